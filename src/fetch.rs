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
//!   clamped to the endpoint's `max_block` (`crate::accounting` reads them:
//!   every answer comes back with its [`Verdict`]).
//! - **Text** it sends back (error bodies, undecodable bodies, the strings of
//!   a JSON body) has every known secret scrubbed (`crate::scrub`) before it is
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

use chrono::{DateTime, Utc};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::accounting::{self, Verdict};
use crate::config::{Endpoint, Job, Method, PageStyle, Secret, Secrets, expand};
use crate::paging::{self, Next, Stored, StoredError, Validators};
use crate::scrub::Scrubber;

/// Redirects followed for one page at most (each one spent). The request
/// before them makes `MAX_REDIRECTS + 1` upstream requests in all.
pub(crate) const MAX_REDIRECTS: u32 = 3;

/// Error answers (4xx, 5xx) are read this far at most: enough for the log
/// and for a quota reason, never a reason to fail.
const ERROR_BODY_LIMIT: u64 = 64 * 1024;

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
        /// HTTP status.
        status: u16,
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
    /// [`MAX_REDIRECTS`], or without a usable `Location`. An answer, so its
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

/// An answer and what it says about the upstream's quota.
#[derive(Debug)]
pub(crate) struct Answered {
    /// What the answer is.
    pub(crate) reply: Reply,
    /// What it says about the quota: settle, resync, block.
    pub(crate) verdict: Verdict,
}

impl Answered {
    fn new(reply: Reply, verdict: Verdict) -> Self {
        Answered { reply, verdict }
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

    /// Sends `req`, classifies the answer and reads what it says about the
    /// upstream's quota.
    pub(crate) async fn send(&self, endpoint: &Endpoint, req: &Request) -> Answered {
        let mut rb = self
            .client
            .request(req.method.clone(), req.url.clone())
            .headers(req.headers.clone())
            .timeout(endpoint.timeout);
        if let Some(b) = &req.body {
            rb = rb.body(b.clone());
        }
        let mut answered = match rb.send().await {
            Err(e) => Answered::new(transport_error(e), Verdict::default()),
            Ok(resp) => answer(endpoint, req, resp, &self.scrubber).await,
        };
        scrub_reply(&self.scrubber, &mut answered.reply);
        metrics::counter!("qw_upstream_responses_total", "endpoint" => endpoint.name.clone(), "status" => answered.reply.status_label())
            .increment(1);
        answered
    }
}

/// Scrubs every piece of upstream text a reply carries (its next page
/// and validators were taken out before, without the secret).
fn scrub_reply(scrubber: &Scrubber, reply: &mut Reply) {
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
        | Reply::ServerError { .. }
        | Reply::Redirect { .. }
        | Reply::TooLarge { .. } => {}
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

/// Reads and classifies one answer to `req`, and what it says about the
/// upstream's quota.
async fn answer(
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
    let verdict = verdict(&body);
    let mut reply = classify(status, &body, cut, verdict.refused, scrubber);
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
    Answered::new(reply, verdict)
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

/// Classifies a complete HTTP answer (not a redirect: see
/// [`Reply::Redirect`]); `refused` is the [`Verdict`]'s: the upstream
/// throttled this request, whatever its status (Shopify's `THROTTLED`
/// comes with a 200). A snippet of `body` (`cut`: the start of a longer
/// one) is scrubbed before it is cut; a decoded body is scrubbed later,
/// after the next page is read from it.
pub(crate) fn classify(
    status: u16,
    body: &[u8],
    cut: bool,
    refused: bool,
    scrubber: &Scrubber,
) -> Reply {
    if refused {
        return Reply::Throttled { status };
    }
    match status {
        200..=299 => match serde_json::from_slice::<Value>(body) {
            Ok(body) => Reply::Ok {
                body,
                next: Next::End,
                validators: Validators::default(),
                status,
            },
            Err(e) => Reply::BadBody {
                status,
                detail: format!("not JSON ({e}): {}", scrubber.snippet(body, cut)),
            },
        },
        // Only a conditional request gets one; never a failure.
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

    /// The verdict decides a refusal, whatever the status: Shopify's
    /// `THROTTLED` comes with a 200 and must never be written as a page.
    #[test]
    fn a_refused_answer_is_throttled_whatever_its_status() {
        for status in [200, 400, 403, 429, 503] {
            assert!(
                matches!(classify(status, b"{}", false, true, &Scrubber::default()), Reply::Throttled { status: s } if s == status)
            );
        }
        assert!(matches!(
            classify(200, b"{}", false, false, &Scrubber::default()),
            Reply::Ok { .. }
        ));
        assert!(matches!(
            classify(429, b"", false, false, &Scrubber::default()),
            Reply::ClientError { status: 429, .. }
        ));
    }

    #[test]
    fn bodies_that_are_not_json_are_bad() {
        assert!(matches!(
            classify(200, b"<html>", false, false, &Scrubber::default()),
            Reply::BadBody { .. }
        ));
        assert!(matches!(
            classify(503, b"", false, false, &Scrubber::default()),
            Reply::ServerError { status: 503 }
        ));
        assert!(matches!(
            classify(404, b"nope", false, false, &Scrubber::default()),
            Reply::ClientError { status: 404, .. }
        ));
    }

    /// Issue 12, item 3: a 304 was `failed`. It is its own answer.
    #[test]
    fn a_304_is_not_modified() {
        assert!(matches!(
            classify(304, b"", false, false, &Scrubber::default()),
            Reply::NotModified { status: 304 }
        ));
    }
}
