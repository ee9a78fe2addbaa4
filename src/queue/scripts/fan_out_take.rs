//! `lua/fan_out_take.lua`: a tick's fan-out taken over from an enqueuer
//! whose lease ran out.

use std::sync::LazyLock;
use std::time::Duration;

use crate::conn::Conn;

use super::fan_out::fanning_member;
use crate::conn::Lua;
use crate::keys::KeySpace;
use crate::queue::task::Origin;

static FAN_OUT_TAKE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../../lua/fan_out_take.lua")));

/// What [`crate::queue::Queue::take_over`] found.
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

/// `lua/fan_out_take.lua`'s arguments.
pub(crate) struct FanOutTake<'a> {
    /// `KEYS[1]` the tick's fan-out progress, `KEYS[2]` the `fanning` zset.
    keys: [String; 2],
    /// `ARGV[1]`: who takes over; `ARGV[2]`: the lease it takes.
    who: &'a str,
    lease: Duration,
    /// `ARGV[3]`: the fan-out's member in `fanning`.
    member: String,
    /// `ARGV[4]`: take it only if its tasks are of this origin.
    only: Option<Origin>,
}

impl<'a> FanOutTake<'a> {
    /// `job`'s fan-out of `tick`, for `who` under a lease of `lease`, if
    /// its origin is `only`.
    pub(crate) fn new(
        keys: &KeySpace,
        job: &str,
        tick: i64,
        who: &'a str,
        lease: Duration,
        only: Option<Origin>,
    ) -> Self {
        FanOutTake {
            keys: [keys.tick_fan_out(job, tick), keys.fanning()],
            who,
            lease,
            member: fanning_member(job, tick),
            only,
        }
    }

    /// Runs the script.
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<TakeOver> {
        let (status, next, name): (i64, i64, String) = FAN_OUT_TAKE
            .call()
            .key(&self.keys[0])
            .key(&self.keys[1])
            .arg(self.who)
            .arg(self.lease.as_millis() as u64)
            .arg(&self.member)
            .arg(self.only.map_or("", Origin::as_str))
            .invoke(conn)
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
}
