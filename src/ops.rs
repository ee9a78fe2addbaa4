//! Operations: Prometheus metrics, `/healthz` and `/readyz`, and the systemd
//! notify protocol.
//!
//! Counters are recorded where things happen (spends in [`crate::quota`],
//! outcomes in [`crate::worker`], upstream answers in [`crate::fetch`]).
//! Window usage and queue depth are read from Redis at scrape time, so every
//! daemon reports the same shared numbers. `WATCHDOG=1` is sent only while
//! the scheduler and feeder loops keep beating ([`crate::daemon::Health`]):
//! a wedged loop stops the pings and systemd restarts the service.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use chrono::Utc;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::daemon::Health;
use crate::queue::Queue;
use crate::quota::{CredentialUsage, Limiter};
use crate::stats::Stats;

/// Spend latency buckets, seconds: a local Redis answers in well under 1 ms.
const SPEND_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use. `None` if
/// another recorder was installed first (then metrics are not exported).
pub fn recorder() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("qw_spend_duration_seconds".into()),
                    &SPEND_BUCKETS,
                )
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            describe();
            Some(handle)
        })
        .as_ref()
}

/// `# HELP` lines: what each metric means (docs/metrics.md).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "qw_spends_total",
        "Spends by credential, endpoint and result (allowed, rejected, unchecked = fail-open without Redis, error)"
    );
    describe_counter!(
        "qw_units_spent_total",
        "Units admitted by this daemon's spends, at the endpoint's configured cost"
    );
    describe_histogram!(
        "qw_spend_duration_seconds",
        "Time of one spend (one Redis round trip), seconds"
    );
    describe_gauge!(
        "qw_window_used_units",
        "Units used in the window now, read from Redis at scrape time (the same on every daemon)"
    );
    describe_gauge!(
        "qw_window_remaining_units",
        "Units left in the window now, read from Redis at scrape time"
    );
    describe_gauge!("qw_window_limit_units", "The window's configured units");
    describe_gauge!(
        "qw_window_frees_in_seconds",
        "Seconds until the oldest spend leaves the window (sliding) or it resets (fixed)"
    );
    describe_gauge!(
        "qw_credential_blocked_seconds",
        "Seconds the credential stays blocked after an upstream 429 (0 = not blocked)"
    );
    describe_counter!(
        "qw_tasks_total",
        "Task outcomes of this daemon by job: done, quota_exhausted, upstream_throttled, retrying, failed, superseded"
    );
    describe_counter!("qw_pages_total", "Pages fetched (2xx) by job");
    describe_counter!("qw_records_total", "Records written to sinks by job");
    describe_counter!(
        "qw_upstream_responses_total",
        "Upstream answers by endpoint and HTTP status (or unreached, timeout, unsent)"
    );
    describe_gauge!(
        "qw_queue_tasks",
        "Tasks in the shared queue by state (backlog, queued, in_flight), read from Redis at scrape time"
    );
    describe_gauge!("qw_tasks_in_flight", "Tasks this daemon is running now");
    describe_gauge!(
        "qw_redis_up",
        "1 if this scrape read the windows and the queue from Redis; 0 if not (those gauges then hold their last values)"
    );
}

/// A loop is healthy if it beat within this long (the feeder can sit in one
/// Redis call for up to the queue connection's 10 s response timeout).
pub const STALE_AFTER: Duration = Duration::from_secs(12);

fn fresh(slot: &std::sync::atomic::AtomicI64, within: Duration) -> bool {
    let last = slot.load(Ordering::Relaxed);
    last > 0 && Utc::now().timestamp_millis() - last < within.as_millis() as i64
}

/// Whether the scheduler and feeder loops are alive.
pub fn loops_alive(health: &Health) -> bool {
    fresh(&health.scheduler, STALE_AFTER) && fresh(&health.feeder, STALE_AFTER)
}

