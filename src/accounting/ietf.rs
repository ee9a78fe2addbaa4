//! `accounting = "ietf"`: the `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers, parsed as RFC 9651 structured
//! fields (lists of items with parameters) by the `sfv` crate:
//!
//! ```text
//! RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400
//! RateLimit: "burst";r=50;t=30, "daily";r=900;t=3600
//! ```
//!
//! Every listed limit is read: each one's `r` resyncs the windows whose
//! `resource` names it, and the smallest `r` the answer's resource's other
//! `upstream = true` windows, each with drift that ends at its `t`. A
//! limit at `r=0` (`0.0` too: a decimal is read, rounded down) anywhere
//! blocks the endpoint's resource until every limit at 0 has reset (the
//! longest `t`). A 429 (or a 503 that says when to come back) is a
//! refusal, and its `Retry-After` wins over `t`. A field that does not
//! parse is ignored (logged at debug), never a reason to fail.

use std::time::Duration;

use reqwest::header::HeaderMap;
use sfv::{BareItem, List, ListEntry, Parser};
use tracing::debug;

use super::{Answer, Block, Left, Resync, Verdict, bounded, retry_after};
use crate::config::Endpoint;
use crate::quota::BlockReason;

/// The `RateLimit` field.
const RATELIMIT: &str = "ratelimit";
/// The `RateLimit-Policy` field.
const POLICY: &str = "ratelimit-policy";

/// One listed limit of a `RateLimit` field: its name, `r` and `t`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Limit {
    name: String,
    r: u64,
    t: Option<u64>,
}

/// A number parameter `key` of an item, if it is one and not negative: an
/// integer, or a decimal rounded down (`down`: what is left is never read
/// as more than said) or up (a time is never read as shorter).
fn param(params: &sfv::Parameters, key: &str, down: bool) -> Option<u64> {
    let v = params.get(key)?;
    if let Some(n) = v.as_integer() {
        return u64::try_from(i64::from(n)).ok();
    }
    let milli = i64::from(v.as_decimal()?.as_integer_scaled_1000());
    let milli = u64::try_from(milli).ok()?;
    Some(if down {
        milli / 1000
    } else {
        milli.div_ceil(1000)
    })
}

/// The name of a list item: a string or a token.
fn item_name(item: &BareItem) -> Option<&str> {
    match item {
        BareItem::String(s) => Some(s.as_str()),
        BareItem::Token(t) => Some(t.as_str()),
        _ => None,
    }
}

/// Every listed limit of a `RateLimit` field's (comma-joined) value, in
/// order; an item without a readable `r` is left out.
fn limits(value: &str) -> Vec<Limit> {
    let list: List = match Parser::new(value).parse() {
        Ok(l) => l,
        Err(e) => {
            debug!(error = %e, "RateLimit is not a structured field list; ignored");
            return Vec::new();
        }
    };
    list.into_iter()
        .filter_map(|e| match e {
            ListEntry::Item(item) => Some(Limit {
                name: item_name(&item.bare_item).unwrap_or_default().to_owned(),
                r: param(&item.params, "r", true)?,
                t: param(&item.params, "t", false),
            }),
            ListEntry::InnerList(_) => None,
        })
        .collect()
}

/// A field's lines joined as one list (RFC 9110: several lines of a list
/// field are one value, comma-separated).
fn field(headers: &HeaderMap, name: &str) -> Option<String> {
    let lines: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!lines.is_empty()).then(|| lines.join(", "))
}

/// The quota (`q`) the policy of `name` declares, for the log.
fn policy_quota(headers: &HeaderMap, name: &str) -> Option<u64> {
    let list: List = Parser::new(&field(headers, POLICY)?).parse().ok()?;
    list.iter().find_map(|e| match e {
        ListEntry::Item(i) if item_name(&i.bare_item) == Some(name) => param(&i.params, "q", true),
        _ => None,
    })
}

/// `t` as a wait, at most `max_block`.
fn wait_of(endpoint: &Endpoint, t: u64) -> Duration {
    bounded(endpoint, RATELIMIT, &t.to_string(), Duration::from_secs(t))
}

