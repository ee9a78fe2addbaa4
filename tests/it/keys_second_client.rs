//! Promise: `quota-worker keys ENDPOINT` tells another program (here a Python
//! script with a bare RESP client) exactly how to spend from the same windows:
//! its spends and the CLI's draw from one budget, and the `{request_id}`
//! placeholder passed through unsubstituted is refused. On an endpoint with a
//! concurrent window it also tells how to return the lease a spend takes
//! (`settle`): Python takes leases and returns them, and the CLI and Python
//! share the window.

use std::path::{Path, PathBuf};
use std::process::Command;

use quota_worker::config::Scope;
use serde_json::Value;

use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

/// The spend history's rings of `k`: its own scope's, then the endpoint
/// `one`'s.
fn rings() -> [String; 2] {
    let keys = support::keys::keys();
    [
        keys.spent("k", &Scope::Credential),
        keys.spent("k", &Scope::Endpoint("one".into())),
    ]
}

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(10, "1h"))
                .window(Window::fixed(100, "24h").timezone("Europe/Berlin")),
        )
        .endpoint(Endpoint::new("one", "k", 1).window(Window::sliding(50, "10m")))
        .write()
}

fn client() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/spend_client.py")
}

/// Runs the Python client once; its JSON answer.
fn python_spend(spec: &Path, server: &RedisServer, id: &str, raw: bool) -> Value {
    python(spec, server, id, if raw { &["--raw"] } else { &[] })
}

/// Runs the Python client once with `extra` arguments; its JSON answer.
fn python(spec: &Path, server: &RedisServer, id: &str, extra: &[&str]) -> Value {
    let mut cmd = Command::new("python3");
    cmd.arg(client())
        .arg(spec)
        .arg(server.port().to_string())
        .arg(id)
        .args(extra);
    let out = cmd.output().expect("run python3");
    assert!(
        out.status.success(),
        "python client failed: {}",
        support::stderr(&out)
    );
    support::json(&out)
}

fn cli_spend(cfg: &TestConfig, server: &RedisServer) -> i32 {
    let out = cfg.run_on(server, &["spend", "one", "--json"]);
    out.status.code().expect("exit code")
}

