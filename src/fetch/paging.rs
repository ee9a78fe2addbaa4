//! Pagination, in one place: where a job's next page is (SPEC "Pagination
//! styles", [`next_page`] reads it from an answer), how a run keeps its
//! place between pages and runs without the secret ([`Cursor`], the
//! checkpoint's pagination part), and when a run's pages are over
//! ([`onward`]).
//!
//! - `cursor`: the string or number at a JSON pointer (or at one inside
//!   the page's last record: `cursor_record`, Stripe's), sent as a query
//!   parameter or wherever the request puts `{cursor}`; `next_url`: the URL
//!   at a JSON pointer; `link`: the `Link` header's `rel="next"` target
//!   ([`next_link`], RFC 8288); `page`: a number the worker counts
//!   ([`page_value`]).
//! - In every style, a `more` / `last` flag in the answer can say that no
//!   page follows: the run ends there, without asking for one more page
//!   ([`flag_says`]).
//! - What is kept (in the page loop and in the checkpoint in Redis) is a
//!   [`Stored`] token: the upstream's text with every spelling of the secret
//!   written `{secret}` / `{+secret}` and every other brace doubled, so the
//!   only placeholder it can ever hold is the secret, and nothing the
//!   upstream sends can pull in `{region}` or any other value
//!   ([`Stored::render`]). The URL it renders is sent only if it is on the
//!   job's origin (`fetch::Origin`), so the secret put back into it goes
//!   nowhere else.

use reqwest::Url;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{CursorAt, Job, PageFlag, PageStyle, Secret, Template};
use crate::scrub::Scrubber;
use crate::sink::json_kind;

/// A next-page cursor or URL as it is kept: the secret in it written as a
/// placeholder (see the module doc). Never holds the secret itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Stored(String);

/// Why a stored token cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StoredError {
    /// It does not parse as a template (a checkpoint of an older version).
    #[error("the stored next page does not parse ({0}); the next run starts over")]
    Unreadable(String),
    /// It names a placeholder other than the secret: never filled in.
    #[error("the stored next page names {{{0}}}; only {{secret}} is ever filled in")]
    Placeholder(String),
}

impl Stored {
    /// Wraps text that is already in stored form (`Scrubber::templatize`).
    pub(crate) fn new(stored: String) -> Self {
        Stored(stored)
    }

    /// The text to send: the secret put back, in a URL percent-encoded as
    /// the request URL's placeholders are (`{secret}`) or as it was
    /// (`{+secret}`), elsewhere as it is.
    pub(crate) fn render(&self, secret: &Secret, in_url: bool) -> Result<String, StoredError> {
        let t = Template::parse(&self.0).map_err(|e| StoredError::Unreadable(e.to_string()))?;
        if let Some(other) = t.placeholders().find(|p| *p != SECRET) {
            return Err(StoredError::Placeholder(other.to_owned()));
        }
        let lookup = |_: &str| Some(secret.expose());
        Ok(if in_url {
            t.render_with(lookup, crate::config::expand)
        } else {
            t.render(lookup)
        })
    }
}

/// The one placeholder a stored token may hold.
pub(crate) const SECRET: &str = "secret";

/// What a page's answer says about the page after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// There is none: the answer names no next page, or its `more` /
    /// `last` flag says this page is the last.
    End,
    /// `style = "page"`: the next number, as far as the answer says (the
    /// worker counts; a page with no records is the last).
    Counted,
    /// The next page's cursor, or its absolute URL, in stored form.
    At(Stored),
    /// The answer names a next page that cannot be used (a cursor that is
    /// an object, a next URL that is not one, a flag that is not a
    /// boolean): a bad response.
    Bad(String),
}

/// A JSON scalar as the text a cursor sends: a string as it is, a number
/// as its decimal text (as the answer wrote it); `None` for anything else.
/// The one place a value read from an answer becomes a cursor.
pub(crate) fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The cursor at `pointer`: a non-empty string, or a number as its decimal
/// text; missing, `null` or `""` means no next page.
pub(crate) fn cursor_at(body: &Value, pointer: &str) -> Result<Option<String>, String> {
    match body.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match scalar_text(v) {
            Some(s) if s.is_empty() => Ok(None),
            Some(s) => Ok(Some(s)),
            None => Err(format!(
                "the cursor at {pointer:?} is {}, not a string or number",
                json_kind(v)
            )),
        },
    }
}

