//! Section `exactness`: under load, the limiter admits exactly the limit in
//! every trailing window: never more (no over-admission), and never refuses
//! while the units were there (no under-admission) — for sliding windows, for
//! spends with a priority reserve beside plain ones, and for a bucket window.
//!
//! 64 callers spend as fast as they can through one shared `Limiter` on a
//! credential with short windows, so demand is many times the limit and the
//! windows slide a few times during the phase. Every call is recorded
//! (request id, cost, reserve, decision, `remaining`, and the wall-clock
//! interval around it). Meanwhile a reader snapshots every window
//! (`support::seed::snapshot_cmd`: one read-only script, so one instant)
//! every 100 ms, far more often than an entry can expire, so it sees every
//! admitted spend with the exact time the script recorded for it (a bucket
//! remembers its ids for 60 s). From that history:
//!
//! - the admitted ids and costs are exactly those the callers were told were
//!   admitted (nothing lost, nothing extra);
//! - sliding: for every admission at time `t` and every window `(units,
//!   per)`, the units admitted in `(t - per, t]` are ≤ `units`, and ≤ `units`
//!   less the reserve after a reserved admission (the script's own expiry
//!   rule); the peak is reported, and with cost-1 demand it must equal the
//!   limit (the window was really filled);
//! - bucket: replaying the admissions through a leaky bucket that drains
//!   `units / per` continuously, its level never passes `units`;
//! - every rejection is justified: it reported `remaining` < its cost, and
//!   that `remaining` is what the history gives for some instant of the
//!   call's interval. Redis runs on this host, so `TIME` inside the script
//!   and the caller's clock read the same kernel clock: the script's `now`
//!   lies within the interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quota_worker::config::{Config, Reserve};
use quota_worker::quota::{Decision, Limiter, Quotas, SpendOptions, request_id};
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;

use crate::Ctx;
use crate::common::{self, thousands};
use crate::report::{Section, Target};
use crate::support::seed::{snapshot_cmd, snapshot_entries};
use crate::support::{ConfigBuilder, Credential, Endpoint, TestConfig, Window};

const CALLERS: usize = 64;

/// One load phase.
struct Phase {
    name: &'static str,
    /// Sliding windows, or one bucket.
    bucket: bool,
    /// (units, period ms) of each window.
    windows: Vec<(u64, u64)>,
    /// Costs are drawn uniformly from 1..=max_cost.
    max_cost: u64,
    /// Every other caller spends with this reserve (percent; 0: none).
    reserve: u8,
    secs: f64,
}

/// One call as its caller saw it.
struct Call {
    id: String,
    cost: u64,
    reserved: bool,
    /// Wall clock around the call, µs since the epoch.
    from_us: i64,
    to_us: i64,
    allowed: bool,
    remaining: u64,
}

#[derive(Serialize)]
struct PhaseResult {
    name: &'static str,
    callers: usize,
    bucket: bool,
    windows: Vec<(u64, u64)>,
    max_cost: u64,
    reserve: u8,
    secs: f64,
    calls: usize,
    spends_per_sec: f64,
    admitted_calls: usize,
    admitted_units: u64,
    rejected: usize,
    /// Admissions the snapshots saw that no caller was told of, and the reverse.
    unknown_admissions: usize,
    missed_admissions: usize,
    cost_mismatches: usize,
    /// Per window: the most units ever live in it at once (a bucket: its
    /// highest level, rounded up), by the history.
    peak_units: Vec<u64>,
    /// Of those, after reserved admissions.
    peak_reserved_units: Vec<u64>,
    /// Admissions after which a window held more than its limit (or, after
    /// a reserved one, more than its limit less the reserve).
    over_admissions: usize,
    /// Rejections that reported enough units left for their cost.
    unjustified_rejections: usize,
    /// Rejections whose `remaining` the history never gives within the call.
    inconsistent_rejections: usize,
    /// How far the script's clock (TIME) and the caller's differ, µs, at most.
    clock_offset_us: i64,
    /// The longest time between two snapshot passes; the history is complete
    /// only while that stays under the shortest window.
    max_snapshot_gap_ms: f64,
    history_complete: bool,
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}

/// A small deterministic generator (xorshift64*): the same costs every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn config(p: &Phase) -> TestConfig {
    let mut credential = Credential::env("ex", "BENCH_UNUSED");
    for (units, ms) in &p.windows {
        let per = format!("{ms}ms");
        credential = credential.window(match p.bucket {
            true => Window::bucket(*units, &per),
            false => Window::sliding(*units, &per),
        });
    }
    ConfigBuilder::new()
        .key_prefix("qwx")
        .credential(credential)
        .endpoint(Endpoint::new("ex", "ex", 1))
        .write()
}

