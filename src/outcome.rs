//! How a task ends: the outcomes SPEC "Task outcomes" names, what each one
//! carries (pages, records, units, retry-after), and how a tick's outcomes are
//! counted in Redis for `trigger --wait`.
//!
//! The worker decides an outcome (`worker`); the counters
//! ([`crate::stats`]), the metrics, the log line and `trigger --wait`
//! ([`crate::cli::trigger`]) read it.

use std::time::Duration;

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
    pub(crate) const ALL: [OutcomeKind; 6] = [
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

    /// Whether the quota (ours or the upstream's) said no: such an outcome
    /// carries the retry-after.
    pub(crate) fn is_quota(self) -> bool {
        matches!(
            self,
            OutcomeKind::QuotaExhausted | OutcomeKind::UpstreamThrottled
        )
    }
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Which outcome.
    pub kind: OutcomeKind,
    /// The page it ended on (the last fetched when done).
    pub page: u32,
    /// Pages fetched by this task.
    pub pages: u32,
    /// Records written by this task.
    pub records: u64,
    /// Units spent by this task.
    pub units: u64,
    /// The quota's (or the upstream's) retry-after, when it said no.
    pub retry_after: Option<Duration>,
    /// When a copy was queued, how long until it runs.
    pub requeued_in: Option<Duration>,
    /// An HTTP status, when one decided.
    pub status: Option<u16>,
    /// Whether the upstream answered `304 Not Modified` (a conditional
    /// request): the run is `done` with nothing written.
    pub not_modified: bool,
    /// Why, in words.
    pub detail: String,
}

impl Outcome {
    /// An outcome of a task that fetched nothing.
    pub(crate) fn new(kind: OutcomeKind, page: u32, detail: impl Into<String>) -> Self {
        Outcome {
            kind,
            page,
            pages: 0,
            records: 0,
            units: 0,
            retry_after: None,
            requeued_in: None,
            status: None,
            not_modified: false,
            detail: detail.into(),
        }
    }

    /// Whether it ends its task's chain: no copy was queued to carry on.
    pub(crate) fn is_terminal(&self) -> bool {
        self.requeued_in.is_none()
    }

    /// The field of the tick's outcome hash this outcome counts in: its kind
    /// when it ends the chain, else [`RETRYING`] or [`DEFERRED`].
    pub(crate) fn tick_field(&self) -> &'static str {
        if self.is_terminal() {
            self.kind.as_str()
        } else if self.kind == OutcomeKind::Retrying {
            RETRYING
        } else {
            DEFERRED
        }
    }
}

/// One task's outcome, for a live view.
#[derive(Debug, Clone)]
pub struct OutcomeEvent {
    /// The job.
    pub job: String,
    /// The item, as `region=US`.
    pub item: String,
    /// The tick.
    pub tick: i64,
    /// How it ended.
    pub outcome: Outcome,
}

// Fields of a tick's outcome hash (`keys::tick_outcomes`) besides the
// terminal kinds' names. `#` marks the ones that are not counts of outcomes
// (`#items`, the tick's task count, is written by `lua/fan_out.lua`).

/// Tasks that were queued again after a failure (not terminal).
pub(crate) const RETRYING: &str = "~retrying";
/// Tasks that were queued again for later without failing (not terminal).
pub(crate) const DEFERRED: &str = "~deferred";
/// The earliest Redis time (ms) at which a task of the tick that ended
/// `quota_exhausted` or `upstream_throttled` may retry (`lua/finish.lua`).
pub(crate) const RETRY_AT_MS: &str = "#retry_at_ms";
/// Set while `trigger --wait` waits for the tick: each task that ends then
/// adds an entry to the tick's stream of ends (`keys::tick_ended`,
/// `lua/finish.lua`), which it blocks on instead of polling.
pub(crate) const WAITED: &str = "#wait";
