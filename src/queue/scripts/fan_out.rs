//! `lua/fan_out.lua`: one chunk of a tick's tasks queued under the tick's
//! claim (the first chunk claims it), idempotently.

use std::sync::LazyLock;
use std::time::Duration;

use crate::conn::Conn;

use crate::conn::Lua;
use crate::keys::KeySpace;
use crate::queue::task::TickFanOut;

/// `lua/fan_out.lua`, after `lua/apalis_push.lua` (apalis's task layout,
/// written in one place for it and `lua/feed.lua`).
static FAN_OUT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("../../../lua/apalis_push.lua"),
        include_str!("../../../lua/fan_out.lua")
    ))
});

/// A fan-out's member in the `fanning` zset: `<job>:<tick_ms>`.
pub(crate) fn fanning_member(job: &str, tick: i64) -> String {
    format!("{job}:{tick}")
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

/// `lua/fan_out.lua`'s arguments: one chunk of one tick's fan-out.
pub(crate) struct FanOut<'a> {
    /// KEYS: the backlog, its payloads, the tick's claim, its outcome hash,
    /// its fan-out progress, the `fanning` zset, the wake stream; apalis's
    /// data hash, active list and scheduled set.
    keys: [String; 10],
    /// `ARGV[8]`: most tasks in apalis's scheduled set and active list (a
    /// task due now goes straight in while there is room); `ARGV[9]`:
    /// apalis's task metadata prefix.
    cap: usize,
    meta: String,
    /// `ARGV[1]` who calls, `ARGV[7]` the tasks' origin; `ARGV[6]` the fan-out's
    /// member in `fanning`.
    fan_out: &'a TickFanOut<'a>,
    /// `ARGV[2]`: the index of this chunk's first task.
    start: u64,
    /// `ARGV[3]`: whether this chunk is the fan-out's last.
    last: bool,
    /// `ARGV[4]`: how long the caller may be silent before another takes
    /// over; `ARGV[5]`: the TTL of the tick's claim, outcome and progress.
    lease: Duration,
    tick_ttl: Duration,
    /// `ARGV[10..]`: per task, its id and payload (queued with no delay).
    tasks: &'a [(String, String)],
}

/// Where a chunk's tasks may go straight in: apalis's queue, and the most
/// tasks it may hold (`queue::FEED_CAP`, as the feeder counts them).
pub(crate) struct Apalis<'a> {
    pub(crate) config: &'a apalis_redis::Config,
    pub(crate) cap: usize,
}

impl<'a> FanOut<'a> {
    /// The chunk `tasks` of `fan_out`, starting at task `start`, `last`
    /// or not, under a lease of `lease`; the tick's keys kept `tick_ttl`.
    #[allow(clippy::too_many_arguments)] // the script's arguments, named
    pub(crate) fn new(
        keys: &KeySpace,
        apalis: Apalis<'_>,
        fan_out: &'a TickFanOut<'a>,
        start: u64,
        last: bool,
        tasks: &'a [(String, String)],
        lease: Duration,
        tick_ttl: Duration,
    ) -> Self {
        let (job, tick) = (fan_out.job, fan_out.tick);
        FanOut {
            keys: [
                keys.backlog(),
                keys.backlog_data(),
                keys.tick_claim(job, tick),
                keys.tick_outcomes(job, tick),
                keys.tick_fan_out(job, tick),
                keys.fanning(),
                keys.wake(),
                apalis.config.job_data_hash(),
                apalis.config.active_jobs_list(),
                apalis.config.scheduled_jobs_set(),
            ],
            cap: apalis.cap,
            meta: apalis.config.job_meta_hash(),
            fan_out,
            start,
            last,
            lease,
            tick_ttl,
            tasks,
        }
    }

    /// Runs the script.
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<Chunk> {
        let mut call = FAN_OUT.call();
        for key in &self.keys {
            call.key(key);
        }
        let f = self.fan_out;
        call.arg(f.who)
            .arg(self.start)
            .arg(u8::from(self.last))
            .arg(self.lease.as_millis() as u64)
            .arg(self.tick_ttl.as_millis() as u64)
            .arg(fanning_member(f.job, f.tick))
            .arg(f.origin.as_str())
            .arg(self.cap)
            .arg(&self.meta);
        for (id, payload) in self.tasks {
            call.arg(id).arg(0).arg(payload);
        }
        let (status, n, owner): (i64, i64, String) = call.invoke(conn).await?;
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
}
