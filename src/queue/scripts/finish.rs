//! `lua/finish.lua`: how a task ended, recorded in one round trip — its
//! done marker, its tick's outcome counts (and earliest retry-after), the
//! job's tick record and last error that the status page shows, and the
//! job's fair rotation and starved items.
//!
//! [`Finish`] names the script's KEYS and ARGV; [`Finish::invoke`] lays
//! them out in the positions the script's header gives. The tick record's
//! layout ([`TICKS_KEPT`], [`LastError`], [`TickRecord`]) is here, beside
//! its writer; the status page reads it (`ops::status::read`).

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use crate::conn::Conn;
use serde::{Deserialize, Serialize};

use crate::conn::Lua;
use crate::keys::KeySpace;
use crate::outcome::{Outcome, OutcomeKind};
use crate::queue::task::TaskArgs;

static FINISH: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../../lua/finish.lua")));

/// How long "this task already ended" is remembered (covers redelivery).
const DONE_TTL: Duration = Duration::from_secs(86_400);
/// How long a job's starved items are kept after the last of them starved:
/// longer than any gap between two ticks of a live job.
const STARVED_TTL: Duration = Duration::from_secs(400 * 86_400);
/// Most starved items kept per job. An item that starts starving while as
/// many are kept has no count: its outcome lines say `starved_ticks=1`
/// until it is served. About 75 bytes each in Redis with a 24-character
/// item key (200,000 took 14.9 MB on Redis 7.0), so ~75 MB for a job of a
/// million items starved at once (its tick's queued tasks take 400 MB).
pub const STARVED_CAP: u64 = 1_000_000;
/// How many of a job's ticks its record keeps (the newest).
pub(crate) const TICKS_KEPT: usize = 10;
/// How long a job's tick record outlives the first end of its newest tick
/// (set once per tick, not per task: issue 28): long enough for a monthly
/// job's last tick to stay on the page.
pub(crate) const TICKS_TTL: Duration = Duration::from_secs(35 * 86_400);

/// What a task's end says about its item's share of the quota, for fair
/// rotation (docs/outcomes.md "starved_ticks").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Served {
    /// The quota (ours or the upstream's) said no before any page.
    Starved,
    /// It said no after some pages: served, but cut short.
    Cut,
    /// A spend was admitted and the task did not end on a "no".
    Yes,
    /// Neither: nothing was spent for another reason (superseded, a
    /// request that could not be built, a job gone).
    Neither,
}

impl Served {
    /// What `o` says about its item's share.
    pub(crate) fn of(o: &Outcome) -> Self {
        match o.kind {
            OutcomeKind::QuotaExhausted | OutcomeKind::UpstreamThrottled if o.pages == 0 => {
                Served::Starved
            }
            OutcomeKind::QuotaExhausted | OutcomeKind::UpstreamThrottled => Served::Cut,
            OutcomeKind::Done => Served::Yes,
            _ if o.units > 0 || o.pages > 0 => Served::Yes,
            _ => Served::Neither,
        }
    }

    /// As the script takes it (`ARGV[9]`).
    fn as_str(self) -> &'static str {
        match self {
            Served::Starved => "starved",
            Served::Cut => "cut",
            Served::Yes => "served",
            Served::Neither => "",
        }
    }
}

/// A job's last error, as `lua/finish.lua` keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LastError {
    /// The outcome (`failed`, or `retrying` for one that was queued again).
    pub(crate) outcome: String,
    /// The fan-out item, as `region=US` (data: shown escaped).
    pub(crate) item: String,
    /// The tick, ms since the epoch.
    pub(crate) tick: i64,
    /// The HTTP status, when one decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<u16>,
    /// Why, in words (the outcome's detail, as logged: free of secrets).
    pub(crate) detail: String,
    /// When, ms since the epoch (the Redis clock); set when read.
    #[serde(default)]
    pub(crate) at_ms: i64,
}

impl LastError {
    /// The job's last error when `o` is one (a failure, or a retry after
    /// one). The detail is the one logged, so it holds no secret.
    fn of(task: &TaskArgs, o: &Outcome) -> Option<Self> {
        matches!(o.kind, OutcomeKind::Failed | OutcomeKind::Retrying).then(|| LastError {
            outcome: o.kind.as_str().to_owned(),
            item: task.item_key(),
            tick: task.tick,
            status: o.status,
            detail: o.detail.clone(),
            at_ms: 0,
        })
    }
}

/// One tick of a job, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TickRecord {
    /// The tick, ms since the epoch.
    pub(crate) tick: i64,
    /// The tick's outcome hash: outcome field -> count, `#items`, ...
    pub(crate) counts: BTreeMap<String, i64>,
}

/// An item's last run, as `quota-worker state` shows it (`KeySpace::
/// item_last`): written with the run's outcome, as one more key of the
/// item's state its end leaves ([`Leaves`]), so no command is added to a
/// task's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LastRun {
    /// The run's tick, ms since the epoch.
    pub(crate) tick: i64,
    /// How it ended (`done`, `quota_exhausted`, ...).
    pub(crate) outcome: String,
    /// When it ended, s since the epoch: Redis's clock at the item's claim
    /// (whole seconds, as `{since}`) plus the run's length on the worker's
    /// monotonic clock (no host's wall clock), so to within a second or two.
    pub(crate) ended_at: i64,
    /// The page it ended on (the last one fetched when `done`).
    pub(crate) page: u32,
    /// Pages it fetched.
    pub(crate) pages: u32,
    /// Why, in words: the outcome's detail, as logged (free of secrets),
    /// cut to [`LastRun::DETAIL_MAX`] bytes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub(crate) detail: String,
}

impl LastRun {
    /// The longest detail kept.
    const DETAIL_MAX: usize = 500;

