//! The systemd watchdog tracks the daemon's loops, not a timer: when the
//! scheduler loop is wedged (`QUOTA_WORKER_FAULT=wedge-scheduler`), the
//! `WATCHDOG=1` pings stop within `ops::STALE_AFTER` (12 s) and `/readyz`
//! says why, while a healthy daemon beside it keeps pinging over the same
//! period. systemd would then kill and restart the wedged one.

use std::time::{Duration, Instant};

use quota_worker::ops::STALE_AFTER;

use crate::support::daemon;
use crate::support::http::{self, http_get};
use crate::support::machine;
use crate::support::notify::NotifySocket;
use crate::support::process::Proc;
use crate::support::redis_server::free_port_except;
use crate::support::{RedisServer, TestConfig, Worker, free_port};

/// Pings are due every 500 ms.
const WATCHDOG_USEC: &str = "1000000";

fn config(url: &str) -> TestConfig {
    daemon::idle(daemon::yt_key1())
        .redis_url(url)
        .worker(Worker::default().concurrency(2).shutdown_timeout("2s"))
        .write()
}

fn start(cfg: &TestConfig, notify: &NotifySocket, port: u16, fault: Option<&str>) -> Proc {
    let path = notify.path();
    let port = format!("127.0.0.1:{port}");
    let mut env = vec![
        ("NOTIFY_SOCKET", path.to_str().expect("utf-8 path")),
        ("WATCHDOG_USEC", WATCHDOG_USEC),
        ("YT_KEY1", "not-a-real-key"),
        ("QUOTA_WORKER_METRICS_LISTEN", port.as_str()),
    ];
    if let Some(f) = fault {
        env.push(("QUOTA_WORKER_FAULT", f));
    }
    let label = if fault.is_some() { "wedged" } else { "healthy" };
    Proc::start(label, cfg, &["run"], &env)
}

fn pings(n: &NotifySocket) -> Vec<Instant> {
    n.notices()
        .into_iter()
        .filter(|x| x.line == "WATCHDOG=1")
        .map(|x| x.at)
        .collect()
}

#[test]
fn watchdog_pings_stop_when_the_scheduler_loop_is_wedged() {
    let _machine = machine::timing();
    let redis = RedisServer::start();
    let cfg = config(&redis.url());
    let (healthy_n, wedged_n) = (NotifySocket::bind(), NotifySocket::bind());
    let healthy_port = free_port();
    let wedged_port = free_port_except(&[healthy_port]);
    let mut healthy = start(&cfg, &healthy_n, healthy_port, None);
    let mut wedged = start(&cfg, &wedged_n, wedged_port, Some("wedge-scheduler"));
    let ready = wedged_n
        .wait_for("READY=1", 1, Duration::from_secs(20))
        .expect("the wedged daemon still starts and says READY=1");
    healthy_n
        .wait_for("READY=1", 1, Duration::from_secs(20))
        .expect("the healthy daemon says READY=1");
    assert!(http::wait_http(wedged_port, Duration::from_secs(10)));
    assert!(
        wedged.wait_log(
            "fault injected: the scheduler loop is wedged",
            Duration::from_secs(5)
        ),
        "the fault was injected"
    );

    // Watch for STALE_AFTER plus a margin, then a quiet period long enough
    // to hold about 12 pings at the 500 ms interval.
    let margin = Duration::from_secs(3);
    let quiet = Duration::from_secs(6);
    let end = ready + STALE_AFTER + margin + quiet;
    std::thread::sleep(end.saturating_duration_since(Instant::now()));

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

    // The wedged daemon says why, and is alive but not ready.
    assert!(
        wedged.wait_log("a loop stopped beating", Duration::from_secs(1)),
        "the wedged daemon logs why it withholds the ping"
    );
    let readyz = http_get(wedged_port, "/readyz");
    assert!(
        matches!(&readyz, Some((503, body)) if body.contains("scheduler not running")),
        "wedged /readyz: {readyz:?}"
    );
    assert_eq!(http_get(wedged_port, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(healthy_port, "/readyz").map(|r| r.0), Some(200));

    // A wedged scheduler does not block the shutdown.
    wedged.term();
    healthy.term();
    assert_eq!(
        wedged
            .wait_exit(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
    assert_eq!(
        healthy
            .wait_exit(Duration::from_secs(10))
            .and_then(|s| s.code()),
        Some(0)
    );
}

/// A Redis that hangs is `/readyz`'s business, not a reason for systemd to
/// kill the daemon: the pings keep their interval while Redis answers
/// nothing (the `STATUS=` line, which reads Redis, must not hold them up).
#[test]
fn watchdog_pings_keep_their_interval_while_redis_hangs() {
    let _machine = machine::timing();
    let redis = RedisServer::start();
    let cfg = config(&redis.url());
    let notify = NotifySocket::bind();
    let port = free_port();
    let mut d = start(&cfg, &notify, port, None);
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
    redis.pause();
    std::thread::sleep(Duration::from_secs(7));
    redis.resume();
    let resumed = Instant::now();
    std::thread::sleep(Duration::from_secs(2));

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
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
}
