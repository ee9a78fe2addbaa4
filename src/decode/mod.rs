//! Decoding an upstream's JSON body, bounded and as sent.
//!
//! As sent (issue 39): the body's text is read in its charset, a byte
//! order mark skipped, what cannot be read as sent made U+FFFD and counted
//! per record ([`text`], [`altered`]); numbers keep their text (1e400, 30
//! digits, `12.30`) and objects their keys' order, through serde_json's
//! `arbitrary_precision` and `preserve_order` (Cargo.toml).
//!
//! Bounded: what decoding builds is charged as it is built, and decoding
//! stops when it would take more than a budget (a small multiple of the
//! endpoint's `max_body`) or nest deeper than [`MAX_DEPTH`]. A body is at
//! most `max_body` bytes, but its decoded form can be many times that:
//! `[0,0,…]` is 2 bytes per element in the body and a 72-byte value plus
//! its number's text in memory. Without a bound, 16 MiB of `[0,0,…]` took
//! the daemon to 860 MB (issue 22, item 3).
//!
//! The charge is what the allocator is asked for: each array's buffer,
//! each object's entries and hash index, each string's and number's bytes
//! rounded up to an allocation, the text when it had to be rewritten. It
//! is an estimate of the heap, not a measure of it, within a small factor
//! of it, and it never undercounts by more than the allocator's own
//! bookkeeping.
//!
//! An object's entries are gathered on one stack shared by the whole body
//! and moved into a map of their exact size when it ends: its hash index
//! is built once, never grown and rebuilt.

mod altered;
pub(crate) mod text;

use std::fmt;
use std::mem::size_of;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

pub(crate) use altered::Altered;

/// The deepest nesting of arrays and objects a body may have. Real APIs
/// nest a few levels (GraphQL a few more); serde_json's own limit is 128.
pub(crate) const MAX_DEPTH: usize = 64;

/// What decoding may build, per byte of the endpoint's `max_body`.
pub(crate) const DECODED_PER_BODY: u64 = 4;

/// Why a body was not decoded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    /// It is not JSON.
    #[error("not JSON ({0})")]
    Json(serde_json::Error),
    /// Decoded, it would take more than `limit` bytes.
    #[error(
        "decoded, the body would take more than {} of memory ({} x max_body); refused",
        crate::config::fmt_size(*.limit),
        DECODED_PER_BODY
    )]
    TooLarge {
        /// The budget, bytes.
        limit: u64,
    },
    /// It nests arrays and objects deeper than [`MAX_DEPTH`].
    #[error("the body nests arrays and objects deeper than {MAX_DEPTH} levels; refused")]
    TooDeep,
}

/// A decoded body, and the records that differ from what was sent.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) body: Value,
    /// The records at the job's `records` pointer that hold a U+FFFD
    /// standing for bytes or an escape as sent.
    pub(crate) altered: Altered,
}

/// Decodes `text` (a body as [`text::text`] read it) within `budget`
/// bytes (as charged), and counts the records at `records` it altered.
pub(crate) fn decode_text(
    text: &text::Text<'_>,
    records: &str,
    budget: u64,
) -> Result<Decoded, DecodeError> {
    // A rewritten text lives while the body is built from it.
    let rewritten = match &text.text {
        std::borrow::Cow::Owned(s) => s.capacity() as u64,
        std::borrow::Cow::Borrowed(_) => 0,
    };
    let Some(budget_left) = budget.checked_sub(rewritten) else {
        return Err(DecodeError::TooLarge { limit: budget });
    };
    let (body, duplicates) = decode_within(&text.text, budget_left, budget)?;
    let altered = altered::altered(&text.text, &text.fixes, duplicates, records);
    Ok(Decoded { body, altered })
}

#[cfg(test)]
/// Decodes `body` (UTF-8 or not) as JSON, building at most `budget`
/// bytes (as charged): [`text::text`] without a charset, then the decoder.
pub(crate) fn decode(body: &[u8], budget: u64) -> Result<Value, DecodeError> {
    decode_text(&text::text(body, None), "", budget).map(|d| d.body)
}

/// An array of JSON values read as [`decode_text`] reads them (numbers'
/// text, keys' order, an object that has serde_json's number key of its
/// own still an object), without a budget: for JSON this process wrote
/// itself, a spooled page's records (`deserialize_with`). serde_json's
/// own `Value` would take `{"$serde_json::private::Number":"7"}` for the
/// number 7, and refuse `{"$serde_json::private::Number":"x"}`.
pub(crate) fn values<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    let mut state = State::new(u64::MAX, u64::MAX);
    match Seed::new(&mut state).deserialize(d)? {
        Value::Array(items) => Ok(items),
        _ => Err(D::Error::custom("expected an array of JSON values")),
    }
}