/// `cursor_record`: the cursor at `pointer` inside the last record of the
/// array at `records` (the sink's); `Ok(None)` when there is no record (an
/// empty page ends the run) or the last one has none there.
pub(crate) fn record_cursor_at(
    body: &Value,
    records: &str,
    pointer: &str,
) -> Result<Option<String>, String> {
    let Some(Value::Array(records)) = body.pointer(records) else {
        // The sink says what is wrong with the records.
        return Ok(None);
    };
    let Some(last) = records.last() else {
        return Ok(None);
    };
    cursor_at(last, pointer).map_err(|e| format!("in the page's last record, {e}"))
}

/// What the answer's `more` / `last` flag says: `Some(true)` another page
/// follows, `Some(false)` none does, `None` the answer does not say (no
/// flag configured, or a `last` flag that is missing or `null`). `Err`: a
/// flag that is not a boolean, naming its pointer.
pub(crate) fn flag_says(flag: Option<&PageFlag>, body: &Value) -> Result<Option<bool>, String> {
    let (pointer, more) = match flag {
        None => return Ok(None),
        Some(PageFlag::More(p)) => (p, true),
        Some(PageFlag::Last(p)) => (p, false),
    };
    match body.pointer(pointer) {
        Some(Value::Bool(b)) => Ok(Some(*b == more)),
        // GraphQL's hasNextPage, Stripe's has_more: absent means no more.
        None | Some(Value::Null) if more => Ok(Some(false)),
        None | Some(Value::Null) => Ok(None),
        Some(other) => Err(format!(
            "the {} flag at {pointer:?} is {}, not a boolean",
            if more { "more" } else { "last" },
            json_kind(other)
        )),
    }
}

/// The next URL at `pointer`: a non-empty string; missing, `null` or `""`
/// means no next page.
pub(crate) fn url_at(body: &Value, pointer: &str) -> Result<Option<String>, String> {
    match body.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.trim().to_owned())),
        Some(other) => Err(format!(
            "the next URL at {pointer:?} is {}, not a string",
            json_kind(other)
        )),
    }
}

/// `style = "page"`: the value of `param` for page `page` (1 = first).
pub(crate) fn page_value(start: u64, step: u64, page: u32) -> u64 {
    start.saturating_add(step.saturating_mul(u64::from(page.saturating_sub(1))))
}

/// The target of the first link whose relation types include `next`, in
/// any of the `Link` header fields given (RFC 8288 section 3), as written
/// (a relative reference is resolved by the caller).
pub(crate) fn next_link<'a>(fields: impl IntoIterator<Item = &'a str>) -> Option<String> {
    fields
        .into_iter()
        .flat_map(links)
        .find(|l| l.rels.iter().any(|r| r.eq_ignore_ascii_case("next")))
        .map(|l| l.target)
}

/// One link-value of a `Link` field.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    target: String,
    /// The relation types of its first `rel` parameter (later ones are
    /// ignored, as RFC 8288 section 3.3 says).
    rels: Vec<String>,
}

