//! A body's bytes as the JSON text they were sent as (issue 39): a byte
//! order mark skipped, the `charset` its `Content-Type` names decoded, and
//! what cannot be read as sent made U+FFFD — a sequence invalid in the
//! charset (a Latin-1 `é` in a UTF-8 body), and a lone surrogate escape
//! (`"a\ud800b"`: text cut in the middle of an emoji by a JavaScript or
//! Java server; RFC 8259 §8.2 allows it, no Rust string can hold it). Each
//! such place is kept ([`Fix`]), so the records it altered can be counted.
//!
//! The usual body (UTF-8, no BOM, no surrogate escape) is only checked and
//! borrowed; the decoder then reads it without checking each string again.

use std::borrow::Cow;

use encoding_rs::{DecoderResult, Encoding, UTF_8};

/// Why a place in the text is not what was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Bytes that are not valid in the body's charset: U+FFFD.
    InvalidBytes,
    /// A `\uD800`–`\uDFFF` escape that is not half of a pair: `\uFFFD`.
    LoneSurrogate,
}

/// One place U+FFFD stands for what was sent: its byte offset in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fix {
    pub(crate) at: usize,
    pub(crate) reason: Reason,
}

/// A body as JSON text, and where it differs from what was sent (in
/// order of `at`).
#[derive(Debug)]
pub(crate) struct Text<'b> {
    pub(crate) text: Cow<'b, str>,
    pub(crate) fixes: Vec<Fix>,
}

/// `body` as text: a leading BOM (UTF-8, UTF-16) says its encoding and is
/// skipped; else `charset` (a `Content-Type`'s parameter) does, UTF-8
/// when it names none or none known (JSON's own, RFC 8259 §8.1).
pub(crate) fn text<'b>(body: &'b [u8], charset: Option<&str>) -> Text<'b> {
    let (encoding, bom) = Encoding::for_bom(body).unwrap_or_else(|| {
        let named = charset.and_then(|c| Encoding::for_label(c.trim().as_bytes()));
        (named.unwrap_or(UTF_8), 0)
    });
    let bytes = &body[bom..];
    let mut fixes = Vec::new();
    let as_is = if encoding == UTF_8 {
        std::str::from_utf8(bytes).ok()
    } else if encoding.is_ascii_compatible() && bytes.is_ascii() {
        // ASCII reads the same in every ASCII-compatible charset.
        std::str::from_utf8(bytes).ok()
    } else {
        None
    };
    let mut text = match as_is {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(transcode(bytes, encoding, &mut fixes)),
    };
    let lone = lone_surrogates(&text);
    if !lone.is_empty() {
        let owned = text.to_mut();
        for &at in &lone {
            // Six ASCII bytes for six: the text stays UTF-8, offsets stay.
            owned.replace_range(at..at + 6, "\\uFFFD");
        }
        fixes.extend(lone.into_iter().map(|at| Fix {
            at,
            reason: Reason::LoneSurrogate,
        }));
        fixes.sort_by_key(|f| f.at);
    }
    Text { text, fixes }
}

/// The charset a `Content-Type` names: `application/json; charset=utf-8`
/// → `utf-8` (quotes taken off).
pub(crate) fn charset(content_type: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(content_type).ok()?;
    value.split(';').skip(1).find_map(|param| {
        let (name, v) = param.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| v.trim().trim_matches('"'))
    })
}

/// `bytes` in `encoding` as UTF-8, each malformed sequence U+FFFD (one
/// per sequence, as the WHATWG decoders count them) and kept in `fixes`.
fn transcode(bytes: &[u8], encoding: &'static Encoding, fixes: &mut Vec<Fix>) -> String {
    let mut decoder = encoding.new_decoder_without_bom_handling();
    let mut out = String::new();
    let mut rest = bytes;
    loop {
        let room = decoder
            .max_utf8_buffer_length_without_replacement(rest.len())
            .unwrap_or(rest.len().saturating_mul(3));
        out.reserve(room);
        let (result, read) = decoder.decode_to_string_without_replacement(rest, &mut out, true);
        rest = &rest[read..];
        match result {
            DecoderResult::InputEmpty => return out,
            DecoderResult::OutputFull => {}
            DecoderResult::Malformed(..) => {
                fixes.push(Fix {
                    at: out.len(),
                    reason: Reason::InvalidBytes,
                });
                out.push('\u{FFFD}');
            }
        }
    }
}

