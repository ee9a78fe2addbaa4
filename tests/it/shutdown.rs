//! Promise: on SIGTERM the daemon stops taking tasks, lets the running ones
//! finish within `shutdown_timeout`, leaves the rest queued for another
//! daemon, and exits 0; a task cut off by the timeout is picked up later by
//! another daemon; and a daemon restarted at once after SIGTERM works
//! normally (apalis pitfall 6: a worker restarted under the same name fails).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use simulator::Fault;

use crate::support::daemon::{assert_sink_once, queue_state, sink_records, tick_outcomes, workers};
use crate::support::machine;
use crate::support::process::Proc;
use crate::support::rig::{Rig, outcomes};
use crate::support::upstream::Upstream;
use crate::support::world::{self, JOB, REGIONS};
use crate::support::{self, RedisServer, Worker, holds_for};

const PAGES: u32 = 3;
const ITEMS_PER_PAGE: u32 = 2;

fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        support::wait_until(timeout, cond),
        "timed out after {timeout:?} waiting for {what}"
    );
}

#[test]
fn sigterm_lets_running_tasks_finish_leaves_the_rest_queued_and_exits_0() {
    let _machine = machine::timing();
    let upstream = Upstream::start(PAGES, ITEMS_PER_PAGE);
    // Two slots, default recover_after (30 s): a task left in the stopped
    // daemon's hands instead of the queue would take 18 s or more to come
    // back, so a second daemon finishing the rest at once shows they were
    // really queued.
    let cfg = world::config(world::job(&upstream.base_url()).pages(PAGES))
        .worker(Worker::default().concurrency(2).shutdown_timeout("30s"))
        .write();
    let delay = Duration::from_secs(3);
    upstream.inject(Fault::Delay(delay), 2);
    let mut rig = Rig::new(cfg);
    let tick = rig.queue(JOB);

    // Both slots are busy with a slow first page.
    wait_for(
        "two slow requests in flight",
        Duration::from_secs(10),
        || upstream.injected() == 2,
    );
    let in_flight_since = Instant::now();
    let mut conn = rig.conn();
    // A quiet period: no third task is taken while both slots are busy.
    let mut before = queue_state(&mut conn);
    let six_wait = holds_for(Duration::from_millis(300), || {
        before = queue_state(&mut conn);
        before.waiting() == 6
    });
    assert!(six_wait, "six tasks wait: {before:?}");

    let (cfg, a) = (&rig.cfg, &mut rig.daemon);
    a.term();
    let sigterm = Instant::now();
    let status = a.wait_exit(Duration::from_secs(40));
    let to_exit = sigterm.elapsed();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit status after SIGTERM: {status:?}"
    );
    // It waited for the slow requests (the rest of their delay), and no more
    // than they needed.
    let remaining = delay.saturating_sub(sigterm.duration_since(in_flight_since));
    assert!(
        to_exit + Duration::from_millis(200) >= remaining,
        "exited {to_exit:?} after SIGTERM, before its running requests ({remaining:?} left) ended"
    );
    assert!(
        to_exit < delay + Duration::from_secs(5),
        "took {to_exit:?} to exit"
    );

    // The two running tasks finished: all their pages, in the sink.
    let ran = outcomes(a);
    assert_eq!(ran.len(), 2, "tasks run by daemon-a: {ran:?}");
    let mut finished = HashSet::new();
    for o in &ran {
        assert_eq!(o.kind, "done", "{o}");
        assert_eq!(o.pages, u64::from(PAGES), "{o}");
        finished.insert(
            o.line["item"]
                .as_str()
                .expect("item")
                .trim_start_matches("region=")
                .to_owned(),
        );
    }
    let records = sink_records(cfg);
    assert_eq!(records.len(), (2 * PAGES * ITEMS_PER_PAGE) as usize);
    assert!(records.iter().all(|(region, _)| finished.contains(region)));
    // No other task started: the upstream saw those two regions only (the
    // delayed first pages are served but, being injected, not charged).
    let stats = upstream.stats();
    assert_eq!(stats.charges.len(), 2 * (PAGES as usize - 1));
    assert!(stats.charges.iter().all(|c| finished.contains(&c.scope)));
    let o = tick_outcomes(&mut conn, tick);
    assert_eq!(o.get("done"), Some(&2), "{o:?}");

    // The other six are still queued, not held by the stopped daemon.
    let after = queue_state(&mut conn);
    assert_eq!(after.waiting(), 6, "after shutdown: {after:?}");
    assert_eq!(after.inflight, 0, "after shutdown: {after:?}");

    // A second daemon runs them, promptly.
    let mut b = rig.spawn_another("daemon-b");
    let started = Instant::now();
    rig.wait_ticks(&[tick], 8, Duration::from_secs(15));
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // A quiet period, in which a task run twice would show.
    let mut o = tick_outcomes(&mut conn, tick);
    let once = holds_for(Duration::from_millis(500), || {
        o = tick_outcomes(&mut conn, tick);
        o.get("done") == Some(&8)
    });
    assert!(once, "{o:?}");
    // Its outcome lines reach its log after Redis's record.
    support::wait_until(Duration::from_secs(10), || b.outcomes().len() >= 6);
    assert_eq!(b.outcomes().len(), 6);
    let stats = upstream.stats();
    assert_eq!(stats.charges.len(), REGIONS.len() * PAGES as usize - 2);
    // Every page of every region in the sink, once.
    assert_sink_once(&rig.cfg, REGIONS.len() * (PAGES * ITEMS_PER_PAGE) as usize);
    assert!(
        stats.duplicate_pages().is_empty(),
        "{:?}",
        stats.duplicate_pages()
    );

    b.term();
    assert_eq!(
        b.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
    eprintln!(
        "MEASURE sigterm->exit with 2 requests in flight ({remaining:?} of their delay left): {to_exit:?}; queued tasks run by a second daemon in {took:?}"
    );
}