/// The decoder proper, over valid UTF-8; `limit` is what an error names.
/// With the value, whether an object had a key twice.
fn decode_within(text: &str, budget: u64, limit: u64) -> Result<(Value, bool), DecodeError> {
    let mut state = State::new(budget, limit);
    let mut de = serde_json::Deserializer::from_str(text);
    let decoded = state
        .charge(size_of::<Value>())
        .map_err(|()| serde_json::Error::custom("over budget"))
        .and_then(|()| Seed::new(&mut state).deserialize(&mut de))
        .and_then(|v| de.end().map(|()| v));
    match (decoded, state.refused) {
        (Ok(v), _) => Ok((v, state.duplicates)),
        (Err(_), Some(refused)) => Err(refused),
        (Err(e), None) => Err(DecodeError::Json(e)),
    }
}

/// What one decoding has left to spend, why it stopped, and the stacks
/// the open arrays and objects gather their contents on.
struct State {
    left: u64,
    limit: u64,
    depth: usize,
    /// Set when the budget or the depth refused the body: the error that
    /// serde_json carries up is ours, not a syntax error.
    refused: Option<DecodeError>,
    /// The entries of the open objects, innermost last.
    entries: Vec<(String, Value)>,
    /// A number's text, as serde_json hands one over (below).
    number: Option<Number>,
    /// Whether an object had a key twice.
    duplicates: bool,
}

impl State {
    fn new(budget: u64, limit: u64) -> Self {
        State {
            left: budget,
            limit,
            depth: 0,
            refused: None,
            entries: Vec::new(),
            number: None,
            duplicates: false,
        }
    }

    fn charge(&mut self, bytes: usize) -> Result<(), ()> {
        match self.left.checked_sub(bytes as u64) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.refused = Some(DecodeError::TooLarge { limit: self.limit });
                Err(())
            }
        }
    }

    /// Charges a buffer's growth from `before` to `after` elements of
    /// `each` bytes (the entries' stack keeps its largest until the body
    /// is decoded).
    fn charge_growth(&mut self, before: usize, after: usize, each: usize) -> Result<(), ()> {
        if after > before {
            self.charge(heap((after - before) * each))
        } else {
            Ok(())
        }
    }

    fn enter(&mut self) -> Result<(), ()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            self.refused = Some(DecodeError::TooDeep);
            return Err(());
        }
        Ok(())
    }
}

/// What the allocator hands out for `len` bytes: nothing for none, else at
/// least 32 bytes, in steps of 16 with 8 of its own (glibc's chunks).
fn heap(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len + 8).div_ceil(16).max(2) * 16
    }
}

/// An object of `n` entries built at its size: its entries (each with
/// its hash) and its hash index (buckets a power of two at most 7/8 full,
/// a control byte each and a group's more).
fn object_bytes(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let entry = size_of::<(String, Value)>() + size_of::<usize>();
    let buckets = (n * 8 / 7 + 1).next_power_of_two().max(4);
    heap(n * entry) + heap(buckets * (size_of::<usize>() + 1) + 16)
}

/// The key serde_json's `arbitrary_precision` hands a number over with:
/// as a one-entry map from this key to the number's text. Not public in
/// serde_json; pinned by the test `numbers_keep_their_text`.
const NUMBER_KEY: &str = "$serde_json::private::Number";

/// An object's key: [`NUMBER_KEY`] told apart without a copy (the one
/// key of every number that is not a 64-bit integer).
enum Key {
    Number,
    Named(String),
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(if v == NUMBER_KEY {
            Key::Number
        } else {
            Key::Named(v.to_owned())
        })
    }

    fn visit_string<E>(self, v: String) -> Result<Key, E> {
        Ok(if v == NUMBER_KEY {
            Key::Number
        } else {
            Key::Named(v)
        })
    }
}

/// Decodes one value, charging `State`. `number`: this value is the one
/// after a [`NUMBER_KEY`], which is a number's text when serde_json gives
/// it as an owned `String` (a JSON string value comes borrowed or copied,
/// never owned: an object with that key of its own stays an object).
struct Seed<'s> {
    state: &'s mut State,
    number: bool,
}

impl<'s> Seed<'s> {
    fn new(state: &'s mut State) -> Self {
        Seed {
            state,
            number: false,
        }
    }

    fn string<E: serde::de::Error>(self, s: String) -> Result<Value, E> {
        self.state
            .charge(heap(s.len()))
            .map_err(|()| E::custom("over budget"))?;
        Ok(Value::String(s))
    }

