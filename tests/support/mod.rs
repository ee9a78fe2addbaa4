//! The one test support library, for the integration tests (`tests/it`)
//! and the benchmark (`benches/quota`, which includes it by path). Real
//! parts only, each on 127.0.0.1 and stopped by its pid on `Drop`:
//!
//! | module | what |
//! |---|---|
//! | [`rig`] | the one way an end-to-end test runs the product: the real binary as daemons on their own Redis (more of them, another config, a restart), `trigger --wait` and a tick's typed outcomes, `trigger` and the tick it claimed, `quota --json`, `/api/status` |
//! | [`world`] | the one world the tests describe: the credential, its secret's variable and value, the endpoint, the job, and builders that compose them into a config |
//! | [`redis_server`] | a private `redis-server` on a free port: stop, kill, hang, restart, a shifted clock |
//! | [`sentinel`] | a master, its replica and three sentinels (`redis-server --sentinel`): who is master now, `SENTINEL FAILOVER`, wait for a new master, sentinels' logs |
//! | [`cluster`] | a private Redis Cluster (3 masters, optionally a replica each): which node masters a key, kill, hang, restart, wait for a failover |
//! | [`hostile`] | an upstream that redirects anywhere, loops, and answers with huge, endless or echoing bodies (the hardening tests) |
//! | [`upstream`] | the simulated metered API on its own runtime, a blackhole upstream, what the simulator saw |
//! | [`config`] | the config builder: credentials, windows, endpoints, jobs, sinks rendered as the TOML files the real loader reads |
//! | [`process`] | the one supervisor for the real binary: spawn on a config with an environment, read its logs, signal it by pid, its exit status |
//! | [`daemon`] | daemons on fixed cron ticks, and what daemons leave in Redis and the sinks |
//! | [`styles`] | jobs in each of the simulator's pagination styles (GitHub, Meta, page numbers, ...), and a scan of every key and value in Redis for a secret |
//! | [`pipeline`] | the daemon in-process, with every task outcome as an event |
//! | [`postgres`] | a private PostgreSQL server (`initdb` into a temp dir, as `nobody` under root): stop, restart on the same port, roles, queries |
//! | [`in_process`] | start, wait for ready, and stop `daemon::run` in this process |
//! | [`notify`] | a `NOTIFY_SOCKET` that records who sent what |
//! | [`http`] | `/metrics`, `/healthz`, `/readyz` and the status page over plain HTTP (any method, extra headers), and the Prometheus text format |
//! | [`browser`] | headless Chromium: the DOM after load, a screenshot (fails saying how to install it, unless `QW_SKIP_BROWSER=1`) |
//! | [`proxy`] | a TCP proxy on loopback that stands in for a managed Redis's moving name: connections made before a switch stay piped to the old server |
//! | [`procfs`] | `/proc`: children, liveness, environment |
//! | [`keys`] | key names as `KeySpace` names them (tests never spell `qw:…`), a window's keys from the loaded config |
//! | [`seed`] | a sliding window's Redis layout (v2): seed entries at chosen times, take the newest back, snapshot, read a spend's time |
//! | [`machine`] | which tests must not share the machine |

pub mod browser;
pub mod canned;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod hostile;
pub mod http;
pub mod in_process;
pub mod keys;
pub mod logs;
pub mod machine;
pub mod notify;
pub mod pipeline;
pub mod postgres;
pub mod process;
pub mod procfs;
pub mod proxy;
pub mod redis_server;
pub mod rig;
pub mod seed;
pub mod sentinel;
pub mod styles;
pub mod upstream;
pub mod world;

use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

pub use config::{
    ConfigBuilder, Credential, Endpoint, Job, Request, Sink, TestConfig, Window, Worker,
};
pub use redis_server::{RedisServer, admit_n, free_port, limiter, rejected};

/// The config `cfg` as the daemon loads it (secrets are read later, by
/// whoever runs it).
pub fn load(cfg: &TestConfig) -> quota_worker::config::Config {
    quota_worker::config::Config::load(&cfg.path()).expect("the test's config loads")
}

/// Another copy of the binary to run, set once ([`use_bin`]).
static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The binary under test: cargo's build of it, or the copy [`use_bin`] set.
pub fn bin() -> PathBuf {
    BIN.get()
        .cloned()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_quota-worker")))
}

/// Runs `path` instead of cargo's build from now on: the chaos run copies
/// the binary first, so a build during its half hour does not change the
/// daemons it restarts.
#[allow(dead_code, reason = "the chaos run uses it, the tests do not")]
pub fn use_bin(path: PathBuf) {
    let _ = BIN.set(path);
}

/// stdout parsed as one JSON value (panics with both streams when it is not).
pub fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}); exit {:?}\nstdout: {}\nstderr: {}",
            o.status.code(),
            stdout(o),
            stderr(o)
        )
    })
}

/// stdout of an output, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr of an output, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits up to `timeout` for `cond`, polling every 20 ms.
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    wait_every(timeout, Duration::from_millis(20), cond)
}

/// Waits up to `timeout` for `cond`, polling every `every`: the one place a
/// test or its support waits for something to happen (a sleep anywhere
/// else is about time itself: a window to pass, a quiet period to watch).
pub fn wait_every(timeout: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(every.min(deadline.saturating_duration_since(Instant::now())));
    }
    cond()
}

/// Watches `cond` for `period` (every 20 ms): true if it held at every
/// look, the last one at the end of the period. The quiet period after
/// everything ended, in which what must not happen (a task run twice, a
/// request more) would show: a test that watches one says so.
pub fn holds_for(period: Duration, cond: impl FnMut() -> bool) -> bool {
    holds_every(period, Duration::from_millis(20), cond)
}

/// [`holds_for`], looking every `every`.
pub fn holds_every(period: Duration, every: Duration, mut cond: impl FnMut() -> bool) -> bool {
    !wait_every(period, every, || !cond())
}
