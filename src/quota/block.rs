//! A resource's block, with its reason: why the upstream stopped us
//! ([`BlockReason`], one stable word each), kept beside the block in Redis
//! by `lua/block.lua` so `quota`, the metrics and the status page can say
//! why; throttles in a row that double each block (the streak, beside the
//! block in Redis, so every daemon shares it) until a success ends it; the
//! blocks of every resource read at once (`lua/blocks.lua`) and lifted by
//! an operator (`unblock`); and the blocking daemon's note in words
//! ([`BlockNote`]: what the upstream answered, on which endpoint) for the
//! status page.
//!
//! A block is per (credential, resource): a spend checks the block of its
//! endpoint's resource (the spend core's first key, `lua/spend/core.lua`). A token-wide limit
//! (GitHub's secondary rate limits) blocks every resource at once.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use crate::conn::Conn;
use redis::{AsyncCommands, FromRedisValue};
use serde::{Deserialize, Serialize};

use super::backend::Durable;
use super::{Limiter, Plan, QuotaError};
use crate::conn::Lua;
use crate::keys::KeySpace;

/// How long a throttle streak is remembered after its last block ends: a
/// throttle an hour after the last block ended starts again at the first
/// block's length.
pub const STREAK_MEMORY: Duration = Duration::from_secs(3600);

/// `lua/block.lua`.
/// `lua/block.lua`'s source.
pub(crate) const BLOCK_SOURCE: &str = include_str!("../../lua/block.lua");
static SCRIPT: LazyLock<Lua> = LazyLock::new(|| Lua::new(BLOCK_SOURCE));

/// `lua/blocks.lua`.
/// `lua/blocks.lua`'s source.
pub(crate) const BLOCKS_SOURCE: &str = include_str!("../../lua/blocks.lua");
static READ: LazyLock<Lua> = LazyLock::new(|| Lua::new(BLOCKS_SOURCE));

/// Why a credential is blocked. The words ([`BlockReason::as_str`]) are
/// stable: they are stored in Redis and shown by `quota --json`, the
/// metrics and the status page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockReason {
    /// `"429"`: the upstream answered 429 (or 503 with a wait).
    TooManyRequests,
    /// `"quota_reason"`: a 403 (or 429) whose body names one of the
    /// endpoint's `quota_reasons`.
    QuotaReason,
    /// `"headers_at_zero"`: the upstream's own headers say nothing is
    /// left (`x-ratelimit-remaining: 0`, `RateLimit: r=0`): blocked until
    /// they say it resets.
    HeadersAtZero,
    /// `"secondary_limit"`: GitHub's secondary rate limit.
    SecondaryLimit,
    /// `"throttled"`: Shopify GraphQL's `THROTTLED`.
    Throttled,
    /// `"usage"`: Meta's usage headers at `throttle_at` or a time to
    /// regain access, or Meta's rate-limit error codes.
    Usage,
}

impl BlockReason {
    /// Every reason, in the order the docs list them.
    pub const ALL: [BlockReason; 6] = [
        BlockReason::TooManyRequests,
        BlockReason::QuotaReason,
        BlockReason::HeadersAtZero,
        BlockReason::SecondaryLimit,
        BlockReason::Throttled,
        BlockReason::Usage,
    ];

    /// Its stable word.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::TooManyRequests => "429",
            BlockReason::QuotaReason => "quota_reason",
            BlockReason::HeadersAtZero => "headers_at_zero",
            BlockReason::SecondaryLimit => "secondary_limit",
            BlockReason::Throttled => "throttled",
            BlockReason::Usage => "usage",
        }
    }

    /// The reason a stored word names.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == word)
    }
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A block to record: what the upstream asked for, and the least it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFor {
    /// The wait the upstream asked for (zero: "now", or a time past).
    pub wait: Duration,
    /// The shortest block: the endpoint's `min_block`, or more where the
    /// upstream's own rule says so (GitHub's secondary limit: a minute).
    pub least: Duration,
    /// For a throttle answer (the upstream refused the request): the
    /// longest the streak doubles `least` to (`throttle_block_max`). `None`
    /// for a block that is no throttle (a page that said 0 left), which
    /// neither counts in nor doubles by the streak.
    pub doubling_to: Option<Duration>,
}

