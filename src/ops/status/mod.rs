//! The status page on the metrics listener: `GET /` (HTML) and
//! `GET /api/status` (the same data as JSON), and `GET /api/state/JOB`
//! (where its items stand). Read-only: both routes answer
//! only GET and HEAD (anything else is 405), and nothing here writes to
//! Redis.
//!
//! - `model`: what the page shows, read from Redis at request time;
//! - `read`: the reads of what the windows and the queue do not keep by
//!   themselves (spend history, tick records, block notes), read-only;
//! - `page`: the HTML (maud), inline CSS and SVG, no script;
//! - `items`: `GET /api/state/JOB[?item=ITEM]`, where a job's items stand
//!   (`quota-worker state`'s JSON), which the page links each item to.
//!
//! Behind a reverse proxy under a path prefix every link works as it is
//! (they are relative); a proxy that sends `X-Forwarded-Prefix` also gets a
//! `<base href>`, so the page works when asked for without a trailing slash.

mod items;
mod model;
mod page;
mod read;

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::OpsState;
use super::metrics::GAUGES_FRESH_FOR;

/// The status last read from Redis, and when. Held while one request reads
/// it, so requests arriving meanwhile wait for that read and show its result
/// (a single flight), and requests within [`GAUGES_FRESH_FOR`] of it cost
/// Redis nothing: a page left open in many browsers, or a loop asking for
/// it, reads Redis at most once a second, as `/metrics` does.
#[derive(Debug, Default)]
pub(crate) struct StatusReads(
    tokio::sync::Mutex<Option<(tokio::time::Instant, Arc<model::Status>)>>,
);

async fn read(s: &OpsState) -> Arc<model::Status> {
    let mut last = s.status_reads.0.lock().await;
    if let Some((at, status)) = &*last
        && at.elapsed() < GAUGES_FRESH_FOR
    {
        return status.clone();
    }
    let status = Arc::new(model::gather(s).await);
    *last = Some((tokio::time::Instant::now(), status.clone()));
    status
}

/// What a browser may do with the page: nothing but show it. It has no
/// script, loads nothing, and cannot be framed; even a value that escaped
/// escaping could not run.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; base-uri 'self'; form-action 'none'; frame-ancestors 'none'";

/// The refresh periods `?refresh=N` accepts, seconds.
const REFRESH: std::ops::RangeInclusive<u64> = 5..=3600;

#[derive(Debug, Deserialize)]
pub(super) struct PageQuery {
    refresh: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct StateQuery {
    item: Option<String>,
}

fn headers(content_type: &'static str) -> [(HeaderName, HeaderValue); 5] {
    [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
    ]
}

/// `GET /`: the page.
pub(super) async fn page(
    State(s): State<OpsState>,
    request: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Response {
    let status = read(&s).await;
    let view = page::View {
        base: request
            .get("x-forwarded-prefix")
            .and_then(|v| v.to_str().ok())
            .and_then(base_href),
        refresh: q.refresh.map(|n| n.clamp(*REFRESH.start(), *REFRESH.end())),
    };
    let body = page::render(&status, &view).into_string();
    (headers("text/html; charset=utf-8"), body).into_response()
}

/// `GET /api/status`: the page's data.
pub(super) async fn api(State(s): State<OpsState>) -> Response {
    let status = read(&s).await;
    let body = serde_json::to_string_pretty(&*status).unwrap_or_else(|_| "{}".into());
    (headers("application/json"), body).into_response()
}

/// `GET /api/state/{job}`: where the job's items stand (`items`).
pub(super) async fn state_api(
    State(s): State<OpsState>,
    Path(job): Path<String>,
    Query(q): Query<StateQuery>,
) -> Response {
    items::api(&s, &job, q.item.as_deref()).await
}

/// The `<base href>` for a proxy's `X-Forwarded-Prefix`: a path (`/ops/qw`)
/// made of plain URL path characters, ending with `/`. Anything else is
/// ignored: a prefix like `//host` would point every link at another site.
fn base_href(prefix: &str) -> Option<String> {
    let prefix = prefix.trim();
    let plain = |c: char| c.is_ascii_alphanumeric() || "-._~/%".contains(c);
    if !prefix.starts_with('/') || prefix.starts_with("//") || !prefix.chars().all(plain) {
        return None;
    }
    let trimmed = prefix.trim_end_matches('/');
    Some(format!("{trimmed}/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plain_path_prefix_becomes_the_base() {
        assert_eq!(base_href("/ops/qw").as_deref(), Some("/ops/qw/"));
        assert_eq!(base_href("/ops/qw/").as_deref(), Some("/ops/qw/"));
        assert_eq!(base_href("/").as_deref(), Some("/"));
        assert_eq!(base_href("//evil.example/"), None);
        assert_eq!(base_href("https://evil.example/"), None);
        assert_eq!(base_href("/a\"><script>"), None);
        assert_eq!(base_href("ops"), None);
    }
}
