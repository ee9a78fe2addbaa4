//! Promise: no task is lost when a daemon is SIGKILLed mid-tick (another
//! daemon picks its tasks up within `[worker] recover_after`, 30 s by
//! default), nor when Redis restarts or drops every client connection
//! mid-run (the daemon's workers come back by themselves and it keeps
//! running).
//!
//! Regression tests for apalis pitfalls 7 (any Redis error kills an apalis
//! worker) and 8 (apalis's defaults bring a dead worker's tasks back after
//! ~300 s).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use simulator::Fault;

use crate::support::daemon::{self, assert_sink_once, ended, sink_records, tick_outcomes, workers};
use crate::support::keys::apalis;
use crate::support::machine;
use crate::support::rig::{Rig, outcomes};
use crate::support::upstream::Upstream;
use crate::support::world::{self, JOB, REGIONS};
use crate::support::{self, ConfigBuilder, RedisServer, Worker, holds_for, wait_until};

const PAGES: u32 = 3;
const ITEMS_PER_PAGE: u32 = 2;
const ITEMS: i64 = REGIONS.len() as i64;

fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        support::wait_until(timeout, cond),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// What [`kill_mid_tick`] measured.
struct Recovery {
    /// From SIGKILL until the dead daemon's worker was declared dead and its
    /// tasks re-queued.
    requeued: Duration,
    /// From SIGKILL until the last of its tasks ended.
    done: Duration,
}

