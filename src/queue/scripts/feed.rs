//! `lua/feed.lua` and `lua/fed.lua`: due backlog tasks leased for handing
//! to apalis-redis (under a cap of what apalis holds), and the lease
//! confirmed once they are pushed.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::conn::Lua;
use crate::keys::KeySpace;

static FEED: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../../lua/feed.lua")));
static FED: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../../lua/fed.lua")));

/// `lua/feed.lua`'s arguments.
pub(crate) struct Feed {
    /// `KEYS[1..3]`: the backlog, its payloads, the leases in transit.
    backlog: [String; 3],
    /// `KEYS[4]`, `KEYS[5]`: apalis's scheduled set and active list.
    apalis: [String; 2],
    /// `ARGV[1]`: most tasks in apalis and in transit together.
    cap: usize,
    /// `ARGV[2]`: how long a feeder may take to push what it leased.
    lease: Duration,
    /// `ARGV[3]`: most tasks leased by this call.
    batch: usize,
}

impl Feed {
    /// A round into `apalis` (its scheduled set and active list).
    pub(crate) fn new(
        keys: &KeySpace,
        apalis: &apalis_redis::Config,
        cap: usize,
        lease: Duration,
        batch: usize,
    ) -> Self {
        Feed {
            backlog: backlog_keys(keys),
            apalis: [apalis.scheduled_jobs_set(), apalis.active_jobs_list()],
            cap,
            lease,
            batch,
        }
    }

    /// Runs the script: the tasks leased now, as (id, payload).
    pub(crate) async fn invoke(
        &self,
        conn: &mut ConnectionManager,
    ) -> redis::RedisResult<Vec<(String, String)>> {
        let mut call = FEED.call();
        for key in self.backlog.iter().chain(&self.apalis) {
            call.key(key);
        }
        let leased: Vec<String> = call
            .arg(self.cap)
            .arg(self.lease.as_millis() as u64)
            .arg(self.batch)
            .invoke(conn)
            .await?;
        let mut pairs = leased.into_iter();
        let mut tasks = Vec::with_capacity(pairs.len() / 2);
        while let (Some(id), Some(payload)) = (pairs.next(), pairs.next()) {
            tasks.push((id, payload));
        }
        Ok(tasks)
    }
}

/// `lua/fed.lua`'s arguments.
pub(crate) struct Fed<'a> {
    /// KEYS: the backlog, its payloads, the leases in transit.
    backlog: [String; 3],
    /// ARGV: the ids now in apalis.
    ids: &'a [String],
}

impl<'a> Fed<'a> {
    /// `ids`, pushed into apalis.
    pub(crate) fn new(keys: &KeySpace, ids: &'a [String]) -> Self {
        Fed {
            backlog: backlog_keys(keys),
            ids,
        }
    }

    /// Runs the script: how many left the backlog.
    pub(crate) async fn invoke(&self, conn: &mut ConnectionManager) -> redis::RedisResult<i64> {
        let mut call = FED.call();
        for key in &self.backlog {
            call.key(key);
        }
        for id in self.ids {
            call.arg(id);
        }
        call.invoke(conn).await
    }
}

fn backlog_keys(keys: &KeySpace) -> [String; 3] {
    [keys.backlog(), keys.backlog_data(), keys.backlog_feeding()]
}
