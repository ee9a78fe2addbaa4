//! What any endpoint may name without an `accounting` adapter:
//! `ratelimit_headers` (a remaining count and a reset, GitHub-style, under
//! any names) resync the `upstream = true` windows and block at 0 until
//! the reset; a 429 blocks for its `Retry-After` (else the reset, else
//! `throttle_block`). `cost_header` and `quota_reasons` are read for every
//! endpoint ([`super::read`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;

use super::{Answer, Block, Left, Verdict, bounded, digits, header_str, header_u64, retry_after};
use crate::config::{Endpoint, ResetIs};
use crate::quota::BlockReason;

/// The endpoint's `ratelimit_headers`: what is left, and how long until
/// the reset (at most `max_block`; a clamp is logged only when it matters,
/// at 0 left).
fn ratelimit(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<(u64, Duration)> {
    let h = endpoint.ratelimit_headers.as_ref()?;
    let remaining = header_u64(headers, &h.remaining)?;
    let raw = header_str(headers, &h.reset)?;
    let reset = digits(raw)?;
    let reset_in = match h.reset_is {
        ResetIs::DeltaSeconds => Duration::from_secs(reset),
        ResetIs::EpochSeconds => {
            let secs = (i128::from(reset) - i128::from(now.timestamp())).max(0);
            // Round up: the reset second itself is not yet free.
            Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX).saturating_add(1))
        }
    };
    let reset_in = if remaining == 0 {
        bounded(endpoint, &h.reset, raw, reset_in)
    } else {
        reset_in.min(endpoint.max_block)
    };
    Some((remaining, reset_in))
}

/// Reads an answer by the endpoint's generic fields.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let (status, headers, now) = (a.status, a.headers, a.now);
    let mut v = Verdict::default();
    let limit = ratelimit(endpoint, headers, now);
    if let Some((remaining, reset_in)) = limit {
        v.left = Some(Left::Units(remaining));
        if remaining == 0 {
            // Nobody spends on this credential until the upstream resets.
            v.block = Some(Block::fixed(reset_in, BlockReason::HeadersAtZero));
            if status == 403 {
                v.refused = true;
            }
        }
    }
    if status == 429 {
        let wait = retry_after(endpoint, headers, now)
            .or(limit.map(|(_, reset_in)| reset_in))
            .unwrap_or(endpoint.throttle_block);
        v.refused = true;
        v.block = Some(Block::fixed(wait, BlockReason::TooManyRequests));
    } else if v.refused
        && let Some(wait) = retry_after(endpoint, headers, now)
    {
        // A 403 at 0 left: its Retry-After, when it gives one, wins.
        v.block = Some(Block::fixed(wait, BlockReason::HeadersAtZero));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::read;
    use super::super::tests::{endpoint, headers};
    use super::*;
    use crate::quota::BlockFor;

    #[test]
    fn remaining_resyncs_and_zero_blocks_until_the_reset() {
        let ep = endpoint(None);
        let now = Utc::now();
        let reset = (now.timestamp() + 30).to_string();
        let h = headers(&[
            ("x-ratelimit-remaining", "12"),
            ("x-ratelimit-reset", &reset),
        ]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert_eq!(v.left, Some(Left::Units(12)));
        assert_eq!(v.block, None);
        let h = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset),
        ]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert!(!v.refused, "a page with 0 left is still a page");
        let b = v.block.expect("blocked");
        assert_eq!(b.reason, BlockReason::HeadersAtZero);
        assert_eq!(b.for_, BlockFor::Fixed(Duration::from_secs(31)));
        let v = read(&ep, 403, &h, b"{}", now);
        assert!(v.refused, "a 403 at 0 left is the upstream's refusal");
        // A 429 without Retry-After waits for the reset the headers give.
        let v = read(&ep, 429, &h, b"", now);
        assert_eq!(
            v.block.map(|b| b.for_),
            Some(BlockFor::Fixed(Duration::from_secs(31)))
        );
    }

    /// Regression (issue 9, item 4): an epoch reset past i64 went negative.
    #[test]
    fn a_reset_past_any_time_is_max_block() {
        let ep = endpoint(None);
        let h = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "18446744073709551615"),
        ]);
        let v = read(&ep, 200, &h, b"{}", Utc::now());
        assert_eq!(v.block.map(|b| b.for_), Some(BlockFor::Fixed(ep.max_block)));
    }
}