/// Two daemons; daemon A holds four of a tick's eight tasks mid-request
/// (the other four done) when it is SIGKILLed; daemon B must finish them.
fn kill_mid_tick(worker: Worker) -> Recovery {
    let upstream = Upstream::start(PAGES, ITEMS_PER_PAGE);
    let cfg = world::config(world::job(&upstream.base_url()).pages(PAGES))
        .worker(worker)
        .write();
    upstream.inject(Fault::Delay(Duration::from_secs(120)), 4);
    let mut rig = Rig::new(cfg);
    let mut conn = rig.conn();
    wait_for(
        "daemon A's worker registered",
        Duration::from_secs(10),
        || workers(&mut conn).len() == 1,
    );
    let a_worker = workers(&mut conn)[0].clone();
    let tick = rig.queue(JOB);
    wait_for(
        "four tasks done and four in flight on daemon A",
        Duration::from_secs(15),
        || upstream.injected() == 4 && tick_outcomes(&mut conn, tick).get("done") == Some(&4),
    );
    let mut b = rig.another("daemon-b");

    rig.daemon.kill();
    let killed = Instant::now();
    let mut requeued = None;
    wait_until(Duration::from_secs(60), || {
        if requeued.is_none() && !workers(&mut conn).contains(&a_worker) {
            requeued = Some(killed.elapsed());
        }
        ended(&tick_outcomes(&mut conn, tick)) >= ITEMS
    });
    let done = killed.elapsed();
    let o = tick_outcomes(&mut conn, tick);
    assert_eq!(ended(&o), ITEMS, "not every task ended: {o:?}");
    let requeued = requeued.expect("the killed daemon's worker was never declared dead");
    // A quiet period, in which a task run twice would show.
    let mut o = tick_outcomes(&mut conn, tick);
    let once = holds_for(Duration::from_secs(1), || {
        o = tick_outcomes(&mut conn, tick);
        o.get("done") == Some(&ITEMS) && ended(&o) == ITEMS
    });
    assert_eq!(o.get("done"), Some(&ITEMS), "{o:?}");
    assert!(once, "a task ended twice: {o:?}");
    // B's outcome lines reach its log after Redis's record.
    wait_until(Duration::from_secs(10), || b.outcomes().len() >= 4);
    assert_eq!(b.outcomes().len(), 4, "{:?}", b.outcomes());

    // Every page once: the killed requests were never answered (so never
    // charged); each page of each region is in the sink exactly once.
    let stats = upstream.stats();
    assert!(
        stats.duplicate_pages().is_empty(),
        "{:?}",
        stats.duplicate_pages()
    );
    assert_eq!(stats.charges.len(), REGIONS.len() * PAGES as usize);
    assert_sink_once(&rig.cfg, REGIONS.len() * (PAGES * ITEMS_PER_PAGE) as usize);

    b.term();
    assert_eq!(
        b.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
    Recovery { requeued, done }
}

/// apalis pitfall 8: with apalis's defaults (30 s heartbeat, 10 missed) a
/// SIGKILLed worker's tasks come back after ~300 s. `recover_after = "6s"`
/// must bring them back within about 6 s.
#[test]
fn pitfall_8_sigkilled_daemon_tasks_are_picked_up_within_recover_after() {
    let _machine = machine::timing();
    let r = kill_mid_tick(Worker::default().concurrency(8).recover_after("6s"));
    eprintln!(
        "MEASURE recover_after=6s: killed daemon's tasks re-queued {:?} after SIGKILL, all ended {:?} after it",
        r.requeued, r.done
    );
    // Declared dead after 3 missed heartbeats of recover_after / 5, checked
    // on the live daemon's heartbeat, at 1 s resolution.
    assert!(
        r.requeued <= Duration::from_secs(6) + Duration::from_millis(1_500),
        "re-queued {:?} after the kill",
        r.requeued
    );
    // The tasks also wait for the dead daemon's item locks (10 s, renewed
    // until the kill) to lapse, then a busy retry (2 s).
    assert!(
        r.done <= Duration::from_secs(14),
        "finished {:?} after the kill",
        r.done
    );
}

/// SPEC: "A SIGKILLed daemon's tasks are picked up by a live daemon within
/// 30 s by default".
#[test]
fn sigkilled_daemon_tasks_are_picked_up_within_30s_by_default() {
    let _machine = machine::timing();
    let r = kill_mid_tick(Worker::default().concurrency(8));
    eprintln!(
        "MEASURE recover_after default (30s): killed daemon's tasks re-queued {:?} after SIGKILL, all ended {:?} after it",
        r.requeued, r.done
    );
    assert!(
        r.requeued <= Duration::from_secs(30),
        "re-queued {:?} after the kill",
        r.requeued
    );
    assert!(
        r.done <= Duration::from_secs(32),
        "finished {:?} after the kill",
        r.done
    );
}

/// A daemon on a job that ticks every 2 s at known times, and something that
/// breaks every Redis connection mid-run (while tasks are in flight): every
/// tick before, during and after fans out, ends with all its tasks done,
/// each counted once, and the daemon keeps running.
fn survive(label: &str, redis_args: &[&str], incident: impl FnOnce(&mut RedisServer)) {
    const TICKS: u32 = 9;
    let ((mut rig, upstream), ticks) =
        daemon::start_before_first_tick(TICKS, 2, Duration::from_secs(4), |schedule| {
            let upstream = Upstream::start(PAGES, ITEMS_PER_PAGE);
            let cfg = daemon::on_ticks(&upstream.base_url(), PAGES, &schedule);
            (
                Rig::start(RedisServer::start_with(redis_args), cfg, &[]),
                upstream,
            )
        });
    // Two whole ticks first.
    rig.wait_ticks(&ticks[..2], ITEMS, Duration::from_secs(80));
    // Mid-run: the next tick's first four requests are slow, so tasks are
    // in flight when the incident happens.
    upstream.inject(Fault::Delay(Duration::from_millis(1_500)), 4);
    wait_for("tasks in flight", Duration::from_secs(10), || {
        upstream.injected() == 4
    });
    let restarts_before = (rig.daemon)
        .messages("worker stopped on an error; restarting")
        .len();
    let at = Instant::now();
    incident(&mut rig.redis);
    let back = at.elapsed();
    let back_ms = chrono::Utc::now().timestamp_millis();

    // Workers come back: the first tick after the incident ends.
    let next = *ticks
        .iter()
        .find(|t| **t > back_ms)
        .expect("ticks after the incident");
    let mut conn = rig.conn();
    let (ok, all) = daemon::wait_ticks_ended(&mut conn, &[next], ITEMS, Duration::from_secs(40));
    assert!(
        ok,
        "{label}: the first tick after the incident did not end: {all:?}; daemon running: {}",
        rig.daemon.running()
    );
    let recovered = at.elapsed();
    assert!(rig.daemon.running(), "{label}: the daemon died");

    // Every tick (before, during and after) fanned out once and ended, each
    // task counted once.
    let (ok, all) = daemon::wait_ticks_ended(&mut conn, &ticks, ITEMS, Duration::from_secs(60));
    let all: BTreeMap<_, _> = all.into_iter().collect();
    assert!(ok, "{label}: tasks lost: {all:?}");
    // A quiet period, in which a tick claimed again would show.
    let mut claimed: Vec<i64> = Vec::new();
    let quiet = holds_for(Duration::from_secs(2), || {
        claimed = rig.claims().into_keys().collect();
        claimed.sort();
        claimed == ticks
    });
    assert_eq!(claimed, ticks, "{label}: ticks claimed");
    assert!(quiet, "{label}: a tick claimed again");
    // A task caught by the incident either finished its item (`done`) or,
    // redelivered after a newer tick already completed the item, ended as
    // `superseded` rather than fetch older data again.
    for t in &ticks {
        let o = tick_outcomes(&mut conn, *t);
        assert_eq!(o.get("#items"), Some(&ITEMS), "{label}: tick {t}: {o:?}");
        let done = o.get("done").copied().unwrap_or(0);
        let superseded = o.get("superseded").copied().unwrap_or(0);
        assert_eq!(done + superseded, ITEMS, "{label}: tick {t}: {o:?}");
        assert_eq!(ended(&o), ITEMS, "{label}: tick {t} counted twice: {o:?}");
    }
    let d = &mut rig.daemon;
    assert!(d.running(), "{label}: the daemon died");
    let restarts = d.messages("worker stopped on an error; restarting").len() - restarts_before;
    // Pages served: the charged ones plus the four delayed (never charged);
    // a superseded task's item was completed by a newer tick's run, which
    // stands in for its pages.
    let superseded: usize = ticks
        .iter()
        .map(|t| {
            tick_outcomes(&mut conn, *t)
                .get("superseded")
                .copied()
                .unwrap_or(0) as usize
        })
        .sum();
    let served = upstream.fetched() + 4;
    let expected = TICKS as usize * REGIONS.len() * PAGES as usize;
    assert!(
        served + superseded * PAGES as usize >= expected,
        "{label}: {served} pages served and {superseded} superseded tasks, {expected} pages expected"
    );
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0),
        "{label}: exit"
    );
    eprintln!(
        "MEASURE {label}: incident took {back:?}; the first tick after it ended {recovered:?} after it began; all {TICKS} ticks done; {restarts} worker restart(s); {served} page(s) served for {expected} expected (at least once around the incident), {superseded} task(s) superseded"
    );
}

