//! The simulator's upstream accounting styles ([`SimAccounting`]): how it
//! meters a key and how it says so, as GitHub, Shopify GraphQL, Meta and an
//! IETF `RateLimit` API do, each with its real over-limit answer.
//!
//! | style | meter (a key's `units` per `per`) | every answer carries | over the limit |
//! |---|---|---|---|
//! | `Google` (default) | sliding | (optional `x-ratelimit-*`, see [`super::SimConfig`]) | 403 `quotaExceeded` |
//! | `Github` | fixed, from the first request after a reset | `x-ratelimit-limit/-remaining/-used/-reset/-resource` | 403 "API rate limit exceeded for user ID 1. ..." |
//! | `Shopify` | leaky bucket: `units` points, `units / per` restored a second | the body's `extensions.cost` | 200 with a `THROTTLED` error |
//! | `Meta` | sliding | `X-App-Usage`, `X-Business-Use-Case-Usage` (percentages) | 400, error code 80002, a time to regain access |
//! | `Ietf` | fixed, as `Github` | `RateLimit-Policy: "default";q=U;w=S`, `RateLimit: "default";r=R;t=T` | 429 with `Retry-After` |
//!
//! Shopify charges `requestedQueryCost` (the path's cost) up front and
//! keeps `actualQueryCost` (`actual_percent` of it, at least 1); a
//! throttled query costs nothing. GitHub's secondary rate limit is an
//! injected fault ([`super::Fault::GithubSecondary`]), with its real text.
//!
//! GitHub meters each resource of a key apart ([`super::SimConfig::resource`]:
//! `search` 30 a minute, `graphql` 5,000 points an hour, ...; any other
//! path is `core`), each a window from its first request after a reset,
//! and every answer names its resource. The `graphql` resource answers as
//! GitHub's GraphQL API: a POST's answer is `{"data": {"items": [...]}}`
//! with `data.rateLimit` when the query asks for it (`rateLimit {` in the
//! body), the path's cost is the query's points, and over the limit the
//! answer is a 200 with `errors[].type == "RATE_LIMITED"`. An IETF key may
//! have named limits besides its own ([`super::SimConfig::limit`]): every
//! request counts on all, every answer lists all.
//!
//! "Another consumer" on the same key ([`super::Simulator::burn`]) spends
//! from the same meter without showing up in the request log, as a second
//! program with the same token would.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{KeyQuota, Limit, OverLimit, Page, Shared, epoch_secs_ceil};

/// How the simulated upstream meters keys and reports it
/// ([`super::SimConfig::accounting`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SimAccounting {
    /// YouTube's: a sliding window, 403 `quotaExceeded` over it.
    #[default]
    Google,
    /// GitHub REST.
    Github,
    /// Shopify GraphQL Admin API; a query's actual cost is this percentage
    /// of its requested cost (at least 1 point).
    Shopify {
        /// `actualQueryCost` as a percentage of `requestedQueryCost`.
        actual_percent: u8,
    },
    /// Meta Graph API (Instagram business use case).
    Meta,
    /// draft-ietf-httpapi-ratelimit-headers.
    Ietf,
}

/// One key's meter in an accounting style other than `Google`.
#[derive(Debug, Clone)]
pub(super) enum Meter {
    /// A window that starts at the first charge after the last one ended
    /// and resets whole `per` later.
    Fixed { start: Option<Instant>, used: u64 },
    /// Points used, draining at `units / per`.
    Bucket { level: f64, at: Instant },
    /// Charges in any trailing `per`.
    Sliding(VecDeque<(Instant, u64)>),
}

impl Meter {
    fn new(style: SimAccounting, now: Instant) -> Self {
        match style {
            SimAccounting::Github | SimAccounting::Ietf => Meter::Fixed {
                start: None,
                used: 0,
            },
            SimAccounting::Shopify { .. } => Meter::Bucket {
                level: 0.0,
                at: now,
            },
            SimAccounting::Meta | SimAccounting::Google => Meter::Sliding(VecDeque::new()),
        }
    }

