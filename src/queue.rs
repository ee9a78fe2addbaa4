//! The task queue: apalis-redis, with our backlog in front of it and our own
//! janitor behind it.
//!
//! Workarounds for apalis-redis 1.0, each pinned by a regression test named
//! after its pitfall (docs/queue.md lists the pitfalls, numbered, with the
//! test that pins each):
//! - every push lands in apalis's scheduled set, and a fetch promotes all due
//!   tasks in one Lua `unpack` that fails past ~8,000: tasks wait in our
//!   backlog and [`Queue::feed`] hands apalis at most [`FEED_CAP`] at a time;
//! - apalis's own retries ignore backoff and bounded attempts: workers always
//!   ack, and schedule retries and deferrals through [`Queue::enqueue`];
//! - done/dead sets, task data and worker metadata are never trimmed:
//!   [`Queue::trim`] does it (never apalis's `vacuum`, which also deletes
//!   tasks waiting for retry);
//! - the default queue name is a Rust type name: it is set explicitly;
//! - orphaned tasks come back after heartbeat × missed heartbeats: both are
//!   derived from `[worker] recover_after`.

use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Duration;

use apalis::prelude::{PollSnapshot, PollStrategy, TaskBuilder, TaskId};
use apalis_redis::RedisStorage;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

use crate::conn::Lua;
use crate::keys::KeySpace;

/// Most tasks handed to apalis and not yet fetched, across all daemons.
/// Far below the ~8,000 its fetch can promote at once.
pub const FEED_CAP: usize = 1_000;

/// Most tasks one fan-out call queues: one call then holds Redis for about
/// a millisecond (3 ms at the median on a 2-core machine under a load of
/// 12); a million-task fan-out in one call held it 34 s, and every other
/// client got `BUSY`.
pub const FAN_OUT_CHUNK: usize = 200;

/// How long a fan-out's enqueuer may be silent (between two chunks) before
/// another may take the rest over. Each chunk renews it.
pub const FAN_OUT_LEASE: Duration = Duration::from_secs(10);

/// How long a tick's claim, outcome counts and fan-out progress are kept.
const TICK_TTL: Duration = Duration::from_secs(86_400);

/// How long a job's rotation is kept after its last tick: longer than any
/// gap between two ticks of a live job (a yearly one's included).
pub(crate) const FAIR_TTL: Duration = Duration::from_secs(400 * 86_400);

/// How long a feeder may take to push a leased batch before another takes over.
const FEED_LEASE: Duration = Duration::from_secs(30);

/// Members of each apalis set one [`Queue::trim`] call looks at.
const TRIM_STEP: usize = 1_000;

/// How long finished tasks stay in apalis's sets before [`Queue::trim`] drops them.
pub const RETENTION: Duration = Duration::from_secs(3_600);

/// When an idle apalis worker fetches again: every `poll_interval`, like
/// apalis's `poll_with_interval`, without its lost wake-up (apalis pitfall
/// 13). apalis-core 1.0's `IntervalStrategy` replaces a fired timer with one
/// it never polls, so when a fetch outlasts the interval and comes back empty
/// nothing wakes the worker until its next heartbeat, `recover_after` ÷ 5
/// later. This strategy drains every tick that is due and returns only once
/// its timer is pending, so a wake-up is always armed.
#[derive(Debug)]
pub(crate) struct Ticker(tokio::time::Interval);

impl Ticker {
    /// Ticks every `every` (a tick missed while a fetch ran is not made up).
    /// Must be called within the tokio runtime.
    pub(crate) fn new(every: Duration) -> Self {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ticker(interval)
    }
}

impl PollStrategy for Ticker {
    fn poll_drive(&mut self, cx: &mut Context<'_>, _: &PollSnapshot) -> Poll<Option<()>> {
        let mut fired = false;
        while self.0.poll_tick(cx).is_ready() {
            fired = true;
        }
        if fired {
            Poll::Ready(Some(()))
        } else {
            Poll::Pending
        }
    }
}

