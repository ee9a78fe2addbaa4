//! Promise: with no `[redis] url`, `quota-worker run` starts its own
//! redis-server on `<state_dir>/redis.sock` with AOF on, so quota state
//! survives a daemon restart (SIGTERM, and SIGKILL too); the CLI reaches it
//! over that socket; the embedded redis-server never outlives the daemon
//! (SIGTERM: stopped by the daemon; SIGKILL: `PR_SET_PDEATHSIG`); and a
//! missing redis-server is a clear error, exit 69.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::process::{Proc, run_cli};
use crate::support::procfs::{alive, child_pid};
use crate::support::upstream::Upstream;
use crate::support::world::{self, JOB, REGIONS};
use crate::support::{self, Worker};

const PAGES: u32 = 3;

fn used(cfg: &support::TestConfig) -> u64 {
    let (code, out, err) = run_cli(cfg, None, &["quota", "--json"], Duration::from_secs(20));
    assert_eq!(code, Some(0), "quota --json: {out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let creds = v["credentials"].as_array().expect("credentials");
    assert_eq!(creds.len(), 1, "{v}");
    let windows = creds[0]["windows"].as_array().expect("windows");
    assert_eq!(windows.len(), 1, "{v}");
    assert_eq!(windows[0]["scope"], "credential");
    windows[0]["used"].as_u64().expect("used")
}

fn spend(cfg: &support::TestConfig, cost: u64) {
    let cost = cost.to_string();
    let (code, out, err) = run_cli(
        cfg,
        None,
        &["spend", world::ENDPOINT, "--cost", &cost, "--json"],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "spend: {out}\n{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["allowed"], true, "{v}");
}

/// `trigger JOB --wait` on the embedded Redis: every task ends done.
fn trigger_all_done(cfg: &support::TestConfig) {
    let (code, out, err) = run_cli(
        cfg,
        None,
        &["trigger", JOB, "--wait"],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "trigger --wait: {out}\n{err}");
    assert!(out.contains("8 task(s) ended: 8 done"), "{out}");
}

/// `quota` fails with 69 when nothing answers on the socket.
fn assert_unreachable(cfg: &support::TestConfig) {
    let (code, out, err) = run_cli(cfg, None, &["quota", "--json"], Duration::from_secs(30));
    assert_eq!(code, Some(69), "quota with no daemon: {out}\n{err}");
}

/// The world's job paging `upstream`, eight worker slots, the state (and
/// the embedded Redis's socket and files) in `state/`.
fn config(upstream: &Upstream) -> support::TestConfig {
    world::config(world::job(&upstream.base_url()).pages(PAGES))
        .state_dir("state")
        .worker(Worker::default().concurrency(8))
        .write()
}

fn start(label: &str, cfg: &support::TestConfig) -> (Proc, u32) {
    let mut d = Proc::daemon(label, cfg, None, &[]);
    d.wait_running(Duration::from_secs(20));
    let pid = child_pid(d.pid(), "redis-server").expect("the daemon's redis-server child");
    assert!(
        cfg.join("state/redis.sock").exists(),
        "socket in the state dir"
    );
    (d, pid)
}

#[test]
fn embedded_redis_keeps_quota_state_across_daemon_restarts_and_never_outlives_the_daemon() {
    let upstream = Upstream::start(PAGES, 2);
    let cfg = config(&upstream);

    let (mut d, redis_pid) = start("embedded-1", &cfg);
    assert!(alive(redis_pid));
    // It runs with what docs/redis.md asks of a Redis: nothing evicted, and
    // the smaller stream nodes it suggests.
    let url = format!("unix://{}", cfg.join("state/redis.sock").display());
    let mut conn = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .expect("the embedded Redis's socket");
    for (name, want) in [
        ("maxmemory-policy", "noeviction"),
        ("stream-node-max-entries", "32"),
    ] {
        let got: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(&mut conn)
            .expect("CONFIG GET");
        assert_eq!(got, [name, want], "the embedded Redis's {name}");
    }
    drop(conn);
    // The daemon works on it (trigger reaches it over the socket too) ...
    trigger_all_done(&cfg);
    // ... and so does `spend`.
    spend(&cfg, 5);
    spend(&cfg, 7);
    let before = used(&cfg);
    assert_eq!(before, (REGIONS.len() as u64) * u64::from(PAGES) + 12);

    // SIGTERM: the daemon stops its redis-server (which writes its AOF).
    d.term();
    let t = Instant::now();
    let status = d.wait_exit(Duration::from_secs(40));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}");
    let to_exit = t.elapsed();
    assert!(
        !alive(redis_pid),
        "the embedded redis-server (pid {redis_pid}) outlived the daemon"
    );
    assert!(
        !cfg.join("state/redis/owner.pid").exists(),
        "owner.pid left behind"
    );
    assert_unreachable(&cfg);

    // Started again: the same units used.
    let (mut d, redis_pid) = start("embedded-2", &cfg);
    assert_eq!(used(&cfg), before, "quota state after a SIGTERM restart");
    spend(&cfg, 3);
    let before = before + 3;
    assert_eq!(used(&cfg), before);

    // SIGKILL: the daemon cannot stop its child; the kernel does.
    d.kill();
    let t = Instant::now();
    assert!(
        support::wait_until(Duration::from_secs(10), || !alive(redis_pid)),
        "the embedded redis-server (pid {redis_pid}) outlived a SIGKILLed daemon"
    );
    let child_gone = t.elapsed();
    assert_unreachable(&cfg);

    // And nothing spent is lost.
    let (mut d, _) = start("embedded-3", &cfg);
    assert_eq!(used(&cfg), before, "quota state after a SIGKILL restart");
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(40)).and_then(|s| s.code()),
        Some(0)
    );
    eprintln!(
        "MEASURE embedded: sigterm->exit {to_exit:?} (redis-server stopped with it); redis-server gone {child_gone:?} after the daemon's SIGKILL"
    );
}