pub async fn run(ctx: &Ctx) -> Section {
    let secs = if ctx.quick { 2.0 } else { 5.0 };
    let phases = [
        Phase {
            name: "cost 1",
            bucket: false,
            windows: vec![(400, 1000), (1000, 3000)],
            max_cost: 1,
            reserve: 0,
            secs,
        },
        Phase {
            name: "weighted, cost 1–100",
            bucket: false,
            windows: vec![(4000, 1000), (10_000, 3000)],
            max_cost: 100,
            reserve: 0,
            secs,
        },
        Phase {
            name: "reserve 50% (half the callers), cost 1–5",
            bucket: false,
            windows: vec![(400, 1000), (1000, 3000)],
            max_cost: 5,
            reserve: 50,
            secs,
        },
        Phase {
            name: "bucket, cost 1–10",
            bucket: true,
            windows: vec![(400, 1000)],
            max_cost: 10,
            reserve: 0,
            secs,
        },
    ];
    let mut results = Vec::new();
    for p in &phases {
        results.push(phase(ctx, p).await);
    }

    let mut md = String::from(
        "64 callers share one `Limiter` and spend as fast as they can on short windows \
         (demand is many times the limit); every call is recorded, and every window is \
         snapshotted every 100 ms (one read-only script per window: its ids, positions and \
         times), which sees every admitted spend with the time the script recorded. Checked \
         against that history: admissions agree with what callers were told; units live in \
         `(t − per, t]` after each admission ≤ the limit (≤ the limit less the reserve after a \
         reserved one); a bucket's level, replayed, never passes its units; each rejection \
         reported `remaining` < its cost and a `remaining` the history gives within the \
         call's interval.\n\n\
         | phase | windows (units / per) | calls | spends/s | admitted calls / units | rejected | peak live units per window (after reserved admissions) | over-admissions | unjustified or inconsistent rejections | admissions lost / unknown / wrong cost |\n\
         |---|---|---:|---:|---:|---:|---|---:|---:|---|\n",
    );
    let mut targets = Vec::new();
    for r in &results {
        let windows: Vec<String> = r
            .windows
            .iter()
            .map(|(u, ms)| {
                let kind = if r.bucket { " bucket" } else { "" };
                format!("{u} / {}s{kind}", *ms as f64 / 1000.0)
            })
            .collect();
        let peaks: Vec<String> = r
            .peak_units
            .iter()
            .zip(&r.peak_reserved_units)
            .zip(&r.windows)
            .map(|((p, pr), (u, _))| {
                if r.reserve > 0 {
                    format!(
                        "{p} of {u} ({pr} of {})",
                        u - u * u64::from(r.reserve) / 100
                    )
                } else {
                    format!("{p} of {u}")
                }
            })
            .collect();
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} / {} | {} | {} | **{}** | **{} / {}** | {} / {} / {} |\n",
            r.name,
            windows.join(", "),
            thousands(r.calls as f64),
            thousands(r.spends_per_sec),
            thousands(r.admitted_calls as f64),
            thousands(r.admitted_units as f64),
            thousands(r.rejected as f64),
            peaks.join(", "),
            r.over_admissions,
            r.unjustified_rejections,
            r.inconsistent_rejections,
            r.missed_admissions,
            r.unknown_admissions,
            r.cost_mismatches,
        ));
        let bookkeeping = r.missed_admissions + r.unknown_admissions + r.cost_mismatches;
        if !r.history_complete {
            // The reader stalled for longer than a window: admissions may
            // have expired unseen, so nothing can be concluded either way.
            targets.push(Target::new(
                format!("exactness, {}", r.name),
                "a complete history",
                format!(
                    "inconclusive: the snapshot reader stalled {:.0} ms",
                    r.max_snapshot_gap_ms
                ),
                false,
            ));
            continue;
        }
        targets.push(
            Target::new(
                format!("exactness, {}: units in any trailing window", r.name),
                "≤ limit",
                format!(
                    "{} over-admissions; peaks {}",
                    r.over_admissions,
                    peaks.join(", ")
                ),
                r.over_admissions == 0 && bookkeeping == 0,
            )
            .correctness(),
        );
        targets.push(
            Target::new(
                format!("exactness, {}: no under-admission", r.name),
                "every rejection justified",
                format!(
                    "{} of {} rejections unjustified or inconsistent",
                    r.unjustified_rejections + r.inconsistent_rejections,
                    thousands(r.rejected as f64)
                ),
                r.unjustified_rejections == 0 && r.inconsistent_rejections == 0,
            )
            .correctness(),
        );
        if r.max_cost == 1 && !r.bucket {
            // Cost-1 demand fills a window exactly, once the phase has run
            // long enough for it to fill (a second to spare).
            let long_enough: Vec<_> = r
                .peak_units
                .iter()
                .zip(&r.windows)
                .filter(|(_, (_, ms))| *ms as f64 / 1000.0 + 1.0 <= r.secs)
                .collect();
            targets.push(Target::new(
                format!(
                    "exactness, {}: admitted = limit when demand exceeds it",
                    r.name
                ),
                "peak live units = limit",
                long_enough
                    .iter()
                    .map(|(p, (u, _))| format!("{p} of {u}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                !long_enough.is_empty() && long_enough.iter().all(|(p, (u, _))| *p == u),
            ));
        }
    }
    md.push_str(&format!(
        "\nThe caller's clock and Redis `TIME` differed by at most {} µs (same host, same kernel clock). \
         The snapshot reader's longest gap was {:.0} ms (the shortest window is 1,000 ms; a longer gap would make the history incomplete and the check inconclusive).\n",
        results.iter().map(|r| r.clock_offset_us).max().unwrap_or(0),
        results
            .iter()
            .map(|r| r.max_snapshot_gap_ms)
            .fold(0.0, f64::max)
    ));
    Section {
        key: "exactness",
        title: "Exactness under load".into(),
        markdown: md,
        data: json!({ "phases": results }),
        targets,
    }
}

