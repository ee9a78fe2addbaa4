//! What an upstream answer means: its body read within bounds (a
//! `Content-Length` or a body over `max_body` is refused, an error answer
//! read only as far as the log needs), classified ([`Reply`]), with what
//! it says about the upstream's quota ([`Answered`]); the next page and the
//! validators taken out before its text is scrubbed.

use std::borrow::Cow;

use chrono::Utc;
use reqwest::header::HeaderMap;
use serde_json::Value;

use super::paging::{Next, Validators, next_page};
use super::request::Request;
use crate::accounting::{self, Verdict};
use crate::config::Endpoint;
use crate::decode::text::{Text, charset, text};
use crate::decode::{Altered, DECODED_PER_BODY, DecodeError, decode_text};
use crate::scrub::Scrubber;
// Where the worker has always found it.
pub(crate) use crate::config::fmt_size;

/// Error answers (4xx, 5xx) are read this far at most: enough for the log
/// and for a quota reason, never a reason to fail.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// What the upstream answered, as the worker needs it.
#[derive(Debug)]
pub(crate) enum Reply {
    /// 2xx with a JSON body.
    Ok {
        /// The decoded body, every known secret scrubbed from its strings.
        body: Value,
        /// Where it says the next page is (read before the scrub, with
        /// the secret kept as a placeholder).
        next: Next,
        /// Its `ETag` / `Last-Modified`, on a `conditional` endpoint (none
        /// that holds a secret).
        validators: Validators,
        /// HTTP status.
        status: u16,
        /// Its records that differ from what was sent (U+FFFD for bytes
        /// invalid in its charset or a lone surrogate escape, a key sent
        /// twice).
        altered: Altered,
    },
    /// The upstream refused this request for its quota (a 429, a 403 with
    /// a quota reason or at 0 left, Shopify's `THROTTLED`, ...: the
    /// [`Verdict`] says so, and for how long the credential is blocked).
    Throttled {
        /// HTTP status.
        status: u16,
    },
    /// 304 to a conditional request: nothing changed since the validators
    /// it sent.
    NotModified {
        /// HTTP status (304).
        status: u16,
    },
    /// 304 to a request that sent no `If-None-Match` or
    /// `If-Modified-Since`: a bad answer (there was nothing it could say
    /// was unchanged), not a complete run.
    UnaskedNotModified {
        /// HTTP status (304).
        status: u16,
    },
    /// 5xx: try again later.
    ServerError {
        /// HTTP status.
        status: u16,
    },
    /// Other 4xx: the request is wrong; retrying will not help.
    ClientError {
        /// HTTP status.
        status: u16,
        /// The start of the body, for the log (secrets scrubbed).
        detail: String,
    },
    /// 2xx whose body is not JSON.
    BadBody {
        /// HTTP status.
        status: u16,
        /// Why it did not decode (secrets scrubbed).
        detail: String,
    },
    /// A redirect within the origin, under the hop limit: `next` is one more
    /// upstream request, spent like any other.
    Redirect {
        /// HTTP status (301, 302, 303, 307, 308).
        status: u16,
        /// The request it asks for (boxed: it is large and rare).
        next: Box<Request>,
    },
    /// A redirect that is not followed: to another origin, past
    /// [`MAX_REDIRECTS`](super::request::MAX_REDIRECTS), or without a usable `Location`. An answer, so its
    /// units are kept.
    RedirectRefused {
        /// HTTP status.
        status: u16,
        /// Why, naming at most the origins (never a path or query).
        why: String,
    },
    /// A body over the endpoint's `max_body`: reading stopped there. An
    /// answer, so its units are kept.
    TooLarge {
        /// HTTP status.
        status: u16,
        /// The endpoint's `max_body`, bytes.
        limit: u64,
    },
    /// The HTTP client refused to send it: it never left, so its units can
    /// be refunded, and sending it again would fail the same way.
    Unsent {
        /// What failed (no URL, so no secret).
        detail: String,
    },
    /// The request never reached the upstream (connection refused, DNS, TLS
    /// handshake): its units can be refunded.
    Unreached {
        /// What failed (no URL, so no secret).
        detail: String,
    },
    /// Sent, but no complete answer in time: it may have been charged.
    TimedOut {
        /// What failed (no URL).
        detail: String,
    },
}

impl Reply {
    /// The HTTP status it came with, if it came with one.
    pub(crate) fn status(&self) -> Option<u16> {
        self.status_label().parse().ok()
    }

