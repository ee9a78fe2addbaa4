//! Section `throughput`: spends per second and p50 / p99 / p99.9 latency of
//! the Rust limiter at 1, 8, 64 and 256 concurrent callers, cost 1 and 100,
//! one window and three, side by side in the same run with
//!
//! - the **ceiling**: `redis-benchmark` running `FCALL` of the spend core
//!   with the same keys and arguments at the same concurrency (what Redis
//!   itself does with this script), and the same with one pipelined
//!   connection (`-c 1 -P N`), which is how the limiter's multiplexed
//!   connection sends, so ours is also held to what Redis does then;
//! - the **naive log** (`benches/baseline/naive_log.lua`: one zset member and
//!   one `ZADD` per unit of cost) and the same log with batched `ZADD`s
//!   (`naive_log_batched.lua`, a fairer naive), through the same harness.
//!
//! All Rust callers are tokio tasks sharing ONE `Limiter`, i.e. one
//! multiplexed `ConnectionManager`, as the daemon's workers do; the naive
//! scripts run over that same connection. redis-benchmark opens one
//! connection per caller. Implementations are interleaved in rounds (order
//! rotated, window keys deleted before each round, one warm-up per cell);
//! ratios are medians of per-round ratios, oriented so > 1 means ours is
//! better. Nothing here asserts a speed; a rejected spend on these
//! never-full windows, or a window that did not record every spend, panics.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quota_worker::config::Config;
use quota_worker::conn::Conn;
use quota_worker::conn::Lua;
use quota_worker::quota::{Decision, Limiter, Quotas, request_id, script};
use serde::Serialize;
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Lat, TIMEOUT, connect, del, median, min_max, percentiles, thousands};
use crate::report::{Section, Target};
use crate::support::{ConfigBuilder, Credential, Endpoint, TestConfig, Window};

/// Key prefix of everything this section writes (deleted at the end).
const PREFIX: &str = "qwtp";
/// A limit no spend here comes near: the windows never fill.
const HUGE: u64 = 1_000_000_000_000;
/// `-r` of redis-benchmark: each `__rand_int__` becomes one of this many values.
const RAND_SPACE: u64 = 1_000_000_000;
/// The ceiling's request id: two independent 12-digit random numbers (10^18
/// ids, so no collision in a run), 32 characters like `request_id()`.
const CEILING_ID: &str = "ceiling__rand_int__-__rand_int__";

static NAIVE: std::sync::LazyLock<Lua> =
    std::sync::LazyLock::new(|| Lua::new(include_str!("../baseline/naive_log.lua")));
static BATCHED: std::sync::LazyLock<Lua> =
    std::sync::LazyLock::new(|| Lua::new(include_str!("../baseline/naive_log_batched.lua")));