static ENQUEUE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../lua/enqueue.lua")));
static FAN_OUT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../lua/fan_out.lua")));
static FAN_OUT_TAKE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../lua/fan_out_take.lua")));
static ROTATE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../lua/rotate.lua")));
static FEED: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../lua/feed.lua")));
static FED: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../lua/fed.lua")));
static TRIM: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../lua/trim.lua")));

/// Why a task was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// A cron tick.
    Tick,
    /// `quota-worker trigger`.
    Trigger,
    /// A retry after a network error, timeout or 5xx (counts as a failure).
    Retry,
    /// Come back later without it being a failure: a deferral to the
    /// retry-after (`on_quota_exhausted = "defer"`), or the limiter was
    /// unreachable.
    Defer,
    /// Another task held the item; try again shortly.
    Busy,
}

impl Origin {
    /// As stored (serde's name).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Tick => "tick",
            Origin::Trigger => "trigger",
            Origin::Retry => "retry",
            Origin::Defer => "defer",
            Origin::Busy => "busy",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// One tick's fan-out, as its chunks name it.
#[derive(Debug, Clone, Copy)]
pub struct TickFanOut<'a> {
    /// The job.
    pub job: &'a str,
    /// The tick, ms.
    pub tick: i64,
    /// Why its tasks are queued (`Tick` or `Trigger`).
    pub origin: Origin,
    /// Who queues it: the claim's value and the progress owner, unique per
    /// process (a daemon's `host:pid`, a trigger's request id).
    pub who: &'a str,
}

/// Where one tick of a job starts serving its items, and its turn (the
/// job's tick count, which `starved_ticks` counts in): [`Queue::begin_tick`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rotation {
    /// The item index queued (and so served) first; the rest follow in
    /// index order, wrapping around.
    pub offset: u64,
    /// The job's tick number.
    pub turn: u64,
}

impl Rotation {
    /// The item index at `position` of a tick of `total` items.
    pub fn index_at(self, position: u64, total: u64) -> u64 {
        if total == 0 {
            return 0;
        }
        (self.offset % total + position % total) % total
    }

    /// The position of item `index` in a tick of `total` items.
    pub fn position_of(self, index: u64, total: u64) -> u64 {
        if total == 0 {
            return 0;
        }
        (index % total + total - self.offset % total) % total
    }
}

/// What one chunk call did.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Queued (or found queued by an earlier call): this many tasks are now.
    Queued(u64),
    /// Every task of the tick is queued: this many.
    Complete(u64),
    /// The tick is someone else's: claimed by another daemon, or taken over
    /// after this caller's lease ran out. `queued`: its progress (`None`:
    /// finished).
    Taken {
        /// Who has it.
        by: String,
        /// Tasks queued so far; `None` when all are.
        queued: Option<u64>,
    },
    /// The chunk did not start where the tick's progress is: go on from there.
    Gap(u64),
    /// The claim expired while chunks were still queued (a fan-out that
    /// took longer than a day): nothing more is queued.
    ClaimGone,
}

/// What [`Queue::take_over`] found.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeOver {
    /// The caller owns the rest now: go on at `next`.
    Taken {
        /// Tasks queued so far.
        next: u64,
        /// The tasks' origin.
        origin: Origin,
    },
    /// Its enqueuer's lease still runs.
    Busy {
        /// Who queues it.
        owner: String,
        /// Tasks queued so far.
        next: u64,
    },
    /// Nothing left: it finished (or its keys expired).
    Finished,
    /// Its tasks are of another origin than asked for: left alone.
    NotMine,
}

/// A fan-out's member in the `fanning` zset.
fn fanning_member(job: &str, tick: i64) -> String {
    format!("{job}:{tick}")
}

/// One task: one fan-out item of one tick of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskArgs {
    /// Unique per queued copy: `<job>:<tick_ms>:<item index>` for a tick's
    /// task, `...:<seq>` for a retry or deferral (a new root), `<root>:b<seq>`
    /// for a busy copy (same root).
    pub id: String,
    /// The unit of work this copy stands for; a redelivered or busy-requeued
    /// copy of a root that already ended does nothing.
    pub root: String,
    /// The job.
    pub job: String,
    /// The tick, ms since the epoch.
    pub tick: i64,
    /// The item's index in the fan-out.
    pub index: u64,
    /// The item: fan-out key/value pairs.
    pub item: Vec<(String, String)>,
    /// Why this copy was queued.
    pub origin: Origin,
    /// Whether it continues its tick's interrupted run (retry, deferral): it
    /// resumes that run's checkpoint only if no newer tick took it over.
    pub continuation: bool,
    /// Real failures so far (network, 5xx, timeouts): bounded by `retry.attempts`.
    pub failures: u32,
    /// Copies queued before this one in its chain.
    pub seq: u32,
    /// The tick's turn in its job's rotation ([`Rotation`]); `None` for a
    /// task queued without one (`enqueue_tick`), which fairness ignores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
}

