//! Promise: when Redis cannot answer, each endpoint's `limiter_unavailable`
//! policy decides, quickly. Stopped Redis: `spend` on a fail-closed endpoint
//! exits 69, on a fail-open one exits 0 marked `"unchecked": true`; `quota`
//! exits 69. Paused Redis (SIGSTOP: it accepts connections but never
//! answers): the same answers within about the `[redis] timeout`, no hang.

use std::time::{Duration, Instant};

use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

const TIMEOUT: Duration = Duration::from_millis(400);

fn config() -> TestConfig {
    ConfigBuilder::new()
        .redis_timeout("400ms")
        .credential(Credential::env("k", "K").window(Window::sliding(100, "1h")))
        .endpoint(Endpoint::new("closed", "k", 1).limiter_unavailable("fail-closed"))
        .endpoint(Endpoint::new("default", "k", 1))
        .endpoint(Endpoint::new("open", "k", 1).limiter_unavailable("fail-open"))
        .write()
}

/// Runs the binary, returning its exit code, stdout and how long it took.
fn timed(cfg: &TestConfig, server: &RedisServer, args: &[&str]) -> (i32, String, Duration) {
    let started = Instant::now();
    let out = cfg.run_on(server, args);
    let took = started.elapsed();
    (
        out.status.code().expect("exit code"),
        support::stdout(&out),
        took,
    )
}

fn assert_unavailable_answers(cfg: &TestConfig, server: &RedisServer, bound: Duration) {
    for endpoint in ["closed", "default"] {
        let (code, _, took) = timed(cfg, server, &["spend", endpoint, "--json"]);
        assert_eq!(code, 69, "spend {endpoint} (fail-closed) with Redis down");
        assert!(took < bound, "spend {endpoint} took {took:?}");
    }

    let (code, out, took) = timed(cfg, server, &["spend", "open", "--json"]);
    assert_eq!(code, 0, "fail-open is allowed with Redis down: {out}");
    assert!(took < bound, "spend open took {took:?}");
    let j: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(j["allowed"], true);
    assert_eq!(j["unchecked"], true, "{j}");
    assert_eq!(j["rejecting_window"], 0);

    let (code, out, _) = timed(cfg, server, &["spend", "open"]);
    assert_eq!(code, 0);
    assert!(out.contains("UNCHECKED"), "{out}");

    for args in [&["quota"][..], &["quota", "--json"], &["quota", "k"]] {
        let (code, _, took) = timed(cfg, server, args);
        assert_eq!(code, 69, "{args:?} with Redis down");
        assert!(took < bound, "{args:?} took {took:?}");
    }
}

#[test]
fn stopped_redis_fail_closed_exits_69_fail_open_is_unchecked() {
    let mut server = RedisServer::start();
    let cfg = config();
    server.stop();
    assert_unavailable_answers(&cfg, &server, Duration::from_secs(5));

    // Nothing was recorded while it was down, and it works again once back.
    server.restart();
    let (code, out, _) = timed(&cfg, &server, &["spend", "open", "--json"]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(j["remaining"], 99, "{j}");
    assert!(j.get("unchecked").is_none(), "{j}");
}

#[test]
fn paused_redis_gives_up_within_the_timeout() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = config();
    let (code, _, fast) = timed(&cfg, &server, &["spend", "closed"]);
    assert_eq!(code, 0);

    server.pause();
    // The configured timeout, plus what a process start costs (measured
    // above), plus slack for a loaded machine; a hang would take forever.
    let bound = TIMEOUT * 2 + fast + Duration::from_millis(1_000);
    assert_unavailable_answers(&cfg, &server, bound);
    let (_, _, took) = timed(&cfg, &server, &["spend", "closed"]);
    assert!(
        took >= TIMEOUT,
        "it did wait for Redis before giving up ({took:?})"
    );
    server.resume();

    let (code, out, _) = timed(&cfg, &server, &["spend", "closed", "--json"]);
    assert_eq!(code, 0, "{out}");
}
