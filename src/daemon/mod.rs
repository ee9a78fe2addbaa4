//! The daemon: Redis (configured or embedded), the scheduler that fires cron
//! ticks and fans them out ([`crate::schedule`]), the feeder that moves due
//! tasks into apalis (`feeder`), the apalis worker that runs them
//! (`supervisor`, one task: `crate::worker`), and the metrics endpoint and
//! systemd notifications ([`crate::ops`]). [`run`] returns when `shutdown`
//! resolves and the running tasks finished (or `shutdown_timeout` passed).

mod announce;
mod drain;
mod feeder;
pub mod reload;
mod supervisor;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::{Config, Secrets};
use crate::conn::{Conn, Master, Timeouts};
pub(crate) use crate::embedded::EmbeddedError;
use crate::embedded::EmbeddedRedis;
use crate::eviction::Eviction;
use crate::keys::KeySpace;
use crate::liveness::Health;
use crate::ops::{self, Notifier, OpsState};
use crate::outcome::OutcomeEvent;
use crate::queue::{Queue, Wake};
use crate::quota::{Limiter, QuotaConn, QuotaTarget, Quotas};
use crate::schedule::Scheduler;
use crate::sink::Sinks;
use crate::stats::Stats;
use crate::worker::{Lasting, Worker};

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The embedded Redis did not start.
    #[error(transparent)]
    Embedded(#[from] EmbeddedError),
    /// Redis stayed unreachable at startup.
    #[error("Redis at {url} is unreachable: {source}")]
    Unreachable {
        /// Where (password redacted).
        url: Master,
        /// The last error.
        #[source]
        source: redis::RedisError,
    },
    /// Redis refused the credentials in the URL (a wrong password, none
    /// where one is needed): a config error, not an outage.
    #[error("{}", crate::acl::refused_credentials(url, source))]
    Auth {
        /// Where (password redacted).
        url: Master,
        /// What Redis said.
        #[source]
        source: redis::RedisError,
    },
    /// The Redis user may not run commands the product sends.
    #[error("Redis at {url}: {what}")]
    Permissions {
        /// Where (password redacted).
        url: Master,
        /// What it may not run, and what to grant.
        what: String,
    },
    /// The Redis Cluster's user (`[redis] quota_nodes`) may not run
    /// commands the windows need.
    #[error("the quota windows' Redis Cluster ([redis] quota_nodes): {what}")]
    WindowPermissions {
        /// What it may not run, and what to grant.
        what: String,
    },
    /// Redis may evict keys, and `[redis] unsafe_eviction` is "refuse".
    #[error("Redis at {url}: {}", Eviction::unsafe_reason(policy))]
    UnsafeEviction {
        /// Where (password redacted).
        url: Master,
        /// Its `maxmemory-policy`.
        policy: String,
    },
    /// The Redis Cluster of `[redis] quota_nodes` stayed unreachable at startup.
    #[error("the quota windows' {target} is unreachable: {source}")]
    QuotaUnreachable {
        /// Its seed nodes (passwords redacted).
        target: QuotaTarget,
        /// The last error.
        #[source]
        source: redis::RedisError,
    },
    /// A master of the quota windows' cluster may evict keys, and
    /// `[redis] unsafe_eviction` is "refuse".
    #[error("the quota windows' {target}: {}", Eviction::unsafe_reason(policy))]
    QuotaUnsafeEviction {
        /// Its seed nodes (passwords redacted).
        target: QuotaTarget,
        /// The evicting node's `maxmemory-policy`, and which node.
        policy: String,
    },
    /// The HTTP client could not be built (TLS roots, say).
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// The metrics endpoint cannot listen on its address (in use by another
    /// process, not an address of this host, not allowed): the config asks
    /// for what this host cannot give.
    #[error(
        "metrics cannot listen on {addr}: {source} (set [metrics] listen, QUOTA_WORKER_METRICS_LISTEN, or \"off\")"
    )]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What a running daemon shares with its caller (the CLI, the demo, tests).