impl TaskArgs {
    /// The item's value for fan-out key `key` ("" when it has none): a
    /// template credential's tenant, for one.
    pub(crate) fn value_of(&self, key: &str) -> &str {
        let found = self.item.iter().find(|(k, _)| k == key);
        found.map_or("", |(_, v)| v.as_str())
    }

    /// The first task of `item` at `tick`.
    pub fn first(
        job: &str,
        tick: i64,
        index: u64,
        item: Vec<(String, String)>,
        origin: Origin,
    ) -> Self {
        let id = format!("{job}:{tick}:{index}");
        TaskArgs {
            root: id.clone(),
            id,
            job: job.to_owned(),
            tick,
            index,
            item,
            origin,
            continuation: false,
            failures: 0,
            seq: 0,
            turn: None,
        }
    }

    /// The task of item `index` of a tick of `total` items queued in
    /// `rotation`'s order. Its id names its position, zero-padded to one
    /// width per tick, so that ids sort in serving order: the backlog and
    /// apalis's scheduled set both hand out tasks due at the same moment in
    /// the order of their ids.
    pub fn in_rotation(
        fan: &TickFanOut<'_>,
        rotation: Rotation,
        total: u64,
        index: u64,
        item: Vec<(String, String)>,
    ) -> Self {
        let width = total.saturating_sub(1).max(1).ilog10() as usize + 1;
        let position = rotation.position_of(index, total);
        let mut task = TaskArgs::first(fan.job, fan.tick, index, item, fan.origin);
        task.id = format!("{}:{}:{position:0width$}", fan.job, fan.tick);
        task.root = task.id.clone();
        task.turn = Some(rotation.turn);
        task
    }

    /// The same item of the same tick, queued again for `origin`.
    ///
    /// A retry or deferral and a busy copy of one task never share an id:
    /// both the backlog and apalis keep the first of two pushes of one id
    /// (apalis for as long as it keeps the task's data, an hour), so a
    /// retry named like a busy copy queued by a redelivered copy of the same
    /// task was dropped, and the task was lost.
    pub(crate) fn again(&self, origin: Origin) -> Self {
        let mut next = self.clone();
        next.origin = origin;
        next.seq += 1;
        match origin {
            Origin::Retry | Origin::Defer => {
                if origin == Origin::Retry {
                    next.failures += 1;
                }
                next.continuation = true;
                next.id = format!("{}:{}:{}:{}", self.job, self.tick, self.index, next.seq);
                next.root = next.id.clone();
            }
            // Stands in for its root: same root, same kind. Two busy copies
            // of one root from two concurrent runs of it may share an id:
            // keeping one of them is right.
            Origin::Busy | Origin::Tick | Origin::Trigger => {
                next.id = format!("{}:b{}", self.root, next.seq);
            }
        }
        next
    }

    /// The item as one string: `region=US,lang=en` (`-` for no fan-out).
    pub(crate) fn item_key(&self) -> String {
        item_key(&self.item)
    }
}

