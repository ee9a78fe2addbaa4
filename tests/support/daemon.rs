//! The real `quota-worker run` as a child process, the simulated upstream it
//! talks to over loopback, a config that wires them together, and readers for
//! what the daemons leave behind (JSON log lines, tick claims and outcome
//! hashes in Redis, sink files). Every daemon is stopped by its pid on `Drop`,
//! and its log is printed when the test panics.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Datelike, Timelike, Utc};
use quota_worker::simulator::{Fault, SimConfig, SimStats, Simulator};
use serde_json::Value;

use super::{TestConfig, bin};

/// The API key the simulator accepts and the config's credential sends.
pub const SIM_KEY: &str = "sim-key";
/// The environment variable the credential's secret comes from.
pub const KEY_ENV: &str = "QW_TEST_KEY";
/// The job every config here defines.
pub const JOB: &str = "trending";
/// The key prefix every config here uses.
pub const PREFIX: &str = "qw";
/// Eight regions: the fan-out of SPEC's example job.
pub const REGIONS: [&str; 8] = ["US", "GB", "DE", "FR", "IN", "BR", "AU", "CA"];
/// A schedule that never fires while a test runs: ticks come from `trigger`.
pub const NEVER: &str = "0 0 0 1 1 * 2099";
/// Outcome fields of a tick hash that end a task's chain.
pub const TERMINAL: [&str; 5] = [
    "done",
    "quota_exhausted",
    "upstream_throttled",
    "failed",
    "superseded",
];

/// The simulated upstream, on its own runtime: the tests themselves are
/// synchronous, they drive processes.
pub struct Upstream {
    sim: Option<Simulator>,
    rt: tokio::runtime::Runtime,
}

impl Upstream {
    /// `pages` pages per query of `items` items, one key with room for
    /// everything a test does.
    pub fn start(pages: u32, items: u32) -> Self {
        Self::with(
            SimConfig {
                pages_per_query: pages,
                items_per_page: items,
                ..SimConfig::default()
            }
            .key(SIM_KEY, 1_000_000, Duration::from_secs(3600)),
        )
    }

    /// Starts it with `config`.
    pub fn with(config: SimConfig) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let sim = rt
            .block_on(Simulator::start(config))
            .expect("start simulator");
        Upstream { sim: Some(sim), rt }
    }

    fn sim(&self) -> &Simulator {
        self.sim.as_ref().expect("simulator running")
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        self.sim().base_url()
    }

    /// What it has seen so far.
    pub fn stats(&self) -> SimStats {
        self.sim().stats()
    }

    /// The next `count` requests get `fault`.
    pub fn inject(&self, fault: Fault, count: u32) {
        self.sim().inject(fault, count);
    }

    /// Requests answered by an injected fault so far (counted when the fault
    /// is taken: a delayed request counts while it is still waiting).
    pub fn injected(&self) -> u64 {
        self.stats().key(SIM_KEY).injected
    }

    /// Charged (2xx) requests so far.
    pub fn fetched(&self) -> usize {
        self.stats().charges.len()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Dropping the simulator stops its server; the runtime goes after it.
        self.sim.take();
    }
}

/// Knobs of [`config`].
pub struct Spec<'a> {
    /// Cron expression of the job.
    pub schedule: String,
    /// Fan-out values of `region`.
    pub regions: &'a [&'a str],
    /// `max_pages`.
    pub max_pages: u32,
    /// Lines of the `[worker]` section.
    pub worker: &'a str,
    /// Lines at the top of the config (`state_dir = ...`).
    pub top: &'a str,
    /// The endpoint's request timeout.
    pub request_timeout: &'a str,
}

impl Default for Spec<'_> {
    fn default() -> Self {
        Spec {
            schedule: NEVER.into(),
            regions: &REGIONS,
            max_pages: 3,
            worker: "",
            top: "",
            request_timeout: "30s",
        }
    }
}

