//! Test harness for the pipeline promises: the real daemon (`daemon::run`)
//! in-process, on a real `redis-server` (`support::RedisServer`) and the real
//! simulated upstream (`quota_worker::simulator`), with a config written to a
//! temp dir. Every task outcome is collected with the instant it arrived.
//!
//! Config texts use three markers: `@REDIS@` (the server's URL), `@SIM@` (the
//! simulator's base URL) and `@DEAD@` (a loopback URL nothing listens on).
//! Jobs go to `jobs/*.toml`; `NEVER` is a cron schedule that does not fire
//! during a test, for jobs that tests trigger themselves.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quota_worker::config::{Config, RedisUrl};
use quota_worker::daemon::{RunOptions, Shared};
use quota_worker::keys::KeySpace;
use quota_worker::outcome::OutcomeEvent;
use quota_worker::outcome::OutcomeKind;
use quota_worker::queue::{Origin, Queue};
use quota_worker::quota::{CredentialUsage, Limiter, Quotas};
use quota_worker::simulator::{SimConfig, SimStats, Simulator};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::support::in_process::InProcess;
use crate::support::{RedisServer, free_port};

/// A cron schedule that never fires while a test runs.
pub const NEVER: &str = "0 0 0 1 1 * 2099";

/// One outcome, and when the test saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When it arrived on the broadcast channel.
    pub at: Instant,
    /// The event.
    pub ev: OutcomeEvent,
}

impl Seen {
    /// The outcome kind.
    pub fn kind(&self) -> OutcomeKind {
        self.ev.outcome.kind
    }

    /// Whether it ends its task's chain (no copy was queued).
    pub fn terminal(&self) -> bool {
        self.ev.outcome.requeued_in.is_none()
    }

    /// The page this run started at: the first page it fetched, or the page
    /// it was refused at when it fetched none.
    pub fn first_page(&self) -> u32 {
        let o = &self.ev.outcome;
        match o.kind {
            // `page` is the last page fetched.
            OutcomeKind::Done => o.page + 1 - o.pages,
            // `page` is the page it stopped at, not fetched.
            _ => o.page - o.pages,
        }
    }
}

/// What a test sets up.
pub struct Setup<'a> {
    /// `config.toml`, with the markers above.
    pub config: &'a str,
    /// `jobs/<name>`, text (markers allowed).
    pub jobs: Vec<(String, String)>,
    /// The upstream.
    pub sim: SimConfig,
    /// Secret environment: variable -> value (the simulator's API keys).
    pub env: &'a [(&'a str, &'a str)],
    /// Where the config dir is made (default: the system temp dir).
    pub base_dir: Option<PathBuf>,
}

/// A running daemon with its Redis and upstream.
pub struct Pipeline {
    /// The Redis the daemon uses.
    pub redis: RedisServer,
    /// The upstream.
    pub sim: Simulator,
    /// The config directory (config.toml, jobs/, data/).
    pub dir: tempfile::TempDir,
    /// The loaded config.
    pub config: Arc<Config>,
    /// Counters the daemon fills in.
    pub shared: Shared,
    /// A limiter on the same windows, for peeks and spends from the test.
    pub limiter: Limiter,
    /// The queue, for triggering ticks.
    pub queue: Queue,
    /// Every outcome so far, in arrival order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// How many events the collector missed (broadcast lag): must stay 0.
    pub lagged: Arc<Mutex<u64>>,
    daemon: InProcess,
    collector: JoinHandle<()>,
}

fn fill(text: &str, redis: &str, sim: &str, dead: &str) -> String {
    text.replace("@REDIS@", redis)
        .replace("@SIM@", sim)
        .replace("@DEAD@", dead)
}

