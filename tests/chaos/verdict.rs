//! After the faults: let the daemons settle, then check the promises from
//! the outside, each from what the parts themselves hold (Redis's tick
//! records, the daemons' logs and `/readyz`, the upstream's request log, the
//! sink's database), and attribute what went wrong to the fault injected
//! last before it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{Value, json};

use crate::faults::{Fault, Injected};
use crate::support::daemon::{ended, tick_claims, tick_outcomes};
use crate::{Args, KINDS, REGIONS, World};

/// Waits up to `timeout` for `cond`, polling every 100 ms.
pub(crate) fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    crate::support::wait_every(timeout, Duration::from_millis(100), cond)
}

/// What the run found.
pub(crate) struct Report {
    seed: u64,
    replicas: u8,
    daemons: usize,
    run_for: Duration,
    faults: Vec<Injected>,
    /// Ticks claimed before the faults ended, and their items lost
    /// (neither ended nor queued after the settling), by tick (ms).
    lost: BTreeMap<i64, i64>,
    /// The same, by when (s since the start).
    lost_at: Vec<(f64, i64)>,
    ticks: usize,
    /// Cron ticks due during the faults that no daemon claimed (fanned
    /// out nothing), as s since the start.
    missed: Vec<f64>,
    /// Ticks whose items were queued twice: fanned out twice from the
    /// start, or more items counted than the tick has.
    fanned_twice: Vec<i64>,
    /// Times (s since the start) the upstream refused a request for its
    /// window.
    over_window: Vec<f64>,
    charged: usize,
    /// Rows of the keyed sink, and distinct (item, key) among them.
    sink_rows: (i64, i64),
    /// Tasks (tick, item) that ended more than once, over every daemon
    /// process's log: run again (a page or more fetched again).
    ran_again: usize,
    /// Daemons not ready at the end, and exits none of ours caused.
    unready: Vec<String>,
    exits: u32,
    /// `qw_redis_reconnects_total` over every daemon, by reason.
    reconnects: BTreeMap<String, f64>,
    /// Items ended per outcome, over the checked ticks.
    outcomes: BTreeMap<String, i64>,
}

/// Stops nothing, waits for the ticks claimed during the faults to end
/// (at most 120 s), and checks.
pub(crate) fn settle_and_check(w: &mut World, args: &Args, faults: &[Injected]) -> Report {
    let cutoff_ms = chrono::Utc::now().timestamp_millis();
    let faults_ended = w.at();
    println!("chaos: faults over after {faults_ended:.0} s; settling (at most 120 s)");
    let settled = wait_until(Duration::from_secs(120), || {
        w.reap();
        let Some(mut conn) = master_conn(w) else {
            return false;
        };
        let claims = tick_claims(&mut conn);
        claims.keys().filter(|t| **t < cutoff_ms).all(|t| {
            let o = tick_outcomes(&mut conn, *t);
            o.get("#items").is_some_and(|n| ended(&o) >= *n)
        }) && w.all_ready()
    });
    println!(
        "chaos: settled: {settled} after {:.0} s",
        w.at() - faults_ended
    );
    let mut conn = master_conn(w).expect("a master after settling");
    let claims = tick_claims(&mut conn);
    let mut lost = BTreeMap::new();
    let mut outcomes: BTreeMap<String, i64> = BTreeMap::new();
    let mut fanned_twice = Vec::new();
    let mut ticks = 0;
    for tick in claims.keys().filter(|t| **t < cutoff_ms) {
        ticks += 1;
        let o: HashMap<String, i64> = tick_outcomes(&mut conn, *tick);
        let items = o.get("#items").copied().unwrap_or(0);
        if items > REGIONS.len() as i64 {
            fanned_twice.push(*tick);
        }
        for (k, v) in &o {
            if !k.starts_with('#') {
                *outcomes.entry(k.clone()).or_default() += v;
            }
        }
        let missing = REGIONS.len() as i64 - ended(&o);
        if missing > 0 {
            lost.insert(*tick, missing);
        }
    }
    for (tick, n) in fan_outs_from_the_start(w) {
        if n > 1 && !fanned_twice.contains(&tick) {
            fanned_twice.push(tick);
        }
    }
    let stats = w.upstream.stats();
    let start_ms = cutoff_ms - (faults_ended * 1000.0) as i64;
    let secs = |ms: i64| (ms - start_ms) as f64 / 1000.0;
    let over_window = (stats.requests.iter())
        .filter(|r| r.over_limit)
        .map(|r| secs(r.received.timestamp_millis()))
        .collect();
    let lost_at = lost.iter().map(|(t, n)| (secs(*t), *n)).collect();
    // The job fires every 3 s, on seconds divisible by 3.
    let first = (start_ms / 3000 + 1) * 3000;
    let missed = (first..cutoff_ms)
        .step_by(3000)
        .filter(|t| !claims.contains_key(t))
        .map(secs)
        .collect();
    let unready = (w.daemons.iter_mut())
        .filter_map(|d| {
            let ready = d.proc.running()
                && crate::support::http::http_get(d.port, "/readyz").is_some_and(|r| r.0 == 200);
            (!ready).then(|| d.label.clone())
        })
        .collect();
    Report {
        seed: args.seed,
        replicas: args.replicas,
        daemons: args.daemons,
        run_for: args.run_for,
        faults: faults.to_vec(),
        lost,
        lost_at,
        ticks,
        missed,
        fanned_twice,
        over_window,
        charged: stats.charges.len(),
        sink_rows: sink_rows(w),
        ran_again: ran_again(w),
        unready,
        exits: w.daemons.iter().map(|d| d.exited).sum(),
        reconnects: reconnects(w),
        outcomes,
    }
}

