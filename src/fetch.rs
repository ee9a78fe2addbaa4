//! Requests to the upstream: rendering a job's request template for one page,
//! sending it, and classifying the answer into what the worker must do.
//!
//! Everything the upstream can make us do is bounded here (docs/security.md):
//!
//! - **Redirects** are never followed by the HTTP client. A 301, 302, 303,
//!   307 or 308 to the origin (scheme, host, port) of the job's request URL
//!   comes back as [`Reply::Redirect`] with the next request, which the
//!   worker spends for like any other request, at most [`MAX_REDIRECTS`]
//!   hops; one to another origin is never requested ([`Reply::RedirectRefused`]).
//!   No `Referer` is ever sent.
//! - **Bodies** are read chunk by chunk up to the endpoint's `max_body`
//!   (a `Content-Length` over it is refused before reading anything).
//! - **Waits** the upstream asks for (Retry-After, a ratelimit reset) are
//!   clamped to the endpoint's `max_block`.
//! - **Text** it sends back (error bodies, undecodable bodies, the strings of
//!   a JSON body) has every known secret scrubbed ([`Scrubber`]) before it is
//!   logged, stored or put in an error.
//! - **URL placeholders** are percent-encoded as RFC 6570 simple expansion
//!   does, so no value changes the URL's path, query or fragment (`{+name}`
//!   opts out); an item whose values hold control characters is refused.
//!
//! The rendered URL carries the secret (`key={secret}`), so nothing here ever
//! logs or returns it: errors are stripped of their URL before they leave,
//! and a [`Request`] prints only its method and origin.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aho_corasick::{AhoCorasick, MatchKind};
use chrono::{DateTime, Utc};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tracing::warn;

use crate::config::{Endpoint, Expansion, Job, Method, PageStyle, ResetIs, Secret, Secrets};
use crate::paging::{self, Next, Stored, StoredError, Validators};

/// Redirects followed for one page at most (each one spent). The request
/// before them makes `MAX_REDIRECTS + 1` upstream requests in all.
pub(crate) const MAX_REDIRECTS: u32 = 3;

/// Error answers (4xx, 5xx) are read this far at most: enough for the log
/// and for a quota reason, never a reason to fail.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

/// What a scrubbed secret is replaced with.
pub(crate) const REDACTED: &str = "[redacted]";

/// RFC 3986 unreserved characters stay; everything else is encoded
/// (RFC 6570 simple expansion).
const SIMPLE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Values the request template's placeholders take for one task.
#[derive(Debug, Clone)]
pub(crate) struct Placeholders<'a> {
    /// The job's name: `{job}`.
    pub job: &'a str,
    /// The fan-out item: `{region}` and friends.
    pub item: &'a [(String, String)],
    /// The credential's secret: `{secret}`.
    pub secret: &'a Secret,
    /// `{date}`: the UTC day the request is made.
    pub date: String,
    /// `{since}`: when the item's last run that ended `done` started, RFC
    /// 3339 UTC with seconds.
    pub since: String,
    /// `{since_epoch}`: the same, in seconds since the epoch.
    pub since_epoch: String,
}

impl<'a> Placeholders<'a> {
    /// Placeholders for `job` and `item` at `now`, for a run whose
    /// `{since}` is `since`.
    pub(crate) fn new(
        job: &'a Job,
        item: &'a [(String, String)],
        secret: &'a Secret,
        now: DateTime<Utc>,
        since: DateTime<Utc>,
    ) -> Self {
        Placeholders {
            job: &job.name,
            item,
            secret,
            date: now.format("%Y-%m-%d").to_string(),
            since: since.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            since_epoch: since.timestamp().to_string(),
        }
    }

    fn lookup(&self, name: &str) -> Option<&str> {
        match name {
            "job" => Some(self.job),
            "date" => Some(&self.date),
            "secret" => Some(self.secret.expose()),
            "since" => Some(&self.since),
            "since_epoch" => Some(&self.since_epoch),
            _ => self
                .item
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str()),
        }
    }
}

/// The upstream's own report of its quota, from response headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UpstreamQuota {
    /// Units it says are left.
    pub remaining: u64,
    /// When it says they reset (at most the endpoint's `max_block`).
    pub reset_in: Duration,
}

/// Where a request may go: the scheme, host and port of the job's request
/// URL. Shown as `https://host:port`, never with a path or query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

impl Origin {
    fn of(url: &Url) -> Self {
        Origin {
            scheme: url.scheme().to_owned(),
            host: url.host_str().unwrap_or("").to_owned(),
            port: url.port_or_known_default(),
        }
    }

