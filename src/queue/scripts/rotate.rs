//! `lua/rotate.lua`: where a tick's fan-out starts serving its items (fair
//! rotation), and the tick's turn.

use std::sync::LazyLock;
use std::time::Duration;

use crate::conn::Conn;

use crate::conn::Lua;
use crate::keys::KeySpace;

static ROTATE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../../lua/rotate.lua")));

/// Where one tick of a job starts serving its items, and its turn (the
/// job's tick count, which `starved_ticks` counts in):
/// [`crate::queue::Queue::begin_tick`].
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

/// `lua/rotate.lua`'s arguments: one tick of one job.
pub(crate) struct Rotate {
    /// `KEYS[1]` the job's rotation (hash), `KEYS[2]` the tick's (hash).
    keys: [String; 2],
    /// `ARGV[1]` the tick (ms), `ARGV[2]` its item count.
    tick: i64,
    total: u64,
    /// `ARGV[3]` the job's rotation's TTL (refreshed by every tick), `ARGV[4]`
    /// the tick's (its claim's).
    fair_ttl: Duration,
    tick_ttl: Duration,
}

impl Rotate {
    /// `job`'s tick at `tick`, of `total` items; its keys kept for
    /// `fair_ttl` and `tick_ttl`.
    pub(crate) fn new(
        keys: &KeySpace,
        job: &str,
        tick: i64,
        total: u64,
        fair_ttl: Duration,
        tick_ttl: Duration,
    ) -> Self {
        Rotate {
            keys: [keys.fair(job), keys.tick_rotation(job, tick)],
            tick,
            total,
            fair_ttl,
            tick_ttl,
        }
    }

    /// Runs the script.
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<Rotation> {
        let (offset, turn): (u64, u64) = ROTATE
            .call()
            .key(&self.keys[0])
            .key(&self.keys[1])
            .arg(self.tick)
            .arg(self.total)
            .arg(self.fair_ttl.as_millis() as u64)
            .arg(self.tick_ttl.as_millis() as u64)
            .invoke(conn)
            .await?;
        Ok(Rotation { offset, turn })
    }
}