/// A block, as recorded.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    /// The block in force: this one, or a longer one already there.
    pub blocked_for: Duration,
    /// The streak this block is part of (1 = first); 0 for no throttle.
    pub streak: u32,
    /// Whether this block is the one in force (not a longer one already
    /// there, whose reason stays).
    pub ours: bool,
}

/// One resource's block, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceBlock {
    /// The resource's name (the credential's default one's too).
    pub resource: String,
    /// Whether it is the credential's default resource.
    pub default: bool,
    /// How long it stays blocked (zero: not blocked).
    pub blocked_for: Duration,
    /// Why, when it is blocked and the block said why.
    pub reason: Option<BlockReason>,
    /// Throttle answers in a row (0: none).
    pub streak: u32,
}

/// Why a credential is blocked, in words, as the daemon whose block is in
/// force recorded it (`keys::block_reason`, in the queue's Redis): what the
/// upstream answered, on which endpoint. The status page shows it beside
/// the block; [`BlockReason`], the stable word, is kept with the block
/// itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BlockNote {
    /// What happened, in words: "upstream answered 429 (quotaExceeded)",
    /// "upstream reports 0 remaining".
    pub(crate) why: String,
    /// The HTTP status that said so, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<u16>,
    /// The upstream's own reason (`quotaExceeded`, a message), if it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
    /// The endpoint whose answer blocked it.
    pub(crate) endpoint: String,
    /// Why, in one stable word ([`BlockReason`]: `"429"`,
    /// `"headers_at_zero"`, `"secondary_limit"`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
}

impl BlockNote {
    /// Records this note for `credential`, for as long as `blocked` (the
    /// block in force). Only the daemon whose block is the one in force
    /// ([`Blocked::ours`]) records it, so a shorter block never replaces a
    /// longer one's note.
    pub(crate) async fn record(
        &self,
        conn: &mut Conn,
        keys: &KeySpace,
        credential: &str,
        resource: Option<&str>,
        blocked: Duration,
    ) -> redis::RedisResult<()> {
        let json = serde_json::to_string(self).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Client, "block note", e.to_string()))
        })?;
        let ms = (blocked.as_millis() as u64).max(1);
        conn.pset_ex(keys.block_reason_in(credential, resource), json, ms)
            .await
    }
}

/// Whole milliseconds, at least 1, below 2^53 (what the scripts take).
fn ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, (1 << 53) - 1) as u64
}