/// Reads an answer's `RateLimit` fields.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let (status, headers, now) = (a.status, a.headers, a.now);
    let mut v = Verdict::default();
    let listed = field(headers, RATELIMIT).map_or_else(Vec::new, |f| limits(&f));
    for l in &listed {
        debug!(endpoint = %endpoint.name, limit = %l.name, r = l.r, t = ?l.t,
               q = ?policy_quota(headers, &l.name), "RateLimit");
        if let Some(name) = super::resource_named(&l.name) {
            v.left.push(Resync {
                limit: Some(name),
                left: Left::Units(l.r),
                resets_in: l.t.map(|t| wait_of(endpoint, t)),
            });
        }
    }
    // The most restrictive, for the windows that name no listed limit.
    if let Some(l) = listed.iter().min_by_key(|l| l.r) {
        v.left_of_resource(Left::Units(l.r), l.t.map(|t| wait_of(endpoint, t)));
    }
    // Blocked until every exhausted limit has reset; a limit at 0 without
    // a `t` did not say how long: throttle_block.
    let at_zero = (listed.iter().filter(|l| l.r == 0))
        .map(|l| {
            l.t.map_or(endpoint.throttle_block, |t| wait_of(endpoint, t))
        })
        .max()
        .map(|wait| Block::fixed(wait, BlockReason::HeadersAtZero));
    v.block = at_zero.clone();
    let waits = retry_after(endpoint, headers, now);
    let refused = status == 429 || (status == 503 && (waits.is_some() || at_zero.is_some()));
    if refused {
        v.refused = true;
        v.block = Some(match (waits, at_zero) {
            (Some(wait), _) => Block::fixed(wait, BlockReason::TooManyRequests),
            (None, Some(b)) => b,
            (None, None) => Block::fixed(endpoint.throttle_block, BlockReason::TooManyRequests),
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::read;
    use super::super::tests::{endpoint, headers, left_of};
    use super::*;
    use crate::config::Accounting;
    use chrono::Utc;

    #[test]
    fn every_listed_limit_is_read_from_structured_fields() {
        let l = limits(r#""default";r=50;t=30, "daily";r=900;t=3600"#);
        let got: Vec<_> = l.iter().map(|l| (l.name.as_str(), l.r, l.t)).collect();
        assert_eq!(got, [("default", 50, Some(30)), ("daily", 900, Some(3600))]);
        let l = limits("burst;t=5;r=0");
        assert_eq!(
            (l[0].r, l[0].t),
            (0, Some(5)),
            "a token name, parameters in any order"
        );
        // Issue 24, item 3: `r=0.0` was ignored. Decimals: r down, t up.
        let l = limits(r#""a";r=0.0;t=2.5, "b";r=7.9"#);
        let got: Vec<_> = l.iter().map(|l| (l.r, l.t)).collect();
        assert_eq!(got, [(0, Some(3)), (7, None)]);
        // Not a structured field, no r, a negative r, an inner list: left out.
        for bad in [
            "default;t=4",
            "x;r=-1",
            "(a b);r=1",
            "r=5, t=3",
            "\"u",
            "x;r=-0.5",
        ] {
            assert_eq!(limits(bad), [], "{bad}");
        }
        let l = limits("(a b);r=1, ok;r=2");
        assert_eq!(l.len(), 1, "the readable ones stay: {l:?}");
    }

    #[test]
    fn r_resyncs_r0_blocks_for_t_and_retry_after_wins() {
        let ep = endpoint(Some(Accounting::Ietf));
        let now = Utc::now();
        let h = headers(&[
            ("ratelimit-policy", r#""default";q=100;w=60"#),
            ("ratelimit", r#""default";r=42;t=17"#),
        ]);
        let v = read(&ep, 200, &h, b"{}", now);
        let in17 = Some(Duration::from_secs(17));
        assert_eq!(
            v.left,
            [left_of(Some("default"), 42, in17), left_of(None, 42, in17)]
        );
        assert_eq!((v.block, v.refused, v.resource), (None, false, None));

        let h = headers(&[("ratelimit", r#""default";r=0;t=17"#)]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert!(!v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait),
            (BlockReason::HeadersAtZero, Duration::from_secs(17))
        );
        let v = read(&ep, 429, &h, b"", now);
        assert!(v.refused);
        assert_eq!(v.block.map(|b| b.wait), Some(Duration::from_secs(17)));

        let h = headers(&[("ratelimit", r#""default";r=0;t=17"#), ("retry-after", "3")]);
        let v = read(&ep, 429, &h, b"", now);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait),
            (BlockReason::TooManyRequests, Duration::from_secs(3))
        );
        // A 503 that says nothing about waiting is a server error, not a refusal.
        assert!(!read(&ep, 503, &HeaderMap::new(), b"", now).refused);
        assert!(read(&ep, 503, &headers(&[("retry-after", "3")]), b"", now).refused);
        // t beyond max_block is clamped.
        let h = headers(&[("ratelimit", "default;r=0;t=999999999")]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert_eq!(v.block.map(|b| b.wait), Some(ep.max_block));
    }

    /// Issue 24, item 3: `"burst";r=50;t=1, "daily";r=0;t=3000` was read
    /// as 50 left, and the next request got a 429.
    #[test]
    fn a_limit_at_zero_anywhere_blocks_until_it_resets() {
        let ep = endpoint(Some(Accounting::Ietf));
        let now = Utc::now();
        let h = headers(&[("ratelimit", r#""burst";r=50;t=1, "daily";r=0;t=3000"#)]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert!(!v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait),
            (BlockReason::HeadersAtZero, Duration::from_secs(3000))
        );
        let (s1, s3000) = (
            Some(Duration::from_secs(1)),
            Some(Duration::from_secs(3000)),
        );
        assert_eq!(
            v.left,
            [
                left_of(Some("burst"), 50, s1),
                left_of(Some("daily"), 0, s3000),
                left_of(None, 0, s3000),
            ],
            "each by name, the most restrictive for the rest"
        );
        // Two at zero: until the later one resets; `r=0.0` is zero.
        let h = headers(&[("ratelimit", r#""burst";r=0.0;t=2, "hour";r=0;t=40"#)]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert_eq!(v.block.map(|b| b.wait), Some(Duration::from_secs(40)));
        // At zero without a t: throttle_block.
        let h = headers(&[("ratelimit", r#""burst";r=3;t=2, "day";r=0"#)]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert_eq!(v.block.map(|b| b.wait), Some(ep.throttle_block));
    }
}