/// A config directory: one credential, one endpoint, the job [`JOB`] paging
/// the simulator's videos list per region into `data/trending/<region>.jsonl`.
/// No `[redis] url`: daemons get [`Daemon::start`]'s URL from
/// `QUOTA_WORKER_REDIS_URL`, or run the embedded Redis.
pub fn config(upstream: &str, spec: &Spec<'_>) -> TestConfig {
    let regions: Vec<String> = spec.regions.iter().map(|r| format!("{r:?}")).collect();
    let main = format!(
        r#"jobs = "jobs/*.toml"
{top}

[redis]
key_prefix = "{PREFIX}"

[worker]
{worker}

[metrics]
listen = "off"

[credentials.sim]
secret_env = "{KEY_ENV}"
windows = [{{ units = 1000000, per = "1h" }}]

[endpoints."sim.videos"]
credential = "sim"
cost = 1
timeout = "{timeout}"
"#,
        top = spec.top,
        worker = spec.worker,
        timeout = spec.request_timeout,
    );
    let job = format!(
        r#"[{JOB}]
schedule = "{schedule}"
endpoint = "sim.videos"
fan_out = {{ region = [{regions}] }}

[{JOB}.request]
method = "GET"
url = "{upstream}/youtube/v3/videos"
query = {{ chart = "mostPopular", regionCode = "{{region}}", part = "snippet", maxResults = "50", key = "{{secret}}" }}

[{JOB}.pagination]
cursor = "/nextPageToken"
param = "pageToken"
max_pages = {max_pages}

[{JOB}.sink]
kind = "jsonl"
path = "data/{{job}}/{{region}}.jsonl"
records = "/items"
"#,
        schedule = spec.schedule,
        regions = regions.join(", "),
        max_pages = spec.max_pages,
    );
    TestConfig::new(&main, &[("trending.toml", &job)])
}

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

/// A running `quota-worker run`.
pub struct Daemon {
    /// Names it in messages.
    pub label: String,
    child: Child,
    status: Option<ExitStatus>,
    stderr: Arc<Mutex<Vec<String>>>,
    stdout: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Reads `r` line by line into a shared buffer, on a thread that ends at EOF.
fn read_lines<R: std::io::Read + Send + 'static>(
    r: R,
) -> (Arc<Mutex<Vec<String>>>, std::thread::JoinHandle<()>) {
    use std::io::BufRead;
    let lines = Arc::new(Mutex::new(Vec::new()));
    let out = lines.clone();
    let handle = std::thread::spawn(move || {
        for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
            out.lock().expect("lines").push(line);
        }
    });
    (lines, handle)
}

impl Daemon {
    /// Starts `quota-worker run` on `cfg` with JSON logs at `info`, on the
    /// Redis at `redis_url` (`None`: the config's, i.e. the embedded one).
    pub fn start(label: &str, cfg: &TestConfig, redis_url: Option<&str>) -> Daemon {
        Self::start_with(label, cfg, redis_url, &[])
    }

    /// Like [`Daemon::start`], with more environment.
    pub fn start_with(
        label: &str,
        cfg: &TestConfig,
        redis_url: Option<&str>,
        env: &[(&str, &str)],
    ) -> Daemon {
        Self::spawn(label, cfg, redis_url, &["--log-format", "json", "run"], env)
    }

    /// Any command of the binary (`trigger JOB --wait`, ...) as a child whose
    /// output is collected while it runs, with `-c cfg` and the same
    /// environment as a daemon.
    pub fn spawn(
        label: &str,
        cfg: &TestConfig,
        redis_url: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let mut cmd = Command::new(bin());
        cmd.arg("-c")
            .arg(cfg.path())
            .args(args)
            .env_remove("QUOTA_WORKER_REDIS_URL")
            .env_remove("QUOTA_WORKER_CONFIG")
            .env_remove("QUOTA_WORKER_METRICS_LISTEN")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env("RUST_LOG", "info")
            .env(KEY_ENV, SIM_KEY)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(url) = redis_url {
            cmd.env("QUOTA_WORKER_REDIS_URL", url);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn quota-worker run");
        let (stderr, e) = read_lines(child.stderr.take().expect("stderr"));
        let (stdout, o) = read_lines(child.stdout.take().expect("stdout"));
        Daemon {
            label: label.to_owned(),
            child,
            status: None,
            stderr,
            stdout,
            readers: vec![e, o],
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs (reaps it when it has exited).
    pub fn running(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.status = Some(s);
        }
        self.status.is_none()
    }

    /// Sends `sig` to it, by pid, if it still runs.
    pub fn signal(&mut self, sig: i32) {
        if self.running() {
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(self.child.id() as i32, sig) };
        }
    }

    /// SIGTERM.
    pub fn term(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.wait_exit(Duration::from_secs(10));
    }

    /// Waits up to `timeout` for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.running() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.status
    }