    /// `task`'s run that ended with `o` at `ended_at`; `None` for a task
    /// that ran nothing (`superseded`): the item's last run stays the one
    /// before.
    pub(crate) fn of(task: &TaskArgs, o: &Outcome, ended_at: i64) -> Option<Self> {
        if o.kind == OutcomeKind::Superseded {
            return None;
        }
        let mut detail = o.detail.clone();
        if detail.len() > Self::DETAIL_MAX {
            let mut end = Self::DETAIL_MAX;
            while !detail.is_char_boundary(end) {
                end -= 1;
            }
            detail.truncate(end);
            detail.push('…');
        }
        Some(LastRun {
            tick: task.tick,
            outcome: o.kind.as_str().to_owned(),
            ended_at,
            page: o.page,
            pages: o.pages,
            detail,
        })
    }
}

/// `lua/finish.lua`'s arguments: one task's end.
pub(crate) struct Finish {
    /// `KEYS[1]` `done:<root>`, `KEYS[2]` the tick's outcome hash, `KEYS[3]` the
    /// job's tick record, `KEYS[4]` its rotation, `KEYS[5]` its starved items,
    /// `KEYS[6]` the tick's stream of ends (for `trigger --wait`).
    keys: [String; 6],
    /// `ARGV[1]`: the outcome, stored in the done marker.
    outcome: &'static str,
    /// `ARGV[2]`: the tick hash's field it counts in ([`Outcome::tick_field`]).
    field: &'static str,
    /// `ARGV[4]`: when an outcome that ends its chain on a quota's "no" may
    /// retry (what `trigger --wait` reports); a deferred one comes back by
    /// itself, so it has none.
    retry_after: Option<Duration>,
    /// `ARGV[5]` (the tick record's field) and `ARGV[10]` (the rotation's tick).
    tick: i64,
    /// `ARGV[8]`: the job's last error, when this outcome is one.
    last_error: Option<LastError>,
    /// `ARGV[9]`: the item's share, for fair rotation.
    served: Served,
    /// `ARGV[11]`, `ARGV[12]`, `ARGV[13]`: the item's index, its tick's turn
    /// (none: queued without rotation, no fairness), its key.
    index: u64,
    turn: Option<u64>,
    item: String,
    /// `KEYS[7..]`, `ARGV[16..]`: the lock the task held and the item's
    /// state its run leaves, written in the same call.
    held: Option<ItemEnd>,
}

/// What a task that held its item leaves of it when it ends, written by
/// `lua/finish.lua` in the call that records the outcome (issue 28: one
/// round trip instead of four, and no SIGKILL can land between them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ItemEnd {
    /// The item lock's key and the holder's value: deleted if still held.
    pub(crate) lock: String,
    pub(crate) holder: String,
    /// The item's state the run leaves.
    pub(crate) leaves: Leaves,
}

/// The item's state a run's end writes (a complete run's: `{since}`, the
/// validators, the completed tick set, the checkpoint deleted); nothing for
/// a run that stops short, whose checkpoint was saved as it went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Leaves {
    /// Keys set, with their value and lifetime.
    pub(crate) set: Vec<(String, String, Duration)>,
    /// Keys deleted.
    pub(crate) del: Vec<String>,
}

impl Finish {
    /// How `task` ended with `o`.
    pub(crate) fn new(keys: &KeySpace, task: &TaskArgs, o: &Outcome) -> Self {
        let job = &task.job;
        Finish {
            keys: [
                keys.task_done(&task.root),
                keys.tick_outcomes(job, task.tick),
                keys.job_ticks(job),
                keys.fair(job),
                keys.starved(job),
                keys.tick_ended(job, task.tick),
            ],
            outcome: o.kind.as_str(),
            field: o.tick_field(),
            retry_after: o
                .retry_after
                .filter(|_| o.is_terminal() && o.kind.is_quota()),
            tick: task.tick,
            last_error: LastError::of(task, o),
            served: Served::of(o),
            index: task.index,
            turn: task.turn,
            item: task.item_key(),
            held: None,
        }
    }

    /// With what the task leaves of the item it held (its lock, its state).
    pub(crate) fn holding(self, held: ItemEnd) -> Self {
        Finish {
            held: Some(held),
            ..self
        }
    }

    /// Runs the script: the item's starved ticks in a row (`None`: no
    /// fairness for this task).
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<Option<u64>> {
        let mut call = FINISH.call();
        for key in &self.keys {
            call.key(key);
        }
        let ms = |d: Duration| d.as_millis() as u64;
        let last_error = (self.last_error.as_ref())
            .and_then(|e| serde_json::to_string(e).ok())
            .unwrap_or_default();
        call.arg(self.outcome)
            .arg(self.field)
            .arg(DONE_TTL.as_secs())
            .arg(
                self.retry_after
                    .map(|d| ms(d).to_string())
                    .unwrap_or_default(),
            )
            .arg(self.tick)
            .arg(TICKS_KEPT)
            .arg(TICKS_TTL.as_secs())
            .arg(last_error)
            .arg(self.served.as_str())
            .arg(self.tick)
            .arg(self.index)
            .arg(self.turn.map(|t| t.to_string()).unwrap_or_default())
            .arg(&self.item)
            .arg(ms(STARVED_TTL))
            .arg(STARVED_CAP);
        if let Some(held) = &self.held {
            call.key(&held.lock);
            call.arg(&held.holder).arg(held.leaves.set.len());
            for (key, value, ttl) in &held.leaves.set {
                call.key(key);
                call.arg(value).arg(ttl.as_secs().max(1));
            }
            for key in &held.leaves.del {
                call.key(key);
            }
        }
        let starved_ticks: i64 = call.invoke(conn).await?;
        Ok(u64::try_from(starved_ticks).ok())
    }
}