/// Sizes and durations; `--quick` shrinks them to a smoke run.
struct Plan {
    callers: Vec<usize>,
    rounds: usize,
    round: Duration,
    warmup: Duration,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                callers: vec![1, 64],
                rounds: 1,
                round: Duration::from_millis(100),
                warmup: Duration::from_millis(30),
            }
        } else {
            Plan {
                callers: vec![1, 8, 64, 256],
                rounds: 3,
                round: Duration::from_millis(600),
                warmup: Duration::from_millis(150),
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Imp {
    Ours,
    Ceiling,
    Pipelined,
    Naive,
    Batched,
}

impl Imp {
    const ALL: [Imp; 5] = [
        Imp::Ours,
        Imp::Ceiling,
        Imp::Pipelined,
        Imp::Naive,
        Imp::Batched,
    ];

    fn key(self) -> &'static str {
        match self {
            Imp::Ours => "ours",
            Imp::Ceiling => "ceiling",
            Imp::Pipelined => "ceiling_pipelined",
            Imp::Naive => "naive",
            Imp::Batched => "naive_batched",
        }
    }

    fn index(self) -> usize {
        Imp::ALL
            .iter()
            .position(|i| *i == self)
            .expect("an implementation of ALL")
    }
}

/// One window set: the endpoint's plan for ours and the ceiling, the
/// equivalent zsets for the naive logs.
struct Shape {
    /// 1 or 3.
    windows: usize,
    /// The endpoint (and credential) name.
    endpoint: String,
    /// Every key the spend script touches (block, clock, windows).
    keys: Vec<String>,
    /// The first window's id log (zset): one member per spend.
    log_key: String,
    /// The naive logs' zsets, one per window.
    naive_keys: Vec<String>,
    batched_keys: Vec<String>,
    /// The naive logs' ARGV after id and cost: limit, period_ms per window.
    naive_windows: Vec<String>,
}

impl Shape {
    fn new(quotas: &Quotas, windows: usize) -> Self {
        let endpoint = format!("tp{windows}");
        let plan = &quotas
            .endpoint(&endpoint)
            .expect("the bench config has the endpoint")
            .plan;
        assert_eq!(plan.windows.len(), windows, "windows of {endpoint}");
        // The first window's id log (meta, log, ts, adj): one member per spend.
        let log_key = plan.windows[0].keys[1].clone();
        // The naive design has no calendar window: the fixed day is a 24 h log.
        let periods: &[u64] = if windows == 1 {
            &[3_600_000]
        } else {
            &[60_000, 3_600_000, 86_400_000]
        };
        let zsets = |kind: &str| -> Vec<String> {
            (1..=windows)
                .map(|i| format!("{PREFIX}:{kind}:{{{endpoint}}}:{i}"))
                .collect()
        };
        Shape {
            windows,
            keys: plan.keys.clone(),
            log_key,
            naive_keys: zsets("naive"),
            batched_keys: zsets("batched"),
            naive_windows: periods
                .iter()
                .flat_map(|p| [HUGE.to_string(), p.to_string()])
                .collect(),
            endpoint,
        }
    }

    fn all_keys(&self) -> Vec<String> {
        let mut k = self.keys.clone();
        k.extend(self.naive_keys.iter().cloned());
        k.extend(self.batched_keys.iter().cloned());
        k
    }

    fn label(&self) -> String {
        if self.windows == 1 {
            "1 window (sliding 1h)".into()
        } else {
            "3 windows (sliding 1m + sliding 1h + fixed day, America/Los_Angeles)".into()
        }
    }
}

/// `tp1`: one sliding hour; `tp3`: a sliding minute, a sliding hour and a
/// fixed day in Los Angeles; none fills ([`HUGE`]).
fn config() -> TestConfig {
    let unused = |name: &str| Credential::env(name, "QW_BENCH_UNUSED");
    let day = Window::fixed(HUGE, "24h")
        .reset("00:00")
        .timezone("America/Los_Angeles");
    ConfigBuilder::new()
        .key_prefix(PREFIX)
        .credential(unused("tp1").window(Window::sliding(HUGE, "1h")))
        .credential(
            unused("tp3")
                .window(Window::sliding(HUGE, "1m"))
                .window(Window::sliding(HUGE, "1h"))
                .window(day),
        )
        .endpoint(Endpoint::new("tp1", "tp1", 1))
        .endpoint(Endpoint::new("tp3", "tp3", 1))
        .write()
}

// ---------------------------------------------------------------- the Rust callers

/// What one caller task holds: clones of the ONE limiter and connection.
#[derive(Clone)]
struct Caller {
    limiter: Limiter,
    conn: Conn,
    endpoint: Arc<str>,
    naive_keys: Arc<[String]>,
    batched_keys: Arc<[String]>,
    naive_windows: Arc<[String]>,
    cost: u64,
}

impl Caller {
    async fn once(&mut self, imp: Imp) {
        match imp {
            Imp::Ours => {
                let d = self
                    .limiter
                    .spend(&self.endpoint, Some(self.cost), &request_id())
                    .await
                    .unwrap_or_else(|e| panic!("ours: spend failed: {e}"));
                if !matches!(d, Decision::Allowed { .. }) {
                    panic!("ours: {d:?} on a window that never fills");
                }
            }
            Imp::Naive | Imp::Batched => {
                let (lua, keys) = if imp == Imp::Naive {
                    (&*NAIVE, &self.naive_keys)
                } else {
                    (&*BATCHED, &self.batched_keys)
                };
                let mut call = lua.call();
                call.key(&keys[..])
                    .arg(request_id())
                    .arg(self.cost)
                    .arg(&self.naive_windows[..]);
                let r: Vec<i64> = call
                    .invoke(&mut self.conn)
                    .await
                    .unwrap_or_else(|e| panic!("{}: spend failed: {e}", imp.key()));
                assert_eq!(
                    r.first(),
                    Some(&1),
                    "{}: rejected ({r:?}) on a window that never fills",
                    imp.key()
                );
            }
            Imp::Ceiling | Imp::Pipelined => unreachable!("the ceilings are redis-benchmark"),
        }
    }
}

/// `n` tasks spend back to back for `d`; returns (spends, seconds, latencies
/// in ns). Every implementation pays the same clone of the caller per call
/// (a few `Arc`s), so the ratios stay fair.
async fn drive(caller: &Caller, imp: Imp, n: usize, d: Duration) -> (u64, f64, Vec<u64>) {
    let caller = caller.clone();
    common::drive(n, d, move || {
        let mut c = caller.clone();
        async move { c.once(imp).await }
    })
    .await
}

// ---------------------------------------------------------------- the ceiling

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What redis-benchmark reported for one run.
#[derive(Debug, Clone, Copy)]
struct BenchRun {
    requests: u64,
    rps: f64,
    lat: Lat,
}

/// Parses redis-benchmark's default (non-CSV) report: `--csv` has no p99.9,
/// the default report has the throughput, the exact p50 / p99 of its summary
/// and the percentile distribution, whose first line at or above 99.9%
/// (99.902% given enough samples) bounds p99.9 from above.
fn parse_benchmark(out: &str) -> Option<BenchRun> {
    let lines: Vec<&str> = out
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let requests = lines.iter().find_map(|l| {
        l.split_once(" requests completed in ")
            .and_then(|(n, _)| n.trim().parse::<u64>().ok())
    })?;
    let rps = lines.iter().find_map(|l| {
        l.strip_prefix("throughput summary:")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|x| x.parse::<f64>().ok())
    })?;
    let at = lines
        .iter()
        .position(|l| l.starts_with("latency summary (msec)"))?;
    let names: Vec<&str> = lines.get(at + 1)?.split_whitespace().collect();
    let values: Vec<f64> = lines
        .get(at + 2)?
        .split_whitespace()
        .map(|x| x.parse::<f64>().ok())
        .collect::<Option<_>>()?;
    let summary = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| values.get(i))
            .map(|ms| ms * 1000.0)
    };
    let from = lines
        .iter()
        .position(|l| l.starts_with("Latency by percentile distribution"))?;
    let p999 = lines[from + 1..]
        .iter()
        .take_while(|l| l.contains("% <= "))
        .find_map(|l| {
            let (pct, rest) = l.split_once("% <= ")?;
            let pct: f64 = pct.parse().ok()?;
            let ms: f64 = rest.split_whitespace().next()?.parse().ok()?;
            (pct >= 99.9).then_some(ms * 1000.0)
        })?;
    Some(BenchRun {
        requests,
        rps,
        lat: Lat {
            p50_us: summary("p50")?,
            p99_us: summary("p99")?,
            p999_us: p999,
            samples: requests,
        },
    })
}