#[test]
fn python_and_cli_spend_from_the_same_windows() {
    let server = RedisServer::start();
    let cfg = config();
    let out = cfg.run(&["keys", "one"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let spec = support::json(&out);

    // The printout: the script file this binary runs, every key, the args.
    let script = std::fs::read_to_string(spec["script"].as_str().expect("script path"))
        .expect("the script file exists");
    assert_eq!(script, quota_worker::quota::SCRIPT);
    let keys: Vec<&str> = spec["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k.as_str().expect("key"))
        .collect();
    assert_eq!(
        keys.len(),
        2 + 4 + 1 + 4 + 2,
        "block, clock, then each window's (4 for a sliding window, 1 for a fixed one), then the spend history's rings (one per scope)"
    );
    assert_eq!(keys[11..], rings(), "{keys:?}");
    let of_k = support::keys::of_credential("k");
    let of_k = of_k.trim_end_matches('*');
    assert!(keys.iter().all(|k| k.starts_with(of_k)), "{keys:?}");
    let args = spec["args"].as_array().expect("args");
    assert_eq!(args[0], "spend");
    assert_eq!(args[1], "{request_id}");
    assert_eq!(args[2], "1", "the endpoint's cost");
    assert_eq!(args[3], "0", "no reserve");
    assert_eq!(args[4], "3", "three windows follow");
    let spec_path = cfg.join("keys.json");
    std::fs::write(&spec_path, out.stdout).expect("write keys.json");

    // Interleaved: 5 through Python (the script, then the function the CLI
    // has loaded by then, in turns), 5 through the CLI, all admitted.
    let fcall = spec["fcall"]["function"].as_str().expect("fcall");
    assert_eq!(fcall, quota_worker::quota::Op::Spend.function().name());
    for i in 0..5 {
        let j = if i % 2 == 0 {
            python_spend(&spec_path, &server, &format!("py-{i}"), false)
        } else {
            python(&spec_path, &server, &format!("py-{i}"), &["--fcall"])
        };
        assert_eq!(j["reply"][0], 1, "python spend {i}: {j}");
        assert_eq!(j["sha1"], spec["sha1"], "the same script");
        let via = if i % 2 == 0 { "evalsha" } else { "fcall" };
        assert_eq!(j["via"], via, "{j}");
        assert_eq!(cli_spend(&cfg, &server), 0, "cli spend {i}");
    }
    // The 11th is refused either way.
    let j = python_spend(&spec_path, &server, "py-late", false);
    assert_eq!(j["reply"][0], 0, "{j}");
    assert_eq!(j["reply"][3], 1, "the 10/1h window refuses: {j}");
    assert_eq!(cli_spend(&cfg, &server), 75);

    let out = cfg.run_on(&server, &["quota", "--json"]);
    let used: Vec<u64> = support::json(&out)["credentials"][0]["windows"]
        .as_array()
        .expect("windows")
        .iter()
        .map(|w| w["used"].as_u64().expect("used"))
        .collect();
    assert_eq!(used, [10, 10, 10]);
    // The spend wrote the status page's history in the same call, for the
    // Python client as for the CLI; refusals add nothing.
    for ring in rings() {
        let raw: Vec<u8> = server.cmd(&["GET", &ring]);
        let charted: u64 = (raw.chunks(4).skip(1))
            .map(|c| {
                let mut b = [0u8; 4];
                b[..c.len()].copy_from_slice(c);
                u64::from(u32::from_be_bytes(b))
            })
            .sum();
        assert_eq!(charted, 10, "units in the spend history's {ring}");
    }

    // A Python retry of a spend it already made is admitted, not charged.
    let j = python_spend(&spec_path, &server, "py-0", false);
    assert_eq!(j["reply"][0], 1, "{j}");

    // Without substituting the request id, the script refuses to spend.
    let j = python_spend(&spec_path, &server, "ignored", true);
    let err = j["error"].as_str().unwrap_or_else(|| panic!("{j}"));
    assert!(err.contains("request id must be unique"), "{err}");
}

#[test]
fn keys_follows_cost_and_refuses_what_can_never_fit() {
    let cfg = config();
    let out = cfg.run(&["keys", "one", "--cost", "7"], &[]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(support::json(&out)["args"][2], "7");
    let out = cfg.run(&["keys", "one", "--cost", "11"], &[]);
    assert_eq!(out.status.code(), Some(64), "{}", support::stdout(&out));
    let out = cfg.run(&["keys", "nope"], &[]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn the_raw_placeholder_is_refused_on_a_fresh_redis_too() {
    // EVAL path (empty script cache), no spend recorded.
    let server = RedisServer::start();
    let cfg = config();
    let out = cfg.run(&["keys", "one"], &[]);
    let spec_path = cfg.join("keys.json");
    std::fs::write(&spec_path, out.stdout).expect("write keys.json");
    let j = python_spend(&spec_path, &server, "ignored", true);
    assert!(j["error"].is_string(), "{j}");
    assert_eq!(server.dbsize(), 0, "nothing recorded");
}

/// The lease round trip from Python, written only from `keys`: spend until
/// the concurrent window refuses, return a lease with the printed settle,
/// spend again; the CLI's spends share the window.
#[test]
fn python_takes_a_lease_and_returns_it_through_keys() {
    let server = RedisServer::start();
    let cfg = ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(100, "1h"))
                .window(Window::concurrent(3)),
        )
        .endpoint(Endpoint::new("one", "k", 1).timeout("10s"))
        .write();
    let out = cfg.run(&["keys", "one"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let spec = support::json(&out);
    let settle = &spec["settle"];
    assert_eq!(settle["lease_ms"], 15_000, "timeout 10 s + 5 s: {settle}");
    assert_eq!(settle["args"][0], "settle");
    assert_eq!(settle["args"][1], "{request_id}");
    assert_eq!(settle["args"][2], "{cost}");
    assert_eq!(settle["keys"], spec["keys"], "the same keys as the spend");
    let spec_path = cfg.join("keys.json");
    std::fs::write(&spec_path, &out.stdout).expect("write keys.json");

    // Two leases from Python, one from the CLI: the window is full.
    for id in ["py-a", "py-b"] {
        let j = python_spend(&spec_path, &server, id, false);
        assert_eq!(j["reply"][0], 1, "{id}: {j}");
    }
    assert_eq!(cli_spend(&cfg, &server), 0);
    let j = python_spend(&spec_path, &server, "py-c", false);
    assert_eq!(j["reply"][0], 0, "refused at 3 in flight: {j}");
    assert_eq!(j["reply"][2], 1_000, "the wait, at most 1 s: {j}");
    assert_eq!(j["reply"][3], 2, "the concurrent window refuses: {j}");
    assert_eq!(cli_spend(&cfg, &server), 75);

    // Python's answer came: its settle returns the lease (and keeps the
    // unit spent in the hour).
    let j = python(&spec_path, &server, "py-a", &["--settle", "1"]);
    assert_eq!(
        j["reply"],
        serde_json::json!([2]),
        "both windows held it: {j}"
    );
    let j = python_spend(&spec_path, &server, "py-c", false);
    assert_eq!(j["reply"][0], 1, "admitted once a lease is back: {j}");
    // A request Python never sent: settled to 0, lease and unit back.
    let j = python(&spec_path, &server, "py-b", &["--settle", "0"]);
    assert_eq!(j["reply"], serde_json::json!([2]), "{j}");
    let out = cfg.run_on(&server, &["quota", "k", "--json"]);
    let windows = support::json(&out)["credentials"][0]["windows"].clone();
    assert_eq!(windows[0]["used"], 3, "py-a, the CLI's, py-c: {windows}");
    assert_eq!(
        (windows[1]["used"].as_u64(), windows[1]["leases"].as_u64()),
        (Some(2), Some(2)),
        "{windows}"
    );
    // The placeholder cost passed through is refused.
    let j = python(&spec_path, &server, "py-c", &["--settle", "{cost}"]);
    let err = j["error"].as_str().unwrap_or_else(|| panic!("{j}"));
    assert!(err.contains("settle cost must be a whole number"), "{err}");
}
