//! The secret scrubber: every known secret, in each spelling an upstream
//! may echo it, removed from the text the upstream sends back before it is
//! logged, stored or put in an error; and the stored form of a next-page
//! cursor or URL, with the secret as the placeholder that renders it back.

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, MatchKind};
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::Value;

use crate::config::{Expansion, Secret, expand};

#[cfg(test)]
mod property;
mod views;

use views::View;

/// What a scrubbed secret is replaced with.
pub(crate) const REDACTED: &str = "[redacted]";

/// Removes every known secret from text the upstream sent back, in every
/// spelling an upstream may echo it in: as it is, percent-encoded (either
/// case of hex, mixed too; `+` for spaces as forms write it; encoded twice),
/// JSON-escaped (`\"`, `\/` as PHP writes it, `\uXXXX` for any character),
/// and any mix of these within one occurrence.
///
/// Matching runs on the text and on its decoded views ([`views`]), each
/// byte of a view mapped back to the text, so what is removed is exactly
/// what spelled the secret. Text cut short before it reached us (a body
/// read up to a limit) may end inside a secret: [`Scrubber::scrub_cut`]
/// also removes a tail that starts one. Scrubbing always comes before any
/// truncation of our own (a snippet, a log field).
///
/// It also writes a next-page cursor or URL in stored form
/// ([`Scrubber::templatize`]): each spelling of a secret as the placeholder
/// that renders it back.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrubber {
    /// One automaton for every form of every secret; `None` without secrets.
    matcher: Option<AhoCorasick>,
    /// Per pattern of `matcher`: its text, and the placeholder that renders
    /// it back in a URL (`{secret}` percent-encodes, `{+secret}` keeps it as
    /// it is).
    forms: Vec<(String, &'static str)>,
}

/// A secret spelled percent-encoded: rendered back by simple expansion.
const ENCODED: &str = "{secret}";
/// A secret spelled as it is: rendered back by reserved expansion (which
/// keeps the characters a URL may hold as they are).
const VERBATIM: &str = "{+secret}";

/// The shortest start of a secret that [`Scrubber::scrub_cut`] removes
/// from the end of a cut text: shorter ones say next to nothing, and
/// ordinary text ends with them by chance.
const MIN_PARTIAL: usize = 4;

