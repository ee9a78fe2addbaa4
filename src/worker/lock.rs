//! The item lock (`lua/item_lock.lua`): one task at a time per job fan-out
//! item. Claimed before the first spend (in the same round trip: whether the
//! task already ended, the item's checkpoint, its newest completed tick, what
//! its last complete run left for the next one, and the Redis clock; and,
//! where the windows allow it, the first page's spend: the spend library's
//! claim, `lua/spend/claim.lua`),
//! renewed in the background while the task runs, released in the call that
//! records the task's end (`lua/finish.lua`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::conn::Conn;
use tracing::warn;

use super::Checkpoint;
use super::guards::Renewer;
use crate::config::Job;
use crate::conn::Lua;
use crate::fetch::paging::Validators;
use crate::keys::KeySpace;
use crate::queue::TaskArgs;
use crate::queue::scripts::finish::{ItemEnd, Leaves};
use crate::quota::{PreparedSpend, QuotaError};

/// `lua/item_lock.lua` run alone: claim, renew, release.
static ITEM_LOCK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("../../lua/item_lock.lua"),
        "\nreturn item_lock(KEYS, ARGV)\n"
    ))
});

/// What claiming the item found (`H`: what a held claim gives, here what
/// it found of the item's state; `claim::Worker::claim` adds the run's
/// share).
pub(super) enum Claim<H = Box<Found>> {
    /// The task (or the step it stands for) already ended.
    AlreadyDone,
    /// Another task holds the item (or a dead one's lock has yet to expire).
    Busy,
    /// Ours, and what the item's state in Redis is.
    Held(H),
    /// A reply that is none of these (a script that is not the one this
    /// daemon ships, say): a protocol error. The task ends `failed` with
    /// it rather than being taken for busy and retried every 2 s for ever.
    Unexpected(String),
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
    /// call: the spend's values, or its error.
    pub(super) spent: Option<Result<Vec<i64>, QuotaError>>,
    /// Why the item's state could not be read (a checkpoint that does not
    /// parse, a foreign writer's or another version's): the task ends
    /// `failed` with it and the state stays as it is, rather than the run
    /// silently starting over.
    pub(super) unreadable: Option<String>,
}

/// The claim's reply as `lua/item_lock.lua`'s header lays it out (followed,
/// `with_spend`, by `lua/spend/claim.lua`'s spend reply); `state` names the
/// keys the item's state was read from (checkpoint, completed tick,
/// `{since}`, validators). Every shape is matched: anything else is
/// [`Claim::Unexpected`], as apalis's `deserialize_with_meta` refuses a
/// task it cannot read.
fn read_claim(reply: &[String], with_spend: bool, state: &[String; 4]) -> Claim {
    match reply {
        [done] if done == "0" => Claim::AlreadyDone,
        [busy] if busy == "1" => Claim::Busy,
        [held, saved, ran, since, validators, now, spent @ ..]
            if held == "2" && (with_spend || spent.is_empty()) =>
        {
            let mut r = Reader::default();
            let [cursor_key, ran_key, since_key, validators_key] = state;
            let saved = r.field(cursor_key, "checkpoint", saved, |s| serde_json::from_str(s));
            let ran = r.field(ran_key, "completed tick", ran, str::parse);
            let since = r.field(since_key, "{since}", since, str::parse);
            let validators = r.field(validators_key, "validators", validators, |s| {
                serde_json::from_str(s)
            });
            let now = match now.parse::<i64>() {
                Ok(now) => now,
                Err(e) => {
                    r.unreadable = Some(format!(
                        "protocol error: the item claim's Redis time {now:?}: {e}"
                    ));
                    chrono::Utc::now().timestamp()
                }
            };
            Claim::Held(Box::new(Found {
                saved,
                ran,
                since,
                validators,
                now,
                spent: with_spend.then(|| crate::quota::spend_reply(spent)),
                unreadable: r.unreadable,
            }))
        }
        other => Claim::Unexpected(format!(
            "protocol error: the item claim answered {other:?}, not what lua/item_lock.lua answers"
        )),
    }
}

/// Reads a held claim's fields, keeping why the first that did not parse.
#[derive(Default)]
struct Reader {
    unreadable: Option<String>,
}

impl Reader {
    /// `raw` ("": none) read by `parse`; `None` too when it does not parse,
    /// which is noted with `key` and `what` it is.
    fn field<T, E: std::fmt::Display>(
        &mut self,
        key: &str,
        what: &str,
        raw: &str,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Option<T> {
        if raw.is_empty() {
            return None;
        }
        match parse(raw) {
            Ok(v) => Some(v),
            Err(e) => {
                (self.unreadable).get_or_insert_with(|| format!("unreadable {what} at {key}: {e}"));
                None
            }
        }
    }
}

/// Who holds an item, as its lock's value says:
/// `<task id>#<nonce>@<host>:<pid>` (the nonce makes each run's value its
/// own, so a late release never frees another run's hold). A lock taken by
/// a daemon from before the host was in it reads with no host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Holder {
    /// The task's id.
    pub(crate) task: String,
    /// Its daemon, `host:pid`.
    pub(crate) host: Option<String>,
}

