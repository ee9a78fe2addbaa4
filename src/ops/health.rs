//! Liveness: each daemon loop beats a slot of [`Health`] every round; the
//! systemd watchdog ([`super::notify`]) and `/readyz` read how fresh the beats are.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::Utc;

use super::OpsState;
use crate::config::UnsafeEviction;
use crate::eviction::{self, Eviction};

/// A loop is healthy if it beat within this long (the feeder can sit in one
/// Redis call for up to the queue connection's 10 s response timeout).
pub const STALE_AFTER: Duration = Duration::from_secs(12);

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
    /// Marks `slot` alive now.
    pub(crate) fn beat(slot: &AtomicI64) {
        slot.store(Utc::now().timestamp_millis(), Ordering::Relaxed);
    }

    /// Whether the scheduler and feeder loops are alive.
    pub(crate) fn loops_alive(&self) -> bool {
        fresh(&self.scheduler, STALE_AFTER) && fresh(&self.feeder, STALE_AFTER)
    }
}

fn fresh(slot: &AtomicI64, within: Duration) -> bool {
    let last = slot.load(Ordering::Relaxed);
    last > 0 && Utc::now().timestamp_millis() - last < within.as_millis() as i64
}

/// `/readyz`: 200 when Redis answers (and may not evict keys, unless
/// `unsafe_eviction = "warn"`) and the scheduler and worker run, else 503
/// naming what is wrong.
pub(super) async fn readyz(State(s): State<OpsState>) -> impl IntoResponse {
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
    } else if let Eviction::Unsafe(policy) =
        eviction::check(&mut conn, Duration::from_secs(1)).await
    {
        // Read every time: a CONFIG SET after start changes the answer.
        let reason = Eviction::unsafe_reason(&policy);
        match s.unsafe_eviction {
            UnsafeEviction::Refuse => problems.push(reason),
            UnsafeEviction::Warn => {
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
