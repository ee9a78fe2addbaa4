//! `lua/feed.lua`: due backlog tasks moved into apalis-redis's queue (under
//! a cap of what apalis holds), in one call, and what is due next.

use std::sync::LazyLock;

use crate::conn::Conn;

use crate::conn::Lua;
use crate::keys::KeySpace;

/// `lua/feed.lua`, after `lua/apalis_push.lua` (apalis's task layout,
/// written in one place for it and `lua/fan_out.lua`).
static FEED: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("../../../lua/apalis_push.lua"),
        include_str!("../../../lua/feed.lua")
    ))
});

/// `lua/feed.lua`'s arguments.
pub(crate) struct Feed {
    /// `KEYS[1..6]`: the backlog, its payloads, apalis's data hash, active
    /// list and scheduled set, the wake stream.
    keys: [String; 6],
    /// `ARGV[1]`: most tasks in apalis's scheduled set and active list.
    cap: usize,
    /// `ARGV[2]`: most tasks moved by this call.
    batch: usize,
    /// `ARGV[3]`: apalis's task metadata prefix.
    meta: String,
}

/// What one call did, and what comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fed {
    /// Tasks moved into apalis now.
    pub moved: usize,
    /// Redis's clock, ms.
    pub now_ms: i64,
    /// When the next task (of the backlog, or of apalis's scheduled set) is
    /// due, ms: at or before `now_ms` when due tasks wait for room.
    pub next_ms: Option<i64>,
    /// Tasks in apalis ready to fetch.
    pub ready: u64,
}

impl Feed {
    /// A round into `apalis`.
    pub(crate) fn new(
        keys: &KeySpace,
        apalis: &apalis_redis::Config,
        cap: usize,
        batch: usize,
    ) -> Self {
        Feed {
            keys: [
                keys.backlog(),
                keys.backlog_data(),
                apalis.job_data_hash(),
                apalis.active_jobs_list(),
                apalis.scheduled_jobs_set(),
                keys.wake(),
            ],
            cap,
            batch,
            meta: apalis.job_meta_hash(),
        }
    }

    /// Runs the script.
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<Fed> {
        let mut call = FEED.call();
        for key in &self.keys {
            call.key(key);
        }
        let (moved, now_ms, next_ms, ready): (i64, i64, i64, i64) = call
            .arg(self.cap)
            .arg(self.batch)
            .arg(&self.meta)
            .invoke(conn)
            .await?;
        Ok(Fed {
            moved: moved.max(0) as usize,
            now_ms,
            next_ms: (next_ms >= 0).then_some(next_ms),
            ready: ready.max(0) as u64,
        })
    }
}
