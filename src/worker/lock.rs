//! The item lock (`lua/item_lock.lua`): one task at a time per job fan-out
//! item. Claimed before the first spend (in the same round trip: whether the
//! task already ended, the item's checkpoint, its newest completed tick, what
//! its last complete run left for the next one, and the Redis clock; and,
//! where the windows allow it, the first page's spend: `lua/claim_spend.lua`),
//! renewed in the background while the task runs, released when it ends.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tracing::warn;

use super::Checkpoint;
use super::guards::Renewer;
use crate::config::Job;
use crate::conn::Lua;
use crate::keys::KeySpace;
use crate::paging::Validators;
use crate::queue::TaskArgs;
use crate::quota::{PreparedSpend, QuotaError};

/// `lua/item_lock.lua`: claim, renew, release.
const ITEM_LOCK_SRC: &str = include_str!("../../lua/item_lock.lua");

static ITEM_LOCK: LazyLock<Lua> = LazyLock::new(|| Lua::new(ITEM_LOCK_SRC));

/// The claim with the first page's spend in the same call: spend.lua's and
/// item_lock.lua's functions, then `lua/claim_spend.lua`.
static CLAIM_SPEND_SRC: LazyLock<String> = LazyLock::new(|| {
    let lock = ITEM_LOCK_SRC
        .trim_end()
        .strip_suffix("return item_lock_main(KEYS, ARGV)")
        .expect("lua/item_lock.lua ends with its dispatch line");
    let tail = include_str!("../../lua/claim_spend.lua");
    format!("{}\n{lock}\n{tail}", crate::quota::library())
});

static CLAIM_SPEND: LazyLock<Lua> = LazyLock::new(|| Lua::new(&CLAIM_SPEND_SRC));

/// What claiming the item found.
pub(super) enum Claim {
    /// The task (or the step it stands for) already ended.
    AlreadyDone,
    /// Another task holds the item (or a dead one's lock has yet to expire).
    Busy,
    /// Ours, and what the item's state in Redis is.
    Held(Box<Found>),
}

/// What a claim found of the item's state.
pub(super) struct Found {
    /// Where the item's interrupted run stands.
    pub(super) saved: Option<Checkpoint>,
    /// The newest tick whose run completed the item.
    pub(super) ran: Option<i64>,
    /// When the item's last complete run started (epoch s): `{since}`.
    pub(super) since: Option<i64>,
    /// The validators of that run's page 1.
    pub(super) validators: Option<Validators>,
    /// The Redis clock at the claim (epoch s): this run's start.
    pub(super) now: i64,
    /// The reply of the first page's spend, when it rode in the claim's
    /// call: spend.lua's values, or the script's error.
    pub(super) spent: Option<Result<Vec<i64>, QuotaError>>,
}

/// One task's hold on one item.
pub(super) struct ItemLock {
    key: String,
    /// Unique per run, so a late release never frees another run's hold.
    value: String,
    ttl: Duration,
}

impl ItemLock {
    pub(super) fn new(keys: &KeySpace, job: &Job, task: &TaskArgs, ttl: Duration) -> Self {
        ItemLock {
            key: keys.item_lock(&job.name, &task.item_key()),
            value: format!("{}#{}", task.id, crate::quota::request_id()),
            ttl,
        }
    }

    /// One round trip: done marker, lock, checkpoint, completed tick; with
    /// `spend`, the first page's spend too, made only if the claim succeeds.
    pub(super) async fn claim(
        &self,
        conn: &mut ConnectionManager,
        keys: &KeySpace,
        job: &Job,
        task: &TaskArgs,
        spend: Option<&PreparedSpend<'_>>,
    ) -> redis::RedisResult<Claim> {
        let item = task.item_key();
        let mut call = match spend {
            Some(_) => CLAIM_SPEND.call(),
            None => ITEM_LOCK.call(),
        };
        call.key(&self.key)
            .key(keys.task_done(&task.root))
            .key(keys.cursor(&job.name, &item))
            .key(keys.item_ran(&job.name, &item))
            .key(keys.since(&job.name, &item))
            .key(keys.validators(&job.name, &item))
            .arg("claim")
            .arg(&self.value)
            .arg(self.ttl.as_millis() as u64);
        if let Some(spend) = spend {
            for key in spend.keys() {
                call.key(key);
            }
            call.arg(&spend.args);
        }
        let reply: Vec<String> = call.invoke(conn).await?;
        Ok(match reply.as_slice() {
            [state] if state == "0" => Claim::AlreadyDone,
            [state, saved, ran, since, validators, now, spent @ ..] if state == "2" => {
                Claim::Held(Box::new(Found {
                    saved: serde_json::from_str::<Checkpoint>(saved).ok(),
                    ran: ran.parse::<i64>().ok(),
                    since: since.parse::<i64>().ok(),
                    validators: serde_json::from_str::<Validators>(validators).ok(),
                    now: now
                        .parse::<i64>()
                        .unwrap_or_else(|_| chrono::Utc::now().timestamp()),
                    spent: spend.map(|_| crate::quota::spend_reply(spent)),
                }))
            }
            _ => Claim::Busy,
        })
    }

    /// Renews the lock every third of its TTL until the returned guard is
    /// dropped, so a long request keeps the item and a killed daemon's (or a
    /// panicked task's) lock lapses within its TTL.
    pub(super) fn keep_renewed(&self, mut conn: ConnectionManager) -> Renewer {
        let (key, value, ttl) = (self.key.clone(), self.value.clone(), self.ttl);
        Renewer::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                let renewed = ITEM_LOCK
                    .call()
                    .key(&key)
                    .arg("renew")
                    .arg(&value)
                    .arg(ttl.as_millis() as u64)
                    .invoke::<i64>(&mut conn)
                    .await;
                if let Ok(0) = renewed {
                    warn!(lock = %key, "lost the item lock (expired under a stalled Redis?)");
                }
            }
        })
    }

    /// Frees the item, if it is still ours.
    pub(super) async fn release(&self, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        ITEM_LOCK
            .call()
            .key(&self.key)
            .arg("release")
            .arg(&self.value)
            .invoke::<i64>(conn)
            .await
            .map(drop)
    }
}
