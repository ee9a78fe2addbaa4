//! Decoding an upstream's JSON body, bounded: what decoding builds is
//! charged as it is built, and decoding stops when it would take more than
//! a budget (a small multiple of the endpoint's `max_body`) or nest deeper
//! than [`MAX_DEPTH`]. A body is at most `max_body` bytes, but its decoded
//! form can be many times that: `[0,0,…]` is 2 bytes per element in the
//! body and a 32-byte value plus its share of the array in memory, a small
//! object a B-tree node of ~630 bytes. Without a bound, 16 MiB of `[0,0,…]`
//! took the daemon to 860 MB (issue 22, item 3).
//!
//! The charge is what the allocator is asked for: each array's buffer as it
//! grows, each object's B-tree nodes, each string's bytes rounded up to an
//! allocation. It is an estimate of the heap, not a measure of it, within a
//! small factor of it, and it never undercounts by more than the
//! allocator's own bookkeeping.

use std::fmt;
use std::mem::size_of;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

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

/// Decodes `body` as JSON, building at most `budget` bytes (as charged).
pub(crate) fn decode(body: &[u8], budget: u64) -> Result<Value, DecodeError> {
    let mut state = State {
        left: budget,
        budget,
        depth: 0,
        refused: None,
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let decoded = state
        .charge(size_of::<Value>())
        .map_err(|()| serde_json::Error::custom("over budget"))
        .and_then(|()| Seed(&mut state).deserialize(&mut de))
        .and_then(|v| de.end().map(|()| v));
    match (decoded, state.refused) {
        (Ok(v), _) => Ok(v),
        (Err(_), Some(refused)) => Err(refused),
        (Err(e), None) => Err(DecodeError::Json(e)),
    }
}

/// What one decoding has left to spend, and why it stopped.
struct State {
    left: u64,
    budget: u64,
    depth: usize,
    /// Set when the budget or the depth refused the body: the error that
    /// serde_json carries up is ours, not a syntax error.
    refused: Option<DecodeError>,
}

impl State {
    fn charge(&mut self, bytes: usize) -> Result<(), ()> {
        match self.left.checked_sub(bytes as u64) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.refused = Some(DecodeError::TooLarge { limit: self.budget });
                Err(())
            }
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

/// One node of an object's B-tree (std's leaf holds up to 11 entries).
const BTREE_NODE: usize = 11 * (size_of::<String>() + size_of::<Value>()) + 16;

/// Entries per B-tree node, counted low: nodes split half full.
const BTREE_FILL: usize = 6;

/// Decodes one value, charging `State`.
struct Seed<'s>(&'s mut State);

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl Seed<'_> {
    fn string<E: serde::de::Error>(self, s: String) -> Result<Value, E> {
        self.0
            .charge(heap(s.len()))
            .map_err(|()| E::custom("over budget"))?;
        Ok(Value::String(s))
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

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.string(v.to_owned())
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Value, E> {
        self.string(v)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let state = self.0;
        let over = || A::Error::custom("over budget");
        state.enter().map_err(|()| over())?;
        let mut items: Vec<Value> = Vec::new();
        while let Some(v) = seq.next_element_seed(Seed(&mut *state))? {
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
        let state = self.0;
        let over = || A::Error::custom("over budget");
        state.enter().map_err(|()| over())?;
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let node = if map.len().is_multiple_of(BTREE_FILL) {
                BTREE_NODE
            } else {
                0
            };
            state.charge(node + heap(key.len())).map_err(|()| over())?;
            let v = access.next_value_seed(Seed(&mut *state))?;
            map.insert(key, v);
        }
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
        // The same shapes within the budget decode.
        decode(zeros.as_bytes(), 64 * zeros.len() as u64).expect("within the budget");
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
}
