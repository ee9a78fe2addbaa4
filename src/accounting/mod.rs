//! Upstream accounting: what one answer says about the upstream's own
//! quota, read as one typed [`Verdict`] that the worker applies in one
//! place (`worker::account`): settle the request to what it really cost,
//! resync the `upstream = true` windows to what is left, block the
//! credential for a while and why, and whether the answer was a refusal.
//!
//! Each upstream's way of saying it is one module, chosen by the endpoint's
//! `accounting`; without one, [`generic`] reads what every endpoint may
//! name (`ratelimit_headers`, `cost_header`, 429s and `quota_reasons`):
//!
//! | module | reads |
//! |---|---|
//! | [`generic`] | `ratelimit_headers`, `cost_header`, 429 / 403 with a quota reason |
//! | [`ietf`] | `RateLimit-Policy` / `RateLimit` structured fields |
//! | [`github`] | `x-ratelimit-*` and `x-ratelimit-resource`, primary and secondary rate limits |
//! | [`github_graphql`] | the same headers, `data.rateLimit`, `RATE_LIMITED`, errors without data |
//! | [`shopify`] | GraphQL `extensions.cost`, `THROTTLED` |
//! | [`meta`] | `X-App-Usage`, `X-Business-Use-Case-Usage`, Meta's rate-limit error codes |
//!
//! An answer speaks for one *resource* of the token ([`Verdict::resource`]:
//! GitHub names it in `x-ratelimit-resource`; absent, the endpoint's): its
//! resyncs and its block apply to that resource's windows and endpoints
//! only, except a block marked [`Block::token_wide`] (GitHub's secondary
//! rate limits). An IETF `RateLimit` lists several limits by name: each is
//! one [`Resync`].
//!
//! Every wait the upstream asks for is bounded here: a `Retry-After` is
//! read as seconds (`7`), decimal seconds (`2.0`, Shopify's) or an HTTP
//! date; one longer than the endpoint's `max_block` is clamped to it and
//! logged as written; a negative or unreadable one is logged and replaced by
//! the endpoint's `throttle_block` (never trusted, never a reason to fail).
//! A wait of zero (`Retry-After: 0`, a date or a reset already past) stays
//! zero here: the worker blocks at least the endpoint's `min_block`, and
//! doubles it for each throttle in a row.
//!
//! Nothing here sends, spends or sleeps: each reader is a pure function of
//! the endpoint, the answer and `now`, unit-tested next to it.

pub(crate) mod generic;
pub(crate) mod github;
pub(crate) mod github_graphql;
pub(crate) mod ietf;
pub(crate) mod meta;
pub(crate) mod shopify;

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;
use tracing::warn;

use crate::config::{Accounting, Endpoint};
use crate::quota::BlockReason;

/// What one answer says about the upstream's quota. Every part is optional;
/// [`Verdict::default`] says nothing.
#[must_use]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// What the request really cost: the spend is settled to it.
    pub(crate) cost: Option<u64>,
    /// The resource the answer counted against, as the upstream names it
    /// (GitHub's `x-ratelimit-resource`); `None`: the endpoint's own, unless
    /// [`Verdict::unusable_resource`] says the answer named one.
    pub(crate) resource: Option<String>,
    /// The answer named its resource, with a name the daemon cannot use
    /// (empty, over 64 bytes, spaces, control or non-ASCII characters: it
    /// would go into Redis keys and metric labels), shown here as the log
    /// shows it. That is a resource no window mirrors, never the endpoint's
    /// own: it resyncs no window and blocks nothing the daemon spends on
    /// (issue 37, item 4: such an answer at 0 left blocked `core`).
    pub(crate) unusable_resource: Option<String>,
    /// What the upstream has left, per limit it reports: the `upstream =
    /// true` windows that mirror each are resynced to it (drift).
    pub(crate) left: Vec<Resync>,
    /// Stop every spend on the answer's resource (or, token-wide, on every
    /// resource of the credential) for a while.
    pub(crate) block: Option<Block>,
    /// The answer is a refusal: the upstream throttled this very request,
    /// which carries no data (always with a `block`).
    pub(crate) refused: bool,
    /// GitHub GraphQL: the token's `x-ratelimit-used` and the reset it
    /// counts towards, for a query that did not ask for its own cost (the
    /// worker settles it to the change since the token's last answer).
    pub(crate) used: Option<Used>,
    /// The answer is a failure whatever its status says (a GraphQL answer
    /// with `errors` and no `data`): why, in words.
    pub(crate) bad: Option<String>,
}

