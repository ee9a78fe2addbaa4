//! The daemon: Redis (configured or embedded), the scheduler that fans cron
//! ticks out, the feeder that moves due tasks into apalis, and the apalis
//! worker that runs them. `run` returns when `shutdown` resolves and the
//! running tasks finished (or `shutdown_timeout` passed).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use apalis::prelude::*;
use chrono::Utc;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::config::{Config, RedisUrl, Secrets};
use crate::embedded::{EmbeddedError, EmbeddedRedis};
use crate::eviction::Eviction;
use crate::fetch::Fetcher;
use crate::keys::KeySpace;
use crate::queue::{Origin, Queue, RETENTION, TaskArgs, Ticker};
use crate::quota::{Limiter, Quotas};
use crate::sink::Sinks;
use crate::stats::Stats;
use crate::worker::Worker;

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
        url: RedisUrl,
        /// The last error.
        #[source]
        source: redis::RedisError,
    },
    /// Redis may evict keys, and `[redis] unsafe_eviction` is "refuse".
    #[error("Redis at {url}: {}", Eviction::unsafe_reason(policy))]
    UnsafeEviction {
        /// Where (password redacted).
        url: RedisUrl,
        /// Its `maxmemory-policy`.
        policy: String,
    },
    /// The HTTP client could not be built (TLS roots, say).
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// The metrics endpoint could not listen.
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

/// Liveness of the daemon's loops, as Unix ms of their last good round: the
/// systemd watchdog and `/readyz` read them.
#[derive(Debug, Default)]
pub struct Health {
    /// The scheduler's last wake-up.
    pub scheduler: AtomicI64,
    /// The feeder's last successful round.
    pub feeder: AtomicI64,
    /// When the worker last (re)started fetching; 0 while it is down.
    pub worker: AtomicI64,
}

impl Health {
    fn beat(slot: &AtomicI64) {
        slot.store(Utc::now().timestamp_millis(), Ordering::Relaxed);
    }
}

/// What a running daemon shares with its caller (the CLI, the demo, tests).
#[derive(Debug, Clone, Default)]
pub struct Shared {
    /// Counters.
    pub stats: Arc<Stats>,
    /// Loop liveness.
    pub health: Arc<Health>,
    /// Every task outcome is sent here too, when set.
    pub events: Option<tokio::sync::broadcast::Sender<crate::worker::OutcomeEvent>>,
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
    /// Fault injection for tests of the watchdog: the scheduler loop blocks
    /// forever after its first beat (`QUOTA_WORKER_FAULT=wedge-scheduler`).
    pub wedge_scheduler: bool,
    /// Exists only for `benches/quota/e2e.rs`, which compares the pipeline
    /// with and without the limiter: workers treat every spend as admitted
    /// without calling Redis (nothing recorded, so nothing settled or
    /// refunded). No config field, flag or variable sets it.
    #[doc(hidden)]
    pub bench_skip_spend: bool,
}

/// A name unique to this process and incarnation: apalis refuses to
/// register a worker name seen alive within its threshold (apalis #504).
fn worker_name(incarnation: u32) -> String {
    let host = hostname();
    format!(
        "qw-{host}-{}-{incarnation}-{}",
        std::process::id(),
        &crate::quota::request_id()[..6]
    )
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Every fan-out combination of `job`, in a stable order.
pub fn fan_out(job: &crate::config::Job) -> Vec<Vec<(String, String)>> {
    let mut items: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for (key, values) in &job.fan_out {
        items = items
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut next = prefix.clone();
                    next.push((key.clone(), v.clone()));
                    next
                })
            })
            .collect();
    }
    items
}

/// The tasks of one tick of `job`.
pub fn tick_tasks(job: &crate::config::Job, tick_ms: i64, origin: Origin) -> Vec<TaskArgs> {
    fan_out(job)
        .into_iter()
        .enumerate()
        .map(|(i, item)| TaskArgs::first(&job.name, tick_ms, i as u64, item, origin))
        .collect()
}

