//! [`Conn`]: a connection to the Redis master that follows it through a
//! failover. redis-rs's `ConnectionManager` reconnects only after an I/O
//! error, and to the same address: a master demoted under it (`READONLY`
//! for ever, redis-rs #1438) or a managed Redis whose name moved kept the
//! daemon on the old server until a restart.
//!
//! One multiplexed connection, shared by every clone. What each reply says
//! decides what happens to it:
//!
//! - `READONLY`, `MASTERDOWN`, `LOADING` (and `UNBLOCKED`, a blocked read
//!   cut by a demotion): the server refused the command without running it.
//!   The connection is dropped, the master found again ([`Master::open`]),
//!   and the command sent again on the new connection, as long as the
//!   call's patience lasts;
//! - the connection lost, or no answer in time: the connection is dropped
//!   and made again, but the command is not sent again (it may have run);
//!   its error goes to the caller, whose own retry is built for that;
//! - anything else is the caller's.
//!
//! Reconnecting runs on a task of its own, one per connection, with a
//! backoff from 100 ms doubling to at most 5 s, until a master answers;
//! calls meanwhile wait for it up to their patience, and then fail with
//! the last reason. Each dropped connection counts once in
//! `qw_redis_reconnects_total{reason}`.
//!
//! About 740 lines: one connection's states (up, dropped, reconnecting) and
//! every path between them are read together here, on purpose; how the
//! master is found is [`super::master`], the `WAIT` acknowledgements a
//! small part of [`Conn`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::master::{Master, Role, role};

/// The longest wait between two attempts to reach the master.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The first wait after a failed attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Why a connection was dropped: the `reason` of
/// `qw_redis_reconnects_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The connection closed or failed.
    Lost,
    /// The server did not answer within the response timeout.
    Timeout,
    /// `READONLY`: a write reached a replica (a demoted master).
    ReadOnly,
    /// `MASTERDOWN`: a replica that lost its master.
    MasterDown,
    /// `LOADING`: a server still loading its data.
    Loading,
    /// The server says it is a replica (a readiness probe, or a blocked
    /// read it cut with `UNBLOCKED` when it was demoted).
    Demoted,
    /// The sentinels announced another master (`+switch-master`).
    Switched,
}

impl Reason {
    /// As the metric labels it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Lost => "lost",
            Reason::Timeout => "timeout",
            Reason::ReadOnly => "readonly",
            Reason::MasterDown => "masterdown",
            Reason::Loading => "loading",
            Reason::Demoted => "demoted",
            Reason::Switched => "switched",
        }
    }

    /// Every reason, for zeroed series.
    pub const ALL: [Reason; 7] = [
        Reason::Lost,
        Reason::Timeout,
        Reason::ReadOnly,
        Reason::MasterDown,
        Reason::Loading,
        Reason::Demoted,
        Reason::Switched,
    ];
}

/// The connection's state, as every clone sees it.
#[derive(Clone)]
enum Link {
    /// Connected to the master at `at`; `generation` counts connections.
    Up {
        generation: u64,
        conn: MultiplexedConnection,
        at: String,
    },
    /// No connection: since when, why, and the last attempt's error.
    Down {
        generation: u64,
        since: Instant,
        reason: Option<Reason>,
        error: Option<RedisError>,
    },
}

impl Link {
    fn generation(&self) -> u64 {
        match self {
            Link::Up { generation, .. } | Link::Down { generation, .. } => *generation,
        }
    }
}

/// What every clone of one [`Conn`] shares.
struct Shared {
    master: Master,
    config: AsyncConnectionConfig,
    /// Which of the process's connections, for the logs.
    label: &'static str,
    link: watch::Sender<Link>,
    /// A reconnecting task runs.
    reconnecting: AtomicBool,
    db: i64,
    timeouts: Timeouts,
    /// Writes that wait for replicas ([`Conn::acked`]), and the
    /// connections of their own they go on. Set once, at the start.
    acked: std::sync::OnceLock<Arc<AckPool>>,
}

