//! The systemd notify protocol of `quota-worker run` (SPEC: `Type=notify`):
//! `READY=1` once Redis answers and the workers run, `WATCHDOG=1` at half of
//! `WATCHDOG_USEC`, `STATUS=` lines an operator reads in `systemctl status`,
//! `STOPPING=1` on SIGTERM — in that order, all from the daemon's own pid
//! (`NotifyAccess=main` would drop anything else). The test plays systemd: it
//! binds the datagram socket and records the sender of every message.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::machine;
use crate::support::notify::NotifySocket;
use crate::support::process::Proc;
use crate::support::procfs::{children_named, environ};
use crate::support::rig::Rig;
use crate::support::world::{self, CREDENTIAL, ENDPOINT};
use crate::support::{RedisServer, TestConfig, Window, Worker};

/// WATCHDOG_USEC the tests announce: pings are due every 500 ms.
const WATCHDOG_USEC: &str = "1000000";

fn config(redis: Option<&str>, state_dir: &str) -> TestConfig {
    // A job whose schedule never fires while the test runs: the scheduler
    // loop runs (and beats) as in production, nothing is fetched.
    let mut config = world::idle(
        world::credential(Window::sliding(9500, "24h")).window(Window::sliding(600, "1m")),
    )
    .state_dir(state_dir)
    .worker(Worker::default().concurrency(8).shutdown_timeout("5s"));
    if let Some(url) = redis {
        config = config.redis_url(url);
    }
    config.write()
}

/// What systemd gives a unit with `Type=notify` and `WatchdogSec`, the
/// socket at `path`.
fn systemd(path: &std::path::Path) -> [(&str, &str); 2] {
    [
        ("NOTIFY_SOCKET", path.to_str().expect("utf-8 path")),
        ("WATCHDOG_USEC", WATCHDOG_USEC),
    ]
}

/// The daemon on a Redis of its own (its state in `state`), run as
/// systemd would, notifying `notify`.
fn daemon(state: &std::path::Path, notify: &NotifySocket) -> Rig {
    let redis = RedisServer::start();
    let cfg = config(Some(&redis.url()), &state.display().to_string());
    Rig::start(redis, cfg, &systemd(&notify.path()))
}

/// The daemon on its embedded Redis, run as systemd would, with `extra`
/// in its environment.
fn embedded_daemon(cfg: &TestConfig, notify: &NotifySocket, extra: &[(&str, &str)]) -> Proc {
    let path = notify.path();
    let mut env = systemd(&path).to_vec();
    env.extend_from_slice(extra);
    Proc::start("daemon", cfg, &["run"], &env)
}

fn is_status_line(s: &str) -> bool {
    // "8 workers, 0 in flight, sim 0/9500 units"
    let Some(rest) = s.strip_prefix("8 workers, ") else {
        return false;
    };
    let Some((in_flight, rest)) = rest.split_once(&format!(" in flight, {CREDENTIAL} ")) else {
        return false;
    };
    let Some(units) = rest.strip_suffix("/9500 units") else {
        return false;
    };
    in_flight.parse::<u64>().is_ok() && units.parse::<u64>().is_ok()
}