impl Verdict {
    /// Makes the answer a refusal that blocks as `block` says, unless it
    /// is one already (the first reading wins).
    fn refuse(&mut self, block: Block) {
        if !self.refused {
            self.refused = true;
            self.block = Some(block);
        }
    }

    /// The one limit a single-limit upstream reports: `left`, resetting in
    /// `resets_in` if it says when.
    fn left_of_resource(&mut self, left: Left, resets_in: Option<Duration>) {
        self.left.push(Resync {
            limit: None,
            left,
            resets_in,
        });
    }
}

/// What the upstream says it has left on one of its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resync {
    /// Which limit: `None` is the answer's resource (every window of it
    /// that mirrors no limit named here); `Some(name)`: the windows whose
    /// `resource` is `name` (an IETF `RateLimit` lists its limits by name).
    pub(crate) limit: Option<String>,
    /// What is left.
    pub(crate) left: Left,
    /// When the upstream's count of this limit resets, from now, if the
    /// answer says (GitHub's `x-ratelimit-reset`, IETF's `t`, a generic
    /// reset header): drift recorded from it ends then.
    pub(crate) resets_in: Option<Duration>,
}

/// A token's `x-ratelimit-used` as one GitHub GraphQL answer reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Used {
    /// Points used in the current period.
    pub(crate) used: u64,
    /// The period's reset (Unix seconds): a change of it starts a new count.
    pub(crate) reset: u64,
}

/// What the upstream says it has left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// This many units.
    Units(u64),
    /// This share of its limit is used, in percent (Meta): a mirrored
    /// window of `units` has `units − ⌈units × percent / 100⌉` left.
    UsedPercent(u64),
}

impl Left {
    /// What a mirrored window of `units` has left.
    pub(crate) fn of(self, units: u64) -> u64 {
        match self {
            Left::Units(n) => n,
            Left::UsedPercent(p) => {
                let used = (u128::from(units) * u128::from(p.min(100))).div_ceil(100);
                units - used as u64
            }
        }
    }
}

/// A block the upstream asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Block {
    /// How long the upstream said to wait, at most the endpoint's
    /// `max_block`; zero for "now" or a time already past. The worker
    /// blocks at least `min_block`, doubled for each throttle in a row.
    pub(crate) wait: Duration,
    /// The first block of a throttle streak when it is not the endpoint's
    /// `min_block`: GitHub's secondary rate limit waits at least a minute.
    pub(crate) first: Option<Duration>,
    /// Why, in a stable word.
    pub(crate) reason: BlockReason,
    /// What the upstream said, for the task's outcome line (`quotaExceeded`,
    /// `THROTTLED`): a configured or known word, never the upstream's own
    /// text, which could hold anything.
    pub(crate) detail: Option<String>,
    /// Every resource of the credential, not only the answer's (GitHub's
    /// secondary rate limits are per token).
    pub(crate) token_wide: bool,
}

impl Block {
    fn fixed(wait: Duration, reason: BlockReason) -> Self {
        Block {
            wait,
            first: None,
            reason,
            detail: None,
            token_wide: false,
        }
    }
}

/// One answer as an adapter reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer<'a> {
    /// HTTP status.
    pub(crate) status: u16,
    /// Its headers.
    pub(crate) headers: &'a HeaderMap,
    /// Its body as received (a redirect's is empty; an error's, its start).
    pub(crate) body: &'a [u8],
    /// When it came (for resets given as a time).
    pub(crate) now: DateTime<Utc>,
}

