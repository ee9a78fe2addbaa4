//! Where a job's fan-out item stands, read from the keys the worker keeps
//! for it (SPEC Part 4, "Item state"): the last run (tick, outcome, when it
//! ended: `queue::scripts::finish::LastRun`), where the next run resumes
//! (the checkpoint, `worker::Checkpoint`, with its `fetch::paging::Cursor`),
//! `{since}`, page 1's validators, and who holds the item now
//! (`worker::Holder`). `quota-worker state` and the status page's
//! `/api/state/JOB` read through here; `reset` starts an item over.
//!
//! Every key name comes from [`KeySpace`] and every value is read with the
//! type its writer writes: this module keeps no copy of the layout.
//!
//! Which items a job has: the ones its fan-out gives now (the caller reads
//! them: `schedule::TickItems`) and the ones Redis still holds state for
//! ([`held_items`]: a `SCAN` with a match, in bounded steps, so a large
//! Redis is never blocked; there is no per-job index of items to read
//! instead).

pub(crate) mod items;
pub(crate) mod reset;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::conn::Conn;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use crate::fetch::paging::Validators;
use crate::keys::KeySpace;
use crate::queue::scripts::finish::LastRun;
use crate::worker::{Checkpoint, Holder};

/// Items read per `MGET` (six keys each).
const READ_BATCH: usize = 500;
/// Keys `SCAN` looks at per step.
const SCAN_COUNT: usize = 1000;

/// One item's state, as `state --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct ItemState {
    /// The item, as `trigger --wait` names it (`region=US`).
    pub(crate) item: String,
    /// Whether the job's fan-out gives it now (`false`: only Redis still
    /// holds state for it).
    pub(crate) in_fan_out: bool,
    /// The tick (ms since the epoch) of its last run: the newest of its
    /// last recorded end, its checkpoint and its last complete run.
    pub(crate) last_tick: Option<i64>,
    /// How that run ended; `None` when no end is recorded for it (it is
    /// running, or its daemon stopped before it ended).
    pub(crate) outcome: Option<String>,
    /// When it ended (RFC 3339, UTC).
    pub(crate) ended_at: Option<String>,
    /// The page its next run resumes at; `None`: it starts at page 1.
    pub(crate) resume_page: Option<u32>,
    /// The rest of the checkpoint's cursor (the cursor or next URL as
    /// stored, the secret written `{secret}`; where the run began), as the
    /// checkpoint holds it; `None` with no checkpoint.
    pub(crate) cursor: Option<serde_json::Value>,
    /// The `{since}` its next run sends (RFC 3339, UTC): the interrupted
    /// run's when it resumes one, else the start of its last complete run
    /// (or what `state reset --since` set); `None`: now − `since_initial`.
    pub(crate) since: Option<String>,
    /// The `ETag` / `Last-Modified` its next run sends with page 1
    /// (`conditional = true`).
    pub(crate) validators: Option<Validators>,
    /// The task that holds the item now, and its daemon's `host:pid`.
    pub(crate) held_by: Option<Holder>,
    /// The last run's detail (why it ended so), as logged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) detail: Option<String>,
    /// Values that did not read (a foreign writer's, another version's):
    /// the key and why. The worker fails such an item's tasks rather than
    /// start it over; `state reset` clears the checkpoint, `{since}` and
    /// validators.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) unreadable: Vec<String>,
}

/// A job's items' state, as `state --json` and `/api/state/JOB` print it
/// (fields in this order).
#[derive(Debug, Serialize)]
pub(crate) struct Listing<'a> {
    /// The job.
    pub(crate) job: &'a str,
    /// Its items.
    pub(crate) items: &'a [ItemState],
    /// `/api/state/JOB`: whether every item is listed (an answer is cut at
    /// a number of items and a time budget); absent from `state --json`,
    /// which lists every item.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) complete: Option<bool>,
    /// With `complete: false`: the command that lists every item.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) every_item: Option<String>,
}

/// An item's keys, in the order [`read`] asks for them.
fn item_keys(keys: &KeySpace, job: &str, item: &str) -> [String; 6] {
    [
        keys.cursor(job, item),
        keys.item_ran(job, item),
        keys.since(job, item),
        keys.validators(job, item),
        keys.item_lock(job, item),
        keys.item_last(job, item),
    ]
}

/// The state of each of `items` of `job` (`true`: the fan-out gives it
/// now), in their order.
pub(crate) async fn read(
    conn: &mut Conn,
    keys: &KeySpace,
    job: &str,
    items: &[(String, bool)],
) -> redis::RedisResult<Vec<ItemState>> {
    let mut out = Vec::with_capacity(items.len());
    for batch in items.chunks(READ_BATCH) {
        let mut mget = redis::cmd("MGET");
        for (item, _) in batch {
            mget.arg(&item_keys(keys, job, item));
        }
        let values: Vec<Option<String>> = mget.query_async(conn).await?;
        for ((item, in_fan_out), v) in batch.iter().zip(values.chunks(6)) {
            let names = item_keys(keys, job, item);
            out.push(state_of(item, *in_fan_out, &names, v));
        }
    }
    Ok(out)
}