/// How redis-benchmark sends: `-c conns -P pipeline`.
#[derive(Debug, Clone, Copy)]
struct Shot<'a> {
    bin: &'a Path,
    port: u16,
    conns: usize,
    pipeline: usize,
}

/// Runs `count` FCALL spends of the endpoint's plan.
async fn ceiling(
    shot: Shot<'_>,
    function: &str,
    keys: &[String],
    args: &[String],
    count: u64,
) -> BenchRun {
    let bin = shot.bin;
    let mut cmd = tokio::process::Command::new(bin);
    cmd.args(["-h", "127.0.0.1", "-p", &shot.port.to_string()])
        .args(["-c", &shot.conns.to_string(), "-n", &count.to_string()])
        .args(["-P", &shot.pipeline.to_string()])
        .args(["-r", &RAND_SPACE.to_string()])
        .arg("FCALL")
        .arg(function)
        .arg(keys.len().to_string())
        .args(keys)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = cmd
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // redis-benchmark exits 1 on the first error reply (NOSCRIPT, a script error).
    assert!(
        out.status.success(),
        "redis-benchmark failed ({}): {}{}",
        out.status,
        stderr.trim(),
        stdout.lines().last().unwrap_or("")
    );
    let run = parse_benchmark(&stdout)
        .unwrap_or_else(|| panic!("cannot parse redis-benchmark's report:\n{stdout}\n{stderr}"));
    assert_eq!(run.requests, count, "redis-benchmark requests");
    run
}

// ---------------------------------------------------------------- CPU

/// CPU seconds (user + system) of a process, from /proc/PID/stat.
fn proc_cpu(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `after` starts at field 3.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks as f64 / hz.max(1) as f64)
}

/// Busy CPU seconds of the whole machine, all cores (from /proc/stat).
fn machine_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice, inside user]
    let busy: u64 = f.iter().take(8).sum::<u64>() - f.get(3)? - f.get(4)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(busy as f64 / hz.max(1) as f64)
}

/// CPU seconds of the waited-for children (redis-benchmark runs).
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU use during one run, in % of one core.
#[derive(Debug, Clone, Copy, Serialize)]
struct Cpu {
    /// redis-server.
    server_pct: f64,
    /// The client: this process for the Rust callers, redis-benchmark for the ceiling.
    client_pct: f64,
    /// Everything else on the machine (other builds, the kernel), all cores.
    others_pct: f64,
    /// redis-server CPU per spend, µs.
    server_us: f64,
    /// Client CPU per spend, µs.
    client_us: f64,
}

