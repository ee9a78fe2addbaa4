//! Connecting to Redis: [`Conn`], a connection to the master that follows
//! it through a failover (`follow`), found where the config says
//! ([`Master`]: a URL's host, or what the sentinels name); and running Lua
//! on it: a script by `EVALSHA` ([`Lua`]), or a function of a library by
//! `FCALL` ([`Library`]), loaded where it is missing, on every call's path,
//! so a new Redis, a failover, a restart or `FUNCTION FLUSH` costs no
//! failed call.

mod follow;
mod master;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisResult, ServerErrorKind};

pub use follow::{Conn, MAX_BACKOFF, NotReady, Reason, Timeouts};
pub use master::{Master, Sentinels};

/// Whether connecting failed because Redis does not take the credentials
/// (a wrong password, none where one is needed): a config error, not an
/// outage. Decided by redis-rs's kind and the server's error code, never by
/// its text.
pub(crate) fn is_auth_failure(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
}

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
    ) -> RedisResult<T> {
        match self
            .command("EVALSHA", &self.lua.sha)
            .query_async(conn)
            .await
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
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
    ) -> RedisResult<(redis::Value, RedisResult<redis::Value>)> {
        let (script, after) = pipelined(conn, self.command("EVALSHA", &self.lua.sha), then).await?;
        match script {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let eval = self.command("EVAL", self.lua.source);
                let (script, after) = pipelined(conn, eval, then).await?;
                Ok((script?, after))
            }
            script => Ok((script?, after)),
        }
    }
}

/// Whether the Redis behind a connection runs a [`Library`] by `FCALL`,
/// learnt at its first call and shared by the connection's clones: yes
/// (Redis 7 and later), or no, and then its functions run as their one
/// script by `EVALSHA` (Redis 6, or a user who may not run `FUNCTION` or
/// `FCALL`).
#[derive(Debug, Clone, Default)]
pub struct Functions(Arc<AtomicU8>);

/// [`Functions`]' states.
const UNKNOWN: u8 = 0;
const FCALL: u8 = 1;
const EVALSHA: u8 = 2;

impl Functions {
    /// Whether the last call ran by `FCALL` (`None`: no call yet).
    pub fn fcall(&self) -> Option<bool> {
        match self.0.load(Ordering::Relaxed) {
            UNKNOWN => None,
            FCALL => Some(true),
            _ => Some(false),
        }
    }

    fn set(&self, fcall: bool, why: Option<&redis::RedisError>) {
        let was = self
            .0
            .swap(if fcall { FCALL } else { EVALSHA }, Ordering::Relaxed);
        if !fcall && was != EVALSHA {
            tracing::warn!(
                error = why.map(tracing::field::display),
                "this Redis does not run Redis functions for quota-worker (a Redis before 7, or a user without FUNCTION and FCALL): its scripts run by EVALSHA, which costs Redis more per call (docs/redis.md)"
            );
        }
    }
}

/// A connection that can tell whether a [`Library`] is loaded where its
/// calls run, and load it there: one Redis, or every master of a cluster.
pub trait FunctionHost: redis::aio::ConnectionLike + Send {
    /// Whether every node a call may reach holds library `name`; an error
    /// from Redis when it may not be asked (a Redis before 7 has no
    /// `FUNCTION`; a user may lack it).
    fn holds_library(&mut self, name: &str) -> impl Future<Output = RedisResult<bool>> + Send;

    /// Loads `source` (`FUNCTION LOAD REPLACE`) on every such node.
    fn load_library(&mut self, source: &str) -> impl Future<Output = RedisResult<()>> + Send;
}

/// `FUNCTION LIST LIBRARYNAME name` on one Redis: whether it holds it.
pub(crate) async fn holds_library(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    name: &str,
) -> RedisResult<bool> {
    let found: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(name)
        .query_async(conn)
        .await?;
    Ok(matches!(found, redis::Value::Array(libs) if !libs.is_empty()))
}

/// `FUNCTION LOAD REPLACE source` (on a cluster, redis-rs sends it to every
/// master). REPLACE: a library of this name is this text, so replacing it
/// is harmless, and two processes that load at once both succeed.
pub(crate) async fn load_library(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    source: &str,
) -> RedisResult<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(source)
        .query_async::<redis::Value>(conn)
        .await
        .map(drop)
}