    /// The one same-origin check, for redirects and next pages alike:
    /// `Err` with `url`'s origin when it is not this one. Nothing is ever
    /// requested from there.
    fn admits(&self, url: &Url) -> Result<(), Origin> {
        let to = Origin::of(url);
        if to == *self { Ok(()) } else { Err(to) }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// One upstream request, ready to send: the page's rendered template, or a
/// redirect within its origin. Its URL and headers may hold the secret, so
/// it prints only its method, origin and hops.
#[derive(Clone)]
pub(crate) struct Request {
    method: reqwest::Method,
    url: Url,
    headers: HeaderMap,
    body: Option<String>,
    /// The job's request URL's origin: redirects and next pages may not
    /// leave it.
    origin: Origin,
    /// Redirects followed to get here.
    hops: u32,
    /// Where its answer says the next page is.
    next_in: NextIn,
}

/// Where a page's answer says the next page is, by the job's style.
#[derive(Debug, Clone)]
enum NextIn {
    /// Nowhere: no pagination, or `style = "page"` (the worker counts).
    Nowhere,
    /// A cursor at this JSON pointer.
    Cursor(String),
    /// A URL at this JSON pointer.
    Url(String),
    /// The `Link` header's `rel="next"`.
    Link,
}

impl NextIn {
    fn of(job: &Job) -> Self {
        match job.pagination.as_ref().map(|p| &p.style) {
            Some(PageStyle::Cursor { cursor, .. }) => NextIn::Cursor(cursor.clone()),
            Some(PageStyle::NextUrl { next }) => NextIn::Url(next.clone()),
            Some(PageStyle::Link) => NextIn::Link,
            Some(PageStyle::Page { .. }) | None => NextIn::Nowhere,
        }
    }
}

/// Which page of a run a request is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PageAt<'a> {
    /// Page `n` as the worker counts them: page 1 is the request template
    /// as written; with `style = "page"` every page is, plus its number.
    Number(u32),
    /// The page the previous one pointed to: a cursor, or a next URL that
    /// replaces the request's URL and query (stored form).
    After(&'a Stored),
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("origin", &self.origin)
            .field("hops", &self.hops)
            .finish_non_exhaustive()
    }
}

impl Request {
    /// The redirect this answer asks for, if it may be followed.
    fn redirected(&self, status: u16, headers: &HeaderMap) -> Result<Request, String> {
        let Some(location) = headers
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
        else {
            return Err(format!(
                "upstream answered {status} without a usable Location; not followed"
            ));
        };
        let Ok(next) = self.url.join(location.trim()) else {
            return Err(format!(
                "upstream answered {status} with a Location that is not a URL; not followed"
            ));
        };
        if let Err(to) = self.origin.admits(&next) {
            return Err(format!(
                "redirect leaves the origin: upstream answered {status} to {to}, outside the job's origin {}; not requested",
                self.origin
            ));
        }
        if self.hops >= MAX_REDIRECTS {
            return Err(format!(
                "too many redirects: upstream answered {status} after {MAX_REDIRECTS} redirects were followed"
            ));
        }
        // As browsers do: 303 turns into GET, and so do 301/302 after a
        // POST; 307 and 308 repeat the method and body (same origin only).
        let to_get = status == 303 || (matches!(status, 301 | 302) && self.method == "POST");
        let (method, body) = if to_get && self.method != reqwest::Method::HEAD {
            (reqwest::Method::GET, None)
        } else {
            (self.method.clone(), self.body.clone())
        };
        Ok(Request {
            method,
            url: next,
            headers: self.headers.clone(),
            body,
            origin: self.origin.clone(),
            hops: self.hops + 1,
            next_in: self.next_in.clone(),
        })
    }

    /// The same request, conditional on the validators of the item's last
    /// complete run: `If-None-Match`, `If-Modified-Since`.
    pub(crate) fn conditional(mut self, v: &Validators) -> Request {
        for (name, value) in [
            (reqwest::header::IF_NONE_MATCH, &v.etag),
            (reqwest::header::IF_MODIFIED_SINCE, &v.last_modified),
        ] {
            if let Some(value) = value.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
                self.headers.insert(name, value);
            }
        }
        self
    }
}

