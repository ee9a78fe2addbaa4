//! How an idle daemon waits for work without polling Redis: one blocking
//! read per daemon on the wake stream (`<prefix>:wake`, written by the
//! scripts that make a task due: `lua/fan_out.lua`, `lua/enqueue.lua`,
//! `lua/feed.lua`), and a wake-up of the daemon's apalis worker that is
//! never lost.
//!
//! - [`WakeStream`]: the daemon's waiter reads the stream (`XREAD BLOCK`)
//!   on a connection of its own: every daemon sees every entry.
//! - [`Wake`]: what the waiter tells the worker ("apalis has tasks").
//! - [`Woken`]: the worker's poll strategy: a wake-up, nothing on a timer.
//! - [`Tapped`]: the worker's Redis connection, which sees apalis's fetch go
//!   by. apalis pitfall 13 again: apalis-core's `PollWith` starts a fetch
//!   whenever the worker is polled and idle, and parks the worker when the
//!   fetch comes back empty. A wake-up that arrives while a fetch is in
//!   flight finds nothing to start; if that fetch left before the tasks
//!   arrived, it comes back empty and nothing wakes the worker again. So
//!   the connection notes the wake-ups each fetch left after, and a fetch
//!   that comes back when a newer one arrived wakes its worker once more.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use apalis::prelude::{PollSnapshot, PollStrategy};
use futures::task::AtomicWaker;
use redis::aio::ConnectionLike;

use crate::conn::Conn;
use redis::{Cmd, RedisFuture, Value};

/// Most entries the wake stream keeps (the scripts' `MAXLEN`): a read that
/// returns this many may have missed some.
pub(crate) const WAKE_STREAM_LEN: usize = 16;

/// A daemon's wake-ups of its apalis worker: a count, and the worker to
/// wake. Cheap to share.
#[derive(Debug, Default)]
pub struct Wake {
    /// Wake-ups so far.
    epoch: AtomicU64,
    /// The worker's task, as its poll strategy last saw it.
    worker: AtomicWaker,
}

impl Wake {
    /// Tells the worker that apalis may have tasks for it.
    pub(crate) fn notify(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.worker.wake();
    }

    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }
}

/// The worker's poll strategy: it fetches when [`Wake::notify`] says so,
/// and otherwise only when apalis-core polls it anyway (a task ended, a
/// heartbeat). Nothing runs on a timer.
#[derive(Debug)]
pub(crate) struct Woken {
    wake: Arc<Wake>,
    seen: u64,
}

impl Woken {
    pub(crate) fn new(wake: Arc<Wake>) -> Self {
        let seen = wake.epoch();
        Woken { wake, seen }
    }
}

impl PollStrategy for Woken {
    fn poll_drive(&mut self, cx: &mut Context<'_>, _: &PollSnapshot) -> Poll<Option<()>> {
        // Registered before the check: a wake-up between the two still
        // wakes this task.
        self.wake.worker.register(cx.waker());
        let now = self.wake.epoch();
        if now != self.seen {
            self.seen = now;
            Poll::Ready(Some(()))
        } else {
            Poll::Pending
        }
    }
}

/// The apalis worker's connection: the queue's, with its fetches watched
/// (see the module's doc). Clones share the watch.
#[derive(Clone)]
pub(crate) struct Tapped {
    conn: Conn,
    wake: Arc<Wake>,
    /// apalis's workers set: the first key of its fetch script, which is
    /// the only one of its scripts with [`FETCH_KEYS`] keys.
    workers: Arc<str>,
}

/// How many keys apalis-redis 1.0's `fetch_next.lua` takes.
const FETCH_KEYS: &[u8] = b"7";

impl Tapped {
    pub(crate) fn new(conn: Conn, wake: Arc<Wake>, workers: String) -> Self {
        Tapped {
            conn,
            wake,
            workers: workers.into(),
        }
    }