/// apalis pitfall 7: any Redis error kills an apalis-redis worker. A Redis
/// restart (2 s down, AOF on) must not stop the daemon's work.
#[test]
fn pitfall_7_redis_restart_mid_run_workers_come_back_and_no_task_is_lost() {
    let _machine = machine::timing();
    survive(
        "redis restart",
        &["--appendonly", "yes", "--appendfsync", "always"],
        |redis| {
            redis.stop();
            // About time: the outage's length.
            std::thread::sleep(Duration::from_secs(2));
            redis.restart();
        },
    );
}

/// apalis pitfall 7, the other way in: every client connection dropped at
/// once (`CLIENT KILL TYPE normal`), twice in a row.
#[test]
fn pitfall_7_client_kill_mid_run_workers_come_back_and_no_task_is_lost() {
    let _machine = machine::timing();
    survive("client kill", &[], |redis| {
        for round in 0..2 {
            if round > 0 {
                // The daemon's connections are back (besides the one
                // asking), to be killed again.
                let back = wait_until(Duration::from_secs(10), || {
                    let list: String = redis.cmd(&["CLIENT", "LIST", "TYPE", "normal"]);
                    list.lines().count() > 1
                });
                assert!(back, "the daemon did not connect again");
            }
            let killed: i64 = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
            assert!(killed > 0, "CLIENT KILL killed nobody");
        }
    });
}

