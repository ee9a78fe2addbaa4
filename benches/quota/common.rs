//! Helpers shared by the sections: connections, Redis introspection,
//! latency percentiles, number formatting.

use std::time::Duration;

use hdrhistogram::Histogram;
use quota_worker::config::RedisUrl;
use quota_worker::conn::Conn;
use serde::Serialize;

use crate::support::{ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

pub const TIMEOUT: Duration = Duration::from_secs(120);

/// Callers and interleaved rounds of a section that compares spends/s.
pub struct Plan {
    pub callers: Vec<usize>,
    pub rounds: usize,
    pub round: Duration,
}

impl Plan {
    /// `full`, or for the smoke run one 100 ms round at 8 callers.
    pub fn quick_or(quick: bool, full: Plan) -> Plan {
        if quick {
            Plan {
                callers: vec![8],
                rounds: 1,
                round: Duration::from_millis(100),
            }
        } else {
            full
        }
    }
}

/// One spend of `cost` (default: the endpoint's) on a window that never
/// fills: anything but an admission is a bug in the section.
pub async fn spend_admitted(
    limiter: &quota_worker::quota::Limiter,
    endpoint: &str,
    cost: Option<u64>,
) {
    let id = quota_worker::quota::request_id();
    let d = limiter.spend(endpoint, cost, &id).await.expect("spend");
    assert!(
        d.is_allowed(),
        "{endpoint}: {d:?} on a window that never fills"
    );
}

/// A multiplexed connection, as the daemon makes them.
pub async fn connect(server: &RedisServer) -> Conn {
    quota_worker::conn::connect(
        &quota_worker::conn::Master::Url(RedisUrl::new(server.url())),
        TIMEOUT,
        "test",
    )
    .await
    .expect("connect")
}

pub async fn del(conn: &mut Conn, keys: &[String]) {
    if keys.is_empty() {
        return;
    }
    let _: () = redis::cmd("DEL")
        .arg(keys)
        .query_async(conn)
        .await
        .expect("del");
}

pub async fn flushall(conn: &mut Conn) {
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async(conn)
        .await
        .expect("FLUSHALL");
}

pub async fn redis_now_us(conn: &mut Conn) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

pub async fn info_field(conn: &mut Conn, section: &str, field: &str) -> String {
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

pub async fn used_memory(conn: &mut Conn) -> i64 {
    info_field(conn, "memory", "used_memory")
        .await
        .parse()
        .expect("used_memory")
}

/// A server setting's value (`CONFIG GET`).
pub async fn config_get(conn: &mut Conn, name: &str) -> String {
    let kv: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .expect("CONFIG GET");
    kv.get(1).cloned().expect("a config value")
}

pub async fn config_set(conn: &mut Conn, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .expect("CONFIG SET");
}

/// `CONFIG RESETSTAT`: `INFO commandstats` and the like count from here.
pub async fn reset_stats(conn: &mut Conn) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// `MEMORY USAGE key SAMPLES 0` (exact: every element counted).
pub async fn memory_usage(conn: &mut Conn, key: &str) -> i64 {
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

/// A latency recorder in ns (1 ns .. 60 s, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Percentiles in µs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Lat {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub samples: u64,
}

pub fn lat(h: &Histogram<u64>) -> Lat {
    let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
    Lat {
        p50_us: q(0.50),
        p99_us: q(0.99),
        p999_us: q(0.999),
        samples: h.len(),
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

/// 12345.6 -> "12,346".
pub fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x.round());
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// `n` tasks call `f` back to back for `d` (each at least once, so a task
/// that starts late on a loaded machine still counts); returns (calls,
/// seconds, each call's latency in ns).
pub async fn drive<F, Fut>(n: usize, d: Duration, f: F) -> (u64, f64, Vec<u64>)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let start = std::time::Instant::now();
    let deadline = start + d;
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let f = f.clone();
            tokio::spawn(async move {
                let mut ns = Vec::with_capacity(4096);
                loop {
                    let t = std::time::Instant::now();
                    f().await;
                    ns.push(t.elapsed().as_nanos() as u64);
                    if std::time::Instant::now() >= deadline {
                        break ns;
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a caller task panicked"));
    }
    let secs = start.elapsed().as_secs_f64();
    (all.len() as u64, secs, all)
}

/// Percentiles of latencies in ns.
pub fn percentiles(ns: &[u64]) -> Lat {
    let mut h = histogram();
    for &v in ns {
        h.saturating_record(v.max(1));
    }
    lat(&h)
}

/// A rate measured in interleaved rounds: the median, and ours ÷ another
/// per round (median, min, max), > 1 when ours is faster.
#[derive(Debug, Clone, Serialize)]
pub struct Rounds {
    pub rates: Vec<f64>,
    pub p50_us: Vec<f64>,
}

impl Rounds {
    pub fn median_rate(&self) -> f64 {
        median(self.rates.clone())
    }

    pub fn median_p50_us(&self) -> f64 {
        median(self.p50_us.clone())
    }

    /// (median, min, max) of self ÷ other, round by round.
    pub fn ratio(&self, other: &Rounds) -> (f64, f64, f64) {
        let per: Vec<f64> = self
            .rates
            .iter()
            .zip(&other.rates)
            .map(|(a, b)| a / b)
            .collect();
        let (lo, hi) = min_max(&per);
        (median(per), lo, hi)
    }
}

/// The config of a section that compares one window kind with a sliding
/// spend: the credential and endpoint `name` with `window`, and `sl` with
/// a sliding hour of a trillion units (neither fills), each endpoint cost
/// 1, keys under `prefix`.
pub fn versus_sliding(prefix: &str, name: &str, window: Window) -> TestConfig {
    let unused = |name: &str| Credential::env(name, "BENCH_UNUSED");
    ConfigBuilder::new()
        .key_prefix(prefix)
        .credential(unused(name).window(window))
        .credential(unused("sl").window(Window::sliding(1_000_000_000_000, "1h")))
        .endpoint(Endpoint::new(name, name, 1))
        .endpoint(Endpoint::new("sl", "sl", 1))
        .write()
}

/// A limiter on the windows of `cfg` over one connection to `server`,
/// emptied first and without history, as the sections that compare one
/// window kind with a sliding spend measure it; and the connection, to
/// empty it again after.
pub async fn limiter_on(
    server: &RedisServer,
    cfg: &TestConfig,
) -> (quota_worker::quota::Limiter, Conn) {
    let config = quota_worker::config::Config::load(&cfg.path()).expect("the section's config");
    let mut conn = connect(server).await;
    flushall(&mut conn).await;
    let limiter = quota_worker::quota::Limiter::new(
        conn.clone(),
        std::sync::Arc::new(quota_worker::quota::Quotas::new(&config)),
        TIMEOUT,
    )
    .without_history();
    (limiter, conn)
}

/// Interleaved rounds of `endpoints[0]` against `endpoints[1]` at `n`
/// callers; `call(endpoint)` is one call. Round 0 warms up and is dropped;
/// which one goes first alternates, so neither always runs warmer.
pub async fn rounds<F, Fut>(
    plan: &Plan,
    n: usize,
    endpoints: [&'static str; 2],
    call: F,
) -> [Rounds; 2]
where
    F: Fn(&'static str) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let mut out = [0, 1].map(|_| Rounds {
        rates: Vec::new(),
        p50_us: Vec::new(),
    });
    for r in 0..plan.rounds + 1 {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let endpoint = endpoints[k];
            let call = call.clone();
            let (calls, secs, ns) = drive(n, plan.round, move || call(endpoint)).await;
            if r > 0 {
                out[k].rates.push(calls as f64 / secs);
                out[k].p50_us.push(percentiles(&ns).p50_us);
            }
        }
    }
    out
}

/// The last cells of an "ours ÷ theirs" table row — each side's median
/// rate (p50 µs), then ours ÷ theirs per round, median (min–max) — and
/// that ratio as (median, min, max).
pub fn versus_cells(r: &[Rounds; 2]) -> (String, (f64, f64, f64)) {
    let (ratio, lo, hi) = r[0].ratio(&r[1]);
    let cells = format!(
        "{} ({}) | {} ({}) | **{ratio:.2}×** ({lo:.2}–{hi:.2})",
        thousands(r[0].median_rate()),
        thousands(r[0].median_p50_us()),
        thousands(r[1].median_rate()),
        thousands(r[1].median_p50_us()),
    );
    (cells, (ratio, lo, hi))
}

/// A table of one window kind (`name`: `bucket`, `concurrent`) against a
/// one-window sliding spend, by cost and callers: its markdown rows, the
/// target (≥ 0.9×) at the most callers of each cost, and the JSON cells.
pub struct VersusSliding {
    name: &'static str,
    /// What the target compares, e.g. "bucket window spends/s".
    what: &'static str,
    pub markdown: String,
    pub targets: Vec<crate::report::Target>,
    pub data: Vec<serde_json::Value>,
}

impl VersusSliding {
    /// A table whose markdown starts with `head` (its text and header).
    pub fn new(name: &'static str, what: &'static str, head: String) -> Self {
        VersusSliding {
            name,
            what,
            markdown: head,
            targets: Vec::new(),
            data: Vec::new(),
        }
    }

    /// The row of `cost` at `n` callers (`last`: the most callers, which
    /// the target reads), from rounds of this kind (`r[0]`) and sliding.
    pub fn row(&mut self, cost: u64, n: usize, last: bool, r: &[Rounds; 2]) {
        let (cells, (ratio, lo, hi)) = versus_cells(r);
        self.markdown
            .push_str(&format!("| {cost} | {n} | {cells} |\n"));
        eprintln!(
            "  cost {cost}, {n} callers: {} ÷ sliding {ratio:.2}×",
            self.name
        );
        if last {
            self.targets.push(crate::report::Target::new(
                format!(
                    "{} ÷ one-window sliding, cost {cost}, {n} callers",
                    self.what
                ),
                "≥ 0.9×",
                format!(
                    "{ratio:.2}× ({} vs {} /s; rounds {lo:.2}–{hi:.2})",
                    thousands(r[0].median_rate()),
                    thousands(r[1].median_rate())
                ),
                ratio >= 0.9,
            ));
        }
        let mut cell = serde_json::Map::new();
        cell.insert("cost".into(), cost.into());
        cell.insert("callers".into(), n.into());
        cell.insert(self.name.into(), serde_json::json!(r[0]));
        cell.insert("sliding".into(), serde_json::json!(r[1]));
        cell.insert(
            format!("{}_vs_sliding", self.name),
            serde_json::json!({ "median": ratio, "min": lo, "max": hi }),
        );
        self.data.push(cell.into());
    }
}
