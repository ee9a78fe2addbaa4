//! Promise: weighted costs. A cost-100 endpoint on a 950-unit window admits
//! exactly 9 calls, and each call costs O(1) memory whatever its cost: one
//! entry per window, not one per unit.

use crate::support::keys;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("yt", "YT")
                .window(Window::sliding(950, "1h"))
                .window(Window::fixed(5000, "24h").timezone("America/Los_Angeles")),
        )
        .endpoint(Endpoint::new("search", "yt", 100).window(Window::sliding(2000, "10m")))
        .write()
}

#[test]
fn cost_100_on_950_units_admits_exactly_nine_with_one_entry_each() {
    let server = RedisServer::start();
    let cfg = config();

    for i in 1..=9u64 {
        let out = cfg.run_on(&server, &["spend", "search", "--json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "spend {i}: {}",
            support::stderr(&out)
        );
        let j = support::json(&out);
        assert_eq!(j["allowed"], true, "spend {i}");
        assert_eq!(j["remaining"], 950 - 100 * i, "spend {i}: {j}");
        assert_eq!(j["retry_after_ms"], 0);
        assert_eq!(j["rejecting_window"], 0);
    }
    let out = cfg.run_on(&server, &["spend", "search", "--json"]);
    assert_eq!(out.status.code(), Some(75), "the 10th spend of 100 on 950");
    let j = support::json(&out);
    assert_eq!(j["allowed"], false);
    assert_eq!(j["remaining"], 50);
    assert_eq!(j["rejecting_window"], 1);
    let retry = j["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(
        (3_500_000..=3_600_000).contains(&retry),
        "the first 100 units free an hour after they were spent: {retry} ms"
    );

    // Memory: one entry per call in every window, whatever the cost.
    let config = support::load(&cfg);
    let sliding = [
        keys::window(&config, "yt", None, 0),
        keys::window(&config, "yt", Some("search"), 0),
    ];
    for window in &sliding {
        let (log, ts) = (&window[1], &window[2]);
        let n: i64 = server.cmd(&["ZCARD", log]);
        assert_eq!(n, 9, "{log} holds one id per spend, not one per unit");
        let entries: i64 = server.cmd(&["XLEN", ts]);
        assert_eq!(entries, 9, "{ts}: one entry per spend");
        // The last entry's position is the window's total: 9 x 100 units.
        let last: Vec<(String, Vec<String>)> =
            server.cmd(&["XREVRANGE", ts, "+", "-", "COUNT", "1"]);
        assert!(last[0].0.starts_with("900-"), "{last:?}");
    }
    let fixed = keys::window(&config, "yt", None, 1);
    assert_eq!(fixed.len(), 1, "a fixed window is one hash: {fixed:?}");
    let fields: i64 = server.cmd(&["HLEN", &fixed[0]]);
    assert_eq!(fields, 11, "9 spends, #period and #used");

    // Every key expires by itself.
    for key in server.keys(&format!("{}:*", keys::PREFIX)) {
        let ttl: i64 = server.cmd(&["PTTL", &key]);
        assert!(ttl > 0, "{key} has no expiry ({ttl})");
    }

    let out = cfg.run_on(&server, &["quota", "yt", "--json"]);
    let j = support::json(&out);
    let used: Vec<u64> = j["credentials"][0]["windows"]
        .as_array()
        .expect("windows")
        .iter()
        .map(|w| w["used"].as_u64().expect("used"))
        .collect();
    assert_eq!(used, [900, 900, 900]);
}

#[test]
fn a_cost_that_can_never_fit_is_a_usage_error_and_touches_nothing() {
    let server = RedisServer::start();
    let cfg = config();
    let out = cfg.run_on(&server, &["spend", "search", "--cost", "951", "--json"]);
    assert_eq!(out.status.code(), Some(64), "{}", support::stdout(&out));
    let err = support::stderr(&out);
    assert!(err.contains("951") && err.contains("950/1h"), "{err}");
    assert_eq!(server.dbsize(), 0, "refused before touching Redis");
    // The largest that fits is still admitted.
    let out = cfg.run_on(&server, &["spend", "search", "--cost", "950", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert_eq!(support::json(&out)["remaining"], 0);
    let out = cfg.run_on(&server, &["spend", "search", "--cost", "1", "--json"]);
    assert_eq!(out.status.code(), Some(75));
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(cost_100_on_950_units_admits_exactly_nine_with_one_entry_each,);
