//! Issue 39: records are stored exactly as they came. A body's byte order
//! mark, its `charset`, a byte invalid in it or a lone surrogate escape
//! never sinks a page: the text is decoded as sent, what cannot be is
//! U+FFFD, the page's other records are stored, the task is `done`, and
//! each record altered is counted (`qw_records_altered_total`, with a
//! record that sent a key twice). Numbers
//! keep their digits in every sink (`1e400`, `-5e-324`, 30 digits, 34
//! digits, `12.30`; an exponent spelled `e+N`), a key from a number is
//! its digits as sent, and a
//! record's keys keep their order, nested objects too. The real binary as
//! a daemon, a real `redis-server` (and PostgreSQL), the hostile
//! upstream's canned answers with exact bytes and headers on loopback.

use serde_json::Value;

use crate::support::canned::CannedRig;
use crate::support::hostile::Hostile;
use crate::support::http::scrape;
use crate::support::postgres::Postgres;
use crate::support::{Job, Sink};

const SECRET: &str = "k3y-for-issue-39";

/// The records of `v`'s JSON lines file, each as the text of its line's
/// `record` (cut out of the line, not decoded and encoded again).
fn record_texts(rig: &CannedRig, v: &str) -> Vec<String> {
    let path = rig.cfg.join(format!("data/leak/{v}.jsonl"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let at = line.find(",\"record\":").expect("a record in the line") + 10;
            line[at..line.len() - 1].to_owned()
        })
        .collect()
}

fn done(outcomes: &[Value], v: &str) {
    let o = CannedRig::outcome(outcomes, v);
    assert_eq!(o["outcome"], "done", "{o}");
}

