//! Section `growth`: spend latency (p50, p99) as the window grows from 1k to
//! 1M live entries, `lua/spend.lua` against the naive log, and the plot of
//! it (`growth.svg`). Also the helpers `memory` and `idle` share: the bench
//! config, the naive spend, and the fills that write a window straight into
//! each layout.

use std::path::Path;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use quota_worker::config::Config;
use quota_worker::conn::Conn;
use quota_worker::conn::Lua;
use quota_worker::quota::{Decision, Limiter, Quotas, RejectedBy};
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Lat, TIMEOUT, histogram, lat, thousands};
use crate::report::{Section, Target};
use crate::support::{ConfigBuilder, Credential, Endpoint, Window};

// ------------------------------------------------------------ shared helpers

/// Every window in these sections is one sliding hour.
pub const PER_MS: u64 = 3_600_000;
pub const PER_US: i64 = PER_MS as i64 * 1000;
/// A limit no benchmark spend reaches.
pub const HUGE: u64 = 1_000_000_000_000;
/// Key prefix of the product's keys in these sections.
pub const PREFIX: &str = "qwb";

/// The naive sliding log: one zset member per unit, one ZADD per unit.
pub static NAIVE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../baseline/naive_log.lua")));

/// Entries per ZADD (and HSET) in a fill, and commands per round trip.
const FILL_CHUNK: usize = 1_000;
const FILL_PIPE: usize = 40;

/// A bench config: one credential per `(name, units)` with one sliding 1h
/// window, and an endpoint of the same name (cost 1) on it.
pub fn quotas(credentials: &[(&str, u64)]) -> Arc<Quotas> {
    let mut b = ConfigBuilder::new().key_prefix(PREFIX);
    for (name, units) in credentials {
        b = b
            .credential(Credential::env(name, "BENCH_UNUSED").window(Window::sliding(*units, "1h")))
            .endpoint(Endpoint::new(name, name, 1));
    }
    let cfg = b.write();
    let config = Config::load(&cfg.path()).expect("bench config");
    Arc::new(Quotas::new(&config))
}

/// spend.lua's keys of endpoint `name`'s window: `[meta, log, ts, adj]`.
/// They do not depend on the window's units, so configs that differ only in
/// the limit share them.
pub fn ours_keys(q: &Quotas, name: &str) -> Vec<String> {
    q.endpoint(name).expect("bench endpoint").plan.keys[2..].to_vec()
}

/// The credential's clock key (one per credential, not per window).
pub fn clock_key(q: &Quotas, name: &str) -> String {
    q.endpoint(name).expect("bench endpoint").plan.keys[1].clone()
}

/// The naive log's zset for credential `name`.
pub fn naive_key(name: &str) -> String {
    format!("nv:{{{name}}}:log")
}

/// One naive spend (one 1h window of `limit` units): (allowed, retry_after_ms).
pub async fn naive_spend(
    conn: &mut Conn,
    key: &str,
    id: &str,
    cost: u64,
    limit: u64,
) -> (bool, i64) {
    let r: Vec<i64> = NAIVE
        .call()
        .key(key)
        .arg(id)
        .arg(cost)
        .arg(limit)
        .arg(PER_MS)
        .invoke(conn)
        .await
        .expect("naive spend");
    (r[0] == 1, r[2])
}

/// Writes `n` one-unit members straight into a naive log: member `<tag:8
/// hex><i:24 hex>:1` (a 32-hex id like a real request id, unit 1) at a spend
/// time spread evenly over [from, to). Pipelined ZADDs of 1,000 members each.
pub async fn fill_naive(conn: &mut Conn, zset: &str, tag: u32, n: usize, from_us: i64, to_us: i64) {
    let mut pipe = redis::pipe();
    let mut queued = 0;
    for first in (0..n).step_by(FILL_CHUNK) {
        let last = (first + FILL_CHUNK).min(n);
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(zset);
        for i in first..last {
            zadd.arg(from_us + (to_us - from_us) * i as i64 / n as i64)
                .arg(format!("{tag:08x}{i:024x}:1"));
        }
        pipe.add_command(zadd).ignore();
        queued += 1;
        if queued >= FILL_PIPE || last == n {
            let _: () = pipe.query_async(conn).await.expect("fill");
            pipe = redis::pipe();
            queued = 0;
        }
    }
}

