//! The simulator's other pagination styles ([`SimStyle`]): GitHub-like
//! (`page=N`, a `Link` header, `ETag`s and `since`), Meta-like (`after=cN`,
//! an absolute `paging.next` that echoes the query, `access_token`
//! included), Salesforce-like (a relative `nextRecordsUrl`), page numbers
//! (an empty page after the last, `has_more` and `isLast` on every page),
//! a numeric cursor (`"next_page": 2`), a GraphQL connection (a POST whose
//! `variables.after` is the cursor, `pageInfo { hasNextPage endCursor }`)
//! and Stripe's lists (`starting_after` = the last object's id,
//! `has_more`).
//!
//! Every style serves [`SimConfig::pages_per_query`] pages of
//! [`SimConfig::items_per_page`] items per scope (`regionCode`, `q` or
//! `repo`, else `all`; a GraphQL request's variables `owner` and `name`,
//! or `repo`, `region`, `q`); an item is `{scope}-p{n}-i{i}` with an
//! `updated_at` ([`super::Simulator::touch`]). With a `since` (RFC 3339;
//! a GraphQL variable too) after it, a scope has no items: one empty page.
//! Pages past the last are empty.

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
    /// `page=N` in; `{"items": [...], "has_more": bool, "isLast": bool}`,
    /// and `{"items": []}` (`has_more: false`, `isLast: true`) past the
    /// last.
    PageNumber,
    /// `page=N` in; `{"items": [...], "next_page": N+1}` (a number) while
    /// pages are left.
    NumericCursor,
    /// A GraphQL connection (GitHub's v4, Shopify's Admin API): a POST
    /// `{"query", "variables"}` whose `variables.after` is `null` for page
    /// 1 and a page's `endCursor` after; the answer is `{"data": {...}}`
    /// with the connection `{"pageInfo": {"hasNextPage", "endCursor",
    /// "hasPreviousPage", "startCursor"}, "nodes": [...]}` at this path
    /// inside `data` (`["repository", "issues"]`, `["products"]`). The
    /// last page still has its `endCursor` (as GitHub's does); the empty
    /// page after it has `null`. A cursor is JSON text
    /// (`{"last":"ID","page":N}`, as Shopify's decode to): quotes and
    /// braces a client must carry unchanged.
    Graphql(&'static [&'static str]),
    /// Stripe's lists: `starting_after=ID` in (the last object's id of the
    /// page before); `{"object": "list", "url": PATH, "has_more": bool,
    /// "data": [...]}`.
    Stripe,
}

impl SimStyle {
    /// The query parameter a page's number (or `cN` cursor) comes in.
    fn param(self) -> &'static str {
        match self {
            SimStyle::NextUrl | SimStyle::RelativeNext => "after",
            SimStyle::Stripe => "starting_after",
            _ => "page",
        }
    }
}

/// A GraphQL request's `variables`, if its body is one.
fn variables(body: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    match v.get("variables") {
        Some(Value::Object(m)) => Some(m.clone()),
        _ => Some(serde_json::Map::new()),
    }
}

/// The scope a request pages over: `body` is a GraphQL request's.
pub(super) fn scope(style: SimStyle, query: &[(String, String)], body: &[u8]) -> String {
    if let SimStyle::Graphql(_) = style {
        let vars = variables(body).unwrap_or_default();
        let var = |k: &str| vars.get(k).and_then(Value::as_str);
        if let (Some(owner), Some(name)) = (var("owner"), var("name")) {
            return format!("{owner}/{name}");
        }
        let found = ["repo", "region", "q"].iter().find_map(|k| var(k));
        return found.unwrap_or("all").to_owned();
    }
    ["regionCode", "q", "repo"]
        .iter()
        .find_map(|p| param(query, p))
        .unwrap_or("all")
        .to_owned()
}

fn bad_cursor() -> BadParam {
    BadParam("invalidPageToken", "The page or cursor is not valid.")
}

/// The page number a request asks for (1 when it names none).
pub(super) fn page_no(
    style: SimStyle,
    query: &[(String, String)],
    body: &[u8],
) -> Result<u32, BadParam> {
    if let SimStyle::Graphql(_) = style {
        let vars = variables(body).ok_or(BadParam(
            "badRequest",
            "A GraphQL request is a JSON object with a query and variables.",
        ))?;
        return match vars.get("after") {
            None | Some(Value::Null) => Ok(1),
            Some(Value::String(c)) => graphql_page(c).ok_or_else(bad_cursor),
            Some(_) => Err(bad_cursor()),
        };
    }
    let Some(v) = param(query, style.param()).filter(|v| !v.is_empty()) else {
        return Ok(1);
    };
    let n = match style {
        SimStyle::NextUrl | SimStyle::RelativeNext => v.strip_prefix('c'),
        // The page after the one whose object this is: `SCOPE-pN-iK`.
        SimStyle::Stripe => {
            let n = v.rsplit_once("-p").and_then(|(_, r)| r.split_once("-i"));
            let n = n.and_then(|(n, _)| n.parse::<u32>().ok());
            return n.map(|n| n + 1).ok_or(BadParam(
                "resource_missing",
                "No such object: the starting_after id is not one of this list's.",
            ));
        }
        _ => Some(v),
    };
    match n.and_then(|n| n.parse::<u32>().ok()) {
        Some(n) if n >= 1 => Ok(n),
        _ => Err(bad_cursor()),
    }
}

