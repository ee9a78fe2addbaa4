//! A page's records as every sink kind sees them: where they are in the body
//! ([`records`]), which page they came from ([`PageRef`]), each record's key
//! and JSON text, the item as one column's text, and a search's [`Hit`].
//! What the SQLite and PostgreSQL sinks share sits here, below both.

use serde_json::Value;

use super::SinkError;
use crate::config::{Item, Job};

/// Which page of which run a write is: with the job and the item, the
/// page's id in a postgres sink, the same for every fetch of that page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRef {
    /// The run's tick (ms since the epoch).
    pub tick: i64,
    /// The page number in the run (1 = first).
    pub page: u32,
}

/// The records of a page: the array `pointer` finds in `body`.
pub(super) fn records<'a>(body: &'a Value, pointer: &str) -> Result<&'a [Value], SinkError> {
    let bad = |problem: String| SinkError::BadRecords {
        pointer: pointer.to_owned(),
        problem,
    };
    if pointer.is_empty() {
        return match body {
            Value::Array(a) => Ok(a),
            Value::Object(_) => Ok(std::slice::from_ref(body)),
            other => Err(bad(format!(
                "(the whole body) is {}, not an array or object",
                json_kind(other)
            ))),
        };
    }
    match body.pointer(pointer) {
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(bad(format!("is {}, not an array", json_kind(other)))),
        None => Err(bad("is missing from the response".to_owned())),
    }
}

pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `item` column: the fan-out item as a JSON object with its keys
/// sorted, so the same item is the same text whatever order its keys were
/// configured in (the `UNIQUE (item, record_key)` constraint compares it).
pub(super) fn item_column(item: &Item) -> String {
    let mut pairs: Vec<(&String, &String)> = item.iter().map(|(k, v)| (k, v)).collect();
    pairs.sort();
    let map: serde_json::Map<String, Value> = pairs
        .into_iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    sorted_json(&Value::Object(map))
}

/// A JSON object's text with its keys sorted, whatever map type serde_json
/// was built with.
pub(super) fn sorted_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), sorted_json(&m[k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        other => other.to_string(),
    }
}

/// A record's unique id at `pointer`: a string as is, anything else as its
/// JSON text; `None` when absent or null.
pub(super) fn key_of(record: &Value, pointer: &str) -> Option<String> {
    match record.pointer(pointer)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The text the full-text index sees: every string at each of `fields`
/// (strings inside arrays and objects there too, e.g. a tags list), one per
/// line.
pub(super) fn search_text(record: &Value, fields: &[String]) -> String {
    fn collect<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            Value::Object(o) => o.values().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    let mut parts = Vec::new();
    for field in fields {
        if let Some(v) = record.pointer(field) {
            collect(v, &mut parts);
        }
    }
    parts.join("\n")
}

/// A record's key and its JSON text.
pub(super) type KeyedRow = (Option<String>, String);

/// Each record with its key (`None` without `sink.key`, or when the record
/// has no value there) and its JSON text; and how many had no key value.
pub(super) fn keyed_rows<'a>(
    job: &Job,
    records: impl ExactSizeIterator<Item = &'a Value>,
) -> Result<(Vec<KeyedRow>, usize), SinkError> {
    let mut missing = 0usize;
    let mut rows = Vec::with_capacity(records.len());
    for record in records {
        let key = (job.sink.key.as_deref()).and_then(|p| key_of(record, p));
        if job.sink.key.is_some() && key.is_none() {
            missing += 1;
        }
        rows.push((
            key,
            serde_json::to_string(record).map_err(SinkError::Encode)?,
        ));
    }
    Ok((rows, missing))
}

/// Logs that `missing_keys` records of a page had no value at `sink.key`.
pub(super) fn warn_missing_keys(job: &Job, missing_keys: usize) {
    if missing_keys > 0 {
        tracing::warn!(
            job = %job.name,
            missing_keys,
            key = job.sink.key.as_deref().unwrap_or_default(),
            "records without a key value are stored without one: re-fetches of them add rows"
        );
    }
}

/// One match of a search ([`find`](super::find) in a SQLite sink,
/// [`find_postgres`](super::find_postgres) in a PostgreSQL one).
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The record's item (its fan-out values), as stored.
    pub item: Value,
    /// The record's key (`sink.key`), if it has one.
    pub key: Option<String>,
    /// When it was fetched (RFC 3339, UTC).
    pub fetched_at: String,
    /// The matching part of its indexed text, matches in `[...]`.
    pub snippet: String,
    /// The record itself.
    pub record: Value,
    /// FTS5's `bm25` rank: lower is better.
    pub rank: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_records() {
        let body = json!({"items": [{"id": 1}, {"id": 2}], "next": "x", "n": 3});
        assert_eq!(records(&body, "/items").expect("array").len(), 2);
        assert_eq!(records(&body, "").expect("object").len(), 1);
        assert_eq!(records(&json!([1, 2, 3]), "").expect("array").len(), 3);
        assert_eq!(
            records(&json!({"items": []}), "/items")
                .expect("empty")
                .len(),
            0
        );
        for (body, pointer, problem) in [
            (&body, "/missing", "is missing from the response"),
            (&body, "/next", "is a string, not an array"),
            (&body, "/n", "is a number, not an array"),
            (
                &json!("x"),
                "",
                "(the whole body) is a string, not an array or object",
            ),
        ] {
            let err = records(body, pointer).expect_err(pointer);
            assert!(err.is_bad_response());
            assert!(
                matches!(&err, SinkError::BadRecords { problem: p, .. } if p == problem),
                "{err}"
            );
        }
    }

    #[test]
    fn keys_are_strings_or_json_text() {
        assert_eq!(key_of(&json!({"id": "a"}), "/id").as_deref(), Some("a"));
        assert_eq!(key_of(&json!({"id": 7}), "/id").as_deref(), Some("7"));
        assert_eq!(
            key_of(&json!({"id": {"videoId": "v"}}), "/id").as_deref(),
            Some(r#"{"videoId":"v"}"#)
        );
        assert_eq!(key_of(&json!({"id": null}), "/id"), None);
        assert_eq!(key_of(&json!({}), "/id"), None);
    }

    #[test]
    fn the_item_column_sorts_its_keys() {
        let item = |p: &[(&str, &str)]| -> Item {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let a = item_column(&item(&[("repo", "a/b"), ("org", "x")]));
        assert_eq!(a, r#"{"org":"x","repo":"a/b"}"#);
        assert_eq!(a, item_column(&item(&[("org", "x"), ("repo", "a/b")])));
        assert_eq!(item_column(&item(&[])), "{}");
        assert_eq!(
            sorted_json(&json!({"b": 1, "a": {"d": 2, "c": "\""}})),
            r#"{"a":{"c":"\"","d":2},"b":1}"#
        );
    }

    #[test]
    fn search_text_takes_strings_under_each_field() {
        let r = json!({"snippet": {"title": "Cats", "tags": ["funny", "pets"], "views": 3},
                       "description": "not indexed"});
        assert_eq!(
            search_text(
                &r,
                &[
                    "/snippet/title".into(),
                    "/snippet/tags".into(),
                    "/none".into()
                ]
            ),
            "Cats\nfunny\npets"
        );
    }
}
