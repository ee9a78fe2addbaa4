//! Requests to the upstream: rendering a job's request template for one page,
//! sending it, and classifying the answer into what the worker must do.
//!
//! The rendered URL carries the secret (`key={secret}`), so nothing here ever
//! logs or returns it: errors are stripped of their URL before they leave.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::config::{Endpoint, Job, Method, ResetIs, Secret};

/// Values the request template's placeholders take for one task.
#[derive(Debug, Clone)]
pub(crate) struct Placeholders<'a> {
    /// The job's name: `{job}`.
    pub job: &'a str,
    /// The fan-out item: `{region}` and friends.
    pub item: &'a [(String, String)],
    /// The credential's secret: `{secret}`.
    pub secret: &'a Secret,
    /// `{date}`: the UTC day the request is made.
    pub date: String,
}

impl<'a> Placeholders<'a> {
    /// Placeholders for `job` and `item` at `now`.
    pub(crate) fn new(
        job: &'a Job,
        item: &'a [(String, String)],
        secret: &'a Secret,
        now: DateTime<Utc>,
    ) -> Self {
        Placeholders {
            job: &job.name,
            item,
            secret,
            date: now.format("%Y-%m-%d").to_string(),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        match name {
            "job" => Some(self.job),
            "date" => Some(&self.date),
            "secret" => Some(self.secret.expose()),
            _ => self
                .item
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str()),
        }
    }
}

/// The upstream's own report of its quota, from response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UpstreamQuota {
    /// Units it says are left.
    pub remaining: u64,
    /// When it says they reset.
    pub reset_in: Duration,
}

/// What the upstream answered, as the worker needs it.
#[derive(Debug)]
pub(crate) enum Reply {
    /// 2xx with a JSON body.
    Ok {
        /// The decoded body.
        body: Value,
        /// The request's actual cost, when the endpoint names a header for it.
        actual_cost: Option<u64>,
        /// The upstream's own remaining quota, when the endpoint names its headers.
        upstream: Option<UpstreamQuota>,
        /// HTTP status.
        status: u16,
    },
    /// 429, or 403 with a quota reason (or a ratelimit header at 0): the
    /// upstream refuses this credential for a while.
    Throttled {
        /// HTTP status.
        status: u16,
        /// How long it said to wait (Retry-After, or the ratelimit reset).
        retry_after: Option<Duration>,
        /// The reason it gave (`quotaExceeded`, ...), if any.
        reason: Option<String>,
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
    },
    /// 5xx: try again later.
    ServerError {
        /// HTTP status.
        status: u16,
        /// What it says it charged, when the endpoint names a cost header
        /// (without one, a 5xx is assumed charged).
        actual_cost: Option<u64>,
    },
    /// Other 4xx: the request is wrong; retrying will not help.
    ClientError {
        /// HTTP status.
        status: u16,
        /// The start of the body, for the log.
        detail: String,
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
    },
    /// 2xx whose body is not JSON.
    BadBody {
        /// HTTP status.
        status: u16,
        /// Why it did not decode.
        detail: String,
    },
    /// The request never reached the upstream (connection refused, DNS, TLS
    /// handshake): its units can be refunded.
    Unreached {
        /// What failed (no URL, so no secret).
        detail: String,
    },
    /// Sent, but no complete answer in time: it may have been charged.
    TimedOut {
        /// What failed (no URL).
        detail: String,
    },
}

/// Sends requests for jobs. Cheap to clone (one connection pool).
#[derive(Debug, Clone)]
pub(crate) struct Fetcher {
    client: reqwest::Client,
}

impl Fetcher {
    /// A fetcher with rustls, a connect timeout, and a user agent.
    pub(crate) fn new() -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("quota-worker/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(Fetcher { client })
    }

