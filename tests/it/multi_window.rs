//! Promise: a spend is all or nothing across every window that applies
//! (credential windows, then the endpoint's own): a rejection by one window
//! records nothing in the others, and `rejecting_window` names the window
//! that said no (1-based, credential windows first; of several, the one that
//! frees last).

use serde_json::Value;

use crate::support::keys;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(25, "5s"))
                .window(Window::sliding(300, "1m")),
        )
        .credential(
            Credential::env("m", "M")
                .window(Window::sliding(25, "1s"))
                .window(Window::sliding(50, "1m")),
        )
        .endpoint(Endpoint::new("plain", "k", 5))
        .endpoint(Endpoint::new("capped", "k", 5).window(Window::sliding(10, "30s")))
        .endpoint(Endpoint::new("bulk", "m", 25))
        .write()
}

fn spend(cfg: &TestConfig, server: &RedisServer, endpoint: &str) -> (i32, Value) {
    let out = cfg.run_on(server, &["spend", endpoint, "--json"]);
    let code = out.status.code().expect("exit code");
    assert!(
        code == 0 || code == 75,
        "spend {endpoint} exited {code}: {}",
        support::stderr(&out)
    );
    (code, support::json(&out))
}

/// `used` of every window of `credential`, from `quota --json`.
fn used(cfg: &TestConfig, server: &RedisServer, credential: &str) -> Vec<u64> {
    let out = cfg.run_on(server, &["quota", credential, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    support::json(&out)["credentials"][0]["windows"]
        .as_array()
        .expect("windows")
        .iter()
        .map(|w| w["used"].as_u64().expect("used"))
        .collect()
}

/// Ids in the logs of `credential`'s windows, as `scopes` lists them: one
/// entry per window, `None` for the credential's own (in config order),
/// `Some(endpoint)` for that endpoint's.
fn logs(
    cfg: &TestConfig,
    server: &RedisServer,
    credential: &str,
    scopes: &[Option<&str>],
) -> Vec<i64> {
    let config = support::load(cfg);
    let mut next = std::collections::HashMap::new();
    scopes
        .iter()
        .map(|scope| {
            let n = next.entry(*scope).or_insert(0);
            let log = keys::window_log(&config, credential, *scope, *n);
            *n += 1;
            server.cmd(&["ZCARD", &log])
        })
        .collect()
}

#[test]
fn rejection_by_the_endpoint_window_records_nothing_in_the_credential_windows() {
    let server = RedisServer::start();
    let cfg = config();
    for _ in 0..2 {
        assert_eq!(spend(&cfg, &server, "capped").0, 0);
    }
    // Windows of `capped`: 1 = k 25/5s, 2 = k 300/1m, 3 = capped's 10/30s.
    let (code, j) = spend(&cfg, &server, "capped");
    assert_eq!(code, 75);
    assert_eq!(j["rejecting_window"], 3, "{j}");
    assert_eq!(j["remaining"], 0);
    let retry = j["retry_after_ms"].as_u64().expect("retry");
    assert!((25_000..=30_000).contains(&retry), "{retry}");
    // quota lists k's windows then each endpoint's: [5s, 1m, capped 30s].
    assert_eq!(used(&cfg, &server, "k"), [10, 10, 10]);
    assert_eq!(
        logs(&cfg, &server, "k", &[None, None, Some("capped")]),
        [2, 2, 2]
    );

    // The credential windows still have room for another endpoint.
    assert_eq!(spend(&cfg, &server, "plain").0, 0);
    assert_eq!(used(&cfg, &server, "k"), [15, 15, 10]);
}

#[test]
fn of_several_rejecting_windows_the_one_that_frees_last_is_named() {
    let server = RedisServer::start();
    let cfg = config();
    assert_eq!(spend(&cfg, &server, "capped").0, 0);
    assert_eq!(spend(&cfg, &server, "capped").0, 0);
    for _ in 0..3 {
        assert_eq!(spend(&cfg, &server, "plain").0, 0);
    }
    assert_eq!(used(&cfg, &server, "k"), [25, 25, 10]);

    // `plain`: only window 1 (25/5s) is full.
    let (code, j) = spend(&cfg, &server, "plain");
    assert_eq!(code, 75);
    assert_eq!(j["rejecting_window"], 1, "{j}");
    let retry = j["retry_after_ms"].as_u64().expect("retry");
    assert!((4_000..=5_000).contains(&retry), "{retry}");

    // `capped`: windows 1 (frees in < 5 s) and 3 (frees in < 30 s) both
    // refuse; 3 frees last, so it is named and its wait is the answer.
    let (code, j) = spend(&cfg, &server, "capped");
    assert_eq!(code, 75);
    assert_eq!(j["rejecting_window"], 3, "{j}");
    let retry = j["retry_after_ms"].as_u64().expect("retry");
    assert!((25_000..=30_000).contains(&retry), "{retry}");

    // Neither rejection recorded anything anywhere.
    assert_eq!(used(&cfg, &server, "k"), [25, 25, 10]);
    assert_eq!(
        logs(&cfg, &server, "k", &[None, None, Some("capped")]),
        [5, 5, 2]
    );
}

#[test]
fn the_second_credential_window_is_numbered_two() {
    // m: 25/1s and 50/1m; `bulk` costs 25.
    let server = RedisServer::start();
    let cfg = config();
    assert_eq!(spend(&cfg, &server, "bulk").0, 0);
    // About time: the 1s window frees.
    std::thread::sleep(std::time::Duration::from_millis(1_050));
    assert_eq!(spend(&cfg, &server, "bulk").0, 0);

    // Both windows are full; the 1m one frees last.
    let (code, j) = spend(&cfg, &server, "bulk");
    assert_eq!(code, 75);
    assert_eq!(j["rejecting_window"], 2, "{j}");
    let retry = j["retry_after_ms"].as_u64().expect("retry");
    assert!((55_000..=60_000).contains(&retry), "{retry}");

    // Once the 1s window has room again, only window 2 refuses, and window 1
    // keeps no trace of the refused spend.
    std::thread::sleep(std::time::Duration::from_millis(1_050));
    let (code, j) = spend(&cfg, &server, "bulk");
    assert_eq!(code, 75);
    assert_eq!(j["rejecting_window"], 2, "{j}");
    assert_eq!(j["remaining"], 0, "window 2 has none left");
    assert_eq!(used(&cfg, &server, "m"), [0, 50]);
    assert_eq!(logs(&cfg, &server, "m", &[None]), [0]);
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    rejection_by_the_endpoint_window_records_nothing_in_the_credential_windows,
    of_several_rejecting_windows_the_one_that_frees_last_is_named,
    the_second_credential_window_is_numbered_two,
);