/// Reads one answer (status, headers, body as received: a redirect's or a
/// transport error's is empty) of `endpoint` by its `accounting`.
pub(crate) fn read(
    endpoint: &Endpoint,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: DateTime<Utc>,
) -> Verdict {
    let a = Answer {
        status,
        headers,
        body,
        now,
    };
    let mut v = match endpoint.accounting {
        None => generic::read(endpoint, &a),
        Some(Accounting::Ietf) => ietf::read(endpoint, &a),
        Some(Accounting::Github) => github::read(endpoint, &a),
        Some(Accounting::GithubGraphql) => github_graphql::read(endpoint, &a),
        Some(Accounting::ShopifyGraphql) => shopify::read(endpoint, &a),
        Some(Accounting::Meta { throttle_at }) => meta::read(endpoint, &a, throttle_at),
    };
    if v.cost.is_none() {
        v.cost = endpoint
            .cost_header
            .as_deref()
            .and_then(|h| header_u64(headers, h));
    }
    // What every endpoint shares, after its own reading: a 403 or 429 whose
    // body names a configured quota reason, and any 429.
    if matches!(status, 403 | 429)
        && let Some(matched) = quota_reason(body, &endpoint.quota_reasons)
    {
        match &mut v.block {
            // Refused already (a 429, say): the reason names it in the outcome.
            Some(b) if v.refused => {
                b.detail.get_or_insert_with(|| matched.to_owned());
            }
            _ => {
                let wait = retry_after(endpoint, headers, now).unwrap_or(endpoint.throttle_block);
                v.refuse(Block {
                    detail: Some(matched.to_owned()),
                    ..Block::fixed(wait, BlockReason::QuotaReason)
                });
            }
        }
    }
    if status == 429 && !v.refused {
        let wait = retry_after(endpoint, headers, now).unwrap_or(endpoint.throttle_block);
        v.refuse(Block::fixed(wait, BlockReason::TooManyRequests));
    }
    v
}

/// A header's whole number; digits beyond `u64` read as `u64::MAX` (the
/// callers bound it), anything else as absent.
pub(crate) fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    digits(headers.get(name)?.to_str().ok()?.trim())
}

fn digits(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(v.parse().unwrap_or(u64::MAX))
}

/// A Unix time in seconds as a header writes it: whole (`1795667000`) or
/// with a fraction (`1795667000.5`), rounded up (the second is not over
/// until it has passed).
pub(crate) fn epoch_secs(v: &str) -> Option<u64> {
    let d = seconds(v)?;
    Some(d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0)))
}

/// A resource as an upstream names it (`x-ratelimit-resource: search`),
/// if it can name one here: a config's resource name
/// ([`crate::config::resource_name_ok`]); anything else is ignored (it ends
/// up in Redis keys and metric labels).
pub(crate) fn resource_named(raw: &str) -> Option<String> {
    let name = raw.trim().to_ascii_lowercase();
    crate::config::resource_name_ok(&name).then_some(name)
}

/// A header's text, trimmed, if it is text.
fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    Some(headers.get(name)?.to_str().ok()?.trim())
}

/// The resource a header names (`x-ratelimit-resource`): `(None, None)`
/// when the answer has no such header, `(Some(name), None)` for a name the
/// daemon can use ([`resource_named`]), `(None, Some(as logged))` for one
/// it cannot (a value that is not even text included).
pub(crate) fn header_resource(headers: &HeaderMap, name: &str) -> (Option<String>, Option<String>) {
    let Some(raw) = headers.get(name) else {
        return (None, None);
    };
    let text = String::from_utf8_lossy(raw.as_bytes());
    match resource_named(&text) {
        Some(named) => (Some(named), None),
        None => (None, Some(as_logged(text.trim()))),
    }
}

/// `raw` as the log shows an upstream's value: escaped, at most 64 chars.
fn as_logged(raw: &str) -> String {
    raw.chars()
        .take(64)
        .collect::<String>()
        .escape_debug()
        .to_string()
}

/// A wait the upstream asked for, at most the endpoint's `max_block`; a
/// clamped value is logged as it was written.
pub(crate) fn bounded(endpoint: &Endpoint, header: &str, raw: &str, wait: Duration) -> Duration {
    if wait <= endpoint.max_block {
        return wait;
    }
    warn!(
        endpoint = %endpoint.name,
        header,
        raw = %as_logged(raw),
        max_block_ms = endpoint.max_block.as_millis() as u64,
        "the upstream asked for a longer wait than max_block; clamped to max_block"
    );
    endpoint.max_block
}

/// Seconds as an upstream writes them: whole (`7`) or decimal (`2.0`,
/// `0.5`), rounded up to whole milliseconds; `None` for anything else,
/// a negative number included. Huge values saturate (the caller bounds them).
fn seconds(v: &str) -> Option<Duration> {
    if let Some(s) = digits(v) {
        return Some(Duration::from_secs(s));
    }
    let (whole, frac) = v.split_once('.')?;
    let ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !ok(whole) || !ok(frac) {
        return None;
    }
    let secs = if whole.is_empty() { 0 } else { digits(whole)? };
    // Milliseconds from the first three decimals, rounded up by the rest.
    let mut ms: u64 = 0;
    for (i, b) in frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .enumerate()
    {
        ms += u64::from(b - b'0') * 10u64.pow(2 - i as u32);
    }
    if frac.bytes().skip(3).any(|b| b != b'0') {
        ms += 1;
    }
    Some(Duration::from_secs(secs).saturating_add(Duration::from_millis(ms)))
}