    /// Brings the meter to `now`: a fixed window past its end is gone, a
    /// bucket drains, old charges leave a sliding window.
    fn advance(&mut self, q: &KeyQuota, now: Instant) {
        match self {
            Meter::Fixed { start, used } => {
                if start.is_some_and(|s| now.saturating_duration_since(s) >= q.per) {
                    *start = None;
                    *used = 0;
                }
            }
            Meter::Bucket { level, at } => {
                let rate = q.units as f64 / q.per.as_secs_f64();
                *level =
                    (*level - now.saturating_duration_since(*at).as_secs_f64() * rate).max(0.0);
                *at = now;
            }
            Meter::Sliding(w) => {
                while w
                    .front()
                    .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= q.per)
                {
                    w.pop_front();
                }
            }
        }
    }

    /// Units used now (a bucket's level, exact).
    fn used(&self) -> f64 {
        match self {
            Meter::Fixed { used, .. } => *used as f64,
            Meter::Bucket { level, .. } => *level,
            Meter::Sliding(w) => w.iter().map(|(_, c)| *c as f64).sum(),
        }
    }

    /// Whole units left now.
    fn left(&self, q: &KeyQuota) -> u64 {
        (q.units as f64 - self.used()).max(0.0).floor() as u64
    }

    /// Charges `units` (the caller checked they fit, or burns what does).
    fn charge(&mut self, now: Instant, units: u64) {
        match self {
            Meter::Fixed { start, used } => {
                start.get_or_insert(now);
                *used += units;
            }
            Meter::Bucket { level, .. } => *level += units as f64,
            Meter::Sliding(w) => w.push_back((now, units)),
        }
    }

    /// How long until a fixed window resets (a whole `per` before its
    /// first charge); zero for the others.
    fn reset_in(&self, q: &KeyQuota, now: Instant) -> Duration {
        match self {
            Meter::Fixed { start, .. } => {
                start.map_or(q.per, |s| (s + q.per).saturating_duration_since(now))
            }
            _ => Duration::ZERO,
        }
    }

    /// How long until `cost` fits, if nobody else spends.
    fn wait_for(&self, q: &KeyQuota, now: Instant, cost: u64) -> Duration {
        match self {
            Meter::Fixed { start, .. } => start.map_or(Duration::ZERO, |s| {
                (s + q.per).saturating_duration_since(now)
            }),
            Meter::Bucket { level, .. } => {
                let over = (level + cost as f64 - q.units as f64).max(0.0);
                Duration::from_secs_f64(over * q.per.as_secs_f64() / q.units as f64)
            }
            Meter::Sliding(w) => {
                let mut used: u64 = w.iter().map(|(_, c)| c).sum();
                for (at, c) in w {
                    if used + cost <= q.units {
                        break;
                    }
                    used -= c;
                    if used + cost <= q.units {
                        return (*at + q.per).saturating_duration_since(now);
                    }
                }
                Duration::ZERO
            }
        }
    }
}

/// Whole seconds, rounded up.
fn secs_ceil(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The key's meter, brought to `now`.
fn meter<'m>(
    meters: &'m mut std::collections::HashMap<String, Meter>,
    style: SimAccounting,
    q: &KeyQuota,
    now: Instant,
) -> &'m mut Meter {
    let m = meters
        .entry(q.key.clone())
        .or_insert_with(|| Meter::new(style, now));
    m.advance(q, now);
    m
}

/// The GitHub resource a request to `path` counts on, if it is not `core`.
pub(super) fn resource_of<'s>(shared: &'s Shared, path: &str) -> Option<&'s str> {
    (shared.accounting == SimAccounting::Github)
        .then(|| {
            shared
                .resources
                .iter()
                .find(|r| r.paths.iter().any(|p| p == path))
        })
        .flatten()
        .map(|r| r.name.as_str())
}

/// A meter of its own for key `q`: its id and limit as a [`KeyQuota`].
fn apart(q: &KeyQuota, name: &str, limit: Limit) -> KeyQuota {
    KeyQuota::new(format!("{}\u{1f}{name}", q.key), limit.units, limit.per)
}