/// The connections acknowledged writes go on, each carrying one write at a
/// time: a `WAIT` holds its connection until the replica answers (up to its
/// timeout, when none is in sync, as right after a failover), and nothing
/// may queue behind it: neither the rest of the traffic (apalis's
/// heartbeats, on the main connection) nor the other acknowledged writes
/// (a tick's claim behind every task's checkpoint). Each connects at its
/// first use.
struct AckPool {
    acks: Acks,
    conns: Vec<Conn>,
    free: std::sync::Mutex<Vec<usize>>,
    permits: tokio::sync::Semaphore,
}

impl AckPool {
    /// Sends `cmd` followed by `WAIT` on a free connection of the pool.
    async fn send(&self, cmd: &Cmd, patience: Duration) -> RedisResult<Value> {
        let _permit = self.permits.acquire().await.map_err(|_| {
            RedisError::from((ErrorKind::Client, "the acknowledged writes' pool is closed"))
        })?;
        let taken = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let Some(i) = taken else {
            unreachable!("a permit is held for each free connection");
        };
        // Given back however the call ends (it may be cancelled).
        let _back = GiveBack(self, i);
        self.conns[i]
            .patient(patience)
            .send_acked(cmd, self.acks)
            .await
    }
}

/// Returns a pool connection to the free list when dropped.
struct GiveBack<'a>(&'a AckPool, usize);

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        self.0
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(self.1);
    }
}

/// Writes that wait for replicas ([`Conn::acked`]).
#[derive(Debug, Clone, Copy)]
struct Acks {
    replicas: u8,
    wait: Duration,
}

/// A connection to the Redis master that follows it (see the module's
/// doc). Cloning is cheap; clones share the connection.
#[derive(Clone)]
pub struct Conn(Arc<Handle>);

/// One way of using the shared connection. Behind its own `Arc` so that a
/// [`Conn`] is one pointer: it is held in values moved around a lot (the
/// limiter in every spend).
struct Handle {
    shared: Arc<Shared>,
    /// How long one call waits for a master before it fails.
    patience: Duration,
    /// Each command goes, followed by `WAIT`, on a connection of the pool
    /// ([`Conn::acked`]).
    acked: Option<Arc<AckPool>>,
}

/// How a [`Conn`] talks to Redis.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Each connection attempt, and each command's answer.
    pub response: Duration,
    /// How long a call waits for a master (reconnecting) before it fails.
    pub patience: Duration,
}

impl Timeouts {
    /// Both the same.
    pub fn both(d: Duration) -> Self {
        Timeouts {
            response: d,
            patience: d,
        }
    }
}

impl Conn {
    fn new(master: &Master, t: Timeouts, label: &'static str, link: Link) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(t.response))
            .set_response_timeout(Some(t.response));
        let c = Conn(Arc::new(Handle {
            shared: Arc::new(Shared {
                db: master.db(),
                master: master.clone(),
                config,
                label,
                link: watch::Sender::new(link),
                reconnecting: AtomicBool::new(false),
                timeouts: t,
                acked: std::sync::OnceLock::new(),
            }),
            patience: t.patience,
            acked: None,
        }));
        if let Master::Sentinel(sentinels) = master {
            tokio::spawn(follow_switches(
                sentinels.switches(),
                Arc::downgrade(&c.0.shared),
            ));
        }
        c
    }

    /// Connects to the master now: its error when it cannot (refused
    /// credentials, nobody there, a replica), for the caller to judge.
    pub async fn connect(master: &Master, t: Timeouts, label: &'static str) -> RedisResult<Conn> {
        let c = Conn::lazy(master, t, label);
        let (conn, at) = master.open(&c.0.shared.config).await?;
        c.0.shared.link.send_replace(Link::Up {
            generation: 1,
            conn,
            at,
        });
        Ok(c)
    }

    /// Connects on first use: an unreachable master surfaces as the first
    /// command's error, after the call's patience.
    pub fn lazy(master: &Master, t: Timeouts, label: &'static str) -> Conn {
        let link = Link::Down {
            generation: 0,
            since: Instant::now(),
            reason: None,
            error: None,
        };
        Conn::new(master, t, label, link)
    }

