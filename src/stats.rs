//! In-process counters of what this daemon did: task outcomes, pages,
//! records, units. The demo's progress line reads them; so do the metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::outcome::OutcomeKind;

/// Counters; all relaxed (they are reports, not synchronisation).
#[derive(Debug, Default)]
pub struct Stats {
    outcomes: [AtomicU64; OutcomeKind::ALL.len()],
    /// Pages fetched (2xx).
    pub pages: AtomicU64,
    /// Records written to sinks.
    pub records: AtomicU64,
    /// Units spent (admitted spends, at their configured cost).
    pub units: AtomicU64,
    /// Spends rejected.
    pub rejected_spends: AtomicU64,
    /// Requeues for later (deferrals, retries, busy items).
    pub requeued: AtomicU64,
    /// Tasks running now.
    pub in_flight: AtomicU64,
}

impl Stats {
    /// Counts one outcome.
    pub(crate) fn outcome(&self, kind: OutcomeKind) {
        self.outcomes[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// How many of `kind`.
    pub(crate) fn count(&self, kind: OutcomeKind) -> u64 {
        self.outcomes[kind as usize].load(Ordering::Relaxed)
    }

    /// Adds `n` to a counter.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts `n` from a counter.
    pub(crate) fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
