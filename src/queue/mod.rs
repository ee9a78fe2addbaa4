//! The task queue: apalis-redis, with our backlog in front of it and our own
//! janitor behind it.
//!
//! - this file: [`Queue`], what the daemon, `trigger` and the workers call;
//! - `task`: what a task is ([`TaskArgs`], [`Origin`]) and its copies' ids;
//! - `scripts`: one file per Lua script the queue runs (`lua/<name>.lua`),
//!   each with a typed value for its KEYS and ARGV and its reply; among them
//!   `finish`, how a task's end is recorded (the tick record the status
//!   page shows);
//! - `wake`: how an idle daemon waits on Redis (a blocking read of the wake
//!   stream) instead of polling, and wakes its worker without losing a
//!   wake-up.
//!
//! Workarounds for apalis-redis 1.0, each pinned by a regression test named
//! after its pitfall (docs/queue.md lists the pitfalls, numbered, with the
//! test that pins each):
//! - every push lands in apalis's scheduled set, and a fetch promotes all due
//!   tasks in one Lua `unpack` that fails past ~8,000: tasks wait in our
//!   backlog and [`Queue::feed`] hands apalis at most [`FEED_CAP`] at a time,
//!   straight into its active list (a fan-out's tasks due now go straight
//!   there themselves while it holds fewer: `lua/fan_out.lua`);
//! - an idle worker is woken only by its heartbeat, and apalis's poll
//!   strategies lose wake-ups: the daemon wakes its worker itself (`wake`);
//! - apalis's own retries ignore backoff and bounded attempts: workers always
//!   ack, and schedule retries and deferrals through [`Queue::enqueue`];
//! - done/dead sets, task data and worker metadata are never trimmed:
//!   [`Queue::trim`] does it (never apalis's `vacuum`, which also deletes
//!   tasks waiting for retry);
//! - the default queue name is a Rust type name: it is set explicitly;
//! - orphaned tasks come back after heartbeat × missed heartbeats: both are
//!   derived from `[worker] recover_after`.

pub mod known;
pub(crate) mod scripts;
mod task;
pub(crate) mod wake;

use std::sync::Arc;
use std::time::Duration;

use crate::conn::Conn;
use apalis_redis::RedisStorage;

use crate::keys::KeySpace;
use scripts::enqueue::Enqueue;
use scripts::fan_out::{Apalis, FanOut};
use scripts::fan_out_take::FanOutTake;
use scripts::feed::Feed;
use scripts::rotate::Rotate;
use scripts::trim::Trim;

pub use scripts::fan_out::Chunk;
pub use scripts::fan_out_take::TakeOver;
pub use scripts::feed::Fed;
pub use scripts::rotate::Rotation;
pub(crate) use task::item_key;
pub use task::{Origin, TaskArgs, TickFanOut};
use wake::Tapped;
pub use wake::Wake;

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

/// How long apalis's own calls wait for a master (a failover, a Redis
/// restart): any error kills its worker (apalis-redis #76), which then
/// restarts under a new name; a wait does not.
pub const APALIS_PATIENCE: Duration = Duration::from_secs(60);

/// How long a queue write waits for a replica's acknowledgement (`[redis]
/// queue_replicas`) before it counts as failed, to be tried again.
pub const ACK_WAIT: Duration = Duration::from_secs(2);

/// How long a tick's claim, outcome counts and fan-out progress are kept.
const TICK_TTL: Duration = Duration::from_secs(86_400);

/// How long a job's rotation is kept after its last tick: longer than any
/// gap between two ticks of a live job (a yearly one's included).
pub(crate) const FAIR_TTL: Duration = Duration::from_secs(400 * 86_400);

/// Most tasks one feeding round moves into apalis.
pub(crate) const FEED_BATCH: usize = 500;

/// Members of each apalis set one [`Queue::trim`] call looks at.
const TRIM_STEP: usize = 1_000;

/// How long finished tasks stay in apalis's sets before [`Queue::trim`] drops them.
pub const RETENTION: Duration = Duration::from_secs(3_600);

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
    conn: Conn,
    keys: KeySpace,
    apalis: apalis_redis::Config,
}

