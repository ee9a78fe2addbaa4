//! Promise: every task outcome is one structured log event carrying the job,
//! the item, the page, the units and the retry-after — checked on the real
//! binary (`quota-worker run --log-format json`), fed by `quota-worker
//! trigger --wait`, against the simulated upstream.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Limiter, Quotas};
use quota_worker::simulator::{SimConfig, Simulator};
use serde_json::Value;
use support::{RedisServer, TestConfig, collect_lines, stderr, stdout, wait_until};

const CONFIG: &str = r#"
jobs = "jobs/*.toml"

[redis]
url = "@REDIS@"

[worker]
concurrency = 1
poll_interval = "20ms"
shutdown_timeout = "5s"

[metrics]
listen = "off"

[credentials.yt]
secret_env = "QW_TEST_YT"
windows = [{ units = 4, per = "1h" }]

[endpoints."youtube.videos.list"]
credential = "yt"
cost = 1
"#;

/// Two regions of three pages against 4 units, one task at a time: the
/// first region gets all three pages, the other one page before the window
/// says no.
const JOB: &str = r#"
[trending]
schedule = "0 0 0 1 1 * 2099"
endpoint = "youtube.videos.list"
fan_out = { region = ["US", "GB"] }

[trending.request]
url = "@SIM@/youtube/v3/videos"
query = { chart = "mostPopular", regionCode = "{region}", maxResults = "2", key = "{secret}" }

[trending.pagination]
cursor = "/nextPageToken"
param = "pageToken"
max_pages = 3

[trending.sink]
kind = "jsonl"
path = "data/{job}.jsonl"
records = "/items"
"#;

struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // By pid: the child we spawned.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_is_a_structured_event_with_job_item_page_units_retry_after() {
    let redis = RedisServer::start();
    let sim = Simulator::start(
        SimConfig {
            pages_per_query: 3,
            items_per_page: 2,
            ..SimConfig::default()
        }
        .key("yt-key", 1000, Duration::from_secs(3600)),
    )
    .await
    .expect("simulator");
    let fill = |s: &str| {
        s.replace("@REDIS@", &redis.url())
            .replace("@SIM@", &sim.base_url())
    };
    let cfg = TestConfig::new(&fill(CONFIG), &[("trending.toml", &fill(JOB))]);
    let env = [("QW_TEST_YT", "yt-key")];

    let mut child = Command::new(support::bin());
    child
        .arg("-c")
        .arg(cfg.path())
        .args(["--log-format", "json", "run"])
        .env_remove("QUOTA_WORKER_REDIS_URL")
        .env_remove("QUOTA_WORKER_METRICS_LISTEN")
        .env("RUST_LOG", "info")
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut daemon = Daemon(child.spawn().expect("spawn quota-worker run"));
    let lines = collect_lines(daemon.0.stderr.take().expect("stderr"));
    assert!(
        wait_until(Duration::from_secs(20), || lines
            .lock()
            .expect("lines")
            .iter()
            .any(|l| l.contains("quota-worker running"))),
        "daemon did not start: {:?}",
        lines.lock().expect("lines")
    );

    let out = tokio::task::spawn_blocking({
        let path = cfg.path();
        move || {
            Command::new(support::bin())
                .arg("-c")
                .arg(path)
                .args(["trigger", "trending", "--wait"])
                .env_remove("QUOTA_WORKER_REDIS_URL")
                .env("RUST_LOG", "warn")
                .envs(env)
                .output()
                .expect("run trigger")
        }
    })
    .await
    .expect("trigger");
    // Tasks ended `quota_exhausted`: `trigger --wait` exits 75.
    assert_eq!(out.status.code(), Some(75), "trigger: {}", stderr(&out));
    let summary = stdout(&out);
    assert!(
        summary.contains("2 task(s) ended") && summary.contains("quota_exhausted"),
        "{summary}"
    );

    // What the window says, to check the event against.
    let config = Config::load_with_env(&cfg.path(), &|_| None).expect("config");
    let conn = quota_worker::conn::connect(
        &quota_worker::config::RedisUrl::new(redis.url()),
        Duration::from_secs(2),
        2,
    )
    .await
    .expect("connect");
    let limiter = Limiter::new(conn, Arc::new(Quotas::new(&config)), Duration::from_secs(2));
    let used = limiter.peek("yt").await.expect("peek").windows[0].used;
    assert_eq!(used, 4);

    // SIGTERM by pid: a clean shutdown, exit 0.
    // SAFETY: kill(2) on the child we spawned and still own.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = daemon.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    std::thread::sleep(Duration::from_millis(100));

    let lines = lines.lock().expect("lines").clone();
    let events: Vec<Value> = lines
        .iter()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .filter(|v: &Value| v.get("outcome").is_some())
        .collect();
    assert_eq!(events.len(), 2, "one event per outcome: {events:#?}");
    let exhausted: Vec<&Value> = events
        .iter()
        .filter(|v| v["outcome"] == "quota_exhausted")
        .collect();
    let done: Vec<&Value> = events.iter().filter(|v| v["outcome"] == "done").collect();
    assert_eq!((exhausted.len(), done.len()), (1, 1), "{events:#?}");

    let e = exhausted[0];
    assert_eq!(e["level"], "INFO", "{e}");
    assert_eq!(e["job"], "trending", "{e}");
    let item = e["item"].as_str().unwrap_or_default();
    assert!(item == "region=US" || item == "region=GB", "{e}");
    assert_eq!(e["endpoint"], "youtube.videos.list", "{e}");
    // The other item took three pages, this one one: it stopped at page 2
    // having spent one unit.
    assert_eq!(e["page"], 2, "{e}");
    assert_eq!(e["pages"], 1, "{e}");
    assert_eq!(e["units"], 1, "{e}");
    let ra = e["retry_after_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("{e}"));
    assert!(
        ra > 3_500_000 && ra <= 3_600_000,
        "retry-after is when the hour window frees: {e}"
    );
    assert!(e["tick"].as_i64().is_some_and(|t| t > 0), "{e}");
    assert!(
        e["task"]
            .as_str()
            .is_some_and(|t| t.starts_with("trending:")),
        "{e}"
    );
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("quota window")),
        "{e}"
    );
    let d = done[0];
    assert_eq!(
        (d["page"].as_u64(), d["pages"].as_u64(), d["units"].as_u64()),
        (Some(3), Some(3), Some(3)),
        "{d}"
    );
    assert!(d.get("retry_after_ms").is_none(), "{d}");
    // No secret anywhere in the log.
    assert!(
        lines.iter().all(|l| !l.contains("yt-key")),
        "secret in the log"
    );
    sim.shutdown().await;
}
