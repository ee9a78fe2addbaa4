//! `lua/trim.lua`: what apalis-redis never trims (done and dead tasks, the
//! metadata of workers that are gone), one bounded scan step per call.

use std::sync::LazyLock;

use crate::conn::Conn;

use crate::conn::Lua;
use crate::keys::KeySpace;

static TRIM: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../../lua/trim.lua")));

/// `lua/trim.lua`'s arguments.
pub(crate) struct Trim {
    /// `KEYS[1..4]`: apalis's done set, dead set, task data hash, workers
    /// zset; `KEYS[5]`: our scan cursors between calls.
    keys: [String; 5],
    /// `ARGV[1]`: apalis's task metadata prefix.
    meta: String,
    /// `ARGV[2]`: tasks done before this (Unix seconds) are dropped.
    cutoff: u64,
    /// `ARGV[3]`: members per scan step.
    step: usize,
    /// `ARGV[4]`: apalis's worker metadata prefix.
    workers_meta: String,
}

impl Trim {
    /// One step over `apalis`'s sets: tasks done before `cutoff` (Unix
    /// seconds) go, `step` members looked at per set.
    pub(crate) fn new(
        keys: &KeySpace,
        apalis: &apalis_redis::Config,
        cutoff: u64,
        step: usize,
    ) -> Self {
        Trim {
            keys: [
                apalis.done_jobs_set(),
                apalis.dead_jobs_set(),
                apalis.job_data_hash(),
                apalis.workers_set(),
                keys.trim_cursors(),
            ],
            meta: apalis.job_meta_hash(),
            cutoff,
            step,
            workers_meta: format!("{}:metadata:", apalis.workers_set()),
        }
    }

    /// Runs the script: tasks dropped, and whether every scan wrapped
    /// around (a full pass is done).
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<(usize, bool)> {
        let mut call = TRIM.call();
        for key in &self.keys {
            call.key(key);
        }
        let (dropped, wrapped): (i64, i64) = call
            .arg(&self.meta)
            .arg(self.cutoff)
            .arg(self.step)
            .arg(&self.workers_meta)
            .invoke(conn)
            .await?;
        Ok((dropped.max(0) as usize, wrapped == 1))
    }
}