/// Every well-formed link-value of one `Link` field:
///
/// ```text
/// Link       = #link-value
/// link-value = "<" URI-Reference ">" *( OWS ";" OWS link-param )
/// link-param = token BWS [ "=" BWS ( token / quoted-string ) ]
/// ```
///
/// Commas and semicolons inside `<...>` and inside quoted strings belong to
/// them. A malformed link-value is skipped up to the next comma at its top
/// level; the others still count.
fn links(field: &str) -> Vec<Link> {
    let mut p = Parser {
        s: field.as_bytes(),
        i: 0,
    };
    let mut out = Vec::new();
    loop {
        p.skip(|b| b == b',' || is_ows(b));
        if p.done() {
            return out;
        }
        match p.link_value() {
            Some(link) => out.push(link),
            // A target cut short by the next one's `<`: start again there.
            None if p.peek() == Some(b'<') => {}
            None => p.skip_value(),
        }
    }
}

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn done(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip(&mut self, f: impl Fn(u8) -> bool) {
        while self.peek().is_some_and(&f) {
            self.i += 1;
        }
    }

    fn text(&self, from: usize) -> String {
        String::from_utf8_lossy(&self.s[from..self.i]).into_owned()
    }

    /// One link-value, the cursor on its first byte; `None` when malformed.
    fn link_value(&mut self) -> Option<Link> {
        if self.peek()? != b'<' {
            return None;
        }
        self.i += 1;
        let from = self.i;
        // No URI reference holds `<` (RFC 3986): one means this target
        // was never closed.
        self.skip(|b| b != b'>' && b != b'<');
        if self.peek() != Some(b'>') {
            return None;
        }
        let target = self.text(from).trim().to_owned();
        self.i += 1;
        let mut rels = None;
        loop {
            self.skip(is_ows);
            match self.peek() {
                None | Some(b',') => break,
                Some(b';') => self.i += 1,
                Some(_) => return None,
            }
            self.skip(is_ows);
            let (name, value) = self.param()?;
            if name.eq_ignore_ascii_case("rel") && rels.is_none() {
                let value = value.unwrap_or_default();
                rels = Some(value.split_ascii_whitespace().map(str::to_owned).collect());
            }
        }
        Some(Link {
            target,
            rels: rels.unwrap_or_default(),
        })
    }

    /// `token BWS [ "=" BWS ( token / quoted-string ) ]`.
    fn param(&mut self) -> Option<(String, Option<String>)> {
        let from = self.i;
        self.skip(is_tchar);
        if self.i == from {
            return None;
        }
        let name = self.text(from);
        self.skip(is_ows);
        if self.peek() != Some(b'=') {
            return Some((name, None));
        }
        self.i += 1;
        self.skip(is_ows);
        if self.peek() == Some(b'"') {
            return Some((name, Some(self.quoted()?)));
        }
        // A token; leniently, anything up to the next separator
        // (`type=text/html` is seen in the wild).
        let from = self.i;
        self.skip(|b| !matches!(b, b';' | b',' | b'"') && !is_ows(b));
        Some((name, Some(self.text(from))))
    }

    /// A quoted-string, the cursor on its opening quote; `\x` is `x`.
    fn quoted(&mut self) -> Option<String> {
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(String::from_utf8_lossy(&out).into_owned());
                }
                b'\\' => {
                    self.i += 1;
                    out.push(self.peek()?);
                }
                b => out.push(b),
            }
            self.i += 1;
        }
    }

    /// Skips a malformed link-value: up to the next comma outside `<...>`
    /// and quoted strings.
    fn skip_value(&mut self) {
        let (mut angle, mut quote) = (false, false);
        while let Some(b) = self.peek() {
            match b {
                b'\\' if quote => self.i += 1,
                b'"' if !angle => quote = !quote,
                b'<' if !quote => angle = true,
                b'>' if !quote => angle = false,
                b',' if !angle && !quote => return,
                _ => {}
            }
            self.i += 1;
        }
    }
}

/// The validators of an item's page 1 (`conditional = true`), sent back as
/// `If-None-Match` / `If-Modified-Since` by the item's next run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Validators {
    /// The `ETag` it was answered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) etag: Option<String>,
    /// The `Last-Modified` it was answered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_modified: Option<String>,
}

impl Validators {
    /// Whether there is nothing to send.
    pub(crate) fn is_empty(&self) -> bool {
        self.etag.is_none() && self.last_modified.is_none()
    }
}

/// Where a page's answer says the next page is, by the job's style, and
/// whether it says one follows at all.
#[derive(Debug, Clone)]
pub(super) struct NextIn {
    at: NextAt,
    /// `more` / `last`.
    flag: Option<PageFlag>,
}

/// Where the next page is, by the job's style.
#[derive(Debug, Clone)]
enum NextAt {
    /// Nowhere: no pagination.
    Nowhere,
    /// `style = "page"`: the worker counts.
    Counted,
    /// A cursor at this JSON pointer.
    Cursor(String),
    /// A cursor at this JSON pointer in the last record of the array at
    /// `records` (the sink's).
    Record { pointer: String, records: String },
    /// A URL at this JSON pointer.
    Url(String),
    /// The `Link` header's `rel="next"`.
    Link,
}

