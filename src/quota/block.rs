//! A credential's block, with its reason: why the upstream stopped us
//! ([`BlockReason`], one stable word each), kept beside the block in Redis
//! by `lua/block.lua` so `quota`, the metrics and the status page can say
//! why, and blocks that double when they come in a row (GitHub's secondary
//! rate limit); and the blocking daemon's note in words ([`BlockNote`]:
//! what the upstream answered, on which endpoint) for the status page.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

use super::backend::Durable;
use super::{Limiter, QuotaError, library};
use crate::config::Reserve;
use crate::conn::Lua;
use crate::keys::KeySpace;

/// How long a doubling streak is remembered after its last block ends: a
/// secondary limit an hour after the last block ended starts again at the
/// first block's length.
pub const STREAK_MEMORY: Duration = Duration::from_secs(3600);

/// `lua/block.lua` after the spend library, which it calls.
static SCRIPT: LazyLock<Lua> = LazyLock::new(|| {
    let source = format!("{}\n{}", library(), include_str!("../../lua/block.lua"));
    Lua::new(Box::leak(source.into_boxed_str()))
});

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

/// How long a block lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFor {
    /// Exactly this long.
    Fixed(Duration),
    /// This long the first time; each block of the same reason in a row
    /// doubles it, up to `cap`. A streak ends [`STREAK_MEMORY`] after its
    /// last block ends.
    Doubling {
        /// The first block.
        first: Duration,
        /// The longest block.
        cap: Duration,
    },
}

/// A block, as recorded.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    /// The block in force: this one, or a longer one already there.
    pub blocked_for: Duration,
    /// The streak this block is part of (1 = first); 0 for a fixed block.
    pub streak: u32,
    /// Whether this block is the one in force (not a longer one already
    /// there, whose reason stays).
    pub ours: bool,
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
        conn: &mut ConnectionManager,
        keys: &KeySpace,
        credential: &str,
        blocked: Duration,
    ) -> redis::RedisResult<()> {
        let json = serde_json::to_string(self).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Client, "block note", e.to_string()))
        })?;
        let ms = (blocked.as_millis() as u64).max(1);
        conn.pset_ex(keys.block_reason(credential), json, ms).await
    }
}

impl Limiter {
    /// Blocks `credential` (a template's tenant named as `quota` shows it,
    /// `ig[account=123]`) for `for_` because of `reason`, never shortening
    /// a longer block; the reason is kept while this block is the one in
    /// force ([`Limiter::block_reason`]).
    pub async fn block_because(
        &self,
        credential: &str,
        for_: BlockFor,
        reason: BlockReason,
    ) -> Result<Blocked, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let ms = |d: Duration| d.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        let (first, cap) = match for_ {
            BlockFor::Fixed(d) => (ms(d), 0),
            BlockFor::Doubling { first, cap } => (ms(first), ms(cap.max(first))),
        };
        let mut args = plan.args("block", &first.to_string(), "", Reserve::NONE);
        args.extend([
            reason.as_str().to_owned(),
            cap.to_string(),
            ms(STREAK_MEMORY).to_string(),
        ]);
        let ks = self.quotas.keys();
        let mut call = SCRIPT.call();
        call.key(&plan.keys)
            .key(ks.block_kind(&plan.credential))
            .key(ks.block_streak(&plan.credential))
            .arg(args);
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

    /// Why `credential` is blocked, if it is and the block said why (a
    /// block set by `block` alone, or by an older version, did not).
    pub async fn block_reason(&self, credential: &str) -> Result<Option<BlockReason>, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let key = self.quotas.keys().block_kind(&plan.credential);
        let mut conn = self.conn.clone();
        let word: Option<String> = tokio::time::timeout(self.timeout, conn.get(key))
            .await
            .map_err(|_| QuotaError::Timeout(self.timeout))?
            .map_err(QuotaError::from_redis)?;
        Ok(word.as_deref().and_then(BlockReason::parse))
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