    /// The label of `qw_upstream_responses_total`'s `status`.
    pub(super) fn status_label(&self) -> String {
        match self {
            Reply::Ok { status, .. }
            | Reply::NotModified { status, .. }
            | Reply::UnaskedNotModified { status, .. }
            | Reply::Throttled { status, .. }
            | Reply::ServerError { status, .. }
            | Reply::ClientError { status, .. }
            | Reply::BadBody { status, .. }
            | Reply::Redirect { status, .. }
            | Reply::RedirectRefused { status, .. }
            | Reply::TooLarge { status, .. } => status.to_string(),
            Reply::Unsent { .. } => "unsent".into(),
            Reply::Unreached { .. } => "unreached".into(),
            Reply::TimedOut { .. } => "timeout".into(),
        }
    }
}

/// An answer and what it says about the upstream's quota.
#[derive(Debug)]
pub(crate) struct Answered {
    /// What the answer is.
    pub(crate) reply: Reply,
    /// What it says about the quota: settle, resync, block.
    pub(crate) verdict: Verdict,
}

impl Answered {
    pub(super) fn new(reply: Reply, verdict: Verdict) -> Self {
        Answered { reply, verdict }
    }
}

/// Scrubs every piece of upstream text a reply carries (its next page
/// and validators were taken out before, without the secret).
pub(super) fn scrub_reply(scrubber: &Scrubber, reply: &mut Reply) {
    match reply {
        Reply::Ok { body, .. } => scrubber.scrub_json(body),
        Reply::ClientError { detail, .. }
        | Reply::BadBody { detail, .. }
        | Reply::Unsent { detail }
        | Reply::Unreached { detail }
        | Reply::TimedOut { detail }
        | Reply::RedirectRefused { why: detail, .. } => {
            if let Cow::Owned(clean) = scrubber.scrub(detail) {
                *detail = clean;
            }
        }
        Reply::Throttled { .. }
        | Reply::NotModified { .. }
        | Reply::UnaskedNotModified { .. }
        | Reply::ServerError { .. }
        | Reply::Redirect { .. }
        | Reply::TooLarge { .. } => {}
    }
}

/// The longest validator kept: real ones are short hashes and dates.
const MAX_VALIDATOR: usize = 1024;

/// A conditional endpoint's `ETag` and `Last-Modified`: visible ASCII, at
/// most [`MAX_VALIDATOR`] bytes, and never one that holds a secret (it is
/// kept in Redis and sent back).
fn validators(endpoint: &Endpoint, headers: &HeaderMap, scrubber: &Scrubber) -> Validators {
    if !endpoint.conditional {
        return Validators::default();
    }
    let get = |name| {
        let v = headers.get(name)?.to_str().ok()?.trim();
        let clean = matches!(scrubber.scrub(v), Cow::Borrowed(_));
        (!v.is_empty() && v.len() <= MAX_VALIDATOR && clean).then(|| v.to_owned())
    };
    Validators {
        etag: get(reqwest::header::ETAG),
        last_modified: get(reqwest::header::LAST_MODIFIED),
    }
}

/// Reads and classifies one answer to `req`, and what it says about the
/// upstream's quota.
pub(super) async fn answer(
    endpoint: &Endpoint,
    req: &Request,
    mut resp: reqwest::Response,
    scrubber: &Scrubber,
) -> Answered {
    let status = resp.status().as_u16();
    let headers = std::mem::take(resp.headers_mut());
    // What it says about the quota, from its headers and `body`. The
    // adapters log a value they cannot read as it was written: they read
    // the headers scrubbed.
    let scrubbed = scrubber.headers(&headers);
    let verdict = |body: &[u8]| accounting::read(endpoint, status, &scrubbed, body, Utc::now());
    if matches!(status, 301 | 302 | 303 | 307 | 308) {
        // The body of a redirect is never read: the connection goes.
        let reply = match req.redirected(status, &headers) {
            Ok(next) => Reply::Redirect {
                status,
                next: Box::new(next),
            },
            Err(why) => Reply::RedirectRefused { status, why },
        };
        return Answered::new(reply, verdict(b""));
    }
    let success = (200..300).contains(&status);
    let limit = if success {
        endpoint.max_body
    } else {
        endpoint.max_body.min(ERROR_BODY_LIMIT)
    };
    let too_large = || {
        let reply = Reply::TooLarge {
            status,
            limit: endpoint.max_body,
        };
        Answered::new(reply, verdict(b""))
    };
    if success && resp.content_length().is_some_and(|n| n > limit) {
        return too_large();
    }
    let (body, cut) = match read_body(&mut resp, limit).await {
        Ok(Body::Whole(b)) => (b, false),
        // An error answer's start is all the log needs.
        Ok(Body::Over(b)) if !success => (b, true),
        Ok(Body::Over(_)) => return too_large(),
        Err(e) => return Answered::new(transport_error(e), Verdict::default()),
    };
    // The body as the text it was sent as (its charset, a BOM skipped):
    // what the accounting reads and what is decoded.
    let content_type = headers.get(reqwest::header::CONTENT_TYPE);
    let text = text(&body, content_type.and_then(|v| charset(v.as_bytes())));
    let verdict = verdict(text.text.as_bytes());
    let budget = endpoint.max_body.saturating_mul(DECODED_PER_BODY);
    let mut reply = classify(status, &text, cut, &verdict, scrubber, budget, &req.records);
    // The body's bytes go; only what was decoded from them stays.
    drop(text);
    drop(body);
    reply = checked(reply, req, endpoint.max_records);
    if let Reply::Ok {
        body,
        next,
        validators: v,
        ..
    } = &mut reply
    {
        *next = next_page(&req.next_in, &req.url, &headers, body, scrubber);
        *v = validators(endpoint, &headers, scrubber);
    }
    Answered::new(reply, verdict)
}

