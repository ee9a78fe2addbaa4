//! In-process counters of what this daemon did: task outcomes, pages,
//! records, units. The demo's progress line reads them; so do the metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Task outcomes, as SPEC "Task outcomes" names them, plus the internal ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// All pages fetched.
    Done,
    /// A spend was rejected.
    QuotaExhausted,
    /// The upstream said 429 (or 403 with a quota reason).
    UpstreamThrottled,
    /// A network error, timeout or 5xx: queued again with backoff.
    Retrying,
    /// Other 4xx, bad response, or attempts used up.
    Failed,
    /// A continuation whose run a newer tick's task took over.
    Superseded,
}

impl OutcomeKind {
    /// Every kind, in display order.
    pub const ALL: [OutcomeKind; 6] = [
        OutcomeKind::Done,
        OutcomeKind::QuotaExhausted,
        OutcomeKind::UpstreamThrottled,
        OutcomeKind::Retrying,
        OutcomeKind::Failed,
        OutcomeKind::Superseded,
    ];

    /// The name used in logs, metrics and `trigger --wait`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Done => "done",
            OutcomeKind::QuotaExhausted => "quota_exhausted",
            OutcomeKind::UpstreamThrottled => "upstream_throttled",
            OutcomeKind::Retrying => "retrying",
            OutcomeKind::Failed => "failed",
            OutcomeKind::Superseded => "superseded",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counters; all relaxed (they are reports, not synchronisation).
#[derive(Debug, Default)]
pub struct Stats {
    outcomes: [AtomicU64; 6],
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
    pub fn outcome(&self, kind: OutcomeKind) {
        self.outcomes[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// How many of `kind`.
    pub fn count(&self, kind: OutcomeKind) -> u64 {
        self.outcomes[kind.index()].load(Ordering::Relaxed)
    }

    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Subtracts `n` from a counter.
    pub fn sub(counter: &AtomicU64, n: u64) {
        counter.fetch_sub(n, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
