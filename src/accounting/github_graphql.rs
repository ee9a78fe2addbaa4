//! `accounting = "github-graphql"`: GitHub's GraphQL API, metered in
//! *points* (a query's cost), not calls, on the `graphql` resource.
//!
//! - **Cost.** The endpoint's `cost` is the estimate spent before the
//!   request; the answer settles it to the query's actual cost:
//!   `data.rateLimit.cost` when the query asks for it
//!   (`rateLimit { cost remaining resetAt }`), else the change in the
//!   token's `x-ratelimit-used` since its last answer (the worker keeps
//!   that, [`Verdict::used`]), else the estimate stays.
//! - **Remaining and reset** come from `x-ratelimit-*` (as GitHub REST's,
//!   [`super::github`]), else from `data.rateLimit.remaining` / `resetAt`.
//! - **`errors[].type == "RATE_LIMITED"`** (with a 200 or a 403) is a
//!   refusal that blocks the resource until the reset; a secondary rate
//!   limit blocks the token, as on REST.
//! - **`errors` without `data`** is a failed query ([`Verdict::bad`]), not
//!   a page: nothing is written and the run does not count as done.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::github::{self, Says};
use super::{Answer, Block, Left, Used, Verdict, header_u64, until_epoch};
use crate::config::Endpoint;
use crate::quota::BlockReason;

/// The longest piece of an error's message kept in the task's outcome.
const MESSAGE_MAX: usize = 200;

/// `data.rateLimit`, as far as it is there and readable.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct RateLimit {
    cost: Option<u64>,
    remaining: Option<u64>,
    used: Option<u64>,
    /// `resetAt` as Unix seconds.
    reset: Option<u64>,
}

fn rate_limit(json: &Value) -> RateLimit {
    let Some(rl) = json.pointer("/data/rateLimit") else {
        return RateLimit::default();
    };
    let n = |k: &str| rl.get(k).and_then(Value::as_u64);
    let reset = (rl.get("resetAt").and_then(Value::as_str))
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .and_then(|t| u64::try_from(t.timestamp()).ok());
    RateLimit {
        cost: n("cost"),
        remaining: n("remaining"),
        used: n("used"),
        reset,
    }
}

/// The answer's `errors`, if it has any.
fn errors(json: &Value) -> &[Value] {
    json.get("errors")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Whether `data` is there (a query with partial errors still has it).
fn has_data(json: &Value) -> bool {
    json.get("data").is_some_and(|d| !d.is_null())
}

/// The first error, in words for the outcome: its `type` and message.
fn first_error(errors: &[Value]) -> String {
    let Some(e) = errors.first() else {
        return String::new();
    };
    let kind = e.get("type").and_then(Value::as_str);
    let message: String = (e.get("message").and_then(Value::as_str))
        .unwrap_or_default()
        .chars()
        .take(MESSAGE_MAX)
        .collect();
    match kind {
        Some(k) => format!("{k}: {message}"),
        None => message,
    }
}

/// Reads a GitHub GraphQL answer.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let mut v = github::headers_say(endpoint, a.headers, a.now);
    let json: Value = serde_json::from_slice(a.body).unwrap_or(Value::Null);
    let rl = rate_limit(&json);
    v.cost = rl.cost;
    let reset = github::reset_at(a.headers).or(rl.reset);
    if v.left.is_empty()
        && let Some(left) = rl.remaining
    {
        let resets_in = rl.reset.map(|r| until(endpoint, r, a.now));
        v.left_of_resource(Left::Units(left), resets_in);
        if left == 0 {
            let wait = resets_in.unwrap_or(endpoint.throttle_block);
            v.block = Some(Block::fixed(wait, BlockReason::HeadersAtZero));
        }
    }
    let used = header_u64(a.headers, github::USED).or(rl.used);
    if let (Some(used), Some(reset)) = (used, reset) {
        v.used = Some(Used { used, reset });
    }
    let errors = errors(&json);
    let said = match github::says(a.body) {
        // GraphQL puts the message in `errors[]`.
        Says::Nothing if errors_say_secondary(errors) => Says::Secondary,
        said => said,
    };
    if matches!(a.status, 403 | 429) && (said != Says::Nothing || github::spent(&v)) {
        github::refusal(endpoint, a, said, &mut v);
        return v;
    }
    let limited =
        (errors.iter()).any(|e| e.get("type").and_then(Value::as_str) == Some("RATE_LIMITED"));
    if limited {
        // Until the reset (the answer's headers or `resetAt`), else
        // throttle_block; a query that was refused ran nothing, and what
        // it may have cost stays as estimated (never less).
        let wait = reset.map_or(endpoint.throttle_block, |r| until(endpoint, r, a.now));
        let reason = if github::spent(&v) {
            BlockReason::HeadersAtZero
        } else {
            BlockReason::TooManyRequests
        };
        v.refused = true;
        v.block = Some(Block {
            detail: Some("RATE_LIMITED".to_owned()),
            ..Block::fixed(wait, reason)
        });
        return v;
    }
    if (200..300).contains(&a.status) {
        v.bad = without_data(&json);
    }
    v
}

/// A GraphQL answer with `errors` and no `data` (`null` or missing): why
/// it is a failure, in words; `None` for any other answer (a query with
/// partial errors still has its data). Read for every `graphql` request
/// too, whatever its accounting (`fetch`).
pub(crate) fn without_data(json: &Value) -> Option<String> {
    let errors = errors(json);
    (!errors.is_empty() && !has_data(json)).then(|| {
        format!(
            "GraphQL answer has errors and no data: {}",
            first_error(errors)
        )
    })
}

