//! What any endpoint may name without an `accounting` adapter:
//! `ratelimit_headers` (a remaining count and a reset, GitHub-style, under
//! any names) resync the `upstream = true` windows (with drift that ends
//! at the reset, when there is one) and block at 0 until the reset; a 429
//! blocks for its `Retry-After` (else the reset, else `throttle_block`).
//! `cost_header` and `quota_reasons` are read for every endpoint
//! ([`super::read`]).
//!
//! A readable `remaining` counts whatever the reset header says: absent
//! or unreadable, the resync has no reset (drift as any other) and 0 left
//! blocks for `throttle_block`. A reset with a fraction (`1795667000.5`)
//! is read, rounded up.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;

use super::{
    Answer, Block, Left, Verdict, bounded, epoch_secs, header_str, header_u64, retry_after, seconds,
};
use crate::config::{Endpoint, ResetIs};
use crate::quota::BlockReason;

/// The endpoint's `ratelimit_headers`: what is left, and how long until
/// the reset if the answer gives a readable one (at most `max_block`; a
/// clamp is logged only when it matters, at 0 left).
fn ratelimit(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<(u64, Option<Duration>)> {
    let h = endpoint.ratelimit_headers.as_ref()?;
    let remaining = header_u64(headers, &h.remaining)?;
    let reset_in = header_str(headers, &h.reset).and_then(|raw| {
        let reset_in = match h.reset_is {
            ResetIs::DeltaSeconds => seconds(raw)?,
            ResetIs::EpochSeconds => {
                let secs = (i128::from(epoch_secs(raw)?) - i128::from(now.timestamp())).max(0);
                // Round up: the reset second itself is not yet free.
                Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX).saturating_add(1))
            }
        };
        Some(if remaining == 0 {
            bounded(endpoint, &h.reset, raw, reset_in)
        } else {
            reset_in.min(endpoint.max_block)
        })
    });
    Some((remaining, reset_in))
}

/// Reads an answer by the endpoint's generic fields.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let (status, headers, now) = (a.status, a.headers, a.now);
    let mut v = Verdict::default();
    let limit = ratelimit(endpoint, headers, now);
    if let Some((remaining, reset_in)) = limit {
        v.left_of_resource(Left::Units(remaining), reset_in);
        if remaining == 0 {
            // Nobody spends on this resource until the upstream resets.
            let wait = reset_in.unwrap_or(endpoint.throttle_block);
            v.block = Some(Block::fixed(wait, BlockReason::HeadersAtZero));
            if status == 403 {
                v.refused = true;
            }
        }
    }
    if status == 429 {
        let wait = retry_after(endpoint, headers, now)
            .or(limit.and_then(|(_, reset_in)| reset_in))
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
    use super::super::tests::{endpoint, headers, left_of};
    use super::*;

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
        assert_eq!(v.left, [left_of(None, 12, Some(Duration::from_secs(31)))]);
        assert_eq!(v.block, None);
        let h = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset),
        ]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert!(!v.refused, "a page with 0 left is still a page");
        let b = v.block.expect("blocked");
        assert_eq!(b.reason, BlockReason::HeadersAtZero);
        assert_eq!(b.wait, Duration::from_secs(31));
        let v = read(&ep, 403, &h, b"{}", now);
        assert!(v.refused, "a 403 at 0 left is the upstream's refusal");
        // A 429 without Retry-After waits for the reset the headers give.
        let v = read(&ep, 429, &h, b"", now);
        assert_eq!(v.block.map(|b| b.wait), Some(Duration::from_secs(31)));
    }

    /// Issue 24, item 4: `remaining` was ignored when the reset header was
    /// absent or not an integer (`1795667000.5`): no drift, no block, and
    /// the next page got a 429.
    #[test]
    fn remaining_counts_without_a_readable_reset_and_a_fraction_rounds_up() {
        let ep = endpoint(None);
        let now = Utc::now();
        for reset in [None, Some("soon"), Some("-3")] {
            let mut pairs = vec![("x-ratelimit-remaining", "0")];
            if let Some(r) = reset {
                pairs.push(("x-ratelimit-reset", r));
            }
            let v = read(&ep, 200, &headers(&pairs), b"{}", now);
            assert_eq!(v.left, [left_of(None, 0, None)], "{reset:?}");
            let b = v.block.expect("blocked for throttle_block");
            assert_eq!(
                (b.wait, b.reason),
                (ep.throttle_block, BlockReason::HeadersAtZero)
            );
            let pairs = [("x-ratelimit-remaining", "7")];
            let v = read(&ep, 200, &headers(&pairs), b"{}", now);
            assert_eq!((v.left, v.block), (vec![left_of(None, 7, None)], None));
        }
        let reset = format!("{}.5", now.timestamp() + 9);
        let h = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset),
        ]);
        let v = read(&ep, 200, &h, b"{}", now);
        // 9.5 s rounds up to the 10th second, and that second is not free.
        assert_eq!(v.block.map(|b| b.wait), Some(Duration::from_secs(11)));
        // Seconds from now, with a fraction too.
        let mut ep = endpoint(None);
        if let Some(h) = ep.ratelimit_headers.as_mut() {
            h.reset_is = ResetIs::DeltaSeconds;
        }
        let h = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "2.25"),
        ]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert_eq!(v.block.map(|b| b.wait), Some(Duration::from_millis(2250)));
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
        assert_eq!(v.block.map(|b| b.wait), Some(ep.max_block));
    }
}