    /// Whether `cmd` is apalis's fetch: `EVALSHA sha 7 <workers set> ...`
    /// (or `EVAL`).
    fn is_fetch(&self, cmd: &Cmd) -> bool {
        let mut args = cmd.args_iter().map(|a| match a {
            redis::Arg::Simple(b) => b,
            _ => &[][..],
        });
        let name = args.next().unwrap_or_default();
        (name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL"))
            && args.nth(1) == Some(FETCH_KEYS)
            && args.next() == Some(self.workers.as_bytes())
    }
}

impl ConnectionLike for Tapped {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if !self.is_fetch(cmd) {
            return self.conn.req_packed_command(cmd);
        }
        // Read before the fetch is sent: a wake-up counted before this was
        // told after its tasks were pushed, which this fetch then sees.
        let left_at = self.wake.epoch();
        Box::pin(Fetch {
            reply: self.conn.req_packed_command(cmd),
            wake: self.wake.clone(),
            left_at,
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// A fetch in flight: when it comes back after a wake-up it may have
/// missed, its worker is woken again, to fetch once more.
struct Fetch<'a> {
    reply: RedisFuture<'a, Value>,
    wake: Arc<Wake>,
    left_at: u64,
}

impl Future for Fetch<'_> {
    type Output = redis::RedisResult<Value>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let reply = std::task::ready!(self.reply.as_mut().poll(cx));
        if self.wake.epoch() != self.left_at {
            // The task polling this is the worker's: woken during its own
            // poll, it is polled again once this poll returns, and then
            // starts a new fetch.
            cx.waker().wake_by_ref();
        }
        Poll::Ready(reply)
    }
}

/// The daemon's blocking read of the wake stream, on its own connection
/// (a blocked read holds its connection).
pub(crate) struct WakeStream {
    conn: Conn,
    key: String,
    /// The newest entry read (`0-0`: none yet).
    last: String,
}

/// What one read of the wake stream found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Woke {
    /// apalis got tasks: the worker should fetch.
    pub(crate) fetch: bool,
    /// The soonest a task added to the backlog is due, from now (zero: due
    /// already), when one was added.
    pub(crate) due_in: Option<Duration>,
    /// The read may have missed entries (the stream kept only its newest):
    /// look at the queue itself.
    pub(crate) look: bool,
}

impl WakeStream {
    /// A reader of `key` on `conn` (a connection whose response timeout
    /// outlasts the longest block), from the newest entry there now on.
    pub(crate) async fn open(mut conn: Conn, key: String) -> redis::RedisResult<Self> {
        let newest: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(&key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut conn)
            .await?;
        let last = newest
            .ids
            .first()
            .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
        Ok(WakeStream { conn, key, last })
    }