/// Where a spelling of a secret is in a text, and what stands for it in
/// stored form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hit {
    start: usize,
    end: usize,
    placeholder: &'static str,
}

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
                // The form spelling once its %XX are decoded: the spaces
                // stay `+`.
                (s.replace(' ', "+"), ENCODED),
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
        Scrubber { matcher, forms }
    }

    /// Where each secret is in `text`, in order, overlaps merged. `cut`:
    /// `text` is the start of a longer text, so a tail that starts a
    /// secret counts too.
    fn hits(&self, text: &str, cut: bool) -> Vec<Hit> {
        let Some(m) = &self.matcher else {
            return Vec::new();
        };
        let raw = View::raw(text);
        let mut hits: Vec<Hit> = m
            .find_iter(text)
            .map(|f| Hit {
                start: f.start(),
                end: f.end(),
                placeholder: self.forms[f.pattern().as_usize()].1,
            })
            .collect();
        let mut views = Vec::new();
        if raw.has(b'\\') {
            let j = raw.json_unescaped(cut);
            if j.has(b'%') {
                views.push(j.percent_decoded(cut));
            }
            views.push(j);
        }
        if raw.has(b'%') {
            let p = raw.percent_decoded(cut);
            if p.has(b'\\') {
                views.push(p.json_unescaped(cut));
            }
            views.push(p);
        }
        for v in &views {
            hits.extend(m.find_iter(v.bytes.as_ref()).map(|f| Hit {
                start: v.start(f.start()),
                end: v.end(f.end() - 1),
                placeholder: ENCODED,
            }));
        }
        if cut {
            views.push(raw);
            hits.extend(views.iter().filter_map(|v| self.tail(v, text.len())));
        }
        merge(text, hits)
    }

    /// The tail of `v` that starts a spelling of a secret, as a hit to the
    /// end of the text (`len`): the text was cut inside it.
    fn tail(&self, v: &View<'_>, len: usize) -> Option<Hit> {
        let bytes = v.bytes.as_ref();
        let longest = self.forms.iter().map(|(f, _)| f.len()).max()?;
        (MIN_PARTIAL..=bytes.len().min(longest))
            .rev()
            .find(|&k| {
                let tail = &bytes[bytes.len() - k..];
                self.forms
                    .iter()
                    .any(|(f, _)| f.as_bytes().starts_with(tail))
            })
            .map(|k| Hit {
                start: v.start(bytes.len() - k),
                end: len,
                placeholder: ENCODED,
            })
    }

    /// `text` (a cursor or next URL from the upstream) in stored form:
    /// braces doubled, so it holds no placeholder of its own, and each
    /// spelling of a secret written as the placeholder that renders it back
    /// ([`Stored::render`](crate::fetch::paging::Stored::render)).
    pub(crate) fn templatize(&self, text: &str) -> String {
        let escape = |t: &str| t.replace('{', "{{").replace('}', "}}");
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for h in self.hits(text, false) {
            out.push_str(&escape(&text[last..h.start]));
            out.push_str(h.placeholder);
            last = h.end;
        }
        out.push_str(&escape(&text[last..]));
        out
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub(crate) fn scrub<'t>(&self, text: &'t str) -> Cow<'t, str> {
        redact(text, self.hits(text, false))
    }

    /// `text`, the start of a longer text cut at a limit (a body read up
    /// to its limit), with every secret replaced by [`REDACTED`], and a
    /// tail that starts one too.
    pub(crate) fn scrub_cut<'t>(&self, text: &'t str) -> Cow<'t, str> {
        redact(text, self.hits(text, true))
    }

    /// Scrubs every string of a JSON value (records, cursors) in place,
    /// the keys of its objects as well as their values, and every number:
    /// a number keeps its digits as sent, however many (issue 39), so a
    /// secret of digits can be one; it becomes the string it is scrubbed
    /// to.
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
            Value::Number(n) => {
                if let Cow::Owned(clean) = self.scrub(n.as_str()) {
                    *value = Value::String(clean);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.scrub_json(v)),
            Value::Object(map) => {
                map.values_mut().for_each(|v| self.scrub_json(v));
                if map.keys().any(|k| matches!(self.scrub(k), Cow::Owned(_))) {
                    // Keys cannot change in place: the object is rebuilt,
                    // in its order.
                    *map = std::mem::take(map)
                        .into_iter()
                        .map(|(k, v)| (self.scrub(&k).into_owned(), v))
                        .collect();
                }
            }
            _ => {}
        }
    }

    /// `headers` with every value that spells a secret scrubbed; borrowed
    /// when none does (the usual case). What reads the copy (the
    /// accounting adapters, which log unreadable values) never sees one.
    pub(crate) fn headers<'h>(&self, headers: &'h HeaderMap) -> Cow<'h, HeaderMap> {
        if self.matcher.is_none() {
            return Cow::Borrowed(headers);
        }
        let scrubbed = |v: &HeaderValue| {
            let text = String::from_utf8_lossy(v.as_bytes());
            match self.scrub(&text) {
                Cow::Owned(clean) => HeaderValue::from_bytes(clean.as_bytes()).ok(),
                Cow::Borrowed(_) => None,
            }
        };
        if headers.values().all(|v| scrubbed(v).is_none()) {
            return Cow::Borrowed(headers);
        }
        let mut out = HeaderMap::with_capacity(headers.len());
        for (name, v) in headers {
            let v = scrubbed(v).unwrap_or_else(|| v.clone());
            out.append(name.clone(), v);
        }
        Cow::Owned(out)
    }

    /// The start of an upstream body, one line of at most [`SNIPPET`]
    /// bytes, for a log or an error: scrubbed whole first, then cut.
    /// `cut`: `body` is itself the start of a longer body (read up to a
    /// limit).
    pub(crate) fn snippet(&self, body: &[u8], cut: bool) -> String {
        // Enough to fill the snippet and to see any secret across its end.
        let cut = cut || body.len() > SNIPPET_SCAN;
        let mut body = &body[..body.len().min(SNIPPET_SCAN)];
        if cut && let Err(e) = std::str::from_utf8(body) {
            // A character cut short at the end is not the start of one.
            if e.error_len().is_none() {
                body = &body[..e.valid_up_to()];
            }
        }
        let text = String::from_utf8_lossy(body);
        let scrub = |t: &str| {
            if cut {
                self.scrub_cut(t).into_owned()
            } else {
                self.scrub(t).into_owned()
            }
        };
        // Scrubbed before the whitespace is folded and after: a secret
        // with a double space, or one that folding spells.
        let folded = scrub(&text)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let mut clean = scrub(&folded);
        if clean.len() > SNIPPET {
            let mut at = SNIPPET;
            while !clean.is_char_boundary(at) {
                at -= 1;
            }
            clean.truncate(at);
        }
        clean
    }
}

