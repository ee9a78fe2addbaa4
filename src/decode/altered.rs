//! Which of a page's records differ from what was sent: a U+FFFD that
//! stands for something else ([`super::text::Fix`]), an object key sent
//! twice (the last value kept). Each record is counted once per reason
//! (`qw_records_altered_total`). Only a page with such a place is read
//! again, and only as far as its records: their places in the text, found
//! with serde_json's borrowed [`RawValue`]s along the job's `records`
//! pointer.

use std::collections::{HashMap, HashSet};
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::text::{Fix, Reason};

/// Records of one page altered on the way in, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Altered {
    /// Records with bytes invalid in the body's charset (U+FFFD).
    pub(crate) invalid_utf8: u64,
    /// Records with a lone surrogate escape (U+FFFD).
    pub(crate) lone_surrogate: u64,
    /// Records with an object that has a key twice (the last value kept).
    pub(crate) duplicate_key: u64,
}

impl Altered {
    /// Counts them: `qw_records_altered_total{qw_job, reason}`.
    pub(crate) fn count(&self, job: &str) {
        for (reason, n) in [
            ("invalid_utf8", self.invalid_utf8),
            ("lone_surrogate", self.lone_surrogate),
            ("duplicate_key", self.duplicate_key),
        ] {
            if n > 0 {
                metrics::counter!("qw_records_altered_total", "qw_job" => job.to_owned(), "reason" => reason)
                    .increment(n);
            }
        }
    }
}

/// The records of `text` (a decoded body, so valid JSON) at `records` (a
/// sink's pointer: "" is the whole body, an array's elements or an object)
/// that hold one of `fixes`, or (`duplicates`: the body has some) an
/// object with a key twice. A place outside every record (in the page's
/// envelope) alters none.
pub(super) fn altered(text: &str, fixes: &[Fix], duplicates: bool, records: &str) -> Altered {
    let mut out = Altered::default();
    if fixes.is_empty() && !duplicates {
        return out;
    }
    let Some(spans) = record_spans(text, records) else {
        return out;
    };
    for (start, end) in spans {
        let first = fixes.partition_point(|f| f.at < start);
        let inside = fixes[first..].iter().take_while(|f| f.at < end);
        let (mut bytes, mut lone) = (false, false);
        for f in inside {
            match f.reason {
                Reason::InvalidBytes => bytes = true,
                Reason::LoneSurrogate => lone = true,
            }
        }
        out.invalid_utf8 += u64::from(bytes);
        out.lone_surrogate += u64::from(lone);
        if duplicates {
            let twice = serde_json::from_str::<Twice>(&text[start..end]).is_ok_and(|t| t.0);
            out.duplicate_key += u64::from(twice);
        }
    }
    out
}

/// Each record's byte range in `text`.
fn record_spans(text: &str, records: &str) -> Option<Vec<(usize, usize)>> {
    let mut at: &RawValue = serde_json::from_str(text).ok()?;
    if !records.is_empty() {
        for token in records.strip_prefix('/')?.split('/') {
            at = child(at, &token.replace("~1", "/").replace("~0", "~"))?;
        }
    }
    let span = |raw: &RawValue| {
        let start = raw.get().as_ptr() as usize - text.as_ptr() as usize;
        (start, start + raw.get().len())
    };
    match at.get().as_bytes().first()? {
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(at.get()).ok()?;
            Some(items.into_iter().map(span).collect())
        }
        b'{' if records.is_empty() => Some(vec![span(at)]),
        _ => None,
    }
}

/// The value at `token` in an object or an array, as `Value::pointer`
/// reads it (an object's duplicate key: the last value).
fn child<'t>(raw: &'t RawValue, token: &str) -> Option<&'t RawValue> {
    match raw.get().as_bytes().first()? {
        b'{' => {
            let mut map: HashMap<String, &'t RawValue> = serde_json::from_str(raw.get()).ok()?;
            map.remove(token)
        }
        b'[' => {
            if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
                return None;
            }
            let index: usize = token.parse().ok()?;
            let items: Vec<&'t RawValue> = serde_json::from_str(raw.get()).ok()?;
            items.get(index).copied()
        }
        _ => None,
    }
}

/// Whether a value has an object with a key twice (keys compared as
/// decoded: `"a"` and `"\u0061"` are one key).
struct Twice(bool);

impl<'de> serde::Deserialize<'de> for Twice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Twice, D::Error> {
        d.deserialize_any(TwiceVisitor).map(Twice)
    }
}

struct TwiceVisitor;

impl<'de> DeserializeSeed<'de> for TwiceVisitor {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TwiceVisitor {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let mut twice = false;
        while let Some(t) = seq.next_element_seed(TwiceVisitor)? {
            twice |= t;
        }
        Ok(twice)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut keys = HashSet::new();
        let mut twice = false;
        while let Some(key) = map.next_key::<String>()? {
            twice |= !keys.insert(key);
            // A number's one-entry map (arbitrary_precision) holds no object.
            twice |= map.next_value_seed(TwiceVisitor)?;
        }
        Ok(twice)
    }
}

#[cfg(test)]
mod tests {
    use super::super::text::text;
    use super::*;

    fn count(body: &[u8], records: &str) -> Altered {
        let t = text(body, None);
        altered(&t.text, &t.fixes, true, records)
    }

    #[test]
    fn each_record_is_counted_once_per_reason() {
        let body = b"{\"next\":\"\xE9\",\"data\":{\"a/b\":[{\"t\":\"\xE9 \xE9\",\"u\":\"\\udc00\"},{\"t\":\"ok\"},{\"t\":\"\\ud800\"}]}}";
        assert_eq!(
            count(body, "/data/a~1b"),
            Altered {
                invalid_utf8: 1,
                lone_surrogate: 2,
                duplicate_key: 0,
            }
        );
        // Outside the records: nothing counted.
        assert_eq!(count(body, "/missing"), Altered::default());
        assert_eq!(
            count(b"[{\"t\":\"\xE9\"},{\"t\":\"ok\"},\"\xE9\"]", ""),
            Altered {
                invalid_utf8: 2,
                lone_surrogate: 0,
                duplicate_key: 0,
            }
        );
        assert_eq!(
            count(b"{\"t\":\"\\ud800\"}", ""),
            Altered {
                invalid_utf8: 0,
                lone_surrogate: 1,
                duplicate_key: 0,
            }
        );
    }

    #[test]
    fn pointers_read_as_value_pointer_reads_them() {
        let body = br#"{"a":[{"x":1},[{"t":"\ud800"}]],"a":{"b":[]},"0":[{"t":"\udc00"}]}"#;
        // The last "a" wins, as in the decoded body.
        assert_eq!(count(body, "/a"), Altered::default());
        assert_eq!(count(body, "/0").lone_surrogate, 1);
        let body = br#"{"a":[{"x":1},[{"t":"\ud800"}]]}"#;
        assert_eq!(count(body, "/a/1").lone_surrogate, 1);
        assert_eq!(count(body, "/a/01"), Altered::default());
    }

    #[test]
    fn a_record_with_a_key_twice_is_counted_once() {
        let body = br#"{"items":[{"a":1,"a":2},{"a":{"b":[{"c":1,"\u0063":2}],"d":1}},{"a":1,"b":{"a":1}},{"x":[1.5,{"y":1,"y":1}],"z":1}]}"#;
        assert_eq!(count(body, "/items").duplicate_key, 3);
    }
}
