//! What a task is: one fan-out item of one tick of one job
//! ([`TaskArgs`], the payload the queue carries), why it was queued
//! ([`Origin`]), and its copies (retries, deferrals, busy copies), each
//! with an id of its own.

use serde::{Deserialize, Serialize};

use crate::config::Item;

use super::scripts::rotate::Rotation;

/// Why a task was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// A cron tick.
    Tick,
    /// `quota-worker trigger`.
    Trigger,
    /// A retry after a network error, timeout or 5xx (counts as a failure).
    Retry,
    /// Come back later without it being a failure: a deferral to the
    /// retry-after (`on_quota_exhausted = "defer"`), or the limiter was
    /// unreachable.
    Defer,
    /// Another task held the item; try again shortly.
    Busy,
}

impl Origin {
    /// As stored (serde's name).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Tick => "tick",
            Origin::Trigger => "trigger",
            Origin::Retry => "retry",
            Origin::Defer => "defer",
            Origin::Busy => "busy",
        }
    }

    /// The origin stored as `s`.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }
}

/// One tick's fan-out, as its chunks name it.
#[derive(Debug, Clone, Copy)]
pub struct TickFanOut<'a> {
    /// The job.
    pub job: &'a str,
    /// The tick, ms.
    pub tick: i64,
    /// Why its tasks are queued (`Tick` or `Trigger`).
    pub origin: Origin,
    /// Who queues it: the claim's value and the progress owner, unique per
    /// process (a daemon's `host:pid`, a trigger's request id).
    pub who: &'a str,
}

/// One task: one fan-out item of one tick of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskArgs {
    /// Unique per queued copy: `<job>:<tick_ms>:<item index>` for a tick's
    /// task, `...:<seq>` for a retry or deferral (a new root), `<root>:b<seq>`
    /// for a busy copy (same root).
    pub id: String,
    /// The unit of work this copy stands for; a redelivered or busy-requeued
    /// copy of a root that already ended does nothing.
    pub root: String,
    /// The job.
    pub job: String,
    /// The tick, ms since the epoch.
    pub tick: i64,
    /// The item's index in the fan-out.
    pub index: u64,
    /// The item: fan-out key/value pairs.
    pub item: Item,
    /// Why this copy was queued.
    pub origin: Origin,
    /// Whether it continues its tick's interrupted run (retry, deferral): it
    /// resumes that run's checkpoint only if no newer tick took it over.
    pub continuation: bool,
    /// Real failures so far (network, 5xx, timeouts): bounded by `retry.attempts`.
    pub failures: u32,
    /// Copies queued before this one in its chain.
    pub seq: u32,
    /// The tick's turn in its job's rotation ([`Rotation`]); `None` for a
    /// task queued without one (`enqueue_tick`), which fairness ignores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
    /// Times a daemon whose config does not have the job gave this task
    /// back (rolling deploys, reloads): each give-back waits twice as long
    /// as the last ([`TaskArgs::given_back`]). Absent in tasks queued
    /// before it existed, and ignored by daemons that predate it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub given_back: u32,
    /// When (Redis time, ms) the first daemon that did not know the job
    /// gave it back: the grace of a job no daemon has ever had counts from
    /// there (`queue::known`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_since: Option<i64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl TaskArgs {
    /// The item's value for fan-out key `key` ("" when it has none): a
    /// template credential's tenant, for one.
    pub(crate) fn value_of(&self, key: &str) -> &str {
        let found = self.item.iter().find(|(k, _)| k == key);
        found.map_or("", |(_, v)| v.as_str())
    }

    /// The first task of `item` at `tick`.
    pub fn first(job: &str, tick: i64, index: u64, item: Item, origin: Origin) -> Self {
        let id = format!("{job}:{tick}:{index}");
        TaskArgs {
            root: id.clone(),
            id,
            job: job.to_owned(),
            tick,
            index,
            item,
            origin,
            continuation: false,
            failures: 0,
            seq: 0,
            turn: None,
            given_back: 0,
            unknown_since: None,
        }
    }

    /// The task of item `index` of a tick of `total` items queued in
    /// `rotation`'s order. Its id names its position, zero-padded to one
    /// width per tick, so that ids sort in serving order: the backlog and
    /// apalis's scheduled set both hand out tasks due at the same moment in
    /// the order of their ids.
    pub fn in_rotation(
        fan: &TickFanOut<'_>,
        rotation: Rotation,
        total: u64,
        index: u64,
        item: Item,
    ) -> Self {
        let width = total.saturating_sub(1).max(1).ilog10() as usize + 1;
        let position = rotation.position_of(index, total);
        let mut task = TaskArgs::first(fan.job, fan.tick, index, item, fan.origin);
        task.id = format!("{}:{}:{position:0width$}", fan.job, fan.tick);
        task.root = task.id.clone();
        task.turn = Some(rotation.turn);
        task
    }

    /// The same item of the same tick, queued again for `origin`.
    ///
    /// A retry or deferral and a busy copy of one task never share an id:
    /// both the backlog and apalis keep the first of two pushes of one id
    /// (apalis for as long as it keeps the task's data, an hour), so a
    /// retry named like a busy copy queued by a redelivered copy of the same
    /// task was dropped, and the task was lost.
    pub(crate) fn again(&self, origin: Origin) -> Self {
        let mut next = self.clone();
        next.origin = origin;
        next.seq += 1;
        match origin {
            Origin::Retry | Origin::Defer => {
                if origin == Origin::Retry {
                    next.failures += 1;
                }
                next.continuation = true;
                next.id = format!("{}:{}:{}:{}", self.job, self.tick, self.index, next.seq);
                next.root = next.id.clone();
            }
            // Stands in for its root: same root, same kind. Two busy copies
            // of one root from two concurrent runs of it may share an id:
            // keeping one of them is right.
            Origin::Busy | Origin::Tick | Origin::Trigger => {
                next.id = format!("{}:b{}", self.root, next.seq);
            }
        }
        next
    }

    /// This task given back by a daemon whose config does not have its job,
    /// for another daemon (or this one, reloaded): the same task (a busy
    /// copy: same root, no attempt counted), with the give-back counted
    /// and the time the job was first found unknown (`since`, Redis ms).
    pub(crate) fn given_back(&self, since: i64) -> Self {
        let mut next = self.again(Origin::Busy);
        next.given_back = self.given_back.saturating_add(1);
        next.unknown_since = Some(self.unknown_since.unwrap_or(since));
        next
    }

    /// The item as one string: `region=US,lang=en` (`-` for no fan-out).
    pub(crate) fn item_key(&self) -> String {
        item_key(&self.item)
    }
}

