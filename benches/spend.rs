//! Benchmarks of `lua/spend.lua` against the baselines it replaces, on one
//! private `redis-server` in one run, reported as ratios (see BENCHMARKS.md).
//!
//! Run: `cargo bench --bench spend` (about 2 minutes). After `--`:
//! `--quick` for a short smoke run, and/or section names (`throughput`,
//! `memory`, `scaling`, `eviction`) to run only those.
//!
//! 1. Throughput and latency of `Limiter::spend` (1 and 16 clients, cost 1
//!    and 100) vs the naive sliding log (`benches/baseline/naive_log.lua`,
//!    one zset member per unit) and a fixed-window counter (INCRBY + EXPIRE).
//! 2. Memory per call after N cost-100 spends.
//! 3. Spend latency on windows holding 1k, 100k and 1M live entries,
//!    including the rejection path on a full window.
//! 4. The first spend after an idle gap: a wholly expired window (100k and
//!    1M entries), a window whose 100k oldest entries expired, and the same
//!    workload in cost-100 spends (10k entries here, 1M naive members).
//!
//! Nothing here asserts a speed; it measures and prints.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use quota_worker::config::{Config, RedisUrl};
use quota_worker::quota::{Limiter, Quotas, request_id};
use redis::aio::ConnectionManager;
use support::{RedisServer, TestConfig};

static NAIVE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("baseline/naive_log.lua")));

/// A limit no benchmark spend reaches.
const HUGE: u64 = 1_000_000_000_000;
/// Every window here is one hour.
const PER_MS: u64 = 3_600_000;
const PER_US: i64 = PER_MS as i64 * 1000;
/// Key prefix of the product's keys in this benchmark.
const PREFIX: &str = "qwb";
const TIMEOUT: Duration = Duration::from_secs(120);

/// Durations and repetitions; `--quick` shrinks them for a smoke run.
struct Plan {
    round: Duration,
    rounds: usize,
    mem_calls: usize,
    samples: usize,
    sizes: Vec<usize>,
    evict_n: usize,
    evict_reps: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                round: Duration::from_millis(200),
                rounds: 1,
                mem_calls: 192,
                samples: 50,
                sizes: vec![1_000, 100_000],
                evict_n: 10_000,
                evict_reps: 1,
            }
        } else {
            Plan {
                round: Duration::from_millis(200),
                rounds: 15,
                mem_calls: 4_800,
                samples: 300,
                sizes: vec![1_000, 100_000, 1_000_000],
                evict_n: 100_000,
                evict_reps: 3,
            }
        }
    }
}

// ---------------------------------------------------------------- setup

/// One credential `NAME` with one sliding 1h window of `units`, and an
/// endpoint `NAME` of cost 1 on it.
fn credential(name: &str, units: u64) -> String {
    format!(
        "[credentials.{name}]\nsecret_env = \"BENCH_UNUSED\"\n\
         windows = [{{ units = {units}, per = \"1h\" }}]\n\n\
         [endpoints.{name}]\ncredential = \"{name}\"\ncost = 1\n\n"
    )
}

fn quotas(credentials: &[(&str, u64)]) -> Arc<Quotas> {
    let mut text = format!("[redis]\nkey_prefix = \"{PREFIX}\"\n\n");
    for (name, units) in credentials {
        text.push_str(&credential(name, *units));
    }
    let cfg = TestConfig::new(&text, &[]);
    let config = Config::load(&cfg.path()).expect("bench config");
    Arc::new(Quotas::new(&config))
}

async fn connect(server: &RedisServer) -> ConnectionManager {
    quota_worker::conn::connect(&RedisUrl::new(server.url()), TIMEOUT, 3)
        .await
        .expect("connect")
}

/// One client: its own connection, used by all three implementations.
#[derive(Clone)]
struct Client {
    limiter: Limiter,
    conn: ConnectionManager,
}

