//! A job's request for one page, ready to send ([`Request`]): its
//! template rendered for one item's values ([`Placeholders`], RFC 6570
//! expansion so no value changes the URL's shape), the page's cursor, next
//! URL or number put in, and checked to stay on the job's origin
//! ([`Origin`]); and a redirect's next hop, within that origin.
//!
//! No value changes a body's structure either: a GraphQL request's body is
//! built by the JSON encoder (its variables JSON strings, the cursor one
//! `null` on page 1), and in a JSON `body` every placeholder's value goes
//! in JSON-string-escaped ([`json_escaped`]). A value is inserted once and
//! never read again as a template: `{secret}` inside a fan-out value is
//! text.

use std::borrow::Cow;
use std::fmt;

use chrono::{DateTime, Utc};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::Fetcher;
use super::paging::{self, NextIn, Stored, StoredError, Validators};
use crate::config::{Expansion, Graphql, Job, Method, PageStyle, Secret, Variable, expand};

/// Redirects followed for one page at most (each one spent). The request
/// before them makes `MAX_REDIRECTS + 1` upstream requests in all.
pub(crate) const MAX_REDIRECTS: u32 = 3;

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
    pub(super) method: reqwest::Method,
    pub(super) url: Url,
    pub(super) headers: HeaderMap,
    pub(super) body: Option<String>,
    /// The job's request URL's origin: redirects and next pages may not
    /// leave it.
    origin: Origin,
    /// Redirects followed to get here.
    hops: u32,
    /// Where its answer says the next page is.
    pub(super) next_in: NextIn,
    /// Where its answer's records are (the job's `sink.records`): their
    /// number is bounded by the endpoint's `max_records`.
    pub(super) records: String,
    /// A GraphQL query (`graphql`): an answer with `errors` and no `data`
    /// is a bad one.
    pub(super) graphql: bool,
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
    pub(super) fn redirected(&self, status: u16, headers: &HeaderMap) -> Result<Request, String> {
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
            records: self.records.clone(),
            graphql: self.graphql,
        })
    }

    /// Whether it asks "only if changed": it sends `If-None-Match` or
    /// `If-Modified-Since` (the item's validators, or the job's own headers).
    pub(crate) fn is_conditional(&self) -> bool {
        self.headers.contains_key(reqwest::header::IF_NONE_MATCH)
            || self
                .headers
                .contains_key(reqwest::header::IF_MODIFIED_SINCE)
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

impl Fetcher {
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
        let style = job.pagination.as_ref().map(|p| &p.style);
        // `{cursor}`: the page's cursor, empty on a run's first page.
        let cursor = match (at, style) {
            (PageAt::After(c), Some(PageStyle::Cursor { .. })) => Some(c.render(ph.secret, false)?),
            _ => None,
        };
        let lookup = |name: &str| match name {
            CURSOR => Some(cursor.as_deref().unwrap_or("")),
            _ => ph.lookup(name),
        };
        let mut url = template_url(job, &lookup)?;
        let origin = Origin::of(&url);
        match (at, style) {
            (PageAt::After(next), Some(PageStyle::NextUrl { .. } | PageStyle::Link)) => {
                let rendered = next.render(ph.secret, true)?;
                url = Url::parse(&rendered).map_err(|e| BuildError::NextUrl(e.to_string()))?;
                origin.admits(&url).map_err(|to| BuildError::LeavesOrigin {
                    to: self.scrubber.scrub(&to.to_string()).into_owned(),
                    origin: self.scrubber.scrub(&origin.to_string()).into_owned(),
                })?;
            }
            (at, style) => {
                let mut query: Vec<(&str, String)> = (req.query.iter())
                    .map(|(k, t)| (k.as_str(), t.render(lookup)))
                    .collect();
                match (at, style, &cursor) {
                    (_, Some(PageStyle::Cursor { param: Some(p), .. }), Some(c)) => {
                        query.push((p, c.clone()));
                    }
                    (PageAt::Number(n), Some(PageStyle::Page { param, start, step }), _) => {
                        query.push((param, paging::page_value(*start, *step, n).to_string()));
                    }
                    _ => {}
                }
                if !query.is_empty() {
                    url.query_pairs_mut().extend_pairs(query);
                }
            }
        }
        let (headers, body) = content(job, &lookup, cursor.as_deref())?;
        Ok(Request {
            method: method(req.method),
            origin,
            url,
            headers,
            body,
            hops: 0,
            next_in: NextIn::of(job),
            records: job.sink.records.clone(),
            graphql: req.graphql.is_some(),
        })
    }
}

