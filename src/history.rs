//! What the status page shows that the windows and the queue do not keep by
//! themselves, kept in Redis, bounded and expiring: units spent per 5 minutes
//! over 24 hours (written by `lua/spend.lua` in the spend's own call, beside
//! the windows), each job's newest ticks' outcome counts
//! and its last error (`lua/finish.lua`), and why a credential is blocked.
//!
//! The spend script, the worker ([`record_block`]) and the finish script
//! write it; [`crate::ops`] reads it. Key names come from [`crate::keys`].

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

use crate::keys::KeySpace;
use crate::quota::QuotaConn;

/// One slot of the spend history.
pub(crate) const SLOT: Duration = Duration::from_secs(300);
/// Slots kept: 24 hours of 5 minutes.
pub(crate) const SLOTS: usize = 288;
/// A ring outlives its newest slot by the span it covers: after that it
/// holds only zeros.
pub(crate) const RING_TTL: Duration = Duration::from_secs(300 * (288 + 1));
/// How many of a job's ticks its record keeps (the newest).
pub(crate) const TICKS_KEPT: usize = 10;
/// How long a job's tick record outlives its last task: long enough for a
/// monthly job's last tick to stay on the page.
pub(crate) const TICKS_TTL: Duration = Duration::from_secs(35 * 86_400);

/// Reads rings where the windows live (they are written by the spend
/// script, beside the windows: the queue's Redis or the quota cluster) and
/// that Redis's clock: the time (ms since the epoch) and each ring's units
/// per slot, oldest first, the last slot being the current one. One command
/// per ring, all in flight at once: on a cluster the rings of different
/// credentials live on different nodes, which one pipeline cannot reach.
pub(crate) async fn read_rings(
    conn: &QuotaConn,
    rings: &[String],
) -> redis::RedisResult<(i64, Vec<Vec<u64>>)> {
    let time = async {
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(&mut conn.clone()).await?;
        Ok::<_, redis::RedisError>(s * 1000 + us / 1000)
    };
    let gets = futures::future::try_join_all(rings.iter().map(|r| async move {
        let raw: Option<Vec<u8>> = redis::cmd("GET")
            .arg(r)
            .query_async(&mut conn.clone())
            .await?;
        Ok::<_, redis::RedisError>(raw)
    }));
    let (now_ms, raws) = futures::future::try_join(time, gets).await?;
    let now_slot = (now_ms.max(0) as u64) / SLOT.as_millis() as u64;
    let out = raws
        .iter()
        .map(|raw| decode(raw.as_deref().unwrap_or_default(), now_slot))
        .collect();
    Ok((now_ms, out))
}

/// The ring `raw` (`lua/spend.lua`'s layout) as [`SLOTS`] counts, oldest
/// first, ending with `now_slot`'s. Slots the ring has not reached yet, or
/// has moved past, count 0.
pub(crate) fn decode(raw: &[u8], now_slot: u64) -> Vec<u64> {
    let counter = |i: usize| -> u64 {
        raw.get(i * 4..i * 4 + 4).map_or(0, |b| {
            u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        })
    };
    let newest = counter(0);
    let n = SLOTS as u64;
    // A Redis clock stepped back: the ring's newest slot is "now".
    let now_slot = now_slot.max(newest);
    (0..n)
        .map(|i| match (now_slot + i + 1).checked_sub(n) {
            Some(slot) if newest != 0 && slot <= newest && newest - slot < n => {
                counter(1 + (slot % n) as usize)
            }
            _ => 0,
        })
        .collect()
}

/// Why a credential is blocked, as the daemon that blocked it recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BlockReason {
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
    /// Why, in one stable word (`quota::BlockReason`: `"429"`,
    /// `"headers_at_zero"`, `"secondary_limit"`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
}

/// Records why `credential` is blocked, for as long as `blocked` (the block
/// in force). Only called by the daemon whose block is the one in force, so
/// a shorter block never replaces a longer one's reason.
pub(crate) async fn record_block(
    conn: &mut ConnectionManager,
    keys: &KeySpace,
    credential: &str,
    blocked: Duration,
    reason: &BlockReason,
) -> redis::RedisResult<()> {
    let json = serde_json::to_string(reason).map_err(|e| {
        redis::RedisError::from((redis::ErrorKind::Client, "block reason", e.to_string()))
    })?;
    let ms = (blocked.as_millis() as u64).max(1);
    conn.pset_ex(keys.block_reason(credential), json, ms).await
}

/// Why each of `credentials` is blocked (`None`: not recorded, or not blocked).
pub(crate) async fn read_block_reasons(
    conn: &mut ConnectionManager,
    keys: &KeySpace,
    credentials: &[String],
) -> redis::RedisResult<Vec<Option<BlockReason>>> {
    if credentials.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = credentials.iter().map(|c| keys.block_reason(c)).collect();
    let raw: Vec<Option<String>> = redis::cmd("MGET").arg(&names).query_async(conn).await?;
    Ok(raw
        .into_iter()
        .map(|r| r.and_then(|s| serde_json::from_str(&s).ok()))
        .collect())
}

