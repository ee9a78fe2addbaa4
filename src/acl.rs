//! What the Redis user may do, and whether it is the user the config says
//! (issue 22, Low 2 and 3). An ACL user without `@scripting` passed `check`
//! and left `run` restarting its worker for ever; a wrong password made
//! `run` wait 30 s and exit 69 as if Redis were down.
//!
//! The permissions are asked of Redis itself, without running anything:
//! one `EVAL` of a script that calls `redis.acl_check_cmd` (Redis 7) for
//! every command the product sends, with keys under the configured prefix
//! (an ACL key pattern such as `~qw:*` is honoured) — the product's own
//! Lua scripts, apalis-redis's, and the commands sent directly. `EVAL`
//! refused is itself the answer (no `@scripting`); `EVALSHA` is tried with
//! a digest no script has (`NOSCRIPT` means allowed).

use std::collections::BTreeSet;
use std::fmt;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::keys::KeySpace;

/// apalis-redis's global registry of queues, outside any prefix: its
/// worker registration script writes it (docs/queue.md).
const APALIS_QUEUES: &str = "core:apalis:queues:list";

/// Every command the product sends, with arguments of the right shape
/// (`{k}`: a key under the prefix; `{q}`: one under the apalis queue's
/// name), and the ACL rule that grants it (a category, or a key pattern).
const NEEDED: &[(&str, &str)] = &[
    // A user given only the prefix's keys (`~qw:*`) passes every other
    // check, then fails the worker's heartbeat for ever.
    (
        "~core:apalis:queues:list",
        "ZADD core:apalis:queues:list GT 1 m",
    ),
    ("+@scripting", "SCRIPT LOAD return"),
    ("+@connection", "PING"),
    // Whether the server is the master, at every (re)connection (conn/master.rs).
    ("+@connection", "HELLO"),
    ("+@fast", "TIME"),
    ("+@keyspace", "SCAN 0"),
    ("+@keyspace", "DEL {k}"),
    ("+@keyspace", "UNLINK {k}"),
    ("+@keyspace", "EXISTS {k}"),
    ("+@keyspace", "EXPIRE {k} 1"),
    ("+@keyspace", "PEXPIRE {k} 1"),
    ("+@keyspace", "PTTL {k}"),
    ("+@string", "GET {k}"),
    ("+@string", "MGET {k}"),
    ("+@string", "SET {k} v"),
    ("+@string", "SETNX {q} v"),
    ("+@bitmap", "BITFIELD {k} GET u8 0"),
    ("+@hash", "HGET {k} f"),
    ("+@hash", "HMGET {k} f"),
    ("+@hash", "HGETALL {k}"),
    ("+@hash", "HKEYS {k}"),
    ("+@hash", "HLEN {k}"),
    ("+@hash", "HEXISTS {k} f"),
    ("+@hash", "HSET {k} f v"),
    ("+@hash", "HMSET {q} f v"),
    ("+@hash", "HSETNX {k} f v"),
    ("+@hash", "HINCRBY {k} f 1"),
    ("+@hash", "HDEL {k} f"),
    ("+@hash", "HSCAN {k} 0"),
    ("+@list", "LLEN {q}"),
    ("+@list", "LPUSH {q} v"),
    ("+@list", "RPUSH {q} v"),
    ("+@list", "LRANGE {q} 0 -1"),
    ("+@list", "LREM {q} 0 v"),
    ("+@list", "LTRIM {q} 0 -1"),
    ("+@set", "SADD {q} v"),
    ("+@set", "SREM {k} v"),
    ("+@set", "SCARD {q}"),
    ("+@set", "SISMEMBER {q} v"),
    ("+@set", "SMEMBERS {q}"),
    ("+@set", "SSCAN {k} 0"),
    ("+@sortedset", "ZADD {k} 1 m"),
    ("+@sortedset", "ZCARD {k}"),
    ("+@sortedset", "ZCOUNT {q} 0 1"),
    ("+@sortedset", "ZRANGE {k} 0 -1"),
    ("+@sortedset", "ZRANGEBYSCORE {k} 0 1"),
    ("+@sortedset", "ZREVRANGE {q} 0 -1"),
    ("+@sortedset", "ZREVRANGEBYSCORE {k} 1 0"),
    ("+@sortedset", "ZSCORE {k} m"),
    ("+@sortedset", "ZREM {k} m"),
    ("+@sortedset", "ZREMRANGEBYRANK {k} 0 1"),
    ("+@sortedset", "ZREMRANGEBYSCORE {k} 0 1"),
    ("+@stream", "XADD {k} 1-1 f v"),
    ("+@stream", "XRANGE {k} - +"),
    ("+@stream", "XREVRANGE {k} + -"),
    ("+@stream", "XTRIM {k} MAXLEN 0"),
    // An idle daemon waits on its wake stream; `trigger --wait` on a
    // tick's stream of ends.
    ("+@stream", "XREAD BLOCK 1 STREAMS {k} $"),
    // A run's checkpoint (worker/run.rs save).
    ("+@string", "SETEX {k} 1 v"),
    // apalis-redis's scripts announce tasks on channels `tasks:<key>:…`.
    ("+@pubsub &tasks:*", "PUBLISH tasks:{q}:available x"),
];