/// Whether Redis holds any state for `item` of `job`.
pub(crate) async fn has_state(
    conn: &mut Conn,
    keys: &KeySpace,
    job: &str,
    item: &str,
) -> redis::RedisResult<bool> {
    let n: u64 = redis::cmd("EXISTS")
        .arg(&item_keys(keys, job, item))
        .query_async(conn)
        .await?;
    Ok(n > 0)
}

/// The items of `job` Redis holds state for, found by `SCAN` with a match
/// ([`KeySpace::items_pattern`]), in steps of [`SCAN_COUNT`] keys; at most
/// `limit` of them (`true` when there are more).
pub(crate) async fn held_items(
    conn: &mut Conn,
    keys: &KeySpace,
    job: &str,
    limit: usize,
) -> redis::RedisResult<(BTreeSet<String>, bool)> {
    let pattern = keys.items_pattern(job);
    let mut found = BTreeSet::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT)
            .query_async(conn)
            .await?;
        for key in &batch {
            if let Some(item) = keys.item_of(job, key) {
                found.insert(item.to_owned());
            }
        }
        if found.len() > limit {
            let more: BTreeSet<String> = found.into_iter().take(limit).collect();
            return Ok((more, true));
        }
        if next == 0 {
            return Ok((found, false));
        }
        cursor = next;
    }
}

/// Epoch seconds as RFC 3339, UTC, whole seconds (as `{since}` is sent).
pub(crate) fn rfc3339(epoch_s: i64) -> String {
    DateTime::<Utc>::from_timestamp(epoch_s, 0)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true))
        .unwrap_or_else(|| epoch_s.to_string())
}

/// A tick (ms since the epoch) as RFC 3339, UTC, with milliseconds.
pub(crate) fn tick_time(tick_ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(tick_ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| tick_ms.to_string())
}

/// `quota-worker ARGS` as one shell command line: each word as it is when
/// it is plain, else single-quoted (items come from data).
pub(crate) fn command_line(args: &[&str]) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=.,/:@%+".contains(c);
    let word = |s: &str| {
        if !s.is_empty() && s.chars().all(plain) {
            s.to_owned()
        } else {
            format!("'{}'", s.replace('\'', r"'\''"))
        }
    };
    let words: Vec<String> = args.iter().map(|a| word(a)).collect();
    format!("quota-worker {}", words.join(" "))
}

/// A checkpoint's cursor without its page number (shown on its own), as
/// the checkpoint's JSON has it: whatever fields the cursor has.
pub(crate) fn cursor_fields(cp: &Checkpoint) -> Option<serde_json::Value> {
    let mut v = serde_json::to_value(&cp.cursor).ok()?;
    if let Some(o) = v.as_object_mut() {
        o.remove("page");
    }
    Some(v)
}

/// Reads what `values` (the item's keys, as [`item_keys`] names them in
/// `names`) hold.
fn state_of(
    item: &str,
    in_fan_out: bool,
    names: &[String],
    values: &[Option<String>],
) -> ItemState {
    let mut unreadable = Vec::new();
    let mut parse = |i: usize, what: &str| -> Option<&str> {
        let raw = values.get(i)?.as_deref()?;
        if raw.is_empty() {
            unreadable.push(format!("{what} at {}: empty", names[i]));
            return None;
        }
        Some(raw)
    };
    let raws = [
        parse(0, "checkpoint"),
        parse(1, "completed tick"),
        parse(2, "{since}"),
        parse(3, "validators"),
        parse(4, "lock"),
        parse(5, "last run"),
    ];
    let mut note = |i: usize, what: &str, e: &dyn std::fmt::Display| {
        unreadable.push(format!("unreadable {what} at {}: {e}", names[i]));
    };
    let cp: Option<Checkpoint> = raws[0].and_then(|r| {
        serde_json::from_str(r)
            .map_err(|e| note(0, "checkpoint", &e))
            .ok()
    });
    let ran: Option<i64> =
        raws[1].and_then(|r| r.parse().map_err(|e| note(1, "completed tick", &e)).ok());
    let since: Option<i64> =
        raws[2].and_then(|r| r.parse().map_err(|e| note(2, "{since}", &e)).ok());
    let validators: Option<Validators> = raws[3].and_then(|r| {
        serde_json::from_str(r)
            .map_err(|e| note(3, "validators", &e))
            .ok()
    });
    let last: Option<LastRun> = raws[5].and_then(|r| {
        serde_json::from_str(r)
            .map_err(|e| note(5, "last run", &e))
            .ok()
    });
    let last_tick = [
        last.as_ref().map(|l| l.tick),
        cp.as_ref().map(|c| c.tick),
        ran,
    ]
    .into_iter()
    .flatten()
    .max();
    // The recorded end is the last run's only if no newer run began; a
    // completed tick without a record (written before records were kept)
    // says `done`, with no time.
    let ended = last.as_ref().filter(|l| Some(l.tick) == last_tick);
    let outcome = match (ended, ran) {
        (Some(l), _) => Some(l.outcome.clone()),
        (None, Some(r)) if Some(r) == last_tick => Some("done".to_owned()),
        _ => None,
    };
    ItemState {
        item: item.to_owned(),
        in_fan_out,
        last_tick,
        outcome,
        ended_at: ended.map(|l| rfc3339(l.ended_at)),
        resume_page: cp.as_ref().map(|c| c.cursor.page),
        cursor: cp.as_ref().and_then(cursor_fields),
        since: cp.as_ref().and_then(|c| c.since).or(since).map(rfc3339),
        validators: validators.filter(|v| !v.is_empty()),
        held_by: raws[4].map(Holder::parse),
        detail: ended.map(|l| l.detail.clone()).filter(|d| !d.is_empty()),
        unreadable,
    }
}