/// A fan-out item as one string, for keys and logs: `k=v,k=v` over every
/// key in order, so items that differ in any value differ here. Injective:
/// `\`, `,` and `=` in a value are escaped with `\` (values from data may
/// hold them: `a="x,b=y", b="z"` and `a="x", b="y,b=z"` must not share a
/// lock or a cursor); values without them are written as before.
pub(crate) fn item_key(item: &[(String, String)]) -> String {
    if item.is_empty() {
        return "-".into();
    }
    let mut out = String::new();
    for (i, (k, v)) in item.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push('=');
        for c in v.chars() {
            if matches!(c, '\\' | ',' | '=') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Regression: values holding `,` or `=` made two items one key.
    #[test]
    fn item_keys_are_injective() {
        let a = item_key(&pairs(&[("a", "x,b=y"), ("b", "z")]));
        let b = item_key(&pairs(&[("a", "x"), ("b", "y,b=z")]));
        assert_ne!(a, b);
        assert_eq!(a, "a=x\\,b\\=y,b=z");
        // Plain values keep the key they always had (cursors survive).
        assert_eq!(
            item_key(&pairs(&[("region", "US"), ("lang", "en")])),
            "region=US,lang=en"
        );
        assert_ne!(
            item_key(&pairs(&[("a", "x\\"), ("b", "y")])),
            item_key(&pairs(&[("a", "x"), ("b", "\\y")]))
        );
        assert_eq!(item_key(&[]), "-");
    }

    /// Ids of a rotated tick sort in serving order (the backlog and apalis
    /// hand out tasks due at the same moment by id), and every position
    /// maps to one item.
    #[test]
    fn rotated_ids_sort_in_serving_order_and_cover_every_item() {
        let fan = TickFanOut {
            job: "j",
            tick: 1_000,
            origin: Origin::Tick,
            who: "t",
        };
        for (total, offset) in [(12u64, 7u64), (5, 0), (5, 4), (1, 0), (101, 100)] {
            let rotation = Rotation { offset, turn: 3 };
            let mut tasks: Vec<TaskArgs> = (0..total)
                .map(|p| {
                    let i = rotation.index_at(p, total);
                    assert_eq!(rotation.position_of(i, total), p);
                    TaskArgs::in_rotation(&fan, rotation, total, i, vec![])
                })
                .collect();
            let served: Vec<u64> = tasks.iter().map(|t| t.index).collect();
            tasks.sort_by(|a, b| a.id.cmp(&b.id));
            let by_id: Vec<u64> = tasks.iter().map(|t| t.index).collect();
            assert_eq!(by_id, served, "total {total}, offset {offset}");
            assert_eq!(served[0], offset % total);
            let mut all = served.clone();
            all.sort_unstable();
            assert_eq!(all, (0..total).collect::<Vec<_>>());
            assert!(tasks.iter().all(|t| t.turn == Some(3) && t.root == t.id));
        }
    }

    /// Regression: a busy copy and a retry of one task got the same id.
    #[test]
    fn busy_copies_and_retries_of_one_task_never_share_an_id() {
        let t = TaskArgs::first(
            "j",
            1_000,
            3,
            vec![("region".into(), "US".into())],
            Origin::Tick,
        );
        let busy = t.again(Origin::Busy);
        let retry = t.again(Origin::Retry);
        let defer = t.again(Origin::Defer);
        assert_ne!(busy.id, retry.id);
        assert_ne!(busy.id, defer.id);
        assert_eq!(busy.root, t.root);
        assert_eq!(retry.root, retry.id);
        assert!(retry.continuation && !busy.continuation);

        // The scenario: the original run of `t` holds the item while a
        // redelivered copy of `t` keeps finding it busy; then the original
        // run queues its retry (or deferral). None of them may share an id.
        let mut ids = std::collections::HashSet::new();
        let mut busy = t.clone();
        for _ in 0..10 {
            busy = busy.again(Origin::Busy);
            assert_eq!(busy.root, t.root);
            assert!(ids.insert(busy.id.clone()), "{}", busy.id);
        }
        for o in [Origin::Retry, Origin::Defer] {
            let next = t.again(o);
            assert!(!ids.contains(&next.id), "{o:?} copy {} collides", next.id);
            // And down that copy's own chain as well.
            let mut b = next.again(Origin::Busy);
            for _ in 0..10 {
                assert!(!ids.contains(&b.id) && b.id != next.id, "{}", b.id);
                b = b.again(Origin::Busy);
            }
        }
    }
}