    /// Waits up to `block` for entries after the last one read.
    pub(crate) async fn wait(&mut self, block: Duration) -> redis::RedisResult<Woke> {
        let block_ms = block.as_millis().max(1) as u64;
        let reply: Option<redis::streams::StreamReadReply> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(WAKE_STREAM_LEN)
            .arg("BLOCK")
            .arg(block_ms)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(&self.last)
            .query_async(&mut self.conn)
            .await?;
        let mut woke = Woke::default();
        let entries = reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids);
        let mut n = 0;
        for entry in entries {
            n += 1;
            // The id's first part is Redis's clock when the entry was added.
            let added: Option<i64> = entry.id.split('-').next().and_then(|ms| ms.parse().ok());
            let at: Option<i64> = entry.get("at");
            match (at, added) {
                (Some(0), _) => woke.fetch = true,
                (Some(at), Some(added)) => {
                    let due_in = Duration::from_millis(u64::try_from(at - added).unwrap_or(0));
                    woke.due_in = Some(woke.due_in.map_or(due_in, |d| d.min(due_in)));
                }
                // Not ours to read: look at the queue rather than guess.
                _ => woke.look = true,
            }
            self.last = entry.id;
        }
        woke.look |= n >= WAKE_STREAM_LEN;
        Ok(woke)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evalsha(keys: &[&str]) -> Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg("0123").arg(keys.len()).arg(keys).arg("now").arg(1);
        c
    }

    #[tokio::test]
    async fn only_apalis_fetch_is_taken_for_a_fetch() {
        // A connection that never connects: is_fetch reads the command only.
        let master = crate::conn::Master::Url(crate::config::RedisUrl::new("redis://127.0.0.1:1/"));
        let conn = crate::conn::connect_lazy(&master, Duration::from_secs(1), "test");
        let t = Tapped::new(conn, Arc::default(), "qw:queue:workers".into());
        let seven = [
            "qw:queue:workers",
            "qw:queue:active",
            "i",
            "d",
            "s",
            "m",
            "sched",
        ];
        assert!(t.is_fetch(&evalsha(&seven)));
        let mut eval = redis::cmd("eval");
        eval.arg("return 1").arg(7).arg(&seven[..]);
        assert!(t.is_fetch(&eval));
        // keep_alive (1 key), reenqueue_orphaned (4), another queue's fetch.
        assert!(!t.is_fetch(&evalsha(&["qw:queue:workers"])));
        assert!(!t.is_fetch(&evalsha(&["qw:queue:workers", "a", "b", "c"])));
        let mut other = seven;
        other[0] = "other:queue:workers";
        assert!(!t.is_fetch(&evalsha(&other)));
        assert!(!t.is_fetch(&redis::cmd("PING")));
    }

    /// The lost wake-up this module exists for: a wake-up told while a
    /// fetch is in flight wakes the worker again when the fetch is back.
    #[tokio::test]
    async fn a_fetch_back_after_a_wake_up_wakes_its_worker_again() {
        let wake = Arc::new(Wake::default());
        let woken = Arc::new(AtomicU64::new(0));
        let waker = futures::task::waker(Arc::new(Count(woken.clone())));
        let mut cx = Context::from_waker(&waker);

        // A reply that comes when `back` is set (and wakes nobody itself).
        let back = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reply = {
            let back = back.clone();
            futures::future::poll_fn(move |_| {
                if back.load(Ordering::SeqCst) {
                    Poll::Ready(Ok(Value::Nil))
                } else {
                    Poll::Pending
                }
            })
        };
        let mut fetch = Box::pin(Fetch {
            reply: Box::pin(reply),
            wake: wake.clone(),
            left_at: wake.epoch(),
        });
        assert!(fetch.as_mut().poll(&mut cx).is_pending());
        wake.notify();
        back.store(true, Ordering::SeqCst);
        assert!(fetch.as_mut().poll(&mut cx).is_ready());
        assert_eq!(woken.load(Ordering::SeqCst), 1, "woken again");

        // A fetch that left after the wake-up saw its tasks: no second wake.
        let mut fresh = Box::pin(Fetch {
            reply: Box::pin(async { Ok(Value::Nil) }),
            wake: wake.clone(),
            left_at: wake.epoch(),
        });
        assert!(fresh.as_mut().poll(&mut cx).is_ready());
        assert_eq!(woken.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_strategy_wakes_its_worker_on_notify() {
        let wake = Arc::new(Wake::default());
        let mut s = Woken::new(wake.clone());
        let woken = Arc::new(AtomicU64::new(0));
        let waker = futures::task::waker(Arc::new(Count(woken.clone())));
        let mut cx = Context::from_waker(&waker);
        let snap = PollSnapshot::default();
        assert!(s.poll_drive(&mut cx, &snap).is_pending());
        wake.notify();
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert!(s.poll_drive(&mut cx, &snap).is_ready());
        assert!(s.poll_drive(&mut cx, &snap).is_pending());
    }

    struct Count(Arc<AtomicU64>);

    impl futures::task::ArcWake for Count {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