/// How long what `state reset --since` sets lives: as long as a complete
/// run's `{since}` (`worker::ITEM_STATE_TTL`).
pub(crate) const SINCE_TTL: Duration = crate::worker::ITEM_STATE_TTL;

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        item_keys(&KeySpace::new("qw"), "j", "region=US").to_vec()
    }

    fn read_one(values: [Option<&str>; 6]) -> ItemState {
        let values: Vec<Option<String>> = values.iter().map(|v| v.map(str::to_owned)).collect();
        state_of("region=US", true, &names(), &values)
    }

    #[test]
    fn an_item_with_no_state_starts_at_page_1() {
        let s = read_one([None; 6]);
        assert_eq!(
            (s.last_tick, s.outcome, s.resume_page, s.since, s.held_by),
            (None, None, None, None, None)
        );
        assert!(s.unreadable.is_empty());
    }

    /// A run stopped by the quota at page 3: its checkpoint says where the
    /// next run resumes and with which `{since}`; its recorded end says how
    /// and when it ended.
    #[test]
    fn a_run_stopped_by_the_quota_resumes_at_its_page() {
        let cp = r#"{"tick":1700000000000,"page":3,"token":"c3","first":1,"since":1699990000,"started":1700000000}"#;
        let last = r#"{"tick":1700000000000,"outcome":"quota_exhausted","ended_at":1700000004,"page":3,"pages":2,"detail":"window 1 said no"}"#;
        let s = read_one([
            Some(cp),
            Some("1690000000000"),
            Some("1600000000"),
            Some(r#"{"etag":"\"v1\""}"#),
            None,
            Some(last),
        ]);
        assert_eq!(s.last_tick, Some(1_700_000_000_000));
        assert_eq!(s.outcome.as_deref(), Some("quota_exhausted"));
        assert_eq!(s.ended_at.as_deref(), Some("2023-11-14T22:13:24Z"));
        assert_eq!(s.resume_page, Some(3));
        assert_eq!(
            s.cursor,
            Some(serde_json::json!({"token": "c3", "first": 1}))
        );
        // The interrupted run's {since}, not the last complete run's.
        assert_eq!(s.since.as_deref(), Some("2023-11-14T19:26:40Z"));
        assert_eq!(s.validators.and_then(|v| v.etag).as_deref(), Some("\"v1\""));
        assert_eq!(s.detail.as_deref(), Some("window 1 said no"));
    }

    /// A run that began after the last recorded end (running now, or its
    /// daemon was killed) has no outcome yet; an item completed before ends
    /// were recorded reads `done`.
    #[test]
    fn the_outcome_is_the_newest_runs_or_none() {
        let cp = r#"{"tick":20,"page":2,"token":null}"#;
        let last = r#"{"tick":10,"outcome":"done","ended_at":1,"page":1,"pages":1}"#;
        let s = read_one([Some(cp), None, None, None, Some("j:20:0#n@h:1"), Some(last)]);
        assert_eq!((s.last_tick, s.outcome), (Some(20), None));
        let held = s.held_by.expect("held");
        assert_eq!(
            (held.task.as_str(), held.host.as_deref()),
            ("j:20:0", Some("h:1"))
        );
        let s = read_one([None, Some("30"), Some("5"), None, None, None]);
        assert_eq!(
            (s.last_tick, s.outcome.as_deref()),
            (Some(30), Some("done"))
        );
        assert_eq!(s.since.as_deref(), Some("1970-01-01T00:00:05Z"));
    }

    #[test]
    fn an_item_is_quoted_for_the_shell_only_when_it_must_be() {
        assert_eq!(
            command_line(&["state", "j", "region=US,lang=en"]),
            "quota-worker state j region=US,lang=en"
        );
        assert_eq!(
            command_line(&["state", "j", "q=it's me"]),
            r"quota-worker state j 'q=it'\''s me'"
        );
        assert_eq!(
            command_line(&["state", "j", "a=$(x)"]),
            "quota-worker state j 'a=$(x)'"
        );
    }

    #[test]
    fn a_value_that_does_not_read_is_named() {
        let s = read_one([Some("{not json"), Some("soon"), None, None, None, None]);
        assert_eq!(s.unreadable.len(), 2, "{:?}", s.unreadable);
        assert!(s.unreadable[0].contains("checkpoint at qw:cursor:j:region=US"));
        assert!(s.unreadable[1].contains("completed tick at qw:ran:j:region=US"));
        assert_eq!(s.resume_page, None);
    }
}