/// Bug: a task's retry was dropped when a redelivered copy of the task had
/// found its item busy meanwhile. Busy copies and retries were both named
/// `<job>:<tick>:<index>:<seq>`, so the retry got the id of the busy copy
/// (`...:1`): the backlog (HSETNX) or apalis (HSETNX on its data hash, kept
/// for an hour) kept the busy copy and dropped the retry, and the busy copy
/// then saw its task marked ended and did nothing. The tick never ended.
///
/// Here: daemon A drains after SIGTERM with a request in flight (no
/// heartbeats while draining), so daemon B redelivers A's task after
/// recover_after; B's copy finds the item locked by A and queues a busy
/// copy; then A's request times out and A queues the retry.
#[test]
fn retry_after_a_redelivered_copy_found_the_item_busy_is_not_lost() {
    let _machine = machine::timing();
    let upstream = Upstream::start(1, 2);
    let cfg = ConfigBuilder::new()
        .credential(world::credential(world::wide()))
        .endpoint(world::endpoint().timeout("10s"))
        .job(
            world::job(&upstream.base_url())
                .fan_out("region", ["US"])
                .pages(1),
        )
        .worker(
            Worker::default()
                .concurrency(1)
                .shutdown_timeout("30s")
                .recover_after("6s"),
        )
        .write();
    upstream.inject(Fault::Delay(Duration::from_secs(40)), 1);
    let mut rig = Rig::new(cfg);
    let mut conn = rig.conn();
    let tick = rig.queue(JOB);
    wait_for(
        "the slow request in flight",
        Duration::from_secs(10),
        || upstream.injected() == 1,
    );
    let b = rig.another("daemon-b");
    rig.daemon.term();

    // A's request times out (10 s) and A queues the retry; B runs it.
    let (ok, all) = daemon::wait_ticks_ended(&mut conn, &[tick], 1, Duration::from_secs(40));
    let copies: Vec<String> = rig.redis.cmd(&["HKEYS", &apalis().job_data_hash()]);
    assert!(
        ok,
        "the retry was lost: {all:?}; task copies queued: {copies:?}; daemon-b's outcomes: {:?}",
        b.outcomes()
    );
    let o = tick_outcomes(&mut conn, tick);
    assert_eq!(o.get("done"), Some(&1), "{o:?}");
    assert_eq!(o.get("~retrying"), Some(&1), "{o:?}");
    // The scenario happened as described: B met the busy item first.
    assert!(
        outcomes(&b).iter().all(|o| o.kind == "done"),
        "{:?}",
        b.outcomes()
    );
    assert_eq!(
        (rig.daemon.wait_exit(Duration::from_secs(40))).and_then(|s| s.code()),
        Some(0)
    );
    assert_eq!(upstream.fetched(), 1);
}

/// The item keys of [`JOB`] named by `key` (`keys().item_lock`, ...), one
/// per item that has one.
fn item_keys(conn: &mut redis::Connection, key: impl Fn(&str, &str) -> String) -> HashSet<String> {
    let pattern = key(JOB, "*");
    let found: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(conn).expect("KEYS");
    let at = pattern.len() - 1;
    found.into_iter().map(|k| k[at..].to_owned()).collect()
}

