//! Connecting to Redis: [`Conn`], a connection to the master that follows
//! it through a failover (`follow`), found where the config says
//! ([`Master`]: a URL's host, or what the sentinels name); and [`Lua`],
//! how the product runs its scripts.

mod follow;
mod master;

use std::time::Duration;

pub use follow::{Conn, MAX_BACKOFF, NotReady, Reason, Timeouts};
pub use master::{Master, Sentinels};

/// Connects to `master` now. Each command times out after `timeout`, each
/// connection attempt too, and a call waits for a master at most that long.
pub async fn connect(
    master: &Master,
    timeout: Duration,
    label: &'static str,
) -> Result<Conn, redis::RedisError> {
    Conn::connect(master, Timeouts::both(timeout), label).await
}

/// Like [`connect`], but connects on first use: an unreachable Redis surfaces
/// as the first command's error, where the caller's policy handles it.
pub(crate) fn connect_lazy(master: &Master, timeout: Duration, label: &'static str) -> Conn {
    Conn::lazy(master, Timeouts::both(timeout), label)
}

/// A Lua script run in one round trip: `EVALSHA`, and on NOSCRIPT (a
/// restarted Redis, a failover, `SCRIPT FLUSH`) `EVAL` with the source, which
/// caches it again. redis-rs's own fallback (`SCRIPT LOAD`, then `EVALSHA`
/// again) fails the call when a flush lands between its two commands.
#[derive(Debug)]
pub struct Lua {
    source: &'static str,
    sha: String,
}

impl Lua {
    /// A script from its source (usually `include_str!("../lua/NAME.lua")`).
    pub fn new(source: &'static str) -> Self {
        Lua {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// Its source.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// Its SHA1, as `EVALSHA` names it.
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// Starts a call.
    pub fn call(&self) -> LuaCall<'_> {
        LuaCall {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Lua`] script: its keys and arguments.
#[derive(Debug)]
pub struct LuaCall<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl LuaCall<'_> {
    /// Adds a key.
    pub fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// Adds an argument.
    pub fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    fn command(&self, name: &str, script: &str) -> redis::Cmd {
        let mut c = redis::cmd(name);
        c.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        c
    }

    /// Runs it.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> redis::RedisResult<T> {
        match self
            .command("EVALSHA", &self.lua.sha)
            .query_async(conn)
            .await
        {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.command("EVAL", self.lua.source)
                    .query_async(conn)
                    .await
            }
            reply => reply,
        }
    }

    /// Runs it and then `then`, as one pipeline on one connection (one write,
    /// one round trip; a cluster sends the pipeline to the node that owns the
    /// script's first key). For a command whose meaning depends on what this
    /// connection ran just before it, such as `WAIT`. On NOSCRIPT both run
    /// again with `EVAL`. Returns the script's reply and `then`'s.
    pub async fn invoke_then(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        then: &redis::Cmd,
    ) -> redis::RedisResult<(redis::Value, redis::RedisResult<redis::Value>)> {
        let run = |script: redis::Cmd| {
            let mut p = redis::pipe();
            p.add_command(script)
                .add_command(then.clone())
                .ignore_errors();
            p
        };
        let replies = |r: Vec<redis::RedisResult<redis::Value>>| {
            let mut r = r.into_iter();
            match (r.next(), r.next()) {
                (Some(script), Some(then)) => Ok((script, then)),
                _ => Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "a two-command pipeline answered fewer than two replies",
                ))),
            }
        };
        let evalsha = run(self.command("EVALSHA", &self.lua.sha));
        let (script, then) = replies(evalsha.query_async(conn).await?)?;
        match script {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let eval = run(self.command("EVAL", self.lua.source));
                let (script, then) = replies(eval.query_async(conn).await?)?;
                Ok((script?, then))
            }
            script => Ok((script?, then)),
        }
    }
}