impl Holder {
    /// A new run's value for `task`, in this process.
    fn value(task: &TaskArgs) -> String {
        format!(
            "{}#{}@{}",
            task.id,
            crate::quota::request_id(),
            crate::host::process()
        )
    }

    /// The holder a lock's value names. Task ids hold no `#`, host names
    /// no `@`.
    pub(crate) fn parse(value: &str) -> Holder {
        let (run, host) = match value.rsplit_once('@') {
            Some((run, host)) if run.contains('#') => (run, Some(host.to_owned())),
            _ => (value, None),
        };
        let task = run.split_once('#').map_or(run, |(task, _)| task);
        Holder {
            task: task.to_owned(),
            host,
        }
    }
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
            value: Holder::value(task),
            ttl,
        }
    }

    /// One round trip: done marker, lock, checkpoint, completed tick; with
    /// `spend`, the first page's spend too, made only if the claim succeeds.
    pub(super) async fn claim(
        &self,
        conn: &mut Conn,
        keys: &KeySpace,
        job: &Job,
        task: &TaskArgs,
        spend: Option<&PreparedSpend<'_>>,
    ) -> redis::RedisResult<Claim> {
        let item = task.item_key();
        let state = [
            keys.cursor(&job.name, &item),
            keys.item_ran(&job.name, &item),
            keys.since(&job.name, &item),
            keys.validators(&job.name, &item),
        ];
        let lock_keys = [
            self.key.as_str(),
            &keys.task_done(&task.root),
            &state[0],
            &state[1],
            &state[2],
            &state[3],
        ];
        let ttl = self.ttl.as_millis() as u64;
        let reply: Vec<String> = match spend {
            // The claim with the first page's spend: the spend library's
            // function (lua/spend/claim.lua), run as the limiter runs it.
            Some(spend) => {
                let mut call = crate::quota::claim_function().call();
                call.key(&lock_keys[..])
                    .arg("claim")
                    .arg(&self.value)
                    .arg(ttl);
                call.key(&spend.layout.keys).arg(&spend.layout.args);
                call.invoke(conn, spend.functions).await?
            }
            None => {
                let mut call = ITEM_LOCK.call();
                call.key(&lock_keys[..])
                    .arg("claim")
                    .arg(&self.value)
                    .arg(ttl);
                call.invoke(conn).await?
            }
        };
        Ok(read_claim(&reply, spend.is_some(), &state))
    }

    /// Renews the lock every third of its TTL until the returned guard is
    /// dropped, so a long request keeps the item and a killed daemon's (or a
    /// panicked task's) lock lapses within its TTL.
    pub(super) fn keep_renewed(&self, mut conn: Conn) -> Renewer {
        let (key, value, ttl) = (self.key.clone(), self.value.clone(), self.ttl);
        let lost = Arc::new(AtomicBool::new(false));
        let lapsed = lost.clone();
        Renewer::watching(lost, async move {
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
                    // The run stops at its next page (`run::Worker::run_pages`):
                    // the item may be another task's now.
                    warn!(lock = %key, "another task holds the item now (this task's lock lapsed while Redis stalled, and the item was claimed again); the task stops at its next page");
                    lapsed.store(true, Ordering::Release);
                    return;
                }
            }
        })
    }

    /// The item's release with `leaves`, for the call that records the
    /// task's outcome (`lua/finish.lua`).
    pub(super) fn end(&self, leaves: Leaves) -> ItemEnd {
        ItemEnd {
            lock: self.key.clone(),
            holder: self.value.clone(),
            leaves,
        }
    }

    /// Saves the item's checkpoint `json` at `cursor_key` for `ttl`, unless
    /// another task holds the item, in one call (a fence: a task whose lock
    /// lapsed under a stalled Redis cannot overwrite, or bring back after a
    /// complete run dropped it, the checkpoint of the task that holds the
    /// item now). A lock nobody holds is taken again (`lua/item_lock.lua`
    /// says when). `false`: another task's, nothing written.
    pub(super) async fn save(
        &self,
        conn: &mut Conn,
        cursor_key: &str,
        json: &str,
        ttl: Duration,
    ) -> redis::RedisResult<bool> {
        let mut call = self.fenced("save", cursor_key);
        call.arg(json).arg(ttl.as_secs());
        Ok(call.invoke::<i64>(conn).await? == 1)
    }

    /// Deletes the item's checkpoint at `cursor_key`, unless another task
    /// holds the item (as [`ItemLock::save`]): the item's next run starts
    /// over. `false`: another task's, nothing deleted.
    pub(super) async fn forget(
        &self,
        conn: &mut Conn,
        cursor_key: &str,
    ) -> redis::RedisResult<bool> {
        Ok(self
            .fenced("forget", cursor_key)
            .invoke::<i64>(conn)
            .await?
            == 1)
    }

    /// `op` on the checkpoint at `cursor_key`, fenced by this lock: its
    /// keys, holder and TTL as `lua/item_lock.lua` reads them.
    fn fenced(&self, op: &str, cursor_key: &str) -> crate::conn::LuaCall<'static> {
        let mut call = ITEM_LOCK.call();
        call.key(&self.key)
            .key(cursor_key)
            .arg(op)
            .arg(&self.value)
            .arg(self.ttl.as_millis() as u64);
        call
    }

    /// Who holds the item now, if anyone.
    pub(super) async fn holder(&self, conn: &mut Conn) -> redis::RedisResult<Option<Holder>> {
        let value: Option<String> = redis::AsyncCommands::get(conn, &self.key).await?;
        Ok(value.as_deref().map(Holder::parse))
    }

    /// Frees the item, if it is still ours: when the task could not record
    /// its end (Redis failed), which would have freed it.
    pub(super) async fn release(&self, conn: &mut Conn) -> redis::RedisResult<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> [String; 4] {
        [
            "qw:cursor:j:-",
            "qw:ran:j:-",
            "qw:since:j:-",
            "qw:validators:j:-",
        ]
        .map(String::from)
    }

    fn reply(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    fn held(c: Claim) -> Found {
        match c {
            Claim::Held(found) => *found,
            _ => panic!("not held"),
        }
    }

    #[test]
    fn every_reply_of_the_header_is_read() {
        assert!(matches!(
            read_claim(&reply(&["0"]), false, &state()),
            Claim::AlreadyDone
        ));
        assert!(matches!(
            read_claim(&reply(&["1"]), true, &state()),
            Claim::Busy
        ));
        let fresh = held(read_claim(
            &reply(&["2", "", "", "", "", "1700000000"]),
            false,
            &state(),
        ));
        assert!(fresh.saved.is_none() && fresh.ran.is_none() && fresh.since.is_none());
        assert_eq!((fresh.now, fresh.unreadable), (1_700_000_000, None));
        assert!(fresh.spent.is_none());

        let cp = r#"{"tick":5,"page":3,"token":null}"#;
        let resumed = held(read_claim(
            &reply(&[
                "2",
                cp,
                "4",
                "1699990000",
                "",
                "1700000000",
                "0",
                "7",
                "0",
                "0",
            ]),
            true,
            &state(),
        ));
        assert_eq!(resumed.saved.map(|c| (c.tick, c.cursor.page)), Some((5, 3)));
        assert_eq!((resumed.ran, resumed.since), (Some(4), Some(1_699_990_000)));
        assert!(resumed.unreadable.is_none());
        assert_eq!(resumed.spent.map(|s| s.ok()), Some(Some(vec![0, 7, 0, 0])));
    }

    /// `state` says which task holds an item, and on which host, from the
    /// lock's value alone; an older daemon's value names no host.
    #[test]
    fn a_locks_value_names_its_task_and_host() {
        let task = TaskArgs::first("j", 5, 0, vec![], crate::queue::Origin::Tick);
        let held = Holder::parse(&Holder::value(&task));
        assert_eq!(held.task, "j:5:0");
        assert_eq!(held.host.as_deref(), Some(crate::host::process()));
        let old = Holder::parse("j:5:0:b2#0123abcd");
        assert_eq!((old.task.as_str(), old.host), ("j:5:0:b2", None));
    }

    /// Regression (issue 23 item 8): any reply that was not "already done"
    /// or "held" was taken for `Busy`, so a script that answered otherwise
    /// had its task retried every 2 s for ever.
    #[test]
    fn a_reply_of_another_shape_is_a_protocol_error_not_busy() {
        for bad in [
            &[][..],
            &["3"],
            &["2"],
            &["1", "x"],
            &["busy"],
            &["2", "", "", "", "", "1700000000", "unexpected"],
        ] {
            match read_claim(&reply(bad), false, &state()) {
                Claim::Unexpected(why) => assert!(why.starts_with("protocol error"), "{why}"),
                _ => panic!("{bad:?} was read as a claim"),
            }
        }
    }

    /// Regression (issue 23 item 8): a checkpoint that did not parse was
    /// read as none (`.ok()`), so the item's run silently started over.
    #[test]
    fn an_unreadable_checkpoint_is_named_not_dropped() {
        let found = held(read_claim(
            &reply(&["2", "{not json", "", "", "", "1700000000"]),
            false,
            &state(),
        ));
        let why = found.unreadable.expect("unreadable");
        assert!(
            why.starts_with("unreadable checkpoint at qw:cursor:j:-: "),
            "{why}"
        );
        let bad_tick = held(read_claim(
            &reply(&["2", "", "soon", "", "", "1700000000"]),
            false,
            &state(),
        ));
        assert!(
            bad_tick
                .unreadable
                .is_some_and(|w| w.contains("qw:ran:j:-"))
        );
    }
}