/// The placeholder a page's cursor fills.
const CURSOR: &str = "cursor";

fn method(m: Method) -> reqwest::Method {
    match m {
        Method::Get => reqwest::Method::GET,
        Method::Post => reqwest::Method::POST,
        Method::Put => reqwest::Method::PUT,
        Method::Patch => reqwest::Method::PATCH,
        Method::Delete => reqwest::Method::DELETE,
    }
}

/// The request's headers and body, rendered with `lookup`: a GraphQL
/// query's body from the JSON encoder (with `Content-Type:
/// application/json` unless the job sends its own), a JSON `body` with its
/// values escaped.
fn content<'a>(
    job: &Job,
    lookup: &impl Fn(&str) -> Option<&'a str>,
    cursor: Option<&str>,
) -> Result<(HeaderMap, Option<String>), BuildError> {
    let req = &job.request;
    let mut headers = HeaderMap::new();
    for (k, t) in &req.headers {
        let bad = || BuildError::Header { name: k.clone() };
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| bad())?;
        let value = HeaderValue::from_str(&t.render(lookup)).map_err(|_| bad())?;
        headers.append(name, value);
    }
    let body = match (&req.graphql, &req.body) {
        (Some(g), _) => {
            if !headers.contains_key(reqwest::header::CONTENT_TYPE) {
                let json = HeaderValue::from_static("application/json");
                headers.insert(reqwest::header::CONTENT_TYPE, json);
            }
            Some(graphql_body(g, lookup, cursor))
        }
        (None, Some(b)) if req.body_is_json => Some(b.render_with(lookup, json_escaped)),
        (None, Some(b)) => Some(b.render(lookup)),
        (None, None) => None,
    };
    Ok((headers, body))
}

/// `{"query": ..., "variables": {...}}`, by the JSON encoder: each
/// variable a JSON string, the `{cursor}` one `null` on page 1.
fn graphql_body<'a>(
    g: &Graphql,
    lookup: &impl Fn(&str) -> Option<&'a str>,
    cursor: Option<&str>,
) -> String {
    let variables: serde_json::Map<String, serde_json::Value> = (g.variables.iter())
        .map(|(name, v)| {
            let value = match v {
                Variable::Cursor => cursor.map_or(serde_json::Value::Null, |c| c.into()),
                Variable::Text(t) => t.render(lookup).into(),
            };
            (name.clone(), value)
        })
        .collect();
    serde_json::json!({ "query": g.query, "variables": variables }).to_string()
}

/// A value as it goes inside a JSON string: `"`, `\` and control
/// characters escaped by the JSON encoder, the rest as it is.
fn json_escaped(value: &str, _: Expansion) -> Cow<'_, str> {
    if !value
        .chars()
        .any(|c| c == '"' || c == '\\' || c.is_control())
    {
        return Cow::Borrowed(value);
    }
    let quoted = serde_json::Value::from(value).to_string();
    Cow::Owned(quoted[1..quoted.len() - 1].to_owned())
}