/// What the HTTP endpoints read.
#[derive(Clone)]
pub struct OpsState {
    /// For window gauges and the readiness ping.
    pub limiter: Limiter,
    /// For queue depth.
    pub queue: Queue,
    /// Loop liveness.
    pub health: Arc<Health>,
    /// This daemon's counters.
    pub stats: Arc<Stats>,
    /// Whether a Redis that may evict keys makes the daemon not ready.
    pub unsafe_eviction: crate::config::UnsafeEviction,
}

/// Serves `/metrics`, `/healthz`, `/readyz` on `listen` until `stop`.
/// Returns the bound address (for `listen = "127.0.0.1:0"`).
pub async fn serve(
    listen: SocketAddr,
    state: OpsState,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state);
    tokio::spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        if let Err(e) = server.await {
            warn!(error = %e, "metrics server stopped");
        }
    });
    info!(%addr, "metrics listening: /metrics /healthz /readyz");
    Ok(addr)
}

async fn readyz(State(s): State<OpsState>) -> impl IntoResponse {
    let mut problems = Vec::new();
    let mut warnings = String::new();
    let mut conn = s.queue.connection();
    let ping = tokio::time::timeout(
        Duration::from_secs(1),
        redis::cmd("PING").query_async::<String>(&mut conn),
    )
    .await;
    if !matches!(ping, Ok(Ok(_))) {
        problems.push("redis unreachable".to_owned());
    } else if let crate::eviction::Eviction::Unsafe(policy) =
        crate::eviction::check(&mut conn, Duration::from_secs(1)).await
    {
        // Read every time: a CONFIG SET after start changes the answer.
        let reason = crate::eviction::Eviction::unsafe_reason(&policy);
        match s.unsafe_eviction {
            crate::config::UnsafeEviction::Refuse => problems.push(reason),
            crate::config::UnsafeEviction::Warn => {
                warnings = format!("warning (unsafe_eviction = \"warn\"): {reason}\n")
            }
        }
    }
    if !fresh(&s.health.scheduler, STALE_AFTER) {
        problems.push("scheduler not running".to_owned());
    }
    if s.health.worker.load(Ordering::Relaxed) == 0 {
        problems.push("worker not running".to_owned());
    }
    if problems.is_empty() {
        (StatusCode::OK, format!("ready\n{warnings}"))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", problems.join(", ")),
        )
    }
}

async fn metrics(State(s): State<OpsState>) -> impl IntoResponse {
    let Some(handle) = recorder() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder unavailable\n".to_owned(),
        );
    };
    refresh_gauges(&s).await;
    (StatusCode::OK, handle.render())
}

/// How long one scrape (or one `STATUS=` line) may wait for Redis, all reads
/// together. Prometheus's default scrape timeout is 10 s; a hung Redis must
/// not take the counters' scrape down with it (the queue's connection alone
/// waits up to 10 s for an answer).
pub const REDIS_READ_BUDGET: Duration = Duration::from_secs(2);

/// Each credential's windows, read from Redis now, all at once and within
/// [`REDIS_READ_BUDGET`]; `None` for a credential that could not be read.
async fn peek_all(limiter: &Limiter) -> Vec<(String, Option<CredentialUsage>)> {
    let names: Vec<String> = limiter
        .quotas()
        .credential_names()
        .map(str::to_owned)
        .collect();
    let reads = names.iter().map(|name| async move {
        match tokio::time::timeout(REDIS_READ_BUDGET, limiter.peek(name)).await {
            Ok(Ok(u)) => Some(u),
            Ok(Err(e)) => {
                warn!(credential = %name, error = %e, "cannot read the windows");
                None
            }
            Err(_) => {
                warn!(credential = %name, budget_ms = REDIS_READ_BUDGET.as_millis() as u64, "reading the windows timed out");
                None
            }
        }
    });
    let usages = futures::future::join_all(reads).await;
    names.into_iter().zip(usages).collect()
}