struct CpuMeter {
    server_pid: Option<String>,
    t: Instant,
    server: f64,
    me: f64,
    children: f64,
    machine: f64,
}

impl CpuMeter {
    fn start(server_pid: Option<u32>) -> Self {
        let server_pid = server_pid.map(|p| p.to_string());
        CpuMeter {
            server: server_pid.as_deref().and_then(proc_cpu).unwrap_or(0.0),
            me: proc_cpu("self").unwrap_or(0.0),
            children: children_cpu(),
            machine: machine_cpu().unwrap_or(0.0),
            t: Instant::now(),
            server_pid,
        }
    }

    fn stop(&self, imp: Imp, spends: u64) -> Cpu {
        let secs = self.t.elapsed().as_secs_f64().max(1e-9);
        let server = self.server_pid.as_deref().and_then(proc_cpu).unwrap_or(0.0);
        let me = proc_cpu("self").unwrap_or(0.0) - self.me;
        let children = children_cpu() - self.children;
        let client = if matches!(imp, Imp::Ceiling | Imp::Pipelined) {
            children
        } else {
            me
        };
        let server = server - self.server;
        let machine = machine_cpu().unwrap_or(0.0) - self.machine;
        let per = 1e6 / spends.max(1) as f64;
        Cpu {
            server_pct: 100.0 * server / secs,
            client_pct: 100.0 * client / secs,
            others_pct: (100.0 * (machine - server - me - children) / secs).max(0.0),
            server_us: server * per,
            client_us: client * per,
        }
    }
}

// ---------------------------------------------------------------- one cell

/// One implementation's measured round.
#[derive(Debug, Clone, Copy, Serialize)]
struct Round {
    spends: u64,
    secs: f64,
    rate: f64,
    lat: Lat,
    cpu: Cpu,
}

/// One implementation in one cell, over its rounds.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    rate: f64,
    lat: Lat,
    cpu: Cpu,
    rounds: Vec<Round>,
}

impl Summary {
    fn of(rounds: Vec<Round>) -> Option<Self> {
        if rounds.is_empty() {
            return None;
        }
        let m = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect());
        Some(Summary {
            rate: m(&|r| r.rate),
            lat: Lat {
                p50_us: m(&|r| r.lat.p50_us),
                p99_us: m(&|r| r.lat.p99_us),
                p999_us: m(&|r| r.lat.p999_us),
                samples: rounds.iter().map(|r| r.lat.samples).sum(),
            },
            cpu: Cpu {
                server_pct: m(&|r| r.cpu.server_pct),
                client_pct: m(&|r| r.cpu.client_pct),
                others_pct: m(&|r| r.cpu.others_pct),
                server_us: m(&|r| r.cpu.server_us),
                client_us: m(&|r| r.cpu.client_us),
            },
            rounds,
        })
    }
}

/// Ours ÷ another, per round.
#[derive(Debug, Clone, Serialize)]
struct Ratio {
    median: f64,
    min: f64,
    max: f64,
    per_round: Vec<f64>,
}

impl Ratio {
    fn of(ours: &[Round], other: &[Round]) -> Option<Self> {
        if ours.is_empty() || other.len() != ours.len() {
            return None;
        }
        let per_round: Vec<f64> = ours
            .iter()
            .zip(other)
            .map(|(o, b)| o.rate / b.rate)
            .collect();
        let (min, max) = min_max(&per_round);
        Some(Ratio {
            median: median(per_round.clone()),
            min,
            max,
            per_round,
        })
    }

