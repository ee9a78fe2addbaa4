//! What the status page reads from Redis that the windows and the queue
//! do not keep by themselves, read-only: the spend history's rings (written
//! by the spend core (`lua/spend/ring.lua`, layout in `quota::ring`), each job's tick record and
//! last error (written by `lua/finish.lua`, layout in
//! `queue::scripts::finish`) and why a credential is blocked (written by the
//! worker that blocked it, `quota::BlockNote`). Each layout lives with its
//! writer; this module only reads them, for [`super::model`].

use std::collections::BTreeMap;

use crate::conn::Conn;
use redis::AsyncCommands;

use crate::keys::KeySpace;
use crate::queue::scripts::finish::{LastError, TICKS_KEPT, TickRecord};
use crate::quota::BlockNote;

/// A job's starved items (`lua/finish.lua` writes them, fair rotation
/// reads them too: `schedule::fairness`).
pub(crate) use crate::schedule::starved_items;

/// Reads rings where the windows live, and that Redis's clock
/// ([`ring::read`]).
pub(crate) use crate::quota::ring::read as read_rings;

/// Why each of `blocks` (a credential and one of its resources, `None`
/// the default one) is blocked (`None`: not recorded, or not blocked).
pub(crate) async fn read_block_notes(
    conn: &mut Conn,
    keys: &KeySpace,
    blocks: &[(String, Option<String>)],
) -> redis::RedisResult<Vec<Option<BlockNote>>> {
    if blocks.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = (blocks.iter())
        .map(|(c, r)| keys.block_reason_in(c, r.as_deref()))
        .collect();
    let raw: Vec<Option<String>> = redis::cmd("MGET").arg(&names).query_async(conn).await?;
    Ok(raw
        .into_iter()
        .map(|r| r.and_then(|s| serde_json::from_str(&s).ok()))
        .collect())
}

/// A job's newest ticks (newest first) and its last error.
pub(crate) async fn read_job(
    conn: &mut Conn,
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
