//! `[job.request]`, and the check every template of a job goes through: each
//! `{placeholder}` must have a value, and `{secret}` goes only where it is
//! sent to the upstream, never into a file name. A request's `graphql`
//! table (its query takes no placeholders: values go in as variables).

use super::Loader;
use crate::config::defaults as d;
use crate::config::raw::{RawGraphql, RawRequest};
use crate::config::{FieldPath, Graphql, Method, RequestTemplate, Source, Template, Variable};

/// The placeholders a job's templates may use: its fan-out keys and
/// `fan_out_from` columns, `{job}` and `{date}`, and in the request (not in
/// file names) `{secret}`, `{since}` and `{since_epoch}`.
pub(super) struct Placeholders<'a> {
    fan_out: Vec<&'a str>,
    /// A `fan_out_from` whose columns could not be read (reported): any
    /// name may be one of them, so none is reported again.
    unknown_columns: bool,
}

/// Placeholders the request may use and file names may not: the secret,
/// the item's `{since}` (which changes every run) and the page's
/// `{cursor}` (whether the job's pagination gives it a value is checked
/// with the pagination: [`cursor_fields`]).
const REQUEST_ONLY: [&str; 4] = ["secret", "since", "since_epoch", "cursor"];

/// The page's cursor: `{cursor}`.
pub(super) const CURSOR: &str = "cursor";

impl<'a> Placeholders<'a> {
    /// A job's: its `fan_out_from` columns, then its `fan_out` keys.
    pub(super) fn of(columns: &'a [String], fan_out: &'a [(String, Vec<String>)]) -> Self {
        let keys = fan_out.iter().map(|(k, _)| k.as_str());
        Placeholders {
            fan_out: columns.iter().map(String::as_str).chain(keys).collect(),
            unknown_columns: false,
        }
    }

    /// Also any name: the job's `fan_out_from` failed to load (reported).
    pub(super) fn with_unknown_columns(mut self, unknown: bool) -> Self {
        self.unknown_columns = unknown;
        self
    }

    fn has(&self, name: &str, secret_ok: bool) -> bool {
        (self.unknown_columns && name != "secret")
            || self.fan_out.contains(&name)
            || name == "job"
            || name == "date"
            || (secret_ok && REQUEST_ONLY.contains(&name))
    }

    /// Whether `name` is a placeholder that has a value in the request
    /// for sure (not only because a `fan_out_from`'s columns are unknown).
    fn known(&self, name: &str) -> bool {
        self.fan_out.contains(&name)
            || name == "job"
            || name == "date"
            || REQUEST_ONLY.contains(&name)
    }

    /// Why `name` may not be used here.
    fn why_not(&self, name: &str, secret_ok: bool) -> String {
        if name == "secret" {
            return "{secret} may not appear here: it would leak the key into file names".into();
        }
        if REQUEST_ONLY.contains(&name) {
            return format!("{{{name}}} may only appear in the request");
        }
        let mut have: Vec<String> = self.fan_out.iter().map(|k| format!("{{{k}}}")).collect();
        have.extend(["{job}", "{date}"].map(String::from));
        if secret_ok {
            have.extend(REQUEST_ONLY.map(|n| format!("{{{n}}}")));
        }
        format!(
            "placeholder {{{name}}} has no value (available: {})",
            have.join(", ")
        )
    }
}

