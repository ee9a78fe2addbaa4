//! The systemd watchdog tracks the daemon's loops, not a timer: when the
//! scheduler loop is wedged, the `WATCHDOG=1` pings stop within
//! `liveness::STALE_AFTER` (12 s) and `/readyz` says why, while a healthy daemon
//! beside it keeps pinging over the same period. systemd would then kill and
//! restart the wedged one.
//!
//! The wedge is the in-process test hook `daemon::Hooks::wedge_scheduler`:
//! both daemons run in this process (`daemon::run`), each with its own notify
//! socket (`Notifier::to`), as the product reads no test switch from its
//! environment. A real systemd tripping `WatchdogSec` on a SIGSTOPped daemon
//! is the systemd test's business (scripts/).

use std::sync::Arc;
use std::time::{Duration, Instant};

use quota_worker::config::Config;
use quota_worker::daemon::{Hooks, RunOptions};
use quota_worker::liveness::STALE_AFTER;
use quota_worker::ops::Notifier;

use crate::support::http::http_get;
use crate::support::in_process::InProcess;
use crate::support::logs::Logs;
use crate::support::machine;
use crate::support::notify::NotifySocket;
use crate::support::rig::Rig;
use crate::support::world;
use crate::support::{self, RedisServer, TestConfig, Window, Worker, free_port};

/// Pings are due every 500 ms.
const WATCHDOG_USEC: &str = "1000000";
const WATCHDOG: Duration = Duration::from_secs(1);

fn config(url: &str, listen: &str) -> TestConfig {
    world::idle(world::credential(Window::sliding(9500, "24h")))
        .redis_url(url)
        .worker(Worker::default().concurrency(2).shutdown_timeout("2s"))
        .metrics_listen(listen)
        .write()
}

/// The binary on `redis`, run as systemd would: `NOTIFY_SOCKET`,
/// `WATCHDOG_USEC`.
fn start(redis: RedisServer, cfg: TestConfig, notify: &NotifySocket) -> Rig {
    let path = notify.path();
    let port = format!("127.0.0.1:{}", free_port());
    let env = vec![
        ("NOTIFY_SOCKET", path.to_str().expect("utf-8 path")),
        ("WATCHDOG_USEC", WATCHDOG_USEC),
        ("QUOTA_WORKER_METRICS_LISTEN", port.as_str()),
    ];
    Rig::start(redis, cfg, &env)
}

/// A daemon in this process, notifying `notify`; returns it and the port its
/// metrics endpoint listens on.
async fn start_in_process(
    cfg: &TestConfig,
    notify: &NotifySocket,
    wedge_scheduler: bool,
) -> (InProcess, u16) {
    // Only the test's variables: nothing leaks in from whoever runs it.
    let lookup = |name: &str| (name == world::KEY_ENV).then(|| world::SECRET.to_owned());
    let config = Config::load_with_env(&cfg.path(), &lookup).expect("config");
    let secrets = config.secrets_with_env(&lookup).expect("secrets");
    let (addr_tx, mut addr_rx) = tokio::sync::watch::channel(None);
    let opts = RunOptions {
        metrics_addr: Some(addr_tx),
        hooks: Hooks {
            wedge_scheduler,
            notify: Some(Notifier::to(notify.path(), Some(WATCHDOG))),
            ..Hooks::default()
        },
        ..RunOptions::default()
    };
    let daemon = InProcess::start(Arc::new(config), secrets, opts).await;
    let addr = *addr_rx
        .wait_for(Option::is_some)
        .await
        .expect("metrics address");
    (daemon, addr.expect("bound").port())
}

fn pings(n: &NotifySocket) -> Vec<Instant> {
    n.notices()
        .into_iter()
        .filter(|x| x.line == "WATCHDOG=1")
        .map(|x| x.at)
        .collect()
}

/// Blocking HTTP off the runtime's thread, which serves the daemons.
async fn get(port: u16, path: &'static str) -> Option<(u16, String)> {
    tokio::task::spawn_blocking(move || http_get(port, path))
        .await
        .expect("http_get")
}

