//! Daemons on fixed cron ticks ([`start_before_first_tick`]), and readers
//! for what the daemons of the world's config ([`super::world`]) leave
//! behind: tick claims and outcome hashes in Redis, the queue's state, the
//! sink's records of [`JOB`].

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde_json::Value;

use super::config::{TestConfig, Worker};
use super::keys::{any_tick, apalis, keys};
use super::world::{self, JOB};

/// Outcome fields of a tick hash that end a task's chain.
pub const TERMINAL: [&str; 5] = [
    "done",
    "quota_exhausted",
    "upstream_throttled",
    "failed",
    "superseded",
];

/// `n` ticks `every_secs` apart (UTC, whole seconds, all in one minute, the
/// first at least `lead` from now) as a cron expression that fires exactly
/// then, and their times in ms.
pub fn fixed_ticks(n: u32, every_secs: u32, lead: Duration) -> (String, Vec<i64>) {
    assert!(n >= 1 && every_secs >= 1 && (n - 1) * every_secs < 60);
    let earliest = Utc::now() + chrono::Duration::from_std(lead).expect("lead");
    let mut first =
        earliest.with_nanosecond(0).expect("whole second") + chrono::Duration::seconds(1);
    while !first.second().is_multiple_of(every_secs) {
        first += chrono::Duration::seconds(1);
    }
    if first.second() + (n - 1) * every_secs > 59 {
        // Would cross into the next minute: start at its beginning instead.
        first = first.with_second(0).expect("second 0") + chrono::Duration::minutes(1);
    }
    let ticks: Vec<DateTime<Utc>> = (0..n)
        .map(|i| first + chrono::Duration::seconds(i64::from(i * every_secs)))
        .collect();
    let seconds: Vec<String> = ticks.iter().map(|t| t.second().to_string()).collect();
    let cron = format!(
        "{} {} {} {} {} * {}",
        seconds.join(","),
        first.minute(),
        first.hour(),
        first.day(),
        first.month(),
        first.year()
    );
    (cron, ticks.iter().map(|t| t.timestamp_millis()).collect())
}

/// Sets a test up with `start` (given the cron schedule of [`fixed_ticks`]`(n,
/// every_secs, lead)`, it starts everything the test needs and returns once
/// the daemons run) and returns what it started with the ticks' times, once
/// the daemons ran before the first tick. On a machine so loaded that they
/// came up after it, everything started is dropped (processes stopped by
/// their pid) and set up afresh with later ticks, three times at most: a tick
/// that fell due before the daemons ran says nothing about the product, and
/// the tests that use this check every tick.
pub fn start_before_first_tick<T>(
    n: u32,
    every_secs: u32,
    lead: Duration,
    mut start: impl FnMut(String) -> T,
) -> (T, Vec<i64>) {
    for attempt in 1..=3 {
        let (schedule, ticks) = fixed_ticks(n, every_secs, lead);
        let started = start(schedule);
        let now = Utc::now().timestamp_millis();
        if now < ticks[0] {
            return (started, ticks);
        }
        eprintln!(
            "attempt {attempt}: the daemons ran {} ms after the first tick; setting up again",
            now - ticks[0]
        );
    }
    panic!("three times the daemons took longer than {lead:?} to start");
}

/// The world's config ([`super::world::config`]) with its job paging
/// `pages` pages of the simulator at `base` on the cron `schedule` (of
/// [`fixed_ticks`]), eight worker slots and `recover_after = "6s"`: the
/// daemons on fixed ticks.
pub fn on_ticks(base: &str, pages: u32, schedule: &str) -> TestConfig {
    world::config(world::job(base).pages(pages).schedule(schedule))
        .worker(Worker::default().concurrency(8).recover_after("6s"))
        .write()
}