/// Whether an error in `errors` is a secondary rate limit.
fn errors_say_secondary(errors: &[Value]) -> bool {
    errors.iter().any(|e| {
        (e.get("message").and_then(Value::as_str)).is_some_and(|m| {
            let m = m.to_lowercase();
            m.contains("secondary rate limit") || m.contains("abuse detection")
        })
    })
}

/// Until Unix second `reset`, rounded up, at most `max_block`.
fn until(endpoint: &Endpoint, reset: u64, now: DateTime<Utc>) -> Duration {
    until_epoch(
        endpoint,
        "data.rateLimit.resetAt",
        &reset.to_string(),
        reset,
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::super::read;
    use super::super::tests::{endpoint, headers, left_of};
    use super::*;
    use crate::config::Accounting;
    use reqwest::header::HeaderMap;

    fn gh(remaining: &str, used: &str, reset: i64) -> HeaderMap {
        headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", remaining),
            ("x-ratelimit-used", used),
            ("x-ratelimit-reset", &reset.to_string()),
            ("x-ratelimit-resource", "graphql"),
        ])
    }

    #[test]
    fn settles_to_the_reported_cost_and_resyncs_the_graphql_resource() {
        let ep = endpoint(Some(Accounting::GithubGraphql));
        let now = super::super::tests::whole_second_now();
        let reset = now.timestamp() + 900;
        let body = format!(
            r#"{{"data":{{"viewer":{{"login":"x"}},"rateLimit":{{"cost":7,"remaining":4893,"used":107,"resetAt":"{}"}}}}}}"#,
            DateTime::from_timestamp(reset, 0)
                .expect("time")
                .to_rfc3339()
        );
        let v = read(&ep, 200, &gh("4893", "107", reset), body.as_bytes(), now);
        assert_eq!((v.cost, v.resource.as_deref()), (Some(7), Some("graphql")));
        assert_eq!(
            v.left,
            [left_of(None, 4893, Some(Duration::from_secs(901)))]
        );
        assert_eq!(
            v.used,
            Some(Used {
                used: 107,
                reset: reset as u64
            })
        );
        assert!(!v.refused && v.block.is_none() && v.bad.is_none());
        // Without the headers: data.rateLimit says it all.
        let v = read(&ep, 200, &HeaderMap::new(), body.as_bytes(), now);
        assert_eq!(
            v.left,
            [left_of(None, 4893, Some(Duration::from_secs(901)))]
        );
        assert_eq!(
            v.used,
            Some(Used {
                used: 107,
                reset: reset as u64
            })
        );
        // A query that did not ask: no cost (the worker uses `used`).
        let v = read(
            &ep,
            200,
            &gh("4890", "110", reset),
            br#"{"data":{"viewer":{}}}"#,
            now,
        );
        assert_eq!((v.cost, v.used.map(|u| u.used)), (None, Some(110)));
    }

    #[test]
    fn rate_limited_blocks_until_the_reset_with_a_200_or_a_403() {
        let ep = endpoint(Some(Accounting::GithubGraphql));
        let now = super::super::tests::whole_second_now();
        let body = br#"{"errors":[{"type":"RATE_LIMITED","code":"graphql_rate_limit","message":"API rate limit exceeded for user ID 1."}]}"#;
        for status in [200, 403] {
            let v = read(
                &ep,
                status,
                &gh("0", "5000", now.timestamp() + 300),
                body,
                now,
            );
            assert!(v.refused, "{status}");
            let b = v.block.expect("blocked");
            assert_eq!(
                (b.reason, b.wait, b.token_wide),
                (BlockReason::HeadersAtZero, Duration::from_secs(301), false),
                "{status}"
            );
            assert!(v.bad.is_none(), "a refusal, not a failure");
        }
        // Without headers: throttle_block, the reason named.
        let v = read(&ep, 200, &HeaderMap::new(), body, now);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.wait, b.detail.as_deref()),
            (ep.throttle_block, Some("RATE_LIMITED"))
        );
    }

    #[test]
    fn a_secondary_limit_blocks_the_token() {
        let ep = endpoint(Some(Accounting::GithubGraphql));
        let now = super::super::tests::whole_second_now();
        let body = br#"{"errors":[{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}]}"#;
        let v = read(
            &ep,
            403,
            &gh("4000", "1000", now.timestamp() + 300),
            body,
            now,
        );
        let b = v.block.expect("blocked");
        assert!(v.refused && b.token_wide, "{b:?}");
        assert_eq!(b.reason, BlockReason::SecondaryLimit);
    }

    /// Issue 24, item 7: a GraphQL answer with errors and no data is
    /// failed, not done; partial data is a page.
    #[test]
    fn errors_without_data_are_a_bad_answer() {
        let ep = endpoint(Some(Accounting::GithubGraphql));
        let now = super::super::tests::whole_second_now();
        let body = br#"{"errors":[{"type":"NOT_FOUND","path":["repository"],"message":"Could not resolve to a Repository with the name 'x/y'."}]}"#;
        let v = read(&ep, 200, &HeaderMap::new(), body, now);
        assert_eq!(
            v.bad.as_deref(),
            Some(
                "GraphQL answer has errors and no data: NOT_FOUND: Could not resolve to a Repository with the name 'x/y'."
            )
        );
        let body = br#"{"data":null,"errors":[{"message":"Something went wrong"}]}"#;
        let v = read(&ep, 200, &HeaderMap::new(), body, now);
        assert!(v.bad.is_some());
        let body = br#"{"data":{"a":1,"b":null},"errors":[{"type":"NOT_FOUND","message":"x"}]}"#;
        assert!(read(&ep, 200, &HeaderMap::new(), body, now).bad.is_none());
        assert!(
            read(&ep, 200, &HeaderMap::new(), br#"{"data":{}}"#, now)
                .bad
                .is_none()
        );
    }
}
