//! The one way an end-to-end test runs the product: the real binary as a
//! daemon on its own `redis-server`, with a config the test built
//! ([`ConfigBuilder`]); ticks by `trigger JOB --wait` ([`Rig::trigger`],
//! [`Rig::tick`]), or queued by `trigger JOB` ([`Rig::queue`]) and waited
//! for in Redis ([`Rig::wait_ticks`]); what it did as typed outcome lines
//! ([`Outcome`]), `quota --json` ([`Rig::quota`], [`Rig::used`]) and
//! `/api/status` ([`Rig::status`]). More daemons on the same Redis and
//! config come from [`Rig::another`]; a daemon that must not be waited for
//! (Redis not there yet) from [`Rig::spawn`]. The upstream is the test's
//! (the simulator, a [`super::hostile::Hostile`], canned answers): the rig
//! needs only its base URL in the config.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use serde_json::Value;

use super::daemon::{TERMINAL, tick_claims, wait_ticks_ended};
use super::http::{http_get, wait_http};
use super::keys::keys;
use super::process::{Proc, run_cli};
use super::{RedisServer, TestConfig, wait_until};

/// How long `trigger --wait` may take before the test calls it hung.
const TRIGGER: Duration = Duration::from_secs(90);

/// How long a tick's outcome lines may take to reach the daemon's log after
/// `trigger --wait` returned (the log is written after Redis's record).
const LOGGED: Duration = Duration::from_secs(10);

/// A daemon on its own Redis.
pub struct Rig {
    pub redis: RedisServer,
    pub cfg: TestConfig,
    pub daemon: Proc,
    /// The metrics listener's port, when [`Rig::listening`] says there is one.
    pub port: Option<u16>,
}

/// `trigger JOB --wait` as it ended.
#[derive(Debug)]
pub struct Triggered {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Triggered {
    /// The summary line it ends with.
    pub fn summary(&self) -> &str {
        self.stdout.lines().last().unwrap_or_default()
    }

    /// The tick it queued (`... (tick T)` in its first line).
    pub fn tick(&self) -> i64 {
        let at = (self.stdout.find("(tick "))
            .unwrap_or_else(|| panic!("no tick in what trigger said: {self:#?}"));
        let rest = &self.stdout[at + "(tick ".len()..];
        let end = rest.find(')').expect("(tick T)");
        rest[..end].parse().expect("a tick's time in ms")
    }
}

/// One task outcome line of the daemon's log, typed; `line` keeps the rest.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `done`, `quota_exhausted`, `upstream_throttled`, `failed`,
    /// `superseded`, `retrying`, ...
    pub kind: String,
    pub job: String,
    /// Its detail, in words.
    pub message: String,
    /// The page it stopped at, or the last it fetched.
    pub page: u64,
    /// Pages fetched.
    pub pages: u64,
    pub records: u64,
    pub units: u64,
    /// The upstream's HTTP status, when one ended it.
    pub status: Option<u64>,
    /// When the quota said the task may go on (`quota_exhausted`,
    /// `upstream_throttled`).
    pub retry_after_ms: Option<u64>,
    /// The whole line.
    pub line: Value,
}

impl Outcome {
    /// Reads one log line (`None`: not an outcome).
    pub fn of(line: Value) -> Option<Outcome> {
        let kind = line.get("outcome")?.as_str()?.to_owned();
        let text = |k: &str| line[k].as_str().unwrap_or_default().to_owned();
        let num = |k: &str| line[k].as_u64().unwrap_or(0);
        Some(Outcome {
            kind,
            job: text("job"),
            message: text("message"),
            page: num("page"),
            pages: num("pages"),
            records: num("records"),
            units: num("units"),
            status: line["status"].as_u64(),
            retry_after_ms: line["retry_after_ms"].as_u64(),
            line,
        })
    }

    /// Whether it ends its task's chain (no copy of it comes back).
    pub fn terminal(&self) -> bool {
        TERMINAL.contains(&self.kind.as_str())
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.line)
    }
}