/// The meters a request to `path` counts on, with the names its answer
/// gives them: GitHub's resource (`core`: the key's own), or every IETF
/// limit (`"default"`: the key's own), or the key's own.
fn meters_of(shared: &Shared, q: &KeyQuota, path: &str) -> Vec<(KeyQuota, String)> {
    match shared.accounting {
        SimAccounting::Github => match resource_of(shared, path) {
            Some(name) => {
                let r = shared.resources.iter().find(|r| r.name == name);
                let limit = r.map_or(
                    Limit {
                        units: q.units,
                        per: q.per,
                    },
                    |r| r.limit,
                );
                vec![(apart(q, name, limit), name.to_owned())]
            }
            None => vec![(q.clone(), "core".to_owned())],
        },
        SimAccounting::Ietf => std::iter::once((q.clone(), "default".to_owned()))
            .chain((shared.limits.iter()).map(|(n, l)| (apart(q, n, *l), n.clone())))
            .collect(),
        _ => vec![(q.clone(), String::new())],
    }
}

/// Answers a valid, parameter-checked request for `page` in `shared`'s
/// accounting style: charged and served, or its style's over-limit answer.
/// Returns the answer and the units charged. `request`: its body (a
/// GraphQL query's).
pub(super) fn serve(
    shared: &Shared,
    q: &KeyQuota,
    cost: u64,
    page: Page,
    query: &[(String, String)],
    request: &[u8],
) -> (Response, u64) {
    let style = shared.accounting;
    let metered = meters_of(shared, q, &page.path);
    let mut guard = shared.lock();
    let now = Instant::now();
    let st = &mut *guard;
    // Shopify charges what a query really cost; the others, the path's cost.
    let charged = match style {
        SimAccounting::Shopify { actual_percent } => {
            (cost * u64::from(actual_percent)).div_ceil(100).max(1)
        }
        _ => cost,
    };
    // The first meter it does not fit: how long it waits, and what is left.
    let over = metered.iter().find_map(|(mq, name)| {
        let m = meter(&mut st.meters, style, mq, now);
        (m.left(mq) < cost).then(|| (m.wait_for(mq, now, cost), m.left(mq), name.clone()))
    });
    if let Some((wait, left, name)) = over {
        st.stats.keys.entry(q.key.clone()).or_default().quota_errors += 1;
        drop(guard);
        let mut r = over_limit(style, q, cost, left, wait, &name);
        r.extensions_mut().insert(OverLimit);
        return (r, 0);
    }
    let mut left = 0;
    for (i, (mq, _)) in metered.iter().enumerate() {
        let m = meter(&mut st.meters, style, mq, now);
        m.charge(now, charged);
        if i == 0 {
            left = m.left(mq);
        }
    }
    super::record_charge(st, q, charged, &page, query, now, chrono::Utc::now());
    let graphql = metered.first().map(|(_, n)| n.as_str()) == Some("graphql");
    // A GraphQL connection's page is its whole answer, `{"data": ...}`;
    // any other page is what `data` holds.
    let connection = matches!(shared.style_of(&page.path), super::SimStyle::Graphql(_));
    let mut body = page.body;
    let body = match style {
        SimAccounting::Shopify { .. } => {
            let data = if connection {
                body["data"].take()
            } else {
                body
            };
            json!({
                "data": data,
                "extensions": { "cost": cost_extension(q, cost, Some(charged), left) },
            })
        }
        _ if graphql => {
            let data = if connection {
                body["data"].take()
            } else {
                json!({ "items": body })
            };
            graphql_data(&metered[0].0, &mut st.meters, now, cost, data, request)
        }
        _ => body,
    };
    let mut r = axum::Json(body).into_response();
    for (name, value) in page.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            r.headers_mut().insert(name, v);
        }
    }
    (r, charged)
}

/// Shopify's `extensions.cost`.
fn cost_extension(q: &KeyQuota, requested: u64, actual: Option<u64>, left: u64) -> Value {
    json!({
        "requestedQueryCost": requested,
        "actualQueryCost": actual,
        "throttleStatus": {
            "maximumAvailable": q.units as f64,
            "currentlyAvailable": left,
            "restoreRate": q.units as f64 / q.per.as_secs_f64(),
        },
    })
}