impl NextIn {
    pub(super) fn of(job: &Job) -> Self {
        let Some(p) = &job.pagination else {
            return NextIn {
                at: NextAt::Nowhere,
                flag: None,
            };
        };
        let at = match &p.style {
            PageStyle::Cursor {
                cursor: CursorAt::Answer(ptr),
                ..
            } => NextAt::Cursor(ptr.clone()),
            PageStyle::Cursor {
                cursor: CursorAt::LastRecord(ptr),
                ..
            } => NextAt::Record {
                pointer: ptr.clone(),
                records: job.sink.records.clone(),
            },
            PageStyle::NextUrl { next } => NextAt::Url(next.clone()),
            PageStyle::Link => NextAt::Link,
            PageStyle::Page { .. } => NextAt::Counted,
        };
        NextIn {
            at,
            flag: p.flag.clone(),
        }
    }

    /// Where the cursor or next URL is, for a message.
    fn describe(&self) -> String {
        match &self.at {
            NextAt::Nowhere | NextAt::Counted => "no next page".to_owned(),
            NextAt::Cursor(p) => format!("no cursor at {p:?}"),
            NextAt::Record { pointer, .. } => {
                format!("no cursor at {pointer:?} in its last record")
            }
            NextAt::Url(p) => format!("no next URL at {p:?}"),
            NextAt::Link => "no Link header with rel=\"next\"".to_owned(),
        }
    }
}

/// Where a page's answer says the next page is, in stored form (`body`
/// and `headers` not yet scrubbed: the secret in a next URL becomes its
/// placeholder, not `[redacted]`). A relative URL resolves against the
/// request's URL (`request_url`); its origin is checked when its request
/// is built.
///
/// A `more` / `last` flag that says no page follows ends the run whatever
/// else the answer names (GraphQL's last page still has an `endCursor`);
/// one that says a page follows when the answer names none is a bad
/// response (ending there would silently lose the pages after it).
pub(super) fn next_page(
    next_in: &NextIn,
    request_url: &Url,
    headers: &HeaderMap,
    body: &Value,
    scrubber: &Scrubber,
) -> Next {
    let follows = match flag_says(next_in.flag.as_ref(), body) {
        Err(e) => return Next::Bad(e),
        Ok(Some(false)) => return Next::End,
        Ok(follows) => follows,
    };
    // `cursor_record`: a page with no records is the last, whatever the
    // flag says.
    let empty = match &next_in.at {
        NextAt::Record { records, .. } => (body.pointer(records))
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty),
        _ => false,
    };
    let next = located(&next_in.at, request_url, headers, body, scrubber);
    match (next, follows) {
        (Next::End, Some(true)) if !empty => {
            let flag = match &next_in.flag {
                Some(PageFlag::More(p)) => format!("{p:?} is true"),
                Some(PageFlag::Last(p)) => format!("{p:?} is false"),
                None => String::new(),
            };
            Next::Bad(format!(
                "the answer says another page follows ({flag}) but has {}",
                next_in.describe()
            ))
        }
        (next, _) => next,
    }
}

/// Where the answer says the next page is, by the style alone.
fn located(
    at: &NextAt,
    request_url: &Url,
    headers: &HeaderMap,
    body: &Value,
    scrubber: &Scrubber,
) -> Next {
    let cursor = |found: Result<Option<String>, String>| match found {
        Ok(Some(c)) => Next::At(Stored::new(scrubber.templatize(&c))),
        Ok(None) => Next::End,
        Err(e) => Next::Bad(e),
    };
    let url = match at {
        NextAt::Nowhere => return Next::End,
        NextAt::Counted => return Next::Counted,
        NextAt::Cursor(ptr) => return cursor(cursor_at(body, ptr)),
        NextAt::Record { pointer, records } => {
            return cursor(record_cursor_at(body, records, pointer));
        }
        NextAt::Url(ptr) => match url_at(body, ptr) {
            Ok(url) => url,
            Err(e) => return Next::Bad(e),
        },
        NextAt::Link => next_link(
            headers
                .get_all(reqwest::header::LINK)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        ),
    };
    let Some(url) = url else {
        return Next::End;
    };
    match request_url.join(&url) {
        Ok(next) => Next::At(Stored::new(scrubber.templatize(next.as_str()))),
        // The parse error names no part of the URL (which may hold the secret).
        Err(e) => Next::Bad(format!("the next page's URL does not parse: {e}")),
    }
}