/// The longest snippet of an upstream body in a log or error, bytes.
pub(crate) const SNIPPET: usize = 200;

/// How much of a body [`Scrubber::snippet`] reads: the snippet and room for
/// any secret across its end, with a margin for folded whitespace.
const SNIPPET_SCAN: usize = 64 * 1024;

/// Hits sorted and merged where they overlap, each widened to whole
/// characters of `text`. Where hits from several spellings cover one
/// occurrence, the widest wins; a merge of two different ones is written
/// percent-encoded.
fn merge(text: &str, mut hits: Vec<Hit>) -> Vec<Hit> {
    hits.sort_by_key(|h| (h.start, std::cmp::Reverse(h.end)));
    let mut out: Vec<Hit> = Vec::with_capacity(hits.len());
    for mut h in hits {
        while !text.is_char_boundary(h.start) {
            h.start -= 1;
        }
        while !text.is_char_boundary(h.end) {
            h.end += 1;
        }
        match out.last_mut() {
            Some(last) if h.start < last.end => {
                if h.end > last.end {
                    last.end = h.end;
                    last.placeholder = ENCODED;
                }
            }
            _ => out.push(h),
        }
    }
    out
}

/// `text` with each hit replaced by [`REDACTED`].
fn redact(text: &str, hits: Vec<Hit>) -> Cow<'_, str> {
    if hits.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for h in hits {
        out.push_str(&text[last..h.start]);
        out.push_str(REDACTED);
        last = h.end;
    }
    out.push_str(&text[last..]);
    Cow::Owned(out)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::paging::Stored;

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

    /// The reproduction's secret.
    const H: &str = "SuperSecretKeyABCDEFGHIJ0123456789xyz";

    /// No 12 characters in a row of `secret` are in `out`, in any of its
    /// spellings.
    fn assert_clean(secret: &str, out: &str, what: &str) {
        if let Some(w) = super::property::survivor(secret, out) {
            panic!("{what}: {w:?} of the secret survives in {out:?}");
        }
    }

    /// Issue 22, item 1 (a): the error snippet was cut to 200 bytes before
    /// it was scrubbed, so a secret across byte 200 leaked all but one
    /// character. Scrubbed whole, then cut.
    #[test]
    fn issue_22_1a_a_secret_across_the_snippet_cut_is_scrubbed() {
        let s = Scrubber::new([&Secret::new(H)]);
        let body = format!("{{\"error\":\"{} key={H} end\"}}", "A".repeat(149));
        let snip = s.snippet(body.as_bytes(), false);
        assert!(snip.len() <= SNIPPET, "{snip}");
        assert!(snip.ends_with(" key=[redacted] end\"}"), "{snip}");
        assert_clean(H, &snip, "snippet");
        // A body read up to a limit inside the secret: its start goes too.
        for cut in 1..H.len() {
            let part = format!("x key={}", &H[..cut]);
            let snip = s.snippet(part.as_bytes(), true);
            assert_clean(H, &snip, "cut snippet");
            if cut >= MIN_PARTIAL {
                assert_eq!(snip, "x key=[redacted]");
            }
        }
    }

    /// Issue 22, item 1 (b): an unreadable `Retry-After: soon <secret>` was
    /// logged raw. Headers are scrubbed before anything reads them.
    #[test]
    fn issue_22_1b_header_values_are_scrubbed() {
        let s = Scrubber::new([&Secret::new(H)]);
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_str(&format!("soon {H}")).unwrap(),
        );
        h.insert("x-ok", HeaderValue::from_static("7"));
        let clean = s.headers(&h);
        assert!(matches!(clean, Cow::Owned(_)));
        assert_eq!(clean["retry-after"], "soon [redacted]");
        assert_eq!(clean["x-ok"], "7");
        h.remove("retry-after");
        assert!(matches!(s.headers(&h), Cow::Borrowed(_)));
    }

    /// Issue 22, item 1 (c): object keys were not scrubbed, and went to the
    /// sink with the secret.
    #[test]
    fn issue_22_1c_json_keys_are_scrubbed() {
        let s = Scrubber::new([&Secret::new(H)]);
        let mut v: Value = serde_json::from_str(&format!(
            r#"{{"items":[{{"{H}":1,"y":{{"inner {H} key":"v"}}}}]}}"#
        ))
        .unwrap();
        s.scrub_json(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"items": [{"[redacted]": 1, "y": {"inner [redacted] key": "v"}}]})
        );
    }

    /// Issue 39: a number keeps every digit, so one can spell a secret
    /// of digits; it is scrubbed like a string.
    #[test]
    fn issue_39_a_number_that_spells_a_secret_is_scrubbed() {
        let s = Scrubber::new([&Secret::new("918273645546372819")]);
        let mut v: Value =
            serde_json::from_str(r#"{"a":9182736455463728190001,"b":12.30,"c":7}"#).unwrap();
        s.scrub_json(&mut v);
        assert_eq!(v.to_string(), r#"{"a":"[redacted]0001","b":12.30,"c":7}"#);
    }

    /// Issue 22, item 1 (d): legal JSON escapes of the secret (`\/` as PHP
    /// writes it, `\u0074`) and percent-encoding in mixed case were not
    /// matched.
    #[test]
    fn issue_22_1d_json_escapes_and_mixed_case_are_matched() {
        let secret = "tok/DEF+ghi=jkl9876";
        let s = Scrubber::new([&Secret::new(secret)]);
        for spelled in [
            r"tok\/DEF+ghi=jkl9876",
            r"\u0074ok/DEF+ghi=jkl9876",
            r"\u0074\u006F\u006b\/DEF\u002bghi=jkl9876",
            "tok%2fDEF%2Bghi%3Djkl9876",
            "%74%6F%6B%2F%44EF%2bghi=jkl9876",
            r"tok\u00252FDEF+ghi=jkl9876",
            "tok%5C%2FDEF+ghi=jkl9876",
            "tok%252FDEF%252Bghi%253Djkl9876",
        ] {
            let text = format!("{{\"error\":\"bad key {spelled}\"}}");
            let out = s.scrub(&text);
            assert_eq!(out, "{\"error\":\"bad key [redacted]\"}", "{spelled}");
            assert_clean(secret, &s.snippet(text.as_bytes(), false), spelled);
            assert!(!s.templatize(&text).contains("DEF"), "{spelled}");
        }
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