    /// This connection with another patience (shared with its clones).
    pub fn patient(&self, patience: Duration) -> Conn {
        Conn(Arc::new(Handle {
            shared: self.0.shared.clone(),
            patience,
            acked: self.0.acked.clone(),
        }))
    }

    fn patience(&self) -> Duration {
        self.0.patience
    }

    /// This connection (and every clone), able to make writes wait for
    /// `replicas` (0: never) for at most `wait` each ([`Conn::acked`]), on
    /// `connections` connections of their own (as many as may write at
    /// once). Set once: a second call changes nothing.
    pub fn with_acks(self, replicas: u8, wait: Duration, connections: usize) -> Conn {
        let shared = &self.0.shared;
        if replicas > 0 && shared.acked.get().is_none() {
            let n = connections.max(1);
            let conns = (0..n)
                .map(|_| Conn::lazy(&shared.master, shared.timeouts, "acked writes"))
                .collect();
            let _ = shared.acked.set(Arc::new(AckPool {
                acks: Acks { replicas, wait },
                conns,
                free: std::sync::Mutex::new((0..n).collect()),
                permits: tokio::sync::Semaphore::new(n),
            }));
        }
        self
    }

    /// A connection whose every command is followed, in the same
    /// pipeline, by `WAIT` for the replicas [`Conn::with_acks`] set (none:
    /// a plain clone). A command that succeeded but that too few replicas
    /// acknowledged in time fails with [`not_acknowledged`]'s error (it is
    /// on the master, and a failover may lose it: it does not count). A
    /// command that failed returns its own error. A `WAIT` acknowledges
    /// everything the master had written before it, whichever connection
    /// wrote it.
    pub fn acked(&self) -> Conn {
        match self.0.shared.acked.get() {
            Some(pool) => Conn(Arc::new(Handle {
                shared: self.0.shared.clone(),
                patience: self.0.patience,
                acked: Some(pool.clone()),
            })),
            None => self.clone(),
        }
    }

    /// Where the master is found.
    pub fn master(&self) -> &Master {
        &self.0.shared.master
    }

    /// Which connection this is: a number that grows each time one is made.
    pub fn generation(&self) -> u64 {
        self.0.shared.link.borrow().generation()
    }

    /// Resolves once a connection newer than `generation` is up: the master
    /// was found again after a drop (a failover, a restart, a lost link).
    pub async fn reconnected(&self, generation: u64) {
        let mut rx = self.0.shared.link.subscribe();
        let _ = rx
            .wait_for(|l| matches!(l, Link::Up { .. }) && l.generation() > generation)
            .await;
    }