impl Loader<'_> {
    /// Parses the template written at `at` and checks its placeholders.
    pub(super) fn template(
        &mut self,
        src: &Source,
        at: &FieldPath,
        written: &str,
        places: &Placeholders<'_>,
        secret_ok: bool,
    ) -> Option<Template> {
        let t = match Template::parse(written) {
            Ok(t) => t,
            Err(e) => {
                self.error(src, at, format!("bad template {written:?}: {e}"));
                return None;
            }
        };
        for ph in t.placeholders() {
            if !places.has(ph, secret_ok) {
                self.error(src, at, places.why_not(ph, secret_ok));
            }
        }
        Some(t)
    }

    /// `[NAME.request]`: method, URL, query, headers and body; every value
    /// a template that may send `{secret}`.
    pub(super) fn request(
        &mut self,
        src: &Source,
        base: &FieldPath,
        req: &RawRequest,
        places: &Placeholders<'_>,
    ) -> Option<RequestTemplate> {
        let url = self.template(src, &base.join("url"), &req.url, places, true);
        let query = self.template_table(src, &base.join("query"), &req.query, places);
        let headers = self.template_table(src, &base.join("headers"), &req.headers, places);
        let body = req
            .body
            .as_ref()
            .and_then(|b| self.template(src, &base.join("body"), b, places, true));
        if let Some(url) = &url {
            self.check_url(src, &base.join("url"), url, &req.url);
        }
        let graphql = (req.graphql.as_ref())
            .and_then(|g| self.graphql(src, &base.join("graphql"), g, places));
        if req.graphql.is_some() && req.body.is_some() {
            let msg = "graphql and body cannot both be written: graphql builds the body (its query and variables, JSON-encoded); leave body out";
            self.error(src, &base.join("body"), msg);
        }
        // A GraphQL query is a POST (GitHub's, Shopify's).
        let default = if req.graphql.is_some() {
            Method::Post
        } else {
            d::METHOD
        };
        let method = req.method.as_deref().map(str::to_ascii_uppercase);
        let method = self.pick_or(src, &base.join("method"), method.as_deref(), default);
        if req.graphql.is_some() && method != Method::Post {
            let msg = format!(
                "graphql is sent with POST, not {}: leave method out or write \"POST\"",
                method.as_str()
            );
            self.error(src, &base.join("method"), msg);
        }
        for (k, v) in &req.headers {
            let at = base.join("headers").join(k.as_str());
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                let msg = format!("invalid header name {k:?}");
                self.error(src, &at, msg);
            }
            // The template's own text must make a sendable value (a CR or
            // LF in it never would); placeholder values are checked per
            // request, before anything is spent.
            let sample = Template::parse(v).map(|t| t.render(|_| Some("x")));
            if sample.is_ok_and(|s| reqwest::header::HeaderValue::from_str(&s).is_err()) {
                self.error(
                    src,
                    &at,
                    "invalid header value: control characters (CR, LF, NUL, ...) cannot be sent in a header",
                );
            }
        }
        let body_is_json = body.as_ref().is_some_and(|b| is_json_body(b, &req.headers));
        Some(RequestTemplate {
            method,
            url: url?,
            query,
            headers,
            body,
            body_is_json,
            graphql,
        })
    }

    /// `graphql = { query, variables }`: a query with no placeholders in
    /// it, and variables whose values are templates (`"{cursor}"` alone:
    /// the cursor, `null` on page 1).
    fn graphql(
        &mut self,
        src: &Source,
        base: &FieldPath,
        raw: &RawGraphql,
        places: &Placeholders<'_>,
    ) -> Option<Graphql> {
        let at = base.join("query");
        if raw.query.trim().is_empty() {
            self.error(src, &at, "an empty query");
        }
        // A value pasted into the query could change it (close a string,
        // add a mutation): the query is sent as written, values go in as
        // variables. Only names that have a value are taken for
        // placeholders: `{id}` may be a selection set.
        for name in query_placeholders(&raw.query).filter(|n| places.known(n)) {
            let msg = format!(
                "the query takes no placeholders: {{{name}}} would be sent as written; pass the value as a variable: variables = {{ {name} = \"{{{name}}}\" }} and ${name}: String in the query"
            );
            self.error(src, &at, msg);
        }
        let mut variables = Vec::new();
        let mut ok = true;
        for (name, value) in &raw.variables {
            let at = base.join("variables").join(name.as_str());
            if !is_graphql_name(name) {
                let msg = format!(
                    "bad variable name {name:?}: GraphQL names are letters, digits and '_', not starting with a digit"
                );
                self.error(src, &at, msg);
            }
            let var = if value == "{cursor}" {
                Variable::Cursor
            } else {
                match self.template(src, &at, value, places, true) {
                    Some(t) => Variable::Text(t),
                    None => {
                        ok = false;
                        continue;
                    }
                }
            };
            variables.push((name.clone(), var));
        }
        ok.then(|| Graphql {
            query: raw.query.clone(),
            variables,
        })
    }

    /// `query` or `headers`: name → template, in config order.
    fn template_table(
        &mut self,
        src: &Source,
        base: &FieldPath,
        raw: &indexmap::IndexMap<String, String>,
        places: &Placeholders<'_>,
    ) -> Vec<(String, Template)> {
        raw.iter()
            .filter_map(|(k, v)| {
                let t = self.template(src, &base.join(k.as_str()), v, places, true)?;
                Some((k.clone(), t))
            })
            .collect()
    }

    /// The URL, every placeholder filled with a sample, must be http(s).
    fn check_url(&mut self, src: &Source, at: &FieldPath, url: &Template, written: &str) {
        let sample = url.render(|_| Some("x"));
        match reqwest::Url::parse(&sample) {
            Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
            Ok(u) => {
                let msg = format!("scheme {:?} is not http or https", u.scheme());
                self.error(src, at, msg);
            }
            Err(e) => self.error(src, at, format!("invalid URL {written:?}: {e}")),
        }
    }
}

