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
        let (line, column) = span.map_or((1, 1), |s| self.line_col(s.start));
        ConfigError {
            file: self.path.clone(),
            line,
            column,
            field: path.to_string(),
            message: message.into(),
        }
    }

    /// Turns a serde/TOML error into a positioned one, naming the field whose
    /// key or value holds the error's span.
    pub fn from_toml(&self, err: &toml::de::Error) -> ConfigError {
        let span = err.span();
        let path = match (&span, DeTable::parse(&self.text)) {
            (Some(span), Ok(doc)) => FieldPath(path_at(doc.get_ref(), span.start)),
            _ => FieldPath::default(),
        };
        let (line, column) = span.map_or((1, 1), |s| self.line_col(s.start));
        ConfigError {
            file: self.path.clone(),
            line,
            column,
            field: path.to_string(),
            message: err.message().trim().to_owned(),
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
    for (key, value) in table.iter() {
        let ks = key.span();
        let vs = value.span();
        let inside = |r: &Range<usize>| r.start <= offset && offset < r.end.max(r.start + 1);
        if inside(&ks) || inside(&vs) {
            let mut path = vec![Seg::Key(key.get_ref().to_string())];
            if inside(&vs) {
                path.extend(path_in_value(value.get_ref(), offset));
            }
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
                if s.start <= offset && offset < s.end.max(s.start + 1) {
                    let mut p = vec![Seg::Index(i)];
                    p.extend(path_in_value(item.get_ref(), offset));
                    return p;
                }
            }
            Vec::new()
        }
        _ => Vec::new(),
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
    fn missing_field_points_at_its_table() {
        let s = src("[a]\nx = 1\n[creds.k]\nwindows = []\n");
        let e = s.error(&FieldPath::new(["creds", "k", "secret_env"]), "missing");
        assert_eq!(e.line, 3);
    }
}