    /// The current connection, or a new one once the master answers,
    /// waiting up to `deadline`.
    async fn up(&self, deadline: Instant) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut rx = self.0.shared.link.subscribe();
        loop {
            if let Link::Up {
                generation, conn, ..
            } = &*rx.borrow_and_update()
            {
                return Ok((*generation, conn.clone()));
            }
            Shared::reconnect(&self.0.shared);
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in `shared`, which `self` holds.
                Ok(Err(_)) | Err(_) => return Err(self.no_master()),
            }
        }
    }

    /// The error of the last attempt to reach the master, while there is
    /// no connection and that attempt's login was refused (a wrong or
    /// rotated password): what a caller whose own deadline ran out says
    /// instead of "no answer in time", since waiting will not fix it.
    pub fn refused_login(&self) -> Option<RedisError> {
        match &*self.0.shared.link.borrow() {
            Link::Down { error: Some(e), .. } if super::is_auth_failure(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// Why no master answers, for a call whose patience ran out.
    fn no_master(&self) -> RedisError {
        let link = self.0.shared.link.borrow();
        match &*link {
            // The last attempt's error keeps its kind: refused credentials
            // stay a config error to the CLI.
            Link::Down { error: Some(e), .. } => e.clone(),
            Link::Down { .. } | Link::Up { .. } => RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no Redis master answered within {:?} ({})",
                    self.patience(),
                    self.0.shared.master
                ),
            )),
        }
    }

    /// Sends `req` (see the module's doc for what each reply does).
    async fn send(&self, req: Request<'_>) -> RedisResult<Reply> {
        let deadline = Instant::now() + self.patience();
        loop {
            let (generation, mut conn) = self.up(deadline).await?;
            let reply = match req {
                Request::One(cmd) => conn.send_packed_command(cmd).await.map(Reply::One),
                Request::Many(p, offset, count) => conn
                    .send_packed_commands(p, offset, count)
                    .await
                    .map(Reply::Many),
            };
            match verdict(&reply) {
                Verdict::Keep => return reply,
                Verdict::Drop(reason) => {
                    let error = reply.as_ref().err().cloned();
                    Shared::drop_link(&self.0.shared, generation, reason, error);
                    return reply;
                }
                Verdict::Refused(reason) => {
                    Shared::drop_link(&self.0.shared, generation, reason, None);
                    if Instant::now() >= deadline {
                        return reply;
                    }
                }
            }
        }
    }

    /// `cmd`, then `WAIT`, in one pipeline (see [`Conn::acked`]).
    async fn send_acked(&self, cmd: &Cmd, acks: Acks) -> RedisResult<Value> {
        let mut p = redis::pipe();
        p.add_command(cmd.clone())
            .cmd("WAIT")
            .arg(acks.replicas)
            .arg(acks.wait.as_millis() as u64);
        let Reply::Many(replies) = self.send(Request::Many(&p, 0, 2)).await? else {
            unreachable!("a pipeline answers a list");
        };
        let mut replies = replies.into_iter();
        let (Some(reply), Some(acked)) = (replies.next(), replies.next()) else {
            return Err(RedisError::from((
                ErrorKind::Client,
                "a two-command pipeline answered fewer than two replies",
            )));
        };
        if let Value::ServerError(_) = reply {
            return Ok(reply);
        }
        match acked {
            Value::Int(n) if n >= i64::from(acks.replicas) => Ok(reply),
            Value::Int(n) => Err(not_acknowledged(acks, Some(n))),
            _ => Err(not_acknowledged(acks, None)),
        }
    }

    /// Whether the master answers now, within `timeout`, and is one:
    /// `Err` says why not. Never waits for a reconnection: while there
    /// is none it answers at once. A server that says it is a replica is
    /// dropped, as a refused write would drop it.
    pub async fn probe(&self, timeout: Duration) -> Result<(), NotReady> {
        let (generation, mut conn, at) = match &*self.0.shared.link.borrow() {
            Link::Up {
                generation,
                conn,
                at,
            } => (*generation, conn.clone(), at.clone()),
            Link::Down { reason, since, .. } => {
                let down = NotReady::Down {
                    reason: *reason,
                    for_ms: since.elapsed().as_millis() as u64,
                };
                Shared::reconnect(&self.0.shared);
                return Err(down);
            }
        };
        match tokio::time::timeout(timeout, role(&mut conn)).await {
            Ok(Ok(Role::Master | Role::Unknown)) => Ok(()),
            Ok(Ok(Role::Replica)) => {
                Shared::drop_link(&self.0.shared, generation, Reason::Demoted, None);
                Err(NotReady::Replica { at })
            }
            Ok(Err(e)) => {
                if let Verdict::Drop(reason) | Verdict::Refused(reason) = verdict(&Err(e.clone())) {
                    Shared::drop_link(&self.0.shared, generation, reason, Some(e));
                }
                Err(NotReady::Unreachable)
            }
            Err(_) => Err(NotReady::Timeout(timeout)),
        }
    }
}