/// Whether a body is JSON, so its placeholders' values go in
/// JSON-string-escaped: a `Content-Type` that says JSON
/// (`application/json`, `application/vnd.api+json`, ...), or a body whose
/// text (placeholders left empty) starts with `{` or `[`.
fn is_json_body(body: &Template, headers: &indexmap::IndexMap<String, String>) -> bool {
    let typed = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("content-type") && v.to_ascii_lowercase().contains("json")
    });
    let text = body.render(|_| Some(""));
    typed || text.trim_start().starts_with(['{', '['])
}

/// The names of `{name}` and `{+name}` in a GraphQL query's text, as a
/// template would read them.
fn query_placeholders(query: &str) -> impl Iterator<Item = &str> {
    query.match_indices('{').filter_map(|(i, _)| {
        let rest = &query[i + 1..];
        let rest = rest.strip_prefix('+').unwrap_or(rest);
        let end = rest.find('}')?;
        let name = &rest[..end];
        let ok = !name.is_empty()
            && (name.chars()).all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        ok.then_some(name)
    })
}

/// GraphQL's `Name`: `[_A-Za-z][_0-9A-Za-z]*`.
fn is_graphql_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// The fields of `req` (under `base`) that use `{cursor}`, in order: the
/// job's pagination must give it a value.
pub(super) fn cursor_fields(base: &FieldPath, req: &RawRequest) -> Vec<FieldPath> {
    let uses = |text: &str| Template::parse(text).is_ok_and(|t| t.uses(CURSOR));
    let mut out = Vec::new();
    if uses(&req.url) {
        out.push(base.join("url"));
    }
    for (table, values) in [("query", &req.query), ("headers", &req.headers)] {
        let used = values.iter().filter(|(_, v)| uses(v));
        out.extend(used.map(|(k, _)| base.join(table).join(k.as_str())));
    }
    if req.body.as_deref().is_some_and(uses) {
        out.push(base.join("body"));
    }
    if let Some(g) = &req.graphql {
        let used = g.variables.iter().filter(|(_, v)| uses(v));
        let at = base.join("graphql").join("variables");
        out.extend(used.map(|(k, _)| at.join(k.as_str())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_in_a_query_are_read_as_a_template_reads_them() {
        let q = "query { a(x: \"{owner}\", y: \"{+path}\") { {id} { nodes } } }";
        assert_eq!(
            query_placeholders(q).collect::<Vec<_>>(),
            ["owner", "path", "id"]
        );
        assert_eq!(query_placeholders("{ a { b } }").count(), 0);
    }

    #[test]
    fn json_bodies_are_told_by_their_type_or_their_first_character() {
        let t = |s| Template::parse(s).expect("template");
        let none = indexmap::IndexMap::new();
        assert!(is_json_body(&t("  {{\"a\": \"{x}\"}}"), &none));
        assert!(is_json_body(&t("[1]"), &none));
        assert!(!is_json_body(&t("a={x}"), &none));
        // A placeholder first is not known to be JSON by its text.
        assert!(!is_json_body(&t("{x}"), &none));
        let typed: indexmap::IndexMap<String, String> = [(
            "content-type".to_owned(),
            "application/vnd.api+JSON".to_owned(),
        )]
        .into();
        assert!(is_json_body(&t("{x}"), &typed));
    }

    #[test]
    fn graphql_names() {
        assert!(is_graphql_name("after") && is_graphql_name("_a1"));
        assert!(!is_graphql_name("1a") && !is_graphql_name("a-b") && !is_graphql_name(""));
    }
}
