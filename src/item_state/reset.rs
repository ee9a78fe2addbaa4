//! `lua/state_reset.lua`: one item started over, atomically — refused
//! while a task holds the item, else its checkpoint, `{since}` and
//! validators forgotten (or `{since}` set) in the same step.
//!
//! [`Reset`] names the script's KEYS and ARGV and lays them out in the
//! positions its header gives; [`Reset::invoke`] reads the reply into
//! [`Reply`].

use std::sync::LazyLock;

use crate::conn::Conn;

use super::SINCE_TTL;
use crate::conn::Lua;
use crate::keys::KeySpace;
use crate::worker::Holder;

static STATE_RESET: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/state_reset.lua")));

/// `lua/state_reset.lua`'s arguments: one item of one job.
pub(crate) struct Reset {
    /// `KEYS[1]` the item lock, `KEYS[2]` its checkpoint, `KEYS[3]` its
    /// `{since}`, `KEYS[4]` its validators.
    keys: [String; 4],
    /// `ARGV[1]`: the `{since}` to set (epoch s); `None`: forget it.
    since: Option<i64>,
}

/// What the script did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A task holds the item: nothing changed.
    Held(Holder),
    /// Reset; what the item's keys held before (raw: shown as they were).
    Forgot(Forgot),
}

/// What a reset removed (each as stored; `None`: the key was not there).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Forgot {
    /// The checkpoint (JSON).
    pub(crate) checkpoint: Option<String>,
    /// `{since}` (epoch s).
    pub(crate) since: Option<String>,
    /// The validators (JSON).
    pub(crate) validators: Option<String>,
}

impl Forgot {
    /// Whether there was nothing to forget.
    pub(crate) fn is_empty(&self) -> bool {
        self.checkpoint.is_none() && self.since.is_none() && self.validators.is_none()
    }
}

impl Reset {
    /// Start `item` of `job` over; `since`: set `{since}` to it (epoch s)
    /// instead of forgetting it.
    pub(crate) fn new(keys: &KeySpace, job: &str, item: &str, since: Option<i64>) -> Self {
        Reset {
            keys: [
                keys.item_lock(job, item),
                keys.cursor(job, item),
                keys.since(job, item),
                keys.validators(job, item),
            ],
            since,
        }
    }

    /// Runs the script.
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<Reply> {
        let mut call = STATE_RESET.call();
        for key in &self.keys {
            call.key(key);
        }
        call.arg(self.since.map(|s| s.to_string()).unwrap_or_default())
            .arg(SINCE_TTL.as_secs());
        let reply: Vec<String> = call.invoke(conn).await?;
        read_reply(reply)
    }
}

/// The reply as the script's header lays it out; any other shape is a
/// protocol error (a script that is not the one this binary ships).
fn read_reply(reply: Vec<String>) -> redis::RedisResult<Reply> {
    let some = |s: &String| (!s.is_empty()).then(|| s.clone());
    match reply.as_slice() {
        [held, holder] if held == "0" => Ok(Reply::Held(Holder::parse(holder))),
        [done, checkpoint, since, validators] if done == "1" => Ok(Reply::Forgot(Forgot {
            checkpoint: some(checkpoint),
            since: some(since),
            validators: some(validators),
        })),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "protocol error",
            format!("lua/state_reset.lua answered {other:?}, not what its header says"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(v: &[&str]) -> redis::RedisResult<Reply> {
        read_reply(v.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn every_reply_of_the_header_is_read() {
        assert_eq!(
            reply(&["0", "j:1:0#n@h:7"]).ok(),
            Some(Reply::Held(Holder {
                task: "j:1:0".into(),
                host: Some("h:7".into())
            }))
        );
        let Ok(Reply::Forgot(f)) = reply(&["1", "{}", "", ""]) else {
            panic!("not forgot");
        };
        assert_eq!((f.checkpoint.as_deref(), f.since), (Some("{}"), None));
        assert!(reply(&["1", "", "", ""]).is_ok_and(|r| r == Reply::Forgot(Forgot::default())));
        for bad in [&[][..], &["2"], &["0"], &["1", "", ""]] {
            assert!(reply(bad).is_err(), "{bad:?}");
        }
    }
}