/// A fan-out item as one string, for keys and logs: `k=v,k=v` over every
/// key in order, so items that differ in any value differ here. Injective:
/// `\`, `,` and `=` in a value are escaped with `\` (values from data may
/// hold them: `a="x,b=y", b="z"` and `a="x", b="y,b=z"` must not share a
/// lock or a cursor); values without them are written as before.
pub(crate) fn item_key(item: &[(String, String)]) -> String {
    if item.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, (k, v)) in item.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push('=');
        for c in v.chars() {
            if matches!(c, '\\' | ',' | '=') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

/// What went wrong with the queue. Redis errors mean "try again later".
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis failed or is unreachable.
    #[error("queue unavailable: {0}")]
    Redis(#[from] redis::RedisError),
    /// apalis-redis failed.
    #[error("queue unavailable: {0}")]
    Apalis(#[from] apalis_redis::Error),
    /// A payload did not (de)serialize: a bug or a foreign writer.
    #[error("bad task payload: {0}")]
    Payload(#[from] serde_json::Error),
}

/// Sizes of the queue's parts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Depth {
    /// In our backlog (due or not).
    pub backlog: u64,
    /// In apalis, waiting to be fetched.
    pub queued: u64,
    /// Fetched by a worker and not yet acked.
    pub in_flight: u64,
}

/// The queue of one key space.
#[derive(Clone)]
pub struct Queue {
    conn: ConnectionManager,
    keys: KeySpace,
    apalis: apalis_redis::Config,
}

impl Queue {
    /// A queue over `conn`. Workers heartbeat every fifth of `recover_after`
    /// and are declared dead after three missed beats, so a killed daemon's
    /// tasks are re-queued within about `recover_after` (at most
    /// 3/5 + 1/5 of it, plus a second of timestamp resolution).
    pub fn new(conn: ConnectionManager, keys: KeySpace, recover_after: Duration) -> Self {
        let heartbeat = (recover_after / 5).max(Duration::from_millis(500));
        let apalis = apalis_redis::Config::default()
            .queue(keys.queue())
            // One task per fetch: a fetched task that waits for a free slot
            // stops the worker's heartbeats (apalis notes, pitfall 9).
            .batch_size(1)
            .heartbeat_interval(heartbeat)
            .missed_heartbeats(3)
            .emit_events(false);
        Queue { conn, keys, apalis }
    }

    /// The apalis-redis config (queue name, heartbeats).
    pub fn apalis_config(&self) -> &apalis_redis::Config {
        &self.apalis
    }

    /// A storage for a worker.
    pub(crate) fn storage(&self) -> RedisStorage<TaskArgs> {
        RedisStorage::new(self.conn.clone()).with_config(self.apalis.clone())
    }

    /// The queue's Redis connection (a cheap clone).
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The key space.
    pub(crate) fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Adds tasks to run after their delays. Ids already waiting are kept.
    pub async fn enqueue(&self, tasks: &[(TaskArgs, Duration)]) -> Result<usize, QueueError> {
        let mut inv = ENQUEUE.call();
        inv.key(self.keys.backlog()).key(self.keys.backlog_data());
        for (t, delay) in tasks {
            inv.arg(&t.id)
                .arg(delay.as_millis() as u64)
                .arg(serde_json::to_string(t)?);
        }
        let mut conn = self.conn.clone();
        let n: i64 = inv.invoke(&mut conn).await?;
        Ok(n.max(0) as usize)
    }

    /// Where `job`'s tick at `tick` (of `total` items) starts serving, and
    /// its turn (`lua/rotate.lua`): where the job's previous tick's first
    /// task that ended on the quota's "no" was, so the items starved last
    /// time go first. The same for every caller for one tick.
    pub async fn begin_tick(
        &self,
        job: &str,
        tick: i64,
        total: u64,
    ) -> Result<Rotation, QueueError> {
        let mut conn = self.conn.clone();
        let (offset, turn): (u64, u64) = ROTATE
            .call()
            .key(self.keys.fair(job))
            .key(self.keys.tick_rotation(job, tick))
            .arg(tick)
            .arg(total)
            .arg(FAIR_TTL.as_millis() as u64)
            .arg(TICK_TTL.as_millis() as u64)
            .invoke(&mut conn)
            .await?;
        Ok(Rotation { offset, turn })
    }

    /// Claims `job`'s tick at `tick_ms` and adds its tasks: with several
    /// daemons, exactly one fans each tick out. `None` when another daemon
    /// (or an earlier call) already claimed it. For tasks already in memory
    /// (tests, benchmarks); the daemon and `trigger` stream a tick's items
    /// through [`Queue::fan_out_chunk`] (`schedule::queue_tick`).
    pub async fn enqueue_tick(
        &self,
        job: &str,
        tick_ms: i64,
        tasks: &[TaskArgs],
        claimed_by: &str,
    ) -> Result<Option<usize>, QueueError> {
        let fan_out = TickFanOut {
            job,
            tick: tick_ms,
            origin: tasks.first().map_or(Origin::Tick, |t| t.origin),
            who: claimed_by,
        };
        let mut start = 0;
        loop {
            let end = (start + FAN_OUT_CHUNK).min(tasks.len());
            let chunk: Vec<(String, String)> = tasks[start..end]
                .iter()
                .map(|t| Ok((t.id.clone(), serde_json::to_string(t)?)))
                .collect::<Result<_, serde_json::Error>>()?;
            let last = end == tasks.len();
            match self
                .fan_out_chunk(&fan_out, start as u64, last, &chunk)
                .await?
            {
                Chunk::Queued(n) | Chunk::Gap(n) => start = n as usize,
                Chunk::Complete(n) => return Ok(Some(n as usize)),
                Chunk::Taken { .. } | Chunk::ClaimGone => return Ok(None),
            }
        }
    }

    /// Queues one chunk of a tick's tasks (`(id, payload)`), the first
    /// `start` of them queued already, under the tick's claim
    /// (`lua/fan_out.lua`). Idempotent: sending a chunk again after a lost
    /// reply changes nothing. The first chunk claims the tick.
    pub async fn fan_out_chunk(
        &self,
        fan_out: &TickFanOut<'_>,
        start: u64,
        last: bool,
        tasks: &[(String, String)],
    ) -> Result<Chunk, QueueError> {
        let TickFanOut {
            job,
            tick,
            origin,
            who,
        } = *fan_out;
        let mut inv = FAN_OUT.call();
        inv.key(self.keys.backlog())
            .key(self.keys.backlog_data())
            .key(self.keys.tick_claim(job, tick))
            .key(self.keys.tick_outcomes(job, tick))
            .key(self.keys.tick_fan_out(job, tick))
            .key(self.keys.fanning())
            .arg(who)
            .arg(start)
            .arg(u8::from(last))
            .arg(FAN_OUT_LEASE.as_millis() as u64)
            .arg(TICK_TTL.as_millis() as u64)
            .arg(fanning_member(job, tick))
            .arg(origin.as_str());
        for (id, payload) in tasks {
            inv.arg(id).arg(0).arg(payload);
        }
        let mut conn = self.conn.clone();
        let (status, n, owner): (i64, i64, String) = inv.invoke(&mut conn).await?;
        Ok(match status {
            0 => Chunk::Queued(n.max(0) as u64),
            1 => Chunk::Complete(n.max(0) as u64),
            -2 => Chunk::ClaimGone,
            -3 => Chunk::Gap(n.max(0) as u64),
            _ => Chunk::Taken {
                by: owner,
                queued: u64::try_from(n).ok(),
            },
        })
    }

    /// Takes over `job`'s fan-out of `tick` if its enqueuer's lease has run
    /// out and (with `only`) its tasks have that origin (`lua/fan_out_take.lua`).
    pub async fn take_over(
        &self,
        job: &str,
        tick: i64,
        who: &str,
        only: Option<Origin>,
    ) -> Result<TakeOver, QueueError> {
        let mut conn = self.conn.clone();
        let (status, next, name): (i64, i64, String) = FAN_OUT_TAKE
            .call()
            .key(self.keys.tick_fan_out(job, tick))
            .key(self.keys.fanning())
            .arg(who)
            .arg(FAN_OUT_LEASE.as_millis() as u64)
            .arg(fanning_member(job, tick))
            .arg(only.map_or("", Origin::as_str))
            .invoke(&mut conn)
            .await?;
        let next = next.max(0) as u64;
        Ok(match status {
            1 => TakeOver::Taken {
                next,
                origin: Origin::parse(&name).unwrap_or(Origin::Tick),
            },
            0 => TakeOver::Busy { owner: name, next },
            -2 => TakeOver::NotMine,
            _ => TakeOver::Finished,
        })
    }

    /// Fan-outs under way (queued in chunks, not finished): job, tick and
    /// when their enqueuer's lease ends (Redis ms), oldest lease first.
    pub async fn unfinished_fan_outs(&self) -> Result<Vec<(String, i64, i64)>, QueueError> {
        let mut conn = self.conn.clone();
        let members: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(self.keys.fanning())
            .arg(0)
            .arg(99)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        Ok(members
            .into_iter()
            .filter_map(|(m, lease)| {
                let (job, tick) = m.rsplit_once(':')?;
                Some((job.to_owned(), tick.parse().ok()?, lease))
            })
            .collect())
    }

    /// Redis's clock, ms (leases are on it).
    pub async fn redis_now_ms(&self) -> Result<i64, QueueError> {
        let mut conn = self.conn.clone();
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        Ok(s * 1000 + us / 1000)
    }

    /// One feeding round: moves due backlog tasks into apalis, keeping it
    /// under [`FEED_CAP`]. Returns how many were moved.
    pub async fn feed(&self) -> Result<usize, QueueError> {
        let mut conn = self.conn.clone();
        let leased: Vec<String> = FEED
            .call()
            .key(self.keys.backlog())
            .key(self.keys.backlog_data())
            .key(self.keys.backlog_feeding())
            .key(self.apalis.scheduled_jobs_set())
            .key(self.apalis.active_jobs_list())
            .arg(FEED_CAP)
            .arg(FEED_LEASE.as_millis() as u64)
            .arg(500)
            .invoke(&mut conn)
            .await?;
        if leased.is_empty() {
            return Ok(0);
        }
        let mut tasks = Vec::with_capacity(leased.len() / 2);
        let mut ids = Vec::with_capacity(leased.len() / 2);
        for pair in leased.chunks(2) {
            let [id, payload] = pair else { continue };
            tasks.push(
                TaskBuilder::new(payload.clone().into_bytes())
                    .task_id(TaskId::from_string(id.clone()))
                    // apalis retries are not used (workers always ack), but
                    // its meta needs a bound.
                    .max_attempts(1)
                    .build(),
            );
            ids.push(id.clone());
        }
        apalis_redis::queries::push_tasks(&mut conn, &self.apalis, &tasks).await?;
        let mut inv = FED.call();
        inv.key(self.keys.backlog())
            .key(self.keys.backlog_data())
            .key(self.keys.backlog_feeding());
        for id in &ids {
            inv.arg(id);
        }
        let _: i64 = inv.invoke(&mut conn).await?;
        Ok(ids.len())
    }

    /// Drops finished tasks older than `retention` from apalis's done and dead
    /// sets (with their data and metadata), and metadata of workers that are
    /// gone, one SSCAN step of each per call. Returns how many tasks were
    /// dropped and whether the scans wrapped around (a full pass is done).
    pub async fn trim(&self, retention: Duration) -> Result<(usize, bool), QueueError> {
        let mut conn = self.conn.clone();
        let cutoff = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(retention)
            .as_secs();
        let cursors = self.keys.trim_cursors();
        let (dropped, wrapped): (i64, i64) = TRIM
            .call()
            .key(self.apalis.done_jobs_set())
            .key(self.apalis.dead_jobs_set())
            .key(self.apalis.job_data_hash())
            .key(self.apalis.workers_set())
            .key(cursors)
            .arg(self.apalis.job_meta_hash())
            .arg(cutoff)
            .arg(TRIM_STEP)
            .arg(format!("{}:metadata:", self.apalis.workers_set()))
            .invoke(&mut conn)
            .await?;
        Ok((dropped.max(0) as usize, wrapped == 1))
    }

    /// How many tasks wait where.
    pub async fn depth(&self) -> Result<Depth, QueueError> {
        let mut conn = self.conn.clone();
        let (backlog, scheduled, active, workers): (u64, u64, u64, Vec<String>) = redis::pipe()
            .zcard(self.keys.backlog())
            .zcard(self.apalis.scheduled_jobs_set())
            .llen(self.apalis.active_jobs_list())
            .zrange(self.apalis.workers_set(), 0, -1)
            .query_async(&mut conn)
            .await?;
        let mut in_flight = 0;
        if !workers.is_empty() {
            let mut pipe = redis::pipe();
            for w in &workers {
                pipe.scard(format!("{}:{w}", self.apalis.inflight_jobs_set()));
            }
            let counts: Vec<u64> = pipe.query_async(&mut conn).await?;
            in_flight = counts.iter().sum();
        }
        Ok(Depth {
            backlog,
            queued: scheduled + active,
            in_flight,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Regression: values holding `,` or `=` made two items one key.
    #[test]
    fn item_keys_are_injective() {
        let a = item_key(&pairs(&[("a", "x,b=y"), ("b", "z")]));
        let b = item_key(&pairs(&[("a", "x"), ("b", "y,b=z")]));
        assert_ne!(a, b);
        assert_eq!(a, "a=x\\,b\\=y,b=z");
        // Plain values keep the key they always had (cursors survive).
        assert_eq!(
            item_key(&pairs(&[("region", "US"), ("lang", "en")])),
            "region=US,lang=en"
        );
        assert_ne!(
            item_key(&pairs(&[("a", "x\\"), ("b", "y")])),
            item_key(&pairs(&[("a", "x"), ("b", "\\y")]))
        );
        assert_eq!(item_key(&[]), "-");
    }

    /// Ids of a rotated tick sort in serving order (the backlog and apalis
    /// hand out tasks due at the same moment by id), and every position
    /// maps to one item.
    #[test]
    fn rotated_ids_sort_in_serving_order_and_cover_every_item() {
        let fan = TickFanOut {
            job: "j",
            tick: 1_000,
            origin: Origin::Tick,
            who: "t",
        };
        for (total, offset) in [(12u64, 7u64), (5, 0), (5, 4), (1, 0), (101, 100)] {
            let rotation = Rotation { offset, turn: 3 };
            let mut tasks: Vec<TaskArgs> = (0..total)
                .map(|p| {
                    let i = rotation.index_at(p, total);
                    assert_eq!(rotation.position_of(i, total), p);
                    TaskArgs::in_rotation(&fan, rotation, total, i, vec![])
                })
                .collect();
            let served: Vec<u64> = tasks.iter().map(|t| t.index).collect();
            tasks.sort_by(|a, b| a.id.cmp(&b.id));
            let by_id: Vec<u64> = tasks.iter().map(|t| t.index).collect();
            assert_eq!(by_id, served, "total {total}, offset {offset}");
            assert_eq!(served[0], offset % total);
            let mut all = served.clone();
            all.sort_unstable();
            assert_eq!(all, (0..total).collect::<Vec<_>>());
            assert!(tasks.iter().all(|t| t.turn == Some(3) && t.root == t.id));
        }
    }

    /// Regression: a busy copy and a retry of one task got the same id.
    #[test]
    fn busy_copies_and_retries_of_one_task_never_share_an_id() {
        let t = TaskArgs::first(
            "j",
            1_000,
            3,
            vec![("region".into(), "US".into())],
            Origin::Tick,
        );
        let busy = t.again(Origin::Busy);
        let retry = t.again(Origin::Retry);
        let defer = t.again(Origin::Defer);
        assert_ne!(busy.id, retry.id);
        assert_ne!(busy.id, defer.id);
        assert_eq!(busy.root, t.root);
        assert_eq!(retry.root, retry.id);
        assert!(retry.continuation && !busy.continuation);

        // The scenario: the original run of `t` holds the item while a
        // redelivered copy of `t` keeps finding it busy; then the original
        // run queues its retry (or deferral). None of them may share an id.
        let mut ids = std::collections::HashSet::new();
        let mut busy = t.clone();
        for _ in 0..10 {
            busy = busy.again(Origin::Busy);
            assert_eq!(busy.root, t.root);
            assert!(ids.insert(busy.id.clone()), "{}", busy.id);
        }
        for o in [Origin::Retry, Origin::Defer] {
            let next = t.again(o);
            assert!(!ids.contains(&next.id), "{o:?} copy {} collides", next.id);
            // And down that copy's own chain as well.
            let mut b = next.again(Origin::Busy);
            for _ in 0..10 {
                assert!(!ids.contains(&b.id) && b.id != next.id, "{}", b.id);
                b = b.again(Origin::Busy);
            }
        }
    }
}
