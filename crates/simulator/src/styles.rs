//! The simulator's other pagination styles ([`SimStyle`]): GitHub-like
//! (`page=N`, a `Link` header, `ETag`s and `since`), Meta-like (`after=cN`,
//! an absolute `paging.next` that echoes the query, `access_token`
//! included), Salesforce-like (a relative `nextRecordsUrl`), page numbers
//! (an empty page after the last) and a numeric cursor (`"next_page": 2`).
//!
//! Every style serves [`SimConfig::pages_per_query`] pages of
//! [`SimConfig::items_per_page`] items per scope (`regionCode`, `q` or
//! `repo`, else `all`); an item is `{scope}-p{n}-i{i}` with an `updated_at`
//! ([`super::Simulator::touch`]). With a `since` (RFC 3339) after it, a scope
//! has no items: one empty page. Pages past the last are empty.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{BadParam, Page, Shared, param};

/// How the simulator pages ([`SimConfig::style`](super::SimConfig::style)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SimStyle {
    /// YouTube: `pageToken` in, `nextPageToken` out (see the module doc of
    /// [`super`]).
    #[default]
    Token,
    /// GitHub REST: `page=N` in; the body is the array of items; a `Link`
    /// header with `rel="next"` (and `rel="last"`) while pages are left.
    Link,
    /// Meta Graph API: `after=cN` in; `{"data": [...], "paging":
    /// {"cursors": {"after"}, "next": ABSOLUTE_URL}}`, the next URL carrying
    /// the request's whole query, `access_token` included.
    NextUrl,
    /// Salesforce-like: `after=cN` in; `{"records": [...],
    /// "nextRecordsUrl": "/path?..."}`, relative, without the host.
    RelativeNext,
    /// `page=N` in; `{"items": [...]}`, and `{"items": []}` past the last.
    PageNumber,
    /// `page=N` in; `{"items": [...], "next_page": N+1}` (a number) while
    /// pages are left.
    NumericCursor,
}

impl SimStyle {
    /// The query parameter a page's number (or `cN` cursor) comes in.
    fn param(self) -> &'static str {
        match self {
            SimStyle::NextUrl | SimStyle::RelativeNext => "after",
            _ => "page",
        }
    }
}

/// The scope a request pages over.
pub(super) fn scope(query: &[(String, String)]) -> String {
    ["regionCode", "q", "repo"]
        .iter()
        .find_map(|p| param(query, p))
        .unwrap_or("all")
        .to_owned()
}

/// The page number a request asks for (1 when it names none).
pub(super) fn page_no(style: SimStyle, query: &[(String, String)]) -> Result<u32, BadParam> {
    let Some(v) = param(query, style.param()).filter(|v| !v.is_empty()) else {
        return Ok(1);
    };
    let n = match style {
        SimStyle::NextUrl | SimStyle::RelativeNext => v.strip_prefix('c'),
        _ => Some(v),
    };
    match n.and_then(|n| n.parse::<u32>().ok()) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(BadParam(
            "invalidPageToken",
            "The page or cursor is not valid.",
        )),
    }
}

/// The answer to `path?query` in `shared`'s style.
pub(super) fn page(
    shared: &Shared,
    path: &str,
    query: &[(String, String)],
) -> Result<Page, BadParam> {
    let style = shared.style;
    let scope = scope(query);
    let n = page_no(style, query)?;
    let updated_at = shared.lock().updated_at;
    let since = match param(query, "since") {
        None => None,
        Some(v) => Some(
            DateTime::parse_from_rfc3339(v)
                .map_err(|_| BadParam("invalidValue", "since must be an RFC 3339 time."))?,
        ),
    };
    let fresh = since.is_none_or(|s| updated_at >= s);
    let last = if fresh { shared.pages } else { 1 };
    let items: Vec<Value> = if fresh && n <= last {
        (1..=shared.items)
            .map(|i| item(&scope, n, i, updated_at))
            .collect()
    } else {
        Vec::new()
    };
    let more = n < last && fresh;
    let mut headers = Vec::new();
    if shared.etag && style == SimStyle::Link {
        headers.push(("etag", etag(&scope, n, updated_at)));
    }
    let at = At {
        base: shared.next_base(),
        path,
        query,
        n,
        last,
        more,
    };
    let body = body(style, &at, items, &mut headers);
    Ok(Page {
        path: path.to_owned(),
        scope,
        token: (n > 1).then(|| n.to_string()),
        body,
        headers,
    })
}