/// `Retry-After`: seconds (whole or decimal) or an HTTP date, at most
/// `max_block`. Anything else, a negative number included, is logged as
/// written and read as `None`: the endpoint's `throttle_block` applies.
pub(crate) fn retry_after(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<Duration> {
    let raw = headers.get(reqwest::header::RETRY_AFTER)?;
    let v = raw.to_str().unwrap_or("").trim();
    let wait = if let Some(wait) = seconds(v) {
        wait
    } else if let Ok(at) = httpdate::parse_http_date(v) {
        let at: DateTime<Utc> = at.into();
        // A date already past: retry now.
        (at - now).to_std().unwrap_or(Duration::ZERO)
    } else {
        warn!(
            endpoint = %endpoint.name,
            raw = %as_logged(&String::from_utf8_lossy(raw.as_bytes())),
            throttle_block_ms = endpoint.throttle_block.as_millis() as u64,
            "Retry-After is neither seconds nor an HTTP date; using throttle_block"
        );
        return None;
    };
    Some(bounded(endpoint, "retry-after", v, wait))
}

/// Until a second after `reset` (a Unix time in seconds, as a header
/// writes it: the reset second itself is not yet free), counted from `now`
/// to the millisecond, at most `max_block`. Regression (issue 33 item 4):
/// counted from `now`'s whole second, drift bound to a reset T (and the
/// block until it) ended anywhere between T + 1 s and T + 2 s.
pub(crate) fn until_epoch(
    endpoint: &Endpoint,
    header: &str,
    raw: &str,
    reset: u64,
    now: DateTime<Utc>,
) -> Duration {
    let end_ms = (i128::from(reset) + 1) * 1000;
    let ms = (end_ms - i128::from(now.timestamp_millis())).max(0);
    let wait = Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
    bounded(endpoint, header, raw, wait)
}

/// The quota reason an error body gives, if it is one of `reasons`: a
/// Google-style `error.errors[].reason` equal to one, or else a top-level
/// `message` or `error.message` (GitHub, most others) that holds one,
/// compared without case. What is returned is the configured reason, never
/// the upstream's text.
pub(crate) fn quota_reason<'r>(body: &[u8], reasons: &'r [String]) -> Option<&'r str> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let listed = v
        .pointer("/error/errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("reason")?.as_str())
        .find_map(|r| reasons.iter().find(|q| *q == r));
    if let Some(r) = listed {
        return Some(r);
    }
    let messages = messages(&v);
    reasons
        .iter()
        .filter(|q| !q.is_empty())
        .find(|q| {
            let q = q.to_lowercase();
            messages.iter().any(|m| m.contains(&q))
        })
        .map(String::as_str)
}

