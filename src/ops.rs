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
use crate::quota::Limiter;
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
            builder.install_recorder().ok()
        })
        .as_ref()
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
    let mut conn = s.queue.connection();
    let ping = tokio::time::timeout(
        Duration::from_secs(1),
        redis::cmd("PING").query_async::<String>(&mut conn),
    )
    .await;
    if !matches!(ping, Ok(Ok(_))) {
        problems.push("redis unreachable");
    }
    if !fresh(&s.health.scheduler, STALE_AFTER) {
        problems.push("scheduler not running");
    }
    if s.health.worker.load(Ordering::Relaxed) == 0 {
        problems.push("worker not running");
    }
    if problems.is_empty() {
        (StatusCode::OK, "ready\n".to_owned())
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

/// Shared numbers, read from Redis now.
async fn refresh_gauges(s: &OpsState) {
    let names: Vec<String> = s
        .limiter
        .quotas()
        .credential_names()
        .map(str::to_owned)
        .collect();
    for name in names {
        match s.limiter.peek(&name).await {
            Ok(u) => {
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
                    metrics::gauge!("qw_window_limit_units", &labels)
                        .set(w.window.units.get() as f64);
                    metrics::gauge!("qw_window_frees_in_seconds", &labels)
                        .set(w.frees_in.as_secs_f64());
                }
            }
            Err(e) => warn!(credential = %name, error = %e, "metrics: cannot read windows"),
        }
    }
    match s.queue.depth().await {
        Ok(d) => {
            metrics::gauge!("qw_queue_tasks", "state" => "backlog").set(d.backlog as f64);
            metrics::gauge!("qw_queue_tasks", "state" => "queued").set(d.queued as f64);
            metrics::gauge!("qw_queue_tasks", "state" => "in_flight").set(d.in_flight as f64);
        }
        Err(e) => warn!(error = %e, "metrics: cannot read queue depth"),
    }
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
/// a `STATUS=` line ("8 workers, 3 in flight, yt-key1 412/9500 units").
pub async fn notify_loop(
    state: OpsState,
    concurrency: usize,
    watchdog: Option<Duration>,
    mut stop: watch::Receiver<bool>,
) {
    let every = watchdog.map_or(Duration::from_secs(5), |w| {
        (w / 2).max(Duration::from_millis(100))
    });
    let mut status_at: Option<tokio::time::Instant> = None;
    let mut warned = false;
    loop {
        if watchdog.is_some() {
            if loops_alive(&state.health) {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                warned = false;
            } else if !warned {
                warn!(
                    "a loop stopped beating: withholding the watchdog ping so systemd restarts the service"
                );
                warned = true;
            }
        }
        if status_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            status_at = Some(tokio::time::Instant::now());
            let line = status_line(&state, concurrency).await;
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&line)]);
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

async fn status_line(state: &OpsState, concurrency: usize) -> String {
    let mut parts = vec![format!(
        "{concurrency} workers, {} in flight",
        Stats::get(&state.stats.in_flight)
    )];
    let names: Vec<String> = state
        .limiter
        .quotas()
        .credential_names()
        .map(str::to_owned)
        .collect();
    for name in names {
        if let Ok(u) = state.limiter.peek(&name).await
            && let Some(w) = u.windows.first()
        {
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
    }
    parts.join(", ")
}