async fn connect_with_retry(
    url: &RedisUrl,
    timeout: Duration,
    patience: Duration,
) -> Result<redis::aio::ConnectionManager, DaemonError> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut wait = Duration::from_millis(100);
    loop {
        match crate::conn::connect(url, timeout, 2).await {
            Ok(c) => return Ok(c),
            Err(e) if tokio::time::Instant::now() + wait < deadline => {
                warn!(url = %url, error = %e, "Redis unreachable; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(source) => {
                return Err(DaemonError::Unreachable {
                    url: url.clone(),
                    source,
                });
            }
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
    let embedded = match &config.redis.url {
        Some(_) => None,
        None => tokio::select! {
            _ = shutdown.as_mut() => return Ok(()),
            r = EmbeddedRedis::start(&config.state_dir) => Some(r?),
        },
    };
    let url = match (&config.redis.url, &embedded) {
        (Some(u), _) => u.clone(),
        (None, Some(e)) => e.url(),
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

async fn run_on(
    config: Arc<Config>,
    secrets: Arc<Secrets>,
    opts: RunOptions,
    shutdown: impl Future<Output = ()> + Send,
    url: &RedisUrl,
) -> Result<(), DaemonError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let connect = async {
        let limiter_conn =
            connect_with_retry(url, config.redis.timeout, Duration::from_secs(30)).await?;
        // apalis-redis kills its worker on any Redis error, a response timeout
        // included (apalis-redis #76): give the queue's connection patience.
        let queue_conn =
            connect_with_retry(url, Duration::from_secs(10), Duration::from_secs(30)).await?;
        Ok::<_, DaemonError>((limiter_conn, queue_conn))
    };
    let (limiter_conn, queue_conn) = tokio::select! {
        _ = shutdown.as_mut() => {
            info!("shut down while waiting for Redis");
            return Ok(());
        }
        r = connect => r?,
    };
    let eviction_wait = config.redis.timeout.max(Duration::from_secs(2));
    match crate::eviction::check(&mut limiter_conn.clone(), eviction_wait).await {
        Eviction::Safe => {}
        Eviction::Unsafe(policy) => match config.redis.unsafe_eviction {
            crate::config::UnsafeEviction::Refuse => {
                return Err(DaemonError::UnsafeEviction {
                    url: url.clone(),
                    policy,
                });
            }
            crate::config::UnsafeEviction::Warn => warn!(
                redis = %url,
                policy,
                "running on a Redis that may evict keys, because [redis] unsafe_eviction = \"warn\": {}",
                Eviction::unsafe_reason(&policy)
            ),
        },
        Eviction::Unknown(why) => warn!(
            redis = %url,
            why,
            "cannot verify that Redis never evicts keys (CONFIG renamed or disabled?): make sure its maxmemory-policy is noeviction (docs/redis.md)"
        ),
    }
    let keys = KeySpace::new(config.redis.key_prefix.clone());
    let queue = Queue::new(
        queue_conn.clone(),
        keys.clone(),
        config.worker.recover_after,
    );
    let limiter = Limiter::new(
        limiter_conn,
        Arc::new(Quotas::new(&config)),
        config.redis.timeout,
    );
    let shared = opts.shared.clone();
    let ops_state = crate::ops::OpsState {
        limiter: limiter.clone(),
        queue: queue.clone(),
        health: shared.health.clone(),
        stats: shared.stats.clone(),
        unsafe_eviction: config.redis.unsafe_eviction,
    };
    let fetcher = Fetcher::new(&secrets)?;
    let worker = Arc::new(Worker {
        config: config.clone(),
        secrets,
        limiter,
        queue: queue.clone(),
        conn: queue_conn.clone(),
        fetcher,
        sinks: Sinks::new(config.dir.clone()),
        stats: shared.stats.clone(),
        events: shared.events.clone(),
        local_blocks: Default::default(),
        bench_skip_spend: opts.bench_skip_spend,
    });
    info!(
        redis = %url,
        jobs = config.jobs.len(),
        concurrency = config.worker.concurrency.get(),
        recover_after_ms = config.worker.recover_after.as_millis() as u64,
        "quota-worker running"
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    // The loops count as alive from the start; they beat from here on.
    Health::beat(&shared.health.scheduler);
    Health::beat(&shared.health.feeder);
    if let Some(listen) = config.metrics.listen {
        crate::ops::recorder();
        let addr = crate::ops::serve(listen, ops_state.clone(), stop_rx.clone())
            .await
            .map_err(|source| DaemonError::Metrics {
                addr: listen,
                source,
            })?;
        if let Some(tx) = &opts.metrics_addr {
            let _ = tx.send(Some(addr));
        }
    }
    let scheduler = tokio::spawn(scheduler(
        config.clone(),
        queue.clone(),
        shared.clone(),
        stop_rx.clone(),
        opts.wedge_scheduler,
    ));
    let feeder = tokio::spawn(feeder(
        config.clone(),
        queue.clone(),
        shared.clone(),
        stop_rx.clone(),
    ));
    let workers = tokio::spawn(supervise_worker(
        config.clone(),
        queue.clone(),
        worker,
        shared.clone(),
        stop_rx.clone(),
    ));
    if let Some(ready) = &opts.ready {
        let _ = ready.send(true);
    }
    crate::ops::notify_ready();
    let notifier = tokio::spawn(crate::ops::notify_loop(
        ops_state,
        config.worker.concurrency.get(),
        sd_notify::watchdog_enabled(),
        stop_rx.clone(),
    ));

    shutdown.await;
    crate::ops::notify_stopping();
    info!(
        timeout_ms = config.worker.shutdown_timeout.as_millis() as u64,
        "shutting down: no new tasks; running ones get the shutdown timeout"
    );
    let _ = stop_tx.send(true);
    let _ = notifier.await;
    let _ = scheduler.await;
    let _ = feeder.await;
    match tokio::time::timeout(
        config.worker.shutdown_timeout + Duration::from_secs(1),
        workers,
    )
    .await
    {
        Ok(_) => info!("all running tasks finished"),
        Err(_) => warn!(
            in_flight = Stats::get(&shared.stats.in_flight),
            "shutdown timeout passed; unfinished tasks stay queued and another daemon (or the next start) picks them up"
        ),
    }
    Ok(())
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Fires each job's cron ticks. Only the next tick after now is ever fired: a
/// daemon that was down does not replay the ticks it missed.
async fn scheduler(
    config: Arc<Config>,
    queue: Queue,
    shared: Shared,
    stop: watch::Receiver<bool>,
    wedge: bool,
) {
    if wedge {
        Health::beat(&shared.health.scheduler);
        warn!("fault injected: the scheduler loop is wedged");
        let mut stop = stop;
        stopped(&mut stop).await;
        return;
    }
    let who = format!("{}:{}", hostname(), std::process::id());
    let mut loops = Vec::new();
    for job in config.jobs.values() {
        let (job, queue, shared, who, mut stop) = (
            job.clone(),
            queue.clone(),
            shared.clone(),
            who.clone(),
            stop.clone(),
        );
        loops.push(tokio::spawn(async move {
            loop {
                Health::beat(&shared.health.scheduler);
                let Some(next) = crate::schedule::next_fires(&job, Utc::now(), 1).pop() else {
                    info!(job = %job.name, "schedule has no future fire time");
                    return;
                };
                let wait = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
                // Wake at least every second, so the watchdog sees the loop alive.
                let nap = wait.min(Duration::from_secs(1));
                tokio::select! {
                    _ = stopped(&mut stop) => return,
                    _ = tokio::time::sleep(nap) => {}
                }
                if nap < wait {
                    continue;
                }
                let tick = next.timestamp_millis();
                let tasks = tick_tasks(&job, tick, Origin::Tick);
                // A failed claim is retried briefly: another daemon may win
                // meanwhile, and then this one stands down. Shutdown cuts
                // the attempts short, even one stuck on a Redis that does
                // not answer: the claim is one script, it happened or not.
                for attempt in 0..5 {
                    let claimed = tokio::select! {
                        _ = stopped(&mut stop) => return,
                        r = queue.enqueue_tick(&job.name, tick, &tasks, &who) => r,
                    };
                    match claimed {
                        Ok(Some(n)) => {
                            info!(job = %job.name, tick, tasks = n, "tick fanned out");
                            break;
                        }
                        Ok(None) => {
                            debug!(job = %job.name, tick, "tick already fanned out by another daemon");
                            break;
                        }
                        Err(e) => {
                            warn!(job = %job.name, tick, attempt, error = %e, "could not fan the tick out; retrying");
                            tokio::select! {
                                _ = stopped(&mut stop) => return,
                                _ = tokio::time::sleep(Duration::from_millis(500 << attempt)) => {}
                            }
                        }
                    }
                }
            }
        }));
    }
    if loops.is_empty() {
        // No jobs: stay alive for the watchdog, as a pure worker.
        let mut stop = stop;
        loop {
            Health::beat(&shared.health.scheduler);
            tokio::select! {
                _ = stopped(&mut stop) => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
    for l in loops {
        let _ = l.await;
    }
}

/// Moves due backlog tasks into apalis, and trims apalis's leftovers.
async fn feeder(
    config: Arc<Config>,
    queue: Queue,
    shared: Shared,
    mut stop: watch::Receiver<bool>,
) {
    let mut next_trim = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut failing = false;
    loop {
        // Drain as long as there is room, a few rounds per wake-up. Shutdown
        // cuts a round short, even one stuck on a Redis that does not
        // answer: a lease left behind expires and another feeder takes it.
        let rounds = async {
            for _ in 0..10 {
                match queue.feed().await {
                    Ok(0) => break,
                    Ok(n) => debug!(tasks = n, "fed tasks to the queue"),
                    Err(e) => {
                        if !failing {
                            warn!(error = %e, "feeder cannot reach the queue; retrying");
                        }
                        return false;
                    }
                }
            }
            true
        };
        let ok = tokio::select! {
            _ = stopped(&mut stop) => return,
            ok = rounds => ok,
        };
        // The loop is alive either way; whether Redis answers is /readyz's business.
        Health::beat(&shared.health.feeder);
        if ok && failing {
            info!("feeder reaches the queue again");
        }
        failing = !ok;
        // Trim in bounded steps: one a second while a pass is under way, then
        // rest a minute once every member has been looked at.
        if ok && tokio::time::Instant::now() >= next_trim {
            let trimmed = tokio::select! {
                _ = stopped(&mut stop) => return,
                r = queue.trim(RETENTION) => r,
            };
            let rest = match trimmed {
                Ok((n, wrapped)) => {
                    if n > 0 {
                        debug!(tasks = n, "trimmed finished tasks");
                    }
                    if wrapped {
                        Duration::from_secs(60)
                    } else {
                        Duration::from_secs(1)
                    }
                }
                Err(e) => {
                    warn!(error = %e, "trim failed");
                    Duration::from_secs(60)
                }
            };
            next_trim = tokio::time::Instant::now() + rest;
        }
        let wait = if ok {
            config.worker.poll_interval
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn handle(task: TaskArgs, worker: Data<Arc<Worker>>) -> Result<(), BoxDynError> {
    let w: Arc<Worker> = (*worker).clone();
    // Detached: if the apalis worker dies on a Redis error, the page in hand
    // still finishes (sink written, checkpoint saved) instead of being
    // dropped between spend and save.
    let run = tokio::spawn(async move { w.run(&task).await });
    match run.await {
        Ok(Ok(_)) => Ok(()),
        // Bookkeeping failed (Redis): let apalis retry the task later.
        Ok(Err(e)) => Err(Box::new(e)),
        Err(e) => Err(Box::new(e)),
    }
}

/// Runs the apalis worker; when it dies (any Redis error kills an apalis-redis
/// worker, apalis-redis #76) starts a new one under a new name, with backoff.
async fn supervise_worker(
    config: Arc<Config>,
    queue: Queue,
    worker: Arc<Worker>,
    shared: Shared,
    mut stop: watch::Receiver<bool>,
) {
    let mut incarnation = 0u32;
    let mut backoff = Duration::from_millis(250);
    loop {
        let name = worker_name(incarnation);
        let w = WorkerBuilder::new(name.clone())
            .backend(
                queue
                    .storage()
                    .poll_with_strategy(Ticker::new(config.worker.poll_interval)),
            )
            .concurrency(config.worker.concurrency.get())
            .data(worker.clone())
            .build(handle);
        let mut stop_signal = stop.clone();
        let started = tokio::time::Instant::now();
        Health::beat(&shared.health.worker);
        let run = w.run_until(async move {
            stopped(&mut stop_signal).await;
            Ok::<(), std::io::Error>(())
        });
        // Bound the graceful drain by the shutdown timeout.
        let mut stop_timer = stop.clone();
        let result = tokio::select! {
            r = run => Some(r),
            _ = async {
                stopped(&mut stop_timer).await;
                tokio::time::sleep(config.worker.shutdown_timeout).await;
            } => None,
        };
        if *stop.borrow() {
            return;
        }
        shared.health.worker.store(0, Ordering::Relaxed);
        match result {
            Some(Err(e)) => {
                error!(worker = %name, error = %e, backoff_ms = backoff.as_millis() as u64, "worker stopped on an error; restarting")
            }
            _ => warn!(worker = %name, "worker stopped; restarting"),
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(250);
        }
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
        incarnation += 1;
    }
}