    fn show(r: Option<&Ratio>) -> String {
        match r {
            Some(r) if r.per_round.len() > 1 => {
                format!("**{:.2}×** ({:.2}–{:.2})", r.median, r.min, r.max)
            }
            Some(r) => format!("**{:.2}×**", r.median),
            None => "not measured".into(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Cell {
    windows: usize,
    cost: u64,
    callers: usize,
    ours: Option<Summary>,
    ceiling: Option<Summary>,
    /// redis-benchmark -c 1 -P callers (not run at 1 caller: it is the ceiling).
    ceiling_pipelined: Option<Summary>,
    naive: Option<Summary>,
    naive_batched: Option<Summary>,
    ours_vs_ceiling: Option<Ratio>,
    ours_vs_ceiling_pipelined: Option<Ratio>,
    ours_vs_naive: Option<Ratio>,
    ours_vs_naive_batched: Option<Ratio>,
    /// redis-benchmark requests per round (sized to last about as long as a round).
    ceiling_requests: Vec<u64>,
    ceiling_pipelined_requests: Vec<u64>,
}

/// Everything a cell needs that outlives it.
struct Env<'a> {
    ctx: &'a Ctx,
    plan: &'a Plan,
    admin: Conn,
    limiter: Limiter,
    conn: Conn,
    bench: Option<PathBuf>,
    /// redis-benchmark's last rate, per way of sending, to size its COUNT.
    ceiling_rate: [f64; 2],
}

impl Env<'_> {
    async fn zcard(&mut self, key: &str) -> u64 {
        redis::cmd("ZCARD")
            .arg(key)
            .query_async(&mut self.admin)
            .await
            .expect("ZCARD")
    }

    /// One run of `imp`, from empty windows; checks every spend was recorded.
    async fn run_once(
        &mut self,
        shape: &Shape,
        caller: &Caller,
        imp: Imp,
        n: usize,
        d: Duration,
    ) -> Option<Round> {
        // One caller pipelines nothing: the pipelined ceiling is the ceiling.
        if imp == Imp::Pipelined && n == 1 {
            return None;
        }
        let bin = match imp {
            Imp::Ceiling | Imp::Pipelined => Some(self.bench.clone()?),
            _ => None,
        };
        del(&mut self.admin, &shape.all_keys()).await;
        let cpu = CpuMeter::start(self.ctx.redis.pid());
        let (spends, secs, rate, lat) = match bin {
            Some(bin) => {
                let (conns, pipeline, slot) = if imp == Imp::Ceiling {
                    (n, 1, 0)
                } else {
                    (1, n, 1)
                };
                // About `d` long at the last rate seen, in whole pipelines.
                let want = ((self.ceiling_rate[slot] * d.as_secs_f64()) as u64).max(4 * n as u64);
                let count = want.div_ceil(pipeline as u64) * pipeline as u64;
                let shot = Shot {
                    bin: &bin,
                    port: self.ctx.redis.port(),
                    conns,
                    pipeline,
                };
                let plan = &(self.limiter.quotas())
                    .endpoint(&shape.endpoint)
                    .expect("endpoint")
                    .plan;
                // As `Ours` spends: without the status page's history.
                let args = (plan.layout(&quota_worker::quota::Operation::Spend {
                    request_id: CEILING_ID,
                    cost: caller.cost,
                    reserve: quota_worker::config::Reserve::NONE,
                    ticket: None,
                    history: false,
                }))
                .args;
                let t = Instant::now();
                let spend = quota_worker::quota::Op::Spend.function().name();
                let run = ceiling(shot, spend, &shape.keys, &args, count).await;
                let secs = t.elapsed().as_secs_f64();
                self.ceiling_rate[slot] = run.rps;
                (run.requests, secs, run.rps, run.lat)
            }
            None => {
                let (spends, secs, ns) = drive(caller, imp, n, d).await;
                (spends, secs, spends as f64 / secs, percentiles(&ns))
            }
        };
        let cpu = cpu.stop(imp, spends);
        // Every spend left one entry per window (per unit, for the naive logs):
        // the scripts really ran their allowed path, with unique ids.
        let (key, want) = match imp {
            Imp::Ours | Imp::Ceiling | Imp::Pipelined => (shape.log_key.clone(), spends),
            Imp::Naive => (shape.naive_keys[0].clone(), spends * caller.cost),
            Imp::Batched => (shape.batched_keys[0].clone(), spends * caller.cost),
        };
        let got = self.zcard(&key).await;
        assert_eq!(
            got,
            want,
            "{}: {key} holds {got} entries after {spends} spends of cost {}",
            imp.key(),
            caller.cost
        );
        Some(Round {
            spends,
            secs,
            rate,
            lat,
            cpu,
        })
    }

    async fn cell(&mut self, shape: &Shape, cost: u64, n: usize, order_seed: usize) -> Cell {
        let caller = Caller {
            limiter: self.limiter.clone(),
            conn: self.conn.clone(),
            endpoint: shape.endpoint.as_str().into(),
            naive_keys: shape.naive_keys.clone().into(),
            batched_keys: shape.batched_keys.clone().into(),
            naive_windows: shape.naive_windows.clone().into(),
            cost,
        };
        // Warm-up: connections, script caches, allocator; sizes the ceilings.
        for imp in Imp::ALL {
            let warm = self.plan.warmup;
            self.run_once(shape, &caller, imp, n, warm).await;
        }
        let mut rounds: [Vec<Round>; 5] = Default::default();
        for r in 0..self.plan.rounds {
            for k in 0..Imp::ALL.len() {
                let imp = Imp::ALL[(k + r + order_seed) % Imp::ALL.len()];
                let round = self.plan.round;
                if let Some(x) = self.run_once(shape, &caller, imp, n, round).await {
                    rounds[imp.index()].push(x);
                }
            }
        }
        del(&mut self.admin, &shape.all_keys()).await;
        let [ours, ceil, piped, naive, batched] = rounds;
        let requests = |v: &[Round]| v.iter().map(|r| r.spends).collect();
        Cell {
            windows: shape.windows,
            cost,
            callers: n,
            ours_vs_ceiling: Ratio::of(&ours, &ceil),
            ours_vs_ceiling_pipelined: Ratio::of(&ours, &piped),
            ours_vs_naive: Ratio::of(&ours, &naive),
            ours_vs_naive_batched: Ratio::of(&ours, &batched),
            ceiling_requests: requests(&ceil),
            ceiling_pipelined_requests: requests(&piped),
            ours: Summary::of(ours),
            ceiling: Summary::of(ceil),
            ceiling_pipelined: Summary::of(piped),
            naive: Summary::of(naive),
            naive_batched: Summary::of(batched),
        }
    }
}

// ---------------------------------------------------------------- report

fn rate(s: Option<&Summary>) -> String {
    s.map_or("not measured".into(), |s| thousands(s.rate))
}

fn us(s: Option<&Summary>) -> String {
    s.map_or("–".into(), |s| {
        format!(
            "{} / {} / {}",
            thousands(s.lat.p50_us),
            thousands(s.lat.p99_us),
            thousands(s.lat.p999_us)
        )
    })
}

fn cpu(s: Option<&Summary>) -> String {
    s.map_or("–".into(), |s| {
        format!(
            "{:.1} / {:.1} ({:.0}% / {:.0}%)",
            s.cpu.server_us, s.cpu.client_us, s.cpu.server_pct, s.cpu.client_pct
        )
    })
}

/// The rest of the machine's CPU during a cell: median over its runs.
fn others(c: &Cell) -> String {
    let v: Vec<f64> = [
        &c.ours,
        &c.ceiling,
        &c.ceiling_pipelined,
        &c.naive,
        &c.naive_batched,
    ]
    .into_iter()
    .flatten()
    .flat_map(|s| s.rounds.iter().map(|r| r.cpu.others_pct))
    .collect();
    if v.is_empty() {
        "–".into()
    } else {
        let (lo, hi) = min_max(&v);
        format!("{:.0}% ({lo:.0}–{hi:.0})", median(v))
    }
}

/// The pipelined ceiling's cells: at one caller it is the ceiling itself.
fn piped<'a>(c: &'a Cell, f: impl Fn(Option<&'a Summary>) -> String) -> String {
    if c.callers == 1 {
        "= ceiling".into()
    } else {
        f(c.ceiling_pipelined.as_ref())
    }
}

fn markdown(plan: &Plan, cells: &[Cell], ceiling_note: &str) -> String {
    let mut md = String::new();
    let mut groups: Vec<(usize, u64)> = Vec::new();
    for c in cells {
        if !groups.contains(&(c.windows, c.cost)) {
            groups.push((c.windows, c.cost));
        }
    }
    for (w, cost) in &groups {
        let label = if *w == 1 {
            "1 window (sliding 1h)"
        } else {
            "3 windows (sliding 1m, sliding 1h, fixed day)"
        };
        md.push_str(&format!(
            "### {label}, cost {cost}\n\n\
             | callers | ours /s | ours µs p50 / p99 / p99.9 | ceiling /s | ceiling µs | pipelined ceiling /s | pipelined ceiling µs | naive /s | naive µs | naive batched /s | naive batched µs | ours ÷ ceiling | ours ÷ pipelined ceiling | ours ÷ naive | ours ÷ naive batched |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|\n"
        ));
        for c in cells.iter().filter(|c| c.windows == *w && c.cost == *cost) {
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                c.callers,
                rate(c.ours.as_ref()),
                us(c.ours.as_ref()),
                rate(c.ceiling.as_ref()),
                us(c.ceiling.as_ref()),
                piped(c, rate),
                piped(c, us),
                rate(c.naive.as_ref()),
                us(c.naive.as_ref()),
                rate(c.naive_batched.as_ref()),
                us(c.naive_batched.as_ref()),
                Ratio::show(c.ours_vs_ceiling.as_ref()),
                if c.callers == 1 {
                    "= ours ÷ ceiling".into()
                } else {
                    Ratio::show(c.ours_vs_ceiling_pipelined.as_ref())
                },
                Ratio::show(c.ours_vs_naive.as_ref()),
                Ratio::show(c.ours_vs_naive_batched.as_ref()),
            ));
        }
        md.push('\n');
    }
    md.push_str(
        "Where the CPU went (median of rounds): CPU µs per spend of redis-server / of the client \
         (this process for ours and the naive logs, redis-benchmark for the ceilings), and in \
         brackets each in % of one core; \"rest of machine\" is every other process and the \
         kernel during the cell's runs, in % of one core (2 cores = 200%), median (range):\n\n\
         | windows | cost | callers | rest of machine | ours | ceiling | pipelined ceiling | naive | naive batched |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in cells {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            c.windows,
            c.cost,
            c.callers,
            others(c),
            cpu(c.ours.as_ref()),
            cpu(c.ceiling.as_ref()),
            piped(c, cpu),
            cpu(c.naive.as_ref()),
            cpu(c.naive_batched.as_ref()),
        ));
    }
    md.push('\n');
    md.push_str(&format!(
        "Method: ours is `Limiter::spend` from N tokio tasks sharing ONE `Limiter` (one multiplexed \
         `ConnectionManager`, as the daemon's workers do), each spending back to back with a fresh \
         request id; the naive logs (`benches/baseline/naive_log.lua`, one `ZADD` per unit; \
         `naive_log_batched.lua`, `ZADD`s of up to 500 members) run through the same tasks and \
         connection, one zset per window (the fixed day is a 24 h log: the naive design has no \
         calendar window); the ceiling is `redis-benchmark -c N` (N connections, one request in \
         flight on each) running `FCALL` of the spend core with the same keys and arguments and \
         a random 32-character id per call{ceiling_note}, and the pipelined ceiling the same with \
         `-c 1 -P N` (one connection, N requests in flight, as the limiter's multiplexed connection \
         sends them; ours can beat the plain ceiling because Redis then reads and answers many \
         spends per system call). All windows are never full. {} interleaved round(s) of {} ms per \
         cell (order rotated, keys deleted before each, one warm-up of {} ms per implementation and \
         cell); spends/s is the median of rounds, each latency percentile the median of the \
         per-round percentiles (redis-benchmark's p99.9 is its 99.902% bucket, an upper bound); \
         ratios are medians of per-round ratios of spends/s, range in brackets, > 1 means ours is \
         better. After every round the first window holds exactly one entry per spend (per unit \
         for the naive logs).\n",
        plan.rounds,
        plan.round.as_millis(),
        plan.warmup.as_millis()
    ));
    md
}