/// Why the master is not ready ([`Conn::probe`]). None holds a password.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NotReady {
    /// Reconnecting: no master answered since the connection was dropped.
    #[error("no master for {for_ms} ms{}", reason.map(|r| format!(" (connection dropped: {})", r.as_str())).unwrap_or_default())]
    Down {
        /// Why the last connection was dropped (`None`: never connected).
        reason: Option<Reason>,
        /// For how long.
        for_ms: u64,
    },
    /// The server says it is a replica.
    #[error("{at} is a replica, not the master")]
    Replica {
        /// Its address.
        at: String,
    },
    /// The connection failed.
    #[error("unreachable")]
    Unreachable,
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The error of a write too few replicas acknowledged in time.
fn not_acknowledged(acks: Acks, got: Option<i64>) -> RedisError {
    let got = got.map_or_else(|| "an error".to_owned(), |n| n.to_string());
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "WAIT {} answered {got} within {:?}: the write is on the master only, and a failover may lose it ([redis] queue_replicas)",
            acks.replicas, acks.wait
        ),
    ))
}

impl Shared {
    /// Drops the connection `generation` (if it is still the current
    /// one) for `reason`, and starts reconnecting.
    fn drop_link(this: &Arc<Shared>, generation: u64, reason: Reason, error: Option<RedisError>) {
        let mut was = None;
        let dropped = this.link.send_if_modified(|link| match link {
            Link::Up {
                generation: g, at, ..
            } if *g == generation => {
                was = Some(at.clone());
                *link = Link::Down {
                    generation,
                    since: Instant::now(),
                    reason: Some(reason),
                    error: error.clone(),
                };
                true
            }
            _ => false,
        });
        if !dropped {
            return;
        }
        metrics::counter!("qw_redis_reconnects_total", "reason" => reason.as_str()).increment(1);
        warn!(
            redis = this.label,
            at = was.unwrap_or_default(),
            reason = reason.as_str(),
            error = error.map(|e| e.to_string()),
            "dropped the connection to the Redis master; finding the master again"
        );
        Shared::reconnect(this);
    }

    /// Starts the reconnecting task, unless one runs or a connection is up.
    fn reconnect(this: &Arc<Shared>) {
        if this.reconnecting.swap(true, Ordering::SeqCst) {
            return;
        }
        if matches!(&*this.link.borrow(), Link::Up { .. }) {
            this.reconnecting.store(false, Ordering::SeqCst);
            return;
        }
        tokio::spawn(reconnecting(Arc::downgrade(this)));
    }
}

/// Leaves the master as soon as the sentinels announce another one, until
/// the connection's last user is gone.
async fn follow_switches(mut switches: watch::Receiver<Option<String>>, shared: Weak<Shared>) {
    while switches.changed().await.is_ok() {
        let Some(this) = shared.upgrade() else {
            return;
        };
        let announced = switches.borrow_and_update().clone();
        let on_old = match &*this.link.borrow() {
            Link::Up { generation, at, .. } => {
                (announced.as_deref() != Some(at.as_str())).then_some(*generation)
            }
            Link::Down { .. } => None,
        };
        if let Some(generation) = on_old {
            Shared::drop_link(&this, generation, Reason::Switched, None);
        }
    }
}