    /// Fetches one page of `job` for `ph`'s item; `cursor` is the page token
    /// from the previous page (none for the first).
    pub(crate) async fn fetch(
        &self,
        job: &Job,
        endpoint: &Endpoint,
        ph: &Placeholders<'_>,
        cursor: Option<&str>,
    ) -> Reply {
        let req = &job.request;
        let url = req.url.render(|k| ph.get(k));
        let method = match req.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Patch => reqwest::Method::PATCH,
            Method::Delete => reqwest::Method::DELETE,
        };
        let mut query: Vec<(String, String)> = req
            .query
            .iter()
            .map(|(k, t)| (k.clone(), t.render(|n| ph.get(n))))
            .collect();
        if let (Some(p), Some(c)) = (&job.pagination, cursor) {
            query.push((p.param.clone(), c.to_owned()));
        }
        let mut rb = self
            .client
            .request(method, url)
            .query(&query)
            .timeout(endpoint.timeout);
        for (k, t) in &req.headers {
            rb = rb.header(k.as_str(), t.render(|n| ph.get(n)));
        }
        if let Some(b) = &req.body {
            rb = rb.body(b.render(|n| ph.get(n)));
        }
        let reply = match rb.send().await {
            Err(e) => transport_error(e),
            Ok(resp) => {
                let status = resp.status().as_u16();
                let headers = resp.headers().clone();
                match resp.bytes().await {
                    Ok(bytes) => classify(endpoint, status, &headers, &bytes, Utc::now()),
                    Err(e) => transport_error(e),
                }
            }
        };
        let status = match &reply {
            Reply::Ok { status, .. }
            | Reply::Throttled { status, .. }
            | Reply::ServerError { status, .. }
            | Reply::ClientError { status, .. }
            | Reply::BadBody { status, .. } => status.to_string(),
            Reply::Unreached { .. } => "unreached".into(),
            Reply::TimedOut { .. } => "timeout".into(),
        };
        metrics::counter!("qw_upstream_responses_total", "endpoint" => endpoint.name.clone(), "status" => status)
            .increment(1);
        reply
    }
}

