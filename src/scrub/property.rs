//! The scrubber's property (issue 22, item 1): for random secrets, spelled
//! in random ways (as they are; percent-encoded in upper, lower or mixed
//! case, every byte or only the reserved ones, `+` for spaces; JSON-escaped
//! with `\"`, `\/` or `\uXXXX` for any character; JSON inside a
//! percent-encoded URL and the reverse), placed at random in upstream text
//! and cut at a random point (inside the secret too), no 12 characters in a
//! row of the secret survive into anything the scrubber returns.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::Value;

use super::views::View;
use super::*;

/// Characters a secret is made of: none is a lower-case ASCII letter, so
/// the filler around it (lower-case and spaces) and `[redacted]` can never
/// spell a piece of it by chance.
const ALPHABET: &[char] = &[
    'A', 'B', 'C', 'D', 'E', 'K', 'Q', 'X', 'Z', '0', '1', '7', '9', '/', '+', '=', '.', '_', '~',
    '-', ' ', '"', '\\', '%', '&', '?', '#', ':', '@', 'ä', '€', '😀',
];

/// How the upstream spells the secret.
#[derive(Debug, Clone, Copy)]
enum Spelling {
    Plain,
    /// The request's own encoding (RFC 6570 simple expansion), hex upper.
    Encoded,
    EncodedLower,
    /// Each triplet's hex in a random case.
    EncodedMixed,
    /// Every byte as `%XX`, unreserved ones too.
    EncodedAll,
    /// A form: `+` for spaces.
    Form,
    /// `serde_json`'s escaping.
    Json,
    /// PHP's: `/` as `\/` too.
    JsonSlash,
    /// Random characters as `\uXXXX` (surrogate pairs beyond the BMP).
    JsonUnicode,
    /// A JSON string inside a percent-encoded URL.
    JsonThenEncoded,
    /// A percent-encoded URL inside a JSON string, its `%` as `\u0025`.
    EncodedThenJsonUnicode,
}

const SPELLINGS: [Spelling; 11] = [
    Spelling::Plain,
    Spelling::Encoded,
    Spelling::EncodedLower,
    Spelling::EncodedMixed,
    Spelling::EncodedAll,
    Spelling::Form,
    Spelling::Json,
    Spelling::JsonSlash,
    Spelling::JsonUnicode,
    Spelling::JsonThenEncoded,
    Spelling::EncodedThenJsonUnicode,
];

/// `%XX` of every byte of `s` that `keep` does not keep, the hex's case
/// chosen per triplet by `upper`.
fn percent(s: &str, keep: impl Fn(u8) -> bool, mut upper: impl FnMut() -> bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if keep(b) {
            out.push(b as char);
        } else if upper() {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// JSON string content: `"` and `\` escaped, and each character `escape`
/// picks as `\uXXXX`.
fn json(s: &str, slash: bool, mut escape: impl FnMut() -> bool) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if escape() {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else if c == '"' || c == '\\' {
            out.push('\\');
            out.push(c);
        } else if c == '/' && slash {
            out.push_str("\\/");
        } else {
            out.push(c);
        }
    }
    out
}

fn spell(secret: &str, how: Spelling, coins: &[bool]) -> String {
    let mut coins = coins.iter().copied().cycle();
    let coin = move || coins.next().unwrap_or(true);
    match how {
        Spelling::Plain => secret.to_owned(),
        Spelling::Encoded => percent(secret, unreserved, || true),
        Spelling::EncodedLower => percent(secret, unreserved, || false),
        Spelling::EncodedMixed => percent(secret, unreserved, coin),
        Spelling::EncodedAll => percent(secret, |_| false, coin),
        Spelling::Form => percent(secret, unreserved, || true).replace("%20", "+"),
        Spelling::Json => json(secret, false, || false),
        Spelling::JsonSlash => json(secret, true, || false),
        Spelling::JsonUnicode => json(secret, true, coin),
        Spelling::JsonThenEncoded => percent(&json(secret, true, || false), unreserved, || true),
        Spelling::EncodedThenJsonUnicode => {
            percent(secret, unreserved, || true).replace('%', "\\u0025")
        }
    }
}

/// Whether `how` spells valid JSON string content.
fn is_json(how: Spelling) -> bool {
    matches!(
        how,
        Spelling::Json | Spelling::JsonSlash | Spelling::JsonUnicode
    )
}

/// The first 12 characters in a row of `secret` that are in `out`, as it
/// is or in any decoded spelling.
pub(super) fn survivor(secret: &str, out: &str) -> Option<String> {
    let chars: Vec<char> = secret.chars().collect();
    let j = View::raw(out).json_unescaped(false);
    let p = View::raw(out).percent_decoded(false);
    let jp = j.percent_decoded(false);
    let pj = p.json_unescaped(false);
    [out.as_bytes(), &j.bytes, &p.bytes, &jp.bytes, &pj.bytes]
        .into_iter()
        .map(String::from_utf8_lossy)
        .find_map(|spelled| {
            chars
                .windows(12.min(chars.len()))
                .map(|w| w.iter().collect::<String>())
                .find(|w| spelled.contains(w))
        })
}

/// Fails when [`survivor`] finds a piece of `secret` in `out`.
fn clean(secret: &str, out: &str, what: &str) -> Result<(), TestCaseError> {
    match survivor(secret, out) {
        Some(w) => Err(TestCaseError::fail(format!(
            "{what}: {w:?} of the secret survives in {out:?}"
        ))),
        None => Ok(()),
    }
}

/// Every string of `v`, keys included.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                strings(v, out);
            }
        }
        _ => {}
    }
}