// A current-thread runtime: the daemons' tasks all run on the test's thread,
// so the thread's log subscriber sees their lines.
#[tokio::test]
async fn watchdog_pings_stop_when_the_scheduler_loop_is_wedged() {
    let _machine = machine::timing();
    let (logs, _logging) = Logs::capture();

    let redis = RedisServer::start();
    let cfg = config(&redis.url(), "127.0.0.1:0");
    let (healthy_n, wedged_n) = (NotifySocket::bind(), NotifySocket::bind());
    let (mut healthy, healthy_port) = start_in_process(&cfg, &healthy_n, false).await;
    let (mut wedged, wedged_port) = start_in_process(&cfg, &wedged_n, true).await;
    // Sent before `start` returns; the socket's reader thread has it at once.
    let ready = tokio::task::spawn_blocking(move || {
        let at = wedged_n.wait_for("READY=1", 1, Duration::from_secs(5));
        (wedged_n, at)
    });
    let (wedged_n, ready) = ready.await.expect("join");
    let ready = ready.expect("the wedged daemon still starts and says READY=1");
    assert_eq!(
        healthy_n.count("READY=1"),
        1,
        "the healthy daemon says READY=1"
    );
    assert!(
        logs.text()
            .contains("test hook: the scheduler loop is wedged"),
        "the hook took effect:\n{}",
        logs.text()
    );

    // Watch for STALE_AFTER plus a margin, then a quiet period long enough
    // to hold about 12 pings at the 500 ms interval.
    let margin = Duration::from_secs(3);
    let quiet = Duration::from_secs(6);
    let end = ready + STALE_AFTER + margin + quiet;
    tokio::time::sleep(end.saturating_duration_since(Instant::now())).await;

    let w = pings(&wedged_n);
    let h = pings(&healthy_n);
    let last = *w
        .last()
        .expect("the wedged daemon pinged while its loops looked fresh");
    let stopped_after = last.duration_since(ready);
    eprintln!(
        "wedged: {} pings, the last {:.2} s after READY=1 (STALE_AFTER {STALE_AFTER:?}); healthy: {} pings",
        w.len(),
        stopped_after.as_secs_f64(),
        h.len()
    );
    assert!(
        stopped_after <= STALE_AFTER + margin,
        "the wedged daemon kept pinging {stopped_after:?} after READY=1 (limit {:?}):\n{}",
        STALE_AFTER + margin,
        wedged_n.dump(ready)
    );
    assert!(
        w.iter().all(|p| *p <= ready + STALE_AFTER + margin),
        "no ping after the loop went stale"
    );
    // The healthy daemon pinged all along, through the wedged one's silence.
    let quiet_from = ready + STALE_AFTER + margin;
    let healthy_in_quiet = h.iter().filter(|p| **p > quiet_from).count();
    assert!(
        healthy_in_quiet >= 8,
        "the healthy daemon must keep pinging (only {healthy_in_quiet} pings in the last {quiet:?}):\n{}",
        healthy_n.dump(ready)
    );
    let max_gap = h.windows(2).map(|p| p[1] - p[0]).max().unwrap_or_default();
    assert!(
        max_gap < Duration::from_millis(900),
        "healthy gap {max_gap:?}"
    );

    // The wedged daemon says why (once), and is alive but not ready.
    let text = logs.text();
    assert_eq!(
        text.matches("a loop stopped beating").count(),
        1,
        "the wedged daemon, and only it, logs why it withholds the ping:\n{text}"
    );
    let readyz = get(wedged_port, "/readyz").await;
    assert!(
        matches!(&readyz, Some((503, body)) if body.contains("scheduler not running")),
        "wedged /readyz: {readyz:?}"
    );
    assert_eq!(get(wedged_port, "/healthz").await.map(|r| r.0), Some(200));
    assert_eq!(get(healthy_port, "/readyz").await.map(|r| r.0), Some(200));

    // A wedged scheduler does not block the shutdown (`stop` asserts a clean
    // exit within 30 s).
    wedged.stop().await;
    healthy.stop().await;
}

/// A Redis that hangs is `/readyz`'s business, not a reason for systemd to
/// kill the daemon: the pings keep their interval while Redis answers
/// nothing (the `STATUS=` line, which reads Redis, must not hold them up).
#[test]
fn watchdog_pings_keep_their_interval_while_redis_hangs() {
    let _machine = machine::timing();
    let redis = RedisServer::start();
    let cfg = config(&redis.url(), "off");
    let notify = NotifySocket::bind();
    let mut rig = start(redis, cfg, &notify);
    let ready = notify
        .wait_for("READY=1", 1, Duration::from_secs(20))
        .expect("READY=1");
    assert!(
        notify
            .wait_for("WATCHDOG=1", 3, Duration::from_secs(5))
            .is_some()
    );

    // Hang Redis across more than one STATUS refresh (every 5 s).
    let paused = Instant::now();
    rig.redis.pause();
    // About time: the hang's length.
    std::thread::sleep(Duration::from_secs(7));
    rig.redis.resume();
    let resumed = Instant::now();
    // Every ping up to a second after it is in once a later one is (the
    // socket reads them in order).
    let after = resumed + Duration::from_secs(1);
    assert!(
        support::wait_until(Duration::from_secs(10), || pings(&notify)
            .iter()
            .any(|p| *p > after)),
        "no ping after Redis resumed:\n{}",
        notify.dump(ready)
    );

    let during: Vec<Instant> = pings(&notify)
        .into_iter()
        .filter(|p| *p >= paused && *p <= resumed + Duration::from_secs(1))
        .collect();
    let mut edges = vec![paused];
    edges.extend(during.iter().copied());
    edges.push(resumed);
    let max_gap = edges
        .windows(2)
        .map(|p| p[1].saturating_duration_since(p[0]))
        .max()
        .unwrap_or_default();
    eprintln!(
        "{} pings while Redis hung for 7 s; largest gap {max_gap:?}",
        during.len()
    );
    assert!(
        max_gap < Duration::from_millis(900),
        "a ping came {max_gap:?} after the previous one (WATCHDOG_USEC = 1 s: systemd would have killed the daemon):\n{}",
        notify.dump(ready)
    );
    let d = &mut rig.daemon;
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
}