/// Where a page is, for the links to the next one.
struct At<'a> {
    /// Where next links point.
    base: &'a str,
    path: &'a str,
    query: &'a [(String, String)],
    n: u32,
    last: u32,
    /// Whether pages are left after this one.
    more: bool,
}

/// A page's body in `style`, and its `Link` header.
fn body(
    style: SimStyle,
    at: &At<'_>,
    items: Vec<Value>,
    headers: &mut Vec<(&'static str, String)>,
) -> Value {
    let (base, path) = (at.base, at.path);
    let next_query = with_param(at.query, style.param(), &next_value(style, at.n + 1));
    match style {
        SimStyle::Token => unreachable!("the YouTube style is served by the crate root's page"),
        SimStyle::Link => {
            if at.more {
                let last_query = with_param(at.query, "page", &at.last.to_string());
                headers.push((
                    "link",
                    format!(
                        "<{base}{path}?{next_query}>; rel=\"next\", <{base}{path}?{last_query}>; rel=\"last\""
                    ),
                ));
            }
            Value::Array(items)
        }
        SimStyle::NextUrl => {
            let mut paging = json!({ "cursors": { "after": next_value(style, at.n + 1) } });
            if at.more {
                paging["next"] = json!(format!("{base}{path}?{next_query}"));
            }
            json!({ "data": items, "paging": paging })
        }
        SimStyle::RelativeNext => {
            let mut body = json!({ "records": items, "done": !at.more });
            if at.more {
                body["nextRecordsUrl"] = json!(format!("{path}?{next_query}"));
            }
            body
        }
        SimStyle::PageNumber => json!({ "items": items }),
        SimStyle::NumericCursor => {
            let mut body = json!({ "items": items });
            if at.more {
                body["next_page"] = json!(at.n + 1);
            }
            body
        }
    }
}

/// The value of the style's page parameter for page `n`.
fn next_value(style: SimStyle, n: u32) -> String {
    match style {
        SimStyle::NextUrl | SimStyle::RelativeNext => format!("c{n}"),
        _ => n.to_string(),
    }
}

/// `query` with `name` set to `value` (added if missing), form-encoded.
fn with_param(query: &[(String, String)], name: &str, value: &str) -> String {
    let mut pairs: Vec<(&str, &str)> = query
        .iter()
        .filter(|(k, _)| k != name)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    pairs.push((name, value));
    let mut out = form_urlencoded(&pairs);
    if out.is_empty() {
        out.push_str(name);
    }
    out
}

fn form_urlencoded(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// The `ETag` of one page: it changes when the items are touched.
pub(super) fn etag(scope: &str, n: u32, updated_at: DateTime<Utc>) -> String {
    format!("W/\"{scope}-p{n}-{}\"", updated_at.timestamp_micros())
}

/// One deterministic item, GitHub-issue-like.
fn item(scope: &str, n: u32, i: u32, updated_at: DateTime<Utc>) -> Value {
    let id = format!("{scope}-p{n}-i{i}");
    json!({
        "id": id,
        "number": (n - 1) * 1000 + i,
        "title": format!("Simulated {scope} item {i} of page {n}"),
        "updated_at": updated_at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn page_numbers_and_cursors_parse() {
        assert_eq!(page_no(SimStyle::Link, &q(&[])).ok(), Some(1));
        assert_eq!(page_no(SimStyle::Link, &q(&[("page", "3")])).ok(), Some(3));
        assert_eq!(
            page_no(SimStyle::NextUrl, &q(&[("after", "c2")])).ok(),
            Some(2)
        );
        assert!(page_no(SimStyle::NextUrl, &q(&[("after", "2")])).is_err());
        assert!(page_no(SimStyle::PageNumber, &q(&[("page", "0")])).is_err());
    }

    #[test]
    fn next_queries_keep_every_other_parameter() {
        let query = q(&[("repo", "o/a"), ("access_token", "t k"), ("page", "1")]);
        assert_eq!(
            with_param(&query, "page", "2"),
            "repo=o%2Fa&access_token=t+k&page=2"
        );
        assert_eq!(scope(&query), "o/a");
    }
}