impl Limiter {
    /// Blocks `resources` of `credential` (a template's tenant named as
    /// `quota` shows it, `ig[account=123]`; `None`: its default resource)
    /// as `for_` says because of `reason`, never shortening a longer block;
    /// the reason is kept while this block is the one in force. Returns
    /// the block of the first resource.
    pub async fn block_because(
        &self,
        credential: &str,
        resources: &[Option<&str>],
        for_: BlockFor,
        reason: BlockReason,
    ) -> Result<Blocked, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let ks = self.quotas.keys();
        let mut call = SCRIPT.call();
        call.key(ks.clock(&plan.credential));
        for r in resources {
            call.key(ks.blocked_in(&plan.credential, *r))
                .key(ks.block_kind_in(&plan.credential, *r))
                .key(ks.block_streak_in(&plan.credential, *r));
        }
        let cap = for_.doubling_to.map_or(0, ms);
        call.arg(ms(for_.wait))
            .arg(ms(for_.least))
            .arg(cap)
            .arg(ms(STREAK_MEMORY))
            .arg(reason.as_str());
        // With `[redis] quota_replicas`, a replica acknowledges it too.
        let reply: Vec<i64> = self.invoke_acked(Durable::Block, &plan, &call).await?;
        let [blocked_ms, streak, ours] = reply[..] else {
            return Err(QuotaError::Script(format!("block returned {reply:?}")));
        };
        Ok(Blocked {
            blocked_for: Duration::from_millis(blocked_ms.max(0) as u64),
            streak: streak.clamp(0, i64::from(u32::MAX)) as u32,
            ours: ours == 1,
        })
    }

    /// Every resource's block of `credential` (a template's tenant named
    /// as `quota` shows it), the default resource first.
    pub async fn blocks(&self, credential: &str) -> Result<Vec<ResourceBlock>, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        self.read_blocks(&plan).await
    }

    /// [`Limiter::blocks`] of a plan's credential.
    pub(super) async fn read_blocks(&self, plan: &Plan) -> Result<Vec<ResourceBlock>, QuotaError> {
        let ks = self.quotas.keys();
        let resources = self.quotas.resources(&plan.family);
        let mut call = READ.call();
        call.key(ks.clock(&plan.credential));
        for (r, _) in &resources {
            call.key(ks.blocked_in(&plan.credential, r.as_deref()))
                .key(ks.block_kind_in(&plan.credential, r.as_deref()))
                .key(ks.block_streak_in(&plan.credential, r.as_deref()));
        }
        let mut conn = self.conn.clone();
        let reply: redis::Value = tokio::time::timeout(self.timeout, call.invoke(&mut conn))
            .await
            .map_err(|_| self.conn.timed_out(self.timeout))?
            .map_err(QuotaError::from_redis)?;
        let values: Vec<redis::Value> = redis::FromRedisValue::from_redis_value(reply)
            .map_err(|e| QuotaError::Script(format!("blocks answered {e}")))?;
        if values.len() != 3 * resources.len() {
            return Err(QuotaError::Script(format!(
                "blocks returned {} values for {} resources",
                values.len(),
                resources.len()
            )));
        }
        let int = |v: &redis::Value| i64::from_redis_value_ref(v).unwrap_or(0).max(0) as u64;
        Ok(resources
            .into_iter()
            .zip(values.chunks(3))
            .map(|((r, name), v)| ResourceBlock {
                resource: name,
                default: r.is_none(),
                blocked_for: Duration::from_millis(int(&v[0])),
                reason: String::from_redis_value_ref(&v[1])
                    .ok()
                    .as_deref()
                    .and_then(BlockReason::parse),
                streak: int(&v[2]).min(u64::from(u32::MAX)) as u32,
            })
            .collect())
    }

    /// A successful answer on `resource` of `credential`: its throttle
    /// streak ends, so the next throttle blocks for `min_block` again.
    pub async fn end_streak(
        &self,
        credential: &str,
        resource: Option<&str>,
    ) -> Result<(), QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let key = self
            .quotas
            .keys()
            .block_streak_in(&plan.credential, resource);
        let mut conn = self.conn.clone();
        tokio::time::timeout(self.timeout, conn.del::<_, ()>(key))
            .await
            .map_err(|_| self.conn.timed_out(self.timeout))?
            .map_err(QuotaError::from_redis)
    }

    /// Lifts the blocks of `resources` of `credential` (an operator who
    /// knows better than the last answer): each block, its reason, its note
    /// and its streak go. Returns the blocks as they were.
    pub async fn unblock(
        &self,
        credential: &str,
        resources: &[Option<&str>],
    ) -> Result<Vec<ResourceBlock>, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let before = self.read_blocks(&plan).await?;
        let ks = self.quotas.keys();
        let mut keys = Vec::new();
        for r in resources {
            keys.extend([
                ks.blocked_in(&plan.credential, *r),
                ks.block_kind_in(&plan.credential, *r),
                ks.block_streak_in(&plan.credential, *r),
                ks.block_reason_in(&plan.credential, *r),
            ]);
        }
        // One DEL: every key carries the credential's hash tag (one slot).
        let mut conn = self.conn.clone();
        tokio::time::timeout(self.timeout, conn.del::<_, ()>(keys))
            .await
            .map_err(|_| self.conn.timed_out(self.timeout))?
            .map_err(QuotaError::from_redis)?;
        let names: Vec<String> = (resources.iter())
            .map(|r| self.quotas.resource_name(&plan.family, *r).to_owned())
            .collect();
        Ok(before
            .into_iter()
            .filter(|b| names.contains(&b.resource))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_from_its_word() {
        for r in BlockReason::ALL {
            assert_eq!(BlockReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(BlockReason::parse("nonsense"), None);
    }
}
