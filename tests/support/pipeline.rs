//! The daemon in this process (`daemon::run`, through [`InProcess`]) on a
//! real `redis-server` and the real simulated upstream, with a config the
//! test builds ([`ConfigBuilder`]); every task outcome is collected with the
//! instant it arrived, for the pipeline promises (queue, retries, quota
//! exhaustion, throttling) that read outcomes rather than logs. What it
//! runs on is the tests' one world ([`super::world`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quota_worker::config::{Config, RedisUrl};
use quota_worker::daemon::{Hooks, RunOptions, Shared};
use quota_worker::keys::KeySpace;
use quota_worker::outcome::OutcomeEvent;
use quota_worker::outcome::OutcomeKind;
use quota_worker::queue::{Origin, Queue};
use quota_worker::quota::{CredentialUsage, Limiter, Quotas};
use simulator::{SimConfig, SimStats, Simulator};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use super::config::{ConfigBuilder, TestConfig};
use super::in_process::InProcess;
use super::redis_server::RedisServer;

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

/// A running daemon with its Redis and upstream.
pub struct Pipeline {
    /// The Redis the daemon uses.
    pub redis: RedisServer,
    /// The upstream.
    pub sim: Simulator,
    /// The config directory (config.toml, jobs/, data/).
    pub cfg: TestConfig,
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

impl Pipeline {
    /// Starts Redis, the simulator (`sim`) and the daemon on the config
    /// `config` builds from the simulator's base URL, with its `[redis] url`
    /// set to the test's server; returns once the daemon is ready.
    pub async fn start(sim: SimConfig, config: impl FnOnce(&str) -> ConfigBuilder) -> Pipeline {
        Self::start_hooked(sim, config, Hooks::default()).await
    }

    /// [`Pipeline::start`], the daemon run with the test hooks `hooks`.
    pub async fn start_hooked(
        sim: SimConfig,
        config: impl FnOnce(&str) -> ConfigBuilder,
        hooks: Hooks,
    ) -> Pipeline {
        let redis = RedisServer::start();
        let sim = Simulator::start(sim).await.expect("start simulator");
        let cfg = config(&sim.base_url()).redis_url(&redis.url()).write();
        let env: BTreeMap<String, String> = cfg
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        // Only the config's secrets: no QUOTA_WORKER_* leaks in from outside.
        let lookup = |name: &str| env.get(name).cloned();
        let config =
            Config::load_with_env(&cfg.path(), &lookup).unwrap_or_else(|e| panic!("config: {e:?}"));
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
            hooks,
            ..RunOptions::default()
        };
        let daemon = InProcess::start(config.clone(), secrets, opts).await;

        let url = RedisUrl::new(redis.url());
        let conn = quota_worker::conn::connect(
            &quota_worker::conn::Master::Url(url.clone()),
            Duration::from_secs(5),
            "test",
        )
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
            cfg,
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
        self.cfg.dir.path()
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

    /// Runs `quota-worker ARGS` on this config to completion.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        self.cfg.run(args, &[])
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

    /// A tick of `job` ([`Pipeline::trigger`]) and its outcomes once `n` of
    /// its tasks ended ([`Pipeline::wait_tick`]).
    pub async fn tick(&self, job: &str, n: usize, timeout: Duration) -> Vec<Seen> {
        let tick = self.trigger(job).await;
        self.wait_tick(job, tick, n, timeout).await
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
