//! Which items a job has, for `state` and `/api/state/JOB`: the ones its
//! fan-out gives now (its `fan_out` lists times its `fan_out_from` rows,
//! read as a tick reads them: `schedule::TickItems`), then the ones only
//! Redis still holds state for (`super::held_items`); and which item an
//! operator's `ITEM` names.

use std::collections::{BTreeSet, HashSet};

use crate::conn::Conn;

use crate::config::Job;
use crate::keys::KeySpace;
use crate::schedule::TickItems;

/// The items `job`'s fan-out gives now, as tasks name them (`region=US`);
/// why not, when its source cannot be read.
pub(crate) async fn fan_out(job: &Job) -> Result<Vec<String>, String> {
    let mut items = TickItems::read_async(job)
        .await
        .map_err(|e| e.to_string())?;
    let iter = items.from(0).map_err(|e| e.to_string())?;
    iter.map(|r| r.map(|(_, item)| crate::queue::item_key(&item)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
}

/// The fan-out's items in its order (`true`), then the others Redis holds
/// state for (`false`), in key order.
pub(crate) fn every_item(fanned: Vec<String>, held: BTreeSet<String>) -> Vec<(String, bool)> {
    let given: HashSet<&str> = fanned.iter().map(String::as_str).collect();
    let others: Vec<(String, bool)> = held
        .into_iter()
        .filter(|h| !given.contains(h.as_str()))
        .map(|h| (h, false))
        .collect();
    fanned
        .into_iter()
        .map(|f| (f, true))
        .chain(others)
        .collect()
}

/// The item `item` names, and whether the fan-out gives it now: one of the
/// fan-out's (`fanned`), as written or with its pairs in another order;
/// else itself, when Redis holds state for it; else `None`.
pub(crate) async fn find(
    conn: &mut Conn,
    keys: &KeySpace,
    job: &Job,
    item: &str,
    fanned: &Result<Vec<String>, String>,
) -> redis::RedisResult<Option<(String, bool)>> {
    if let Ok(f) = fanned {
        if f.iter().any(|x| x == item) {
            return Ok(Some((item.to_owned(), true)));
        }
        let wanted = canonical(item);
        let same = |x: &&String| wanted.is_some() && canonical(x) == wanted;
        if let Some(x) = f.iter().find(same) {
            return Ok(Some((x.clone(), true)));
        }
    }
    let held = super::has_state(conn, keys, &job.name, item).await?;
    Ok(held.then(|| (item.to_owned(), false)))
}

/// An item's pairs in name order (`queue::item_key`'s escapes undone):
/// `lang=en,region=US` and `region=US,lang=en` are one item. `None` for
/// text that is not `k=v` pairs.
fn canonical(item: &str) -> Option<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    let (mut key, mut cur, mut escaped) = (None::<String>, String::new(), false);
    for c in item.chars() {
        match c {
            _ if escaped => {
                cur.push(c);
                escaped = false;
            }
            '\\' => escaped = true,
            '=' if key.is_none() => key = Some(std::mem::take(&mut cur)),
            ',' => pairs.push((key.take()?, std::mem::take(&mut cur))),
            _ => cur.push(c),
        }
    }
    pairs.push((key?, cur));
    pairs.sort();
    Some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_the_same_in_any_order_of_its_pairs() {
        assert_eq!(
            canonical("region=US,lang=en"),
            canonical("lang=en,region=US")
        );
        assert_ne!(
            canonical("region=US,lang=en"),
            canonical("region=US,lang=fr")
        );
        // Escapes as `queue::item_key` writes them.
        let key = crate::queue::item_key(&[("a".into(), "x,b=y".into()), ("b".into(), "z".into())]);
        assert_eq!(
            canonical(&key),
            Some(vec![("a".into(), "x,b=y".into()), ("b".into(), "z".into())])
        );
        assert_eq!(canonical("US"), None);
        assert_eq!(canonical("-"), None);
    }

    #[test]
    fn the_fan_out_comes_first_then_what_only_redis_holds() {
        let items = every_item(
            vec!["r=b".into(), "r=a".into()],
            ["r=a".to_owned(), "r=0".to_owned()].into(),
        );
        assert_eq!(
            items,
            [
                ("r=b".to_owned(), true),
                ("r=a".to_owned(), true),
                ("r=0".to_owned(), false)
            ]
        );
    }
}