#[derive(Debug, Clone, Default)]
pub struct Shared {
    /// Counters.
    pub stats: Arc<Stats>,
    /// Loop liveness.
    pub health: Arc<Health>,
    /// Every task outcome is sent here too, when set.
    pub events: Option<tokio::sync::broadcast::Sender<OutcomeEvent>>,
}

/// Options beyond the config.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Counters and liveness to fill in (the caller keeps a clone to read them).
    pub shared: Shared,
    /// Called once Redis answers and the worker is running.
    pub ready: Option<watch::Sender<bool>>,
    /// Where the metrics endpoint listens, once it does.
    pub metrics_addr: Option<watch::Sender<Option<std::net::SocketAddr>>>,
    /// Reload requests (the CLI counts SIGHUPs here): each change reloads
    /// the config from its file (`reload`). `None`: never reloads.
    pub reload: Option<watch::Receiver<u64>>,
    /// Test hooks: see [`Hooks`]. Default: none.
    #[doc(hidden)]
    pub hooks: Hooks,
}

/// Test and benchmark hooks. Only a caller in the same process (a test, a
/// benchmark) can set them: no config field, flag or environment variable
/// reaches them, and the CLI always passes the default (all off).
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    /// The scheduler loop beats once, then waits for shutdown without firing
    /// a tick: a wedged loop, for the watchdog test.
    pub wedge_scheduler: bool,
    /// Workers treat every spend as admitted without calling Redis (nothing
    /// recorded, so nothing settled or refunded): the end-to-end benchmark's
    /// "spend off", to measure what the limiter costs.
    pub skip_spend: bool,
    /// While above 0, a task panics right after its page's spend is
    /// admitted (before its request), counting it down: for the test that
    /// a panicking task's lease is still returned (`worker::lease`).
    pub panic_after_spend: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// Where systemd notify messages go, instead of `NOTIFY_SOCKET` and
    /// `WATCHDOG_USEC`: a process's environment is shared by every daemon a
    /// test runs in it.
    pub notify: Option<Notifier>,
}

async fn connect_with_retry(
    master: &Master,
    timeouts: Timeouts,
    patience: Duration,
    label: &'static str,
) -> Result<Conn, DaemonError> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut wait = Duration::from_millis(100);
    loop {
        // A PING too: a URL without a password is only refused (NOAUTH) at
        // the first command.
        let connected = match Conn::connect(master, timeouts, label).await {
            Ok(mut c) => match redis::cmd("PING").query_async::<()>(&mut c).await {
                Err(e) if crate::acl::is_auth_failure(&e) => Err(e),
                _ => Ok(c),
            },
            Err(e) => Err(e),
        };
        match connected {
            Ok(c) => return Ok(c),
            // Waiting will not change the password.
            Err(source) if crate::acl::is_auth_failure(&source) => {
                return Err(DaemonError::Auth {
                    url: master.clone(),
                    source,
                });
            }
            Err(e) if tokio::time::Instant::now() + wait < deadline => {
                warn!(redis = %master, error = %e, "Redis unreachable; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(crate::conn::MAX_BACKOFF);
            }
            Err(source) => {
                return Err(DaemonError::Unreachable {
                    url: master.clone(),
                    source,
                });
            }
        }
    }
}

/// The parts of a running daemon that its loops share.
struct Parts {
    queue: Queue,
    /// What a reload replaces, for whoever reads it.
    live: reload::Senders,
    /// The feeder's own connection, for its blocking reads.
    wake_conn: Conn,
    /// What the metrics endpoint and the notifier read.
    ops: OpsState,
}

