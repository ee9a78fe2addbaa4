//! Config errors that name the file, line, column and field, and the helpers
//! that find a field's position in the TOML source.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};

/// One segment of a field's path: `endpoints."youtube.search.list".windows[0].per`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A table key.
    Key(String),
    /// An array index.
    Index(usize),
}

impl From<&str> for Seg {
    fn from(s: &str) -> Self {
        Seg::Key(s.to_owned())
    }
}

impl From<&String> for Seg {
    fn from(s: &String) -> Self {
        Seg::Key(s.clone())
    }
}

impl From<usize> for Seg {
    fn from(i: usize) -> Self {
        Seg::Index(i)
    }
}

/// A field path, rendered the way TOML would spell it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldPath(pub Vec<Seg>);

impl FieldPath {
    /// Builds a path from segments.
    pub fn new<I, S>(segs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<Seg>,
    {
        FieldPath(segs.into_iter().map(Into::into).collect())
    }

    /// This path with one more segment.
    pub fn join(&self, seg: impl Into<Seg>) -> Self {
        let mut v = self.0.clone();
        v.push(seg.into());
        FieldPath(v)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for seg in &self.0 {
            match seg {
                Seg::Key(k) => {
                    if !first {
                        f.write_str(".")?;
                    }
                    let bare = !k.is_empty()
                        && k.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    if bare {
                        f.write_str(k)?;
                    } else {
                        write!(f, "{k:?}")?;
                    }
                }
                Seg::Index(i) => write!(f, "[{i}]")?,
            }
            first = false;
        }
        if first {
            f.write_str("(top level)")?;
        }
        Ok(())
    }
}

/// A configuration error: where it is and what is wrong. Exit code 78.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the error is in.
    pub file: PathBuf,
    /// 1-based line (0 when the error is about the file as a whole).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The field, as a TOML path.
    pub field: String,
    /// What is wrong, and where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(
                f,
                "{}: {}: {}",
                self.file.display(),
                self.field,
                self.message
            )
        } else {
            write!(
                f,
                "{}:{}:{}: {}: {}",
                self.file.display(),
                self.line,
                self.column,
                self.field,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// All the errors found in one load, reported together so an operator fixes
/// them in one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}

/// A parsed source file, kept to turn field paths and byte offsets into
/// line:column positions.
pub struct Source {
    path: PathBuf,
    text: String,
}

impl Source {
    /// Wraps a file's text.
    pub fn new(path: &Path, text: String) -> Self {
        Source {
            path: path.to_owned(),
            text,
        }
    }

    /// The file's text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let col = before.rfind('\n').map_or(before.chars().count(), |nl| {
            before[nl + 1..].chars().count()
        }) + 1;
        (line, col)
    }

    /// An error at `path`: positioned at the field when it is in the file, else
    /// at the closest enclosing table that is.
    pub fn error(&self, path: &FieldPath, message: impl Into<String>) -> ConfigError {
        let span = DeTable::parse(&self.text)
            .ok()
            .and_then(|doc| span_of(doc.get_ref(), &path.0));
        self.at(span.map(|s| s.start), path, message.into())
    }

    /// Turns a serde/TOML error into a positioned one, naming the field whose
    /// key or value holds the error's span.
    pub fn from_toml(&self, err: &toml::de::Error) -> ConfigError {
        let span = err.span();
        let path = match (&span, DeTable::parse(&self.text)) {
            (Some(span), Ok(doc)) => FieldPath(path_at(doc.get_ref(), span.start)),
            (Some(span), Err(_)) => FieldPath(path_by_text(&self.text, span.start)),
            _ => FieldPath::default(),
        };
        self.at(
            span.map(|s| s.start),
            &path,
            err.message().trim().to_owned(),
        )
    }

    /// An error at byte `offset` (the file's start when unknown).
    fn at(&self, offset: Option<usize>, path: &FieldPath, message: String) -> ConfigError {
        let (line, column) = offset.map_or((1, 1), |o| self.line_col(o));
        ConfigError {
            file: self.path.clone(),
            line,
            column,
            field: path.to_string(),
            message,
        }
    }

    /// An error about the whole file (unreadable, say).
    pub fn file_error(path: &Path, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: path.to_owned(),
            line: 0,
            column: 0,
            field: "(file)".into(),
            message: message.into(),
        }
    }
}

/// Span of the value at `path` (or of the nearest ancestor present).
fn span_of(table: &DeTable<'_>, path: &[Seg]) -> Option<Range<usize>> {
    let (first, rest) = path.split_first()?;
    let Seg::Key(k) = first else { return None };
    let (key, value) = table.iter().find(|(key, _)| key.get_ref().as_ref() == k)?;
    Some(span_in_value(value.get_ref(), rest).unwrap_or_else(|| {
        if rest.is_empty() {
            value.span()
        } else {
            key.span()
        }
    }))
}

fn span_in_value(value: &DeValue<'_>, path: &[Seg]) -> Option<Range<usize>> {
    let (first, rest) = path.split_first()?;
    match (value, first) {
        (DeValue::Table(t), Seg::Key(_)) => span_of(t, path),
        (DeValue::Array(a), Seg::Index(i)) => {
            let item = a.get(*i)?;
            Some(span_in_value(item.get_ref(), rest).unwrap_or_else(|| item.span()))
        }
        _ => None,
    }
}

