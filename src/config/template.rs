//! `{placeholder}` templates: request URLs, query values, headers, bodies and
//! sink paths. `{{` and `}}` stand for literal braces.

use std::fmt;

/// A parsed template: literal text and placeholders, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
    source: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Lit(String),
    Var(String),
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
                    let name = &rest[..end];
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
                    parts.push(Part::Var(name.to_owned()));
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
            Part::Var(v) => Some(v.as_str()),
            Part::Lit(_) => None,
        })
    }

    /// Whether it uses `name`.
    pub fn uses(&self, name: &str) -> bool {
        self.placeholders().any(|p| p == name)
    }

    /// Renders with `lookup`; a placeholder it has no value for renders empty
    /// (config validation makes sure that cannot happen).
    pub fn render<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
        let mut out = String::with_capacity(self.source.len());
        for p in &self.parts {
            match p {
                Part::Lit(s) => out.push_str(s),
                Part::Var(v) => out.push_str(lookup(v).unwrap_or("")),
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
