//! `{placeholder}` templates: request URLs, query values, headers, bodies and
//! sink paths. `{{` and `}}` stand for literal braces. `{+name}` is the
//! reserved expansion of RFC 6570: in a request URL its value keeps `/`, `?`,
//! `&` and the other reserved characters (see [`Expansion`]).

use std::borrow::Cow;
use std::fmt;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// RFC 3986 unreserved characters stay; everything else is encoded
/// (RFC 6570 simple expansion).
const SIMPLE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

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

/// A parsed template: literal text and placeholders, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    source: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(String, Expansion),
}

/// How a placeholder's value goes into a request URL (RFC 6570 section 3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expansion {
    /// `{name}`: every character but the unreserved ones is percent-encoded,
    /// so no value can change the URL's structure.
    Simple,
    /// `{+name}`: reserved characters (`/`, `?`, `#`, `&`, ...) and
    /// percent-encoded triplets are kept as written.
    Reserved,
}

/// Why a template does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `{` with no matching `}`.
    #[error("unclosed '{{' at byte {0}; write '{{{{' for a literal brace")]
    Unclosed(usize),
    /// `}` that closes nothing.
    #[error("unmatched '}}' at byte {0}; write '}}}}' for a literal brace")]
    Unmatched(usize),
    /// `{}` or `{a b}`.
    #[error("bad placeholder name {0:?}: use letters, digits, '_' and '-'")]
    BadName(String),
}

impl Template {
    /// Parses `source`.
    pub fn parse(source: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut lit = String::new();
        let mut chars = source.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|p| p.1) == Some('{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek().map(|p| p.1) == Some('}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let rest = &source[i + 1..];
                    let end = rest.find('}').ok_or(TemplateError::Unclosed(i))?;
                    let (name, expansion) = match rest[..end].strip_prefix('+') {
                        Some(name) => (name, Expansion::Reserved),
                        None => (&rest[..end], Expansion::Simple),
                    };
                    let ok = !name.is_empty()
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if !ok {
                        return Err(TemplateError::BadName(name.to_owned()));
                    }
                    if !lit.is_empty() {
                        parts.push(Part::Lit(std::mem::take(&mut lit)));
                    }
                    parts.push(Part::Var(name.to_owned(), expansion));
                    for _ in 0..=end {
                        chars.next();
                    }
                }
                '}' => return Err(TemplateError::Unmatched(i)),
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        Ok(Template {
            parts,
            source: source.to_owned(),
        })
    }

    /// The placeholders it uses, in order (with repeats).
    pub fn placeholders(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Var(v, _) => Some(v.as_str()),
            Part::Lit(_) => None,
        })
    }

    /// Whether it uses `name`.
    pub fn uses(&self, name: &str) -> bool {
        self.placeholders().any(|p| p == name)
    }

    /// Whether it has a `{+name}` placeholder.
    pub fn has_reserved(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Var(_, Expansion::Reserved)))
    }

    /// Renders with `lookup`; a placeholder it has no value for renders empty
    /// (config validation makes sure that cannot happen). Values go in as
    /// they are, `{+name}` or not.
    pub fn render<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
        self.render_with(lookup, |v, _| Cow::Borrowed(v))
    }

    /// Renders with `lookup`, each value passed through `escape` with the
    /// placeholder's [`Expansion`] (a request URL percent-encodes them).
    pub fn render_with<'a>(
        &self,
        lookup: impl Fn(&str) -> Option<&'a str>,
        escape: impl Fn(&'a str, Expansion) -> Cow<'a, str>,
    ) -> String {
        let mut out = String::with_capacity(self.source.len());
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v, e) => out.push_str(&escape(lookup(v).unwrap_or(""), *e)),
            }
        }
        out
    }

    /// The template as written (safe to log: placeholders are not expanded).
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn renders_placeholders_and_escapes() {
        let t = Template::parse("data/{job}/{region}/{{x}}.jsonl").unwrap();
        assert_eq!(t.placeholders().collect::<Vec<_>>(), ["job", "region"]);
        let out = t.render(|k| match k {
            "job" => Some("trending"),
            "region" => Some("US"),
            _ => None,
        });
        assert_eq!(out, "data/trending/US/{x}.jsonl");
    }

    #[test]
    fn reserved_placeholders_parse_and_say_so() {
        let t = Template::parse("https://h/{+path}/{id}").unwrap();
        assert_eq!(t.placeholders().collect::<Vec<_>>(), ["path", "id"]);
        assert!(t.has_reserved());
        let out = t.render_with(
            |k| Some(if k == "path" { "a/b" } else { "c/d" }),
            |v, e| match e {
                Expansion::Reserved => Cow::Borrowed(v),
                Expansion::Simple => Cow::Owned(v.replace('/', "%2F")),
            },
        );
        assert_eq!(out, "https://h/a/b/c%2Fd");
        assert!(!Template::parse("{a}").unwrap().has_reserved());
        assert!(matches!(
            Template::parse("{+}"),
            Err(TemplateError::BadName(_))
        ));
    }

    #[test]
    fn rejects_broken_templates() {
        assert_eq!(
            Template::parse("a{b").unwrap_err(),
            TemplateError::Unclosed(1)
        );
        assert_eq!(
            Template::parse("a}b").unwrap_err(),
            TemplateError::Unmatched(1)
        );
        assert!(matches!(
            Template::parse("{}"),
            Err(TemplateError::BadName(_))
        ));
        assert!(matches!(
            Template::parse("{a b}"),
            Err(TemplateError::BadName(_))
        ));
    }
}