/// Where a run is in its item's pages: the pagination part of the
/// checkpoint (`worker::Checkpoint` flattens it, so the JSON kept in Redis
/// is as it was).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Cursor {
    /// The next page's number (1 = first).
    pub(crate) page: u32,
    /// The cursor or next URL to send for it (none for page 1, and for
    /// `style = "page"`, which counts).
    pub(crate) token: Option<Stored>,
    /// The page this run started at: 1, or where it went on from a run
    /// that stopped at `max_pages` (`continue = true`). `max_pages` counts
    /// from here, a resumed run included.
    #[serde(default = "first_page")]
    pub(crate) first: u32,
}

fn first_page() -> u32 {
    1
}

impl Cursor {
    /// A run's first page.
    pub(crate) fn start() -> Self {
        Cursor {
            page: 1,
            token: None,
            first: 1,
        }
    }

    /// The last page this run may fetch: `max_pages` from the page it
    /// started at.
    pub(crate) fn last_page(&self, max_pages: u32) -> u32 {
        self.first.saturating_add(max_pages - 1)
    }

    /// On to the next page, asked for by `token`.
    pub(crate) fn advance(&mut self, token: Option<Stored>) {
        self.page += 1;
        self.token = token;
    }

    /// On to the next page, where the item's next run starts
    /// (`continue = true`: `max_pages` counts from there).
    pub(crate) fn hand_on(&mut self, token: Option<Stored>) {
        self.advance(token);
        self.first = self.page;
    }
}

/// What a fetched page says comes after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Onward {
    /// Nothing: the run's pages are over.
    Last,
    /// Another page, with the cursor or next URL that asks for it (none
    /// for `style = "page"`, which counts).
    To(Option<Stored>),
}