/// The job's request URL for an item's values (`lookup`), without its
/// query.
fn template_url<'a>(
    job: &Job,
    lookup: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Url, BuildError> {
    let t = &job.request.url;
    let url =
        Url::parse(&t.render_with(lookup, expand)).map_err(|e| BuildError::Url(e.to_string()))?;
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

fn path_segments(url: &Url) -> usize {
    url.path_segments().map_or(0, Iterator::count)
}

/// `region=a\rb`: an item key fit for a log line.
pub(crate) fn escaped_item(item: &[(String, String)]) -> String {
    crate::queue::item_key(item).escape_debug().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Secrets};

    /// The job `j` of a config whose job file is `job` (TOML, the `[j]`
    /// table's fields and its sub-tables), on a credential whose secret is
    /// `s3cr3t`.
    fn job(job: &str) -> Job {
        load(job).expect("config loads").jobs["j"].clone()
    }

    fn load(job: &str) -> Result<Config, crate::config::ConfigErrors> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("jobs")).expect("jobs");
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            "jobs = \"jobs/*.toml\"\n[credentials.c]\nsecret_env = \"K\"\nwindows = [{ units = 10, per = \"1h\" }]\n[endpoints.e]\ncredential = \"c\"\ncost = 1\n",
        )
        .expect("config");
        let text = format!(
            "[j]\nschedule = \"0 * * * * *\"\nendpoint = \"e\"\n{job}\n[j.sink]\nkind = \"jsonl\"\npath = \"out.jsonl\"\nrecords = \"/items\"\n"
        );
        std::fs::write(dir.path().join("jobs/j.toml"), text).expect("job");
        Config::load_with_env(&config, &|name: &str| {
            (name == "K").then(|| "s3cr3t".to_owned())
        })
    }

    /// The request for page `at` of `job` for `item`.
    fn build(job: &Job, item: &[(String, String)], at: PageAt<'_>) -> Request {
        let secret = Secret::new("s3cr3t");
        let mut secrets = Secrets::new();
        secrets.insert("c".into(), secret.clone());
        let fetcher = Fetcher::new(&secrets).expect("fetcher");
        let now = chrono::Utc::now();
        let ph = Placeholders::new(job, item, &secret, now, now);
        fetcher.request(job, &ph, at).expect("request")
    }

    /// The fan-out value of issue 32: JSON's and templates' special
    /// characters, non-ASCII text and a placeholder's name.
    const NASTY: &str = "a\"b\\c}d{e ünï {secret} {{x}}";

    fn item() -> Vec<(String, String)> {
        vec![("v".to_owned(), NASTY.to_owned())]
    }

    fn body(r: &Request) -> serde_json::Value {
        serde_json::from_str(r.body.as_deref().expect("a body")).expect("the body is JSON")
    }

    const GRAPHQL: &str = r#"fan_out = { v = ["x"] }
