//! `/healthz` and `/readyz` of a running daemon: `/healthz` says the process
//! is alive and stays 200 whatever Redis does; `/readyz` goes 503 when Redis
//! stops (or hangs) and 200 again when it is back on the same port, without
//! restarting the daemon. The HTTP endpoints answer promptly meanwhile.

use std::time::{Duration, Instant};

use crate::support::http::{self, http_get};
use crate::support::machine;
use crate::support::process::Proc;
use crate::support::rig::Rig;
use crate::support::world;
use crate::support::{RedisServer, TestConfig, Window, Worker, free_port, holds_every, wait_until};

fn config() -> TestConfig {
    world::idle(world::credential(Window::sliding(9500, "24h")))
        .redis_timeout("500ms")
        .worker(Worker::default().concurrency(2).shutdown_timeout("2s"))
        .metrics_listen("127.0.0.1:9464")
        .write()
}

/// The daemon on a Redis of its own, listening on a free port, once
/// `/readyz` says it is ready; and that port.
fn start() -> (Rig, u16) {
    let listen = format!("127.0.0.1:{}", free_port());
    let rig = Rig::start(
        RedisServer::start(),
        config(),
        &[("QUOTA_WORKER_METRICS_LISTEN", &listen)],
    );
    let port = rig.listener();
    assert!(http::wait_http(port, Duration::from_secs(20)));
    assert!(
        wait_until(Duration::from_secs(10), || status(port, "/readyz")
            == Some(200)),
        "ready after start: {:?}",
        http_get(port, "/readyz")
    );
    (rig, port)
}

/// `GET path`, and how long it took.
/// Redis answers again: the next read of the gauges says so
/// (`qw_redis_up` 1, after the 0 the test read while it did not), and the
/// daemon stops cleanly.
fn up_again_then_stop(port: u16, d: &mut Proc) {
    let up = http::scrape_until(port, Duration::from_secs(10), |m| {
        m.sum("qw_redis_up", &[]) == 1.0
    });
    assert_eq!(up.one("qw_redis_up", &[]), 1.0);
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
}

fn timed_get(port: u16, path: &str) -> (Option<(u16, String)>, Duration) {
    let t = Instant::now();
    let r = http_get(port, path);
    (r, t.elapsed())
}

fn status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).map(|r| r.0)
}

#[test]
fn readyz_follows_redis_and_healthz_stays_up() {
    let _machine = machine::timing();
    let (mut rig, port) = start();
    let (redis, d) = (&mut rig.redis, &mut rig.daemon);
    assert_eq!(http_get(port, "/healthz"), Some((200, "ok\n".into())));

    // Redis goes away.
    let stopped = Instant::now();
    redis.stop();
    let mut seen = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            seen = http_get(port, "/readyz");
            matches!(&seen, Some((503, _)))
        }),
        "/readyz must go 503 when Redis stops: {seen:?}"
    );
    let unready_after = stopped.elapsed();
    let body = seen.expect("a reply").1;
    assert!(body.contains("redis unreachable"), "says why: {body:?}");
    // While Redis is down (a quiet period of 3 s): alive, still not ready,
    // and every answer prompt.
    holds_every(Duration::from_secs(3), Duration::from_millis(200), || {
        let (h, ht) = timed_get(port, "/healthz");
        assert_eq!(
            h.map(|r| r.0),
            Some(200),
            "/healthz stays 200 without Redis"
        );
        let (r, rt) = timed_get(port, "/readyz");
        assert_eq!(r.map(|r| r.0), Some(503), "/readyz stays 503 without Redis");
        assert!(
            ht < Duration::from_secs(1) && rt < Duration::from_secs(3),
            "{ht:?} {rt:?}"
        );
        true
    });
    assert!(d.running(), "the daemon survives a Redis outage");
    let (m, mt) = timed_get(port, "/metrics");
    assert!(mt < Duration::from_secs(5), "/metrics took {mt:?}");
    let m = http::Metrics::parse(&m.expect("/metrics answers without Redis").1);
    assert_eq!(m.one("qw_redis_up", &[]), 0.0);

    // Redis comes back on the same port.
    let back = Instant::now();
    redis.restart();
    let mut last = None;
    assert!(
        wait_until(Duration::from_secs(45), || {
            last = http_get(port, "/readyz");
            assert_eq!(status(port, "/healthz"), Some(200));
            matches!(&last, Some((200, _)))
        }),
        "/readyz must be 200 again once Redis is back: {last:?}"
    );
    eprintln!(
        "unready {:.2} s after Redis stopped; ready {:.2} s after it returned",
        unready_after.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );
    assert!(d.running());
    up_again_then_stop(port, d);
}

/// Regression: with Redis hung (SIGSTOP: connections open, no answers) a
/// `/metrics` scrape waited for the queue-depth read on the queue's
/// connection, up to its 10 s response timeout — past Prometheus's default
/// scrape timeout, so the counters were lost with the gauges. Every endpoint
/// must answer promptly, `/readyz` with 503 and `/metrics` with
/// `qw_redis_up 0`.
#[test]
fn metrics_scrape_stays_within_the_scrape_timeout_while_redis_hangs() {
    let _machine = machine::timing();
    let (mut rig, port) = start();
    let (redis, d) = (&mut rig.redis, &mut rig.daemon);
    let before = http::scrape(port);
    assert!(!before.select("qw_window_used_units", &[]).is_empty());
    assert_eq!(before.one("qw_redis_up", &[]), 1.0);

    redis.pause();
    // About time: the gauges `before` read are served for a second; past
    // it, the scrape below reads Redis (a /readyz no longer takes that
    // second).
    std::thread::sleep(Duration::from_millis(1_100));
    let (r, rt) = timed_get(port, "/readyz");
    let (m, mt) = timed_get(port, "/metrics");
    let (h, ht) = timed_get(port, "/healthz");
    redis.resume();
    eprintln!("while Redis hangs: /readyz {rt:?}, /metrics {mt:?}, /healthz {ht:?}");
    assert_eq!(r.as_ref().map(|r| r.0), Some(503), "{r:?}");
    assert!(rt < Duration::from_secs(3), "/readyz took {rt:?}");
    assert_eq!(h.map(|r| r.0), Some(200));
    assert!(ht < Duration::from_secs(1), "/healthz took {ht:?}");
    // Prometheus's default scrape timeout is 10 s: well within it.
    assert_eq!(m.as_ref().map(|r| r.0), Some(200), "{m:?}");
    assert!(mt < Duration::from_secs(5), "/metrics took {mt:?}");
    let during = http::Metrics::parse(&m.expect("a reply").1);
    assert_eq!(
        during.one("qw_redis_up", &[]),
        0.0,
        "the scrape says Redis did not answer"
    );

    assert!(
        wait_until(Duration::from_secs(45), || status(port, "/readyz")
            == Some(200)),
        "ready again after Redis resumes: {:?}",
        http_get(port, "/readyz")
    );
    up_again_then_stop(port, d);
}