async fn phase(ctx: &Ctx, p: &Phase) -> PhaseResult {
    let cfg = config(p);
    let config = Config::load(&cfg.path()).expect("exactness config");
    let quotas = Arc::new(Quotas::new(&config));
    let conn = common::connect(&ctx.redis).await;
    let limiter = Limiter::new(conn.clone(), quotas, common::TIMEOUT).without_history();
    let plan = &limiter.quotas().endpoint("ex").expect("endpoint").plan;
    // blocked, clock, then meta, log, ts, adj per window.
    let keys = plan.keys.clone();
    let logs: Vec<Vec<String>> = keys[2..].chunks(4).map(<[String]>::to_vec).collect();
    let mut admin = common::connect(&ctx.redis).await;
    common::del(&mut admin, &keys).await;
    let clock_offset_us = clock_offset(&mut admin).await;

    // The reader: every admitted entry, with the time the script gave it.
    let (stop_tx, stop_rx) = watch::channel(false);
    let reader = {
        let mut conn = common::connect(&ctx.redis).await;
        let logs = logs.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut seen: HashMap<String, (i64, u64)> = HashMap::new();
            // From the start of one pass to the end of the next: an entry
            // admitted in between is read unless that outlasts a window.
            let (mut max_gap, mut prev_start) = (Duration::ZERO, None::<Instant>);
            loop {
                let done = *stop.borrow();
                let start = Instant::now();
                for window in &logs {
                    let snap = snapshot_cmd(window)
                        .query_async(&mut conn)
                        .await
                        .expect("snapshot");
                    seen.extend(snapshot_entries(snap));
                }
                if let Some(prev) = prev_start {
                    max_gap = max_gap.max(prev.elapsed());
                }
                prev_start = Some(start);
                if done {
                    return (seen, max_gap);
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = stop.changed() => {}
                }
            }
        })
    };

    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(p.secs);
    let callers: Vec<_> = (0..CALLERS)
        .map(|k| {
            let limiter = limiter.clone();
            let max_cost = p.max_cost;
            // Every other caller keeps the reserve.
            let reserve = if k % 2 == 1 {
                Reserve::new(p.reserve).expect("a reserve of 0-99%")
            } else {
                Reserve::NONE
            };
            tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (k as u64 + 1));
                let mut calls = Vec::new();
                while Instant::now() < deadline {
                    let cost = 1 + rng.below(max_cost);
                    let id = request_id();
                    let from_us = now_us();
                    let d = limiter
                        .spend_with("ex", &id, SpendOptions::new().cost(cost).reserve(reserve))
                        .await
                        .expect("spend");
                    let to_us = now_us();
                    let (allowed, remaining) = match d {
                        Decision::Allowed { remaining } => (true, remaining),
                        Decision::Rejected(r) => (false, r.remaining),
                        Decision::Unchecked => panic!("unchecked with Redis up"),
                    };
                    calls.push(Call {
                        id,
                        cost,
                        reserved: reserve != Reserve::NONE,
                        from_us,
                        to_us,
                        allowed,
                        remaining,
                    });
                }
                calls
            })
        })
        .collect();
    let mut calls = Vec::new();
    for c in callers {
        calls.extend(c.await.expect("caller"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop_tx.send(true).expect("reader alive");
    let (seen, max_gap) = reader.await.expect("reader");
    common::del(&mut admin, &keys).await;

    let mut r = check(p, calls, seen, elapsed, clock_offset_us);
    r.max_snapshot_gap_ms = max_gap.as_secs_f64() * 1000.0;
    let shortest = p.windows.iter().map(|w| w.1).min().expect("windows");
    r.history_complete = max_gap < Duration::from_millis(shortest);
    r
}

/// Upper bound on |caller clock − Redis TIME|: TIME read between two
/// readings of the caller's clock.
async fn clock_offset(conn: &mut quota_worker::conn::Conn) -> i64 {
    let mut worst = 0;
    for _ in 0..5 {
        let a = now_us();
        let t = common::redis_now_us(conn).await;
        let b = now_us();
        let off = if t < a {
            a - t
        } else if t > b {
            t - b
        } else {
            0
        };
        worst = worst.max(off);
    }
    worst
}

fn check(
    p: &Phase,
    calls: Vec<Call>,
    seen: HashMap<String, (i64, u64)>,
    elapsed: f64,
    clock_offset_us: i64,
) -> PhaseResult {
    // 1. What was admitted, by both accounts.
    let told: HashMap<&str, &Call> = calls
        .iter()
        .filter(|c| c.allowed)
        .map(|c| (c.id.as_str(), c))
        .collect();
    let missed = told.keys().filter(|id| !seen.contains_key(**id)).count();
    let unknown = seen
        .keys()
        .filter(|id| !told.contains_key(id.as_str()))
        .count();
    let mismatched = seen
        .iter()
        .filter(|(id, (_, cost))| told.get(id.as_str()).is_some_and(|c| c.cost != *cost))
        .count();

    // The history: admissions in the order of the script's clock, with
    // whether each kept the reserve.
    let mut adm: Vec<(i64, u64, bool)> = seen
        .iter()
        .map(|(id, &(t, cost))| (t, cost, told.get(id.as_str()).is_some_and(|c| c.reserved)))
        .collect();
    adm.sort_unstable();
    // What a spend may take of a window of `units`: all less the reserve.
    let lim = |units: u64, reserved: bool| {
        let w = quota_worker::config::Window {
            units: std::num::NonZeroU64::new(units).expect("units"),
            per: Duration::from_secs(1),
            kind: quota_worker::config::WindowKind::Sliding,
            upstream: false,
            resource: None,
            every_resource: false,
            mode: Default::default(),
            keyed_by_units: false,
        };
        let r = if reserved { p.reserve } else { 0 };
        w.admits(Reserve::new(r).expect("a reserve of 0-99%"))
    };

    let (mut peaks, mut peaks_reserved, mut over) = (Vec::new(), Vec::new(), 0);
    let (unjustified, inconsistent, rejected);
    if p.bucket {
        // 2. A bucket: replay the admissions through the leaky bucket, in
        // units x µs (exact integers, as the script keeps them): it drains
        // `units` per µs and holds at most units x per.
        let (units, per_ms) = p.windows[0];
        let per = per_ms as i64 * 1000;
        let units_i = units as i64;
        let mut after = Vec::with_capacity(adm.len());
        let (mut level, mut prev, mut peak) = (0i64, i64::MIN, 0i64);
        for &(t, cost, _) in &adm {
            if prev != i64::MIN {
                level = (level - (t - prev) * units_i).max(0);
            }
            level += cost as i64 * per;
            prev = t;
            peak = peak.max(level);
            if level > units_i * per {
                over += 1;
            }
            after.push(level);
        }
        peaks.push((peak as u64).div_ceil(per as u64));
        peaks_reserved.push(0);
        // The level at t, counting the admissions at t or not.
        let level_at = |t: i64, inclusive: bool| -> i64 {
            let n = if inclusive {
                adm.partition_point(|a| a.0 <= t)
            } else {
                adm.partition_point(|a| a.0 < t)
            };
            if n == 0 {
                return 0;
            }
            (after[n - 1] - (t - adm[n - 1].0) * units_i).max(0)
        };
        let left = |level: i64| units - (level as u64).div_ceil(per as u64);
        // 3. Rejections: justified, and `remaining` one the level takes in
        // the call's interval (it drains between admissions, so every value
        // between the ends of each stretch).
        let (mut u, mut i, mut r) = (0, 0, 0);
        for c in calls.iter().filter(|c| !c.allowed) {
            r += 1;
            if c.remaining >= c.cost {
                u += 1;
                continue;
            }
            let (a, b) = (c.from_us - clock_offset_us, c.to_us + clock_offset_us);
            let from = adm.partition_point(|x| x.0 < a);
            let mut cuts = vec![a];
            cuts.extend(adm[from..].iter().map(|x| x.0).take_while(|t| *t <= b));
            cuts.push(b);
            let consistent = cuts.windows(2).any(|s| {
                let hi = left(level_at(s[1], false));
                let lo = left(level_at(s[0], true));
                (lo..=hi).contains(&c.remaining)
            });
            if !consistent {
                i += 1;
            }
        }
        (unjustified, inconsistent, rejected) = (u, i, r);
    } else {
        // 2. Units live in (t - per, t] after each admission, per window: at
        // most the limit, and at most the limit less the reserve after a
        // reserved admission.
        for &(units, per_ms) in &p.windows {
            let per = per_ms as i64 * 1000;
            let (mut lo, mut sum, mut peak, mut peak_r) = (0usize, 0u64, 0u64, 0u64);
            for j in 0..adm.len() {
                sum += adm[j].1;
                while adm[lo].0 <= adm[j].0 - per {
                    sum -= adm[lo].1;
                    lo += 1;
                }
                if adm[j].2 {
                    peak_r = peak_r.max(sum);
                    if sum > lim(units, true) {
                        over += 1;
                    }
                }
                // Admissions at the same µs count together.
                if j + 1 < adm.len() && adm[j + 1].0 == adm[j].0 {
                    continue;
                }
                peak = peak.max(sum);
                if sum > units {
                    over += 1;
                }
            }
            peaks.push(peak);
            peaks_reserved.push(peak_r);
        }

        // 3. Rejections: justified, and consistent with the history (for a
        // reserved spend, `remaining` is what it may still take).
        let left_at = |t: i64, inclusive: bool, reserved: bool| -> u64 {
            p.windows
                .iter()
                .map(|&(units, per_ms)| {
                    let per = per_ms as i64 * 1000;
                    // Live at t: score in (t - per, t] (or (t - per, t) before t's own events).
                    let start = adm.partition_point(|a| a.0 <= t - per);
                    let end = if inclusive {
                        adm.partition_point(|a| a.0 <= t)
                    } else {
                        adm.partition_point(|a| a.0 < t)
                    };
                    let used: u64 = adm[start..end.max(start)].iter().map(|a| a.1).sum();
                    lim(units, reserved).saturating_sub(used)
                })
                .min()
                .expect("windows")
        };
        let (mut u, mut i, mut r) = (0, 0, 0);
        for c in calls.iter().filter(|c| !c.allowed) {
            r += 1;
            if c.remaining >= c.cost {
                u += 1;
                continue;
            }
            // Every instant where the history changes within the call:
            // admissions at their time, expiries at time + per.
            let (a, b) = (c.from_us - clock_offset_us, c.to_us + clock_offset_us);
            let mut instants = vec![a, b];
            for &(_, per_ms) in &p.windows {
                let per = per_ms as i64 * 1000;
                let from = adm.partition_point(|x| x.0 < a - per);
                for x in &adm[from..] {
                    if x.0 > b {
                        break;
                    }
                    for t in [x.0, x.0 + per] {
                        if (a..=b).contains(&t) {
                            instants.push(t);
                        }
                    }
                }
            }
            let consistent = instants.iter().any(|&t| {
                left_at(t, true, c.reserved) == c.remaining
                    || left_at(t, false, c.reserved) == c.remaining
            });
            if !consistent {
                i += 1;
            }
        }
        (unjustified, inconsistent, rejected) = (u, i, r);
    }

    PhaseResult {
        name: p.name,
        callers: CALLERS,
        bucket: p.bucket,
        windows: p.windows.to_vec(),
        max_cost: p.max_cost,
        reserve: p.reserve,
        secs: elapsed,
        calls: calls.len(),
        spends_per_sec: calls.len() as f64 / elapsed,
        admitted_calls: told.len(),
        admitted_units: told.values().map(|c| c.cost).sum(),
        rejected,
        unknown_admissions: unknown,
        missed_admissions: missed,
        cost_mismatches: mismatched,
        peak_units: peaks,
        peak_reserved_units: peaks_reserved,
        over_admissions: over,
        unjustified_rejections: unjustified,
        inconsistent_rejections: inconsistent,
        clock_offset_us,
        max_snapshot_gap_ms: 0.0,
        history_complete: false,
    }
}