impl Parts {
    fn new(
        config: &Arc<Config>,
        secrets: Arc<Secrets>,
        opts: &RunOptions,
        limiter_conn: QuotaConn,
        queue_conn: Conn,
        wake_conn: Conn,
    ) -> Result<Self, DaemonError> {
        let keys = KeySpace::new(config.redis.key_prefix.clone());
        let queue = Queue::new(
            queue_conn.clone(),
            keys.clone(),
            config.worker.recover_after,
        );
        let limiter = Limiter::new(
            limiter_conn,
            Arc::new(Quotas::new(config)),
            config.redis.timeout,
        )
        .with_replicas(config.redis.quota_replicas);
        let shared = &opts.shared;
        // Shared with the status page, which shows what its commands did.
        let minter: Arc<crate::mint::Minter> = Arc::default();
        let lasting = Lasting {
            queue: queue.clone(),
            conn: queue_conn,
            stats: shared.stats.clone(),
            events: shared.events.clone(),
            local_blocks: Arc::default(),
            unanswered: Arc::default(),
            remembered: Arc::default(),
            minter: minter.clone(),
            skip_spend: opts.hooks.skip_spend,
            panic_after_spend: opts.hooks.panic_after_spend.clone(),
            newest: Arc::default(),
        };
        let sinks = Sinks::for_config(config);
        let worker = Worker::new(config.clone(), secrets, limiter.clone(), sinks, lasting)?;
        let worker = Arc::new(worker);
        worker.publish();
        let (ops_live, ops_rx) = watch::channel(ops::Live {
            config: config.clone(),
            limiter,
        });
        let live = reload::Senders {
            config: watch::Sender::new(config.clone()),
            worker: watch::Sender::new(worker),
            ops: ops_live,
        };
        let ops = OpsState {
            live: ops_rx,
            queue: queue.clone(),
            health: shared.health.clone(),
            stats: shared.stats.clone(),
            unsafe_eviction: config.redis.unsafe_eviction,
            gauge_reads: Arc::default(),
            status_reads: Arc::default(),
            minter,
        };
        Ok(Parts {
            queue,
            live,
            wake_conn,
            ops,
        })
    }
}

/// The daemon's loops, running.
struct Loops {
    scheduler: JoinHandle<()>,
    feeder: JoinHandle<()>,
    workers: JoinHandle<supervisor::Stopped>,
    announce: JoinHandle<()>,
}

impl Loops {
    fn spawn(
        config: &Arc<Config>,
        parts: &Parts,
        hooks: &Hooks,
        stop: &watch::Receiver<bool>,
    ) -> Self {
        let health = parts.ops.health.clone();
        let host = supervisor::hostname();
        let announce = tokio::spawn(announce::run(
            parts.queue.connection(),
            parts.queue.keys().clone(),
            announce::daemon_id(&host),
            host,
            parts.live.config.subscribe(),
            stop.clone(),
        ));
        let scheduler = if hooks.wedge_scheduler {
            tokio::spawn(wedged(stop.clone()))
        } else {
            let who = format!("{}:{}", supervisor::hostname(), std::process::id());
            tokio::spawn(
                Scheduler {
                    queue: parts.queue.clone(),
                    health: health.clone(),
                    who,
                    stop: stop.clone(),
                }
                .run(parts.live.config.subscribe()),
            )
        };
        let wake = Arc::new(Wake::default());
        let feeder = tokio::spawn(feeder::run(
            parts.queue.clone(),
            wake.clone(),
            parts.wake_conn.clone(),
            config.worker.poll_interval,
            health.clone(),
            stop.clone(),
        ));
        let workers = tokio::spawn(supervisor::run(
            config.clone(),
            parts.queue.clone(),
            parts.live.worker.subscribe(),
            wake,
            health,
            stop.clone(),
        ));
        Loops {
            scheduler,
            feeder,
            workers,
            announce,
        }
    }

    /// Waits for the loops to end after `stop`: the running tasks get the
    /// shutdown timeout; unfinished ones stay queued.
    async fn join(self, config: &Config, stats: &Stats) {
        let _ = self.scheduler.await;
        let _ = self.feeder.await;
        let _ = self.announce.await;
        let drain = config.worker.shutdown_timeout + Duration::from_secs(1);
        // The supervisor bounds its drain by the shutdown timeout itself;
        // the extra second here only guards against a drain that hangs.
        match tokio::time::timeout(drain, self.workers).await {
            Ok(Ok(supervisor::Stopped::Drained)) => info!("all running tasks finished"),
            Ok(Ok(supervisor::Stopped::TimedOut)) | Ok(Err(_)) | Err(_) => warn!(
                in_flight = Stats::get(&stats.in_flight),
                "shutdown timeout passed; unfinished tasks stay queued and another daemon (or the next start) picks them up"
            ),
        }
    }
}

