//! `accounting = "github"`: GitHub REST's own accounting.
//!
//! Every answer carries `x-ratelimit-limit`, `-remaining`, `-used` and
//! `-reset` (Unix seconds) for the request's resource: `remaining` (else
//! `limit − used`) resyncs the mirrored window, and 0 blocks until
//! `reset`. A 403 or 429 is a rate limit when its headers say 0 left or its
//! `message` says so; GitHub's own rules for it are followed in their order
//! ("Rate limits for the REST API", "Handle rate limit errors
//! appropriately"):
//!
//! 1. `retry-after` present: wait that long;
//! 2. `x-ratelimit-remaining: 0`: wait until `x-ratelimit-reset`;
//! 3. a secondary rate limit (`message` mentions "secondary rate limit", or
//!    the older "abuse detection") without either: at least 60 s, doubling
//!    for each further one in a row (60 s, 120 s, 240 s, ... up to
//!    `max_block`; a streak is forgotten an hour after its last block ends,
//!    `quota::STREAK_MEMORY`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::{
    Answer, Block, Left, Verdict, header_str, header_u64, messages, retry_after, until_epoch,
};
use crate::config::Endpoint;
use crate::quota::{BlockFor, BlockReason};

/// A secondary rate limit without a `retry-after` blocks at least this long.
pub(crate) const SECONDARY_FIRST: Duration = Duration::from_secs(60);

const REMAINING: &str = "x-ratelimit-remaining";
const LIMIT: &str = "x-ratelimit-limit";
const USED: &str = "x-ratelimit-used";
const RESET: &str = "x-ratelimit-reset";

/// What the headers say is left.
fn remaining(headers: &HeaderMap) -> Option<u64> {
    header_u64(headers, REMAINING).or_else(|| {
        let (limit, used) = (header_u64(headers, LIMIT)?, header_u64(headers, USED)?);
        Some(limit.saturating_sub(used))
    })
}

/// Until `x-ratelimit-reset`, if the answer gives it.
fn until_reset(endpoint: &Endpoint, headers: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let raw = header_str(headers, RESET)?;
    let reset = super::digits(raw)?;
    Some(until_epoch(endpoint, RESET, raw, reset, now))
}

/// Which rate limit an error body names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Says {
    Secondary,
    Primary,
    Nothing,
}

fn says(body: &[u8]) -> Says {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Says::Nothing;
    };
    let m = messages(&v);
    if m.iter()
        .any(|m| m.contains("secondary rate limit") || m.contains("abuse detection"))
    {
        Says::Secondary
    } else if m.iter().any(|m| m.contains("rate limit exceeded")) {
        Says::Primary
    } else {
        Says::Nothing
    }
}

/// Reads a GitHub answer.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let (status, headers, body, now) = (a.status, a.headers, a.body, a.now);
    let mut v = Verdict::default();
    let left = remaining(headers);
    v.left = left.map(Left::Units);
    let spent = left == Some(0);
    if spent && let Some(wait) = until_reset(endpoint, headers, now) {
        v.block = Some(Block::fixed(wait, BlockReason::HeadersAtZero));
    }
    if !matches!(status, 403 | 429) {
        return v;
    }
    let said = says(body);
    if !spent && said == Says::Nothing && status == 403 {
        // Forbidden for another reason (a token without access, ...).
        return v;
    }
    let reason = match said {
        Says::Secondary => BlockReason::SecondaryLimit,
        _ if spent => BlockReason::HeadersAtZero,
        _ => BlockReason::TooManyRequests,
    };
    let detail = match said {
        Says::Secondary => Some("secondary rate limit".to_owned()),
        Says::Primary => Some("rate limit exceeded".to_owned()),
        Says::Nothing => None,
    };
    let for_ = if let Some(wait) = retry_after(endpoint, headers, now) {
        BlockFor::Fixed(wait)
    } else if let Some(Block { for_, .. }) = v.block.take().filter(|_| spent) {
        for_
    } else if said == Says::Secondary {
        BlockFor::Doubling {
            first: SECONDARY_FIRST.min(endpoint.max_block),
            cap: endpoint.max_block,
        }
    } else {
        BlockFor::Fixed(endpoint.throttle_block)
    };
    v.refused = true;
    v.block = Some(Block {
        for_,
        reason,
        detail,
    });
    v
}

