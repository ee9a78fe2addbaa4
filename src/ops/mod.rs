//! Operations: Prometheus metrics, `/healthz` and `/readyz`, and the systemd
//! notify protocol.
//!
//! - `metrics`: the recorder, and the gauges read from Redis at scrape time;
//! - `health`: `/readyz`, from Redis and the daemon loops' liveness
//!   ([`crate::liveness`]);
//! - `notify`: `READY=1`, `STOPPING=1`, `STATUS=`, and `WATCHDOG=1`, sent
//!   only while the scheduler and feeder loops keep beating: a wedged loop
//!   stops the pings and systemd restarts the service;
//! - `status`: the status page, `GET /`, `GET /api/status` and `GET
//!   /api/state/JOB` (read-only);
//! - `listener`: the HTTP server for all of it, with a cap on connections and
//!   a request-head timeout.
//!
//! The daemon ([`crate::daemon`]) starts all of it; nothing here knows the daemon.

mod health;
mod listener;
mod metrics;
mod notify;
mod status;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

pub use listener::{HEAD_TIMEOUT, MAX_CONNECTIONS};
pub(crate) use metrics::{GaugeReads, recorder, zero_counters};
pub use notify::Notifier;
pub(crate) use status::StatusReads;

use crate::liveness::Health;
use crate::queue::Queue;
use crate::quota::{CredentialUsage, Limiter};
use crate::stats::Stats;

/// What a reload replaces ([`crate::daemon`]): the config, and the limiter
/// over its windows. Each read takes the one in force then.
#[derive(Clone)]
pub(crate) struct Live {
    /// The jobs and endpoints the status page lists.
    pub(crate) config: Arc<crate::config::Config>,
    /// For window gauges and the readiness ping.
    pub(crate) limiter: Limiter,
}

/// What the HTTP endpoints and the `STATUS=` line read.
#[derive(Clone)]
pub(crate) struct OpsState {
    /// The config and limiter in force: a reload sends new ones.
    pub(crate) live: watch::Receiver<Live>,
    /// For queue depth.
    pub(crate) queue: Queue,
    /// Loop liveness.
    pub(crate) health: Arc<Health>,
    /// This daemon's counters.
    pub(crate) stats: Arc<Stats>,
    /// Whether a Redis that may evict keys makes the daemon not ready.
    pub(crate) unsafe_eviction: crate::config::UnsafeEviction,
    /// When `/metrics` last read its gauges from Redis.
    pub(crate) gauge_reads: Arc<GaugeReads>,
    /// When the status page last read Redis, and what it read.
    pub(crate) status_reads: Arc<StatusReads>,
    /// This daemon's credential commands (the status page shows their state).
    pub(crate) minter: Arc<crate::mint::Minter>,
}

impl OpsState {
    /// The config and limiter in force now.
    pub(crate) fn live(&self) -> Live {
        self.live.borrow().clone()
    }
}

/// Takes the metrics address, before anything else starts: an address this
/// host cannot listen on is said at once, not after waiting for Redis.
/// Warns when it is reachable from other hosts: the endpoints have no
/// authentication.
pub(crate) async fn bind(listen: SocketAddr) -> std::io::Result<TcpListener> {
    if let Some(why) = exposed(listen) {
        warn!(addr = %listen, "{why}");
    }
    listener::bind(listen)
}

/// Why serving the endpoints on `listen` deserves a warning, if it does:
/// any address but loopback lets other hosts read them, and nothing
/// authenticates a scrape (`check` says the same).
pub fn exposed(listen: SocketAddr) -> Option<&'static str> {
    (!listen.ip().is_loopback()).then_some(
        "metrics listen beyond loopback, without authentication: any host that reaches it reads credential names, quota usage, blocks, jobs and queue depth from /metrics and the status page; bind 127.0.0.1 (the default) behind a proxy that authenticates, or firewall the port",
    )
}

/// Serves `/metrics`, `/healthz`, `/readyz`, and the status page (`/`,
/// `/api/status`) on `listener` until `stop`, at most [`MAX_CONNECTIONS`]
/// connections at once, each dropped when it sends no request head within
/// [`HEAD_TIMEOUT`] ([`listener`]).
/// Returns the bound address (for `listen = "127.0.0.1:0"`).
pub(crate) fn serve(
    listener: TcpListener,
    state: OpsState,
    stop: watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let addr = listener.local_addr()?;
    recorder();
    metrics::zero_counters(&state.live().config);
    let app = Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(health::readyz))
        .route("/", get(status::page))
        .route("/api/status", get(status::api))
        .route("/api/state/{job}", get(status::state_api))
        .with_state(state);
    tokio::spawn(listener::run(listener, app, stop));
    info!(%addr, "metrics listening: /metrics /healthz /readyz, status page / and /api/status, item state /api/state/JOB");
    Ok(addr)
}

/// How long one scrape (or one `STATUS=` line) may wait for Redis, all reads
/// together. Prometheus's default scrape timeout is 10 s; a hung Redis must
/// not take the counters' scrape down with it (the queue's connection alone
/// waits up to 10 s for an answer).
pub(crate) const REDIS_READ_BUDGET: Duration = Duration::from_secs(2);

/// A template credential's tenants whose windows `/metrics` exports, at
/// most: one series per tenant and window would otherwise grow with the
/// tenants (docs/metrics.md); `quota TEMPLATE` lists them all.
pub(crate) const METRICS_TENANTS: usize = 50;
/// Runs `read` within [`REDIS_READ_BUDGET`]; `None` (logged, naming
/// `what`) when it fails or takes longer.
pub(crate) async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    read: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout(REDIS_READ_BUDGET, read).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            warn!(error = %e, "{what}: cannot read it from Redis");
            None
        }
        Err(_) => {
            warn!(
                budget_ms = REDIS_READ_BUDGET.as_millis() as u64,
                "{what}: reading it from Redis timed out"
            );
            None
        }
    }
}

/// Each credential's windows, read from Redis now, all at once and within
/// [`REDIS_READ_BUDGET`]; `None` for a credential that could not be read.
/// A template credential stands for its tenants found in Redis (the first
/// [`METRICS_TENANTS`] by name), named `ig[account=123]`.
pub(crate) async fn peek_all(limiter: &Limiter) -> Vec<(String, Option<CredentialUsage>)> {
    let mut names = Vec::new();
    for name in limiter.quotas().credential_names() {
        if limiter.quotas().template_of(name).is_none() {
            names.push(name.to_owned());
            continue;
        }
        let found = tokio::time::timeout(REDIS_READ_BUDGET, limiter.tenants(name, METRICS_TENANTS));
        match found.await {
            Ok(Ok(t)) => {
                ::metrics::gauge!("qw_credential_tenants", "credential" => name.to_owned())
                    .set(t.names.len() as f64);
                names.extend(t.names);
            }
            Ok(Err(e)) => warn!(credential = %name, error = %e, "cannot list the tenants"),
            Err(_) => warn!(credential = %name, "listing the tenants timed out"),
        }
    }
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
