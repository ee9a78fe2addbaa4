//! Liveness: each daemon loop (the scheduler, the feeder, the worker's
//! supervisor) beats a slot of [`Health`] every round; the systemd watchdog
//! and `/readyz` ([`crate::ops`]) read how fresh the beats are. Below both:
//! the loops report here and know nothing of ops, ops reads here and knows
//! no loop.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::Utc;

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

/// Whether `slot` beat within `within`.
pub(crate) fn fresh(slot: &AtomicI64, within: Duration) -> bool {
    let last = slot.load(Ordering::Relaxed);
    last > 0 && Utc::now().timestamp_millis() - last < within.as_millis() as i64
}
