//! `accounting = "github"`: GitHub REST's own accounting.
//!
//! Every answer carries `x-ratelimit-limit`, `-remaining`, `-used`,
//! `-reset` (Unix seconds) and `-resource` (`core`, `search`,
//! `code_search`, `graphql`, ...): the answer speaks for that resource
//! only. `remaining` (else `limit − used`) resyncs the windows that mirror
//! it, with drift that ends at `reset`, and 0 blocks the resource until
//! `reset`. A 403 or 429 is a rate limit when its headers say 0 left or its
//! `message` says so; GitHub's own rules for it are followed in their order
//! ("Rate limits for the REST API", "Handle rate limit errors
//! appropriately"):
//!
//! 1. `retry-after` present: wait that long;
//! 2. `x-ratelimit-remaining: 0`: wait until `x-ratelimit-reset`;
//! 3. a secondary rate limit (`message` mentions "secondary rate limit", or
//!    the older "abuse detection") without either: at least 60 s, doubling
//!    for each further throttle in a row (the worker's streak, up to the
//!    endpoint's `throttle_block_max`).
//!
//! A secondary rate limit is the token's, not a resource's: it blocks every
//! resource of the credential ([`Block::token_wide`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::{
    Answer, Block, Left, Verdict, epoch_secs, header_str, header_u64, messages, retry_after,
    until_epoch,
};
use crate::config::Endpoint;
use crate::quota::BlockReason;

/// A secondary rate limit without a `retry-after` blocks at least this long.
pub(crate) const SECONDARY_FIRST: Duration = Duration::from_secs(60);

const REMAINING: &str = "x-ratelimit-remaining";
const LIMIT: &str = "x-ratelimit-limit";
pub(super) const USED: &str = "x-ratelimit-used";
pub(super) const RESET: &str = "x-ratelimit-reset";
const RESOURCE: &str = "x-ratelimit-resource";

/// What the headers say is left.
pub(super) fn remaining(headers: &HeaderMap) -> Option<u64> {
    header_u64(headers, REMAINING).or_else(|| {
        let (limit, used) = (header_u64(headers, LIMIT)?, header_u64(headers, USED)?);
        Some(limit.saturating_sub(used))
    })
}

/// `x-ratelimit-reset`, Unix seconds (a fraction rounded up), if given.
pub(super) fn reset_at(headers: &HeaderMap) -> Option<u64> {
    epoch_secs(header_str(headers, RESET)?)
}

/// Until `x-ratelimit-reset`, if the answer gives it.
pub(super) fn until_reset(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<Duration> {
    let raw = header_str(headers, RESET)?;
    Some(until_epoch(endpoint, RESET, raw, epoch_secs(raw)?, now))
}

/// Which rate limit an error body names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Says {
    Secondary,
    Primary,
    Nothing,
}

