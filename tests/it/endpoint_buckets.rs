//! Promise (SPEC Part 2, "Endpoint buckets"): an endpoint with
//! `charge_credential = false` spends only from its own windows (which it
//! must have: a config error otherwise), never from its credential's; the
//! credential's block still stops it; `quota` shows its window; `check`
//! counts its jobs against its own windows only. The shipped config — YouTube's
//! cost table — passes `check`. Real binary, real Redis.

use std::path::Path;
use std::time::Duration;

use crate::support::{self, RedisServer, TestConfig};
use quota_worker::config::Config;
use serde_json::Value;

const CONFIG: &str = r#"
jobs = "jobs/*.toml"

[credentials.yt]
secret_env = "YT"
windows = [{ units = 10, per = "1h" }]

[endpoints.shared]
credential = "yt"
cost = 1

[endpoints.search]
credential = "yt"
cost = 1
charge_credential = false
windows = [{ units = 3, per = "1h" }]

# Its cost only has to fit its own window, not the credential's 10.
[endpoints.upload]
credential = "yt"
cost = 50
charge_credential = false
windows = [{ units = 60, per = "24h", kind = "fixed", timezone = "America/Los_Angeles" }]
"#;

const JOBS: &str = r#"
[searches]
schedule = "0 0 * * * *"
endpoint = "search"
fan_out = { q = ["a", "b"] }
request = { url = "https://example.test/search?q={q}&key={secret}" }
sink = { kind = "jsonl", path = "data/{job}.jsonl" }

[videos]
schedule = "0 0 * * * *"
endpoint = "shared"
request = { url = "https://example.test/videos?key={secret}" }
sink = { kind = "jsonl", path = "data/{job}.jsonl" }
"#;

fn spend(cfg: &TestConfig, redis: &RedisServer, endpoint: &str) -> (Option<i32>, Value) {
    let o = cfg.run_on(redis, &["spend", endpoint, "--json"]);
    (o.status.code(), support::json(&o))
}