/// The scheduler loop, wedged ([`Hooks::wedge_scheduler`]): it beat once
/// (at the start, in `run_on`) and never again.
async fn wedged(mut stop: watch::Receiver<bool>) {
    warn!("test hook: the scheduler loop is wedged");
    let _ = stop.wait_for(|s| *s).await;
}

/// Refuses a Redis that may evict the windows' keys, unless the config says
/// to run anyway (src/eviction.rs): the queue's Redis, and the cluster's
/// masters when the windows live there.
async fn check_eviction(
    url: &Master,
    config: &Config,
    conn: &Conn,
    quota: &QuotaConn,
) -> Result<(), DaemonError> {
    let wait = config.redis.timeout.max(Duration::from_secs(2));
    let queue = crate::eviction::check(&mut conn.clone(), wait).await;
    eviction_verdict(&url.to_string(), config, queue).map_err(|policy| {
        DaemonError::UnsafeEviction {
            url: url.clone(),
            policy,
        }
    })?;
    if let QuotaConn::Cluster(_) = quota {
        let target = QuotaTarget::of(config, url.clone());
        let eviction = quota.eviction(wait).await;
        eviction_verdict(&target.to_string(), config, eviction)
            .map_err(|policy| DaemonError::QuotaUnsafeEviction { target, policy })?;
    }
    Ok(())
}

/// What Redis must allow before anything runs: no key evicted, and every
/// command the product sends permitted to its user.
async fn preflight(
    url: &Master,
    config: &Config,
    queue_conn: &Conn,
    limiter_conn: &QuotaConn,
) -> Result<(), DaemonError> {
    check_eviction(url, config, queue_conn, limiter_conn).await?;
    check_access(url, config, queue_conn).await?;
    if config.redis.quota_nodes.is_empty() {
        return Ok(());
    }
    check_window_access(config, limiter_conn).await
}

/// Like [`check_access`], for the user of the quota windows' cluster
/// (`[redis] quota_nodes`) and what the windows need of it.
async fn check_window_access(config: &Config, conn: &QuotaConn) -> Result<(), DaemonError> {
    let replicas = config.redis.quota_replicas > 0;
    let at = "the quota windows' Redis Cluster";
    match crate::acl::access_windows(&mut conn.clone(), &config.redis.key_prefix, replicas).await {
        Ok(crate::acl::Access::Granted) => Ok(()),
        Ok(missing @ crate::acl::Access::Missing(_)) => Err(DaemonError::WindowPermissions {
            what: missing.to_string(),
        }),
        Ok(unknown @ crate::acl::Access::Unknown(_)) => {
            warn!(
                "{at}: {unknown}: make sure its user may run every command the windows need (docs/redis.md)"
            );
            Ok(())
        }
        Err(e) => {
            warn!(error = %e, "{at}: the user's permissions could not be read");
            Ok(())
        }
    }
}

/// Refuses a Redis user that may not run every command the product sends
/// (src/acl.rs), naming what is missing; one whose permissions cannot be
/// read (a Redis before 7) is logged and let through.
async fn check_access(url: &Master, config: &Config, conn: &Conn) -> Result<(), DaemonError> {
    let replicas = config.redis.quota_replicas > 0 || config.redis.queue_replicas > 0;
    match crate::acl::access(&mut conn.clone(), &config.redis.key_prefix, replicas).await {
        Ok(crate::acl::Access::Granted) => Ok(()),
        Ok(missing @ crate::acl::Access::Missing(_)) => Err(DaemonError::Permissions {
            url: url.clone(),
            what: missing.to_string(),
        }),
        Ok(unknown @ crate::acl::Access::Unknown(_)) => {
            warn!(redis = %url, "{unknown}: make sure its user may run every command quota-worker sends (docs/redis.md)");
            Ok(())
        }
        Err(e) => {
            warn!(redis = %url, error = %e, "the Redis user's permissions could not be read");
            Ok(())
        }
    }
}