/// GitHub GraphQL's answer: `data` (the page's items under `items`, or
/// its connection), and `data.rateLimit` when the query (`request`) asks
/// for it.
fn graphql_data(
    q: &KeyQuota,
    meters: &mut std::collections::HashMap<String, Meter>,
    now: Instant,
    cost: u64,
    mut data: Value,
    request: &[u8],
) -> Value {
    if String::from_utf8_lossy(request).contains("rateLimit") {
        let m = meter(meters, SimAccounting::Github, q, now);
        let reset = epoch_secs_ceil(SystemTime::now() + m.reset_in(q, now));
        let reset_at = chrono::DateTime::from_timestamp(reset as i64, 0)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default();
        data["rateLimit"] = json!({
            "cost": cost,
            "limit": q.units,
            "remaining": m.left(q),
            "used": m.used() as u64,
            "resetAt": reset_at,
            "nodeCount": 0,
        });
    }
    json!({ "data": data })
}

/// The style's answer to a request over the key's limit (in GitHub's, of
/// resource `resource`).
fn over_limit(
    style: SimAccounting,
    q: &KeyQuota,
    cost: u64,
    left: u64,
    wait: Duration,
    resource: &str,
) -> Response {
    match style {
        SimAccounting::Google => super::quota_exceeded(),
        SimAccounting::Github if resource == "graphql" => {
            // GitHub GraphQL: a 200 whose error says so.
            let body = json!({
                "errors": [{
                    "type": "RATE_LIMITED",
                    "code": "graphql_rate_limit",
                    "message": "API rate limit exceeded for user ID 1.",
                }],
            });
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        SimAccounting::Github => {
            let body = json!({
                "message": "API rate limit exceeded for user ID 1. If you reach out to GitHub Support for help, please include the request ID SIM0:0001:0001:0001:00000001.",
                "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
                "status": "403",
            });
            (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
        }
        SimAccounting::Shopify { .. } => {
            let body = json!({
                "errors": [{
                    "message": "Throttled",
                    "extensions": {
                        "code": "THROTTLED",
                        "documentation": "https://shopify.dev/api/usage/rate-limits",
                    },
                }],
                "extensions": { "cost": cost_extension(q, cost, None, left) },
            });
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        SimAccounting::Meta => {
            let body = json!({
                "error": {
                    "message": "There have been too many calls to this Instagram account. Wait a bit and try again.",
                    "type": "OAuthException",
                    "is_transient": true,
                    "code": 80002,
                    "fbtrace_id": "SIMtrace0001",
                }
            });
            (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
        }
        SimAccounting::Ietf => {
            let body = json!({ "title": "Too Many Requests", "status": 429 });
            let mut r = (StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response();
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs_ceil(wait).max(1)));
            r
        }
    }
}

/// GitHub's answer to a request that trips its secondary rate limit.
pub(super) fn github_secondary(retry_after_secs: Option<u64>) -> Response {
    let body = json!({
        "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID SIM0:0002:0002:0002:00000002.",
        "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
        "status": "403",
    });
    let mut r = (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    if let Some(s) = retry_after_secs {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// The headers every answer to a valid key carries in the style (none for
/// `Google`, whose are [`super::SimConfig::ratelimit_headers`], and
/// Shopify, whose accounting is in the body): of the meters a request to
/// `path` counts on.
pub(super) fn headers(shared: &Shared, q: &KeyQuota, path: &str, headers: &mut HeaderMap) {
    let style = shared.accounting;
    if matches!(style, SimAccounting::Google | SimAccounting::Shopify { .. }) {
        return;
    }
    let now = Instant::now();
    let metered = meters_of(shared, q, path);
    // (name, used, left, reset_in, frees_in, units, per) of each meter.
    let read: Vec<_> = {
        let mut st = shared.lock();
        (metered.iter())
            .map(|(mq, name)| {
                let m = meter(&mut st.meters, style, mq, now);
                let (used, left) = (m.used() as u64, m.left(mq));
                (
                    name.clone(),
                    used,
                    left,
                    m.reset_in(mq, now),
                    m.wait_for(mq, now, 1),
                    mq.units,
                    mq.per,
                )
            })
            .collect()
    };
    let (resource, used, left, reset_in, frees_in, units, _) = read[0].clone();
    let mut set = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    };
    match style {
        SimAccounting::Github => {
            set("x-ratelimit-limit", units.to_string());
            set("x-ratelimit-remaining", left.to_string());
            set("x-ratelimit-used", used.to_string());
            set(
                "x-ratelimit-reset",
                epoch_secs_ceil(SystemTime::now() + reset_in).to_string(),
            );
            set("x-ratelimit-resource", resource);
        }
        SimAccounting::Ietf => {
            let policy: Vec<String> = (read.iter())
                .map(|(n, _, _, _, _, units, per)| {
                    format!("\"{n}\";q={units};w={}", secs_ceil(*per))
                })
                .collect();
            let limits: Vec<String> = (read.iter())
                .map(|(n, _, left, reset_in, ..)| {
                    format!("\"{n}\";r={left};t={}", secs_ceil(*reset_in))
                })
                .collect();
            set("ratelimit-policy", policy.join(", "));
            set("ratelimit", limits.join(", "));
        }
        SimAccounting::Meta => {
            // Whole percentages, rounded down, as Meta writes them.
            let pct = used.saturating_mul(100) / q.units.max(1);
            let regain = if left == 0 {
                secs_ceil(frees_in).div_ceil(60).max(1)
            } else {
                0
            };
            set(
                "x-app-usage",
                json!({ "call_count": pct / 2, "total_cputime": pct / 4, "total_time": pct / 4 })
                    .to_string(),
            );
            set(
                "x-business-use-case-usage",
                json!({ "17841400000000001": [{
                    "type": "instagram",
                    "call_count": pct,
                    "total_cputime": pct / 4,
                    "total_time": pct / 4,
                    "estimated_time_to_regain_access": regain,
                }]})
                .to_string(),
            );
        }
        SimAccounting::Google | SimAccounting::Shopify { .. } => {}
    }
}

/// Another program spends up to `units` of `q`'s key now: what fits is
/// charged to the meter (not to the request log). Returns what was.
pub(super) fn burn(shared: &Shared, q: &KeyQuota, units: u64) -> u64 {
    let style = shared.accounting;
    let now = Instant::now();
    let mut st = shared.lock();
    let m = meter(&mut st.meters, style, q, now);
    let burnt = units.min(m.left(q));
    m.charge(now, burnt);
    burnt
}

/// What `q`'s key has left now on GitHub resource `name` (`core`: its own).
pub(super) fn left_of(shared: &Shared, q: &KeyQuota, name: &str) -> u64 {
    let metered = match shared.resources.iter().find(|r| r.name == name) {
        Some(r) => apart(q, name, r.limit),
        None => q.clone(),
    };
    let mut st = shared.lock();
    meter(&mut st.meters, shared.accounting, &metered, Instant::now()).left(&metered)
}

/// What `q`'s key has left now, by its meter.
pub(super) fn left(shared: &Shared, q: &KeyQuota) -> u64 {
    let mut st = shared.lock();
    meter(&mut st.meters, shared.accounting, q, Instant::now()).left(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(units: u64, per_ms: u64) -> KeyQuota {
        KeyQuota::new("k", units, Duration::from_millis(per_ms))
    }

    #[test]
    fn a_fixed_window_resets_whole_per_after_its_first_charge() {
        let q = key(10, 1000);
        let t0 = Instant::now();
        let mut m = Meter::new(SimAccounting::Github, t0);
        m.charge(t0, 4);
        m.advance(&q, t0 + Duration::from_millis(500));
        m.charge(t0 + Duration::from_millis(500), 6);
        assert_eq!(m.left(&q), 0);
        assert_eq!(
            m.wait_for(&q, t0 + Duration::from_millis(600), 1),
            Duration::from_millis(400)
        );
        m.advance(&q, t0 + Duration::from_millis(1000));
        assert_eq!(m.left(&q), 10);
    }

    #[test]
    fn a_bucket_drains_at_units_per_per() {
        let q = key(100, 10_000);
        let t0 = Instant::now();
        let mut m = Meter::new(SimAccounting::Shopify { actual_percent: 50 }, t0);
        m.charge(t0, 100);
        assert_eq!(m.left(&q), 0);
        // 10 points a second: 30 for a query of 30.
        let w = m.wait_for(&q, t0, 30);
        assert!((w.as_secs_f64() - 3.0).abs() < 1e-9, "{w:?}");
        m.advance(&q, t0 + Duration::from_secs(2));
        assert_eq!(m.left(&q), 20);
    }
}