impl Client {
    async fn new(server: &RedisServer, quotas: Arc<Quotas>) -> Self {
        let conn = connect(server).await;
        Client {
            limiter: Limiter::new(conn.clone(), quotas, TIMEOUT),
            conn,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Imp {
    Ours,
    Naive,
    Fixed,
}

impl Imp {
    const ALL: [Imp; 3] = [Imp::Ours, Imp::Naive, Imp::Fixed];

    fn name(self) -> &'static str {
        match self {
            Imp::Ours => "spend.lua",
            Imp::Naive => "naive log",
            Imp::Fixed => "fixed counter",
        }
    }
}

/// The fixed-window counter's key for the current hour.
fn fixed_key(credential: &str) -> String {
    let hour = chrono::Utc::now().timestamp() / 3600;
    format!("fw:{{{credential}}}:{hour}")
}

fn naive_key(credential: &str) -> String {
    format!("nv:{{{credential}}}:log")
}

/// One spend by `imp` on credential `cred` (endpoint of the same name).
async fn spend(c: &mut Client, imp: Imp, cred: &str, cost: u64, limit: u64) -> bool {
    match imp {
        Imp::Ours => c
            .limiter
            .spend(cred, Some(cost), &request_id())
            .await
            .expect("spend")
            .is_allowed(),
        Imp::Naive => naive(&mut c.conn, &naive_key(cred), cost, limit).await,
        Imp::Fixed => {
            // What teams write today: count per calendar hour, one round trip.
            let key = fixed_key(cred);
            let (n,): (u64,) = redis::pipe()
                .cmd("INCRBY")
                .arg(&key)
                .arg(cost)
                .cmd("EXPIRE")
                .arg(&key)
                .arg(PER_MS / 1000 + 60)
                .ignore()
                .query_async(&mut c.conn)
                .await
                .expect("incrby");
            n <= limit
        }
    }
}

async fn naive(conn: &mut ConnectionManager, key: &str, cost: u64, limit: u64) -> bool {
    let r: Vec<i64> = NAIVE
        .key(key)
        .arg(request_id())
        .arg(cost)
        .arg(limit)
        .arg(PER_MS)
        .invoke_async(conn)
        .await
        .expect("naive spend");
    r[0] == 1
}

async fn del(conn: &mut ConnectionManager, keys: &[String]) {
    let _: () = redis::cmd("DEL")
        .arg(keys)
        .query_async(conn)
        .await
        .expect("del");
}

async fn redis_now_us(conn: &mut ConnectionManager) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

async fn info_field(conn: &mut ConnectionManager, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("?")
        .trim()
        .to_owned()
}

async fn used_memory(conn: &mut ConnectionManager) -> i64 {
    info_field(conn, "memory", "used_memory")
        .await
        .parse()
        .expect("used_memory")
}

async fn memory_usage(conn: &mut ConnectionManager, key: &str) -> i64 {
    let n: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .expect("MEMORY USAGE");
    n.unwrap_or(0)
}

/// Writes `n` entries of `cost` units straight into a sliding window in the
/// spend script's layout (log zset + units hash + "#used"), spend times
/// evenly spread over [from_us, to_us). Ids look like real ones (32 hex).
async fn fill_ours(
    conn: &mut ConnectionManager,
    keys: &[String],
    tag: u32,
    n: usize,
    cost: u64,
    from_us: i64,
    to_us: i64,
) {
    let (log, units) = (&keys[0], &keys[1]);
    let mut pipe = redis::pipe();
    let mut queued = 0;
    for chunk_start in (0..n).step_by(1000) {
        let end = (chunk_start + 1000).min(n);
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(log);
        let mut hset = redis::cmd("HSET");
        hset.arg(units);
        for i in chunk_start..end {
            let id = format!("{tag:08x}{i:024x}");
            zadd.arg(from_us + (to_us - from_us) * i as i64 / n as i64)
                .arg(&id);
            hset.arg(&id).arg(cost);
        }
        pipe.add_command(zadd).ignore().add_command(hset).ignore();
        queued += 1;
        if queued == 20 {
            let _: () = pipe.query_async(conn).await.expect("fill");
            pipe = redis::pipe();
            queued = 0;
        }
    }
    pipe.cmd("HINCRBY")
        .arg(units)
        .arg("#used")
        .arg(n as u64 * cost)
        .ignore();
    let _: () = pipe.query_async(conn).await.expect("fill");
}

/// The same for the naive log: `n` single-unit members.
async fn fill_naive(
    conn: &mut ConnectionManager,
    key: &str,
    tag: u32,
    n: usize,
    from_us: i64,
    to_us: i64,
) {
    let mut pipe = redis::pipe();
    let mut queued = 0;
    for chunk_start in (0..n).step_by(1000) {
        let end = (chunk_start + 1000).min(n);
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(key);
        for i in chunk_start..end {
            zadd.arg(from_us + (to_us - from_us) * i as i64 / n as i64)
                .arg(format!("{tag:08x}{i:024x}:1"));
        }
        pipe.add_command(zadd).ignore();
        queued += 1;
        if queued == 40 {
            let _: () = pipe.query_async(conn).await.expect("fill");
            pipe = redis::pipe();
            queued = 0;
        }
    }
    if queued > 0 {
        let _: () = pipe.query_async(conn).await.expect("fill");
    }
}

// ---------------------------------------------------------------- stats

#[derive(Clone, Copy, Debug)]
struct Lat {
    p50: f64,
    p99: f64,
}

/// Percentiles (µs) of latencies in ns.
fn lat(mut ns: Vec<u64>) -> Lat {
    ns.sort_unstable();
    let at = |q: usize| ns[(ns.len() * q / 100).min(ns.len() - 1)] as f64 / 1000.0;
    Lat {
        p50: at(50),
        p99: at(99),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// ---------------------------------------------------------------- 1. throughput

/// Runs `clients` concurrent spenders for `d`; returns (spends/s, latencies).
async fn run_clients(clients: &[Client], imp: Imp, cost: u64, d: Duration) -> (f64, Vec<u64>) {
    let start = Instant::now();
    let deadline = start + d;
    let handles: Vec<_> = clients
        .iter()
        .cloned()
        .map(|mut c| {
            tokio::spawn(async move {
                let mut lats = Vec::with_capacity(1 << 14);
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let ok = spend(&mut c, imp, "tp", cost, HUGE).await;
                    lats.push(t.elapsed().as_nanos() as u64);
                    assert!(ok, "{imp:?} rejected a spend on a huge window");
                }
                lats
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("client"));
    }
    let secs = start.elapsed().as_secs_f64();
    (all.len() as f64 / secs, all)
}

async fn throughput(plan: &Plan, clients: &[Client], admin: &mut ConnectionManager) {
    let ours_keys = clients[0]
        .limiter
        .quotas()
        .endpoint("tp")
        .unwrap()
        .plan
        .keys[2..]
        .to_vec();
    let mut keys = ours_keys.clone();
    keys.push(naive_key("tp"));
    keys.push(fixed_key("tp"));

    print!(
        "| clients | cost | implementation | spends/s (median of rounds) | p50 µs | p99 µs | spend.lua ÷ this, spends/s (median of per-round ratios; range) |\n\
         |---:|---:|---|---:|---:|---:|---|\n",
    );
    for n in [1usize, 16] {
        for cost in [1u64, 100] {
            let cs = &clients[..n];
            // Warm-up: loads the scripts, warms the connections.
            for imp in Imp::ALL {
                run_clients(cs, imp, cost, Duration::from_millis(150)).await;
            }
            let mut rates: Vec<Vec<f64>> = vec![Vec::new(); 3];
            let mut lats: Vec<Vec<u64>> = vec![Vec::new(); 3];
            for round in 0..plan.rounds {
                // Rotate the order so no implementation always runs first.
                for k in 0..3 {
                    let i = (k + round) % 3;
                    del(admin, &keys).await;
                    let (rate, l) = run_clients(cs, Imp::ALL[i], cost, plan.round).await;
                    rates[i].push(rate);
                    lats[i].extend(l);
                }
            }
            del(admin, &keys).await;
            for (i, imp) in Imp::ALL.iter().enumerate() {
                let l = lat(std::mem::take(&mut lats[i]));
                let rel = if *imp == Imp::Ours {
                    "1 (reference)".to_owned()
                } else {
                    let per_round: Vec<f64> =
                        rates[0].iter().zip(&rates[i]).map(|(o, b)| o / b).collect();
                    let (lo, hi) = min_max(&per_round);
                    format!("**{:.2}×** ({lo:.2}–{hi:.2})", median(per_round))
                };
                let line = format!(
                    "| {n} | {cost} | {} | {:.0} | {:.0} | {:.0} | {rel} |\n",
                    imp.name(),
                    median(rates[i].clone()),
                    l.p50,
                    l.p99
                );
                print!("{line}");
            }
        }
    }
}

// ---------------------------------------------------------------- 2. memory

async fn memory(plan: &Plan, clients: &[Client], admin: &mut ConnectionManager) {
    let n = plan.mem_calls;
    let ours_keys = clients[0]
        .limiter
        .quotas()
        .endpoint("mem")
        .unwrap()
        .plan
        .keys[2..]
        .to_vec();
    let mut all = ours_keys.clone();
    all.push(naive_key("mem"));
    all.push(fixed_key("mem"));
    del(admin, &all).await;

    print!(
        "| implementation | keys after N spends | MEMORY USAGE (bytes) | bytes / call | used_memory Δ / call | vs spend.lua |\n\
         |---|---|---:|---:|---:|---|\n",
    );
    let mut ours_per_call = 0.0;
    for imp in Imp::ALL {
        let keys: Vec<String> = match imp {
            Imp::Ours => ours_keys.clone(),
            Imp::Naive => vec![naive_key("mem")],
            Imp::Fixed => vec![fixed_key("mem")],
        };
        let before = used_memory(admin).await;
        // N cost-100 spends from 16 clients.
        let per_client = n / clients.len();
        let handles: Vec<_> = clients
            .iter()
            .cloned()
            .map(|mut c| {
                tokio::spawn(async move {
                    for _ in 0..per_client {
                        assert!(spend(&mut c, imp, "mem", 100, HUGE).await);
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.expect("client");
        }
        let calls = per_client * clients.len();
        let after = used_memory(admin).await;
        let mut usage = 0;
        for k in &keys {
            usage += memory_usage(admin, k).await;
        }
        let per_call = usage as f64 / calls as f64;
        if imp == Imp::Ours {
            ours_per_call = per_call;
        }
        let rel = match imp {
            Imp::Ours => "1 (reference)".to_owned(),
            Imp::Naive => format!("**{:.0}× more**", per_call / ours_per_call),
            Imp::Fixed => format!("{:.4}× (O(1) total, inexact)", per_call / ours_per_call),
        };
        let line = format!(
            "| {} | {} ({calls} calls) | {usage} | {per_call:.1} | {:.1} | {rel} |\n",
            imp.name(),
            keys.len(),
            (after - before) as f64 / calls as f64,
        );
        print!("{line}");
        del(admin, &keys).await;
    }
}

// ---------------------------------------------------------------- 3. scaling

/// One timed spend; it must be `allowed` as expected.
async fn timed(c: &mut Client, imp: Imp, cred: &str, cost: u64, limit: u64, allowed: bool) -> u64 {
    let t = Instant::now();
    let ok = spend(c, imp, cred, cost, limit).await;
    let ns = t.elapsed().as_nanos() as u64;
    assert_eq!(ok, allowed, "{imp:?} on {cred}: allowed {ok}");
    ns
}

/// Every size is filled at once (credential `s<n>` each) and sampled round
/// robin, spend.lua and naive alternating, so load on this shared machine
/// hits all sizes and both designs alike.
async fn scaling(plan: &Plan, server: &RedisServer, admin: &mut ConnectionManager) {
    let names: Vec<String> = plan.sizes.iter().map(|n| format!("s{n}")).collect();
    // Same key names under both plans (window keys do not depend on units):
    // `full` has units = n, so the filled window is exactly full; `room` has
    // room for everything.
    let room = quotas(&names.iter().map(|s| (s.as_str(), HUGE)).collect::<Vec<_>>());
    let full = quotas(
        &names
            .iter()
            .zip(&plan.sizes)
            .map(|(s, n)| (s.as_str(), *n as u64))
            .collect::<Vec<_>>(),
    );
    let mut c_room = Client::new(server, room.clone()).await;
    let mut c_full = Client::new(server, full).await;
    let mut all = Vec::new();
    for (name, &n) in names.iter().zip(&plan.sizes) {
        let keys = room.endpoint(name).unwrap().plan.keys[2..].to_vec();
        let nkey = naive_key(name);
        del(admin, &keys).await;
        del(admin, std::slice::from_ref(&nkey)).await;
        let now = redis_now_us(admin).await;
        let t = Instant::now();
        // Live entries spread over the last 30 minutes of the 1h window.
        fill_ours(admin, &keys, 1, n, 1, now - PER_US / 2, now - 1_000_000).await;
        let fill_ours_ms = ms(t.elapsed());
        let t = Instant::now();
        fill_naive(admin, &nkey, 1, n, now - PER_US / 2, now - 1_000_000).await;
        let fill_naive_ms = ms(t.elapsed());
        eprintln!(
            "  filled {n}: spend.lua layout {fill_ours_ms:.0} ms, naive {fill_naive_ms:.0} ms"
        );
        all.extend(keys);
        all.push(nkey);
    }

    print!(
        "| live entries | case | spend.lua p50 µs | p99 µs | p50 ÷ p50 at {} | naive log p50 µs | p99 µs | naive ÷ spend.lua (p50) |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|\n",
        plan.sizes[0]
    );
    // Rejection first, while each window is exactly full (used = n): a cost
    // of 100 needs the 100 oldest entries freed.
    let cases: [(&str, u64, bool); 3] = [
        ("reject, full window, cost 100", 100, false),
        ("allow, cost 1", 1, true),
        ("allow, cost 100", 100, true),
    ];
    for (name, cost, allowed) in cases {
        let (c, limit_of): (&mut Client, fn(usize) -> u64) = if allowed {
            (&mut c_room, |_| HUGE)
        } else {
            (&mut c_full, |n| n as u64)
        };
        let mut ours: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
        let mut naive: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
        for i in 0..plan.samples + 20 {
            for (j, (cred, &n)) in names.iter().zip(&plan.sizes).enumerate() {
                let o = timed(c, Imp::Ours, cred, cost, limit_of(n), allowed).await;
                let v = timed(c, Imp::Naive, cred, cost, limit_of(n), allowed).await;
                // The first 20 rounds warm up.
                if i >= 20 {
                    ours[j].push(o);
                    naive[j].push(v);
                }
            }
        }
        let ours: Vec<Lat> = ours.into_iter().map(lat).collect();
        let naive: Vec<Lat> = naive.into_iter().map(lat).collect();
        for (j, n) in plan.sizes.iter().enumerate() {
            let (o, v) = (ours[j], naive[j]);
            let line = format!(
                "| {n} | {name} | {:.0} | {:.0} | {:.2}× | {:.0} | {:.0} | {:.2}× |\n",
                o.p50,
                o.p99,
                o.p50 / ours[0].p50,
                v.p50,
                v.p99,
                v.p50 / o.p50
            );
            print!("{line}");
        }
    }
    del(admin, &all).await;
}

// ---------------------------------------------------------------- 4. eviction

/// One idle-gap case: `expired` spends of `cost` units each, all older than
/// the window, then `live` spends of 1 unit within it.
struct Gap {
    name: String,
    expired: usize,
    cost: u64,
    live: usize,
}

/// Times the first spend on windows whose entries expired during an idle gap.
async fn eviction(plan: &Plan, server: &RedisServer, admin: &mut ConnectionManager) {
    let room = quotas(&[("ev", HUGE)]);
    let mut c = Client::new(server, room.clone()).await;
    let keys = room.endpoint("ev").unwrap().plan.keys[2..].to_vec();
    let nkey = naive_key("ev");
    let mut all = keys.clone();
    all.push(nkey.clone());

    let n = plan.evict_n;
    let live = 1_000;
    print!(
        "| case | entries (spend.lua / naive) | spend.lua first spend, ms | next spend, ms | naive log first spend, ms | naive ÷ spend.lua |\n\
         |---|---|---:|---:|---:|---:|\n",
    );
    let mut cases = vec![
        Gap {
            name: format!("{n} cost-1 spends, all expired (whole window)"),
            expired: n,
            cost: 1,
            live: 0,
        },
        Gap {
            name: format!("{n} cost-1 spends expired + {live} live (batched eviction)"),
            expired: n,
            cost: 1,
            live,
        },
        Gap {
            name: format!(
                "{} cost-100 spends expired + {live} live (same workload, weighted)",
                n / 10
            ),
            expired: n / 10,
            cost: 100,
            live,
        },
    ];
    if plan.sizes.contains(&1_000_000) {
        cases.push(Gap {
            name: "1000000 cost-1 spends, all expired (whole window)".into(),
            expired: 1_000_000,
            cost: 1,
            live: 0,
        });
    }
    for g in cases {
        let mut first = Vec::new();
        let mut next = Vec::new();
        let mut naive_first = Vec::new();
        for _ in 0..plan.evict_reps {
            del(admin, &all).await;
            let now = redis_now_us(admin).await;
            // Expired: spent between 2h and 1h+10s ago; live: the last 10 min.
            let (old_from, old_to) = (now - 2 * PER_US, now - PER_US - 10_000_000);
            let (live_from, live_to) = (now - 600_000_000, now - 1_000_000);
            fill_ours(admin, &keys, 2, g.expired, g.cost, old_from, old_to).await;
            if g.live > 0 {
                fill_ours(admin, &keys, 3, g.live, 1, live_from, live_to).await;
            }
            let t = Instant::now();
            assert!(spend(&mut c, Imp::Ours, "ev", 1, HUGE).await);
            first.push(ms(t.elapsed()));
            let t = Instant::now();
            assert!(spend(&mut c, Imp::Ours, "ev", 1, HUGE).await);
            next.push(ms(t.elapsed()));
            // Correct after eviction: only the live entries and our 2 spends.
            let used: i64 = redis::cmd("HGET")
                .arg(&keys[1])
                .arg("#used")
                .query_async(admin)
                .await
                .expect("HGET");
            assert_eq!(used, g.live as i64 + 2, "{}: #used after eviction", g.name);
            let card: i64 = redis::cmd("ZCARD")
                .arg(&keys[0])
                .query_async(admin)
                .await
                .expect("ZCARD");
            assert_eq!(
                card,
                g.live as i64 + 2,
                "{}: entries after eviction",
                g.name
            );
            del(admin, &all).await;

            // The naive log holds one member per unit.
            let members = g.expired * g.cost as usize;
            fill_naive(admin, &nkey, 2, members, old_from, old_to).await;
            if g.live > 0 {
                fill_naive(admin, &nkey, 3, g.live, live_from, live_to).await;
            }
            let t = Instant::now();
            assert!(naive(&mut c.conn, &nkey, 1, HUGE).await);
            naive_first.push(ms(t.elapsed()));
            let card: i64 = redis::cmd("ZCARD")
                .arg(&nkey)
                .query_async(admin)
                .await
                .expect("ZCARD");
            assert_eq!(card, g.live as i64 + 1, "{}: naive members after", g.name);
        }
        let (f, x, v) = (median(first), median(next), median(naive_first));
        let line = format!(
            "| {} | {} / {} | {f:.2} | {x:.2} | {v:.2} | {:.2}× |\n",
            g.name,
            g.expired + g.live,
            g.expired * g.cost as usize + g.live,
            v / f
        );
        print!("{line}");
    }
    del(admin, &all).await;
}

// ---------------------------------------------------------------- main

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "?".into())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

async fn bench(quick: bool, only: &[String]) {
    let plan = Plan::new(quick);
    let run = |section: &str| only.is_empty() || only.iter().any(|o| section.contains(o.as_str()));
    let server = RedisServer::start();
    let tp = quotas(&[("tp", HUGE), ("mem", HUGE)]);
    let mut admin = connect(&server).await;
    let mut clients = Vec::new();
    for _ in 0..16 {
        clients.push(Client::new(&server, tp.clone()).await);
    }
    let version = info_field(&mut admin, "server", "redis_version").await;
    let started = Instant::now();
    println!(
        "# spend.lua benchmark{}",
        if quick { " (--quick)" } else { "" }
    );
    println!(
        "date {} | nproc {} | CPU {} | redis-server {version} (private, 127.0.0.1:{}) | load avg at start {}\n",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model(),
        server.port(),
        loadavg(),
    );

    if run("throughput") {
        println!(
            "## 1. Throughput (1h window, never full; {} interleaved rounds of {:?} each)\n",
            plan.rounds, plan.round
        );
        throughput(&plan, &clients, &mut admin).await;
    }
    if run("memory") {
        println!("\n## 2. Memory after {} cost-100 spends\n", plan.mem_calls);
        memory(&plan, &clients, &mut admin).await;
    }
    if run("scaling") {
        println!(
            "\n## 3. Latency vs live entries in the window ({} interleaved spends each)\n",
            plan.samples
        );
        scaling(&plan, &server, &mut admin).await;
    }
    if run("eviction") {
        println!(
            "\n## 4. First spend after an idle gap (median of {})\n",
            plan.evict_reps
        );
        eviction(&plan, &server, &mut admin).await;
    }
    println!(
        "\ntotal {:.0} s | load avg at end {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
}

/// `cargo bench --bench spend [-- [--quick] [SECTION...]]`, SECTION one of
/// throughput, memory, scaling, eviction (default: all).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    // cargo passes `--bench`; anything not starting with `-` picks sections.
    let only: Vec<String> = args.into_iter().filter(|a| !a.starts_with('-')).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench(quick, &only));
}