fn secret() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(ALPHABET), 12..40)
        .prop_map(|c| c.into_iter().collect())
}

fn filler(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        proptest::sample::select(&['a', 'e', 'k', 'y', 'z', ' ', 'q'][..]),
        0..max,
    )
    .prop_map(|c| c.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn issue_22_1_no_spelling_of_the_secret_survives(
        secret in secret(),
        how in proptest::sample::select(&SPELLINGS[..]),
        coins in proptest::collection::vec(any::<bool>(), 1..16),
        before in filler(300),
        after in filler(40),
        cut_at in 0.0f64..1.0,
    ) {
        let s = Scrubber::new([&Secret::new(&secret)]);
        let spelled = spell(&secret, how, &coins);
        let text = format!("{before}{spelled}{after}");

        clean(&secret, &s.scrub(&text), "scrub")?;
        clean(&secret, &s.templatize(&text), "templatize")?;
        clean(&secret, &s.snippet(text.as_bytes(), false), "snippet")?;

        // Cut anywhere, inside the secret's spelling too: a body read up to
        // its limit.
        let cut = (text.len() as f64 * cut_at) as usize;
        let part = &text.as_bytes()[..cut];
        clean(&secret, &s.snippet(part, true), "snippet of a cut body")?;
        let mut part_text = String::from_utf8_lossy(part).into_owned();
        if part_text.ends_with('\u{FFFD}') {
            part_text.pop();
        }
        clean(&secret, &s.scrub_cut(&part_text), "scrub_cut")?;

        // A decoded body: the text as a key and as a value.
        let mut v = serde_json::json!({ "items": [{ "k": text.clone(), text.clone(): 1 }] });
        s.scrub_json(&mut v);
        let mut found = Vec::new();
        strings(&v, &mut found);
        for f in &found {
            clean(&secret, f, "a decoded body's string")?;
        }
        // A body the upstream wrote: JSON spellings decode to the secret.
        if is_json(how) {
            let raw = format!(r#"{{"items":[{{"{before}{spelled}":"{spelled}{after}"}}]}}"#);
            let mut v: Value = serde_json::from_str(&raw).expect("valid JSON");
            s.scrub_json(&mut v);
            let mut found = Vec::new();
            strings(&v, &mut found);
            for f in &found {
                clean(&secret, f, "a raw body's string")?;
            }
        }

        // A header value.
        if let Ok(value) = HeaderValue::from_bytes(text.as_bytes()) {
            let mut h = HeaderMap::new();
            h.insert("retry-after", value);
            let scrubbed = s.headers(&h);
            let out = String::from_utf8_lossy(scrubbed["retry-after"].as_bytes()).into_owned();
            clean(&secret, &out, "a header")?;
        }
    }
}