/// Issue 28: a task's end is one call (`lua/finish.lua`): its done marker,
/// what its complete run leaves of the item (`{since}`, the completed
/// tick, the checkpoint deleted) and its item lock's release; it was four
/// (a MULTI/EXEC, a SETEX, the outcome, the release), with a SIGKILL
/// possible between each. A daemon SIGKILLed while it records its tasks'
/// ends (every page fetched and written; Redis's writes paused, so each
/// end's call waits in Redis, and its connections killed before they
/// resume) leaves no end half recorded: each item as its run left it, held
/// by a lock that lapses within its TTL. A daemon started after runs each
/// task to its end once, fetching each page at most once more (SPEC,
/// postgres sink: "a daemon killed between writing and checkpointing"
/// writes a page twice), and each of its ends frees its item at once.
#[test]
fn a_daemon_killed_while_recording_its_tasks_ends_leaves_each_item_whole() {
    let _machine = machine::timing();
    let upstream = Upstream::start(1, ITEMS_PER_PAGE);
    // Item locks of min(10 s, recover_after / 2) = 8 s, renewed every
    // 2.7 s until Redis's writes pause: held (not lapsed) while the test
    // looks at them.
    let cfg = world::config(world::job(&upstream.base_url()).pages(1))
        .worker(Worker::default().concurrency(8).recover_after("16s"))
        .write();
    let lock_ttl_ms = 8_000;
    let items = REGIONS.len();
    upstream.inject(Fault::Delay(Duration::from_secs(1)), items as u32);
    let mut rig = Rig::new(cfg);
    let mut conn = rig.conn();
    let tick = rig.queue(JOB);
    wait_for("every request in flight", Duration::from_secs(15), || {
        upstream.injected() == items as u64
    });
    let redis = &rig.redis;
    let _: String = redis.cmd(&["CLIENT", "PAUSE", "60000", "WRITE"]);
    wait_for("every page written", Duration::from_secs(15), || {
        sink_records(&rig.cfg).len() == items * ITEMS_PER_PAGE as usize
    });
    let k = crate::support::keys::keys();
    // Written, and nothing of any end recorded: each task waits in its end.
    let locks = item_keys(&mut conn, |j, i| k.item_lock(j, i));
    assert_eq!(locks.len(), items, "{locks:?}");
    assert!(item_keys(&mut conn, |j, i| k.since(j, i)).is_empty());
    assert!(item_keys(&mut conn, |j, i| k.item_ran(j, i)).is_empty());
    assert_eq!(ended(&tick_outcomes(&mut conn, tick)), 0);

    let a = &mut rig.daemon;
    a.kill();
    assert!(a.wait_exit(Duration::from_secs(10)).is_some());
    // Every client but the one asking: the test's own connection too.
    let _: i64 = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    conn = redis.conn();
    let _: String = redis.cmd(&["CLIENT", "UNPAUSE"]);

    // Nothing of any end, over a quiet period in which a write the killed
    // daemon had waiting would land: each item still held by the dead
    // daemon's lock, which lapses within its TTL, and no run's state half
    // written.
    let (mut locks, mut since, mut ran, mut ends) = Default::default();
    holds_for(Duration::from_millis(300), || {
        locks = item_keys(&mut conn, |j, i| k.item_lock(j, i));
        since = item_keys(&mut conn, |j, i| k.since(j, i));
        ran = item_keys(&mut conn, |j, i| k.item_ran(j, i));
        ends = ended(&tick_outcomes(&mut conn, tick));
        locks.len() == items && since.is_empty() && ran.is_empty() && ends == 0
    });
    assert_eq!(locks.len(), items, "{locks:?}");
    assert!(since.is_empty(), "{since:?}");
    assert!(ran.is_empty(), "{ran:?}");
    assert_eq!(ends, 0);
    for item in &locks {
        let pttl: i64 = redis.cmd(&["PTTL", &k.item_lock(JOB, item)]);
        assert!(
            (-2..=lock_ttl_ms).contains(&pttl),
            "{item}'s lock outlives its TTL: {pttl} ms"
        );
    }

    // Another daemon runs what the killed one left, once each.
    let mut b = rig.another("daemon-b");
    rig.wait_ticks(&[tick], ITEMS, Duration::from_secs(60));
    // A quiet period, in which a task run twice would show.
    let mut o = tick_outcomes(&mut conn, tick);
    let once = holds_for(Duration::from_secs(1), || {
        o = tick_outcomes(&mut conn, tick);
        o.get("done") == Some(&ITEMS) && ended(&o) == ITEMS
    });
    assert_eq!(o.get("done"), Some(&ITEMS), "{o:?}");
    assert!(once, "a task ended twice: {o:?}");
    // Requests, not charges: the simulator charges no delayed answer.
    let fetched = upstream.stats().requests_per_page(0);
    assert_eq!(fetched.len(), items, "{fetched:?}");
    assert!(fetched.values().all(|n| *n <= 2), "{fetched:?}");
    assert!(item_keys(&mut conn, |j, i| k.item_lock(j, i)).is_empty());
    assert_eq!(item_keys(&mut conn, |j, i| k.since(j, i)).len(), items);
    assert_eq!(item_keys(&mut conn, |j, i| k.item_ran(j, i)).len(), items);
    assert!(item_keys(&mut conn, |j, i| k.cursor(j, i)).is_empty());
    eprintln!(
        "MEASURE killed while recording ends: pages fetched twice: {} of {items}",
        fetched.values().filter(|n| **n == 2).count()
    );
    b.term();
    assert_eq!(
        b.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
}