fn transport_error(e: reqwest::Error) -> Reply {
    // The URL holds the secret: drop it before the error is printed anywhere.
    let e = e.without_url();
    let detail = error_chain(&e);
    if e.is_timeout() {
        Reply::TimedOut { detail }
    } else if e.is_connect() {
        Reply::Unreached { detail }
    } else {
        // Reset mid-request, or a body cut short: it may have been charged.
        Reply::TimedOut { detail }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// `Retry-After`: delta seconds or an HTTP date.
fn retry_after(headers: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let v = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    let at: DateTime<Utc> = at.into();
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
}

fn upstream_quota(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<UpstreamQuota> {
    let h = endpoint.ratelimit_headers.as_ref()?;
    let remaining = header_u64(headers, &h.remaining)?;
    let reset = header_u64(headers, &h.reset)?;
    let reset_in = match h.reset_is {
        ResetIs::DeltaSeconds => Duration::from_secs(reset),
        ResetIs::EpochSeconds => {
            let secs = (reset as i64).saturating_sub(now.timestamp()).max(0) as u64;
            // Round up: the reset second itself is not yet free.
            Duration::from_secs(secs + 1)
        }
    };
    Some(UpstreamQuota {
        remaining,
        reset_in,
    })
}

/// The quota reason of a Google-style error body, if it is one of `reasons`.
fn quota_reason(body: &[u8], reasons: &[String]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let errors = v.pointer("/error/errors")?.as_array()?;
    errors
        .iter()
        .filter_map(|e| e.get("reason")?.as_str())
        .find(|r| reasons.iter().any(|q| q == r))
        .map(str::to_owned)
}

fn snippet(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(200)]);
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Classifies a complete HTTP answer.
pub(crate) fn classify(
    endpoint: &Endpoint,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: DateTime<Utc>,
) -> Reply {
    let upstream = upstream_quota(endpoint, headers, now);
    // Any answer may say what it cost, errors included (often 0).
    let actual_cost = endpoint
        .cost_header
        .as_deref()
        .and_then(|h| header_u64(headers, h));
    match status {
        200..=299 => match serde_json::from_slice::<Value>(body) {
            Ok(body) => Reply::Ok {
                body,
                actual_cost,
                upstream,
                status,
            },
            Err(e) => Reply::BadBody {
                status,
                detail: format!("not JSON ({e}): {}", snippet(body)),
            },
        },
        429 => Reply::Throttled {
            status,
            retry_after: retry_after(headers, now).or(upstream.map(|u| u.reset_in)),
            reason: quota_reason(body, &endpoint.quota_reasons),
            actual_cost,
        },
        403 => {
            let reason = quota_reason(body, &endpoint.quota_reasons);
            let exhausted = upstream.is_some_and(|u| u.remaining == 0);
            if reason.is_some() || exhausted {
                Reply::Throttled {
                    status,
                    retry_after: retry_after(headers, now).or(upstream.map(|u| u.reset_in)),
                    reason,
                    actual_cost,
                }
            } else {
                Reply::ClientError {
                    status,
                    detail: snippet(body),
                    actual_cost,
                }
            }
        }
        500..=599 => Reply::ServerError {
            status,
            actual_cost,
        },
        _ => Reply::ClientError {
            status,
            detail: snippet(body),
            actual_cost,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LimiterUnavailable, RatelimitHeaders};
    use reqwest::header::HeaderValue;
    use std::num::NonZeroU64;

    fn endpoint() -> Endpoint {
        Endpoint {
            name: "e".into(),
            credential: "c".into(),
            cost: NonZeroU64::MIN,
            limiter_unavailable: LimiterUnavailable::FailClosed,
            windows: vec![],
            timeout: Duration::from_secs(1),
            throttle_block: Duration::from_secs(60),
            quota_reasons: vec!["quotaExceeded".into(), "rateLimitExceeded".into()],
            ratelimit_headers: Some(RatelimitHeaders {
                remaining: "x-ratelimit-remaining".into(),
                reset: "x-ratelimit-reset".into(),
                reset_is: ResetIs::EpochSeconds,
            }),
            cost_header: Some("x-quota-cost".into()),
        }
    }

    #[test]
    fn youtube_quota_exceeded_is_throttling() {
        let body = br#"{"error":{"code":403,"errors":[{"reason":"quotaExceeded","domain":"youtube.quota"}]}}"#;
        let r = classify(&endpoint(), 403, &HeaderMap::new(), body, Utc::now());
        assert!(
            matches!(r, Reply::Throttled { reason: Some(ref x), retry_after: None, .. } if x == "quotaExceeded")
        );
        let forbidden = br#"{"error":{"code":403,"errors":[{"reason":"forbidden"}]}}"#;
        let r = classify(&endpoint(), 403, &HeaderMap::new(), forbidden, Utc::now());
        assert!(matches!(r, Reply::ClientError { status: 403, .. }));
    }

    #[test]
    fn retry_after_seconds_and_github_headers() {
        let now = Utc::now();
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        let r = classify(&endpoint(), 429, &h, b"", now);
        assert!(
            matches!(r, Reply::Throttled { retry_after: Some(d), .. } if d == Duration::from_secs(7))
        );

        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        let reset = (now.timestamp() + 30).to_string();
        h.insert("x-ratelimit-reset", HeaderValue::from_str(&reset).unwrap());
        h.insert("x-quota-cost", HeaderValue::from_static("3"));
        let r = classify(&endpoint(), 200, &h, b"{}", now);
        let Reply::Ok {
            upstream: Some(u),
            actual_cost,
            ..
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(u.remaining, 0);
        assert_eq!(u.reset_in, Duration::from_secs(31));
        assert_eq!(actual_cost, Some(3));
        let r = classify(&endpoint(), 403, &h, b"{}", now);
        assert!(matches!(
            r,
            Reply::Throttled {
                retry_after: Some(_),
                ..
            }
        ));
    }

    /// Regression: a 5xx's reported cost was dropped, so its units could
    /// never be settled to what the upstream said it charged.
    #[test]
    fn error_answers_carry_their_reported_cost() {
        let mut h = HeaderMap::new();
        h.insert("x-quota-cost", HeaderValue::from_static("0"));
        let r = classify(&endpoint(), 503, &h, b"", Utc::now());
        assert!(matches!(
            r,
            Reply::ServerError {
                status: 503,
                actual_cost: Some(0)
            }
        ));
        let r = classify(&endpoint(), 429, &h, b"", Utc::now());
        assert!(matches!(
            r,
            Reply::Throttled {
                actual_cost: Some(0),
                ..
            }
        ));
        let r = classify(&endpoint(), 404, &h, b"", Utc::now());
        assert!(matches!(
            r,
            Reply::ClientError {
                actual_cost: Some(0),
                ..
            }
        ));
    }

    #[test]
    fn bodies_that_are_not_json_are_bad() {
        let r = classify(&endpoint(), 200, &HeaderMap::new(), b"<html>", Utc::now());
        assert!(matches!(r, Reply::BadBody { .. }));
        let r = classify(&endpoint(), 503, &HeaderMap::new(), b"", Utc::now());
        assert!(matches!(
            r,
            Reply::ServerError {
                status: 503,
                actual_cost: None
            }
        ));
        let r = classify(&endpoint(), 404, &HeaderMap::new(), b"nope", Utc::now());
        assert!(matches!(r, Reply::ClientError { status: 404, .. }));
    }
}
