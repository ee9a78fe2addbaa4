//! `accounting = "ietf"`: the `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers, parsed as RFC 9651 structured
//! fields (lists of items with parameters) by the `sfv` crate:
//!
//! ```text
//! RateLimit-Policy: "default";q=100;w=60
//! RateLimit: "default";r=50;t=30
//! ```
//!
//! `r` of the first listed limit is what is left (resync); `r=0` blocks for
//! `t` seconds; a 429 (or a 503 that says when to come back) is a refusal,
//! and its `Retry-After` wins over `t`. A field that does not parse is
//! ignored (logged once per answer), never a reason to fail.

use std::time::Duration;

use reqwest::header::HeaderMap;
use sfv::{BareItem, List, ListEntry, Parser};
use tracing::debug;

use super::{Answer, Block, Left, Verdict, bounded, retry_after};
use crate::config::Endpoint;
use crate::quota::BlockReason;

/// The `RateLimit` field.
const RATELIMIT: &str = "ratelimit";
/// The `RateLimit-Policy` field.
const POLICY: &str = "ratelimit-policy";

/// The first limit of a `RateLimit` field: its name, `r` and `t`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Limit {
    name: String,
    r: u64,
    t: Option<u64>,
}

/// A whole number parameter `key` of an item, if it is one and not negative.
fn param(params: &sfv::Parameters, key: &str) -> Option<u64> {
    let n = i64::from(params.get(key)?.as_integer()?);
    u64::try_from(n).ok()
}

/// The first listed limit of a `RateLimit` field's (comma-joined) value.
fn first_limit(value: &str) -> Option<Limit> {
    let list: List = match Parser::new(value).parse() {
        Ok(l) => l,
        Err(e) => {
            debug!(error = %e, "RateLimit is not a structured field list; ignored");
            return None;
        }
    };
    let ListEntry::Item(item) = list.into_iter().next()? else {
        return None;
    };
    let name = match &item.bare_item {
        BareItem::String(s) => s.as_str().to_owned(),
        BareItem::Token(t) => t.as_str().to_owned(),
        _ => String::new(),
    };
    Some(Limit {
        name,
        r: param(&item.params, "r")?,
        t: param(&item.params, "t"),
    })
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
        ListEntry::Item(i) if matches!(&i.bare_item, BareItem::String(s) if s.as_str() == name) => {
            param(&i.params, "q")
        }
        ListEntry::Item(i) if matches!(&i.bare_item, BareItem::Token(t) if t.as_str() == name) => {
            param(&i.params, "q")
        }
        _ => None,
    })
}

/// Reads an answer's `RateLimit` fields.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let (status, headers, now) = (a.status, a.headers, a.now);
    let mut v = Verdict::default();
    let limit = field(headers, RATELIMIT).and_then(|f| first_limit(&f));
    let mut at_zero = None;
    if let Some(l) = &limit {
        v.left = Some(Left::Units(l.r));
        if l.r == 0 {
            let t = l.t.unwrap_or(0);
            let wait = bounded(endpoint, RATELIMIT, &t.to_string(), Duration::from_secs(t));
            // Without a `t` the upstream did not say how long: throttle_block.
            let wait = if l.t.is_some() {
                wait
            } else {
                endpoint.throttle_block
            };
            at_zero = Some(Block::fixed(wait, BlockReason::HeadersAtZero));
            v.block = at_zero.clone();
        }
        debug!(endpoint = %endpoint.name, limit = %l.name, r = l.r, t = ?l.t,
               q = ?policy_quota(headers, &l.name), "RateLimit");
    }
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
    use super::super::tests::{endpoint, headers};
    use super::*;
    use crate::config::Accounting;
    use crate::quota::BlockFor;
    use chrono::Utc;

    #[test]
    fn the_first_listed_limit_is_read_from_structured_fields() {
        let l = first_limit(r#""default";r=50;t=30, "daily";r=900;t=3600"#).expect("a limit");
        assert_eq!((l.name.as_str(), l.r, l.t), ("default", 50, Some(30)));
        let l = first_limit("burst;t=5;r=0").expect("a token name, parameters in any order");
        assert_eq!((l.r, l.t), (0, Some(5)));
        // Not a structured field, no r, a negative r, an inner list: ignored.
        for bad in [
            r#""default";r=1.5"#,
            "default;t=4",
            "x;r=-1",
            "(a b);r=1",
            "r=5, t=3",
            "\"u",
        ] {
            assert_eq!(first_limit(bad), None, "{bad}");
        }
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
        assert_eq!(
            (v.left, v.block, v.refused),
            (Some(Left::Units(42)), None, false)
        );

        let h = headers(&[("ratelimit", r#""default";r=0;t=17"#)]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert!(!v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.for_),
            (
                BlockReason::HeadersAtZero,
                BlockFor::Fixed(Duration::from_secs(17))
            )
        );
        let v = read(&ep, 429, &h, b"", now);
        assert!(v.refused);
        assert_eq!(
            v.block.map(|b| b.for_),
            Some(BlockFor::Fixed(Duration::from_secs(17)))
        );

        let h = headers(&[("ratelimit", r#""default";r=0;t=17"#), ("retry-after", "3")]);
        let v = read(&ep, 429, &h, b"", now);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.for_),
            (
                BlockReason::TooManyRequests,
                BlockFor::Fixed(Duration::from_secs(3))
            )
        );
        // A 503 that says nothing about waiting is a server error, not a refusal.
        assert!(!read(&ep, 503, &HeaderMap::new(), b"", now).refused);
        assert!(read(&ep, 503, &headers(&[("retry-after", "3")]), b"", now).refused);
        // t beyond max_block is clamped.
        let h = headers(&[("ratelimit", "default;r=0;t=999999999")]);
        let v = read(&ep, 200, &h, b"{}", now);
        assert_eq!(v.block.map(|b| b.for_), Some(BlockFor::Fixed(ep.max_block)));
    }
}
