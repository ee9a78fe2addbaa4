//! The secret scrubber: every known secret, in each spelling an upstream
//! may echo it, removed from the text the upstream sends back before it is
//! logged, stored or put in an error; and the stored form of a next-page
//! cursor or URL, with the secret as the placeholder that renders it back.

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;

use crate::config::{Expansion, Secret, expand};

/// What a scrubbed secret is replaced with.
pub(crate) const REDACTED: &str = "[redacted]";

/// Removes every known secret from text the upstream sent back: each
/// credential's secret as it is, percent-encoded (upper- and lower-case
/// hex, `+` for spaces as forms write it) and JSON-escaped, since an
/// upstream echoes the URL or the request in any of these forms.
///
/// It also writes a next-page cursor or URL in stored form
/// ([`Scrubber::templatize`]): each spelling of a secret as the placeholder
/// that renders it back.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrubber {
    /// One automaton for every form of every secret; `None` without secrets.
    matcher: Option<AhoCorasick>,
    /// Per pattern of `matcher`: the placeholder that renders it back in a
    /// URL (`{secret}` percent-encodes, `{+secret}` keeps it as it is).
    placeholders: Vec<&'static str>,
}

/// A secret spelled percent-encoded: rendered back by simple expansion.
const ENCODED: &str = "{secret}";
/// A secret spelled as it is: rendered back by reserved expansion (which
/// keeps the characters a URL may hold as they are).
const VERBATIM: &str = "{+secret}";

impl Scrubber {
    /// A scrubber for `secrets`.
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = &'a Secret>) -> Self {
        let mut forms: Vec<(String, &'static str)> = Vec::new();
        for s in secrets {
            let s = s.expose();
            if s.is_empty() {
                continue;
            }
            let encoded = expand(s, Expansion::Simple).into_owned();
            let json = serde_json::to_string(s).unwrap_or_default();
            forms.extend([
                (s.to_owned(), VERBATIM),
                (encoded.replace("%20", "+"), ENCODED),
                (lower_hex(&encoded), ENCODED),
                // The quotes around it, not the escaped ones inside.
                (
                    json.get(1..json.len().saturating_sub(1))
                        .unwrap_or_default()
                        .to_owned(),
                    VERBATIM,
                ),
                (encoded, ENCODED),
            ]);
        }
        forms.retain(|(f, _)| !f.is_empty());
        // Where two spellings are the same text, the one listed first wins
        // (stable sort): as it is renders it back exactly.
        forms.sort_by(|a, b| a.0.cmp(&b.0));
        forms.dedup_by(|b, a| a.0 == b.0);
        let matcher = if forms.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(forms.iter().map(|(f, _)| f))
                .ok()
        };
        Scrubber {
            matcher,
            placeholders: forms.into_iter().map(|(_, p)| p).collect(),
        }
    }

    /// `text` (a cursor or next URL from the upstream) in stored form:
    /// braces doubled, so it holds no placeholder of its own, and each
    /// spelling of a secret written as the placeholder that renders it back
    /// ([`Stored::render`]).
    pub(crate) fn templatize(&self, text: &str) -> String {
        let escape = |t: &str| t.replace('{', "{{").replace('}', "}}");
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        if let Some(m) = &self.matcher {
            for found in m.find_iter(text) {
                out.push_str(&escape(&text[last..found.start()]));
                out.push_str(self.placeholders[found.pattern().as_usize()]);
                last = found.end();
            }
        }
        out.push_str(&escape(&text[last..]));
        out
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub(crate) fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match &self.matcher {
            Some(m) if m.is_match(text) => {
                let with: Vec<&str> = vec![REDACTED; m.patterns_len()];
                Cow::Owned(m.replace_all(text, &with))
            }
            _ => Cow::Borrowed(text),
        }
    }

    /// Scrubs every string of a JSON value (records, cursors) in place.
    pub(crate) fn scrub_json(&self, value: &mut Value) {
        if self.matcher.is_none() {
            return;
        }
        match value {
            Value::String(s) => {
                if let Cow::Owned(clean) = self.scrub(s) {
                    *s = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.scrub_json(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.scrub_json(v)),
            _ => {}
        }
    }
}

/// `%2F` → `%2f`: the other spelling of the same encoding.
fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut hex_left = 0;
    for c in encoded.chars() {
        if c == '%' {
            hex_left = 2;
            out.push(c);
        } else if hex_left > 0 {
            hex_left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The start of an upstream body, one line, for a log or an error (not yet
/// scrubbed).
pub(crate) fn snippet(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(&body[..body.len().min(200)]);
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paging::Stored;

    /// A next URL is kept with each spelling of the secret as the
    /// placeholder that renders it back, and nothing else the upstream
    /// wrote can become a placeholder.
    #[test]
    fn next_urls_are_kept_without_the_secret_and_render_back() {
        let secret = Secret::new("k/y+z ä");
        let s = Scrubber::new([&secret]);
        let encoded = "k%2Fy%2Bz%20%C3%A4";
        let url = format!(
            "https://graph.example/v1/me/media?access_token={encoded}&after=c2&x={{region}}"
        );
        let stored = s.templatize(&url);
        assert_eq!(
            stored,
            "https://graph.example/v1/me/media?access_token={secret}&after=c2&x={{region}}"
        );
        let back = Stored::new(stored).render(&secret, true).unwrap();
        assert_eq!(back, url, "rendered back as it was sent");
        // The lower-case and form spellings render back as equivalents.
        let lower = s.templatize("?t=k%2fy%2bz%20%c3%a4&u=k%2Fy%2Bz+%C3%A4");
        assert_eq!(lower, "?t={secret}&u={secret}");
        // A token of URL-safe characters only: kept as it is.
        let meta = Secret::new("EAAGm0PX4ZCps");
        let s = Scrubber::new([&meta]);
        let stored = s.templatize("https://g/x?access_token=EAAGm0PX4ZCps&limit=2");
        assert_eq!(stored, "https://g/x?access_token={+secret}&limit=2");
        let back = Stored::new(stored).render(&meta, true).unwrap();
        assert_eq!(back, "https://g/x?access_token=EAAGm0PX4ZCps&limit=2");
        // Without secrets only the braces change.
        assert_eq!(Scrubber::default().templatize("a{b}"), "a{{b}}");
    }

    #[test]
    fn scrubber_finds_every_spelling() {
        let s = Scrubber::new([&Secret::new("k/y+z ä\"")]);
        for text in [
            "k/y+z ä\"",
            "k%2Fy%2Bz%20%C3%A4%22",
            "k%2fy%2bz%20%c3%a4%22",
            "k%2Fy%2Bz+%C3%A4%22",
            "k/y+z ä\\\"",
        ] {
            let line = format!("GET /x?key={text}&a=1");
            assert_eq!(
                s.scrub(&line),
                format!("GET /x?key={REDACTED}&a=1"),
                "{text}"
            );
        }
        let mut v =
            serde_json::json!({"a": ["x k/y+z ä\" y", 1], "b": {"c": "k%2Fy%2Bz%20%C3%A4%22"}});
        s.scrub_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": [format!("x {REDACTED} y"), 1], "b": {"c": REDACTED}})
        );
        assert_eq!(Scrubber::default().scrub("anything"), "anything");
    }
}