/// The issue's table, first four rows: a BOM before `{`, a lone surrogate
/// escape, a Latin-1 byte in a UTF-8 body, a Latin-1 body that says so.
/// Each page ended `failed` with 0 of its records stored ("not JSON").
#[test]
fn issue_39_text_as_sent_a_bom_a_lone_surrogate_a_latin1_byte_and_a_charset() {
    let upstream = Hostile::start();
    let two = |odd: &[u8]| {
        let mut body = b"{\"items\":[{\"id\":\"odd\",\"t\":\"".to_vec();
        body.extend_from_slice(odd);
        body.extend_from_slice(b"\"},{\"id\":\"plain\",\"t\":\"\\ud83d\\ude00 ok\"}]}");
        body
    };
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(two(b"caf\xC3\xA9"));
    upstream.answer("bom", 200, &[], bom);
    upstream.answer("surrogate", 200, &[], two(b"a\\ud800b"));
    upstream.answer("latin1", 200, &[], two(b"caf\xE9"));
    let latin1: &[u8] = b"application/json; charset=iso-8859-1";
    upstream.answer("charset", 200, &[("content-type", latin1)], two(b"caf\xE9"));
    // A key sent twice: the last value, at the first place.
    upstream.answer(
        "twice",
        200,
        &[],
        r#"{"items":[{"id":"odd","t":1,"x":0,"t":2},{"id":"plain","t":"\ud83d\ude00 ok"}]}"#,
    );
    // Still refused: a body that is not JSON at all.
    upstream.answer(
        "html",
        200,
        &[("content-type", latin1)],
        "<html>caf\u{e9}</html>",
    );
    let items = ["bom", "surrogate", "latin1", "charset", "twice", "html"];
    let rig = CannedRig::start(&upstream, SECRET, CannedRig::endpoint(), &items);
    let (outcomes, _) = rig.tick(items.len());
    let plain = r#"{"id":"plain","t":"😀 ok"}"#;
    for (v, odd) in [
        ("bom", "café"),
        ("surrogate", "a\u{FFFD}b"),
        ("latin1", "caf\u{FFFD}"),
        ("charset", "café"),
    ] {
        done(&outcomes, v);
        assert_eq!(
            record_texts(&rig, v),
            [format!(r#"{{"id":"odd","t":"{odd}"}}"#), plain.to_owned()],
            "{v}"
        );
    }
    done(&outcomes, "twice");
    assert_eq!(
        record_texts(&rig, "twice"),
        [r#"{"id":"odd","t":2,"x":0}"#, plain]
    );
    let html = CannedRig::outcome(&outcomes, "html");
    assert_eq!(html["outcome"], "failed", "{html}");
    assert!(
        CannedRig::message(html).starts_with("bad response: not JSON"),
        "{html}"
    );
    let m = scrape(rig.port);
    let altered = |reason| {
        m.sum(
            "qw_records_altered_total",
            &[("qw_job", "leak"), ("reason", reason)],
        )
    };
    assert_eq!(
        (
            altered("invalid_utf8"),
            altered("lone_surrogate"),
            altered("duplicate_key")
        ),
        (1.0, 1.0, 1.0),
        "{}",
        m.text
    );
}

/// The numbers of the issue's table, one record.
const NUMBERS: &str = r#"{"id":"n1","big":1e400,"tiny":-5e-324,"int30":123456789012345678901234567890,"dec34":0.1000000000000000055511151231257827,"price":12.30}"#;

/// [`NUMBERS`] as stored: every digit, `12.30` as sent; an exponent
/// spelled `e+N` (serde_json's `arbitrary_precision`; the value is the
/// same, docs/jobs.md "What the product does to a record").
const NUMBERS_STORED: &str = r#"{"id":"n1","big":1e+400,"tiny":-5e-324,"int30":123456789012345678901234567890,"dec34":0.1000000000000000055511151231257827,"price":12.30}"#;

/// Two records whose ids differ in the 30th digit: one row each.
const TWO_IDS: &str =
    r#"[{"id":123456789012345678901234567890,"n":1},{"id":123456789012345678901234567891,"n":2}]"#;

/// A record whose keys are not sorted, nested too.
const ORDERED: &str = r#"{"z":1,"a":{"y":[{"q":1,"b":2}],"b":3},"id":"o1","m":null}"#;

fn page(records: &str) -> String {
    format!(r#"{{"items":{records}}}"#)
}

/// Numbers and key order in a JSON lines file: the record's text is the
/// upstream's (`12.30` stays `12.30`), keys in the order sent.
#[test]
fn issue_39_jsonl_keeps_every_digit_and_the_key_order() {
    let upstream = Hostile::start();
    upstream.answer("numbers", 200, &[], page(&format!("[{NUMBERS}]")));
    upstream.answer("ordered", 200, &[], page(&format!("[{ORDERED}]")));
    let rig = CannedRig::start(
        &upstream,
        SECRET,
        CannedRig::endpoint(),
        &["numbers", "ordered"],
    );
    let (outcomes, _) = rig.tick(2);
    done(&outcomes, "numbers");
    done(&outcomes, "ordered");
    assert_eq!(record_texts(&rig, "numbers"), [NUMBERS_STORED]);
    assert_eq!(record_texts(&rig, "ordered"), [ORDERED]);
}

/// Numbers in a SQLite sink: the `record` column holds the upstream's
/// text, and a key from a number is its digits: two 30-digit ids are two
/// rows.
#[test]
fn issue_39_sqlite_keeps_every_digit_and_keys_30_digit_ids_apart() {
    let upstream = Hostile::start();
    upstream.answer("numbers", 200, &[], page(&format!("[{NUMBERS}]")));
    upstream.answer("ids", 200, &[], page(TWO_IDS));
    let job = CannedRig::job(&upstream)
        .fan_out("v", ["numbers", "ids"])
        .sink(
            Sink::sqlite("data/{job}.sqlite")
                .records("/items")
                .key("/id"),
        );
    let rig = CannedRig::start_job(SECRET, CannedRig::endpoint(), job, &[]);
    let (outcomes, _) = rig.tick(2);
    done(&outcomes, "numbers");
    done(&outcomes, "ids");
    let db = rusqlite::Connection::open(rig.cfg.join("data/leak.sqlite")).expect("open");
    let rows: Vec<(String, String)> = db
        .prepare("SELECT record_key, record FROM leak ORDER BY record_key")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        rows,
        [
            (
                "123456789012345678901234567890".to_owned(),
                r#"{"id":123456789012345678901234567890,"n":1}"#.to_owned()
            ),
            (
                "123456789012345678901234567891".to_owned(),
                r#"{"id":123456789012345678901234567891,"n":2}"#.to_owned()
            ),
            ("n1".to_owned(), NUMBERS_STORED.to_owned()),
        ]
    );
}

/// Numbers in a PostgreSQL sink: jsonb holds each as the same numeric
/// (`12.30` with its scale), and two 30-digit ids are two rows keyed by
/// their digits.
#[test]
fn issue_39_postgres_keeps_every_digit_and_keys_30_digit_ids_apart() {
    let pg = Postgres::start();
    pg.role("ingest", "pg-Pw-39");
    let upstream = Hostile::start();
    upstream.answer("numbers", 200, &[], page(&format!("[{NUMBERS}]")));
    upstream.answer("ids", 200, &[], page(TWO_IDS));
    let sink = Sink::postgres(&pg.url("ingest", "ingest"))
        .password_file("pgpass")
        .table("exact")
        .records("/items")
        .key("/id");
    let job: Job = CannedRig::job(&upstream)
        .fan_out("v", ["numbers", "ids"])
        .sink(sink);
    let rig = CannedRig::start_job(
        SECRET,
        CannedRig::endpoint(),
        job,
        &[("pgpass", "pg-Pw-39\n")],
    );
    let (outcomes, _) = rig.tick(2);
    done(&outcomes, "numbers");
    done(&outcomes, "ids");
    let exact = pg.query(
        "ingest",
        "SELECT (record->'big')::numeric = 1e400, (record->'tiny')::numeric = -5e-324, \
         record->>'int30', record->>'dec34', record->>'price' FROM exact WHERE key = 'n1'",
    );
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        exact,
        [vec![
            some("t"),
            some("t"),
            some("123456789012345678901234567890"),
            some("0.1000000000000000055511151231257827"),
            some("12.30"),
        ]]
    );
    let ids = pg.query(
        "ingest",
        "SELECT key, record->>'id', record->>'n' FROM exact WHERE key <> 'n1' ORDER BY key",
    );
    assert_eq!(
        ids,
        [
            vec![
                some("123456789012345678901234567890"),
                some("123456789012345678901234567890"),
                some("1")
            ],
            vec![
                some("123456789012345678901234567891"),
                some("123456789012345678901234567891"),
                some("2")
            ],
        ]
    );
}