/// What `req` makes of a classified answer: too many records, a GraphQL
/// answer with errors and no data, a 304 to a request that was not
/// conditional are bad answers.
fn checked(reply: Reply, req: &Request, max_records: u64) -> Reply {
    if let Some(over) = too_many_records(&reply, &req.records, max_records) {
        return over;
    }
    if let (true, Reply::Ok { body, status, .. }) = (req.graphql, &reply)
        && let Some(detail) = accounting::github_graphql::without_data(body)
    {
        // Never a page (its cursor and records are not there), whatever
        // the endpoint's accounting reads.
        return Reply::BadBody {
            status: *status,
            detail,
        };
    }
    match reply {
        Reply::NotModified { status } if !req.is_conditional() => {
            Reply::UnaskedNotModified { status }
        }
        reply => reply,
    }
}

/// A page with more records than `max_records` where `records` points,
/// as the bad answer it is: nothing of it is written. A missing or
/// non-array `records` is the sink's to say.
fn too_many_records(reply: &Reply, records: &str, max_records: u64) -> Option<Reply> {
    let Reply::Ok { body, status, .. } = reply else {
        return None;
    };
    let n = match body.pointer(records) {
        Some(Value::Array(a)) => a.len(),
        _ => return None,
    };
    (n as u64 > max_records).then(|| Reply::BadBody {
        status: *status,
        detail: format!(
            "{n} records at {records:?}, over the endpoint's max_records {max_records}; nothing written"
        ),
    })
}

/// A body as read: all of it, or the first `limit` bytes of a longer one.
enum Body {
    Whole(Vec<u8>),
    Over(Vec<u8>),
}

/// Reads the body chunk by chunk, never holding more than `limit` bytes;
/// dropping the response on `Over` closes the connection.
async fn read_body(resp: &mut reqwest::Response, limit: u64) -> Result<Body, reqwest::Error> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let hint = resp.content_length().unwrap_or(0).min(1 << 20) as usize;
    let mut buf = Vec::with_capacity(hint.min(limit));
    while let Some(chunk) = resp.chunk().await? {
        let room = limit - buf.len();
        if chunk.len() > room {
            buf.extend_from_slice(&chunk[..room]);
            return Ok(Body::Over(buf));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Body::Whole(buf))
}