#[test]
fn embedded_redis_missing_is_a_clear_error_exit_69() {
    let cfg = world::config(world::job("http://127.0.0.1:9"))
        .state_dir("state")
        .write();
    let empty = tempfile::tempdir().expect("tempdir");
    let path = empty.path().to_string_lossy().into_owned();
    let mut d = Proc::sim_cli("no-redis", &cfg, None, &["run"], &[("PATH", &path)]);
    let status = d.wait_exit(Duration::from_secs(20));
    let err = d.log();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(69),
        "exit status; stderr:\n{err}"
    );
    assert!(
        err.contains("redis-server") && err.contains("install"),
        "the error says to install redis-server:\n{err}"
    );
    assert!(
        err.contains("[redis] url"),
        "and how to use an existing Redis instead:\n{err}"
    );
}

#[test]
fn a_second_daemon_on_the_same_embedded_redis_is_refused_with_exit_69() {
    let cfg = world::config(world::job("http://127.0.0.1:9"))
        .state_dir("state")
        .write();
    let (mut first, redis_pid) = start("embedded-1", &cfg);
    let mut second = Proc::daemon("embedded-2", &cfg, None, &[]);
    let status = second.wait_exit(Duration::from_secs(20));
    let err = second.log();
    assert_eq!(status.and_then(|s| s.code()), Some(69), "stderr:\n{err}");
    assert!(
        err.contains(&format!("pid {}", first.pid())) && err.contains("[redis] url"),
        "names the daemon that runs it and the way out:\n{err}"
    );
    // The first one and its redis-server are unharmed.
    assert!(first.running() && alive(redis_pid));
    spend(&cfg, 1);
    first.term();
    assert_eq!(
        first
            .wait_exit(Duration::from_secs(40))
            .and_then(|s| s.code()),
        Some(0)
    );
    assert!(!alive(redis_pid));
}

/// A daemon SIGKILLed and started again at once (a supervisor restarting
/// it): its old redis-server is still shutting down (SIGTERM from
/// `PR_SET_PDEATHSIG`, flushing its AOF) when the new daemon looks at the
/// socket. The new daemon must end up on a working Redis with the same
/// state, not adopt the one that is going away.
///
/// Bug: it adopted it ("adopting an embedded Redis left running by a daemon
/// that is gone"), the server finished exiting a moment later, and the new
/// daemon ran on with no Redis at all (feeder: broken pipe, for good).
#[test]
fn daemon_restarted_at_once_after_sigkill_gets_a_working_embedded_redis() {
    let cfg = world::config(world::job("http://127.0.0.1:9"))
        .state_dir("state")
        .write();
    let (mut d, mut redis_pid) = start("embedded-0", &cfg);
    for round in 1..=5u64 {
        spend(&cfg, 1);
        d.kill();
        // No pause: the next one starts while the old redis-server exits.
        let mut next = Proc::daemon(&format!("embedded-{round}"), &cfg, None, &[]);
        next.wait_running(Duration::from_secs(20));
        let Some(own) = child_pid(next.pid(), "redis-server") else {
            panic!(
                "round {round}: the new daemon did not start its own redis-server (adopted the dying one?)"
            )
        };
        // Once the old redis-server is gone, the Redis the new daemon runs
        // on works and holds every unit spent so far.
        assert!(
            support::wait_until(Duration::from_secs(20), || !alive(redis_pid)),
            "round {round}: the old redis-server {redis_pid} outlived its daemon"
        );
        assert_eq!(used(&cfg), round, "round {round}");
        assert!(next.running(), "round {round}: {}", next.log());
        (d, redis_pid) = (next, own);
    }
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(40)).and_then(|s| s.code()),
        Some(0)
    );
}