/// Writes `n` entries of `cost` units straight into a sliding window in
/// spend.lua's layout (`keys`: meta, log, ts, adj; `support::seed`), spend
/// times spread evenly over [from_us, to_us), ids of 32 characters like a
/// real request id. Entries are appended: `from_us` must not be earlier than
/// the window's newest.
pub async fn fill_ours(
    conn: &mut Conn,
    keys: &[String],
    tag: u32,
    n: usize,
    cost: u64,
    from_us: i64,
    to_us: i64,
) {
    let prefix = format!("{tag:08x}{:017}", 0);
    let _: i64 = crate::support::seed::Seed {
        prefix: &prefix,
        n,
        cost,
        first_us: from_us,
        step_us: (to_us - from_us) / n.max(1) as i64,
        group: 1,
        per_ms: PER_MS,
    }
    .cmd(keys)
    .query_async(conn)
    .await
    .expect("fill");
}

/// Units a window counts now, by the limiter (`peek` of credential `name`).
pub async fn used_units(limiter: &Limiter, name: &str) -> u64 {
    limiter.peek(name).await.expect("peek").windows[0].used
}

pub async fn zcard(conn: &mut Conn, key: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

/// Entries a spend.lua window's stream holds (`keys`: meta, log, ts, adj):
/// one per spend, expired ones dropped a few calls after they expire.
pub async fn stream_len(conn: &mut Conn, keys: &[String]) -> i64 {
    redis::cmd("XLEN")
        .arg(&keys[2])
        .query_async(conn)
        .await
        .expect("XLEN")
}

/// Takes entry `id`, the newest of the spend.lua window `keys`, back out.
pub async fn pop_newest(conn: &mut Conn, keys: &[String], id: &str) -> i64 {
    crate::support::seed::pop_cmd(keys, id)
        .query_async(conn)
        .await
        .expect("pop the newest entry")
}

/// Drops keys without blocking Redis (large values are freed by Redis's
/// lazy-free thread), then waits until that thread is done, so the next
/// measurement does not share the CPU with it.
pub async fn unlink(conn: &mut Conn, keys: &[String]) {
    if keys.is_empty() {
        return;
    }
    let _: i64 = redis::cmd("UNLINK")
        .arg(keys)
        .query_async(conn)
        .await
        .expect("UNLINK");
    wait_lazyfree(conn).await;
}

/// Waits until Redis's lazy-free thread has nothing left to free.
pub async fn wait_lazyfree(conn: &mut Conn) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::info_field(conn, "memory", "lazyfree_pending_objects").await != "0"
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// 1000 -> "1k", 1000000 -> "1M".
pub fn short(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

// ------------------------------------------------------------ the section

struct Plan {
    sizes: Vec<usize>,
    /// Timed spends per implementation, case and size.
    samples: usize,
    /// Untimed rounds first (scripts cached, connections warm).
    warmup: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                sizes: vec![1_000, 10_000, 100_000],
                samples: 100,
                warmup: 10,
            }
        } else {
            Plan {
                sizes: vec![1_000, 10_000, 100_000, 1_000_000],
                samples: 2_000,
                warmup: 50,
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Case {
    key: &'static str,
    label: &'static str,
    cost: u64,
    allowed: bool,
}

/// Rejection: the window is exactly full (limit = live units), so a cost of
/// 100 needs the 100 oldest units freed (cost 1: the oldest): spend.lua finds
/// the entry that frees them with one lookup on positions, whatever the cost.
/// Allowed: a limit nothing reaches.
const CASES: [Case; 4] = [
    Case {
        key: "allow_1",
        label: "allowed, cost 1",
        cost: 1,
        allowed: true,
    },
    Case {
        key: "allow_100",
        label: "allowed, cost 100",
        cost: 100,
        allowed: true,
    },
    Case {
        key: "reject_1",
        label: "rejected (full window), cost 1",
        cost: 1,
        allowed: false,
    },
    Case {
        key: "reject_100",
        label: "rejected (full window), cost 100",
        cost: 100,
        allowed: false,
    },
];

/// The latencies of one case at one size.
struct Cell {
    ours: Histogram<u64>,
    naive: Histogram<u64>,
}

/// Sanity facts gathered over all the rejections.
#[derive(Default)]
struct Checks {
    /// Largest |spend.lua retry-after − naive retry-after| on a rejection, ms.
    retry_gap_ms: i64,
    /// Smallest and largest retry-after spend.lua gave, ms.
    retry_min_ms: i64,
    retry_max_ms: i64,
}

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::new(ctx.quick);
    let mut conn = common::connect(&ctx.redis).await;
    common::flushall(&mut conn).await;

    let names: Vec<String> = plan.sizes.iter().map(|n| format!("g{n}")).collect();
    let room = quotas(&names.iter().map(|s| (s.as_str(), HUGE)).collect::<Vec<_>>());
    let full = quotas(
        &names
            .iter()
            .zip(&plan.sizes)
            .map(|(s, n)| (s.as_str(), *n as u64))
            .collect::<Vec<_>>(),
    );
    let ours_room = Limiter::new(conn.clone(), room.clone(), TIMEOUT).without_history();
    let ours_full = Limiter::new(conn.clone(), full, TIMEOUT).without_history();

    // Every size is filled first and then sampled round robin, so load on
    // this shared machine hits all sizes and both designs alike. Live
    // entries of 1 unit, spread over the last 30 minutes of the 1h window.
    let mut fills = Vec::new();
    let mut windows: Vec<(Vec<String>, String)> = Vec::new();
    for (name, &n) in names.iter().zip(&plan.sizes) {
        let keys = ours_keys(&room, name);
        let nkey = naive_key(name);
        let now = common::redis_now_us(&mut conn).await;
        let span = (now - PER_US / 2, now - 1_000_000);
        let t = Instant::now();
        fill_ours(&mut conn, &keys, 1, n, 1, span.0, span.1).await;
        let ours_ms = ms(t.elapsed());
        let t = Instant::now();
        fill_naive(&mut conn, &nkey, 1, n, span.0, span.1).await;
        let naive_ms = ms(t.elapsed());
        check_window(&mut conn, &ours_room, name, &nkey, n, "after the fill").await;
        eprintln!(
            "  filled {}: spend.lua layout {ours_ms:.0} ms, naive {naive_ms:.0} ms",
            short(n)
        );
        fills.push(json!({ "entries": n, "ours_ms": ours_ms, "naive_ms": naive_ms }));
        windows.push((keys, nkey));
    }

    let mut cells: Vec<Vec<Cell>> = CASES
        .iter()
        .map(|_| {
            plan.sizes
                .iter()
                .map(|_| Cell {
                    ours: histogram(),
                    naive: histogram(),
                })
                .collect()
        })
        .collect();
    let mut checks = Checks {
        retry_min_ms: i64::MAX,
        ..Checks::default()
    };

    let t = Instant::now();
    for round in 0..plan.warmup + plan.samples {
        let timed = round >= plan.warmup;
        for (ci, case) in CASES.iter().enumerate() {
            for (si, name) in names.iter().enumerate() {
                let n = plan.sizes[si];
                let (limiter, limit) = if case.allowed {
                    (&ours_room, HUGE)
                } else {
                    (&ours_full, n as u64)
                };
                let nkey = naive_key(name);
                let ours_id = quota_worker::quota::request_id();
                let naive_id = quota_worker::quota::request_id();
                // Alternate which goes first, call by call.
                let mut ours_ns = 0;
                let mut naive_ns = 0;
                let mut ours_decision = None;
                let mut naive_reply = (false, 0);
                for k in 0..2 {
                    if (k + round) % 2 == 0 {
                        let t = Instant::now();
                        let d = limiter
                            .spend(name, Some(case.cost), &ours_id)
                            .await
                            .expect("spend");
                        ours_ns = t.elapsed().as_nanos() as u64;
                        ours_decision = Some(d);
                    } else {
                        let t = Instant::now();
                        naive_reply =
                            naive_spend(&mut conn, &nkey, &naive_id, case.cost, limit).await;
                        naive_ns = t.elapsed().as_nanos() as u64;
                    }
                }
                let ours_decision = ours_decision.expect("ours ran");
                assert_eq!(
                    ours_decision.is_allowed(),
                    case.allowed,
                    "spend.lua, {} at {n}: {ours_decision:?}",
                    case.label
                );
                assert_eq!(naive_reply.0, case.allowed, "naive, {} at {n}", case.label);
                if case.allowed {
                    // Take both spends back out (untimed), so every spend
                    // meets exactly n live entries.
                    undo(&mut conn, &room, name, &ours_id, &naive_id, case.cost).await;
                } else {
                    let Decision::Rejected(r) = &ours_decision else {
                        unreachable!("checked above")
                    };
                    assert_eq!(r.by, RejectedBy::Window(1), "rejecting window");
                    assert_eq!(r.remaining, 0, "remaining on a full window");
                    let ours_ms = r.retry_after.as_millis() as i64;
                    checks.retry_gap_ms = checks.retry_gap_ms.max((ours_ms - naive_reply.1).abs());
                    checks.retry_min_ms = checks.retry_min_ms.min(ours_ms);
                    checks.retry_max_ms = checks.retry_max_ms.max(ours_ms);
                }
                if timed {
                    let cell = &mut cells[ci][si];
                    cell.ours.record(ours_ns).expect("record");
                    cell.naive.record(naive_ns).expect("record");
                }
            }
        }
    }
    let sampling_s = t.elapsed().as_secs_f64();
    // Both spends on the same distribution of entries must name the same
    // instant: the 100th-oldest unit's expiry (the calls are µs apart).
    assert!(
        checks.retry_gap_ms <= 1_000,
        "spend.lua and naive retry-after differ by {} ms",
        checks.retry_gap_ms
    );
    for ((name, (_, nkey)), &n) in names.iter().zip(&windows).zip(&plan.sizes) {
        check_window(&mut conn, &ours_room, name, nkey, n, "after sampling").await;
    }

    let lats: Vec<Vec<(Lat, Lat)>> = cells
        .iter()
        .map(|row| row.iter().map(|c| (lat(&c.ours), lat(&c.naive))).collect())
        .collect();

    let svg = ctx.out.join("growth.svg");
    let plotted = match plot(&svg, &plan.sizes, &lats) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("  growth.svg: {e}");
            false
        }
    };

    let (first, last) = (plan.sizes[0], *plan.sizes.last().expect("sizes"));
    let mut targets = Vec::new();
    let mut md = String::new();
    md.push_str(&format!(
        "Method: each window pre-filled straight into its layout with n one-unit entries over the last 30 min of a sliding 1h window; \
         then {} rounds (after {} untimed) of one spend per case × size, spend.lua (`Limiter::spend`) and the naive log \
         (`naive_log.lua`) alternating call by call, each allowed spend taken back out untimed so every spend meets exactly n entries; \
         \"rejected\" runs on a window whose limit is exactly its n units.\n\n",
        plan.samples, plan.warmup
    ));
    md.push_str(&format!(
        "| live entries | case | spend.lua p50 µs | p99 µs | p50 ÷ p50 at {} | naive p50 µs | p99 µs | naive p50 ÷ spend.lua p50 |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n",
        short(first)
    ));
    let mut cases_json = Vec::new();
    for (ci, case) in CASES.iter().enumerate() {
        let base = lats[ci][0].0.p50_us;
        let mut rows = Vec::new();
        for (si, &n) in plan.sizes.iter().enumerate() {
            let (o, v) = lats[ci][si];
            md.push_str(&format!(
                "| {} | {} | {:.0} | {:.0} | {:.2}× | {:.0} | {:.0} | {:.2}× |\n",
                thousands(n as f64),
                case.label,
                o.p50_us,
                o.p99_us,
                o.p50_us / base,
                v.p50_us,
                v.p99_us,
                v.p50_us / o.p50_us
            ));
            rows.push(json!({
                "entries": n,
                "ours": o,
                "naive": v,
                "ours_p50_vs_smallest": o.p50_us / base,
                "naive_p50_vs_ours": v.p50_us / o.p50_us,
            }));
        }
        let ratio = lats[ci].last().expect("sizes").0.p50_us / base;
        targets.push(Target::new(
            format!(
                "spend p50 at {} ÷ p50 at {} live entries, {}",
                short(last),
                short(first),
                case.label
            ),
            "≤ 1.5×",
            format!(
                "{ratio:.2}× ({:.0} vs {base:.0} µs)",
                lats[ci].last().expect("sizes").0.p50_us
            ),
            ratio <= 1.5,
        ));
        cases_json.push(json!({
            "case": case.key,
            "label": case.label,
            "cost": case.cost,
            "allowed": case.allowed,
            "ours_p50_largest_vs_smallest": ratio,
            "sizes": rows,
        }));
    }
    md.push_str(&format!(
        "\nRejections: spend.lua's retry-after was {}–{} s and matched the naive log's for the same window on every call, \
         to within the time between the two calls (at most {} ms). Fills (ms, spend.lua / naive): {}.\n",
        checks.retry_min_ms / 1000,
        checks.retry_max_ms / 1000,
        checks.retry_gap_ms,
        fills
            .iter()
            .map(|f| format!(
                "{} {:.0} / {:.0}",
                short(f["entries"].as_u64().unwrap_or(0) as usize),
                f["ours_ms"].as_f64().unwrap_or(0.0),
                f["naive_ms"].as_f64().unwrap_or(0.0)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if plotted {
        md.push_str(
            "\nPlot: [growth.svg](growth.svg) (beside this report): p50 solid, p99 dashed; both axes logarithmic.\n",
        );
    } else {
        md.push_str("\nPlot: not written (see the bench's stderr).\n");
    }

    let all_keys: Vec<String> = windows
        .into_iter()
        .flat_map(|(keys, nkey)| keys.into_iter().chain([nkey]))
        .collect();
    unlink(&mut conn, &all_keys).await;
    common::flushall(&mut conn).await;

    Section {
        key: "growth",
        title: "Cost growth: spend latency against live entries".into(),
        markdown: md,
        data: json!({
            "window": { "kind": "sliding", "per_ms": PER_MS, "entry_cost": 1, "spread": "last 30 min" },
            "samples": plan.samples,
            "warmup_rounds": plan.warmup,
            "sampling_secs": sampling_s,
            "fills": fills,
            "rejections": {
                "ours_retry_after_ms_min": checks.retry_min_ms,
                "ours_retry_after_ms_max": checks.retry_max_ms,
                "max_gap_vs_naive_ms": checks.retry_gap_ms,
            },
            "cases": cases_json,
            "plot": if plotted { Some("growth.svg") } else { None },
        }),
        targets,
    }
}

/// Removes an allowed spend pair again: spend.lua's entry (the window's
/// newest) and the naive log's `cost` members. One round trip each.
async fn undo(conn: &mut Conn, q: &Quotas, name: &str, ours_id: &str, naive_id: &str, cost: u64) {
    let keys = ours_keys(q, name);
    let members: Vec<String> = (1..=cost).map(|i| format!("{naive_id}:{i}")).collect();
    let popped = pop_newest(conn, &keys, ours_id).await;
    let nrem: i64 = redis::cmd("ZREM")
        .arg(naive_key(name))
        .arg(&members)
        .query_async(conn)
        .await
        .expect("undo");
    assert_eq!(
        (popped, nrem),
        (cost as i64, cost as i64),
        "undo of an allowed spend"
    );
}

/// Both layouts hold exactly `n` live one-unit entries.
async fn check_window(
    conn: &mut Conn,
    limiter: &Limiter,
    name: &str,
    nkey: &str,
    n: usize,
    when: &str,
) {
    let keys = ours_keys(limiter.quotas(), name);
    let n = n as i64;
    assert_eq!(used_units(limiter, name).await as i64, n, "used {when}");
    assert_eq!(zcard(conn, &keys[1]).await, n, "log ids {when}");
    assert_eq!(stream_len(conn, &keys).await, n, "stream entries {when}");
    assert_eq!(zcard(conn, nkey).await, n, "naive members {when}");
}

// ------------------------------------------------------------ the plot

/// 1, 2, 5 × 10^k within [lo, hi]: labels for a log axis.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powi(lo.log10().floor() as i32);
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = decade * m;
            if (lo..=hi).contains(&t) {
                out.push(t);
            }
        }
        decade *= 10.0;
    }
    out
}

/// `growth.svg`: latency against live entries, log–log; one colour per
/// implementation × case, p50 solid with markers, p99 dashed and lighter.
fn plot(
    path: &Path,
    sizes: &[usize],
    lats: &[Vec<(Lat, Lat)>],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    // spend.lua in blues/greens, the naive log in reds/oranges.
    const OURS: [RGBColor; 4] = [
        RGBColor(31, 119, 180),
        RGBColor(23, 160, 180),
        RGBColor(110, 170, 60),
        RGBColor(44, 110, 44),
    ];
    const NAIVE_C: [RGBColor; 4] = [
        RGBColor(214, 39, 40),
        RGBColor(240, 130, 20),
        RGBColor(200, 120, 170),
        RGBColor(148, 80, 170),
    ];

    let values = lats
        .iter()
        .flatten()
        .flat_map(|(o, v)| [o.p50_us, o.p99_us, v.p50_us, v.p99_us]);
    let (lo, hi) = common::min_max(&values.collect::<Vec<_>>());
    let (ylo, yhi) = (lo.max(1.0) / 1.6, hi * 1.6);
    let xlo = sizes[0] as f64 / 1.6;
    let xhi = *sizes.last().expect("sizes") as f64 * 1.6;

    let root = SVGBackend::new(path, (1100, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(760);
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "Spend latency against live entries in the window (sliding 1h)",
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (xlo..xhi)
                .log_scale()
                .with_key_points(sizes.iter().map(|&n| n as f64).collect()),
            (ylo..yhi).log_scale().with_key_points(ticks(ylo, yhi)),
        )?;
    chart
        .configure_mesh()
        .x_desc("live entries in the window (log scale)")
        .y_desc("latency per spend, µs (log scale)")
        .x_label_formatter(&|x| short(x.round() as usize))
        .y_label_formatter(&|y| {
            if *y >= 10.0 {
                thousands(*y)
            } else {
                format!("{y:.1}")
            }
        })
        .light_line_style(WHITE.mix(0.0))
        .draw()?;

    let mut legend: Vec<(String, RGBColor, bool)> = Vec::new();
    for (ci, case) in CASES.iter().enumerate() {
        for (imp, colour) in [("spend.lua", OURS[ci]), ("naive log", NAIVE_C[ci])] {
            let pick = |p99: bool| -> Vec<(f64, f64)> {
                sizes
                    .iter()
                    .zip(&lats[ci])
                    .map(|(&n, (o, v))| {
                        let l = if imp == "spend.lua" { o } else { v };
                        (n as f64, if p99 { l.p99_us } else { l.p50_us })
                    })
                    .collect()
            };
            let p50 = pick(false);
            let p99 = pick(true);
            chart.draw_series(LineSeries::new(p50.clone(), colour.stroke_width(2)))?;
            if imp == "spend.lua" {
                chart.draw_series(p50.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
            } else {
                chart.draw_series(
                    p50.iter()
                        .map(|&p| TriangleMarker::new(p, 5, colour.filled())),
                )?;
            }
            chart.draw_series(DashedLineSeries::new(
                p99,
                6,
                4,
                colour.mix(0.55).stroke_width(1),
            ))?;
            legend.push((format!("{imp}: {}", case.label), colour, imp == "spend.lua"));
        }
    }

    // The legend beside the chart, where no line can hide it.
    let font = ("sans-serif", 15).into_font();
    let mut y = 60;
    right.draw(&Text::new("p50 (solid)", (10, y), font.clone()))?;
    y += 28;
    for (label, colour, ours) in &legend {
        right.draw(&PathElement::new(
            vec![(10, y + 8), (44, y + 8)],
            colour.stroke_width(2),
        ))?;
        if *ours {
            right.draw(&Circle::new((27, y + 8), 4, colour.filled()))?;
        } else {
            right.draw(&TriangleMarker::new((27, y + 8), 5, colour.filled()))?;
        }
        right.draw(&Text::new(label.clone(), (52, y), font.clone()))?;
        y += 26;
    }
    y += 12;
    right.draw(&PathElement::new(
        vec![(10, y + 8), (16, y + 8)],
        BLACK.mix(0.55).stroke_width(1),
    ))?;
    right.draw(&PathElement::new(
        vec![(20, y + 8), (26, y + 8)],
        BLACK.mix(0.55).stroke_width(1),
    ))?;
    right.draw(&PathElement::new(
        vec![(30, y + 8), (36, y + 8)],
        BLACK.mix(0.55).stroke_width(1),
    ))?;
    right.draw(&Text::new(
        "p99, same colour (dashed)",
        (52, y),
        font.clone(),
    ))?;
    root.present()?;
    Ok(())
}
