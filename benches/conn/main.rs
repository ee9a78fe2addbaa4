//! What the connection that follows the master (`conn::Conn`, issue 36)
//! costs per command beside the plain redis-rs `ConnectionManager` the
//! daemon used before it: the same commands on one private `redis-server`,
//! the two interleaved round by round in one run, so that this machine's
//! load falls on both alike. Per command: wall time, this process's CPU
//! (the wrapper's own work: an `Arc`, a `watch` read, a look at the reply)
//! and Redis's CPU (which should not move: the wrapper sends nothing more).
//!
//! Section `tasks` (`tasks.rs`): Redis commands and Redis CPU per
//! one-page task, with and without `queue_replicas = 1`.
//!
//! ```sh
//! cargo bench --bench conn                 # both sections (about 5 minutes)
//! cargo bench --bench conn -- commands     # per command only (about a minute)
//! cargo bench --bench conn -- tasks        # per task only
//! cargo bench --bench conn -- --quick      # smoke run
//! ```
//!
//! `cargo test --all-targets` runs it as the smoke run. Nothing here
//! asserts a speed: BENCHMARKS.md §17 quotes the numbers.

// The integration tests' support library; the benchmark uses its Redis.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

mod tasks;

use std::time::{Duration, Instant};

use quota_worker::config::RedisUrl;
use quota_worker::conn::{Conn, Master, Timeouts};
use redis::aio::{ConnectionLike, ConnectionManager};
use support::RedisServer;

/// What one workload measured, per command.
#[derive(Debug, Clone, Copy, Default)]
struct PerCommand {
    wall_us: f64,
    client_cpu_us: f64,
    redis_cpu_us: f64,
}

/// One at a time (a round trip each: the latency a task's step sees), or
/// this many tasks at once on the one shared connection (the daemon's
/// shape: every task slot on one multiplexed connection).
const SHAPES: [(&str, usize); 2] = [("one at a time", 1), ("64 at once", 64)];

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` (the test
    // suite, CI) passes nothing and gets the smoke run.
    let mut quick = !std::env::args().any(|a| a == "--bench");
    let mut only = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--quick" => quick = true,
            "--bench" => {}
            "commands" | "tasks" => only.push(a),
            s => {
                eprintln!("unknown argument {s:?}; sections: commands tasks");
                std::process::exit(64);
            }
        }
    }
    let wanted = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if wanted("commands") {
        rt.block_on(commands(quick));
    }
    if wanted("tasks") {
        rt.block_on(tasks::section(quick));
    }
}

/// Section `commands`: the wrapper against `ConnectionManager`.
async fn commands(quick: bool) {
    let (rounds, commands) = if quick { (1, 2_000) } else { (5, 40_000) };
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).expect("client");
    let plain = ConnectionManager::new(client)
        .await
        .expect("ConnectionManager");
    let master = Master::Url(RedisUrl::new(redis.url()));
    let wrapped = Conn::connect(&master, Timeouts::both(Duration::from_secs(10)), "bench")
        .await
        .expect("Conn");
    println!(
        "conn: {rounds} rounds of {commands} INCRs each way and shape, interleaved, redis-server on 127.0.0.1"
    );
    println!(
        "| shape | connection | wall µs/command | client CPU µs/command | Redis CPU µs/command |"
    );
    println!("|---|---|---:|---:|---:|");
    for (shape, at_once) in SHAPES {
        let mut plain_runs = Vec::new();
        let mut wrapped_runs = Vec::new();
        for round in 0..rounds {
            // Which goes first alternates: neither always gets the warmer
            // machine.
            let p = || run(&redis, plain.clone(), commands, at_once);
            let w = || run(&redis, wrapped.clone(), commands, at_once);
            if round % 2 == 0 {
                plain_runs.push(p().await);
                wrapped_runs.push(w().await);
            } else {
                wrapped_runs.push(w().await);
                plain_runs.push(p().await);
            }
        }
        let (p, w) = (median(&plain_runs), median(&wrapped_runs));
        row(shape, "ConnectionManager", p);
        row(shape, "conn::Conn", w);
        println!(
            "| {shape} | ratio Conn ÷ ConnectionManager | {:.3} | {:.3} | {:.3} |",
            w.wall_us / p.wall_us,
            w.client_cpu_us / p.client_cpu_us,
            w.redis_cpu_us / p.redis_cpu_us
        );
    }
}

fn row(shape: &str, what: &str, m: PerCommand) {
    println!(
        "| {shape} | {what} | {:.2} | {:.2} | {:.2} |",
        m.wall_us, m.client_cpu_us, m.redis_cpu_us
    );
}

/// `commands` INCRs on `conn`, `at_once` tasks sharing it.
async fn run<C>(redis: &RedisServer, conn: C, commands: usize, at_once: usize) -> PerCommand
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let redis_cpu0 = redis_cpu_us(redis);
    let cpu0 = process_cpu_us();
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..at_once {
        let mut c = conn.clone();
        let n = commands / at_once;
        tasks.spawn(async move {
            let key = format!("bench:conn:{i}");
            for _ in 0..n {
                let _: i64 = redis::cmd("INCR")
                    .arg(&key)
                    .query_async(&mut c)
                    .await
                    .expect("INCR");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a task");
    }
    let n = (commands / at_once * at_once) as f64;
    PerCommand {
        wall_us: t.elapsed().as_secs_f64() * 1e6 / n,
        client_cpu_us: (process_cpu_us() - cpu0) / n,
        redis_cpu_us: (redis_cpu_us(redis) - redis_cpu0) / n,
    }
}

/// Each field's median over the rounds.
fn median(runs: &[PerCommand]) -> PerCommand {
    let m = |f: fn(&PerCommand) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    PerCommand {
        wall_us: m(|r| r.wall_us),
        client_cpu_us: m(|r| r.client_cpu_us),
        redis_cpu_us: m(|r| r.redis_cpu_us),
    }
}

/// This process's user + system CPU time so far, in µs.
fn process_cpu_us() -> f64 {
    // SAFETY: getrusage writes into the struct it is given, nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0, "getrusage");
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(u.ru_utime) + us(u.ru_stime)
}

/// Redis's `used_cpu_user + used_cpu_sys` so far, in µs.
pub(crate) fn redis_cpu_us(redis: &RedisServer) -> f64 {
    let info: String = redis.cmd(&["INFO", "cpu"]);
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("used_cpu_user") + field("used_cpu_sys")) * 1e6
}