/// A redis-server left running on the socket by a daemon that is gone (no
/// `PR_SET_PDEATHSIG` where it ran, say) is not adopted — an adopted server
/// would not be stopped with the daemon — but stopped and replaced by the
/// daemon's own child, on the same AOF: nothing spent is lost.
#[test]
fn a_left_over_embedded_redis_is_replaced_not_adopted_and_its_state_kept() {
    let cfg = world::config(world::job("http://127.0.0.1:9"))
        .state_dir("state")
        .write();
    let dir = cfg.join("state/redis");
    std::fs::create_dir_all(&dir).expect("state dir");
    let socket = cfg.join("state/redis.sock");
    /// Stops the left-over server by its pid if the test fails first.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut left = Reap(
        std::process::Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .arg("--dir")
            .arg(&dir)
            .args(["--appendonly", "yes", "--save", ""])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    let left_pid = left.0.id();
    // Started once it answers (its socket appears a moment before).
    let url = format!("unix://{}", socket.display());
    assert!(
        support::wait_until(Duration::from_secs(5), || socket.exists()
            && redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()),
        "the left-over redis-server did not start"
    );
    spend(&cfg, 4);
    // Its daemon is gone: a pid that is not running.
    std::fs::write(dir.join("owner.pid"), "999999999").expect("owner.pid");

    let (mut d, own) = start("embedded", &cfg);
    assert_ne!(own, left_pid);
    assert!(
        support::wait_until(Duration::from_secs(5), || matches!(
            left.0.try_wait(),
            Ok(Some(_))
        )),
        "the left-over redis-server was not stopped"
    );
    assert_eq!(used(&cfg), 4, "the state it held");
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(40)).and_then(|s| s.code()),
        Some(0)
    );
    assert!(!alive(own));
}

/// The embedded redis-server dies under the daemon (the OOM killer, a
/// crash): the daemon starts it again on the same files and carries on; the
/// new server is tied to the daemon like the first (gone after a SIGKILL).
///
/// Bug: nobody restarted it; the daemon ran on without Redis for good, its
/// worker restarting with ever longer backoff, and the CLI failing with 69.
#[test]
fn embedded_redis_killed_under_the_daemon_is_started_again() {
    let upstream = Upstream::start(PAGES, 2);
    let cfg = config(&upstream);
    let (mut d, redis_pid) = start("embedded", &cfg);
    spend(&cfg, 2);
    // About time: the AOF (appendfsync everysec) reaches the disk within
    // a second or so; the "crash" comes after.
    std::thread::sleep(Duration::from_millis(1_500));
    // SAFETY: kill(2) on the redis-server the daemon under test started; the
    // test plays the OOM killer.
    unsafe { libc::kill(redis_pid as i32, libc::SIGKILL) };
    let t = Instant::now();
    let back = support::wait_until(Duration::from_secs(20), || {
        run_cli(&cfg, None, &["quota", "--json"], Duration::from_secs(5)).0 == Some(0)
    });
    let took = t.elapsed();
    assert!(
        back,
        "20 s after its redis-server died the daemon still runs without one:\n{}",
        d.log()
    );
    assert!(d.running());
    let new_pid = child_pid(d.pid(), "redis-server").expect("a new redis-server child");
    assert_ne!(new_pid, redis_pid);
    assert_eq!(used(&cfg), 2, "the state on disk");
    trigger_all_done(&cfg);
    d.kill();
    assert!(
        support::wait_until(Duration::from_secs(10), || !alive(new_pid)),
        "the restarted redis-server outlived a SIGKILLed daemon"
    );
    eprintln!("MEASURE embedded redis-server SIGKILLed: serving again in {took:?}");
}

/// Issue 22, Low 4: the embedded Redis's `owner.pid` in the state directory
/// was written through a symbolic link planted in its place (the daemon's
/// pid over the link's target). It is refused: the daemon exits naming the
/// link, the target untouched.
#[test]
fn issue_22_low_4_a_link_planted_as_owner_pid_is_never_written_through() {
    let cfg = world::config(world::job("http://127.0.0.1:9"))
        .state_dir("state")
        .write();
    let victim = cfg.join("victim.txt");
    std::fs::write(&victim, "precious\n").expect("victim");
    std::fs::create_dir_all(cfg.join("state/redis")).expect("mkdir");
    std::os::unix::fs::symlink(&victim, cfg.join("state/redis/owner.pid")).expect("symlink");
    let mut d = Proc::sim_cli("embedded", &cfg, None, &["run"], &[]);
    let status = d.wait_exit(Duration::from_secs(20));
    if status.is_none() {
        d.kill();
    }
    let err = d.log();
    assert!(
        status.is_some_and(|s| !s.success()),
        "refused; stderr:\n{err}"
    );
    assert!(
        err.contains("owner.pid") && err.contains("symbolic link"),
        "names the link:\n{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious\n"
    );
}