impl FunctionHost for Conn {
    async fn holds_library(&mut self, name: &str) -> RedisResult<bool> {
        holds_library(self, name).await
    }

    async fn load_library(&mut self, source: &str) -> RedisResult<()> {
        load_library(self, source).await
    }
}

/// A plain connection manager (the benchmarks' baseline) runs libraries too.
impl FunctionHost for ConnectionManager {
    async fn holds_library(&mut self, name: &str) -> RedisResult<bool> {
        holds_library(self, name).await
    }

    async fn load_library(&mut self, source: &str) -> RedisResult<()> {
        load_library(self, source).await
    }
}

/// A Redis function library (`FUNCTION LOAD`): Lua that registers one
/// function per operation, under a name that carries its version (a hash
/// of its text), so that two versions of quota-worker can run side by side
/// on one Redis during a rolling deploy, each calling its own.
#[derive(Debug)]
pub struct Library {
    name: String,
    source: String,
}

impl Library {
    /// The library `<prefix>_<version>` of Lua `body`, which registers its
    /// functions as `LIBRARY .. '_<op>'` (the text starts with the
    /// `#!lua name=…` line and defines `LIBRARY`, the name).
    pub fn new(prefix: &str, body: &str) -> Self {
        let digest = sha1_smol::Sha1::from(body).digest().to_string();
        let name = format!("{prefix}_{}", &digest[..12]);
        let source = format!("#!lua name={name}\nlocal LIBRARY = '{name}'\n{body}");
        Library { name, source }
    }

    /// Its name (`qw_<version>`), as `FUNCTION LIST` shows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its text, as `FUNCTION LOAD` takes it.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Its function `op`, which runs as `script` (the same operation, the
    /// same KEYS and ARGV) where Redis runs no functions.
    pub fn function(&'static self, op: &str, script: &'static Lua) -> Function {
        Function {
            library: self,
            name: format!("{}_{op}", self.name),
            script,
        }
    }
}

/// One function of a [`Library`], with the script that stands in for it.
#[derive(Debug)]
pub struct Function {
    library: &'static Library,
    name: String,
    script: &'static Lua,
}

impl Function {
    /// Its name, as `FCALL` takes it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The script that runs it where Redis runs no functions.
    pub fn script(&self) -> &'static Lua {
        self.script
    }

    /// Its library.
    pub fn library(&self) -> &'static Library {
        self.library
    }

    /// Starts a call.
    pub fn call(&self) -> FnCall<'_> {
        FnCall {
            function: self,
            call: self.script.call(),
        }
    }
}

/// One call of a [`Function`]: its keys and arguments, run by `FCALL` where
/// Redis runs functions (the library loaded first where it is missing: a
/// new Redis, a failover, a restart, `FUNCTION FLUSH`), else by `EVALSHA`.
#[derive(Debug)]
pub struct FnCall<'a> {
    function: &'a Function,
    call: LuaCall<'a>,
}