impl Pipeline {
    /// Starts Redis, the simulator and the daemon; returns once the daemon
    /// is ready.
    pub async fn start(setup: Setup<'_>) -> Pipeline {
        let redis = RedisServer::start();
        let sim = Simulator::start(setup.sim).await.expect("start simulator");
        let dead = format!("http://127.0.0.1:{}", free_port());
        let dir = match &setup.base_dir {
            Some(b) => tempfile::tempdir_in(b).expect("tempdir"),
            None => tempfile::tempdir().expect("tempdir"),
        };
        let config_text = fill(setup.config, &redis.url(), &sim.base_url(), &dead);
        std::fs::write(dir.path().join("config.toml"), config_text).expect("write config");
        std::fs::create_dir_all(dir.path().join("jobs")).expect("mkdir jobs");
        for (name, text) in &setup.jobs {
            let text = fill(text, &redis.url(), &sim.base_url(), &dead);
            std::fs::write(dir.path().join("jobs").join(name), text).expect("write job");
        }
        let env: BTreeMap<String, String> = setup
            .env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // Only the test's variables: no QUOTA_WORKER_* leaks in from outside.
        let lookup = |name: &str| env.get(name).cloned();
        let config = Config::load_with_env(&dir.path().join("config.toml"), &lookup)
            .unwrap_or_else(|e| panic!("config: {e:?}"));
        let secrets = config
            .secrets_with_env(&lookup)
            .unwrap_or_else(|e| panic!("secrets: {e:?}"));
        let config = Arc::new(config);

        let (tx, mut rx) = broadcast::channel::<OutcomeEvent>(65_536);
        let shared = Shared {
            events: Some(tx),
            ..Shared::default()
        };
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let lagged: Arc<Mutex<u64>> = Arc::default();
        let collector = {
            let (seen, lagged) = (seen.clone(), lagged.clone());
            tokio::spawn(async move {
                loop {
                    match rx.recv().await {
                        Ok(ev) => seen.lock().expect("seen").push(Seen {
                            at: Instant::now(),
                            ev,
                        }),
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            *lagged.lock().expect("lagged") += n;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                }
            })
        };
        let opts = RunOptions {
            shared: shared.clone(),
            ..RunOptions::default()
        };
        let daemon = InProcess::start(config.clone(), secrets, opts).await;

        let url = RedisUrl::new(redis.url());
        let conn = quota_worker::conn::connect(&url, Duration::from_secs(5), 3)
            .await
            .expect("connect");
        let limiter = Limiter::new(
            conn.clone(),
            Arc::new(Quotas::new(&config)),
            Duration::from_secs(5),
        );
        let queue = Queue::new(
            conn,
            KeySpace::new(config.redis.key_prefix.clone()),
            config.worker.recover_after,
        );
        Pipeline {
            redis,
            sim,
            dir,
            config,
            shared,
            limiter,
            queue,
            seen,
            lagged,
            daemon,
            collector,
        }
    }

    /// The config directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Enqueues one tick of `job` now, as `quota-worker trigger` does.
    /// Returns the tick (ms).
    pub async fn trigger(&self, job: &str) -> i64 {
        let j = &self.config.jobs[job];
        let mut tick = chrono::Utc::now().timestamp_millis();
        loop {
            let tasks = quota_worker::schedule::tick_tasks(j, tick, Origin::Trigger);
            match self
                .queue
                .enqueue_tick(job, tick, &tasks, "test")
                .await
                .expect("enqueue")
            {
                Some(_) => return tick,
                None => tick += 1,
            }
        }
    }

    /// A snapshot of every outcome so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// The outcomes of `job`'s tick `tick`.
    pub fn of_tick(&self, job: &str, tick: i64) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.ev.job == job && s.ev.tick == tick)
            .collect()
    }

    /// Waits up to `timeout` until `n` tasks of the tick have ended for good
    /// (retries and deferrals do not count); returns its outcomes so far.
    pub async fn wait_tick(&self, job: &str, tick: i64, n: usize, timeout: Duration) -> Vec<Seen> {
        let deadline = Instant::now() + timeout;
        loop {
            let evs = self.of_tick(job, tick);
            let ended = evs.iter().filter(|s| s.terminal()).count();
            if ended >= n || Instant::now() >= deadline {
                return evs;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits up to `timeout` for `cond` over all outcomes so far.
    pub async fn wait_for(&self, timeout: Duration, mut cond: impl FnMut(&[Seen]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if cond(&self.seen()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The credential's live usage.
    pub async fn peek(&self, credential: &str) -> CredentialUsage {
        self.limiter.peek(credential).await.expect("peek")
    }

    /// Units used now in the credential's first window.
    pub async fn used(&self, credential: &str) -> u64 {
        self.peek(credential).await.windows[0].used
    }

    /// What the upstream saw.
    pub fn sim_stats(&self) -> SimStats {
        self.sim.stats()
    }

    /// Every JSON lines record the sinks wrote under `data/`, as parsed lines.
    pub fn sink_records(&self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        let mut stack = vec![self.path().join("data")];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "jsonl") {
                    let text = std::fs::read_to_string(&p).expect("read sink");
                    for line in text.lines() {
                        out.push(serde_json::from_str(line).unwrap_or_else(|e| {
                            panic!("{}: unparsable line {line:?}: {e}", p.display())
                        }));
                    }
                }
            }
        }
        out
    }

    /// Stops the daemon (as SIGTERM would) and waits for it.
    pub async fn stop(&mut self) {
        self.daemon.stop().await;
        // Let the collector drain what is already sent.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            *self.lagged.lock().expect("lagged"),
            0,
            "outcome events lost"
        );
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // The daemon is asked to stop by InProcess's own Drop.
        self.collector.abort();
    }
}

/// A fan-out list for TOML: `["r0", "r1", ...]`.
pub fn toml_list(values: impl IntoIterator<Item = String>) -> String {
    let v: Vec<String> = values.into_iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", v.join(", "))
}

/// Page numbers fetched per scope (region), in order: 1 for a first page,
/// n for token `pn`.
pub fn pages_by_scope(stats: &SimStats) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for c in &stats.charges {
        let n = match &c.page_token {
            None => 1,
            Some(t) => t
                .strip_prefix('p')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected page token {t:?}")),
        };
        out.entry(c.scope.clone()).or_default().push(n);
    }
    out
}

/// The record ids the upstream served: `<scope>-p<n>-i<k>` for each charged
/// page of `per_page` items.
pub fn served_ids(stats: &SimStats, per_page: u32) -> Vec<String> {
    let mut ids = Vec::new();
    for c in &stats.charges {
        let n = c
            .page_token
            .as_deref()
            .and_then(|t| t.strip_prefix('p'))
            .map_or(1, |n| n.parse::<u32>().expect("page token"));
        for k in 1..=per_page {
            ids.push(format!("{}-p{n}-i{k}", c.scope));
        }
    }
    ids.sort();
    ids
}

/// The record ids in sink lines (`record.id`), sorted.
pub fn sink_ids(records: &[serde_json::Value]) -> Vec<String> {
    let mut ids: Vec<String> = records
        .iter()
        .map(|r| {
            r.pointer("/record/id")
                .and_then(|v| v.as_str())
                .unwrap_or_else(|| panic!("sink line without record.id: {r}"))
                .to_owned()
        })
        .collect();
    ids.sort();
    ids
}

/// Counts of outcome kinds (terminal or not), by name.
pub fn kinds(seen: &[Seen]) -> BTreeMap<&'static str, usize> {
    let mut out = BTreeMap::new();
    for s in seen {
        *out.entry(s.kind().as_str()).or_default() += 1;
    }
    out
}