/// A connection to the master the sentinels name now.
fn master_conn(w: &World) -> Option<redis::Connection> {
    let port = w.redis.master_port()?;
    redis::Client::open(format!("redis://127.0.0.1:{port}/0"))
        .ok()?
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()
}

/// How often each tick was fanned out from its first item, over every
/// process of every daemon (`tick fanned out` with `from: 0`).
fn fan_outs_from_the_start(w: &World) -> HashMap<i64, usize> {
    let mut n = HashMap::new();
    for d in &w.daemons {
        for p in d.before.iter().chain([&d.proc]) {
            for e in p.messages("tick fanned out") {
                if e["from"].as_u64() == Some(0)
                    && let Some(t) = e["tick"].as_i64()
                {
                    *n.entry(t).or_default() += 1;
                }
            }
        }
    }
    n
}

/// Tasks that ended more than once (a terminal outcome line for the same
/// tick and item), over every process of every daemon.
fn ran_again(w: &World) -> usize {
    let mut ends: HashMap<(i64, String), usize> = HashMap::new();
    for d in &w.daemons {
        for p in d.before.iter().chain([&d.proc]) {
            for e in p.outcomes() {
                let terminal = matches!(
                    e["outcome"].as_str(),
                    Some("done" | "quota_exhausted" | "upstream_throttled" | "failed")
                );
                if let (true, Some(t), Some(i)) = (terminal, e["tick"].as_i64(), e["item"].as_str())
                {
                    *ends.entry((t, i.to_owned())).or_default() += 1;
                }
            }
        }
    }
    ends.values().filter(|n| **n > 1).count()
}

/// Rows in the keyed SQLite sink, and distinct (item, key) among them.
fn sink_rows(w: &World) -> (i64, i64) {
    let path = w
        .cfg
        .join(std::path::Path::new("data").join(format!("{}.sqlite", crate::support::world::JOB)));
    let Ok(db) = rusqlite::Connection::open(&path) else {
        return (0, 0);
    };
    let sql = format!(
        "SELECT COUNT(*), COUNT(DISTINCT item || '\u{1f}' || record_key) FROM \"{}\"",
        crate::support::world::JOB
    );
    db.query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap_or((0, 0))
}

/// `qw_redis_reconnects_total` summed over the daemons now running.
fn reconnects(w: &World) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    for d in &w.daemons {
        let Some((200, text)) = crate::support::http::http_get(d.port, "/metrics") else {
            continue;
        };
        let m = crate::support::http::Metrics::parse(&text);
        for s in m.select("qw_redis_reconnects_total", &[]) {
            let reason = s.labels.get("reason").cloned().unwrap_or_default();
            *by.entry(reason).or_insert(0.0) += s.value;
        }
    }
    by
}

/// The fault injected last at or before `at` (s), if any.
fn blame(faults: &[Injected], at: f64) -> Option<Fault> {
    faults.iter().rev().find(|f| f.at <= at).map(|f| f.fault)
}

