//! Promise: `quota` shows, live from Redis, every window's used / remaining /
//! frees-in, per credential in config order (credential windows first, then
//! each endpoint's), as a table or as the SPEC's JSON shape.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(100, "1h"))
                .window(Window::fixed(50, "24h")),
        )
        .credential(Credential::env("other", "O").window(Window::sliding(7, "1m")))
        .endpoint(Endpoint::new("e", "k", 10).window(Window::sliding(30, "10m")))
        .endpoint(Endpoint::new("o", "other", 1))
        .write()
}

const DAY_US: i64 = 86_400_000_000;

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect()
}

fn quota_json(cfg: &TestConfig, server: &RedisServer, args: &[&str]) -> (Value, i64, i64) {
    let t0 = server.time_us();
    let out = cfg.run_on(server, args);
    let t1 = server.time_us();
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    (support::json(&out), t0, t1)
}

fn assert_within(what: &str, ms: &Value, until_us: i64, t0: i64, t1: i64) {
    let ms = ms.as_i64().unwrap_or_else(|| panic!("{what}: {ms}"));
    let (lo, hi) = ((until_us - t1) / 1000 - 2, (until_us - t0) / 1000 + 2);
    assert!(
        (lo..=hi).contains(&ms),
        "{what}: {ms} ms, expected {lo}..={hi}"
    );
}

#[test]
fn quota_json_has_the_spec_shape_and_live_numbers() {
    let server = RedisServer::start();
    let cfg = config();
    for _ in 0..2 {
        let out = cfg.run_on(&server, &["spend", "e"]);
        assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    }
    let window = support::keys::window(&support::load(&cfg), "k", None, 0);
    let log: Vec<String> = server.cmd(&["ZRANGE", &window[1], "0", "0"]);
    let first = support::seed::spend_time_us(&server, &window, &log[0]).expect("the oldest spend");

    let (j, t0, t1) = quota_json(&cfg, &server, &["quota", "--json"]);
    assert_eq!(keys(&j), BTreeSet::from(["credentials"]));
    let creds = j["credentials"].as_array().expect("credentials");
    let names: Vec<&str> = creds
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["k", "other"], "config order");

    let k = &creds[0];
    assert_eq!(
        keys(k),
        BTreeSet::from([
            "name",
            "blocked_for_ms",
            "blocked_reason",
            "resources",
            "windows"
        ])
    );
    assert_eq!(k["blocked_for_ms"], 0);
    assert_eq!(k["blocked_reason"], serde_json::Value::Null, "not blocked");
    // SPEC Part 3: each resource's block; this one has the default only.
    assert_eq!(
        k["resources"],
        serde_json::json!([{"name": "default", "default": true, "blocked_for_ms": 0, "blocked_reason": null, "streak": 0}])
    );
    let w = k["windows"].as_array().expect("windows");
    assert_eq!(w.len(), 3);
    let shape = BTreeSet::from([
        "scope",
        "resource",
        "kind",
        "units",
        "period_ms",
        "used",
        "remaining",
        "frees_in_ms",
        "drift",
    ]);
    for win in w {
        assert_eq!(keys(win), shape, "{win}");
    }
    let rows: Vec<(&str, &str, u64, u64, u64, u64)> = w
        .iter()
        .map(|x| {
            (
                x["scope"].as_str().expect("scope"),
                x["kind"].as_str().expect("kind"),
                x["units"].as_u64().expect("units"),
                x["period_ms"].as_u64().expect("period_ms"),
                x["used"].as_u64().expect("used"),
                x["remaining"].as_u64().expect("remaining"),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("credential", "sliding", 100, 3_600_000, 20, 80),
            ("credential", "fixed", 50, 86_400_000, 20, 30),
            ("endpoint:e", "sliding", 30, 600_000, 20, 10),
        ]
    );
    // Sliding: when the oldest entry expires. Fixed: the next UTC midnight.
    assert_within(
        "1h frees_in",
        &w[0]["frees_in_ms"],
        first + 3_600_000_000,
        t0,
        t1,
    );
    assert_within(
        "10m frees_in",
        &w[2]["frees_in_ms"],
        first + 600_000_000,
        t0,
        t1,
    );
    let midnight = (t0 / DAY_US + 1) * DAY_US;
    assert_within("fixed frees_in", &w[1]["frees_in_ms"], midnight, t0, t1);

    let other = &creds[1]["windows"][0];
    assert_eq!(other["used"], 0);
    assert_eq!(other["remaining"], 7);
    assert_eq!(other["frees_in_ms"], 0, "an empty window frees nothing");

    // One credential only.
    let (j, _, _) = quota_json(&cfg, &server, &["quota", "other", "--json"]);
    let only: Vec<&str> = j["credentials"]
        .as_array()
        .expect("credentials")
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect();
    assert_eq!(only, ["other"]);
    let out = cfg.run_on(&server, &["quota", "nope"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(support::stderr(&out).contains("unknown credential"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_table_reads_like_the_json() {
    let server = RedisServer::start();
    let cfg = config();
    let out = cfg.run_on(&server, &["spend", "e"]);
    assert_eq!(out.status.code(), Some(0));
    let config = quota_worker::config::Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    limiter
        .block("other", std::time::Duration::from_secs(90))
        .await
        .expect("block");

    let out = cfg.run_on(&server, &["quota"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let text = support::stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let row = |n: &str, scope: &str| -> Vec<&str> {
        lines
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|c| c.first() == Some(&n) && c.get(1) == Some(&scope))
            .unwrap_or_else(|| panic!("no row {n} {scope}:\n{text}"))
    };
    assert_eq!(lines[0], "k", "{text}");
    assert!(
        lines[1].contains("scope") && lines[1].contains("frees in"),
        "{text}"
    );
    let r = row("1", "credential");
    assert_eq!(&r[2..5], ["100/1h", "10", "90"], "{text}");
    // Just under an hour ("59m 59s", or less on a slow machine).
    assert_eq!(r[5], "59m", "{text}");
    let r = row("3", "endpoint:e");
    assert_eq!(&r[2..5], ["30/10m", "10", "20"], "{text}");
    let blocked = lines
        .iter()
        .find(|l| l.starts_with("other"))
        .unwrap_or_else(|| panic!("no credential other:\n{text}"));
    assert!(
        blocked.contains("BLOCKED by the upstream for 1m"),
        "{blocked}"
    );
    let r = lines
        .iter()
        .skip_while(|l| !l.starts_with("other"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&"1"))
        .unwrap_or_else(|| panic!("no window row for other:\n{text}"));
    assert_eq!(r[2..], ["7/1m", "0", "7", "-"], "{text}");

    let (j, _, _) = quota_json(&cfg, &server, &["quota", "other", "--json"]);
    let ms = j["credentials"][0]["blocked_for_ms"].as_u64().expect("ms");
    assert!((85_000..=90_000).contains(&ms), "{ms}");
}
