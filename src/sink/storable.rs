//! What PostgreSQL cannot hold that JSON allows, and what the postgres sink
//! writes instead, so that one odd value never costs a page (issue 37):
//!
//! - **U+0000 in a string** (a value or an object key): neither `jsonb` nor
//!   `text` can hold it (`unsupported Unicode escape sequence`, SQLSTATE
//!   22P05; `invalid byte sequence for encoding "UTF8": 0x00`, 22021). Each
//!   one is written as U+FFFD, the replacement character.
//! - **A number outside `numeric`'s range**: more than 131,072 digits
//!   before the decimal point or 16,383 after it (`1e131072`, `1e-16384`,
//!   `0.0e-20000`; `value overflows numeric format`, 22003), which JSON
//!   allows and exact numbers keep as sent. It is written as a JSON string
//!   holding the number's text, every digit kept.
//!
//! The walk is generic over [`Value`] (whatever map type and number
//! representation serde_json was built with), and a record that needs
//! nothing is not copied. Only the postgres sink calls it: the other sinks
//! keep a record as it came. Nesting needs nothing: a body nests at most
//! `decode::MAX_DEPTH` levels, far below what PostgreSQL parses.

use serde_json::{Map, Number, Value};

/// What [`storable`] changed in one record.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Altered {
    /// A string or key held U+0000.
    pub(crate) nul: bool,
    /// A number was outside `numeric`'s range.
    pub(crate) numeric_range: bool,
}

impl Altered {
    /// The metric reasons (`qw_records_altered_total{reason}`) that apply.
    pub(crate) fn reasons(self) -> impl Iterator<Item = &'static str> {
        [(self.nul, "nul"), (self.numeric_range, "numeric_range")]
            .into_iter()
            .filter_map(|(hit, reason)| hit.then_some(reason))
    }
}

/// `record` as PostgreSQL can hold it, and what changed; `None` when it can
/// hold it as it is (the common case: nothing is copied).
pub(crate) fn storable(record: &Value) -> Option<(Value, Altered)> {
    if fits(record) {
        return None;
    }
    let mut altered = Altered::default();
    let fixed = fix(record, &mut altered);
    Some((fixed, altered))
}

/// The replacement character, for U+0000.
const REPLACEMENT: &str = "\u{FFFD}";

/// Whether PostgreSQL takes `v` as it is.
fn fits(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(_) => true,
        Value::Number(n) => numeric_fits(n),
        Value::String(s) => !s.contains('\0'),
        Value::Array(a) => a.iter().all(fits),
        Value::Object(o) => o.iter().all(|(k, v)| !k.contains('\0') && fits(v)),
    }
}

