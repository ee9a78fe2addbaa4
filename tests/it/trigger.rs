//! Promise: `quota-worker trigger JOB --wait` against a running daemon queues
//! one tick, waits for its tasks, prints a one-line summary and exits 0; with
//! no daemon running it says so (a hint, not a silent hang), also when its
//! output is not a terminal.

use std::time::{Duration, Instant};

use crate::support::daemon::{tick_claims, tick_outcomes};
use crate::support::process::{Proc, run_cli};
use crate::support::redis_server::redis_conn;
use crate::support::rig::Rig;
use crate::support::upstream::{Blackhole, Upstream};
use crate::support::world::{self, JOB, REGIONS};
use crate::support::{self, RedisServer, TestConfig};

const PAGES: u32 = 3;

#[test]
fn trigger_wait_prints_a_one_line_summary_and_exits_0() {
    let upstream = Upstream::start(PAGES, 2);
    let rig = Rig::new(world::config(world::job(&upstream.base_url()).pages(PAGES)).write());

    let t = Instant::now();
    let out = rig.trigger_expect(JOB, 0).stdout;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "stdout:\n{out}");
    let tick = *rig.claims().keys().next().expect("the tick");
    assert_eq!(
        lines[0],
        format!("queued 8 task(s) of job {JOB} (tick {tick})")
    );
    assert_eq!(
        lines[1],
        format!("{JOB} tick {tick}: 8 task(s) ended: 8 done")
    );
    let o = tick_outcomes(&mut rig.conn(), tick);
    assert_eq!(o.get("done"), Some(&(REGIONS.len() as i64)));
    assert_eq!(upstream.fetched(), REGIONS.len() * PAGES as usize);
    eprintln!("trigger --wait took {took:?}");
}

#[test]
fn trigger_without_wait_queues_and_exits_at_once() {
    let redis = RedisServer::start();
    let cfg = world::config(world::job("http://127.0.0.1:9")).write();
    let (code, out, err) = run_cli(
        &cfg,
        Some(&redis.url()),
        &["trigger", JOB],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.starts_with("queued 8 task(s) of job trending (tick "),
        "{out}"
    );
    let mut conn = redis_conn(&redis.url());
    let ticks = tick_claims(&mut conn);
    assert_eq!(ticks.len(), 1);
    let tick = *ticks.keys().next().expect("tick");
    assert_eq!(tick_outcomes(&mut conn, tick).get("#items"), Some(&8));
}

/// Bug: the "is a daemon running?" hint went through the progress bar,
/// which draws nothing when stderr is not a terminal (indicatif's `println`
/// on a hidden bar is a no-op): under a script or CI, `trigger --wait` with
/// no daemon just hung in silence.
#[test]
fn trigger_wait_with_no_daemon_prints_the_hint_even_without_a_terminal() {
    let redis = RedisServer::start();
    let cfg = world::config(world::job("http://127.0.0.1:9")).write();
    let mut p = Proc::sim_cli(
        "trigger --wait",
        &cfg,
        Some(&redis.url()),
        &["trigger", JOB, "--wait"],
        &[],
    );
    let t = Instant::now();
    let hinted = support::wait_until(Duration::from_secs(25), || {
        p.log().contains("is a `quota-worker run` daemon running")
    });
    let after = t.elapsed();
    assert!(
        hinted,
        "no hint within 25 s; stdout:\n{}\nstderr:\n{}",
        p.stdout(),
        p.log()
    );
    assert!(p.running(), "it keeps waiting after the hint");
    assert!(p.stdout().starts_with("queued 8 task(s)"), "{}", p.stdout());
    p.kill();
    eprintln!("hint after {after:?}");
}

/// `trigger JOB --wait` on the world's config, once it has queued the
/// tick's 8 tasks (and waits for them to end).
fn waiting_trigger(cfg: &TestConfig, redis: &RedisServer) -> Proc {
    let p = Proc::sim_cli(
        "trigger --wait",
        cfg,
        Some(&redis.url()),
        &["trigger", JOB, "--wait"],
        &[],
    );
    assert!(
        support::wait_until(Duration::from_secs(10), || p
            .stdout()
            .starts_with("queued 8 task(s)")),
        "{}",
        p.log()
    );
    p
}

/// Issue 28: `trigger --wait` read the tick's counts every 200 ms (5
/// commands a second for as long as a tick ran). It blocks on the tick's
/// stream of ends now: with no task ending, over 5 s it sends a few
/// commands (a blocked `XREAD` every 5 s, a read of the counts after it),
/// not 25. No daemon runs here, so every command Redis counts is its.
#[test]
fn trigger_wait_blocks_on_redis_instead_of_polling_it() {
    let redis = RedisServer::start();
    let cfg = world::config(world::job("http://127.0.0.1:9")).write();
    let mut p = waiting_trigger(&cfg, &redis);
    // It is blocked on the tick's stream of ends.
    assert!(
        support::wait_until(Duration::from_secs(10), || redis.blocked_clients() == 1),
        "trigger --wait is not blocked on Redis: {}",
        p.log()
    );
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    // About time: the commands of 5 s of waiting are counted.
    std::thread::sleep(Duration::from_secs(5));
    let (commands, stats) = redis.command_calls();
    assert!(p.running(), "it keeps waiting: {}", p.log());
    p.kill();
    eprintln!("trigger --wait sent {commands} commands in 5 s:\n{stats}");
    assert!(
        commands <= 10,
        "trigger --wait sent {commands} commands in 5 s while nothing ended:\n{stats}"
    );
}

/// Bug: losing Redis while waiting ended `trigger --wait` with exit 69 and
/// no word why when stderr is not a terminal (the message went to the hidden
/// progress bar).
#[test]
fn trigger_wait_says_why_when_redis_goes_away() {
    let mut redis = RedisServer::start();
    let cfg = world::config(world::job("http://127.0.0.1:9")).write();
    let mut p = waiting_trigger(&cfg, &redis);
    redis.kill();
    let status = p.wait_exit(Duration::from_secs(30));
    let err = p.log();
    assert_eq!(status.and_then(|s| s.code()), Some(69), "stderr:\n{err}");
    assert!(err.contains("Redis"), "stderr says Redis was lost:\n{err}");
}

/// Issue 22, Low 5: with a daemon running and its tasks simply in flight
/// against a slow upstream, `trigger --wait` said after 10 s "no task has
/// ended yet: is a `quota-worker run` daemon running on this Redis?". It
/// says what is in flight instead, and keeps waiting.
#[test]
fn issue_22_low_5_trigger_wait_says_what_is_in_flight() {
    let upstream = Blackhole::start();
    let mut rig = Rig::new(world::config(world::job(&upstream.base_url())).write());
    let mut p = Proc::sim_cli(
        "trigger --wait",
        &rig.cfg,
        Some(&rig.redis.url()),
        &["trigger", JOB, "--wait"],
        &[],
    );
    let said = support::wait_until(Duration::from_secs(25), || {
        p.log().contains("no task has ended yet")
    });
    let log = p.log();
    assert!(said, "nothing said within 25 s:\n{log}");
    assert!(log.contains("in flight on 1 worker"), "{log}");
    assert!(
        !log.contains("daemon running"),
        "a daemon is running: {log}"
    );
    assert!(p.running(), "it keeps waiting");
    p.kill();
    rig.daemon.kill();
}