pub(super) fn transport_error(e: reqwest::Error) -> Reply {
    // The URL holds the secret: drop it before the error is printed anywhere.
    let e = e.without_url();
    let detail = error_chain(&e);
    if e.is_builder() {
        // Refused before anything was sent (an invalid request).
        Reply::Unsent { detail }
    } else if e.is_timeout() {
        Reply::TimedOut { detail }
    } else if e.is_connect() {
        Reply::Unreached { detail }
    } else {
        // Reset mid-request, or a body cut short: it may have been charged.
        Reply::TimedOut { detail }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Classifies a complete HTTP answer (not a redirect: see
/// [`Reply::Redirect`]) with what its accounting made of it: a refusal
/// (the upstream throttled this request, whatever its status: Shopify's
/// `THROTTLED` comes with a 200), or a bad answer whatever its status (a
/// GraphQL answer with errors and no data). A snippet of `body` (`cut`:
/// the start of a longer one) is scrubbed before it is cut; a decoded body
/// is scrubbed later, after the next page is read from it. `records`: the
/// job's pointer to them, whose records altered on the way in are counted.
pub(crate) fn classify(
    status: u16,
    text: &Text<'_>,
    cut: bool,
    verdict: &Verdict,
    scrubber: &Scrubber,
    budget: u64,
    records: &str,
) -> Reply {
    let body = text.text.as_bytes();
    if verdict.refused {
        return Reply::Throttled { status };
    }
    if let Some(why) = &verdict.bad
        && (200..300).contains(&status)
    {
        // The detail is scrubbed with the reply (`scrub_reply`).
        return Reply::BadBody {
            status,
            detail: why.clone(),
        };
    }
    match status {
        200..=299 => match decode_text(text, records, budget) {
            Ok(decoded) => Reply::Ok {
                body: decoded.body,
                next: Next::End,
                validators: Validators::default(),
                status,
                altered: decoded.altered,
            },
            Err(e @ DecodeError::Json(_)) => Reply::BadBody {
                status,
                detail: format!("{e}: {}", scrubber.snippet(body, cut)),
            },
            Err(e) => Reply::BadBody {
                status,
                detail: e.to_string(),
            },
        },
        // A conditional request's answer; never a failure (one to a request
        // that was not conditional is told apart by the caller).
        304 => Reply::NotModified { status },
        500..=599 => Reply::ServerError { status },
        _ => Reply::ClientError {
            status,
            detail: scrubber.snippet(body, cut),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`classify`] of `body` read as UTF-8, its records at `/items`.
    fn classified(
        status: u16,
        body: &[u8],
        cut: bool,
        verdict: &Verdict,
        scrubber: &Scrubber,
        budget: u64,
    ) -> Reply {
        let text = text(body, None);
        classify(status, &text, cut, verdict, scrubber, budget, "/items")
    }

    fn refused() -> Verdict {
        Verdict {
            refused: true,
            ..Verdict::default()
        }
    }

    /// Issue 24, item 7: a GraphQL answer with errors and no data was
    /// written as a page and the run ended `done`.
    #[test]
    fn a_bad_verdict_makes_a_2xx_a_bad_body() {
        let v = Verdict {
            bad: Some("GraphQL answer has errors and no data: NOT_FOUND".into()),
            ..Verdict::default()
        };
        assert!(matches!(
            classified(200, br#"{"errors":[]}"#, false, &v, &Scrubber::default(), 1 << 20),
            Reply::BadBody { status: 200, detail } if detail.starts_with("GraphQL answer has errors")
        ));
    }

    /// The verdict decides a refusal, whatever the status: Shopify's
    /// `THROTTLED` comes with a 200 and must never be written as a page.
    #[test]
    fn a_refused_answer_is_throttled_whatever_its_status() {
        for status in [200, 400, 403, 429, 503] {
            assert!(
                matches!(classified(status, b"{}", false, &refused(), &Scrubber::default(), 1 << 20), Reply::Throttled { status: s } if s == status)
            );
        }
        assert!(matches!(
            classified(
                200,
                b"{}",
                false,
                &Verdict::default(),
                &Scrubber::default(),
                1 << 20
            ),
            Reply::Ok { .. }
        ));
        assert!(matches!(
            classified(
                429,
                b"",
                false,
                &Verdict::default(),
                &Scrubber::default(),
                1 << 20
            ),
            Reply::ClientError { status: 429, .. }
        ));
    }

    #[test]
    fn bodies_that_are_not_json_are_bad() {
        assert!(matches!(
            classified(
                200,
                b"<html>",
                false,
                &Verdict::default(),
                &Scrubber::default(),
                1 << 20
            ),
            Reply::BadBody { .. }
        ));
        assert!(matches!(
            classified(
                503,
                b"",
                false,
                &Verdict::default(),
                &Scrubber::default(),
                1 << 20
            ),
            Reply::ServerError { status: 503 }
        ));
        assert!(matches!(
            classified(
                404,
                b"nope",
                false,
                &Verdict::default(),
                &Scrubber::default(),
                1 << 20
            ),
            Reply::ClientError { status: 404, .. }
        ));
    }

    /// Issue 12, item 3: a 304 was `failed`. It is its own answer.
    #[test]
    fn a_304_is_not_modified() {
        assert!(matches!(
            classified(
                304,
                b"",
                false,
                &Verdict::default(),
                &Scrubber::default(),
                1 << 20
            ),
            Reply::NotModified { status: 304 }
        ));
    }
}
