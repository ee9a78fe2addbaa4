//! Fields that take one of a few words (`kind = "jsonl"`,
//! `limiter_unavailable = "fail-open"`): one table per enum, one parser, one
//! error message that lists what is accepted. The loader positions the error
//! at the field ([`super::load`]); `--log-format` reuses the same parser.

use super::{
    LimiterUnavailable, LogFormat, Method, OnQuotaExhausted, ResetIs, SinkKind, UnsafeEviction,
    WindowMode,
};

/// An enum written in the config as one of a fixed set of words.
pub(crate) trait Choice: Copy + Sized + 'static {
    /// What the field is called in an error ("sink kind").
    const WHAT: &'static str;
    /// Every accepted word with its value, in the order errors list them.
    const CHOICES: &'static [(&'static str, Self)];

    /// The value `written` names, or an error listing the accepted words.
    fn parse(written: &str) -> Result<Self, String> {
        Self::CHOICES
            .iter()
            .find(|(word, _)| *word == written)
            .map(|&(_, v)| v)
            .ok_or_else(|| {
                format!(
                    "unknown {} {written:?}: use {}",
                    Self::WHAT,
                    one_of(Self::CHOICES.iter().map(|(w, _)| *w))
                )
            })
    }
}

/// `"a"`, `"a" or "b"`, `"a", "b" or "c"`.
fn one_of<'a>(words: impl Iterator<Item = &'a str>) -> String {
    let quoted: Vec<String> = words.map(|w| format!("{w:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.concat(),
    }
}

impl Choice for WindowMode {
    const WHAT: &'static str = "window mode";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("enforce", WindowMode::Enforce),
        ("shadow", WindowMode::Shadow),
    ];
}

impl Choice for LogFormat {
    const WHAT: &'static str = "log format";
    const CHOICES: &'static [(&'static str, Self)] =
        &[("text", LogFormat::Text), ("json", LogFormat::Json)];
}

impl Choice for LimiterUnavailable {
    const WHAT: &'static str = "policy";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("fail-closed", LimiterUnavailable::FailClosed),
        ("fail-open", LimiterUnavailable::FailOpen),
    ];
}

impl Choice for UnsafeEviction {
    const WHAT: &'static str = "unsafe_eviction";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("refuse", UnsafeEviction::Refuse),
        ("warn", UnsafeEviction::Warn),
    ];
}

impl Choice for ResetIs {
    const WHAT: &'static str = "reset_is";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("epoch-seconds", ResetIs::EpochSeconds),
        ("delta-seconds", ResetIs::DeltaSeconds),
    ];
}

impl Choice for OnQuotaExhausted {
    const WHAT: &'static str = "on_quota_exhausted";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("stop", OnQuotaExhausted::Stop),
        ("defer", OnQuotaExhausted::Defer),
    ];
}

/// Matched after upper-casing what was written: `method = "get"` is GET.
impl Choice for Method {
    const WHAT: &'static str = "method";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("GET", Method::Get),
        ("POST", Method::Post),
        ("PUT", Method::Put),
        ("PATCH", Method::Patch),
        ("DELETE", Method::Delete),
    ];
}

impl Choice for SinkKind {
    const WHAT: &'static str = "sink kind";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("jsonl", SinkKind::Jsonl),
        ("sqlite", SinkKind::Sqlite),
        ("postgres", SinkKind::Postgres),
    ];
}

/// `[job.pagination] style`, before its fields make it a
/// [`super::PageStyle`] (which carries data, so has no table of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageStyleName {
    /// `"cursor"`.
    Cursor,
    /// `"next_url"`.
    NextUrl,
    /// `"link"`.
    Link,
    /// `"page"`.
    Page,
}

impl Choice for PageStyleName {
    const WHAT: &'static str = "pagination style";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("cursor", PageStyleName::Cursor),
        ("next_url", PageStyleName::NextUrl),
        ("link", PageStyleName::Link),
        ("page", PageStyleName::Page),
    ];
}

/// A window's `kind`, before its other fields make it a
/// [`super::WindowKind`] (which carries data, so has no table of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowKindName {
    /// `"sliding"`.
    Sliding,
    /// `"fixed"`.
    Fixed,
    /// `"bucket"`.
    Bucket,
    /// `"concurrent"`.
    Concurrent,
}

impl Choice for WindowKindName {
    const WHAT: &'static str = "window kind";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("sliding", WindowKindName::Sliding),
        ("fixed", WindowKindName::Fixed),
        ("bucket", WindowKindName::Bucket),
        ("concurrent", WindowKindName::Concurrent),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_word_lists_every_accepted_one() {
        assert_eq!(SinkKind::parse("sqlite"), Ok(SinkKind::Sqlite));
        assert_eq!(
            SinkKind::parse("csv").unwrap_err(),
            r#"unknown sink kind "csv": use "jsonl", "sqlite" or "postgres""#
        );
        assert_eq!(
            Method::parse("GOT").unwrap_err(),
            r#"unknown method "GOT": use "GET", "POST", "PUT", "PATCH" or "DELETE""#
        );
    }

    #[test]
    fn every_table_names_each_value_once() {
        fn distinct<T: Choice + PartialEq + std::fmt::Debug>() {
            for (i, (w, v)) in T::CHOICES.iter().enumerate() {
                for (w2, v2) in &T::CHOICES[i + 1..] {
                    assert_ne!(w, w2);
                    assert_ne!(v, v2, "{w} and {w2}");
                }
            }
        }
        distinct::<LogFormat>();
        distinct::<LimiterUnavailable>();
        distinct::<ResetIs>();
        distinct::<OnQuotaExhausted>();
        distinct::<Method>();
        distinct::<SinkKind>();
        distinct::<WindowKindName>();
        distinct::<WindowMode>();
        distinct::<PageStyleName>();
    }
}