impl Queue {
    /// A queue over `conn`. Workers heartbeat every fifth of `recover_after`
    /// and are declared dead after three missed beats, so a killed daemon's
    /// tasks are re-queued within about `recover_after` (at most
    /// 3/5 + 1/5 of it, plus a second of timestamp resolution).
    pub fn new(conn: Conn, keys: KeySpace, recover_after: Duration) -> Self {
        let heartbeat = (recover_after / 5).max(Duration::from_millis(500));
        let apalis = apalis_redis::Config::default()
            .queue(keys.queue())
            // One task per fetch: a fetched task that waits for a free slot
            // stops the worker's heartbeats (apalis notes, pitfall 9).
            .batch_size(1)
            .heartbeat_interval(heartbeat)
            .missed_heartbeats(3)
            // No task leases (issue 28): apalis's lock is a second script
            // call per task (6 commands, among them an LREM that scans the
            // whole active list, O(n), for a task its fetch already took off
            // it), and what it writes (the task's `locked_by`, `Running`)
            // nothing reads. The fetch's in-flight set is what brings a dead
            // worker's tasks back (pitfall 8), and the item lock is what keeps
            // two tasks off one item.
            .lock_tasks(false)
            .emit_events(false);
        Queue { conn, keys, apalis }
    }

    /// The apalis-redis config (queue name, heartbeats).
    pub fn apalis_config(&self) -> &apalis_redis::Config {
        &self.apalis
    }

    /// A storage for a worker that `wake` wakes (its fetches watched:
    /// `wake::Tapped`).
    pub(crate) fn storage(&self, wake: Arc<Wake>) -> RedisStorage<TaskArgs, Tapped> {
        // Any error kills an apalis worker (apalis-redis #76): its calls
        // wait out a failover rather than fail.
        let conn = self.conn.patient(APALIS_PATIENCE);
        let conn = Tapped::new(conn, wake, self.apalis.workers_set());
        RedisStorage::new(conn).with_config(self.apalis.clone())
    }

    /// The queue's Redis connection (a cheap clone).
    pub(crate) fn connection(&self) -> Conn {
        self.conn.clone()
    }

    /// The key space.
    pub(crate) fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// Adds tasks to run after their delays. Ids already waiting are kept.
    pub async fn enqueue(&self, tasks: &[(TaskArgs, Duration)]) -> Result<usize, QueueError> {
        let call = Enqueue::new(&self.keys, tasks)?;
        Ok(call.invoke(&mut self.conn.clone()).await?)
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
        let call = Rotate::new(&self.keys, job, tick, total, FAIR_TTL, TICK_TTL);
        Ok(call.invoke(&mut self.conn.clone()).await?)
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
        let apalis = Apalis {
            config: &self.apalis,
            cap: FEED_CAP,
        };
        let call = FanOut::new(
            &self.keys,
            apalis,
            fan_out,
            start,
            last,
            tasks,
            FAN_OUT_LEASE,
            TICK_TTL,
        );
        // The claim rides in the first chunk: with `[redis] queue_replicas`
        // no chunk counts before a replica has it.
        Ok(call.invoke(&mut self.conn.acked()).await?)
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
        let call = FanOutTake::new(&self.keys, job, tick, who, FAN_OUT_LEASE, only);
        Ok(call.invoke(&mut self.conn.acked()).await?)
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

    /// One feeding round: moves due backlog tasks into apalis (at most
    /// [`FEED_CAP`] in it), and says what is due next.
    pub async fn feed(&self) -> Result<Fed, QueueError> {
        let feed = Feed::new(&self.keys, &self.apalis, FEED_CAP, FEED_BATCH);
        Ok(feed.invoke(&mut self.conn.clone()).await?)
    }

    /// Drops finished tasks older than `retention` from apalis's done and dead
    /// sets (with their data and metadata), and metadata of workers that are
    /// gone, one SSCAN step of each per call. Returns how many tasks were
    /// dropped and whether the scans wrapped around (a full pass is done).
    pub async fn trim(&self, retention: Duration) -> Result<(usize, bool), QueueError> {
        let cutoff = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_sub(retention)
            .as_secs();
        let call = Trim::new(&self.keys, &self.apalis, cutoff, TRIM_STEP);
        Ok(call.invoke(&mut self.conn.clone()).await?)
    }

    /// How many daemons are alive on this queue now: apalis workers (one
    /// per running daemon) whose last heartbeat is within `within`.
    pub async fn live_workers(&self, within: Duration) -> Result<u64, QueueError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // apalis scores heartbeats in whole seconds.
        let since = now.saturating_sub(within).as_secs();
        let n: u64 = redis::cmd("ZCOUNT")
            .arg(self.apalis.workers_set())
            .arg(since)
            .arg("+inf")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(n)
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