#[test]
fn shutdown_timeout_shorter_than_the_work_exits_0_and_another_daemon_finishes_it() {
    let _machine = machine::timing();
    let upstream = Upstream::start(PAGES, ITEMS_PER_PAGE);
    let cfg = world::config(
        world::job(&upstream.base_url())
            .fan_out("region", ["US"])
            .pages(PAGES),
    )
    .worker(
        Worker::default()
            .concurrency(1)
            .shutdown_timeout("2s")
            .recover_after("6s"),
    )
    .write();
    // The first page hangs far longer than the shutdown timeout.
    upstream.inject(Fault::Delay(Duration::from_secs(25)), 1);
    let mut rig = Rig::new(cfg);
    let tick = rig.queue(JOB);
    wait_for(
        "the slow request in flight",
        Duration::from_secs(10),
        || upstream.injected() == 1,
    );

    let a = &mut rig.daemon;
    a.term();
    let sigterm = Instant::now();
    let status = a.wait_exit(Duration::from_secs(15));
    let to_exit = sigterm.elapsed();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    assert!(
        to_exit >= Duration::from_millis(1_900) && to_exit < Duration::from_millis(4_500),
        "exited {to_exit:?} after SIGTERM with shutdown_timeout = 2s"
    );
    let mut conn = rig.conn();
    let o = tick_outcomes(&mut conn, tick);
    assert_eq!(o.get("done"), None, "the cut-off task did not end: {o:?}");
    let a = &rig.daemon;
    assert!(a.outcomes().is_empty());
    // It says so, and does not claim its tasks finished.
    assert!(
        a.messages("all running tasks finished").is_empty(),
        "{}",
        a.log()
    );
    let cut = a.messages(
        "shutdown timeout passed; unfinished tasks stay queued and another daemon (or the next start) picks them up",
    );
    assert_eq!(cut.len(), 1, "{}", a.log());

    // Nothing is lost: another daemon runs the task.
    let mut b = rig.spawn_another("daemon-b");
    let started = Instant::now();
    rig.wait_ticks(&[tick], 1, Duration::from_secs(40));
    let since_exit = sigterm.elapsed() - to_exit;
    let since_start = started.elapsed();
    // Its outcome line reaches its log after Redis's record.
    support::wait_until(Duration::from_secs(10), || !b.outcomes().is_empty());
    let outs = outcomes(&b);
    assert_eq!(outs.len(), 1, "{outs:?}");
    assert_eq!(outs[0].kind, "done");
    assert_eq!(outs[0].pages, u64::from(PAGES));
    let stats = upstream.stats();
    assert_eq!(stats.charges.len(), PAGES as usize);
    assert!(stats.duplicate_pages().is_empty());
    assert_eq!(
        sink_records(&rig.cfg).len(),
        (PAGES * ITEMS_PER_PAGE) as usize
    );
    b.term();
    assert_eq!(
        b.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
    eprintln!(
        "MEASURE shutdown_timeout=2s: sigterm->exit {to_exit:?}; cut-off task finished by another daemon {since_exit:?} after the exit ({since_start:?} after that daemon started; recover_after = 6s)"
    );
}

/// apalis pitfall 6: graceful close does not unregister a worker, and a
/// worker registering under a name seen alive within the threshold fails.
/// Names are unique per process and incarnation, so a daemon restarted at
/// once after SIGTERM takes tasks at once.
#[test]
fn pitfall_6_daemon_restarted_at_once_after_sigterm_runs_tasks() {
    let _machine = machine::timing();
    let upstream = Upstream::start(PAGES, ITEMS_PER_PAGE);
    let cfg = world::config(world::job(&upstream.base_url()).pages(PAGES))
        // 30 s recover_after: a stale registration would block for long.
        .worker(Worker::default().concurrency(4))
        .write();
    let mut rig = Rig::new(cfg);
    let mut conn = rig.conn();
    let mut names_seen: Vec<String> = Vec::new();
    for round in 0..3 {
        if round > 0 {
            let d = &mut rig.daemon;
            d.term();
            let status = d.wait_exit(Duration::from_secs(15));
            assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", d.label);
            // Started the moment the previous one exited.
            rig.daemon = rig.another(&format!("incarnation-{round}"));
        }
        let t = Instant::now();
        let out = rig.trigger_expect(JOB, 0).stdout;
        assert!(
            out.contains("8 task(s) ended: 8 done"),
            "round {round}: {out}"
        );
        let took = t.elapsed();
        assert!(took < Duration::from_secs(10), "round {round}: {took:?}");
        let restarts = rig
            .daemon
            .messages("worker stopped on an error; restarting");
        assert!(restarts.is_empty(), "round {round}: {restarts:?}");
        let names = workers(&mut conn);
        let new: Vec<&String> = names.iter().filter(|n| !names_seen.contains(n)).collect();
        assert_eq!(
            new.len(),
            1,
            "round {round}: one new worker name: {names:?}"
        );
        names_seen.push(new[0].clone());
        eprintln!("round {round}: worker {} ran a tick in {took:?}", new[0]);
    }
    assert_eq!(
        names_seen.iter().collect::<HashSet<_>>().len(),
        3,
        "{names_seen:?}"
    );
    let stats = upstream.stats();
    assert_eq!(stats.charges.len(), 3 * REGIONS.len() * PAGES as usize);
}

/// SIGTERM while Redis does not answer (down, or hung): the daemon still
/// exits 0 within about `shutdown_timeout`, whatever its loops were waiting
/// on (a tick being fanned out, a feeding round, a worker restart).
///
/// Bug: the scheduler's tick claim (five attempts with backoff, each up to
/// the queue connection's 10 s response timeout) and the feeder's round did
/// not listen for shutdown, and the daemon waited for both before draining
/// its workers: 13 s to exit with Redis down, 63 s with Redis hung, against
/// a 3 s shutdown_timeout.
fn sigterm_with_redis_unreachable(label: &str, break_redis: impl FnOnce(&mut RedisServer)) {
    let cfg = world::config(world::job("http://127.0.0.1:9").schedule("* * * * * *"))
        .worker(Worker::default().shutdown_timeout("3s").recover_after("6s"))
        .write();
    let mut rig = Rig::new(cfg);
    // The loops are at work: a tick has been claimed and fanned out.
    assert!(
        rig.daemon
            .wait_log("tick fanned out", Duration::from_secs(10)),
        "{label}: no tick fanned out: {}",
        rig.daemon.log()
    );
    let (redis, d) = (&mut rig.redis, &mut rig.daemon);
    break_redis(redis);
    // About time: long enough for every loop to be stuck on Redis (a tick
    // falls due every second); a hung Redis says nothing to wait for.
    std::thread::sleep(Duration::from_secs(3));
    d.term();
    let t = Instant::now();
    let status = d.wait_exit(Duration::from_secs(120));
    let took = t.elapsed();
    redis.resume();
    eprintln!("MEASURE {label}: sigterm->exit {took:?} (shutdown_timeout = 3s), status {status:?}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{label}: {status:?}"
    );
    assert!(
        took <= Duration::from_secs(3) + Duration::from_millis(1_500),
        "{label}: took {took:?} to exit after SIGTERM with shutdown_timeout = 3s"
    );
}

#[test]
fn sigterm_with_redis_down_exits_0_within_shutdown_timeout() {
    let _machine = machine::timing();
    sigterm_with_redis_unreachable("redis down", |r| r.kill());
}

#[test]
fn sigterm_with_redis_hung_exits_0_within_shutdown_timeout() {
    let _machine = machine::timing();
    sigterm_with_redis_unreachable("redis hung", |r| r.pause());
}

/// SIGTERM while the daemon still waits for Redis at startup (it retries
/// for up to 30 s): a clean, prompt exit 0, like any other SIGTERM.
///
/// Bug: the signal handlers were installed only when the shutdown future
/// was first polled, after Redis answered: until then SIGTERM's default
/// action killed the daemon (no exit 0, no log line).
#[test]
fn sigterm_while_waiting_for_redis_at_startup_exits_0_at_once() {
    let _machine = machine::timing();
    let port = support::free_port();
    let url = format!("redis://127.0.0.1:{port}/0");
    let cfg = world::config(world::job("http://127.0.0.1:9")).write();
    let mut d = Proc::daemon("daemon", &cfg, Some(&url), &[]);
    assert!(
        d.wait_log("Redis unreachable; retrying", Duration::from_secs(10)),
        "it says it waits for Redis: {}",
        d.log()
    );
    assert!(d.running(), "it waits for Redis: {}", d.log());
    d.term();
    let t = Instant::now();
    let status = d.wait_exit(Duration::from_secs(40));
    let took = t.elapsed();
    eprintln!("MEASURE sigterm while connecting: exit {status:?} after {took:?}");
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// apalis pitfall 14: with more than four tasks ending during a shutdown,
/// the drain waited out all of `shutdown_timeout`.
///
/// apalis-core's persistence layer sends each task's ack ("complete") into
/// a channel of `batch_size × 4` slots (4 here: batch 1), which only the
/// worker's `poll_ready` and `poll_close` empty; once shutdown starts,
/// `CallAll` calls neither until every task future has ended, and a task
/// future whose ack found the channel full never ends. The daemon exited at
/// `shutdown_timeout` (30 s) though the tasks ended after 3 s, and their
/// acks were lost.
#[test]
fn pitfall_14_sigterm_with_8_tasks_in_flight_exits_when_they_end() {
    let _machine = machine::timing();
    let upstream = Upstream::start(PAGES, ITEMS_PER_PAGE);
    let shutdown_timeout = Duration::from_secs(30);
    let cfg = world::config(world::job(&upstream.base_url()).pages(PAGES))
        .worker(Worker::default().concurrency(8).shutdown_timeout("30s"))
        .write();
    // Every task's first page is slow, and they all end at about the same
    // time: eight acks at once.
    let delay = Duration::from_secs(3);
    upstream.inject(Fault::Delay(delay), REGIONS.len() as u32);
    let mut rig = Rig::new(cfg);
    let tick = rig.queue(JOB);
    wait_for(
        "eight slow requests in flight",
        Duration::from_secs(15),
        || upstream.injected() == REGIONS.len() as u64,
    );

    let a = &mut rig.daemon;
    a.term();
    let sigterm = Instant::now();
    let status = a.wait_exit(Duration::from_secs(45));
    let to_exit = sigterm.elapsed();
    eprintln!(
        "MEASURE sigterm->exit with 8 requests in flight (3 s delay, shutdown_timeout 30 s): {to_exit:?}"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    // The tasks end about 3 s after SIGTERM; the drain must not wait for
    // the shutdown timeout (generous margin for a loaded machine).
    assert!(
        to_exit < shutdown_timeout / 2,
        "took {to_exit:?} to exit after SIGTERM, though its tasks ended ~3 s after it began: {}",
        a.log()
    );
    assert_eq!(
        a.messages("all running tasks finished").len(),
        1,
        "{}",
        a.log()
    );

    // All eight finished in that daemon, and their acks reached the queue:
    // nothing left in flight for another daemon to run again.
    let ran = outcomes(a);
    assert_eq!(ran.len(), REGIONS.len(), "{ran:?}");
    assert!(ran.iter().all(|o| o.kind == "done"), "{ran:?}");
    let mut conn = rig.conn();
    let o = tick_outcomes(&mut conn, tick);
    assert_eq!(o.get("done"), Some(&(REGIONS.len() as i64)), "{o:?}");
    let after = queue_state(&mut conn);
    assert_eq!(after.waiting(), 0, "after shutdown: {after:?}");
    assert_eq!(after.inflight, 0, "after shutdown: {after:?}");
}
