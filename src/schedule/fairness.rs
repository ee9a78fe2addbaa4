//! Fair rotation of a job's items when its ticks cannot all be served: what
//! Redis keeps (`lua/rotate.lua`, `lua/finish.lua`) and how it is read back
//! (the status page's "starved items", `check`'s per-item share).
//!
//! A tick's items are queued in rotated order, starting at the first
//! position of the job's previous tick whose task ended on the quota's
//! "no" ([`crate::queue::Queue::begin_tick`]). Per job, Redis keeps one
//! small hash (`keys::fair`: the latest tick, its turn, offset, item count
//! and first "no") and the starved items (`keys::starved`: item key → the
//! turn its starvation began), at most [`STARVED_CAP`] of them.

use redis::aio::ConnectionLike;

use crate::keys::KeySpace;

/// Most starved items kept per job: defined beside the script that keeps
/// them (`lua/finish.lua`), so the queue's scripts import nothing from here.
pub use crate::queue::scripts::finish::STARVED_CAP;

/// Most starved items [`starved_items`] reads to pick the most starved.
const SCAN_MAX: usize = 10_000;

/// A job's starved items, as [`starved_items`] reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StarvedItems {
    /// How many items are starved now (counted, not all listed).
    pub total: u64,
    /// The most starved ones, most first: item key (`region=US`) and the
    /// ticks in a row it has been starved, the job's latest tick included.
    pub items: Vec<(String, u64)>,
}

/// The items of `job` starved now, the `limit` most starved first, with
/// their `starved_ticks` (docs/outcomes.md). Reads one small hash and at
/// most 10,000 starved items (in a job with more, the most starved among
/// those read). Read-only: for the status page and tests.
pub async fn starved_items(
    conn: &mut impl ConnectionLike,
    keys: &KeySpace,
    job: &str,
    limit: usize,
) -> Result<StarvedItems, redis::RedisError> {
    let (turn, total): (Option<u64>, u64) = redis::pipe()
        .hget(keys.fair(job), "turn")
        .hlen(keys.starved(job))
        .query_async(conn)
        .await?;
    let Some(turn) = turn else {
        return Ok(StarvedItems::default());
    };
    let mut found: Vec<(String, u64)> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<(String, u64)>) = redis::cmd("HSCAN")
            .arg(keys.starved(job))
            .arg(cursor)
            .arg("COUNT")
            .arg(500)
            .query_async(conn)
            .await?;
        found.extend(
            page.into_iter()
                .map(|(item, since)| (item, (turn + 1).saturating_sub(since).max(1))),
        );
        cursor = next;
        if cursor == 0 || found.len() >= SCAN_MAX {
            break;
        }
    }
    found.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    found.truncate(limit);
    Ok(StarvedItems {
        total,
        items: found,
    })
}

/// The share of ticks each item of a job is served on, when only `fits`
/// of its `items` fit per tick: with the rotation, every item in turn.
pub(crate) fn share(fits: u64, items: u64) -> f64 {
    if items == 0 {
        return 1.0;
    }
    fits.min(items) as f64 / items as f64
}
