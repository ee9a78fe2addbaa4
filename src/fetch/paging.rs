//! Pagination, in one place: where a job's next page is (SPEC "Pagination
//! styles", [`next_page`] reads it from an answer), how a run keeps its
//! place between pages and runs without the secret ([`Cursor`], the
//! checkpoint's pagination part), and when a run's pages are over
//! ([`onward`]).
//!
//! - `cursor`: the string or number at a JSON pointer, sent as a query
//!   parameter; `next_url`: the URL at a JSON pointer; `link`: the `Link`
//!   header's `rel="next"` target ([`next_link`], RFC 8288); `page`: a
//!   number the worker counts ([`page_value`]).
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

use crate::config::{Job, PageStyle, Secret, Template};
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
    /// There is none (or the style is `page`, which the worker counts).
    End,
    /// The next page's cursor, or its absolute URL, in stored form.
    At(Stored),
    /// The answer names a next page that cannot be used (a cursor that is
    /// an object, a next URL that is not one): a bad response.
    Bad(String),
}

/// The cursor at `pointer`: a non-empty string, or a number as its decimal
/// text; missing, `null` or `""` means no next page.
pub(crate) fn cursor_at(body: &Value, pointer: &str) -> Result<Option<String>, String> {
    match body.pointer(pointer) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(format!(
            "the cursor at {pointer:?} is {}, not a string or number",
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

/// Where a page's answer says the next page is, by the job's style.
#[derive(Debug, Clone)]
pub(super) enum NextIn {
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
    pub(super) fn of(job: &Job) -> Self {
        match job.pagination.as_ref().map(|p| &p.style) {
            Some(PageStyle::Cursor { cursor, .. }) => NextIn::Cursor(cursor.clone()),
            Some(PageStyle::NextUrl { next }) => NextIn::Url(next.clone()),
            Some(PageStyle::Link) => NextIn::Link,
            Some(PageStyle::Page { .. }) | None => NextIn::Nowhere,
        }
    }
}

/// Where a page's answer says the next page is, in stored form (`body`
/// and `headers` not yet scrubbed: the secret in a next URL becomes its
/// placeholder, not `[redacted]`). A relative URL resolves against the
/// request's URL (`request_url`); its origin is checked when its request
/// is built.
pub(super) fn next_page(
    next_in: &NextIn,
    request_url: &Url,
    headers: &HeaderMap,
    body: &Value,
    scrubber: &Scrubber,
) -> Next {
    let url = match next_in {
        NextIn::Nowhere => return Next::End,
        NextIn::Cursor(ptr) => {
            return match cursor_at(body, ptr) {
                Ok(Some(c)) => Next::At(Stored::new(scrubber.templatize(&c))),
                Ok(None) => Next::End,
                Err(e) => Next::Bad(e),
            };
        }
        NextIn::Url(ptr) => match url_at(body, ptr) {
            Ok(url) => url,
            Err(e) => return Next::Bad(e),
        },
        NextIn::Link => next_link(
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
/// names no next page. `Err` is a bad response (a next page that cannot be
/// used).
pub(crate) fn onward(
    style: Option<&PageStyle>,
    next: Next,
    on_page: usize,
) -> Result<Onward, String> {
    match (style, next) {
        (Some(PageStyle::Page { .. }), _) if on_page == 0 => Ok(Onward::Last),
        (Some(PageStyle::Page { .. }), _) => Ok(Onward::To(None)),
        (None, _) | (Some(_), Next::End) => Ok(Onward::Last),
        (Some(_), Next::At(token)) => Ok(Onward::To(Some(token))),
        (Some(_), Next::Bad(why)) => Err(why),
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