impl FnCall<'_> {
    /// Adds a key.
    pub fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        self.call.key(key);
        self
    }

    /// Adds an argument.
    pub fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.call.arg(arg);
        self
    }

    /// Its keys and arguments as `FCALL` takes them.
    fn fcall(&self) -> redis::Cmd {
        self.call.command("FCALL", &self.function.name)
    }

    /// Whether `how` (learnt, or learnt now) runs it by `FCALL`; loads the
    /// library where it is missing. An error only when Redis could not be
    /// asked (the connection's).
    async fn ready(&self, conn: &mut impl FunctionHost, how: &Functions) -> RedisResult<bool> {
        if let Some(fcall) = how.fcall() {
            return Ok(fcall);
        }
        self.load_if_missing(conn, how)
            .await
            .map(|_| how.fcall() == Some(true))
    }

    /// Asks whether the library is where the call runs and loads it where
    /// not. Returns whether it loaded it; learns in `how` whether Redis runs
    /// functions at all (a refusal of `FUNCTION`: not).
    async fn load_if_missing(
        &self,
        conn: &mut impl FunctionHost,
        how: &Functions,
    ) -> RedisResult<bool> {
        let library = self.function.library;
        let loaded = match conn.holds_library(&library.name).await {
            Ok(true) => false,
            Ok(false) => match conn.load_library(&library.source).await {
                Ok(()) => true,
                Err(e) if is_refusal(&e) => {
                    how.set(false, Some(&e));
                    return Ok(false);
                }
                Err(e) => return Err(e),
            },
            Err(e) if is_refusal(&e) => {
                how.set(false, Some(&e));
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        how.set(true, None);
        Ok(loaded)
    }

    /// Runs it.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        conn: &mut impl FunctionHost,
        how: &Functions,
    ) -> RedisResult<T> {
        if !self.ready(conn, how).await? {
            return self.call.invoke(conn).await;
        }
        match self.fcall().query_async(conn).await {
            Err(e) if is_refusal(&e) => match self.retry_after(conn, how, &e).await? {
                Retry::Fcall => match self.fcall().query_async(conn).await {
                    // Refused again (flushed again before the call, or the
                    // function's own error): this call runs as the script,
                    // whose answer stands either way.
                    Err(e) if is_refusal(&e) => self.call.invoke(conn).await,
                    reply => reply,
                },
                Retry::Evalsha => self.call.invoke(conn).await,
            },
            reply => reply,
        }
    }

    /// Runs it and then `then`, as one pipeline on one connection, like
    /// [`LuaCall::invoke_then`]; a call that must load the library first
    /// runs both again.
    pub async fn invoke_then(
        &self,
        conn: &mut impl FunctionHost,
        how: &Functions,
        then: &redis::Cmd,
    ) -> RedisResult<(redis::Value, RedisResult<redis::Value>)> {
        if !self.ready(conn, how).await? {
            return self.call.invoke_then(conn, then).await;
        }
        let (reply, after) = pipelined(conn, self.fcall(), then).await?;
        match reply {
            Err(e) if is_refusal(&e) => match self.retry_after(conn, how, &e).await? {
                Retry::Fcall => match pipelined(conn, self.fcall(), then).await? {
                    (Err(e), _) if is_refusal(&e) => self.call.invoke_then(conn, then).await,
                    (reply, after) => Ok((reply?, after)),
                },
                Retry::Evalsha => self.call.invoke_then(conn, then).await,
            },
            reply => Ok((reply?, after)),
        }
    }

    /// What to do after `FCALL` answered `e`: call again, the library
    /// loaded where it was missing (a failover, a restart, `FUNCTION
    /// FLUSH`; or found there: loaded by another process meanwhile, or the
    /// function's own error, which the calls that follow answer again), or
    /// run the script (`FCALL` refused).
    async fn retry_after(
        &self,
        conn: &mut impl FunctionHost,
        how: &Functions,
        e: &redis::RedisError,
    ) -> RedisResult<Retry> {
        if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
            how.set(false, Some(e));
            return Ok(Retry::Evalsha);
        }
        self.load_if_missing(conn, how).await?;
        Ok(match how.fcall() {
            Some(false) => Retry::Evalsha,
            _ => Retry::Fcall,
        })
    }
}

/// What a failed `FCALL` leads to ([`FnCall::retry_after`]).
enum Retry {
    Fcall,
    Evalsha,
}

/// Whether Redis answered `e` (an error reply, not a lost connection):
/// where the library may be missing or functions refused.
fn is_refusal(e: &redis::RedisError) -> bool {
    e.code().is_some() && matches!(e.retry_method(), redis::RetryMethod::NoRetry)
}

/// `script` then `then`, pipelined: both replies.
async fn pipelined(
    conn: &mut impl redis::aio::ConnectionLike,
    script: redis::Cmd,
    then: &redis::Cmd,
) -> RedisResult<(RedisResult<redis::Value>, RedisResult<redis::Value>)> {
    let mut p = redis::pipe();
    p.add_command(script)
        .add_command(then.clone())
        .ignore_errors();
    let mut r = p
        .query_async::<Vec<RedisResult<redis::Value>>>(conn)
        .await?
        .into_iter();
    match (r.next(), r.next()) {
        (Some(script), Some(then)) => Ok((script, then)),
        _ => Err(redis::RedisError::from((
            ErrorKind::Client,
            "a two-command pipeline answered fewer than two replies",
        ))),
    }
}