fn fix(v: &Value, altered: &mut Altered) -> Value {
    match v {
        Value::Number(n) if !numeric_fits(n) => {
            altered.numeric_range = true;
            Value::String(n.as_str().to_owned())
        }
        Value::String(s) => Value::String(fix_str(s, altered)),
        Value::Array(a) => Value::Array(a.iter().map(|v| fix(v, altered)).collect()),
        Value::Object(o) => {
            let mut out = Map::new();
            for (k, v) in o {
                out.insert(fix_str(k, altered), fix(v, altered));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn fix_str(s: &str, altered: &mut Altered) -> String {
    if s.contains('\0') {
        altered.nul = true;
        s.replace('\0', REPLACEMENT)
    } else {
        s.to_owned()
    }
}

/// The most digits `numeric` holds before the decimal point, and after it.
const NUMERIC_INT_DIGITS: i64 = 131_072;
const NUMERIC_SCALE: i64 = 16_383;

/// Whether `numeric` holds `n`, by its text as sent (numbers are kept as
/// their text: serde_json's `arbitrary_precision`).
fn numeric_fits(n: &Number) -> bool {
    text_fits(n.as_str())
}

/// Whether `numeric` holds the JSON number `text`: its scale (digits after
/// the decimal point, counting trailing zeros, as PostgreSQL does) at most
/// [`NUMERIC_SCALE`], and its digits before the point at most
/// [`NUMERIC_INT_DIGITS`] (zero has none, whatever its exponent).
fn text_fits(text: &str) -> bool {
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], &unsigned[i + 1..]),
        None => (unsigned, "0"),
    };
    let exponent = parse_exponent(exponent);
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let scale = (frac.len() as i64).saturating_sub(exponent).max(0);
    if scale > NUMERIC_SCALE {
        return false;
    }
    let digits = int.bytes().chain(frac.bytes());
    let Some(first) = digits.clone().position(|b| b != b'0') else {
        return true;
    };
    // The value is 0.DDD x 10^weight, its first digit D not zero.
    let weight = (int.len() as i64 - first as i64).saturating_add(exponent);
    weight <= NUMERIC_INT_DIGITS
}

/// A JSON exponent (`+5`, `-16384`, `99999999999999999999`), saturating.
fn parse_exponent(s: &str) -> i64 {
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let magnitude = digits.bytes().fold(0i64, |acc, b| {
        acc.saturating_mul(10)
            .saturating_add(i64::from(b.wrapping_sub(b'0')))
    });
    if negative { -magnitude } else { magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_number_past_numeric_becomes_a_string_of_its_digits() {
        let r: Value = serde_json::from_str(r#"{"big": 1e200000, "tiny": -1e-20000, "ok": 12.30}"#)
            .expect("json");
        let (fixed, altered) = storable(&r).expect("altered");
        assert_eq!(
            fixed,
            serde_json::from_str::<Value>(
                r#"{"big": "1e+200000", "tiny": "-1e-20000", "ok": 12.30}"#
            )
            .expect("json")
        );
        assert_eq!(altered.reasons().collect::<Vec<_>>(), ["numeric_range"]);
    }

    #[test]
    fn a_record_without_nul_or_huge_numbers_is_not_copied() {
        let r = json!({"id": "1", "t": "a b", "n": [1, -2.5, 1e300, {"k": null}]});
        assert!(storable(&r).is_none());
    }

    #[test]
    fn nul_in_values_and_keys_becomes_the_replacement_character() {
        let r = json!({"id": "1", "t": "a\u{0}b", "nested": [{"k\u{0}": "\u{0}"}], "ok": "x"});
        let (fixed, altered) = storable(&r).expect("altered");
        assert_eq!(
            fixed,
            json!({"id": "1", "t": "a\u{FFFD}b", "nested": [{"k\u{FFFD}": "\u{FFFD}"}], "ok": "x"})
        );
        assert_eq!(
            altered,
            Altered {
                nul: true,
                numeric_range: false
            }
        );
        assert_eq!(altered.reasons().collect::<Vec<_>>(), ["nul"]);
    }

    /// Each boundary as a real PostgreSQL 15 server answered it
    /// (`SELECT 'TEXT'::jsonb`).
    #[test]
    fn numeric_range_matches_postgresql() {
        for fits in [
            "0",
            "-0",
            "12.30",
            "1e400",
            "-5e-324",
            "1e131071",
            "9.9e131071",
            "0.00001e131076",
            "1e-16383",
            "0e200000",
            "123456789012345678901234567890",
            "1E+5",
        ] {
            assert!(text_fits(fits), "{fits} fits");
        }
        for overflows in [
            "1e131072",
            "1e200000",
            "1e-16384",
            "1e-20000",
            "0.0e-20000",
            "1.00000e-16383",
            "1e99999999999999999999999",
            "-1e-99999999999999999999999",
        ] {
            assert!(!text_fits(overflows), "{overflows} overflows");
        }
    }

    /// What the check costs per record, beside the JSON encoding the sink
    /// does for every record anyway (BENCHMARKS.md section 16), on 50
    /// video-like records of ~680 bytes; best of 7 runs. A measurement,
    /// not a test: `cargo test --release --lib storable_cost -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore = "a measurement: run it in release (BENCHMARKS.md section 16)"]
    fn storable_cost() {
        use std::time::Instant;
        let record = |i: usize| {
            json!({"kind": "youtube#video", "etag": format!("XI7nbFXulYBIpL0ayR_gDh3eu1k-{i}"),
                   "id": format!("w1-p1-i{i}"),
                   "snippet": {"publishedAt": "2026-11-01T10:00:00Z", "channelId": "UCaaaaaaaaaaaaaaaaaaaaaa",
                               "title": format!("Async Rust in production, part {i}: tokio, pools and back-pressure"),
                               "description": "d".repeat(300), "tags": ["rust", "async", "tokio", "quota"]},
                   "statistics": {"viewCount": "1234567", "likeCount": "12345", "commentCount": "123"}})
        };
        let records: Vec<Value> = (0..50).map(record).collect();
        let n = 4000;
        let per = |f: &dyn Fn(&Value) -> usize| {
            (0..7)
                .map(|_| {
                    let t = Instant::now();
                    let mut x = 0;
                    for _ in 0..n {
                        for r in &records {
                            x += f(std::hint::black_box(r));
                        }
                    }
                    std::hint::black_box(x);
                    t.elapsed().as_secs_f64() * 1e9 / (n * records.len()) as f64
                })
                .fold(f64::MAX, f64::min)
        };
        let check = per(&|r| usize::from(storable(r).is_some()));
        let encode = per(&|r| serde_json::to_string(r).map_or(0, |t| t.len()));
        let bytes = serde_json::to_string(&records[0]).map_or(0, |t| t.len());
        println!(
            "record {bytes} bytes: storable() {check:.0} ns, serde_json::to_string {encode:.0} ns, ratio {:.2}",
            check / encode
        );
    }
}