/// With `[redis] quota_replicas`: each spend waits for a replica.
const NEEDED_WITH_REPLICAS: (&str, &str) = ("+@connection", "WAIT 1 0");

/// The spend core as a function library (Redis 7): asking whether it is
/// loaded, loading it, calling it. Not required: without them the spend
/// core runs by `EVALSHA`, which costs Redis more per call ([`functions`]).
const WANTED: &[(&str, &str)] = &[
    ("+@scripting", "FUNCTION LIST"),
    ("+@scripting", "FUNCTION LOAD x"),
    ("+@scripting", "FCALL f 1 {k}"),
];

/// Asks `redis.acl_check_cmd` about each spec in ARGV (words separated by
/// a unit separator, `{k}` and `{q}` in them replaced by KEYS[1] and
/// KEYS[2]); returns the (1-based) index of each refused one.
const PROBE: &str = r"
local missing = {}
for i = 1, #ARGV do
  local words = {}
  for w in string.gmatch(ARGV[i], '[^\31]+') do
    -- Functions as replacements: a key's '%' stays literal.
    w = w:gsub('{k}', function() return KEYS[1] end)
    w = w:gsub('{q}', function() return KEYS[2] end)
    words[#words + 1] = w
  end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(words))
  if not ok or not allowed then
    missing[#missing + 1] = i
  end
end
return missing
";

/// A command the user may not run, and the rule that would grant it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Missing {
    /// `EVAL`, `XADD`, `SCRIPT LOAD`, `ZADD core:apalis:queues:list`.
    pub(crate) command: String,
    /// `+@scripting`, `+@stream`, `~core:apalis:queues:list`.
    pub(crate) grant: &'static str,
}

/// What the user may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Access {
    /// Everything the product sends.
    Granted,
    /// Not these.
    Missing(Vec<Missing>),
    /// Could not be told (a Redis before 7 has no `acl_check_cmd`): not a
    /// refusal; `run` finds out at the first command.
    Unknown(String),
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Access::Granted => {
                f.write_str("the Redis user may run every command quota-worker sends")
            }
            Access::Unknown(why) => {
                write!(f, "the Redis user's permissions could not be read ({why})")
            }
            Access::Missing(missing) => {
                let commands: Vec<&str> = missing.iter().map(|m| m.command.as_str()).collect();
                let mut grant: Vec<&str> = missing.iter().map(|m| m.grant).collect();
                grant.sort_unstable();
                grant.dedup();
                write!(
                    f,
                    "the Redis user may not run {} (quota-worker needs them): grant them, e.g. ACL SETUSER <user> {}, and keys under the key prefix",
                    commands.join(", "),
                    grant.join(" ")
                )
            }
        }
    }
}

/// What the user of `conn` may do, for keys under `prefix` (`[redis]
/// key_prefix`); `replicas`: `[redis] quota_replicas` is on.
pub(crate) async fn access<C: ConnectionLike + Send>(
    conn: &mut C,
    prefix: &str,
    replicas: bool,
) -> Result<Access, RedisError> {
    let mut specs: Vec<(&str, &str)> = NEEDED.to_vec();
    if replicas {
        specs.push(NEEDED_WITH_REPLICAS);
    }
    let probe_key = format!("{prefix}:acl-probe");
    let queue_key = format!("{}:acl-probe", KeySpace::new(prefix).queue());
    access_with(conn, &specs, [&probe_key, &queue_key]).await
}