impl Rig {
    /// Starts the daemon on a Redis of its own with `cfg`.
    pub fn new(cfg: TestConfig) -> Rig {
        Self::start(RedisServer::start(), cfg, &[])
    }

    /// Starts the daemon on `redis` with `cfg` (its `[redis] url` may name
    /// another server: the daemon is pointed at `redis`), `env` added to
    /// its environment, and waits until it says it runs (and, when `cfg` or
    /// `env`'s `QUOTA_WORKER_METRICS_LISTEN` opens a listener, until it
    /// answers).
    pub fn start(redis: RedisServer, cfg: TestConfig, env: &[(&str, &str)]) -> Rig {
        let mut daemon = Self::spawn(&redis, &cfg, "daemon", env);
        let port = Self::running(&mut daemon, &cfg, env);
        Rig {
            redis,
            cfg,
            daemon,
            port,
        }
    }

    /// Starts the daemon as `quota-worker ARGS` (`args` ends in `run`: a
    /// log format of the test's, `--log-format text`, none) on `redis` with
    /// `cfg` and `env`, and waits until it says it runs, in whichever
    /// format.
    pub fn start_args(
        redis: RedisServer,
        cfg: TestConfig,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Rig {
        let daemon = Proc::sim_cli("daemon", &cfg, Some(&redis.url()), args, env);
        assert!(
            daemon.wait_log("quota-worker running", Duration::from_secs(30)),
            "the daemon did not start; log:\n{}",
            daemon.log()
        );
        let port = Self::listening(&cfg, env);
        if let Some(port) = port {
            assert!(wait_http(port, Duration::from_secs(10)), "{}", daemon.log());
        }
        Rig {
            redis,
            cfg,
            daemon,
            port,
        }
    }

    /// Starts `n` daemons at once on `redis` with `cfg` and `env`
    /// (`daemon`, `daemon-1`, ...) and waits until each runs: the rig (the
    /// first) and the others.
    pub fn start_n(
        redis: RedisServer,
        cfg: TestConfig,
        n: usize,
        env: &[(&str, &str)],
    ) -> (Rig, Vec<Proc>) {
        let mut all: Vec<Proc> = (0..n)
            .map(|i| match i {
                0 => Self::spawn(&redis, &cfg, "daemon", env),
                i => Self::spawn(&redis, &cfg, &format!("daemon-{i}"), env),
            })
            .collect();
        let port = (all.iter_mut())
            .map(|d| Self::running(d, &cfg, env))
            .last()
            .flatten();
        let others = all.split_off(1);
        let daemon = all.pop().expect("n >= 1");
        let rig = Rig {
            redis,
            cfg,
            daemon,
            port,
        };
        (rig, others)
    }

    /// Waits until `daemon` says it runs and its listener (if `cfg` or
    /// `env` opens one) answers: the listener's port.
    fn running(daemon: &mut Proc, cfg: &TestConfig, env: &[(&str, &str)]) -> Option<u16> {
        daemon.wait_running(Duration::from_secs(30));
        let port = Self::listening(cfg, env);
        if let Some(port) = port {
            assert!(
                wait_http(port, Duration::from_secs(10)),
                "{}'s listener on {port} did not answer; log:\n{}",
                daemon.label,
                daemon.log()
            );
        }
        port
    }

    /// A daemon started on `redis` with `cfg` and `env`, not waited for (it
    /// may wait for a Redis that is not there yet): the test waits for
    /// what it needs ([`Proc::wait_running`], a log line).
    pub fn spawn(redis: &RedisServer, cfg: &TestConfig, label: &str, env: &[(&str, &str)]) -> Proc {
        Proc::daemon(label, cfg, Some(&redis.url()), env)
    }

    /// Another daemon on this rig's Redis and config, started (the test
    /// waits for what it needs).
    pub fn spawn_another(&self, label: &str) -> Proc {
        Self::spawn(&self.redis, &self.cfg, label, &[])
    }

    /// More daemons on this rig's Redis and config, one per label, started
    /// at once and then waited for.
    pub fn others(&self, labels: &[&str]) -> Vec<Proc> {
        let mut all: Vec<Proc> = (labels.iter())
            .map(|l| Self::spawn(&self.redis, &self.cfg, l, &[]))
            .collect();
        for d in &mut all {
            Self::running(d, &self.cfg, &[]);
        }
        all
    }

    /// Another daemon on this rig's Redis and config, running.
    pub fn another(&self, label: &str) -> Proc {
        self.another_with(label, &[])
    }

    /// Another daemon on this rig's Redis with a config of its own (the
    /// other version in a rolling deploy), running.
    pub fn another_on(&self, label: &str, cfg: &TestConfig) -> Proc {
        let mut d = Self::spawn(&self.redis, cfg, label, &[]);
        Self::running(&mut d, cfg, &[]);
        d
    }

    /// Another daemon on this rig's Redis and config with `env` added
    /// (its own `QUOTA_WORKER_METRICS_LISTEN`), running (and answering on
    /// that listener).
    pub fn another_with(&self, label: &str, env: &[(&str, &str)]) -> Proc {
        let mut d = Self::spawn(&self.redis, &self.cfg, label, env);
        Self::running(&mut d, &self.cfg, env);
        d
    }

    /// Stops the daemon (SIGTERM; it must exit) if it still runs, and
    /// starts it again on the same Redis with `cfg`, as an operator does
    /// with a new config; waits until it runs.
    pub fn restart_with(&mut self, cfg: TestConfig) {
        self.daemon.term();
        assert!(
            self.daemon.wait_exit(Duration::from_secs(30)).is_some(),
            "the daemon did not stop; log:\n{}",
            self.daemon.log()
        );
        self.cfg = cfg;
        self.daemon = Self::spawn(&self.redis, &self.cfg, "daemon", &[]);
        self.port = Self::running(&mut self.daemon, &self.cfg, &[]);
    }

    /// The port `env`'s `QUOTA_WORKER_METRICS_LISTEN`, else the config's
    /// `[metrics] listen`, opens, if any.
    fn listening(cfg: &TestConfig, env: &[(&str, &str)]) -> Option<u16> {
        let listen = match env
            .iter()
            .find(|(k, _)| *k == "QUOTA_WORKER_METRICS_LISTEN")
        {
            Some((_, v)) => v.to_string(),
            None => {
                let text = std::fs::read_to_string(cfg.join("config.toml")).ok()?;
                let doc: toml::Value = toml::from_str(&text).ok()?;
                doc.get("metrics")?.get("listen")?.as_str()?.to_owned()
            }
        };
        listen.rsplit_once(':')?.1.parse().ok()
    }

    /// A command of the binary on this rig's Redis: its exit code, stdout
    /// and stderr.
    pub fn cli(&self, args: &[&str]) -> (Option<i32>, String, String) {
        run_cli(
            &self.cfg,
            Some(&self.redis.url()),
            args,
            Duration::from_secs(30),
        )
    }

    /// `trigger JOB --wait`, as it ended (it must end).
    pub fn trigger(&self, job: &str) -> Triggered {
        trigger(&self.redis, &self.cfg, job)
    }

    /// `trigger JOB` (without `--wait`), which must queue a tick: the
    /// tick's time (ms), its key in Redis.
    pub fn queue(&self, job: &str) -> i64 {
        let (code, stdout, stderr) = self.cli(&["trigger", job]);
        let t = Triggered {
            code,
            stdout,
            stderr,
        };
        assert_eq!(t.code, Some(0), "trigger {job}: {t:#?}");
        let tick = t.tick();
        let claim = keys().tick_claim(job, tick);
        let claimed: bool = self.redis.cmd(&["EXISTS", &claim]);
        assert!(
            claimed,
            "trigger {job} queued tick {tick} unclaimed: {t:#?}"
        );
        tick
    }

    /// A connection to the rig's Redis.
    pub fn conn(&self) -> redis::Connection {
        self.redis.conn()
    }

    /// The claimed ticks of the world's job: tick ms → who claimed it.
    pub fn claims(&self) -> HashMap<i64, String> {
        tick_claims(&mut self.conn())
    }

    /// Waits up to `timeout` until each of `ticks` of the world's job has
    /// `items` tasks ended (in Redis's tick records), and asserts it did:
    /// their outcome counts.
    pub fn wait_ticks(
        &self,
        ticks: &[i64],
        items: i64,
        timeout: Duration,
    ) -> HashMap<i64, HashMap<String, i64>> {
        let (ok, all) = wait_ticks_ended(&mut self.conn(), ticks, items, timeout);
        assert!(ok, "not every task of ticks {ticks:?} ended: {all:?}");
        all
    }

    /// `trigger JOB --wait`, which must exit `code`.
    pub fn trigger_expect(&self, job: &str, code: i32) -> Triggered {
        let t = self.trigger(job);
        assert_eq!(t.code, Some(code), "trigger {job} --wait: {t:#?}");
        t
    }

    /// Runs one tick of `job` by `trigger --wait` and returns the `items`
    /// outcomes it ended with (exactly that many), and the trigger.
    pub fn tick(&self, job: &str, items: usize) -> (Vec<Outcome>, Triggered) {
        let before = self.ended(job).len();
        let t = self.trigger(job);
        wait_until(LOGGED, || self.ended(job).len() >= before + items);
        let all = self.ended(job);
        assert_eq!(all.len(), before + items, "{job}: {all:#?}\n{t:#?}");
        (all[before..].to_vec(), t)
    }

    /// Every outcome line the daemon logged so far.
    pub fn outcomes(&self) -> Vec<Outcome> {
        outcomes(&self.daemon)
    }

    /// The terminal outcomes of `job` so far.
    pub fn ended(&self, job: &str) -> Vec<Outcome> {
        (self.outcomes().into_iter())
            .filter(|o| o.job == job && o.terminal())
            .collect()
    }

    /// `quota CREDENTIAL --json`'s credential (the first it lists).
    pub fn quota(&self, credential: &str) -> Value {
        let (code, out, err) = self.cli(&["quota", credential, "--json"]);
        assert_eq!(code, Some(0), "quota {credential}: {out}\n{err}");
        let v: Value = serde_json::from_str(&out).expect("quota --json");
        v["credentials"][0].clone()
    }

    /// Units `credential`'s windows hold, summed over the credential and
    /// its tenants (`quota --json`).
    pub fn used(&self, credential: &str) -> u64 {
        let (code, out, err) = self.cli(&["quota", credential, "--json"]);
        assert_eq!(code, Some(0), "quota {credential}: {out}\n{err}");
        let v: Value = serde_json::from_str(&out).expect("quota --json");
        let creds = v["credentials"].as_array().cloned().unwrap_or_default();
        (creds.iter())
            .filter(|c| (c["name"].as_str()).is_some_and(|n| n.starts_with(credential)))
            .flat_map(|c| c["windows"].as_array().cloned().unwrap_or_default())
            .map(|w| w["used"].as_u64().expect("used"))
            .sum()
    }

    /// The metrics listener's port (the config must open one).
    pub fn listener(&self) -> u16 {
        self.port.expect("the config opens no listener")
    }

    /// `/api/status`, as JSON.
    pub fn status(&self) -> Value {
        let port = self.listener();
        let (code, body) = http_get(port, "/api/status").expect("/api/status");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }
}

/// Every outcome line `daemon` logged so far (a daemon of [`Rig::another`]).
pub fn outcomes(daemon: &Proc) -> Vec<Outcome> {
    (daemon.outcomes().into_iter())
        .filter_map(Outcome::of)
        .collect()
}

/// `trigger JOB --wait` on `redis` with `cfg`, as it ended (it must end):
/// [`Rig::trigger`] for a test whose daemons are its own.
pub fn trigger(redis: &RedisServer, cfg: &TestConfig, job: &str) -> Triggered {
    let (code, stdout, stderr) = run_cli(
        cfg,
        Some(&redis.url()),
        &["trigger", job, "--wait"],
        TRIGGER,
    );
    let t = Triggered {
        code,
        stdout,
        stderr,
    };
    assert!(t.code.is_some(), "trigger {job} --wait hung: {t:#?}");
    t
}