pub(super) fn says(body: &[u8]) -> Says {
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

/// The headers' part of a verdict: the resource, what it has left and
/// when it resets, and at 0 a block until then.
pub(super) fn headers_say(endpoint: &Endpoint, headers: &HeaderMap, now: DateTime<Utc>) -> Verdict {
    let (resource, unusable_resource) = super::header_resource(headers, RESOURCE);
    let mut v = Verdict {
        resource,
        unusable_resource,
        ..Verdict::default()
    };
    let resets_in = until_reset(endpoint, headers, now);
    if let Some(left) = remaining(headers) {
        v.left_of_resource(Left::Units(left), resets_in);
        if left == 0 {
            // Without a reset GitHub did not say how long: throttle_block.
            let wait = resets_in.unwrap_or(endpoint.throttle_block);
            v.block = Some(Block::fixed(wait, BlockReason::HeadersAtZero));
        }
    }
    v
}

/// Whether the headers say the resource has nothing left.
pub(super) fn spent(v: &Verdict) -> bool {
    v.left.iter().any(|r| r.left == Left::Units(0))
}

/// A 403 or 429 that is a rate limit: the refusal and its block, in
/// GitHub's order (retry-after, the reset at 0 left, a secondary limit's
/// minute). `v` holds what the headers said.
pub(super) fn refusal(endpoint: &Endpoint, a: &Answer<'_>, said: Says, v: &mut Verdict) {
    let spent = spent(v);
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
    let at_zero = v.block.take().filter(|_| spent).map(|b| b.wait);
    let (wait, first) = if let Some(wait) = retry_after(endpoint, a.headers, a.now) {
        (wait, None)
    } else if let Some(wait) = at_zero {
        (wait, None)
    } else if said == Says::Secondary {
        (
            Duration::ZERO,
            Some(SECONDARY_FIRST.min(endpoint.max_block)),
        )
    } else {
        (endpoint.throttle_block, None)
    };
    v.refused = true;
    v.block = Some(Block {
        wait,
        first,
        reason,
        detail,
        token_wide: said == Says::Secondary,
    });
}

/// Reads a GitHub answer.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let mut v = headers_say(endpoint, a.headers, a.now);
    if !matches!(a.status, 403 | 429) {
        return v;
    }
    let said = says(a.body);
    if !spent(&v) && said == Says::Nothing && a.status == 403 {
        // Forbidden for another reason (a token without access, ...).
        return v;
    }
    refusal(endpoint, a, said, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::super::read;
    use super::super::tests::{endpoint, headers, left_of};
    use super::*;
    use crate::config::Accounting;

    pub(crate) const PRIMARY: &[u8] = br#"{"message":"API rate limit exceeded for user ID 1. If you reach out to GitHub Support for help, please include the request ID 8C3C:3B3C:9B2A2F:A6B7E5:65F3D1A2.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api","status":"403"}"#;
    pub(crate) const SECONDARY: &[u8] = br#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID 8C3C:3B3C:9B2A2F:A6B7E5:65F3D1A2.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits","status":"403"}"#;

    fn gh(remaining: &str, reset: i64) -> HeaderMap {
        gh_of("core", "5000", remaining, reset)
    }

    fn gh_of(resource: &str, limit: &str, remaining: &str, reset: i64) -> HeaderMap {
        headers(&[
            ("x-ratelimit-limit", limit),
            ("x-ratelimit-remaining", remaining),
            ("x-ratelimit-used", "1"),
            ("x-ratelimit-reset", &reset.to_string()),
            ("x-ratelimit-resource", resource),
        ])
    }

    #[test]
    fn remaining_resyncs_until_the_reset_and_zero_blocks_until_then() {
        let ep = endpoint(Some(Accounting::Github));
        let now = super::super::tests::whole_second_now();
        let v = read(&ep, 200, &gh("4999", now.timestamp() + 600), b"[]", now);
        assert_eq!(v.resource.as_deref(), Some("core"));
        assert_eq!(
            v.left,
            [left_of(None, 4999, Some(Duration::from_secs(601)))]
        );
        assert_eq!((v.block.is_none(), v.refused), (true, false));
        let v = read(&ep, 200, &gh("0", now.timestamp() + 600), b"[]", now);
        assert!(!v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait, b.token_wide),
            (BlockReason::HeadersAtZero, Duration::from_secs(601), false)
        );
        // limit − used when remaining is missing; no reset: none said.
        let h = headers(&[("x-ratelimit-limit", "60"), ("x-ratelimit-used", "58")]);
        let v = read(&ep, 200, &h, b"[]", now);
        assert_eq!((v.left, v.resource), (vec![left_of(None, 2, None)], None));
    }

    /// Issue 24, item 1: a search answer (`limit 30, remaining 29, resource
    /// search`) resynced the core window and a search answer at 0 blocked
    /// the whole credential. The verdict names its resource.
    #[test]
    fn a_search_answer_speaks_for_search_only() {
        let ep = endpoint(Some(Accounting::Github));
        let now = super::super::tests::whole_second_now();
        let v = read(
            &ep,
            200,
            &gh_of("search", "30", "29", now.timestamp() + 60),
            b"{}",
            now,
        );
        assert_eq!(v.resource.as_deref(), Some("search"));
        assert_eq!(v.left, [left_of(None, 29, Some(Duration::from_secs(61)))]);
        let v = read(
            &ep,
            403,
            &gh_of("search", "30", "0", now.timestamp() + 45),
            PRIMARY,
            now,
        );
        assert_eq!(v.resource.as_deref(), Some("search"));
        let b = v.block.expect("blocked");
        assert!(v.refused && !b.token_wide, "{b:?}");
        assert_eq!(b.wait, Duration::from_secs(46));
        // A resource name that cannot be one (it ends up in keys) is a
        // resource no window mirrors, never the endpoint's own (issue 37).
        for bad in ["", "a b", "core/x", "{core}", &"x".repeat(65)] {
            let v = read(
                &ep,
                200,
                &gh_of(bad, "30", "1", now.timestamp()),
                b"{}",
                now,
            );
            assert_eq!(v.resource, None, "{bad:?}");
            assert!(v.unusable_resource.is_some(), "{bad:?}");
        }
        let v = read(
            &ep,
            200,
            &gh_of("core", "30", "1", now.timestamp()),
            b"{}",
            now,
        );
        assert_eq!(v.unusable_resource, None);
        let v = read(
            &ep,
            200,
            &gh_of(" Code_Search ", "10", "1", now.timestamp()),
            b"{}",
            now,
        );
        assert_eq!(v.resource.as_deref(), Some("code_search"));
    }

    /// Issue 24, item 4 (the same reading in the adapter): a reset with a
    /// fraction is read, rounded up.
    #[test]
    fn a_fractional_reset_is_rounded_up() {
        let ep = endpoint(Some(Accounting::Github));
        let now = super::super::tests::whole_second_now();
        let mut h = gh("0", 0);
        let reset = format!("{}.5", now.timestamp() + 9);
        h.insert("x-ratelimit-reset", reset.parse().expect("value"));
        let v = read(&ep, 200, &h, b"[]", now);
        assert_eq!(v.block.map(|b| b.wait), Some(Duration::from_secs(11)));
    }

    #[test]
    fn the_primary_limit_blocks_until_the_reset() {
        let ep = endpoint(Some(Accounting::Github));
        let now = super::super::tests::whole_second_now();
        for status in [403, 429] {
            let v = read(&ep, status, &gh("0", now.timestamp() + 120), PRIMARY, now);
            assert!(v.refused);
            let b = v.block.expect("blocked");
            assert_eq!(
                (b.reason, b.wait, b.first, b.token_wide),
                (
                    BlockReason::HeadersAtZero,
                    Duration::from_secs(121),
                    None,
                    false
                )
            );
        }
    }

    /// Issue 13: a secondary rate limit was `failed` with no block. It is
    /// the token's: every resource is blocked.
    #[test]
    fn a_secondary_limit_blocks_the_token_60s_doubling_or_its_retry_after() {
        let ep = endpoint(Some(Accounting::Github));
        let now = super::super::tests::whole_second_now();
        let v = read(&ep, 403, &gh("4000", now.timestamp() + 600), SECONDARY, now);
        assert!(v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait, b.first, b.token_wide),
            (
                BlockReason::SecondaryLimit,
                Duration::ZERO,
                Some(Duration::from_secs(60)),
                true
            )
        );
        assert_eq!(
            v.left,
            [left_of(None, 4000, Some(Duration::from_secs(601)))],
            "the primary count still resyncs"
        );

        let mut h = gh("4000", now.timestamp() + 600);
        h.insert("retry-after", "30".parse().expect("value"));
        let v = read(&ep, 403, &h, SECONDARY, now);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait, b.first, b.token_wide),
            (
                BlockReason::SecondaryLimit,
                Duration::from_secs(30),
                None,
                true
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
        let now = super::super::tests::whole_second_now();
        let body =
            br#"{"message":"Resource not accessible by integration","documentation_url":"x"}"#;
        let v = read(&ep, 403, &gh("4000", now.timestamp() + 600), body, now);
        assert!(!v.refused && v.block.is_none());
    }
}