/// Finds the master and connects, with backoff, until it answers or the
/// connection is dropped by all its users.
async fn reconnecting(shared: Weak<Shared>) {
    let mut backoff = FIRST_BACKOFF;
    let mut said = false;
    loop {
        let Some(this) = shared.upgrade() else {
            return;
        };
        match this.master.open(&this.config).await {
            Ok((conn, at)) => {
                let mut down_ms = 0;
                this.link.send_modify(|link| {
                    if let Link::Down { since, .. } = link {
                        down_ms = since.elapsed().as_millis() as u64;
                    }
                    *link = Link::Up {
                        generation: link.generation() + 1,
                        conn,
                        at: at.clone(),
                    };
                });
                this.reconnecting.store(false, Ordering::SeqCst);
                info!(
                    redis = this.label,
                    at, down_ms, "connected to the Redis master"
                );
                // Dropped again between the two lines above: go on.
                if !matches!(&*this.link.borrow(), Link::Up { .. }) {
                    Shared::reconnect(&this);
                }
                return;
            }
            Err(e) => {
                if !said {
                    warn!(redis = this.label, master = %this.master, error = %e, "no Redis master answers yet; retrying with backoff (at most 5 s)");
                    said = true;
                }
                this.link.send_modify(|link| {
                    if let Link::Down { error, .. } = link {
                        *error = Some(e);
                    }
                });
            }
        }
        drop(this);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One command, or a pipeline's part (`offset`, `count`).
#[derive(Clone, Copy)]
enum Request<'a> {
    One(&'a Cmd),
    Many(&'a Pipeline, usize, usize),
}

enum Reply {
    One(Value),
    Many(Vec<Value>),
}

/// What a reply means for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Nothing: the caller's.
    Keep,
    /// Drop it; the command may have run, so it is not sent again.
    Drop(Reason),
    /// Drop it; the server did not run the command: send it again.
    Refused(Reason),
}

fn verdict(reply: &RedisResult<Reply>) -> Verdict {
    match reply {
        Ok(Reply::One(v)) => refused(v).map_or(Verdict::Keep, Verdict::Refused),
        Ok(Reply::Many(vs)) => vs
            .iter()
            .find_map(refused)
            .map_or(Verdict::Keep, Verdict::Refused),
        Err(e) => match e.kind() {
            ErrorKind::Server(kind) => {
                server_refusal(Some(kind), e.code()).map_or(Verdict::Keep, Verdict::Refused)
            }
            _ if e.is_timeout() => Verdict::Drop(Reason::Timeout),
            ErrorKind::Io | ErrorKind::Parse => Verdict::Drop(Reason::Lost),
            _ => Verdict::Keep,
        },
    }
}

/// The reason a reply says the server refused to run the command because
/// of what it is now, if it does.
fn refused(v: &Value) -> Option<Reason> {
    match v {
        Value::ServerError(e) => server_refusal(e.kind(), Some(e.code())),
        _ => None,
    }
}

fn server_refusal(kind: Option<ServerErrorKind>, code: Option<&str>) -> Option<Reason> {
    match kind {
        Some(ServerErrorKind::ReadOnly) => Some(Reason::ReadOnly),
        Some(ServerErrorKind::MasterDown) => Some(Reason::MasterDown),
        Some(ServerErrorKind::BusyLoading) => Some(Reason::Loading),
        _ if code == Some("UNBLOCKED") => Some(Reason::Demoted),
        _ => None,
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            if let Some(pool) = &self.0.acked {
                return pool.send(cmd, self.0.patience).await;
            }
            match self.send(Request::One(cmd)).await? {
                Reply::One(v) => Ok(v),
                Reply::Many(_) => unreachable!("one command answers one reply"),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            if self.0.acked.is_some() {
                // Every acknowledged write is one command (a script, a SET):
                // a pipeline here is a bug, said rather than left unacked.
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "an acknowledged connection sends one command at a time",
                )));
            }
            match self.send(Request::Many(pipeline, offset, count)).await? {
                Reply::Many(v) => Ok(v),
                Reply::One(_) => unreachable!("a pipeline answers a list"),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.0.shared.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(text: &str) -> Value {
        let (code, detail) = text.split_once(' ').unwrap_or((text, ""));
        let e = redis::make_extension_error(code.to_owned(), Some(detail.to_owned()));
        match e.into_server_errors() {
            Some(errs) => Value::ServerError(errs[0].1.clone()),
            None => unreachable!(),
        }
    }

    #[test]
    fn refusals_are_sent_again_and_losses_are_not() {
        let one = |v| verdict(&Ok(Reply::One(v)));
        assert_eq!(one(Value::Okay), Verdict::Keep);
        assert_eq!(
            one(server_error("UNBLOCKED force unblock")),
            Verdict::Refused(Reason::Demoted)
        );
        assert_eq!(one(server_error("NOSCRIPT no")), Verdict::Keep);
        let lost = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(verdict(&Err(lost)), Verdict::Drop(Reason::Lost));
        let slow = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(verdict(&Err(slow)), Verdict::Drop(Reason::Timeout));
        let wrong = RedisError::from((ErrorKind::Client, "bug"));
        assert_eq!(verdict(&Err(wrong)), Verdict::Keep);
    }
}