fn targets(cells: &[Cell], why_not: &str) -> Vec<Target> {
    let mut t = Vec::new();
    let wname = |w: usize| if w == 1 { "1 window" } else { "3 windows" };
    for c in cells.iter().filter(|c| c.callers == 64) {
        let what = format!(
            "spends/s vs the ceiling (redis-benchmark FCALL) at 64 callers, cost {}, {}",
            c.cost,
            wname(c.windows)
        );
        let (measured, met) = match (&c.ours_vs_ceiling, &c.ours, &c.ceiling) {
            (Some(r), Some(o), Some(b)) => (
                format!(
                    "{:.0}% ({} vs {} /s; rounds {:.0}–{:.0}%; vs the pipelined ceiling {})",
                    r.median * 100.0,
                    thousands(o.rate),
                    thousands(b.rate),
                    r.min * 100.0,
                    r.max * 100.0,
                    c.ours_vs_ceiling_pipelined
                        .as_ref()
                        .map_or("–".into(), |x| format!("{:.0}%", x.median * 100.0))
                ),
                r.median >= 0.9,
            ),
            _ => (format!("not measured ({why_not})"), false),
        };
        t.push(Target::new(what, "≥ 90%", measured, met));
    }
    // Issue 11: cost 1 at least 0.9× the naive log (64 callers); cost 100
    // at least 10× it from 8 callers on (at 1 caller a round trip bounds it).
    for c in cells.iter().filter(|c| c.cost == 1 && c.callers == 64) {
        let what = format!(
            "spends/s vs the naive log at cost 1, 64 callers, {}",
            wname(c.windows)
        );
        let (measured, met) = match (&c.ours_vs_naive, &c.ours, &c.naive) {
            (Some(r), Some(o), Some(b)) => (
                format!(
                    "{:.2}× ({} vs {} /s; rounds {:.2}–{:.2}×)",
                    r.median,
                    thousands(o.rate),
                    thousands(b.rate),
                    r.min,
                    r.max
                ),
                r.median >= 0.9,
            ),
            _ => ("not measured".into(), false),
        };
        t.push(Target::new(what, "≥ 0.9×", measured, met));
    }
    for c in cells.iter().filter(|c| c.cost == 100 && c.callers >= 8) {
        let what = format!(
            "spends/s vs the naive log at cost 100, {} callers, {}",
            c.callers,
            wname(c.windows)
        );
        let (measured, met) = match (&c.ours_vs_naive, &c.ours, &c.naive) {
            (Some(r), Some(o), Some(b)) => (
                format!(
                    "{:.1}× ({} vs {} /s; rounds {:.1}–{:.1}×; naive batched {})",
                    r.median,
                    thousands(o.rate),
                    thousands(b.rate),
                    r.min,
                    r.max,
                    c.ours_vs_naive_batched
                        .as_ref()
                        .map_or("–".into(), |x| format!("{:.1}×", x.median))
                ),
                r.median >= 10.0,
            ),
            _ => ("not measured".into(), false),
        };
        t.push(Target::new(what, "≥ 10×", measured, met));
    }
    t
}

