//! The spend history's rings: units spent per 5-minute slot over 24 hours,
//! one ring per window scope, written by `lua/spend/ring.lua` in the spend's own
//! call (so a spend costs no round trip more for it). The layout is known
//! here and in the script only; the status page reads rings through
//! [`decode`].

use std::time::Duration;

use super::QuotaConn;

/// One slot of the spend history.
pub(crate) const SLOT: Duration = Duration::from_secs(300);
/// Slots kept: 24 hours of 5 minutes.
pub(crate) const SLOTS: usize = 288;
/// A ring outlives its newest slot by the span it covers: after that it
/// holds only zeros.
pub(crate) const RING_TTL: Duration = Duration::from_secs(300 * (288 + 1));

/// The ring `raw` (`lua/spend/ring.lua`'s layout) as [`SLOTS`] counts, oldest
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

/// Reads rings where the windows live (they are written by the spend
/// core, beside the windows: the queue's Redis or the quota cluster) and
/// that Redis's clock: the time (ms since the epoch) and each ring's counts
/// per slot, oldest first, the last slot being the current one. One command
/// per ring, all in flight at once: on a cluster the rings of different
/// credentials live on different nodes, which one pipeline cannot reach.
pub(crate) async fn read(
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
}
