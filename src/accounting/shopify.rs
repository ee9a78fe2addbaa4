//! `accounting = "shopify-graphql"`: the Shopify GraphQL Admin API's
//! leaky bucket, reported in every answer's body:
//!
//! ```json
//! {"extensions": {"cost": {"requestedQueryCost": 101, "actualQueryCost": 46,
//!   "throttleStatus": {"maximumAvailable": 1000.0, "currentlyAvailable": 954, "restoreRate": 50.0}}}}
//! ```
//!
//! The spend is settled to `actualQueryCost` (Shopify takes the requested
//! cost up front and refunds the difference); `currentlyAvailable` resyncs
//! the mirrored bucket; a `THROTTLED` error (answered with HTTP 200) is a
//! refusal that charged nothing, blocked for exactly the refill it needs,
//! ⌈(requestedQueryCost − currentlyAvailable) / restoreRate⌉ seconds.

use std::time::Duration;

use serde_json::Value;

use super::{Answer, Block, Left, Verdict, bounded, retry_after};
use crate::config::Endpoint;
use crate::quota::BlockReason;

/// A non-negative JSON number (Shopify writes some as `1000.0`).
fn number(v: &Value, ptr: &str) -> Option<f64> {
    v.pointer(ptr)?
        .as_f64()
        .filter(|n| n.is_finite() && *n >= 0.0)
}

/// Whole units, saturating: what an `f64` count of points comes to.
fn units(n: f64) -> u64 {
    if n >= u64::MAX as f64 {
        u64::MAX
    } else {
        n as u64
    }
}

/// Reads a Shopify GraphQL answer.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>) -> Verdict {
    let (headers, body, now) = (a.headers, a.body, a.now);
    let mut v = Verdict::default();
    let Ok(json) = serde_json::from_slice::<Value>(body) else {
        return v;
    };
    let cost = "/extensions/cost";
    let requested = number(&json, &format!("{cost}/requestedQueryCost"));
    let actual = number(&json, &format!("{cost}/actualQueryCost"));
    let available = number(&json, &format!("{cost}/throttleStatus/currentlyAvailable"));
    let restore = number(&json, &format!("{cost}/throttleStatus/restoreRate"));
    // Fewer points than reported, never more: what is available rounds down.
    if let Some(a) = available {
        v.left_of_resource(Left::Units(units(a.floor())), None);
    }
    let throttled = (json
        .get("errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten())
    .any(|e| e.pointer("/extensions/code").and_then(Value::as_str) == Some("THROTTLED"));
    if !throttled {
        v.cost = actual.map(|a| units(a.ceil()));
        return v;
    }
    // A throttled query is not charged.
    v.cost = Some(0);
    let wait = match (requested, available, retry_after(endpoint, headers, now)) {
        (_, _, Some(wait)) => wait,
        (Some(req), Some(avail), None) if restore.is_some_and(|r| r > 0.0) => {
            let secs = ((req - avail) / restore.unwrap_or(1.0)).ceil().max(0.0);
            let raw = format!("({req} - {avail}) / {}", restore.unwrap_or(1.0));
            bounded(
                endpoint,
                "extensions.cost",
                &raw,
                Duration::from_secs_f64(secs.min(1e12)),
            )
        }
        _ => endpoint.throttle_block,
    };
    v.refused = true;
    v.block = Some(Block {
        detail: Some("THROTTLED".to_owned()),
        ..Block::fixed(wait, BlockReason::Throttled)
    });
    v
}

#[cfg(test)]
mod tests {
    use super::super::tests::endpoint;
    use super::super::{Resync, read};
    use super::*;
    use crate::config::Accounting;
    use chrono::Utc;
    use reqwest::header::HeaderMap;

    #[test]
    fn settles_to_the_actual_cost_and_resyncs_to_what_is_available() {
        let ep = endpoint(Some(Accounting::ShopifyGraphql));
        let body = br#"{"data":{"products":{"nodes":[]}},"extensions":{"cost":{"requestedQueryCost":101,"actualQueryCost":46,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":954.5,"restoreRate":50.0}}}}"#;
        let v = read(&ep, 200, &HeaderMap::new(), body, Utc::now());
        assert_eq!(
            (v.cost, v.left, v.refused),
            (
                Some(46),
                vec![Resync {
                    limit: None,
                    left: Left::Units(954),
                    resets_in: None
                }],
                false
            )
        );
        assert_eq!(v.block, None);
    }

    #[test]
    fn throttled_blocks_for_the_refill_it_needs_and_charges_nothing() {
        let ep = endpoint(Some(Accounting::ShopifyGraphql));
        let body = br#"{"errors":[{"message":"Throttled","extensions":{"code":"THROTTLED","documentation":"https://shopify.dev/api/usage/rate-limits"}}],"extensions":{"cost":{"requestedQueryCost":752,"actualQueryCost":null,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":640,"restoreRate":50.0}}}}"#;
        let v = read(&ep, 200, &HeaderMap::new(), body, Utc::now());
        assert!(
            v.refused,
            "THROTTLED comes with HTTP 200 and is still a refusal"
        );
        assert_eq!(
            (v.cost, v.left),
            (
                Some(0),
                vec![Resync {
                    limit: None,
                    left: Left::Units(640),
                    resets_in: None
                }]
            )
        );
        let b = v.block.expect("blocked");
        // (752 − 640) / 50 = 2.24: 3 s.
        assert_eq!(
            (b.reason, b.wait),
            (BlockReason::Throttled, Duration::from_secs(3))
        );
    }

    #[test]
    fn a_body_without_cost_says_nothing() {
        let ep = endpoint(Some(Accounting::ShopifyGraphql));
        let v = read(&ep, 200, &HeaderMap::new(), br#"{"data":{}}"#, Utc::now());
        assert_eq!(v, Verdict::default());
        let v = read(&ep, 200, &HeaderMap::new(), b"not json", Utc::now());
        assert_eq!(v, Verdict::default());
    }
}