/// A job's last error, as `lua/finish.lua` keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LastError {
    /// The outcome (`failed`, or `retrying` for one that was queued again).
    pub(crate) outcome: String,
    /// The fan-out item, as `region=US` (data: shown escaped).
    pub(crate) item: String,
    /// The tick, ms since the epoch.
    pub(crate) tick: i64,
    /// The HTTP status, when one decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<u16>,
    /// Why, in words (the outcome's detail, as logged: free of secrets).
    pub(crate) detail: String,
    /// When, ms since the epoch (the Redis clock); set when read.
    #[serde(default)]
    pub(crate) at_ms: i64,
}

/// One tick of a job, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TickRecord {
    /// The tick, ms since the epoch.
    pub(crate) tick: i64,
    /// The tick's outcome hash: outcome field -> count, `#items`, ...
    pub(crate) counts: BTreeMap<String, i64>,
}

/// A job's newest ticks (newest first) and its last error.
pub(crate) async fn read_job(
    conn: &mut ConnectionManager,
    keys: &KeySpace,
    job: &str,
) -> redis::RedisResult<(Vec<TickRecord>, Option<LastError>)> {
    let all: BTreeMap<String, String> = conn.hgetall(keys.job_ticks(job)).await?;
    Ok(parse_job(&all))
}

fn parse_job(all: &BTreeMap<String, String>) -> (Vec<TickRecord>, Option<LastError>) {
    let mut ticks: Vec<TickRecord> = all
        .iter()
        .filter_map(|(field, json)| {
            let tick = field.parse::<i64>().ok()?;
            let map: BTreeMap<String, serde_json::Value> = serde_json::from_str(json).ok()?;
            let counts = map
                .into_iter()
                .filter_map(|(k, v)| Some((k, v.as_f64()? as i64)))
                .collect();
            Some(TickRecord { tick, counts })
        })
        .collect();
    ticks.sort_by_key(|t| std::cmp::Reverse(t.tick));
    ticks.truncate(TICKS_KEPT);
    let error = all.get("#error").and_then(|json| {
        let mut e: LastError = serde_json::from_str(json).ok()?;
        e.at_ms = all.get("#error_at_ms")?.parse().ok()?;
        Some(e)
    });
    (ticks, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(newest: u32, slots: &[(u64, u32)]) -> Vec<u8> {
        let mut raw = vec![0u8; (SLOTS + 1) * 4];
        raw[..4].copy_from_slice(&newest.to_be_bytes());
        for (slot, units) in slots {
            let i = 1 + (*slot % SLOTS as u64) as usize;
            raw[i * 4..i * 4 + 4].copy_from_slice(&units.to_be_bytes());
        }
        raw
    }

    #[test]
    fn decode_puts_the_current_slot_last_and_drops_what_the_ring_moved_past() {
        let now = 1_000_000u64;
        let raw = ring(now as u32, &[(now, 7), (now - 1, 5), (now - 287, 3)]);
        let d = decode(&raw, now);
        assert_eq!(d.len(), SLOTS);
        assert_eq!(d[SLOTS - 1], 7);
        assert_eq!(d[SLOTS - 2], 5);
        assert_eq!(d[0], 3);
        assert_eq!(d.iter().sum::<u64>(), 15);
        // Ten slots later nothing was written: the last ten count 0 (their
        // ring positions still hold what was there 24 hours earlier), and
        // the oldest ones have left.
        let later = decode(&raw, now + 10);
        assert_eq!(later[SLOTS - 11], 7);
        assert_eq!(later[SLOTS - 12], 5);
        assert!(later[SLOTS - 10..].iter().all(|u| *u == 0));
        assert_eq!(later.iter().sum::<u64>(), 12);
        // A whole day later: nothing.
        assert!(decode(&raw, now + SLOTS as u64).iter().all(|u| *u == 0));
    }

    #[test]
    fn decode_reads_a_missing_or_short_ring_as_zeros() {
        assert!(decode(&[], 5).iter().all(|u| *u == 0));
        let short = &ring(100, &[(100, 9)])[..8];
        assert_eq!(decode(short, 100).iter().sum::<u64>(), 0);
    }

    #[test]
    fn parse_job_keeps_the_newest_ticks_first_and_reads_the_last_error() {
        let mut all = BTreeMap::new();
        for t in 0..12 {
            all.insert(
                format!("{}", 1000 + t),
                format!("{{\"done\":{t},\"#items\":4}}"),
            );
        }
        all.insert(
            "#error".into(),
            r#"{"outcome":"failed","item":"region=<b>","tick":1011,"status":404,"detail":"upstream answered 404"}"#.into(),
        );
        all.insert("#error_at_ms".into(), "1732345200000".into());
        let (ticks, error) = parse_job(&all);
        assert_eq!(ticks.len(), TICKS_KEPT);
        assert_eq!(ticks[0].tick, 1011);
        assert_eq!(ticks[0].counts["done"], 11);
        assert_eq!(ticks[0].counts["#items"], 4);
        let e = error.expect("last error");
        assert_eq!(e.item, "region=<b>");
        assert_eq!(e.status, Some(404));
        assert_eq!(e.at_ms, 1_732_345_200_000);
    }
}