#[test]
fn ready_then_watchdog_then_stopping_in_order_with_status_lines() {
    let _machine = machine::timing();
    let state = tempfile::tempdir().expect("tempdir");
    let notify = NotifySocket::bind();
    let started = Instant::now();
    let mut rig = daemon(state.path(), &notify);
    let (redis, cfg, d) = (&mut rig.redis, &mut rig.cfg, &mut rig.daemon);

    let ready = notify
        .wait_for("READY=1", 1, Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no READY=1 within 20 s:\n{}", notify.dump(started)));
    eprintln!(
        "READY=1 {:.0} ms after start",
        ready.duration_since(started).as_secs_f64() * 1000.0
    );
    assert!(
        notify
            .wait_for(
                &format!("STATUS=8 workers, 0 in flight, {CREDENTIAL} 0/9500 units"),
                1,
                Duration::from_secs(10)
            )
            .is_some(),
        "no initial STATUS line:\n{}",
        notify.dump(started)
    );

    // The STATUS line reads the shared windows live: a spend from the CLI
    // shows up in the next one (they are refreshed every 5 s).
    let spent = cfg.run_on(redis, &["spend", ENDPOINT, "--cost", "412"]);
    assert_eq!(spent.status.code(), Some(0), "{spent:?}");
    assert!(
        notify
            .wait_for(
                &format!("STATUS=8 workers, 0 in flight, {CREDENTIAL} 412/9500 units"),
                1,
                Duration::from_secs(8)
            )
            .is_some(),
        "the STATUS line did not show the 412 units spent:\n{}",
        notify.dump(started)
    );
    // At least 3 s of pings.
    let ready_plus = ready + Duration::from_secs(3);
    std::thread::sleep(ready_plus.saturating_duration_since(Instant::now()));

    let term_at = Instant::now();
    d.term();
    let stopping = notify
        .wait_for("STOPPING=1", 1, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no STOPPING=1 after SIGTERM:\n{}", notify.dump(started)));
    let status = d
        .wait_exit(Duration::from_secs(15))
        .expect("daemon exits within shutdown_timeout after SIGTERM");
    eprintln!(
        "SIGTERM -> STOPPING=1: {:.1} ms; SIGTERM -> exit: {:.0} ms",
        stopping.saturating_duration_since(term_at).as_secs_f64() * 1000.0,
        term_at.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(status.code(), Some(0), "clean shutdown exits 0");
    assert!(
        stopping.saturating_duration_since(term_at) < Duration::from_secs(1),
        "STOPPING=1 must be sent as soon as the shutdown starts"
    );

    let notices = notify.notices();
    let dump = notify.dump(started);
    // Everything comes from the daemon itself.
    for n in &notices {
        assert_eq!(
            n.pid,
            Some(d.pid()),
            "a notice not from the daemon:\n{dump}"
        );
    }
    let lines: Vec<&str> = notices.iter().map(|n| n.line.as_str()).collect();
    assert_eq!(
        lines.first(),
        Some(&"READY=1"),
        "READY=1 comes first:\n{dump}"
    );
    assert_eq!(
        lines.iter().filter(|l| **l == "READY=1").count(),
        1,
        "{dump}"
    );
    assert_eq!(
        lines.iter().filter(|l| **l == "STOPPING=1").count(),
        1,
        "{dump}"
    );
    let stop_ix = lines
        .iter()
        .position(|l| *l == "STOPPING=1")
        .expect("STOPPING=1");
    // Several pings between READY and STOPPING, none far apart.
    let pings: Vec<Instant> = notices[..stop_ix]
        .iter()
        .filter(|n| n.line == "WATCHDOG=1")
        .map(|n| n.at)
        .collect();
    assert!(
        pings.len() >= 5,
        "expected several WATCHDOG=1 before STOPPING=1:\n{dump}"
    );
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    let max_gap = gaps.iter().max().copied().unwrap_or_default();
    eprintln!("{} pings, largest gap {max_gap:?}", pings.len());
    assert!(
        max_gap < Duration::from_millis(900),
        "pings must come at about half of WATCHDOG_USEC (1 s), well before it runs out; largest gap {max_gap:?}:\n{dump}"
    );
    assert!(
        pings[0].duration_since(ready) < Duration::from_millis(900),
        "the first ping follows READY=1 promptly:\n{dump}"
    );
    // Every message is one of the protocol's.
    for l in &lines {
        match l.split_once('=') {
            Some(("READY" | "WATCHDOG" | "STOPPING", "1")) => {}
            Some(("STATUS", s)) => assert!(is_status_line(s), "odd STATUS line {s:?}"),
            _ => panic!("unexpected notify line {l:?}:\n{dump}"),
        }
    }
}

/// The real `redis-server` (`$REDIS_SERVER`, else the first on `PATH`).
fn real_redis_server() -> PathBuf {
    if let Some(p) = std::env::var_os("REDIS_SERVER") {
        return PathBuf::from(p);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .expect("redis-server on PATH")
}

/// Regression: redis-server speaks the notify protocol itself. An embedded
/// Redis that inherited `NOTIFY_SOCKET` (or the watchdog variables) could tell
/// systemd the *service* is ready before the daemon is, or be taken for the
/// main process; the daemon removes them from the child's environment.
///
/// The daemon finds a `redis-server` on `PATH` that the test put first: it
/// records the environment it was given (redis-server's own
/// `/proc/PID/environ` is overwritten by its process title) and runs the real
/// one with `--supervised auto`, so that an inherited `NOTIFY_SOCKET` would
/// also make it send its own `READY=1`, as a packaged redis.conf does.
#[test]
fn embedded_redis_does_not_inherit_notify_socket() {
    let state = tempfile::tempdir().expect("tempdir");
    let cfg = config(None, &state.path().display().to_string());
    let shim_dir = tempfile::tempdir().expect("tempdir");
    let env_dump = shim_dir.path().join("redis-server.env");
    let shim = shim_dir.path().join("redis-server");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\nenv > '{}'\nexec '{}' \"$@\" --supervised auto\n",
            env_dump.display(),
            real_redis_server().display()
        ),
    )
    .expect("write shim");
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod shim");
    let path = std::env::join_paths(std::iter::once(shim_dir.path().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let notify = NotifySocket::bind();
    let started = Instant::now();
    let mut d = embedded_daemon(
        &cfg,
        &notify,
        &[("PATH", path.to_str().expect("utf-8 PATH"))],
    );
    notify
        .wait_for("READY=1", 1, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no READY=1 within 30 s:\n{}", notify.dump(started)));

    let children = children_named(d.pid(), "redis-server");
    assert_eq!(
        children.len(),
        1,
        "the daemon runs one embedded redis-server (children: {children:?})"
    );
    let env =
        std::fs::read_to_string(&env_dump).expect("the shim ran and recorded its environment");
    assert!(env.contains("PATH="), "a real environment dump:\n{env}");
    for var in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
        assert!(
            !env.lines().any(|e| e.starts_with(&format!("{var}="))),
            "the embedded redis-server inherited {var}:\n{env}"
        );
    }
    // The daemon's own environment does hold them.
    assert!(
        environ(d.pid())
            .iter()
            .any(|e| e.starts_with("NOTIFY_SOCKET=")),
        "the daemon was started with NOTIFY_SOCKET"
    );

    // Some pings, then a clean stop.
    assert!(
        notify
            .wait_for("WATCHDOG=1", 3, Duration::from_secs(5))
            .is_some(),
        "{}",
        notify.dump(started)
    );
    d.term();
    assert!(
        notify
            .wait_for("STOPPING=1", 1, Duration::from_secs(5))
            .is_some(),
        "{}",
        notify.dump(started)
    );
    let status = d.wait_exit(Duration::from_secs(20)).expect("daemon exits");
    assert_eq!(status.code(), Some(0));
    assert!(
        children_named(d.pid(), "redis-server").is_empty()
            && !std::path::Path::new(&format!("/proc/{}", children[0])).exists(),
        "the embedded redis-server is stopped with the daemon"
    );

    let dump = notify.dump(started);
    let notices = notify.notices();
    assert_eq!(notify.count("READY=1"), 1, "exactly one READY=1:\n{dump}");
    for n in &notices {
        assert_eq!(
            n.pid,
            Some(d.pid()),
            "a notify message from another process than the daemon:\n{dump}"
        );
    }
}

/// systemd's notify-reload protocol (systemd.service(5)): on SIGHUP,
/// `RELOADING=1` with `MONOTONIC_USEC=` (CLOCK_MONOTONIC) in one message,
/// then `READY=1` once the reload is done — whether the config was applied
/// or refused, so `systemctl reload` never hangs on a bad file.
#[test]
fn a_reload_says_reloading_with_monotonic_usec_then_ready_applied_or_refused() {
    let state = tempfile::tempdir().expect("tempdir");
    let notify = NotifySocket::bind();
    let started = Instant::now();
    let mut rig = daemon(state.path(), &notify);
    let (cfg, d) = (&mut rig.cfg, &mut rig.daemon);
    assert!(
        notify
            .wait_for("READY=1", 1, Duration::from_secs(20))
            .is_some(),
        "{}",
        notify.dump(started)
    );
    let monotonic_now = || {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec it is given.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
    };

    for (round, ready_count) in [(1, 2), (2, 3)] {
        if round == 2 {
            // A file that does not parse: refused, READY=1 all the same.
            std::fs::write(cfg.path(), "this is not toml = = =").expect("write");
        }
        let before = monotonic_now();
        d.signal(libc::SIGHUP);
        let reloading = notify
            .wait_for("RELOADING=1", round, Duration::from_secs(20))
            .unwrap_or_else(|| panic!("no RELOADING=1:\n{}", notify.dump(started)));
        assert!(
            notify
                .wait_for("READY=1", ready_count, Duration::from_secs(20))
                .is_some(),
            "no READY=1 after the reload:\n{}",
            notify.dump(started)
        );
        let after = monotonic_now();
        let notices = notify.notices();
        // In the same datagram as RELOADING=1 (it arrived at the same instant).
        let usec: Vec<u64> = (notices.iter())
            .filter(|n| n.at == reloading)
            .filter_map(|n| n.line.strip_prefix("MONOTONIC_USEC="))
            .filter_map(|v| v.parse().ok())
            .collect();
        assert_eq!(usec.len(), 1, "{}", notify.dump(started));
        assert!(
            (before..=after).contains(&usec[0]),
            "MONOTONIC_USEC={} outside [{before}, {after}]",
            usec[0]
        );
        let lines: Vec<&str> = notices.iter().map(|n| n.line.as_str()).collect();
        let reload_ix = (lines.iter())
            .enumerate()
            .filter(|(_, l)| **l == "RELOADING=1")
            .map(|(i, _)| i)
            .nth(round - 1)
            .expect("RELOADING=1");
        assert!(
            lines[reload_ix..].contains(&"READY=1"),
            "READY=1 after RELOADING=1:\n{}",
            notify.dump(started)
        );
    }
    assert!(d.running(), "{}", d.log());
}