/// The deepest field whose key or value contains `offset`.
fn path_at(table: &DeTable<'_>, offset: usize) -> Vec<Seg> {
    let inside = |r: &Range<usize>| r.start <= offset && offset < r.end.max(r.start + 1);
    for (key, value) in table.iter() {
        let ks = key.span();
        let vs = value.span();
        if inside(&ks) || inside(&vs) {
            let mut path = vec![Seg::Key(key.get_ref().to_string())];
            if inside(&vs) {
                path.extend(path_in_value(value.get_ref(), offset));
            }
            return path;
        }
    }
    // A table opened by a `[header]` (or made implicit by a dotted one) does
    // not span its body, so the field may be further down any table.
    for (key, value) in table.iter() {
        let below = path_in_value(value.get_ref(), offset);
        if !below.is_empty() {
            let mut path = vec![Seg::Key(key.get_ref().to_string())];
            path.extend(below);
            return path;
        }
    }
    Vec::new()
}

fn path_in_value(value: &DeValue<'_>, offset: usize) -> Vec<Seg> {
    match value {
        DeValue::Table(t) => path_at(t, offset),
        DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                let s = item.span();
                let below = path_in_value(item.get_ref(), offset);
                if (s.start <= offset && offset < s.end.max(s.start + 1)) || !below.is_empty() {
                    let mut p = vec![Seg::Index(i)];
                    p.extend(below);
                    return p;
                }
            }
            Vec::new()
        }
        _ => Vec::new(),
    }
}

/// For a file that does not parse (so has no tree to search): the field read
/// from the text, the last `[table]` header above `offset` and the key its
/// line assigns, as far as they read as keys.
fn path_by_text(text: &str, offset: usize) -> Vec<Seg> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let mut path = Vec::new();
    for line in text[..start].lines().rev() {
        let line = line.trim();
        if line.starts_with('[') {
            let header = line.trim_start_matches('[');
            if let Some(keys) = header.find(']').and_then(|e| dotted_key(&header[..e])) {
                path = keys;
            }
            break;
        }
    }
    if let Some(keys) = text[start..end]
        .split_once('=')
        .and_then(|(key, _)| dotted_key(key))
    {
        path.extend(keys);
    }
    path
}

/// `a."b.c".d` as segments; `None` when it is not a TOML key.
fn dotted_key(s: &str) -> Option<Vec<Seg>> {
    let mut segs = Vec::new();
    let mut rest = s.trim();
    loop {
        let (seg, tail) = match rest.chars().next()? {
            q @ ('"' | '\'') => {
                let end = rest[1..].find(q)? + 1;
                (&rest[1..end], &rest[end + 1..])
            }
            _ => {
                let end = rest.find(['.', ' ', '\t']).unwrap_or(rest.len());
                let bare = &rest[..end];
                let ok = !bare.is_empty()
                    && bare
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !ok {
                    return None;
                }
                (bare, &rest[end..])
            }
        };
        segs.push(Seg::Key(seg.to_owned()));
        rest = tail.trim_start();
        if rest.is_empty() {
            return Some(segs);
        }
        rest = rest.strip_prefix('.')?.trim_start();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(text: &str) -> Source {
        Source::new(Path::new("t.toml"), text.to_owned())
    }

    #[test]
    fn path_renders_like_toml() {
        let p = FieldPath::new(["endpoints", "youtube.search.list", "windows"]).join(0);
        assert_eq!(
            p.join("per").to_string(),
            r#"endpoints."youtube.search.list".windows[0].per"#
        );
    }

    #[test]
    fn error_points_at_the_field() {
        let s =
            src("[a]\nx = 1\n\n[b.\"c.d\"]\ncost = 5\nwindows = [{ units = 1, per = \"1s\" }]\n");
        let e = s.error(&FieldPath::new(["b", "c.d", "cost"]), "too big");
        assert_eq!((e.line, e.column), (5, 8));
        let e = s.error(
            &FieldPath::new(["b", "c.d", "windows"]).join(0).join("per"),
            "bad",
        );
        assert_eq!(e.line, 6);
        assert_eq!(e.field, r#"b."c.d".windows[0].per"#);
    }

    #[test]
    fn unknown_key_under_a_table_header_is_named() {
        // Regression: the field used to read "(top level)", because a table
        // opened by a header does not span the keys below it.
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Ep {
            cost: u64,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Top {
            endpoints: std::collections::BTreeMap<String, Ep>,
        }
        let text = "[endpoints.\"a.b\"]\ncost = 1\ncosts = 2\n";
        let err = toml::from_str::<Top>(text).unwrap_err();
        let e = src(text).from_toml(&err);
        assert_eq!((e.line, e.field.as_str()), (3, r#"endpoints."a.b".costs"#));
    }

    #[test]
    fn syntax_error_names_the_field_from_the_text() {
        let text = "x = 1\n[endpoints.\"a.b\"]\ncredential = \"k\"\ncost = 100 100\n";
        let err = toml::from_str::<toml::Table>(text).unwrap_err();
        let e = src(text).from_toml(&err);
        assert_eq!((e.line, e.field.as_str()), (4, r#"endpoints."a.b".cost"#));
        assert_eq!(
            dotted_key(" a . 'b.c'.d "),
            Some(vec![Seg::from("a"), Seg::from("b.c"), Seg::from("d")])
        );
        assert_eq!(dotted_key("{ units"), None);
    }

    #[test]
    fn missing_field_points_at_its_table() {
        let s = src("[a]\nx = 1\n[creds.k]\nwindows = []\n");
        let e = s.error(&FieldPath::new(["creds", "k", "secret_env"]), "missing");
        assert_eq!(e.line, 3);
    }
}