impl Report {
    /// Whether the run kept the promises: no item lost, every daemon
    /// running and ready, none exited by itself, every fault survived; and
    /// with replicas (`queue_replicas = quota_replicas = 1`) no tick fanned
    /// out twice and no unit over the upstream's window. Without them those
    /// two are measured, not failed (docs/redis.md says what they may be).
    pub(crate) fn passed(&self) -> bool {
        let kept = self.lost.is_empty()
            && self.unready.is_empty()
            && self.exits == 0
            && self.faults.iter().all(|f| f.ready_after.is_some())
            && self.sink_rows.0 == self.sink_rows.1;
        kept && (self.replicas == 0
            || (self.fanned_twice.is_empty() && self.over_window.is_empty()))
    }

    /// Per fault kind: injected, survived, slowest recovery, units over the
    /// window and items lost after it (before the next fault).
    fn table(&self) -> Vec<(Fault, usize, usize, f64, usize, i64)> {
        KINDS
            .iter()
            .map(|&k| {
                let of: Vec<&Injected> = self.faults.iter().filter(|f| f.fault == k).collect();
                let survived = of.iter().filter(|f| f.ready_after.is_some()).count();
                let slowest = of.iter().filter_map(|f| f.ready_after).fold(0.0, f64::max);
                let over = (self.over_window.iter())
                    .filter(|t| blame(&self.faults, **t) == Some(k))
                    .count();
                let lost = (self.lost_at.iter())
                    .filter(|(t, _)| blame(&self.faults, *t) == Some(k))
                    .map(|(_, n)| n)
                    .sum();
                (k, of.len(), survived, slowest, over, lost)
            })
            .collect()
    }

    pub(crate) fn markdown(&self) -> String {
        let mut s = format!(
            "## Chaos run: seed {}, {} of faults, {} daemons, queue_replicas = quota_replicas = {}\n\n",
            self.seed,
            quota_worker::config::fmt_duration(self.run_for),
            self.daemons,
            self.replicas
        );
        s += "| fault | injected | survived (all daemons ready within 30 s) | slowest back to ready | units over the upstream's window after it | items lost |\n";
        s += "|---|---:|---:|---:|---:|---:|\n";
        let lost_total: i64 = self.lost.values().sum();
        for (k, n, ok, slowest, over, lost) in self.table() {
            s += &format!(
                "| {} | {n} | {ok} | {slowest:.1} s | {over} | {lost} |\n",
                k.name()
            );
        }
        s += &format!(
            "\nticks checked: {} (cron ticks no daemon claimed: {}); items lost: **{lost_total}** {:?}; ticks fanned out twice: **{}**; requests the upstream refused for its window: **{}**; tasks that ended twice (run again): {}; requests charged: {}; keyed sink rows: {} ({} distinct); daemons not ready at the end: {:?}; exits by themselves: {}\n",
            self.ticks,
            self.missed.len(),
            self.lost,
            self.fanned_twice.len(),
            self.over_window.len(),
            self.ran_again,
            self.charged,
            self.sink_rows.0,
            self.sink_rows.1,
            self.unready,
            self.exits
        );
        s += &format!("\noutcomes over the ticks checked: {:?}\n", self.outcomes);
        s += &format!(
            "\nconnections dropped and made again (qw_redis_reconnects_total, daemons running at the end): {:?}\n",
            self.reconnects
        );
        s += &format!(
            "\nverdict: **{}**\n",
            if self.passed() { "passed" } else { "FAILED" }
        );
        s
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "seed": self.seed,
            "replicas": self.replicas,
            "daemons": self.daemons,
            "run_for_s": self.run_for.as_secs(),
            "faults": self.faults.iter().map(|f| json!({
                "fault": f.fault.name(), "at_s": f.at, "detail": f.detail, "ready_after_s": f.ready_after,
            })).collect::<Vec<_>>(),
            "ticks_checked": self.ticks,
            "ticks_missed_at_s": self.missed,
            "items_lost": self.lost.iter().map(|(t, n)| json!({"tick": t, "lost": n})).collect::<Vec<_>>(),
            "ticks_fanned_out_twice": self.fanned_twice,
            "over_window_at_s": self.over_window,
            "ran_again": self.ran_again,
            "charged": self.charged,
            "sink_rows": self.sink_rows.0,
            "sink_distinct": self.sink_rows.1,
            "unready": self.unready,
            "exits": self.exits,
            "reconnects": self.reconnects,
            "outcomes": self.outcomes,
            "passed": self.passed(),
        })
    }
}