/// The cursor after page `n` of `scope`: JSON text, as Shopify's decode to.
fn graphql_cursor(scope: &str, n: u32, items: u32) -> String {
    json!({ "last": format!("{scope}-p{n}-i{items}"), "page": n }).to_string()
}

/// The page a GraphQL `after` cursor asks for: the one after its `page`.
fn graphql_page(cursor: &str) -> Option<u32> {
    let v: Value = serde_json::from_str(cursor).ok()?;
    let n = u32::try_from(v.get("page")?.as_u64()?).ok()?;
    Some(n + 1)
}

/// The answer to `path?query` (with `body`, a GraphQL request's) in
/// `shared`'s style.
pub(super) fn page(
    shared: &Shared,
    path: &str,
    query: &[(String, String)],
    request: &[u8],
) -> Result<Page, BadParam> {
    let style = shared.style_of(path);
    let scope = scope(style, query, request);
    let n = page_no(style, query, request)?;
    let updated_at = shared.lock().updated_at;
    let graphql_since = match style {
        SimStyle::Graphql(_) => variables(request)
            .and_then(|v| v.get("since").and_then(Value::as_str).map(str::to_owned)),
        _ => None,
    };
    let since = match graphql_since.as_deref().or_else(|| param(query, "since")) {
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
        scope: &scope,
        items: shared.items,
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
    scope: &'a str,
    /// Items per full page.
    items: u32,
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
        SimStyle::PageNumber => json!({ "items": items, "has_more": at.more, "isLast": !at.more }),
        SimStyle::Graphql(connection) => {
            let end = (!items.is_empty()).then(|| graphql_cursor(at.scope, at.n, at.items));
            let start = (at.n > 1).then(|| graphql_cursor(at.scope, at.n - 1, at.items));
            let mut data = json!({
                "pageInfo": {
                    "hasNextPage": at.more,
                    "endCursor": end,
                    "hasPreviousPage": at.n > 1 && !items.is_empty(),
                    "startCursor": start.filter(|_| !items.is_empty()),
                },
                "nodes": items,
            });
            for field in connection.iter().rev() {
                let mut m = serde_json::Map::new();
                m.insert((*field).to_owned(), data);
                data = Value::Object(m);
            }
            json!({ "data": data })
        }
        SimStyle::Stripe => json!({
            "object": "list",
            "url": path,
            "has_more": at.more,
            "data": items,
        }),
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
        let no = |style, query: &[(&str, &str)]| page_no(style, &q(query), b"").ok();
        assert_eq!(no(SimStyle::Link, &[]), Some(1));
        assert_eq!(no(SimStyle::Link, &[("page", "3")]), Some(3));
        assert_eq!(no(SimStyle::NextUrl, &[("after", "c2")]), Some(2));
        assert_eq!(no(SimStyle::NextUrl, &[("after", "2")]), None);
        assert_eq!(no(SimStyle::PageNumber, &[("page", "0")]), None);
        assert_eq!(no(SimStyle::Stripe, &[]), Some(1));
        assert_eq!(
            no(SimStyle::Stripe, &[("starting_after", "a-b-p3-i2")]),
            Some(4)
        );
        assert_eq!(no(SimStyle::Stripe, &[("starting_after", "cus_1")]), None);
    }

    #[test]
    fn graphql_cursors_are_json_text_and_come_back_in_the_variables() {
        let style = SimStyle::Graphql(&["repository", "issues"]);
        let c = graphql_cursor("o/r", 2, 5);
        assert_eq!(c, r#"{"last":"o/r-p2-i5","page":2}"#);
        let body = |after: Value| {
            json!({"query": "q", "variables": {"owner": "o", "name": "r", "after": after}})
                .to_string()
        };
        let no = |b: String| page_no(style, &[], b.as_bytes()).ok();
        assert_eq!(no(body(Value::Null)), Some(1));
        assert_eq!(no(body(json!(c))), Some(3));
        assert_eq!(no(body(json!("nope"))), None);
        assert_eq!(no("not json".into()), None);
        assert_eq!(scope(style, &[], body(Value::Null).as_bytes()), "o/r");
    }

    #[test]
    fn next_queries_keep_every_other_parameter() {
        let query = q(&[("repo", "o/a"), ("access_token", "t k"), ("page", "1")]);
        assert_eq!(
            with_param(&query, "page", "2"),
            "repo=o%2Fa&access_token=t+k&page=2"
        );
        assert_eq!(scope(SimStyle::Link, &query, b""), "o/a");
    }
}
