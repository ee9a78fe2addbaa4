//! `accounting = "meta"`: the Meta Graph API's (Facebook, Instagram) usage
//! headers, JSON with percentages of the app's and the business's limits:
//!
//! ```text
//! X-App-Usage: {"call_count":28,"total_time":25,"total_cputime":25}
//! X-Business-Use-Case-Usage: {"17841400000000000":[{"type":"instagram","call_count":80,
//!   "total_cputime":20,"total_time":20,"estimated_time_to_regain_access":0}]}
//! ```
//!
//! The largest percentage is how much of the mirrored window is used
//! (resync); any percentage at `throttle_at` (default 100) or an
//! `estimated_time_to_regain_access` (minutes) above 0 blocks the
//! credential, for that many minutes, else for `throttle_block`. Meta's
//! rate-limit errors (codes 4, 17, 32, 613 and the business use case codes
//! 80001–80014) are refusals, blocked the same way.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;

use super::{Answer, Block, Left, Verdict, bounded};
use crate::config::Endpoint;
use crate::quota::BlockReason;

const APP: &str = "x-app-usage";
const BUSINESS: &str = "x-business-use-case-usage";

/// Meta's rate-limit error codes: application (4), user (17), page (32),
/// per-method (613) and business use case limits.
fn rate_limit_code(code: i64) -> bool {
    matches!(code, 4 | 17 | 32 | 613 | 80001..=80014)
}

/// What the usage headers say: the largest percentage and the longest
/// time to regain access, in minutes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Usage {
    percent: Option<u64>,
    regain_minutes: u64,
}

impl Usage {
    fn percent(&mut self, v: &Value) {
        if let Some(n) = v.as_f64().filter(|n| n.is_finite() && *n >= 0.0) {
            let n = n.ceil().min(1e6) as u64;
            self.percent = Some(self.percent.map_or(n, |p| p.max(n)));
        }
    }

    /// One usage object: every `call_count`, `total_time`, `total_cputime`
    /// is a percentage.
    fn object(&mut self, o: &Value) {
        for k in ["call_count", "total_time", "total_cputime"] {
            if let Some(v) = o.get(k) {
                self.percent(v);
            }
        }
        if let Some(m) = o
            .get("estimated_time_to_regain_access")
            .and_then(Value::as_u64)
        {
            self.regain_minutes = self.regain_minutes.max(m);
        }
    }
}

fn json_header(headers: &HeaderMap, name: &str) -> Option<Value> {
    serde_json::from_slice(headers.get(name)?.as_bytes()).ok()
}

fn usage(headers: &HeaderMap) -> Usage {
    let mut u = Usage::default();
    if let Some(app) = json_header(headers, APP) {
        u.object(&app);
    }
    if let Some(Value::Object(by_business)) = json_header(headers, BUSINESS) {
        for entries in by_business.values() {
            for e in entries.as_array().into_iter().flatten() {
                u.object(e);
            }
        }
    }
    u
}

/// Reads a Meta answer.
pub(crate) fn read(endpoint: &Endpoint, a: &Answer<'_>, throttle_at: u8) -> Verdict {
    let (status, headers, body) = (a.status, a.headers, a.body);
    let u = usage(headers);
    let mut v = Verdict::default();
    if let Some(p) = u.percent {
        v.left_of_resource(Left::UsedPercent(p), None);
    }
    let wait = if u.regain_minutes > 0 {
        let raw = format!("estimated_time_to_regain_access: {}", u.regain_minutes);
        let minutes = Duration::from_secs(u.regain_minutes.saturating_mul(60));
        Some(bounded(endpoint, BUSINESS, &raw, minutes))
    } else if u.percent.is_some_and(|p| p >= u64::from(throttle_at)) {
        Some(endpoint.throttle_block)
    } else {
        None
    };
    v.block = wait.map(|w| Block::fixed(w, BlockReason::Usage));
    let code = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|b| b.pointer("/error/code")?.as_i64());
    if status >= 400 && code.is_some_and(rate_limit_code) {
        v.refused = true;
        let block = v.block.take();
        v.block = Some(Block {
            detail: code.map(|c| format!("error code {c}")),
            ..block.unwrap_or_else(|| Block::fixed(endpoint.throttle_block, BlockReason::Usage))
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::tests::{endpoint, headers};
    use super::super::{Resync, read};
    use super::*;
    use crate::config::Accounting;
    use chrono::Utc;

    fn meta(throttle_at: u8) -> Endpoint {
        endpoint(Some(Accounting::Meta { throttle_at }))
    }

    #[test]
    fn the_largest_percentage_resyncs() {
        let h = headers(&[
            (
                "x-app-usage",
                r#"{"call_count":28,"total_time":25,"total_cputime":25}"#,
            ),
            (
                "x-business-use-case-usage",
                r#"{"1784":[{"type":"instagram","call_count":80,"total_cputime":20,"total_time":20,"estimated_time_to_regain_access":0}]}"#,
            ),
        ]);
        let v = read(&meta(100), 200, &h, b"{}", Utc::now());
        assert_eq!(
            (v.left, v.block, v.refused),
            (
                vec![Resync {
                    limit: None,
                    left: Left::UsedPercent(80),
                    resets_in: None
                }],
                None,
                false
            )
        );
        // At throttle_at: blocked for throttle_block.
        let v = read(&meta(80), 200, &h, b"{}", Utc::now());
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait),
            (BlockReason::Usage, Duration::from_secs(60))
        );
    }

    #[test]
    fn the_time_to_regain_access_blocks_that_many_minutes() {
        let h = headers(&[(
            "x-business-use-case-usage",
            r#"{"1784":[{"type":"instagram","call_count":100,"total_cputime":9,"total_time":9,"estimated_time_to_regain_access":7}]}"#,
        )]);
        let body = br#"{"error":{"message":"There have been too many calls to this Instagram account. Wait a bit and try again.","type":"OAuthException","is_transient":true,"code":80002,"fbtrace_id":"A1"}}"#;
        let v = read(&meta(100), 400, &h, body, Utc::now());
        assert!(v.refused);
        let b = v.block.expect("blocked");
        assert_eq!(
            (b.reason, b.wait),
            (BlockReason::Usage, Duration::from_secs(420))
        );
        assert_eq!(b.detail.as_deref(), Some("error code 80002"));
        assert_eq!(v.left[0].left, Left::UsedPercent(100));
    }

    #[test]
    fn rate_limit_codes_refuse_and_other_errors_do_not() {
        let app = br#"{"error":{"message":"(#4) Application request limit reached","type":"OAuthException","is_transient":true,"code":4}}"#;
        let v = read(&meta(100), 403, &HeaderMap::new(), app, Utc::now());
        assert!(v.refused);
        assert_eq!(v.block.map(|b| b.wait), Some(Duration::from_secs(60)));
        let other = br#"{"error":{"message":"Invalid OAuth access token.","type":"OAuthException","code":190}}"#;
        assert!(!read(&meta(100), 400, &HeaderMap::new(), other, Utc::now()).refused);
        // Headers that are not JSON are ignored.
        let h = headers(&[("x-app-usage", "call_count=50")]);
        assert_eq!(
            read(&meta(100), 200, &h, b"{}", Utc::now()),
            Verdict::default()
        );
    }
}