/// What comes after a fetched page, by the job's `style`: `style = "page"`
/// ends at the first page with no records (`on_page`: records the page
/// held, not how many the sink stored, which is 0 for a page a keyed
/// SQLite sink already holds newer copies of), the others where the answer
/// names no next page; every style where its `more` / `last` flag says so
/// ([`Next::End`]). `Err` is a bad response (a next page that cannot be
/// used, a flag that is not a boolean).
pub(crate) fn onward(
    style: Option<&PageStyle>,
    next: Next,
    on_page: usize,
) -> Result<Onward, String> {
    match (style, next) {
        (None, _) | (Some(_), Next::End) => Ok(Onward::Last),
        (Some(_), Next::Bad(why)) => Err(why),
        (Some(PageStyle::Page { .. }), _) if on_page == 0 => Ok(Onward::Last),
        (Some(PageStyle::Page { .. }), _) => Ok(Onward::To(None)),
        (Some(_), Next::At(token)) => Ok(Onward::To(Some(token))),
        // Only `style = "page"` counts.
        (Some(_), Next::Counted) => Ok(Onward::Last),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn targets(field: &str) -> Vec<(String, Vec<String>)> {
        links(field)
            .into_iter()
            .map(|l| (l.target, l.rels))
            .collect()
    }

    #[test]
    fn github_and_shopify_links() {
        let gh = r#"<https://api.github.com/repositories/1/issues?page=2>; rel="next", <https://api.github.com/repositories/1/issues?page=14>; rel="last""#;
        assert_eq!(
            next_link([gh]).as_deref(),
            Some("https://api.github.com/repositories/1/issues?page=2")
        );
        let shopify = r#"<https://shop.myshopify.com/admin/api/2024-01/products.json?page_info=abc&limit=3>; rel="previous", <https://shop.myshopify.com/admin/api/2024-01/products.json?page_info=def&limit=3>; rel="next""#;
        assert!(next_link([shopify]).unwrap().contains("page_info=def"));
        // The last page has no next.
        let last = r#"<https://h/x?page=1>; rel="first", <https://h/x?page=13>; rel="prev""#;
        assert_eq!(next_link([last]), None);
    }

    #[test]
    fn commas_and_semicolons_inside_targets_and_quotes_belong_to_them() {
        let f = r#"<https://h/x?ids=1,2,3;a=b>; title="a, b; rel=next"; rel="prev", <https://h/x?ids=4,5>; rel=next"#;
        assert_eq!(
            targets(f),
            [
                (
                    "https://h/x?ids=1,2,3;a=b".to_owned(),
                    vec!["prev".to_owned()]
                ),
                ("https://h/x?ids=4,5".to_owned(), vec!["next".to_owned()]),
            ]
        );
        assert_eq!(next_link([f]).as_deref(), Some("https://h/x?ids=4,5"));
    }

    #[test]
    fn several_rels_case_and_whitespace() {
        let f = "<  /page/3  >  ;  REL = \"last   NEXT\"";
        assert_eq!(next_link([f]).as_deref(), Some("/page/3"));
        // Only the first rel counts (RFC 8288 section 3.3).
        assert_eq!(next_link([r#"</a>; rel="prev"; rel="next""#]), None);
        // A quoted-pair inside the value.
        let f = r#"</a>; title="say \"next\""; rel="alternate next""#;
        assert_eq!(next_link([f]).as_deref(), Some("/a"));
        // Other parameters without values, or with token values.
        assert_eq!(
            next_link(["</b>; crossorigin; type=text/html; rel=next"]).as_deref(),
            Some("/b")
        );
        // "nextish" is not "next".
        assert_eq!(next_link([r#"</c>; rel="nextish""#]), None);
    }

    #[test]
    fn several_fields_and_malformed_values() {
        // Two Link header fields: the next link is in the second.
        assert_eq!(
            next_link([r#"</1>; rel="prev""#, r#"</3>; rel="next""#]).as_deref(),
            Some("/3")
        );
        // A malformed link-value is skipped; the well-formed ones count.
        for f in [
            r#"https://h/no-brackets; rel="next", </ok>; rel="next""#,
            r#"</broken; rel="next", </ok>; rel=next"#,
            r#"</x>; rel="unterminated, </ok>; rel="next""#,
        ] {
            let got = next_link([f]);
            assert!(
                got.is_none() || got.as_deref() == Some("/ok"),
                "{f}: {got:?}"
            );
        }
        assert_eq!(
            next_link([r#"garbage "a,b", </ok>; rel="next""#]).as_deref(),
            Some("/ok")
        );
        assert_eq!(next_link(["", " , ,", "<>"]), None);
    }

    #[test]
    fn cursors_are_strings_or_numbers() {
        let body = json!({"s": "abc", "n": 2, "big": 12345678901234_u64, "e": "", "z": null,
                          "o": {"a": 1}});
        assert_eq!(cursor_at(&body, "/s"), Ok(Some("abc".into())));
        assert_eq!(cursor_at(&body, "/n"), Ok(Some("2".into())));
        assert_eq!(cursor_at(&body, "/big"), Ok(Some("12345678901234".into())));
        assert_eq!(cursor_at(&body, "/e"), Ok(None));
        assert_eq!(cursor_at(&body, "/z"), Ok(None));
        assert_eq!(cursor_at(&body, "/missing"), Ok(None));
        assert!(cursor_at(&body, "/o").unwrap_err().contains("an object"));
        // Issue 39: a number's text as sent, every digit (a cursor from a
        // record's id, issue 32's `cursor_record`, reads it here too).
        let body: Value =
            serde_json::from_str(r#"{"id":123456789012345678901234567891,"p":12.30}"#).unwrap();
        let cursor = |p| cursor_at(&body, p).unwrap();
        assert_eq!(
            cursor("/id").as_deref(),
            Some("123456789012345678901234567891")
        );
        assert_eq!(cursor("/p").as_deref(), Some("12.30"));
        assert_eq!(
            url_at(&json!({"p": {"next": " /x "}}), "/p/next"),
            Ok(Some("/x".into()))
        );
        assert!(url_at(&json!({"n": 3}), "/n").is_err());
    }

    fn more(p: &str) -> Option<PageFlag> {
        Some(PageFlag::More(p.into()))
    }

    fn last(p: &str) -> Option<PageFlag> {
        Some(PageFlag::Last(p.into()))
    }

    #[test]
    fn flags_say_whether_a_page_follows() {
        let body = json!({"has_more": true, "no": false, "isLast": true, "z": null,
                          "s": "yes", "n": 1});
        assert_eq!(flag_says(None, &body), Ok(None));
        assert_eq!(flag_says(more("/has_more").as_ref(), &body), Ok(Some(true)));
        assert_eq!(flag_says(more("/no").as_ref(), &body), Ok(Some(false)));
        // A missing or null `more` is no more (GraphQL, Stripe).
        assert_eq!(flag_says(more("/z").as_ref(), &body), Ok(Some(false)));
        assert_eq!(flag_says(more("/gone").as_ref(), &body), Ok(Some(false)));
        assert_eq!(flag_says(last("/isLast").as_ref(), &body), Ok(Some(false)));
        assert_eq!(flag_says(last("/no").as_ref(), &body), Ok(Some(true)));
        // A missing `last` says nothing: the style decides.
        assert_eq!(flag_says(last("/gone").as_ref(), &body), Ok(None));
        assert_eq!(
            flag_says(more("/s").as_ref(), &body),
            Err(r#"the more flag at "/s" is a string, not a boolean"#.into())
        );
        assert_eq!(
            flag_says(last("/n").as_ref(), &body),
            Err(r#"the last flag at "/n" is a number, not a boolean"#.into())
        );
    }

    #[test]
    fn a_record_cursor_is_the_last_records() {
        let body = json!({"data": [{"id": "a"}, {"id": "b"}], "n": [{"id": 7}],
                          "empty": [], "o": [{"id": {"x": 1}}]});
        assert_eq!(
            record_cursor_at(&body, "/data", "/id"),
            Ok(Some("b".into()))
        );
        assert_eq!(record_cursor_at(&body, "/n", "/id"), Ok(Some("7".into())));
        assert_eq!(record_cursor_at(&body, "/empty", "/id"), Ok(None));
        assert_eq!(record_cursor_at(&body, "/missing", "/id"), Ok(None));
        assert_eq!(
            record_cursor_at(&body, "/o", "/id"),
            Err(r#"in the page's last record, the cursor at "/id" is an object, not a string or number"#.into())
        );
    }

    fn next_of(at: NextAt, flag: Option<PageFlag>, body: &Value) -> Next {
        let url = Url::parse("https://h/x").unwrap();
        let next_in = NextIn { at, flag };
        next_page(
            &next_in,
            &url,
            &HeaderMap::new(),
            body,
            &Scrubber::default(),
        )
    }

    fn at(t: &str) -> Next {
        Next::At(Stored::new(t.into()))
    }

    #[test]
    fn a_flag_that_says_no_more_ends_the_run_whatever_else_the_answer_names() {
        let page = |more: bool| json!({"data": {"c": {"pageInfo": {"hasNextPage": more, "endCursor": "e{1}"}}}});
        let cursor = || NextAt::Cursor("/data/c/pageInfo/endCursor".into());
        let flag = more("/data/c/pageInfo/hasNextPage");
        assert_eq!(next_of(cursor(), flag.clone(), &page(true)), at("e{{1}}"));
        // GraphQL's last page still has an endCursor.
        assert_eq!(next_of(cursor(), flag.clone(), &page(false)), Next::End);
        assert_eq!(next_of(cursor(), None, &page(false)), at("e{{1}}"));
        // A flag that says more, and no cursor: a bad answer, never a
        // silent end.
        let none = json!({"data": {"c": {"pageInfo": {"hasNextPage": true, "endCursor": null}}}});
        assert_eq!(
            next_of(cursor(), flag.clone(), &none),
            Next::Bad(r#"the answer says another page follows ("/data/c/pageInfo/hasNextPage" is true) but has no cursor at "/data/c/pageInfo/endCursor""#.into())
        );
        // A bad flag is a bad answer.
        let bad = json!({"data": {"c": {"pageInfo": {"hasNextPage": "true", "endCursor": "x"}}}});
        assert!(matches!(next_of(cursor(), flag, &bad), Next::Bad(e) if e.contains("hasNextPage")));
        // Pages count on until the flag says stop.
        let n = json!({"items": [1], "isLast": false});
        assert_eq!(next_of(NextAt::Counted, last("/isLast"), &n), Next::Counted);
        let n = json!({"items": [1], "isLast": true});
        assert_eq!(next_of(NextAt::Counted, last("/isLast"), &n), Next::End);
        let link = || NextAt::Link;
        assert_eq!(
            next_of(link(), more("/more"), &json!({"more": false})),
            Next::End
        );
        assert!(
            matches!(next_of(link(), more("/more"), &json!({"more": true})), Next::Bad(e) if e.contains("no Link header"))
        );
    }

    #[test]
    fn stripe_pages_by_the_last_records_id_until_has_more_is_false() {
        let rec = || NextAt::Record {
            pointer: "/id".into(),
            records: "/data".into(),
        };
        let body = json!({"data": [{"id": "cus_1"}, {"id": "cus_2"}], "has_more": true});
        assert_eq!(next_of(rec(), more("/has_more"), &body), at("cus_2"));
        let body = json!({"data": [{"id": "cus_3"}], "has_more": false});
        assert_eq!(next_of(rec(), more("/has_more"), &body), Next::End);
        // An empty page ends the run, whatever has_more says.
        let body = json!({"data": [], "has_more": true});
        assert_eq!(next_of(rec(), more("/has_more"), &body), Next::End);
        // A last record without an id while has_more says more: bad.
        let body = json!({"data": [{"x": 1}], "has_more": true});
        assert!(matches!(
            next_of(rec(), more("/has_more"), &body),
            Next::Bad(_)
        ));
        assert_eq!(
            next_of(rec(), None, &json!({"data": [{"x": 1}]})),
            Next::End
        );
    }

    #[test]
    fn onward_ends_every_style_on_end_and_counts_pages() {
        let page = PageStyle::Page {
            param: "p".into(),
            start: 1,
            step: 1,
        };
        assert_eq!(onward(Some(&page), Next::Counted, 2), Ok(Onward::To(None)));
        assert_eq!(onward(Some(&page), Next::Counted, 0), Ok(Onward::Last));
        assert_eq!(onward(Some(&page), Next::End, 2), Ok(Onward::Last));
        assert_eq!(
            onward(Some(&page), Next::Bad("b".into()), 2),
            Err("b".into())
        );
        assert_eq!(
            onward(Some(&PageStyle::Link), at("u"), 2),
            Ok(Onward::To(Some(Stored::new("u".into()))))
        );
        assert_eq!(onward(None, at("u"), 2), Ok(Onward::Last));
    }

    #[test]
    fn page_values_count_from_start_by_step() {
        assert_eq!(page_value(1, 1, 1), 1);
        assert_eq!(page_value(1, 1, 4), 4);
        assert_eq!(page_value(0, 100, 3), 200);
        assert_eq!(page_value(u64::MAX, 5, 9), u64::MAX);
    }

    #[test]
    fn stored_tokens_fill_in_only_the_secret() {
        let s = Secret::new("k/y");
        let t = Stored::new("https://h/x?t={secret}&u={+secret}&b={{x}}".into());
        let url = t.render(&s, true).unwrap();
        assert_eq!(url, "https://h/x?t=k%2Fy&u=k/y&b={x}");
        assert_eq!(
            Stored::new("c-{secret}".into()).render(&s, false).unwrap(),
            "c-k/y"
        );
        assert_eq!(
            Stored::new("https://h/{region}".into()).render(&s, false),
            Err(StoredError::Placeholder("region".into()))
        );
        assert!(matches!(
            Stored::new("a{b".into()).render(&s, false),
            Err(StoredError::Unreadable(_))
        ));
    }
}