// ---------------------------------------------------------------- entry

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::new(ctx.quick);
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("throughput bench config");
    let quotas = Arc::new(Quotas::new(&config));
    let shapes = [Shape::new(&quotas, 1), Shape::new(&quotas, 3)];

    let mut admin = connect(&ctx.redis).await;
    let conn = connect(&ctx.redis).await;
    let limiter = Limiter::new(conn.clone(), quotas, TIMEOUT).without_history();

    // Load the library and the scripts, so FCALL and EVALSHA find them from
    // the first call.
    let _: () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(quota_worker::quota::library().source())
        .query_async::<String>(&mut admin)
        .await
        .map(drop)
        .expect("FUNCTION LOAD");
    for source in [script().source(), NAIVE.source(), BATCHED.source()] {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(source)
            .query_async(&mut admin)
            .await
            .expect("SCRIPT LOAD");
        assert!(
            [script().sha(), NAIVE.sha(), BATCHED.sha()].contains(&sha.as_str()),
            "SCRIPT LOAD returned an unexpected sha {sha}"
        );
    }

    let bench = on_path("redis-benchmark");
    let why_not = "redis-benchmark is not on PATH; scripts/deps installs redis-server, \
                   which brings it (Debian: redis-tools)";
    let ceiling_note = match &bench {
        Some(p) => format!(" ({})", p.display()),
        None => format!(" — **not measured: {why_not}**"),
    };
    if bench.is_none() {
        eprintln!("throughput: ceiling not measured: {why_not}");
    }

    let mut env = Env {
        ctx,
        plan: &plan,
        admin: admin.clone(),
        limiter,
        conn,
        bench,
        ceiling_rate: [10_000.0; 2],
    };
    let started = Instant::now();
    let mut cells = Vec::new();
    let mut seed = 0;
    for shape in &shapes {
        for cost in [1u64, 100] {
            for &n in &plan.callers {
                let t = Instant::now();
                let c = env.cell(shape, cost, n, seed).await;
                seed += 1;
                eprintln!(
                    "  {} cost {cost} callers {n}, spends/s: ours {}, ceiling {}, pipelined {}, naive {}, batched {} ({:.1} s)",
                    shape.label(),
                    rate(c.ours.as_ref()),
                    rate(c.ceiling.as_ref()),
                    piped(&c, rate),
                    rate(c.naive.as_ref()),
                    rate(c.naive_batched.as_ref()),
                    t.elapsed().as_secs_f64()
                );
                cells.push(c);
            }
        }
    }
    // Leave the shared server as we found it.
    for s in &shapes {
        del(&mut admin, &s.all_keys()).await;
    }
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{PREFIX}:*"))
        .query_async(&mut admin)
        .await
        .expect("KEYS");
    del(&mut admin, &left).await;

    let md = markdown(&plan, &cells, &ceiling_note);
    let targets = targets(&cells, why_not);
    Section {
        key: "throughput",
        title: "Spend throughput and latency".into(),
        markdown: md,
        data: json!({
            "method": {
                "callers": plan.callers,
                "rounds": plan.rounds,
                "round_ms": plan.round.as_millis() as u64,
                "warmup_ms": plan.warmup.as_millis() as u64,
                "shared_connection": "all Rust callers share one Limiter (one multiplexed Conn)",
                "ceiling": env.bench.as_ref().map_or(
                    serde_json::Value::String(format!("not measured: {why_not}")),
                    |p| json!(format!("{} -c N (ceiling), -c 1 -P N (ceiling_pipelined)", p.display()))
                ),
                "ratios": "ours ÷ other, spends/s, median of per-round ratios; > 1 means ours is better",
                "latency": "µs, median over rounds of each round's percentile",
                "cpu": "% of one core; client = this process (ours, naive) or redis-benchmark (ceilings); others = rest of the machine",
            },
            "secs": started.elapsed().as_secs_f64(),
            "cells": cells,
        }),
        targets,
    }
}