    /// After it exited: waits until its output is read to the end.
    pub fn drain_output(&mut self) {
        if !self.running() {
            for r in self.readers.drain(..) {
                let _ = r.join();
            }
        }
    }

    /// Its log (stderr) so far.
    pub fn log(&self) -> String {
        self.stderr.lock().expect("log").join("\n")
    }

    /// Its stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().expect("stdout").join("\n")
    }

    /// Every JSON log line so far.
    pub fn events(&self) -> Vec<Value> {
        self.stderr
            .lock()
            .expect("log")
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    }

    /// The log lines with `message`.
    pub fn messages(&self, message: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["message"].as_str() == Some(message))
            .collect()
    }

    /// Every task outcome line so far.
    pub fn outcomes(&self) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e.get("outcome").is_some())
            .collect()
    }

    /// Waits up to `timeout` for the daemon to say it runs.
    pub fn wait_running(&mut self, timeout: Duration) {
        let ok = super::wait_until(timeout, || {
            !self.messages("quota-worker running").is_empty()
        });
        assert!(
            ok,
            "{} did not start within {timeout:?}; log:\n{}",
            self.label,
            self.log()
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.running() {
            // SAFETY: as in `signal`: our child, not yet reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
            let _ = self.child.wait();
        }
        // QW_TEST_LOGS=1 shows every daemon's log, not only a failed test's.
        if std::thread::panicking() || std::env::var_os("QW_TEST_LOGS").is_some() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(150)..];
            eprintln!(
                "----- {} (pid {}) log, last {} lines -----\n{}\n----- end of {} -----",
                self.label,
                self.child.id(),
                tail.len(),
                tail.join("\n"),
                self.label
            );
        }
    }
}

/// A synchronous connection to `url` (`redis://...` or `unix://...`).
pub fn redis_conn(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The claimed ticks of [`JOB`]: tick ms → who claimed it.
pub fn tick_claims(conn: &mut redis::Connection) -> HashMap<i64, String> {
    let pattern = format!("{PREFIX}:tick:{JOB}:*");
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
        .arg(format!("{PREFIX}:tick:{JOB}:{tick}:outcomes"))
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
    let deadline = Instant::now() + timeout;
    loop {
        let all: HashMap<i64, HashMap<String, i64>> = ticks
            .iter()
            .map(|t| (*t, tick_outcomes(conn, *t)))
            .collect();
        let ok = all.values().all(|o| ended(o) >= items);
        if ok || Instant::now() >= deadline {
            return (ok, all);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every record the sink wrote, as `(region, record id)`.
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

/// How many times each page of each region was fetched (charged), keyed by
/// `(region, page token)` with `None` for the first page.
pub fn page_counts(stats: &SimStats) -> HashMap<(String, Option<String>), usize> {
    let mut counts = HashMap::new();
    for (_, scope, token) in stats.fetched_pages() {
        *counts.entry((scope, token)).or_insert(0) += 1;
    }
    counts
}

/// The pid of `parent`'s child running `comm`, if any (from `/proc`).
pub fn child_pid(parent: u32, comm: &str) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split at the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map(|(_, n)| n).unwrap_or("");
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(parent) && name == comm {
            return Some(pid);
        }
    }
    None
}

/// Whether `pid` is a live process (a zombie waiting to be reaped is not).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// Where the tasks of [`PREFIX`]'s queue are.
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
    let q = format!("{PREFIX}:queue");
    let (backlog, scheduled, active): (u64, u64, u64) = redis::pipe()
        .zcard(format!("{PREFIX}:backlog"))
        .zcard(format!("{q}:scheduled"))
        .llen(format!("{q}:active"))
        .query(conn)
        .expect("queue sizes");
    let sets: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{q}:inflight:*"))
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
        .arg(format!("{PREFIX}:queue:workers"))
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("ZRANGE workers")
}

/// Runs `quota-worker -c cfg ARGS` to completion (killed after `timeout`),
/// returning its exit code (`None` if it had to be killed), stdout and stderr.
pub fn run_cli(
    cfg: &TestConfig,
    redis_url: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> (Option<i32>, String, String) {
    let mut p = Daemon::spawn(&format!("{args:?}"), cfg, redis_url, args, &[]);
    let status = p.wait_exit(timeout);
    if status.is_none() {
        p.kill();
    }
    p.drain_output();
    (status.and_then(|s| s.code()), p.stdout(), p.log())
}