/// A body's top-level `message` and `error.message`, lower-cased.
pub(crate) fn messages(v: &Value) -> Vec<String> {
    [v.get("message"), v.pointer("/error/message")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_lowercase)
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::{LimiterUnavailable, RatelimitHeaders, ResetIs};
    use reqwest::header::HeaderValue;
    use std::num::NonZeroU64;

    /// An endpoint with `accounting`, YouTube's quota reasons, a 60 s
    /// `throttle_block` and a one-hour `max_block`.
    /// Now, on a whole second: what a test that compares a wait with a
    /// whole number of seconds until a reset (a header's epoch second) reads
    /// the answer at (a reset ends a second after it, to the millisecond).
    pub(crate) fn whole_second_now() -> DateTime<Utc> {
        DateTime::from_timestamp(Utc::now().timestamp(), 0).expect("now")
    }

    pub(crate) fn endpoint(accounting: Option<Accounting>) -> Endpoint {
        Endpoint {
            name: "e".into(),
            credential: "c".into(),
            cost: NonZeroU64::MIN,
            limiter_unavailable: LimiterUnavailable::FailClosed,
            windows: vec![],
            charge_credential: true,
            timeout: Duration::from_secs(1),
            throttle_block: Duration::from_secs(60),
            quota_reasons: vec!["quotaExceeded".into(), "rateLimitExceeded".into()],
            ratelimit_headers: accounting.is_none().then(|| RatelimitHeaders {
                remaining: "x-ratelimit-remaining".into(),
                reset: "x-ratelimit-reset".into(),
                reset_is: ResetIs::EpochSeconds,
            }),
            cost_header: Some("x-quota-cost".into()),
            max_body: crate::config::defaults::MAX_BODY,
            max_records: crate::config::defaults::MAX_RECORDS,
            max_block: Duration::from_secs(3600),
            conditional: false,
            not_modified_cost: 1,
            accounting,
            resource: None,
            min_block: Duration::from_secs(1),
            throttle_block_max: Duration::from_secs(900),
        }
    }

    /// One resync: `left` units of `limit` (`None`: the answer's resource),
    /// resetting in `resets_in`.
    pub(crate) fn left_of(limit: Option<&str>, left: u64, resets_in: Option<Duration>) -> Resync {
        Resync {
            limit: limit.map(str::to_owned),
            left: Left::Units(left),
            resets_in,
        }
    }

    /// Headers from `(name, value)` pairs.
    pub(crate) fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                reqwest::header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    /// Regression (issue 33 item 4): drift bound to an upstream reset T
    /// (and the block until it) ended between T + 1 s and T + 2 s, counted
    /// from the whole second of now; it ends at T + 1 s to the millisecond.
    #[test]
    fn a_reset_ends_a_second_after_it_to_the_millisecond() {
        let ep = endpoint(None);
        let t: u64 = 1_700_000_020;
        let at = |ms_before: i64| {
            let now = DateTime::from_timestamp_millis(t as i64 * 1000 - ms_before).expect("time");
            until_epoch(&ep, "x-ratelimit-reset", "r", t, now)
        };
        assert_eq!(at(300), Duration::from_millis(1_300));
        assert_eq!(at(7_700), Duration::from_millis(8_700));
        assert_eq!(at(-700), Duration::from_millis(300));
        assert_eq!(at(-1_500), Duration::ZERO, "a reset long past");
    }

    fn wait_of(v: &Verdict) -> Option<Duration> {
        Some(v.block.as_ref()?.wait)
    }

    /// Issue 13: Retry-After as seconds, as Shopify's `2.0`, as an HTTP
    /// date; huge values clamped to `max_block`; negative and garbage ones
    /// are `throttle_block`, never trusted. Regression (issue 9, item 4):
    /// Retry-After 999999999 blocked a credential for 31 years; u64::MAX
    /// failed the block script.
    #[test]
    fn retry_after_reads_seconds_decimals_and_dates_and_bounds_the_rest() {
        let ep = endpoint(None);
        let now = Utc::now();
        let at = |raw: &str| {
            let v = read(&ep, 429, &headers(&[("retry-after", raw)]), b"", now);
            assert!(v.refused, "{raw}");
            assert_eq!(
                v.block.as_ref().map(|b| b.reason),
                Some(BlockReason::TooManyRequests)
            );
            wait_of(&v).expect("a block")
        };
        assert_eq!(at("7"), Duration::from_secs(7));
        assert_eq!(at("2.0"), Duration::from_secs(2));
        assert_eq!(at("0.25"), Duration::from_millis(250));
        assert_eq!(at("1.0001"), Duration::from_millis(1001));
        let date = httpdate::fmt_http_date((now + chrono::Duration::seconds(30)).into());
        let d = at(&date);
        assert!(
            d > Duration::from_secs(28) && d <= Duration::from_secs(30),
            "{d:?}"
        );
        let past = httpdate::fmt_http_date((now - chrono::Duration::seconds(30)).into());
        // A date already past: no wait (the worker blocks `min_block`).
        assert_eq!(at(&past), Duration::ZERO);
        for huge in [
            "999999999",
            "18446744073709551615",
            "99999999999999999999999999",
            "1e9",
            "99999999999.5",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            let want = if huge == "1e9" {
                ep.throttle_block
            } else {
                ep.max_block
            };
            assert_eq!(at(huge), want, "{huge}");
        }
        for bad in ["-5", "-2.0", "soon", "", ".", "1.", "NaN", "inf", "2,0"] {
            let want = if bad == "1." {
                Duration::from_secs(1)
            } else {
                ep.throttle_block
            };
            assert_eq!(at(bad), want, "{bad:?}");
        }
    }

    #[test]
    fn quota_reasons_and_429s_refuse_on_every_adapter() {
        for acc in [
            None,
            Some(Accounting::Ietf),
            Some(Accounting::Github),
            Some(Accounting::GithubGraphql),
            Some(Accounting::ShopifyGraphql),
            Some(Accounting::Meta { throttle_at: 100 }),
        ] {
            let ep = endpoint(acc);
            let body = br#"{"error":{"code":403,"errors":[{"reason":"quotaExceeded"}]}}"#;
            let v = read(&ep, 403, &HeaderMap::new(), body, Utc::now());
            assert!(v.refused, "{acc:?}");
            let b = v.block.expect("block");
            assert_eq!(b.reason, BlockReason::QuotaReason);
            assert_eq!(b.detail.as_deref(), Some("quotaExceeded"));
            let v = read(&ep, 429, &HeaderMap::new(), b"", Utc::now());
            assert!(v.refused, "{acc:?}");
            let v = read(
                &ep,
                403,
                &HeaderMap::new(),
                br#"{"message":"nope"}"#,
                Utc::now(),
            );
            assert!(
                !v.refused,
                "{acc:?}: a 403 that names no quota is no refusal"
            );
            let v = read(
                &ep,
                200,
                &headers(&[("x-quota-cost", "3")]),
                b"{}",
                Utc::now(),
            );
            assert_eq!(v.cost, Some(3), "{acc:?}: cost_header on every adapter");
        }
    }

    /// Regression: a 5xx's reported cost was dropped, so its units could
    /// never be settled to what the upstream said it charged.
    #[test]
    fn error_answers_carry_their_reported_cost() {
        let ep = endpoint(None);
        let h = headers(&[("x-quota-cost", "0")]);
        for status in [503, 429, 404, 304, 302] {
            assert_eq!(
                read(&ep, status, &h, b"", Utc::now()).cost,
                Some(0),
                "{status}"
            );
        }
        assert_eq!(
            read(&ep, 200, &HeaderMap::new(), b"{}", Utc::now()).cost,
            None
        );
    }

    /// Issue 12, item 4: GitHub and most others say "rate limit" in a
    /// top-level `message`, Google APIs in `error.message` too.
    #[test]
    fn quota_reasons_match_messages_without_case() {
        let mut ep = endpoint(None);
        ep.quota_reasons = vec!["quotaExceeded".into(), "rate limit exceeded".into()];
        let detail = |ep: &Endpoint, body: &[u8]| {
            let v = read(ep, 403, &HeaderMap::new(), body, Utc::now());
            v.refused.then(|| v.block.and_then(|b| b.detail)).flatten()
        };
        let gh =
            br#"{"message": "API Rate Limit Exceeded for user ID 1.", "documentation_url": "x"}"#;
        assert_eq!(detail(&ep, gh).as_deref(), Some("rate limit exceeded"));
        let nested = br#"{"error": {"code": 403, "message": "Daily RATE LIMIT EXCEEDED."}}"#;
        assert_eq!(detail(&ep, nested).as_deref(), Some("rate limit exceeded"));
        // The reasons list still wins, and other 403s are no refusal.
        let both = br#"{"error": {"message": "rate limit exceeded", "errors": [{"reason": "quotaExceeded"}]}}"#;
        assert_eq!(detail(&ep, both).as_deref(), Some("quotaExceeded"));
        let other = br#"{"message": "Resource not accessible by integration"}"#;
        assert_eq!(detail(&ep, other), None);
        ep.quota_reasons = vec![String::new()];
        assert_eq!(detail(&ep, other), None, "an empty reason matches nothing");
        // YouTube's: the reason, without a Retry-After: throttle_block.
        let yt = br#"{"error":{"code":403,"errors":[{"reason":"quotaExceeded","domain":"youtube.quota"}]}}"#;
        let v = read(&endpoint(None), 403, &HeaderMap::new(), yt, Utc::now());
        assert_eq!(wait_of(&v), Some(Duration::from_secs(60)));
    }

    #[test]
    fn a_used_percentage_leaves_the_rest_of_any_window() {
        assert_eq!(Left::UsedPercent(80).of(200), 40);
        assert_eq!(Left::UsedPercent(33).of(10), 6, "3.3 used rounds up to 4");
        assert_eq!(Left::UsedPercent(150).of(10), 0);
        assert_eq!(Left::UsedPercent(0).of(10), 10);
        assert_eq!(Left::Units(7).of(10), 7);
    }
}