/// Why a request could not be built. Nothing was sent, so nothing needs to
/// be spent: the task ends `failed` with this reason.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    /// A fan-out value holds a control character (CR, LF, NUL, ESC, ...).
    #[error("fan-out item {item} holds control characters; refused")]
    ControlChars {
        /// The item key, control characters escaped.
        item: String,
    },
    /// The URL does not parse once its placeholders are filled in.
    #[error("the request URL does not parse with this item's values: {0}")]
    Url(String),
    /// A value would change the URL's path (a whole segment of `.` or `..`).
    #[error(
        "a placeholder value would change the request URL's path (a value of \".\" or \"..\"?); refused"
    )]
    PathChanged,
    /// A header's rendered value cannot be sent.
    #[error(
        "header {name}: the rendered value cannot be sent (control characters such as CR or LF)"
    )]
    Header {
        /// The header's name.
        name: String,
    },
    /// The previous page's next URL is on another origin than the job's
    /// request URL: never requested, so no secret goes there.
    #[error(
        "next page leaves the origin: the upstream's next page is on {to}, outside the job's origin {origin}; not requested"
    )]
    LeavesOrigin {
        /// The next page's origin, secrets scrubbed (a host could hold one).
        to: String,
        /// The job's, likewise.
        origin: String,
    },
    /// The stored cursor or next URL cannot be sent.
    #[error(transparent)]
    Stored(#[from] StoredError),
    /// The next URL does not parse once the secret is back in it.
    #[error("the next page's URL does not parse: {0}")]
    NextUrl(String),
}

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
        /// The request's actual cost, when the endpoint names a header for it.
        actual_cost: Option<u64>,
        /// The upstream's own remaining quota, when the endpoint names its headers.
        upstream: Option<UpstreamQuota>,
        /// HTTP status.
        status: u16,
    },
    /// 429, or 403 with a quota reason (or a ratelimit header at 0): the
    /// upstream refuses this credential for a while.
    Throttled {
        /// HTTP status.
        status: u16,
        /// How long it said to wait (Retry-After, or the ratelimit reset),
        /// at most the endpoint's `max_block`; `None` when it did not say
        /// (or said nonsense): the endpoint's `throttle_block` applies.
        retry_after: Option<Duration>,
        /// The reason it gave (`quotaExceeded`, ...), if any.
        reason: Option<String>,
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
    },
    /// 304 to a conditional request: nothing changed since the validators
    /// it sent.
    NotModified {
        /// HTTP status (304).
        status: u16,
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
    },
    /// 5xx: try again later.
    ServerError {
        /// HTTP status.
        status: u16,
        /// What it says it charged, when the endpoint names a cost header
        /// (without one, a 5xx is assumed charged).
        actual_cost: Option<u64>,
    },
    /// Other 4xx: the request is wrong; retrying will not help.
    ClientError {
        /// HTTP status.
        status: u16,
        /// The start of the body, for the log (secrets scrubbed).
        detail: String,
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
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
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
    },
    /// A redirect that is not followed: to another origin, past
    /// [`MAX_REDIRECTS`], or without a usable `Location`. An answer, so its
    /// units are kept.
    RedirectRefused {
        /// HTTP status.
        status: u16,
        /// Why, naming at most the origins (never a path or query).
        why: String,
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
    },
    /// A body over the endpoint's `max_body`: reading stopped there. An
    /// answer, so its units are kept.
    TooLarge {
        /// HTTP status.
        status: u16,
        /// The endpoint's `max_body`, bytes.
        limit: u64,
        /// What it says it charged, when the endpoint names a cost header.
        actual_cost: Option<u64>,
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
    /// The label of `qw_upstream_responses_total`'s `status`.
    fn status_label(&self) -> String {
        match self {
            Reply::Ok { status, .. }
            | Reply::NotModified { status, .. }
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

/// Removes every known secret from text the upstream sent back: each
/// credential's secret as it is, percent-encoded (upper- and lower-case
/// hex, `+` for spaces as forms write it) and JSON-escaped, since an
/// upstream echoes the URL or the request in any of these forms.
///
/// It also writes a next-page cursor or URL in stored form
/// ([`Scrubber::templatize`]): each spelling of a secret as the placeholder
/// that renders it back.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrubber {
    /// One automaton for every form of every secret; `None` without secrets.
    matcher: Option<AhoCorasick>,
    /// Per pattern of `matcher`: the placeholder that renders it back in a
    /// URL (`{secret}` percent-encodes, `{+secret}` keeps it as it is).
    placeholders: Vec<&'static str>,
}

/// A secret spelled percent-encoded: rendered back by simple expansion.
const ENCODED: &str = "{secret}";
/// A secret spelled as it is: rendered back by reserved expansion (which
/// keeps the characters a URL may hold as they are).
const VERBATIM: &str = "{+secret}";

impl Scrubber {
    /// A scrubber for `secrets`.
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = &'a Secret>) -> Self {
        let mut forms: Vec<(String, &'static str)> = Vec::new();
        for s in secrets {
            let s = s.expose();
            if s.is_empty() {
                continue;
            }
            let encoded = utf8_percent_encode(s, SIMPLE).to_string();
            let json = serde_json::to_string(s).unwrap_or_default();
            forms.extend([
                (s.to_owned(), VERBATIM),
                (encoded.replace("%20", "+"), ENCODED),
                (lower_hex(&encoded), ENCODED),
                // The quotes around it, not the escaped ones inside.
                (
                    json.get(1..json.len().saturating_sub(1))
                        .unwrap_or_default()
                        .to_owned(),
                    VERBATIM,
                ),
                (encoded, ENCODED),
            ]);
        }
        forms.retain(|(f, _)| !f.is_empty());
        // Where two spellings are the same text, the one listed first wins
        // (stable sort): as it is renders it back exactly.
        forms.sort_by(|a, b| a.0.cmp(&b.0));
        forms.dedup_by(|b, a| a.0 == b.0);
        let matcher = if forms.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(forms.iter().map(|(f, _)| f))
                .ok()
        };
        Scrubber {
            matcher,
            placeholders: forms.into_iter().map(|(_, p)| p).collect(),
        }
    }

    /// `text` (a cursor or next URL from the upstream) in stored form:
    /// braces doubled, so it holds no placeholder of its own, and each
    /// spelling of a secret written as the placeholder that renders it back
    /// ([`Stored::render`]).
    pub(crate) fn templatize(&self, text: &str) -> String {
        let escape = |t: &str| t.replace('{', "{{").replace('}', "}}");
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        if let Some(m) = &self.matcher {
            for found in m.find_iter(text) {
                out.push_str(&escape(&text[last..found.start()]));
                out.push_str(self.placeholders[found.pattern().as_usize()]);
                last = found.end();
            }
        }
        out.push_str(&escape(&text[last..]));
        out
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub(crate) fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match &self.matcher {
            Some(m) if m.is_match(text) => {
                let with: Vec<&str> = vec![REDACTED; m.patterns_len()];
                Cow::Owned(m.replace_all(text, &with))
            }
            _ => Cow::Borrowed(text),
        }
    }

    /// Scrubs every string of a JSON value (records, cursors) in place.
    pub(crate) fn scrub_json(&self, value: &mut Value) {
        if self.matcher.is_none() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(clean) = self.scrub(s) {
                    *s = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.scrub_json(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.scrub_json(v)),
            _ => {}
        }
    }

    /// Scrubs every piece of upstream text a reply carries (its next page
    /// and validators were taken out before, without the secret).
    fn scrub_reply(&self, reply: &mut Reply) {
        match reply {
            Reply::Ok { body, .. } => self.scrub_json(body),
            Reply::ClientError { detail, .. }
            | Reply::BadBody { detail, .. }
            | Reply::Unsent { detail }
            | Reply::Unreached { detail }
            | Reply::TimedOut { detail }
            | Reply::RedirectRefused { why: detail, .. } => {
                if let Cow::Owned(clean) = self.scrub(detail) {
                    *detail = clean;
                }
            }
            Reply::Throttled { .. }
            | Reply::NotModified { .. }
            | Reply::ServerError { .. }
            | Reply::Redirect { .. }
            | Reply::TooLarge { .. } => {}
        }
    }
}

/// `%2F` → `%2f`: the other spelling of the same encoding.
fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut hex_left = 0;
    for c in encoded.chars() {
        if c == '%' {
            hex_left = 2;
            out.push(c);
        } else if hex_left > 0 {
            hex_left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A value as RFC 6570 expands it into a URL.
pub(crate) fn expand(value: &str, how: Expansion) -> Cow<'_, str> {
    match how {
        Expansion::Simple => utf8_percent_encode(value, SIMPLE).into(),
        Expansion::Reserved => {
            // Unreserved and reserved characters and %XX triplets stay.
            const KEEP: &[u8] = b"-._~:/?#[]@!$&'()*+,;=";
            let bytes = value.as_bytes();
            let mut out = String::with_capacity(value.len());
            for (i, &b) in bytes.iter().enumerate() {
                let triplet = b == b'%'
                    && bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                    && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
                if b.is_ascii_alphanumeric() || KEEP.contains(&b) || triplet {
                    out.push(b as char);
                } else {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
            Cow::Owned(out)
        }
    }
}

fn path_segments(url: &Url) -> usize {
    url.path_segments().map_or(0, Iterator::count)
}

/// A size as an operator writes it: "16 MiB", "512 KiB", "1000 B".
pub(crate) fn fmt_size(bytes: u64) -> String {
    for (unit, len) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= len && bytes.is_multiple_of(len) {
            return format!("{} {unit}", bytes / len);
        }
    }
    if bytes >= 1 << 10 {
        return bytesize::ByteSize(bytes).display().iec().to_string();
    }
    format!("{bytes} B")
}

/// `region=a\rb`: an item key fit for a log line.
pub(crate) fn escaped_item(item: &[(String, String)]) -> String {
    crate::queue::item_key(item).escape_debug().to_string()
}

/// Sends requests for jobs. Cheap to clone (one connection pool).
#[derive(Debug, Clone)]
pub(crate) struct Fetcher {
    client: reqwest::Client,
    scrubber: Arc<Scrubber>,
    /// The secrets `scrubber` scrubs, for [`Fetcher::with_secret`].
    secrets: Arc<Vec<Secret>>,
}

impl Fetcher {
    /// A fetcher with rustls, a connect timeout and a user agent, that
    /// follows no redirect and sends no `Referer`, and scrubs `secrets` from
    /// whatever the upstream sends back.
    pub(crate) fn new(secrets: &Secrets) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("quota-worker/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .build()?;
        let secrets: Vec<Secret> = secrets.values().cloned().collect();
        Ok(Fetcher {
            client,
            scrubber: Arc::new(Scrubber::new(&secrets)),
            secrets: Arc::new(secrets),
        })
    }

    /// The same fetcher (one connection pool), scrubbing `secret` too: a
    /// template credential's tenant's, read for one task.
    pub(crate) fn with_secret(&self, secret: &Secret) -> Self {
        Fetcher {
            client: self.client.clone(),
            scrubber: Arc::new(Scrubber::new(self.secrets.iter().chain([secret]))),
            secrets: self.secrets.clone(),
        }
    }

    /// The request for page `at` of `job` for `ph`'s item.
    ///
    /// A next URL (`next_url`, `link`) replaces the template's URL and query
    /// (headers and body are rendered as always), and only if it is on the
    /// job's origin: the one place a next page is checked, before anything
    /// is spent, so a checkpoint written before the job's URL changed never
    /// sends the secret to the old host either.
    pub(crate) fn request(
        &self,
        job: &Job,
        ph: &Placeholders<'_>,
        at: PageAt<'_>,
    ) -> Result<Request, BuildError> {
        if ph.item.iter().any(|(_, v)| v.chars().any(char::is_control)) {
            return Err(BuildError::ControlChars {
                item: escaped_item(ph.item),
            });
        }
        let req = &job.request;
        let mut url = template_url(job, ph)?;
        let origin = Origin::of(&url);
        match (at, job.pagination.as_ref().map(|p| &p.style)) {
            (PageAt::After(next), Some(PageStyle::NextUrl { .. } | PageStyle::Link)) => {
                let rendered = next.render(ph.secret, true)?;
                url = Url::parse(&rendered).map_err(|e| BuildError::NextUrl(e.to_string()))?;
                origin.admits(&url).map_err(|to| BuildError::LeavesOrigin {
                    to: self.scrubber.scrub(&to.to_string()).into_owned(),
                    origin: self.scrubber.scrub(&origin.to_string()).into_owned(),
                })?;
            }
            (at, style) => {
                let mut query: Vec<(&str, String)> = req
                    .query
                    .iter()
                    .map(|(k, t)| (k.as_str(), t.render(|n| ph.lookup(n))))
                    .collect();
                match (at, style) {
                    (PageAt::After(c), Some(PageStyle::Cursor { param, .. })) => {
                        query.push((param, c.render(ph.secret, false)?));
                    }
                    (PageAt::Number(n), Some(PageStyle::Page { param, start, step })) => {
                        query.push((param, paging::page_value(*start, *step, n).to_string()));
                    }
                    _ => {}
                }
                if !query.is_empty() {
                    url.query_pairs_mut().extend_pairs(query);
                }
            }
        }
        let mut headers = HeaderMap::new();
        for (k, t) in &req.headers {
            let bad = || BuildError::Header { name: k.clone() };
            let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| bad())?;
            let value = HeaderValue::from_str(&t.render(|n| ph.lookup(n))).map_err(|_| bad())?;
            headers.append(name, value);
        }
        let method = match req.method {
            Method::Get => reqwest::Method::GET,
            Method::Post => reqwest::Method::POST,
            Method::Put => reqwest::Method::PUT,
            Method::Patch => reqwest::Method::PATCH,
            Method::Delete => reqwest::Method::DELETE,
        };
        Ok(Request {
            method,
            origin,
            url,
            headers,
            body: req.body.as_ref().map(|b| b.render(|n| ph.lookup(n))),
            hops: 0,
            next_in: NextIn::of(job),
        })
    }

    /// Sends `req` and classifies the answer.
    pub(crate) async fn send(&self, endpoint: &Endpoint, req: &Request) -> Reply {
        let mut rb = self
            .client
            .request(req.method.clone(), req.url.clone())
            .headers(req.headers.clone())
            .timeout(endpoint.timeout);
        if let Some(b) = &req.body {
            rb = rb.body(b.clone());
        }
        let mut reply = match rb.send().await {
            Err(e) => transport_error(e),
            Ok(resp) => answer(endpoint, req, resp, &self.scrubber).await,
        };
        self.scrubber.scrub_reply(&mut reply);
        metrics::counter!("qw_upstream_responses_total", "endpoint" => endpoint.name.clone(), "status" => reply.status_label())
            .increment(1);
        reply
    }
}

/// The job's request URL for `ph`'s item, without its query.
fn template_url(job: &Job, ph: &Placeholders<'_>) -> Result<Url, BuildError> {
    let t = &job.request.url;
    let url = Url::parse(&t.render_with(|k| ph.lookup(k), expand))
        .map_err(|e| BuildError::Url(e.to_string()))?;
    // Simple expansion encodes '/', so only a whole segment of "." or
    // ".." (which URL parsing removes) can change the path's shape.
    if !t.has_reserved() {
        let shape = Url::parse(&t.render(|_| Some("x"))).map(|u| path_segments(&u));
        if shape.ok() != Some(path_segments(&url)) {
            return Err(BuildError::PathChanged);
        }
    }
    Ok(url)
}

/// Where a page's answer says the next page is, in stored form (`body`
/// and `headers` not yet scrubbed: the secret in a next URL becomes its
/// placeholder, not `[redacted]`). A relative URL resolves against the
/// request's URL; its origin is checked when its request is built.
fn next_page(req: &Request, headers: &HeaderMap, body: &Value, scrubber: &Scrubber) -> Next {
    let url = match &req.next_in {
        NextIn::Nowhere => return Next::End,
        NextIn::Cursor(ptr) => {
            return match paging::cursor_at(body, ptr) {
                Ok(Some(c)) => Next::At(Stored::new(scrubber.templatize(&c))),
                Ok(None) => Next::End,
                Err(e) => Next::Bad(e),
            };
        }
        NextIn::Url(ptr) => match paging::url_at(body, ptr) {
            Ok(url) => url,
            Err(e) => return Next::Bad(e),
        },
        NextIn::Link => paging::next_link(
            headers
                .get_all(reqwest::header::LINK)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        ),
    };
    let Some(url) = url else {
        return Next::End;
    };
    match req.url.join(&url) {
        Ok(next) => Next::At(Stored::new(scrubber.templatize(next.as_str()))),
        // The parse error names no part of the URL (which may hold the secret).
        Err(e) => Next::Bad(format!("the next page's URL does not parse: {e}")),
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

/// Reads and classifies one answer to `req`.
async fn answer(
    endpoint: &Endpoint,
    req: &Request,
    mut resp: reqwest::Response,
    scrubber: &Scrubber,
) -> Reply {
    let status = resp.status().as_u16();
    let headers = std::mem::take(resp.headers_mut());
    if matches!(status, 301 | 302 | 303 | 307 | 308) {
        // The body of a redirect is never read: the connection goes.
        let actual_cost = cost(endpoint, &headers);
        return match req.redirected(status, &headers) {
            Ok(next) => Reply::Redirect {
                status,
                next: Box::new(next),
                actual_cost,
            },
            Err(why) => Reply::RedirectRefused {
                status,
                why,
                actual_cost,
            },
        };
    }
    let success = (200..300).contains(&status);
    let limit = if success {
        endpoint.max_body
    } else {
        endpoint.max_body.min(ERROR_BODY_LIMIT)
    };
    let too_large = Reply::TooLarge {
        status,
        limit: endpoint.max_body,
        actual_cost: cost(endpoint, &headers),
    };
    if success && resp.content_length().is_some_and(|n| n > limit) {
        return too_large;
    }
    let body = match read_body(&mut resp, limit).await {
        Ok(Body::Whole(b)) => b,
        // An error answer's start is all the log needs.
        Ok(Body::Over(b)) if !success => b,
        Ok(Body::Over(_)) => return too_large,
        Err(e) => return transport_error(e),
    };
    let mut reply = classify(endpoint, status, &headers, &body, Utc::now());
    if let Reply::Ok {
        body,
        next,
        validators: v,
        ..
    } = &mut reply
    {
        *next = next_page(req, &headers, body, scrubber);
        *v = validators(endpoint, &headers, scrubber);
    }
    reply
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

fn transport_error(e: reqwest::Error) -> Reply {
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

/// A header's whole number; digits beyond `u64` read as `u64::MAX` (the
/// callers bound it), anything else as absent.
fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    digits(headers.get(name)?.to_str().ok()?.trim())
}

fn digits(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(v.parse().unwrap_or(u64::MAX))
}

fn cost(endpoint: &Endpoint, headers: &HeaderMap) -> Option<u64> {
    endpoint
        .cost_header
        .as_deref()
        .and_then(|h| header_u64(headers, h))
}

/// A wait the upstream asked for, at most the endpoint's `max_block`; a
/// clamped value is logged as it was written.
fn bounded(endpoint: &Endpoint, header: &str, raw: &str, wait: Duration) -> Duration {
    if wait <= endpoint.max_block {
        return wait;
    }
    let raw: String = raw.chars().take(64).collect();
    warn!(
        endpoint = %endpoint.name,
        header,
        raw = %raw.escape_debug(),
        max_block_ms = endpoint.max_block.as_millis() as u64,
        "the upstream asked for a longer wait than max_block; clamped to max_block"
    );
    endpoint.max_block
}

/// `Retry-After`: delta seconds or an HTTP date, at most `max_block`;
/// anything else is `None` (the endpoint's `throttle_block` applies).
fn retry_after(endpoint: &Endpoint, headers: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let raw = headers.get(reqwest::header::RETRY_AFTER)?;
    let v = raw.to_str().unwrap_or("").trim();
    let wait = if let Some(secs) = digits(v) {
        Duration::from_secs(secs)
    } else if let Ok(at) = httpdate::parse_http_date(v) {
        let at: DateTime<Utc> = at.into();
        (at - now).to_std().unwrap_or(Duration::ZERO)
    } else {
        // Not logged as written: it could be anything.
        warn!(
            endpoint = %endpoint.name,
            throttle_block_ms = endpoint.throttle_block.as_millis() as u64,
            "Retry-After is neither seconds nor an HTTP date; using throttle_block"
        );
        return None;
    };
    Some(bounded(endpoint, "retry-after", v, wait))
}

fn upstream_quota(
    endpoint: &Endpoint,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<UpstreamQuota> {
    let h = endpoint.ratelimit_headers.as_ref()?;
    let remaining = header_u64(headers, &h.remaining)?;
    let raw = headers.get(h.reset.as_str())?.to_str().ok()?.trim();
    let reset = digits(raw)?;
    let reset_in = match h.reset_is {
        ResetIs::DeltaSeconds => Duration::from_secs(reset),
        ResetIs::EpochSeconds => {
            let secs = (i128::from(reset) - i128::from(now.timestamp())).max(0);
            // Round up: the reset second itself is not yet free.
            Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX).saturating_add(1))
        }
    };
    // Only a spent quota blocks on the reset, so only then is a clamp news.
    let reset_in = if remaining == 0 {
        bounded(endpoint, &h.reset, raw, reset_in)
    } else {
        reset_in.min(endpoint.max_block)
    };
    Some(UpstreamQuota {
        remaining,
        reset_in,
    })
}

/// The quota reason an error body gives, if it is one of `reasons`: a
/// Google-style `error.errors[].reason` equal to one, or else a top-level
/// `message` or `error.message` (GitHub, most others) that holds one,
/// compared without case. What is returned is the configured reason, never
/// the upstream's text.
fn quota_reason(body: &[u8], reasons: &[String]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let listed = v
        .pointer("/error/errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("reason")?.as_str())
        .find_map(|r| reasons.iter().find(|q| *q == r));
    if let Some(r) = listed {
        return Some(r.clone());
    }
    let messages: Vec<String> = [v.get("message"), v.pointer("/error/message")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_lowercase)
        .collect();
    reasons
        .iter()
        .filter(|q| !q.is_empty())
        .find(|q| {
            let q = q.to_lowercase();
            messages.iter().any(|m| m.contains(&q))
        })
        .cloned()
}

fn snippet(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(200)]);
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Classifies a complete HTTP answer (not a redirect: see [`Reply::Redirect`]).
/// Its text is not yet scrubbed of secrets.
pub(crate) fn classify(
    endpoint: &Endpoint,
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    now: DateTime<Utc>,
) -> Reply {
    let upstream = upstream_quota(endpoint, headers, now);
    // Any answer may say what it cost, errors included (often 0).
    let actual_cost = cost(endpoint, headers);
    let throttled = |status, reason| Reply::Throttled {
        status,
        retry_after: retry_after(endpoint, headers, now).or(upstream.map(|u| u.reset_in)),
        reason,
        actual_cost,
    };
    match status {
        200..=299 => match serde_json::from_slice::<Value>(body) {
            Ok(body) => Reply::Ok {
                body,
                next: Next::End,
                validators: Validators::default(),
                actual_cost,
                upstream,
                status,
            },
            Err(e) => Reply::BadBody {
                status,
                detail: format!("not JSON ({e}): {}", snippet(body)),
            },
        },
        // Only a conditional request gets one; never a failure.
        304 => Reply::NotModified {
            status,
            actual_cost,
        },
        429 => throttled(status, quota_reason(body, &endpoint.quota_reasons)),
        403 => {
            let reason = quota_reason(body, &endpoint.quota_reasons);
            let exhausted = upstream.is_some_and(|u| u.remaining == 0);
            if reason.is_some() || exhausted {
                throttled(status, reason)
            } else {
                Reply::ClientError {
                    status,
                    detail: snippet(body),
                    actual_cost,
                }
            }
        }
        500..=599 => Reply::ServerError {
            status,
            actual_cost,
        },
        _ => Reply::ClientError {
            status,
            detail: snippet(body),
            actual_cost,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LimiterUnavailable, RatelimitHeaders};
    use reqwest::header::HeaderValue;
    use std::num::NonZeroU64;

    fn endpoint() -> Endpoint {
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
            ratelimit_headers: Some(RatelimitHeaders {
                remaining: "x-ratelimit-remaining".into(),
                reset: "x-ratelimit-reset".into(),
                reset_is: ResetIs::EpochSeconds,
            }),
            cost_header: Some("x-quota-cost".into()),
            max_body: crate::config::defaults::MAX_BODY,
            max_block: crate::config::defaults::MAX_BLOCK,
            conditional: true,
            not_modified_cost: 0,
        }
    }

    #[test]
    fn youtube_quota_exceeded_is_throttling() {
        let body = br#"{"error":{"code":403,"errors":[{"reason":"quotaExceeded","domain":"youtube.quota"}]}}"#;
        let r = classify(&endpoint(), 403, &HeaderMap::new(), body, Utc::now());
        assert!(
            matches!(r, Reply::Throttled { reason: Some(ref x), retry_after: None, .. } if x == "quotaExceeded")
        );
        let forbidden = br#"{"error":{"code":403,"errors":[{"reason":"forbidden"}]}}"#;
        let r = classify(&endpoint(), 403, &HeaderMap::new(), forbidden, Utc::now());
        assert!(matches!(r, Reply::ClientError { status: 403, .. }));
    }

    #[test]
    fn retry_after_seconds_and_github_headers() {
        let now = Utc::now();
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        let r = classify(&endpoint(), 429, &h, b"", now);
        assert!(
            matches!(r, Reply::Throttled { retry_after: Some(d), .. } if d == Duration::from_secs(7))
        );

        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        let reset = (now.timestamp() + 30).to_string();
        h.insert("x-ratelimit-reset", HeaderValue::from_str(&reset).unwrap());
        h.insert("x-quota-cost", HeaderValue::from_static("3"));
        let r = classify(&endpoint(), 200, &h, b"{}", now);
        let Reply::Ok {
            upstream: Some(u),
            actual_cost,
            ..
        } = r
        else {
            panic!("{r:?}")
        };
        assert_eq!(u.remaining, 0);
        assert_eq!(u.reset_in, Duration::from_secs(31));
        assert_eq!(actual_cost, Some(3));
        let r = classify(&endpoint(), 403, &h, b"{}", now);
        assert!(matches!(
            r,
            Reply::Throttled {
                retry_after: Some(_),
                ..
            }
        ));
    }

    /// Regression (issue 9, item 4): Retry-After 999999999 blocked a
    /// credential for 31 years; u64::MAX failed the block script; an epoch
    /// reset past i64 went negative. Every upstream wait is at most
    /// `max_block`, and nonsense is no wait at all (throttle_block applies).
    #[test]
    fn upstream_waits_are_clamped_to_max_block() {
        let now = Utc::now();
        let ep = endpoint();
        for raw in [
            "999999999",
            "18446744073709551615",
            "99999999999999999999999999",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            let mut h = HeaderMap::new();
            h.insert("retry-after", HeaderValue::from_str(raw).unwrap());
            let r = classify(&ep, 429, &h, b"", now);
            assert!(
                matches!(r, Reply::Throttled { retry_after: Some(d), .. } if d == ep.max_block),
                "{raw}: {r:?}"
            );
        }
        for raw in ["-5", "soon", "1.5", ""] {
            let mut h = HeaderMap::new();
            h.insert("retry-after", HeaderValue::from_str(raw).unwrap());
            let r = classify(&ep, 429, &h, b"", now);
            assert!(
                matches!(
                    r,
                    Reply::Throttled {
                        retry_after: None,
                        ..
                    }
                ),
                "{raw}: {r:?}"
            );
        }
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        h.insert(
            "x-ratelimit-reset",
            HeaderValue::from_static("18446744073709551615"),
        );
        let r = classify(&ep, 200, &h, b"{}", now);
        assert!(
            matches!(r, Reply::Ok { upstream: Some(u), .. } if u.reset_in == ep.max_block),
            "{r:?}"
        );
    }

    /// Regression: a 5xx's reported cost was dropped, so its units could
    /// never be settled to what the upstream said it charged.
    #[test]
    fn error_answers_carry_their_reported_cost() {
        let mut h = HeaderMap::new();
        h.insert("x-quota-cost", HeaderValue::from_static("0"));
        let r = classify(&endpoint(), 503, &h, b"", Utc::now());
        assert!(matches!(
            r,
            Reply::ServerError {
                status: 503,
                actual_cost: Some(0)
            }
        ));
        let r = classify(&endpoint(), 429, &h, b"", Utc::now());
        assert!(matches!(
            r,
            Reply::Throttled {
                actual_cost: Some(0),
                ..
            }
        ));
        let r = classify(&endpoint(), 404, &h, b"", Utc::now());
        assert!(matches!(
            r,
            Reply::ClientError {
                actual_cost: Some(0),
                ..
            }
        ));
    }

    #[test]
    fn bodies_that_are_not_json_are_bad() {
        let r = classify(&endpoint(), 200, &HeaderMap::new(), b"<html>", Utc::now());
        assert!(matches!(r, Reply::BadBody { .. }));
        let r = classify(&endpoint(), 503, &HeaderMap::new(), b"", Utc::now());
        assert!(matches!(
            r,
            Reply::ServerError {
                status: 503,
                actual_cost: None
            }
        ));
        let r = classify(&endpoint(), 404, &HeaderMap::new(), b"nope", Utc::now());
        assert!(matches!(r, Reply::ClientError { status: 404, .. }));
    }

    #[test]
    fn simple_expansion_keeps_only_unreserved_characters() {
        let e = |v| expand(v, Expansion::Simple).into_owned();
        assert_eq!(e("../../etc/x"), "..%2F..%2Fetc%2Fx");
        assert_eq!(e("&key=evil"), "%26key%3Devil");
        assert_eq!(e("a?b#c d%"), "a%3Fb%23c%20d%25");
        assert_eq!(e("Zürich-1_~."), "Z%C3%BCrich-1_~.");
        let r = |v| expand(v, Expansion::Reserved).into_owned();
        assert_eq!(r("a/b?c=d&e#f"), "a/b?c=d&e#f");
        assert_eq!(r("%41 %zz"), "%41%20%25zz");
    }

    /// Issue 12, item 4: GitHub and most others say "rate limit" in a
    /// top-level `message`, Google APIs in `error.message` too.
    #[test]
    fn quota_reasons_match_messages_without_case() {
        let mut ep = endpoint();
        ep.quota_reasons = vec!["quotaExceeded".into(), "rate limit exceeded".into()];
        let gh =
            br#"{"message": "API Rate Limit Exceeded for user ID 1.", "documentation_url": "x"}"#;
        let r = classify(&ep, 403, &HeaderMap::new(), gh, Utc::now());
        assert!(
            matches!(r, Reply::Throttled { reason: Some(ref x), .. } if x == "rate limit exceeded"),
            "{r:?}"
        );
        let nested = br#"{"error": {"code": 403, "message": "Daily RATE LIMIT EXCEEDED."}}"#;
        let r = classify(&ep, 403, &HeaderMap::new(), nested, Utc::now());
        assert!(matches!(r, Reply::Throttled { .. }), "{r:?}");
        // The reasons list still wins, and other 403s stay client errors.
        let both = br#"{"error": {"message": "rate limit exceeded", "errors": [{"reason": "quotaExceeded"}]}}"#;
        let r = classify(&ep, 403, &HeaderMap::new(), both, Utc::now());
        assert!(
            matches!(r, Reply::Throttled { reason: Some(ref x), .. } if x == "quotaExceeded"),
            "{r:?}"
        );
        let other = br#"{"message": "Resource not accessible by integration"}"#;
        let r = classify(&ep, 403, &HeaderMap::new(), other, Utc::now());
        assert!(matches!(r, Reply::ClientError { status: 403, .. }), "{r:?}");
        ep.quota_reasons = vec![String::new()];
        let r = classify(&ep, 403, &HeaderMap::new(), other, Utc::now());
        assert!(
            matches!(r, Reply::ClientError { .. }),
            "an empty reason matches nothing"
        );
    }

    /// Issue 12, item 3: a 304 was `failed`. It is its own answer.
    #[test]
    fn a_304_is_not_modified() {
        let mut h = HeaderMap::new();
        h.insert("x-quota-cost", HeaderValue::from_static("0"));
        let r = classify(&endpoint(), 304, &h, b"", Utc::now());
        assert!(matches!(
            r,
            Reply::NotModified {
                status: 304,
                actual_cost: Some(0)
            }
        ));
    }

    /// A next URL is kept with each spelling of the secret as the
    /// placeholder that renders it back, and nothing else the upstream
    /// wrote can become a placeholder.
    #[test]
    fn next_urls_are_kept_without_the_secret_and_render_back() {
        let secret = Secret::new("k/y+z ä");
        let s = Scrubber::new([&secret]);
        let encoded = "k%2Fy%2Bz%20%C3%A4";
        let url = format!(
            "https://graph.example/v1/me/media?access_token={encoded}&after=c2&x={{region}}"
        );
        let stored = s.templatize(&url);
        assert_eq!(
            stored,
            "https://graph.example/v1/me/media?access_token={secret}&after=c2&x={{region}}"
        );
        let back = Stored::new(stored).render(&secret, true).unwrap();
        assert_eq!(back, url, "rendered back as it was sent");
        // The lower-case and form spellings render back as equivalents.
        let lower = s.templatize("?t=k%2fy%2bz%20%c3%a4&u=k%2Fy%2Bz+%C3%A4");
        assert_eq!(lower, "?t={secret}&u={secret}");
        // A token of URL-safe characters only: kept as it is.
        let meta = Secret::new("EAAGm0PX4ZCps");
        let s = Scrubber::new([&meta]);
        let stored = s.templatize("https://g/x?access_token=EAAGm0PX4ZCps&limit=2");
        assert_eq!(stored, "https://g/x?access_token={+secret}&limit=2");
        let back = Stored::new(stored).render(&meta, true).unwrap();
        assert_eq!(back, "https://g/x?access_token=EAAGm0PX4ZCps&limit=2");
        // Without secrets only the braces change.
        assert_eq!(Scrubber::default().templatize("a{b}"), "a{{b}}");
    }

    #[test]
    fn scrubber_finds_every_spelling() {
        let s = Scrubber::new([&Secret::new("k/y+z ä\"")]);
        for text in [
            "k/y+z ä\"",
            "k%2Fy%2Bz%20%C3%A4%22",
            "k%2fy%2bz%20%c3%a4%22",
            "k%2Fy%2Bz+%C3%A4%22",
            "k/y+z ä\\\"",
        ] {
            let line = format!("GET /x?key={text}&a=1");
            assert_eq!(
                s.scrub(&line),
                format!("GET /x?key={REDACTED}&a=1"),
                "{text}"
            );
        }
        let mut v =
            serde_json::json!({"a": ["x k/y+z ä\" y", 1], "b": {"c": "k%2Fy%2Bz%20%C3%A4%22"}});
        s.scrub_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": [format!("x {REDACTED} y"), 1], "b": {"c": REDACTED}})
        );
        assert_eq!(Scrubber::default().scrub("anything"), "anything");
    }
}
