//! `lua/enqueue.lua`: tasks into our backlog (retries, deferrals, busy
//! copies), each to run after its delay on Redis's clock.

use std::sync::LazyLock;
use std::time::Duration;

use crate::conn::Conn;

use crate::conn::Lua;
use crate::keys::KeySpace;
use crate::queue::task::TaskArgs;

static ENQUEUE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../../lua/enqueue.lua")));

/// `lua/enqueue.lua`'s arguments.
pub(crate) struct Enqueue {
    /// `KEYS[1]` the backlog (zset), `KEYS[2]` its payloads (hash),
    /// `KEYS[3]` the wake stream.
    keys: [String; 3],
    /// ARGV: per task, its id, its delay (ms) and its payload (JSON).
    tasks: Vec<(String, u64, String)>,
}

impl Enqueue {
    /// `tasks`, each after its delay. `Err`: a task that does not serialize.
    pub(crate) fn new(
        keys: &KeySpace,
        tasks: &[(TaskArgs, Duration)],
    ) -> Result<Self, serde_json::Error> {
        let tasks = (tasks.iter())
            .map(|(t, delay)| {
                Ok((
                    t.id.clone(),
                    delay.as_millis() as u64,
                    serde_json::to_string(t)?,
                ))
            })
            .collect::<Result<_, serde_json::Error>>()?;
        Ok(Enqueue {
            keys: [keys.backlog(), keys.backlog_data(), keys.wake()],
            tasks,
        })
    }

    /// Runs the script: how many tasks were added (an id already waiting
    /// is kept as it is).
    pub(crate) async fn invoke(&self, conn: &mut Conn) -> redis::RedisResult<usize> {
        let mut call = ENQUEUE.call();
        for key in &self.keys {
            call.key(key);
        }
        for (id, delay_ms, payload) in &self.tasks {
            call.arg(id).arg(delay_ms).arg(payload);
        }
        let n: i64 = call.invoke(conn).await?;
        Ok(n.max(0) as usize)
    }
}