/// What the user of `conn`, a Redis Cluster of `[redis] quota_nodes`, may
/// do of what the windows need: the commands the windows' scripts call
/// (found in their source, so a command added there is asked about without
/// a second list to keep), the status page's reads, and `WAIT` with
/// `replicas`. Asked of the master of one slot: a cluster's ACL users are
/// set per node, and an operator sets them alike on every node.
pub(crate) async fn access_windows<C: ConnectionLike + Send>(
    conn: &mut C,
    prefix: &str,
    replicas: bool,
) -> Result<Access, RedisError> {
    let mut called = BTreeSet::new();
    for script in crate::quota::SCRIPTS {
        commands_in(script, &["call('", "call(\""], &mut called);
    }
    // Besides the scripts: loading them, the status page's reads (TIME, GET
    // of the rings), the connection's PING.
    called.extend(["SCRIPT", "PING", "TIME", "GET"].map(str::to_owned));
    let mut specs: Vec<(&str, &str)> = (NEEDED.iter())
        .filter(|(_, spec)| called.contains(spec.split(' ').next().unwrap_or("")))
        .copied()
        .collect();
    if replicas {
        specs.push(NEEDED_WITH_REPLICAS);
    }
    // Both keys in one slot: a cluster runs a script's keys on one node.
    let probe_key = format!("{prefix}:{{acl-probe}}:w");
    let other_key = format!("{prefix}:{{acl-probe}}:q");
    access_with(conn, &specs, [&probe_key, &other_key]).await
}

/// Whether the user of `conn` may load and call the spend core's function
/// library, for keys under `prefix` (both keys in one slot, as a cluster's
/// call has them). `Missing`: spends run by `EVALSHA` instead, which works
/// and costs Redis more per call ([`slower`] says so).
pub(crate) async fn functions<C: ConnectionLike + Send>(
    conn: &mut C,
    prefix: &str,
) -> Result<Access, RedisError> {
    let probe_key = format!("{prefix}:{{acl-probe}}:w");
    let other_key = format!("{prefix}:{{acl-probe}}:q");
    access_with(conn, WANTED, [&probe_key, &other_key]).await
}

/// What to tell a user that may not run the library's commands (`missing`,
/// from [`functions`]): not an error.
pub(crate) fn slower(missing: &[Missing]) -> String {
    let commands: Vec<&str> = missing.iter().map(|m| m.command.as_str()).collect();
    format!(
        "the Redis user may not run {}: quota-worker spends by EVALSHA instead, which works and costs Redis more per call; for the function library (FCALL) grant them, e.g. ACL SETUSER <user> +fcall +function",
        commands.join(", ")
    )
}

/// The command names in `text` at each of `openers` (`call('` and the
/// like): the word up to the closing quote, upper-cased.
pub(crate) fn commands_in(text: &str, openers: &[&str], found: &mut BTreeSet<String>) {
    for opener in openers {
        for (at, _) in text.match_indices(opener) {
            let rest = &text[at + opener.len()..];
            let word: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            let closed = rest[word.len()..].starts_with(['\'', '"']);
            if closed && !word.is_empty() {
                found.insert(word.to_ascii_uppercase());
            }
        }
    }
}

/// Asks whether the user of `conn` may run each of `specs` (`{k}` and `{q}`
/// in them: `keys`).
async fn access_with<C: ConnectionLike + Send>(
    conn: &mut C,
    specs: &[(&'static str, &'static str)],
    [probe_key, queue_key]: [&str; 2],
) -> Result<Access, RedisError> {
    let mut missing = Vec::new();
    // EVALSHA with a digest no script has: NOSCRIPT if it may run.
    let evalsha = redis::cmd("EVALSHA")
        .arg("0".repeat(40))
        .arg(0)
        .query_async::<redis::Value>(conn)
        .await;
    if let Err(e) = evalsha
        && refused(&e)
    {
        missing.push(Missing {
            command: "EVALSHA".into(),
            grant: "+@scripting",
        });
    }
    let mut eval = redis::cmd("EVAL");
    eval.arg(PROBE).arg(2).arg(probe_key).arg(queue_key);
    for (_, spec) in specs {
        eval.arg(spec.replace(' ', "\u{1f}"));
    }
    match eval.query_async::<Vec<usize>>(conn).await {
        Ok(refused) => missing.extend(refused.into_iter().filter_map(|i| {
            let (grant, spec) = specs.get(i.checked_sub(1)?)?;
            Some(Missing {
                command: command_of(spec),
                grant,
            })
        })),
        Err(e) if refused(&e) => missing.insert(
            0,
            Missing {
                command: "EVAL".into(),
                grant: "+@scripting",
            },
        ),
        // The script ran and failed: not an answer about permissions.
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError) => {
            return Ok(Access::Unknown(e.to_string()));
        }
        Err(e) => return Err(e),
    }
    Ok(if missing.is_empty() {
        Access::Granted
    } else {
        Access::Missing(missing)
    })
}