/// `quota --json`'s windows of credential `yt`, as `(scope, used)`.
fn used(cfg: &TestConfig, redis: &RedisServer) -> Vec<(String, u64)> {
    let o = cfg.run_on(redis, &["quota", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
    let v = support::json(&o);
    v["credentials"][0]["windows"]
        .as_array()
        .expect("windows")
        .iter()
        .map(|w| {
            (
                w["scope"].as_str().unwrap_or_default().to_owned(),
                w["used"].as_u64().unwrap_or(u64::MAX),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_bucket_endpoint_spends_only_its_own_window_and_the_credentials_block_still_applies() {
    let redis = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[("jobs.toml", JOBS)]);
    for n in 0..3 {
        let (code, v) = spend(&cfg, &redis, "search");
        assert_eq!(code, Some(0), "spend {n}: {v}");
        assert_eq!(v["remaining"], 2 - n, "its own window's units left");
    }
    let (code, v) = spend(&cfg, &redis, "search");
    assert_eq!(code, Some(75), "{v}");
    assert_eq!(v["rejecting_window"], 1, "its own window is its first: {v}");
    assert_eq!(
        used(&cfg, &redis),
        [
            ("credential".to_owned(), 0),
            ("endpoint:search".to_owned(), 3),
            ("endpoint:upload".to_owned(), 0),
        ],
        "the credential's window is untouched"
    );
    let (code, v) = spend(&cfg, &redis, "shared");
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["remaining"], 9);
    assert_eq!(
        used(&cfg, &redis)[..2],
        [
            ("credential".to_owned(), 1),
            ("endpoint:search".to_owned(), 3)
        ]
    );

    // The credential's block is in the bucket endpoint's spend too.
    let keys = cfg.run_on(&redis, &["keys", "upload"]);
    assert_eq!(keys.status.code(), Some(0), "{}", support::stderr(&keys));
    let keys = support::json(&keys);
    assert_eq!(keys["keys"][0], support::keys::keys().blocked("yt"));
    assert_eq!(keys["args"][3], "0", "no reserve");
    assert_eq!(keys["args"][4], "1", "one window: its own");
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&redis, &config).await;
    limiter
        .block("yt", Duration::from_secs(120))
        .await
        .expect("block");
    let (code, v) = spend(&cfg, &redis, "upload");
    assert_eq!(code, Some(75), "{v}");
    assert_eq!(v["blocked"], true, "{v}");
    assert_eq!(v["rejecting_window"], 0);
    let (code, v) = spend(&cfg, &redis, "shared");
    assert_eq!((code, v["blocked"].clone()), (Some(75), Value::Bool(true)));
}

#[test]
fn check_counts_a_bucket_endpoints_jobs_against_its_own_window_only() {
    let redis = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[("jobs.toml", JOBS)]);
    let o = cfg.run(
        &["check"],
        &[("YT", "k"), ("QUOTA_WORKER_REDIS_URL", &redis.url())],
    );
    let out = support::stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", support::stderr(&o));
    let row = |scope: &str| -> String {
        out.lines()
            .find(|l| l.trim_start().starts_with(scope) && l.contains("worst case"))
            .unwrap_or_else(|| panic!("no {scope} row in:\n{out}"))
            .to_owned()
    };
    // videos: 24 ticks a day x 1, at most one in any hour; searches: 2 an hour.
    assert!(
        row("credential ").contains("worst case         1 units per 1h"),
        "{out}"
    );
    assert!(
        row("endpoint:search ").contains("worst case         2 units per 1h"),
        "{out}"
    );
}

#[test]
fn a_bucket_endpoint_without_windows_is_a_config_error() {
    let cfg = TestConfig::new(
        r#"
[credentials.yt]
secret_env = "YT"
windows = [{ units = 10, per = "1h" }]

[endpoints.search]
credential = "yt"
cost = 1
charge_credential = false
"#,
        &[],
    );
    let o = cfg.run(&["check"], &[("YT", "k")]);
    let err = support::stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains(":9:21: endpoints.search.charge_credential: an endpoint with charge_credential = false counts only against its own windows"),
        "{err}"
    );
}

/// The shipped config (YouTube's cost table) and job pass `check`, given a
/// key (a dummy) where systemd would put it.
#[test]
fn the_shipped_config_passes_check() {
    let redis = RedisServer::start();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().expect("tempdir");
    let creds = tmp.path().join("credentials");
    std::fs::create_dir_all(&creds).expect("mkdir");
    std::fs::write(creds.join("yt-key1"), "dummy-key\n").expect("key");
    let state = tmp.path().join("state");
    let o = std::process::Command::new(support::bin())
        .args(["check", "-c"])
        .arg(repo.join("config/quota-worker.toml"))
        .env_remove("QUOTA_WORKER_CONFIG")
        .env("CREDENTIALS_DIRECTORY", &creds)
        .env("STATE_DIRECTORY", &state)
        .env("QUOTA_WORKER_REDIS_URL", redis.url())
        .output()
        .expect("check");
    let out = support::stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", support::stderr(&o));
    for line in [
        "credential                      9500/24h fixed, resets 00:00 America/Los_Angeles",
        "endpoint:youtube.search.list    95/24h fixed, resets 00:00 America/Los_Angeles",
        "endpoint:youtube.videos.insert  95/24h fixed, resets 00:00 America/Los_Angeles",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    assert!(
        state.join("data/trending").is_dir(),
        "check created the sink directory"
    );
    let config =
        Config::load_with_env(&repo.join("config/quota-worker.toml"), &|_| None).expect("loads");
    for (name, own_bucket) in [
        ("youtube.search.list", true),
        ("youtube.videos.insert", true),
        ("youtube.videos.list", false),
        ("youtube.channels.list", false),
        ("youtube.playlistItems.list", false),
    ] {
        let e = &config.endpoints[name];
        assert_eq!(e.cost.get(), 1, "{name}");
        assert_eq!(!e.charge_credential, own_bucket, "{name}");
    }
}