/// Shared numbers, read from Redis now. When Redis cannot answer in time the
/// gauges keep their last values and `qw_redis_up` says 0.
async fn refresh_gauges(s: &OpsState) {
    let depth = async {
        match tokio::time::timeout(REDIS_READ_BUDGET, s.queue.depth()).await {
            Ok(Ok(d)) => Some(d),
            Ok(Err(e)) => {
                warn!(error = %e, "metrics: cannot read queue depth");
                None
            }
            Err(_) => {
                warn!("metrics: reading queue depth timed out");
                None
            }
        }
    };
    let (usages, depth) = tokio::join!(peek_all(&s.limiter), depth);
    let mut up = depth.is_some();
    for (name, usage) in usages {
        let Some(u) = usage else {
            up = false;
            continue;
        };
        metrics::gauge!("qw_credential_blocked_seconds", "credential" => name.clone())
            .set(u.blocked_for.as_secs_f64());
        for w in &u.windows {
            let labels = [
                ("credential", name.clone()),
                ("scope", w.scope.to_string()),
                ("window", w.window.describe()),
            ];
            metrics::gauge!("qw_window_used_units", &labels).set(w.used as f64);
            metrics::gauge!("qw_window_remaining_units", &labels).set(w.remaining as f64);
            metrics::gauge!("qw_window_limit_units", &labels).set(w.window.units.get() as f64);
            metrics::gauge!("qw_window_frees_in_seconds", &labels).set(w.frees_in.as_secs_f64());
        }
    }
    if let Some(d) = depth {
        metrics::gauge!("qw_queue_tasks", "state" => "backlog").set(d.backlog as f64);
        metrics::gauge!("qw_queue_tasks", "state" => "queued").set(d.queued as f64);
        metrics::gauge!("qw_queue_tasks", "state" => "in_flight").set(d.in_flight as f64);
    }
    metrics::gauge!("qw_redis_up").set(if up { 1.0 } else { 0.0 });
    metrics::gauge!("qw_tasks_in_flight").set(Stats::get(&s.stats.in_flight) as f64);
}

/// `READY=1`: Redis answers and the worker runs.
pub fn notify_ready() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
}

/// `STOPPING=1`.
pub fn notify_stopping() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}

/// Sends `WATCHDOG=1` at half the watchdog interval while the loops beat, and
/// every 5 s a `STATUS=` line ("8 workers, 3 in flight, yt-key1 412/9500
/// units"). The status line reads Redis, so it is written by a task of its
/// own: a Redis that hangs must not delay a ping (systemd would kill the
/// daemon for what is `/readyz`'s business).
pub async fn notify_loop(
    state: OpsState,
    concurrency: usize,
    watchdog: Option<Duration>,
    mut stop: watch::Receiver<bool>,
) {
    let status = tokio::spawn(status_loop(state.clone(), concurrency, stop.clone()));
    let every = watchdog.map_or(Duration::from_secs(5), |w| {
        (w / 2).max(Duration::from_millis(100))
    });
    let mut warned = false;
    if watchdog.is_some() {
        loop {
            if loops_alive(&state.health) {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                warned = false;
            } else if !warned {
                warn!(
                    "a loop stopped beating: withholding the watchdog ping so systemd restarts the service"
                );
                warned = true;
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
    let _ = status.await;
}

async fn status_loop(state: OpsState, concurrency: usize, mut stop: watch::Receiver<bool>) {
    loop {
        let line = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            line = status_line(&state, concurrency) => line,
        };
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&line)]);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

async fn status_line(state: &OpsState, concurrency: usize) -> String {
    let mut parts = vec![format!(
        "{concurrency} workers, {} in flight",
        Stats::get(&state.stats.in_flight)
    )];
    for (name, usage) in peek_all(&state.limiter).await {
        match usage.as_ref().and_then(|u| Some((u, u.windows.first()?))) {
            Some((u, w)) => {
                let blocked = if u.blocked_for.is_zero() {
                    ""
                } else {
                    " (blocked)"
                };
                parts.push(format!(
                    "{name} {}/{} units{blocked}",
                    w.used, w.window.units
                ));
            }
            None if usage.is_none() => parts.push(format!("{name} ? units (Redis unreachable)")),
            None => {}
        }
    }
    parts.join(", ")
}