/// `SCRIPT LOAD return` → `SCRIPT LOAD`; `XADD {k} …` → `XADD`; a command
/// on apalis's global key keeps the key (`ZADD core:apalis:queues:list`).
fn command_of(spec: &str) -> String {
    let mut words = spec.split(' ');
    let first = words.next().unwrap_or_default();
    match (first, words.next()) {
        ("SCRIPT" | "FUNCTION", Some(sub)) => format!("{first} {sub}"),
        (_, Some(APALIS_QUEUES)) => format!("{first} {APALIS_QUEUES}"),
        _ => first.to_owned(),
    }
}

/// Whether Redis refused the command for the user's permissions.
fn refused(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
}

/// What to say when Redis at `url` refused the credentials: `e` and the fix.
pub(crate) fn refused_credentials(url: &impl fmt::Display, e: &RedisError) -> String {
    format!(
        "Redis at {url} refused the credentials of [redis] url ({e}): fix its user name or password"
    )
}

pub(crate) use crate::conn::is_auth_failure;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::{NEEDED, NEEDED_WITH_REPLICAS, WANTED, commands_in};

    /// Commands sent that the check deliberately does not ask about, and why.
    const NOT_ASKED: &[(&str, &str)] = &[
        ("EVAL", "asked by the probe itself (it is an EVAL)"),
        ("EVALSHA", "asked as SCRIPT LOAD: the same @scripting"),
        (
            "CONFIG",
            "not required: without it the eviction policy is logged unread",
        ),
        (
            "CLUSTER",
            "only with [redis] quota_nodes, whose user is not asked",
        ),
        ("INFO", "the embedded Redis only, as its own default user"),
        (
            "SENTINEL",
            "sent to the sentinels, whose users are not the master's (docs/redis.md names what they need)",
        ),
        (
            "ROLE",
            "not required: asked only where HELLO is unknown, and a refusal is let through",
        ),
        (
            "SHUTDOWN",
            "the embedded Redis only, as its own default user",
        ),
    ];

    fn walk(dir: &Path, ext: &str, each: &mut dyn FnMut(&str)) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, ext, each);
            } else if path.extension().is_some_and(|e| e == ext) {
                each(&std::fs::read_to_string(&path).expect("read"));
            }
        }
    }

    /// The upkeep rule ("a new Redis command goes into NEEDED"), checked:
    /// every command our Lua scripts call and every `redis::cmd("…")` in
    /// `src/` is asked about, or listed above with the reason it is not.
    /// (Commands sent through redis-rs's typed methods, `hgetall` and the
    /// like, are not found here; they are few and in NEEDED.)
    #[test]
    fn every_command_the_product_sends_is_asked_about() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut sent = BTreeSet::new();
        walk(&root.join("lua"), "lua", &mut |text| {
            commands_in(text, &["call('", "call(\""], &mut sent);
        });
        walk(&root.join("src"), "rs", &mut |text| {
            commands_in(text, &["cmd(\""], &mut sent);
        });
        assert!(sent.len() > 30, "the scan found too little: {sent:?}");
        let asked: BTreeSet<String> = (NEEDED.iter().chain([&NEEDED_WITH_REPLICAS]).chain(WANTED))
            .map(|(_, spec)| spec.split(' ').next().unwrap_or("").to_owned())
            .chain(NOT_ASKED.iter().map(|(c, _)| (*c).to_owned()))
            .collect();
        let missing: Vec<&String> = sent.difference(&asked).collect();
        assert!(
            missing.is_empty(),
            "sent but not in acl::NEEDED (add each with the ACL rule that grants it): {missing:?}"
        );
    }
}