/// Where each lone surrogate escape starts (the `\` of `\uD800`). Every
/// backslash in valid JSON starts an escape or ends a `\\`, so reading
/// them in order tells the two apart; in text that is not JSON, what this
/// finds does not matter (the decoder refuses it).
fn lone_surrogates(text: &str) -> Vec<usize> {
    let b = text.as_bytes();
    let mut lone = Vec::new();
    let mut next = 0;
    for i in memchr::memchr_iter(b'\\', b) {
        if i < next {
            continue;
        }
        match b.get(i + 1) {
            Some(b'u') => {}
            _ => {
                next = i + 2;
                continue;
            }
        }
        next = i + 6;
        let Some(unit) = hex4(b, i + 2) else {
            continue;
        };
        match unit {
            0xD800..=0xDBFF => {
                let low = (b.get(i + 6) == Some(&b'\\') && b.get(i + 7) == Some(&b'u'))
                    .then(|| hex4(b, i + 8))
                    .flatten();
                if low.is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)) {
                    next = i + 12;
                } else {
                    lone.push(i);
                }
            }
            0xDC00..=0xDFFF => lone.push(i),
            _ => {}
        }
    }
    lone
}

/// The four hex digits at `at`, as a UTF-16 unit.
fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
    if !digits.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(body: &[u8], charset: Option<&str>) -> (String, Vec<(usize, Reason)>) {
        let t = text(body, charset);
        let fixes = t.fixes.iter().map(|f| (f.at, f.reason)).collect();
        (t.text.into_owned(), fixes)
    }

    #[test]
    fn utf8_without_a_bom_is_borrowed_as_is() {
        let body = "{\"a\":\"caf\u{e9} \\ud83d\\ude00 \\\\ud800\"}".as_bytes();
        let t = text(body, None);
        assert!(matches!(t.text, Cow::Borrowed(_)));
        assert!(t.fixes.is_empty());
        assert!(matches!(text(body, Some("UTF-8")).text, Cow::Borrowed(_)));
    }

    #[test]
    fn a_bom_is_skipped_and_says_the_encoding() {
        assert_eq!(fixed(b"\xEF\xBB\xBF{}", None), ("{}".into(), vec![]));
        // The BOM wins over the label, as in every WHATWG decoder.
        assert_eq!(
            fixed(b"\xEF\xBB\xBF\"caf\xC3\xA9\"", Some("iso-8859-1")),
            ("\"café\"".into(), vec![])
        );
        assert_eq!(
            fixed(b"\xFF\xFE{\0}\0", Some("utf-8")),
            ("{}".into(), vec![])
        );
    }

    #[test]
    fn the_charset_is_decoded() {
        assert_eq!(
            fixed(b"\"caf\xE9\"", Some("iso-8859-1")),
            ("\"café\"".into(), vec![])
        );
        assert_eq!(
            fixed(b"\"caf\xE9\"", Some(" ISO-8859-1 ")),
            ("\"café\"".into(), vec![])
        );
        // An unknown label: UTF-8, JSON's own.
        assert_eq!(
            fixed(b"\"caf\xE9\"", Some("no-such-charset")),
            ("\"caf\u{FFFD}\"".into(), vec![(4, Reason::InvalidBytes)])
        );
    }

    #[test]
    fn invalid_bytes_are_u_fffd_each_seen() {
        assert_eq!(
            fixed(b"[\"caf\xE9\",\"\xF0\x9F\x98\",\"ok\xFF\"]", None),
            (
                "[\"caf\u{FFFD}\",\"\u{FFFD}\",\"ok\u{FFFD}\"]".into(),
                vec![
                    (5, Reason::InvalidBytes),
                    (11, Reason::InvalidBytes),
                    (19, Reason::InvalidBytes)
                ]
            )
        );
    }

    #[test]
    fn lone_surrogates_are_u_fffd_pairs_and_escaped_backslashes_are_not() {
        let (t, f) = fixed(
            br#"["a\ud800b","\uDC00","\ud83d\ude00","\\ud800","\\\ud800","\ud800\u0041","\ud800"#,
            None,
        );
        assert_eq!(
            t,
            r#"["a\uFFFDb","\uFFFD","\ud83d\ude00","\\ud800","\\\uFFFD","\uFFFD\u0041","\uFFFD"#
        );
        let at: Vec<usize> = f.iter().map(|(at, _)| *at).collect();
        assert_eq!(at, [3, 13, 49, 58, 73]);
        assert!(f.iter().all(|(_, r)| *r == Reason::LoneSurrogate));
        // Both kinds, in order.
        let (_, f) = fixed(b"[\"\xE9\",\"\\ud800\"]", None);
        assert_eq!(f, [(2, Reason::InvalidBytes), (8, Reason::LoneSurrogate)]);
    }

    #[test]
    fn the_charset_parameter_is_read() {
        assert_eq!(
            charset(b"application/json; charset=iso-8859-1"),
            Some("iso-8859-1")
        );
        assert_eq!(
            charset(b"application/json;Charset=\"UTF-8\""),
            Some("UTF-8")
        );
        assert_eq!(charset(b"application/json"), None);
        assert_eq!(charset(b"application/json; q=1"), None);
    }
}