/// What the config says to do about `eviction` at `at`: `Err(policy)` to refuse.
fn eviction_verdict(at: &str, config: &Config, eviction: Eviction) -> Result<(), String> {
    match eviction {
        Eviction::Safe => {}
        Eviction::Unsafe(policy) => match config.redis.unsafe_eviction {
            crate::config::UnsafeEviction::Refuse => return Err(policy),
            crate::config::UnsafeEviction::Warn => warn!(
                redis = %at,
                policy,
                "running on a Redis that may evict keys, because [redis] unsafe_eviction = \"warn\": {}",
                Eviction::unsafe_reason(&policy)
            ),
        },
        Eviction::Unknown(why) => warn!(
            redis = %at,
            why,
            "cannot verify that Redis never evicts keys (CONFIG renamed or disabled?): make sure its maxmemory-policy is noeviction (docs/redis.md)"
        ),
    }
    Ok(())
}

/// The daemon's Redis connections.
struct Conns {
    /// The limiter's: to the cluster of `[redis] quota_nodes` when there is
    /// one, else to `url`.
    limiter: QuotaConn,
    /// The queue's.
    queue: Conn,
    /// The feeder's blocking reads of the wake stream: a blocked read holds
    /// its connection, so it has one of its own.
    wake: Conn,
}

/// How long a call on the queue's connection waits for a master: about
/// one failover's worth of the daemon's loops' time, short enough that
/// they keep beating (`ops::STALE_AFTER`) while no master answers.
const QUEUE_PATIENCE: Duration = Duration::from_secs(5);

/// Connects the daemon's Redis connections ([`Conns`]), retrying for 30 s.
async fn connect(master: &Master, config: &Config) -> Result<Conns, DaemonError> {
    let patience = Duration::from_secs(30);
    let limiter_conn = match QuotaTarget::of(config, master.clone()) {
        QuotaTarget::Standalone(_) => {
            let t = Timeouts::both(config.redis.timeout);
            connect_with_retry(master, t, patience, "windows")
                .await?
                .into()
        }
        cluster => connect_cluster_with_retry(cluster, config.redis.timeout, patience).await?,
    };
    // apalis-redis kills its worker on any Redis error, a response timeout
    // included (apalis-redis #76): give the queue's connection patience.
    let queue = Timeouts {
        response: Duration::from_secs(10),
        patience: QUEUE_PATIENCE,
    };
    let queue_conn = connect_with_retry(master, queue, patience, "queue")
        .await?
        // Each task writes its checkpoints and end, and the scheduler its
        // claims, one at a time: one connection each.
        .with_acks(
            config.redis.queue_replicas,
            crate::queue::ACK_WAIT,
            config.worker.concurrency.get() + 2,
        );
    // Its reads block up to feeder::BLOCK: they must not time out first.
    let wake = Timeouts {
        response: feeder::BLOCK + config.redis.timeout.max(Duration::from_secs(2)),
        patience: QUEUE_PATIENCE,
    };
    let wake_conn = connect_with_retry(master, wake, patience, "wake").await?;
    Ok(Conns {
        limiter: limiter_conn,
        queue: queue_conn,
        wake: wake_conn,
    })
}