[j.request]
url = "http://127.0.0.1:1/graphql"
headers = { Authorization = "Bearer {secret}" }
graphql.query = 'query($v: String!, $after: String) { search(q: $v, after: $after) { id } }'
graphql.variables = { v = "{v}", after = "{cursor}", both = "{v}/{cursor}" }
[j.pagination]
cursor = "/next"
more = "/more"
max_pages = 3"#;

    /// Issue 32: a value went into a GraphQL body as written and could
    /// close its string. Each variable is a JSON string with exactly the
    /// value; `{cursor}` alone is null on page 1, the cursor after.
    #[test]
    fn graphql_variables_are_json_strings_with_exactly_the_values() {
        let job = job(GRAPHQL);
        let r = build(&job, &item(), PageAt::Number(1));
        assert_eq!(r.method, reqwest::Method::POST);
        assert_eq!(r.headers["content-type"], "application/json");
        assert!(r.graphql);
        let b = body(&r);
        assert_eq!(
            b["query"],
            "query($v: String!, $after: String) { search(q: $v, after: $after) { id } }"
        );
        assert_eq!(b["variables"]["v"], NASTY);
        assert_eq!(b["variables"]["after"], serde_json::Value::Null);
        assert_eq!(b["variables"]["both"], format!("{NASTY}/"));
        // The URL has no cursor parameter: the variables carry it.
        assert_eq!(r.url.query(), None);
        // Page 2: the cursor, braces and quotes as the upstream wrote them.
        let cursor = Stored::new(r#"{{"last_id":7,"q":"a\"b"}}"#.into());
        let r = build(&job, &item(), PageAt::After(&cursor));
        let b = body(&r);
        assert_eq!(b["variables"]["after"], r#"{"last_id":7,"q":"a\"b"}"#);
        assert_eq!(b["variables"]["v"], NASTY);
    }

    /// A JSON `body`: every placeholder's value JSON-string-escaped, and
    /// never rendered again (`{secret}` in a value stays text).
    #[test]
    fn a_json_body_escapes_every_value() {
        let job = job(r#"fan_out = { v = ["x"] }
[j.request]
method = "POST"
url = "http://127.0.0.1:1/q"
body = '{{"variables": {{"v": "{v}", "c": "{cursor}", "k": "{secret}"}}}}'
[j.pagination]
cursor = "/next"
max_pages = 3"#);
        let r = build(&job, &item(), PageAt::Number(1));
        let b = body(&r);
        assert_eq!(b["variables"]["v"], NASTY);
        assert_eq!(b["variables"]["c"], "");
        assert_eq!(b["variables"]["k"], "s3cr3t");
        let cursor = Stored::new("c\"2".into());
        let b = body(&build(&job, &item(), PageAt::After(&cursor)));
        assert_eq!(b["variables"]["c"], "c\"2");
        // Not JSON: inserted as written, as before.
        let job = self::job(
            r#"fan_out = { v = ["x"] }
[j.request]
method = "POST"
url = "http://127.0.0.1:1/q"
body = 'v={v}'"#,
        );
        let r = build(&job, &item(), PageAt::Number(1));
        assert_eq!(r.body.as_deref(), Some(format!("v={NASTY}").as_str()));
    }

    /// `{cursor}` in the URL, the query and a header: empty on page 1, the
    /// cursor after, escaped as each place escapes values; without
    /// `param`, no cursor parameter is added.
    #[test]
    fn the_cursor_is_a_placeholder_in_url_query_and_headers() {
        let job = job(r#"[j.request]
url = "http://127.0.0.1:1/items/{cursor}"
query = { starting_after = "{cursor}" }
headers = { X-Cursor = "c={cursor}" }
[j.pagination]
cursor = "/next"
max_pages = 3"#);
        let r = build(&job, &[], PageAt::Number(1));
        assert_eq!(r.url.as_str(), "http://127.0.0.1:1/items/?starting_after=");
        assert_eq!(r.headers["x-cursor"], "c=");
        let cursor = Stored::new("a/b c".into());
        let r = build(&job, &[], PageAt::After(&cursor));
        assert_eq!(
            r.url.as_str(),
            "http://127.0.0.1:1/items/a%2Fb%20c?starting_after=a%2Fb+c"
        );
        assert_eq!(r.headers["x-cursor"], "c=a/b c");
    }

    #[test]
    fn a_cursor_param_still_carries_the_cursor() {
        let job = job(r#"[j.request]
url = "http://127.0.0.1:1/items"
[j.pagination]
cursor_record = "/id"
param = "starting_after"
more = "/has_more"
max_pages = 3"#);
        let r = build(&job, &[], PageAt::Number(1));
        assert_eq!(r.url.query(), None);
        let cursor = Stored::new("cus_2".into());
        let r = build(&job, &[], PageAt::After(&cursor));
        assert_eq!(r.url.query(), Some("starting_after=cus_2"));
    }

    #[test]
    fn json_escaping_is_the_encoders() {
        let e = |v| json_escaped(v, Expansion::Simple).into_owned();
        assert_eq!(e("plain ü {x}"), "plain ü {x}");
        assert_eq!(e("a\"b\\c\nd\u{1}"), "a\\\"b\\\\c\\nd\\u0001");
    }
}