    fn number<E: serde::de::Error>(self, n: Number) -> Result<Value, E> {
        let text = n.as_str().len();
        self.state
            .charge(heap(text))
            .map_err(|()| E::custom("over budget"))?;
        Ok(Value::Number(n))
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.number(v.into())
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.number(v.into())
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        match Number::from_f64(v) {
            Some(n) => self.number(n),
            None => Ok(Value::Null),
        }
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.string(v.to_owned())
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        if !self.number {
            return self.string(v);
        }
        // The number's text as scanned; read again as a Number (which
        // keeps it), so a text that is not one is an error, not a value.
        let n: Number = v.parse().map_err(E::custom)?;
        self.state.number = Some(n);
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let state = self.state;
        let over = || A::Error::custom("over budget");
        state.enter().map_err(|()| over())?;
        let mut items: Vec<Value> = Vec::new();
        while let Some(v) = seq.next_element_seed(Seed::new(&mut *state))? {
            let before = items.capacity();
            items.push(v);
            let grown = items.capacity() - before;
            // The old buffer and the new one both live while it moves.
            if grown > 0 {
                let bytes = grown * size_of::<Value>();
                state.charge(heap(bytes)).map_err(|()| over())?;
            }
        }
        state.depth -= 1;
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let state = self.state;
        let over = || A::Error::custom("over budget");
        state.enter().map_err(|()| over())?;
        let mark = state.entries.len();
        let mut first = true;
        while let Some(key) = access.next_key_seed(KeySeed)? {
            let number = first && matches!(key, Key::Number);
            let seed = Seed {
                state: &mut *state,
                number,
            };
            let v = access.next_value_seed(seed)?;
            if number && let Some(n) = state.number.take() {
                // serde_json's one-entry map of a number: nothing follows.
                state.depth -= 1;
                return Seed::new(state).number(n);
            }
            first = false;
            let key = match key {
                Key::Number => NUMBER_KEY.to_owned(),
                Key::Named(k) => k,
            };
            state.charge(heap(key.len())).map_err(|()| over())?;
            let before = state.entries.capacity();
            state.entries.push((key, v));
            let after = state.entries.capacity();
            (state.charge_growth(before, after, size_of::<(String, Value)>()))
                .map_err(|()| over())?;
        }
        let n = state.entries.len() - mark;
        state.charge(object_bytes(n)).map_err(|()| over())?;
        let mut map = Map::with_capacity(n);
        // A duplicate key keeps its first place and its last value, as
        // serde_json's own Value does.
        map.extend(state.entries.drain(mark..));
        state.duplicates |= map.len() < n;
        state.depth -= 1;
        Ok(Value::Object(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever decodes within the budget decodes as serde_json decodes it.
    #[test]
    fn decodes_as_serde_json_does() {
        for text in [
            r#"{"items":[{"id":"a","n":1,"f":-2.5,"t":true,"z":null}],"next":"c\u00e4\/"}"#,
            "[]",
            "0",
            r#""x""#,
            r#"{"a":{"b":{"c":[1,[2,[3]]]}}}"#,
        ] {
            let ours = decode(text.as_bytes(), 1 << 20).expect(text);
            let theirs: Value = serde_json::from_str(text).unwrap();
            assert_eq!(ours, theirs, "{text}");
        }
        assert!(matches!(
            decode(b"{\"a\":", 1 << 20),
            Err(DecodeError::Json(_))
        ));
        assert!(matches!(
            decode(b"[1] x", 1 << 20),
            Err(DecodeError::Json(_))
        ));
    }

    /// Issue 22, item 3: `[0,0,…]` decodes to 16 times its size and more.
    /// The budget stops it, whatever shape spends it.
    #[test]
    fn issue_22_3_decoding_stops_at_the_budget() {
        let zeros = format!("{{\"items\":[{}0]}}", "0,".repeat(100_000));
        let budget = 4 * zeros.len() as u64;
        match decode(zeros.as_bytes(), budget) {
            Err(DecodeError::TooLarge { limit }) => assert_eq!(limit, budget),
            other => panic!("{other:?}"),
        }
        let objects = format!("[{}{{}}]", "{\"a\":0},".repeat(20_000));
        assert!(matches!(
            decode(objects.as_bytes(), 4 * objects.len() as u64),
            Err(DecodeError::TooLarge { .. })
        ));
        let strings = format!("[{}\"\"]", "\"a\",".repeat(20_000));
        assert!(matches!(
            decode(strings.as_bytes(), 4 * strings.len() as u64),
            Err(DecodeError::TooLarge { .. })
        ));
        // The same shapes within the budget decode (zeros: 72 bytes of
        // Value, twice while its array grows, and 32 of its text, per 2
        // bytes of body).
        decode(zeros.as_bytes(), 128 * zeros.len() as u64).expect("within the budget");
        decode(objects.as_bytes(), 128 * objects.len() as u64).expect("within the budget");
    }

    #[test]
    fn issue_22_3_nesting_is_bounded() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        decode(deep(MAX_DEPTH).as_bytes(), 1 << 20).expect("at the limit");
        assert!(matches!(
            decode(deep(MAX_DEPTH + 1).as_bytes(), 1 << 20),
            Err(DecodeError::TooDeep)
        ));
        let objects = format!(
            "{}1{}",
            "{\"a\":".repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        assert!(matches!(
            decode(objects.as_bytes(), 1 << 20),
            Err(DecodeError::TooDeep)
        ));
    }

    /// Issue 39: numbers keep their text, objects the order of their keys.
    #[test]
    fn numbers_keep_their_text_and_objects_their_order() {
        let text = r#"{"z":1,"a":{"y":2,"b":[1e400,-5e-324,123456789012345678901234567890,0.1000000000000000055511151231257827,12.30,-0,1E+2,18446744073709551616,-9223372036854775809,-1,0]},"id":"o1","a2":{}}"#;
        let v = decode(text.as_bytes(), 1 << 20).expect(text);
        // An exponent is spelled `e+N` / `e-N` (serde_json's
        // arbitrary_precision), the number's value unchanged.
        let spelled = text.replace("1e400", "1e+400").replace("1E+2", "1e+2");
        assert_eq!(v.to_string(), spelled);
        assert_eq!(v["a"]["b"][2].to_string(), "123456789012345678901234567890");
        assert_eq!(
            v.pointer("/a/b/4").map(Value::to_string).as_deref(),
            Some("12.30")
        );
        // A duplicate key: its first place, its last value.
        let v = decode(br#"{"a":1,"b":2,"a":3}"#, 1 << 20).expect("duplicate");
        assert_eq!(v.to_string(), r#"{"a":3,"b":2}"#);
    }

    /// serde_json hands a number that is not a 64-bit integer over as a
    /// map from [`NUMBER_KEY`] to its text; an object that has that key of
    /// its own is still an object, whatever its value.
    #[test]
    fn numbers_keep_their_text_and_a_number_key_of_its_own_is_an_object() {
        let v = decode(b"[1.5]", 1 << 20).expect("a number");
        assert!(v[0].is_number(), "{v}");
        for text in [
            r#"{"$serde_json::private::Number":"1.5"}"#,
            r#"{"$serde_json::private::Number":1.5}"#,
            r#"{"$serde_json::private::Number":"x","b":2}"#,
            r#"{"a":1,"$serde_json::private::Number":"2"}"#,
            r#"{"$serde_json::private::Number":{"$serde_json::private::Number":"2"}}"#,
        ] {
            let v = decode(text.as_bytes(), 1 << 20).expect(text);
            assert!(v.is_object(), "{text}: {v}");
            assert_eq!(v.to_string(), text);
        }
    }

    /// A spooled page's records read back as they were decoded.
    #[test]
    fn values_read_back_as_decoded() {
        #[derive(serde::Deserialize)]
        struct Page {
            #[serde(deserialize_with = "values")]
            records: Vec<Value>,
        }
        let records = r#"[{"$serde_json::private::Number":"7"},{"$serde_json::private::Number":"x"},{"z":123456789012345678901234567890,"a":12.30}]"#;
        let page: Page = serde_json::from_str(&format!(r#"{{"records":{records}}}"#)).unwrap();
        assert_eq!(Value::Array(page.records).to_string(), records);
    }

    /// Issue 39: a BOM, a lone surrogate and bytes invalid in UTF-8 decode.
    #[test]
    fn text_that_is_not_as_sent_decodes_with_u_fffd() {
        let t = text::text(
            b"\xEF\xBB\xBF{\"items\":[{\"t\":\"a\\ud800b\"},{\"t\":\"caf\xE9\"},{}]}",
            None,
        );
        let d = decode_text(&t, "/items", 1 << 20).expect("decodes");
        assert_eq!(d.body["items"][0]["t"], "a\u{FFFD}b");
        assert_eq!(d.body["items"][1]["t"], "caf\u{FFFD}");
        assert_eq!(
            d.altered,
            Altered {
                invalid_utf8: 1,
                lone_surrogate: 1,
                duplicate_key: 0,
            }
        );
        let t = text::text(br#"{"items":[{"a":1,"a":2},{"a":1}]}"#, None);
        let d = decode_text(&t, "/items", 1 << 20).expect("decodes");
        assert_eq!(d.altered.duplicate_key, 1);
    }
}