/// The claimed ticks of [`JOB`]: tick ms → who claimed it.
pub fn tick_claims(conn: &mut redis::Connection) -> HashMap<i64, String> {
    let pattern = any_tick(|t| keys().tick_claim(JOB, t));
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(conn).expect("KEYS");
    let mut claims = HashMap::new();
    for k in keys {
        let Some(ms) = k.rsplit(':').next().and_then(|s| s.parse::<i64>().ok()) else {
            continue; // the outcome hashes end in ":outcomes"
        };
        let by: String = redis::cmd("GET").arg(&k).query(conn).expect("GET claim");
        claims.insert(ms, by);
    }
    claims
}

/// The outcome hash of [`JOB`]'s tick `tick`.
pub fn tick_outcomes(conn: &mut redis::Connection, tick: i64) -> HashMap<String, i64> {
    redis::cmd("HGETALL")
        .arg(keys().tick_outcomes(JOB, tick))
        .query(conn)
        .expect("HGETALL outcomes")
}

/// Tasks of a tick that ended (terminal outcomes).
pub fn ended(outcomes: &HashMap<String, i64>) -> i64 {
    TERMINAL
        .iter()
        .map(|k| outcomes.get(*k).copied().unwrap_or(0))
        .sum()
}

/// Waits up to `timeout` until each of `ticks` has `items` tasks ended;
/// returns their outcome hashes (as they are at the deadline if not).
pub fn wait_ticks_ended(
    conn: &mut redis::Connection,
    ticks: &[i64],
    items: i64,
    timeout: Duration,
) -> (bool, HashMap<i64, HashMap<String, i64>>) {
    let mut all = HashMap::new();
    let ok = super::wait_every(timeout, Duration::from_millis(50), || {
        all = (ticks.iter())
            .map(|t| (*t, tick_outcomes(conn, *t)))
            .collect();
        all.values().all(|o| ended(o) >= items)
    });
    (ok, all)
}

/// Every record the sink of [`JOB`] wrote, as `(region, record id)`.
pub fn sink_records(cfg: &TestConfig) -> Vec<(String, String)> {
    let dir = cfg.join(Path::new("data").join(JOB));
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let region = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for line in text.lines() {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: bad line {line:?}: {e}", path.display()));
            let id = v["record"]["id"].as_str().unwrap_or_default().to_owned();
            out.push((region.clone(), id));
        }
    }
    out
}

/// Asserts that the sink of [`JOB`] holds `n` records, none twice.
pub fn assert_sink_once(cfg: &TestConfig, n: usize) {
    let records = sink_records(cfg);
    let distinct: std::collections::HashSet<_> = records.iter().collect();
    assert_eq!(records.len(), n, "records in the sink");
    assert_eq!(distinct.len(), records.len(), "a record stored twice");
}

/// Where the tasks of the queue are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueState {
    /// In our backlog (zset).
    pub backlog: u64,
    /// In apalis's scheduled set.
    pub scheduled: u64,
    /// In apalis's active list (waiting for a worker).
    pub active: u64,
    /// In some worker's in-flight set (fetched, not acked).
    pub inflight: u64,
}

impl QueueState {
    /// Tasks waiting to be fetched.
    pub fn waiting(&self) -> u64 {
        self.backlog + self.scheduled + self.active
    }
}

/// Reads [`QueueState`].
pub fn queue_state(conn: &mut redis::Connection) -> QueueState {
    let q = apalis();
    let (backlog, scheduled, active): (u64, u64, u64) = redis::pipe()
        .zcard(keys().backlog())
        .zcard(q.scheduled_jobs_set())
        .llen(q.active_jobs_list())
        .query(conn)
        .expect("queue sizes");
    let sets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*", q.inflight_jobs_set()))
        .query(conn)
        .expect("KEYS inflight");
    let mut inflight = 0;
    for s in sets {
        let n: u64 = redis::cmd("SCARD").arg(&s).query(conn).expect("SCARD");
        inflight += n;
    }
    QueueState {
        backlog,
        scheduled,
        active,
        inflight,
    }
}

/// The worker names registered in apalis's workers set.
pub fn workers(conn: &mut redis::Connection) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(apalis().workers_set())
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("ZRANGE workers")
}