/// [`connect_with_retry`] for the quota windows' cluster.
async fn connect_cluster_with_retry(
    target: QuotaTarget,
    timeout: Duration,
    patience: Duration,
) -> Result<QuotaConn, DaemonError> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut wait = Duration::from_millis(100);
    loop {
        match target.connect(timeout, 2).await {
            Ok(c) => return Ok(c),
            Err(e) if tokio::time::Instant::now() + wait < deadline => {
                warn!(quota = %target, error = %e, "Redis Cluster unreachable; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(source) => return Err(DaemonError::QuotaUnreachable { target, source }),
        }
    }
}

/// Runs the daemon until `shutdown` resolves.
pub async fn run(
    config: Arc<Config>,
    secrets: Arc<Secrets>,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), DaemonError> {
    // Shutdown is heard from the start: while waiting for Redis, too.
    let mut shutdown = std::pin::pin!(shutdown);
    let embedded = match Master::of(&config.redis) {
        Some(_) => None,
        None => tokio::select! {
            _ = shutdown.as_mut() => return Ok(()),
            r = EmbeddedRedis::start(&config.state_dir) => Some(r?),
        },
    };
    let url = match (Master::of(&config.redis), &embedded) {
        (Some(m), _) => m,
        (None, Some(e)) => Master::Url(e.url()),
        (None, None) => unreachable!("embedded started above"),
    };
    let Some(mut embedded) = embedded else {
        return run_on(config, secrets, opts, shutdown, &url).await;
    };
    // The embedded redis-server is restarted if it dies under us (the OOM
    // killer, a crash): the daemon has no other Redis. Watched on this very
    // task, not a spawned one, so a restarted server is a child of the same
    // thread as the first, which PR_SET_PDEATHSIG ties its life to.
    let result = tokio::select! {
        r = run_on(config, secrets, opts, shutdown, &url) => r,
        never = embedded.keep_running() => match never {},
    };
    embedded.stop().await;
    info!("embedded Redis stopped");
    result
}

/// The daemon's life on one Redis, in the order it happens: listen, connect,
/// preflight, start the loops, say ready, wait for the stop, drain. Over 80
/// lines on purpose: each step is a few lines that hand the next its value,
/// and the start and the stop read best as one sequence.
async fn run_on(
    config: Arc<Config>,
    secrets: Arc<Secrets>,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send,
    url: &Master,
) -> Result<(), DaemonError> {
    let mut shutdown = std::pin::pin!(shutdown);
    // Taken first: an address this host cannot listen on is said at once,
    // not after waiting up to 30 s for Redis.
    let metrics = match config.metrics.listen {
        Some(addr) => Some(
            ops::bind(addr)
                .await
                .map_err(|source| DaemonError::Metrics { addr, source })?,
        ),
        None => None,
    };
    let conns = tokio::select! {
        _ = shutdown.as_mut() => {
            info!("shut down while waiting for Redis");
            return Ok(());
        }
        r = connect(url, &config) => r?,
    };
    preflight(url, &config, &conns.queue, &conns.limiter).await?;
    let quota = QuotaTarget::of(&config, url.clone());
    let parts = Parts::new(
        &config,
        secrets,
        &opts,
        conns.limiter,
        conns.queue,
        conns.wake,
    )?;
    info!(
        redis = %url,
        quota = %quota,
        quota_replicas = config.redis.quota_replicas,
        queue_replicas = config.redis.queue_replicas,
        jobs = config.jobs.len(),
        concurrency = config.worker.concurrency.get(),
        recover_after_ms = config.worker.recover_after.as_millis() as u64,
        "quota-worker running"
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    // The loops count as alive from the start; they beat from here on.
    Health::beat(&parts.ops.health.scheduler);
    Health::beat(&parts.ops.health.feeder);
    if let (Some(listener), Some(addr)) = (metrics, config.metrics.listen) {
        let bound = ops::serve(listener, parts.ops.clone(), stop_rx.clone())
            .map_err(|source| DaemonError::Metrics { addr, source })?;
        if let Some(tx) = &opts.metrics_addr {
            let _ = tx.send(Some(bound));
        }
    }
    let loops = Loops::spawn(&config, &parts, &opts.hooks, &stop_rx);
    if let Some(ready) = &opts.ready {
        let _ = ready.send(true);
    }
    let notifier = opts.hooks.notify.clone().unwrap_or_else(Notifier::from_env);
    notifier.ready();
    let concurrency = config.worker.concurrency.get();
    let notify = tokio::spawn(
        notifier
            .clone()
            .run(parts.ops, concurrency, stop_rx.clone()),
    );
    let reloads = tokio::spawn(reload::run(
        parts.live,
        notifier.clone(),
        opts.reload.clone(),
        stop_rx,
    ));

    shutdown.await;
    notifier.stopping();
    info!(
        timeout_ms = config.worker.shutdown_timeout.as_millis() as u64,
        "shutting down: no new tasks; running ones get the shutdown timeout"
    );
    let _ = stop_tx.send(true);
    let _ = notify.await;
    loops.join(&config, &opts.shared.stats).await;
    let _ = reloads.await;
    Ok(())
}