#[cfg(test)]
mod tests {
    use super::super::read;
    use super::super::tests::{endpoint, headers};
    use super::*;
    use crate::config::Accounting;

    const PRIMARY: &[u8] = br#"{"message":"API rate limit exceeded for user ID 1. If you reach out to GitHub Support for help, please include the request ID 8C3C:3B3C:9B2A2F:A6B7E5:65F3D1A2.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api","status":"403"}"#;
    const SECONDARY: &[u8] = br#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID 8C3C:3B3C:9B2A2F:A6B7E5:65F3D1A2.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits","status":"403"}"#;

    fn gh(remaining: &str, reset: i64) -> HeaderMap {
        headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", remaining),
            ("x-ratelimit-used", "1"),
            ("x-ratelimit-reset", &reset.to_string()),
            ("x-ratelimit-resource", "core"),
        ])
    }

    #[test]
    fn remaining_resyncs_and_zero_blocks_until_the_reset() {
        let ep = endpoint(Some(Accounting::Github));
        let now = Utc::now();
        let v = read(&ep, 200, &gh("4999", now.timestamp() + 600), b"[]", now);
        assert_eq!(
            (v.left, v.block.is_none(), v.refused),
            (Some(Left::Units(4999)), true, false)
        );
        let v = read(&ep, 200, &gh("0", now.timestamp() + 600), b"[]", now);
        assert!(!v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.for_),
            (
                BlockReason::HeadersAtZero,
                BlockFor::Fixed(Duration::from_secs(601))
            )
        );
        // limit − used when remaining is missing.
        let h = headers(&[("x-ratelimit-limit", "60"), ("x-ratelimit-used", "58")]);
        assert_eq!(read(&ep, 200, &h, b"[]", now).left, Some(Left::Units(2)));
    }

    #[test]
    fn the_primary_limit_blocks_until_the_reset() {
        let ep = endpoint(Some(Accounting::Github));
        let now = Utc::now();
        for status in [403, 429] {
            let v = read(&ep, status, &gh("0", now.timestamp() + 120), PRIMARY, now);
            assert!(v.refused);
            let b = v.block.expect("blocked");
            assert_eq!(
                (b.reason, b.for_),
                (
                    BlockReason::HeadersAtZero,
                    BlockFor::Fixed(Duration::from_secs(121))
                )
            );
        }
    }

    /// Issue 13: a secondary rate limit was `failed` with no block.
    #[test]
    fn a_secondary_limit_blocks_60s_doubling_or_its_retry_after() {
        let ep = endpoint(Some(Accounting::Github));
        let now = Utc::now();
        let v = read(&ep, 403, &gh("4000", now.timestamp() + 600), SECONDARY, now);
        assert!(v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(b.reason, BlockReason::SecondaryLimit);
        assert_eq!(
            b.for_,
            BlockFor::Doubling {
                first: Duration::from_secs(60),
                cap: ep.max_block
            }
        );
        assert_eq!(
            v.left,
            Some(Left::Units(4000)),
            "the primary count still resyncs"
        );

        let mut h = gh("4000", now.timestamp() + 600);
        h.insert("retry-after", "30".parse().expect("value"));
        let v = read(&ep, 403, &h, SECONDARY, now);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.for_),
            (
                BlockReason::SecondaryLimit,
                BlockFor::Fixed(Duration::from_secs(30))
            )
        );
        // The older wording.
        let abuse = br#"{"message":"You have triggered an abuse detection mechanism. Please wait a few minutes before you try again."}"#;
        let v = read(&ep, 403, &HeaderMap::new(), abuse, now);
        assert_eq!(v.block.map(|b| b.reason), Some(BlockReason::SecondaryLimit));
    }

    #[test]
    fn other_403s_are_not_rate_limits() {
        let ep = endpoint(Some(Accounting::Github));
        let now = Utc::now();
        let body =
            br#"{"message":"Resource not accessible by integration","documentation_url":"x"}"#;
        let v = read(&ep, 403, &gh("4000", now.timestamp() + 600), body, now);
        assert!(!v.refused && v.block.is_none());
    }
}
