//! Promise: every task outcome is one structured log event carrying the job,
//! the item, the page, the units and the retry-after — checked on the real
//! binary (`quota-worker run --log-format json`), fed by `quota-worker
//! trigger --wait`, against the simulated upstream.

use std::time::Duration;

use quota_worker::config::Config;
use serde_json::Value;
use simulator::{SimConfig, Simulator};

use crate::support::rig::Rig;
use crate::support::world;
use crate::support::{ConfigBuilder, Job, RedisServer, Sink, TestConfig, Window, limiter};

/// Two regions of three pages against 4 units, one task at a time: the
/// first region gets all three pages, the other one page before the window
/// says no.
fn config(redis: &str, sim: &str) -> TestConfig {
    ConfigBuilder::new()
        .redis_url(redis)
        .worker(world::quick_worker(1))
        .credential(world::credential(Window::sliding(4, "1h")))
        .endpoint(world::endpoint())
        .job(
            Job::videos("trending", world::ENDPOINT, sim)
                .fan_out("region", ["US", "GB"])
                .pages(3)
                .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
        )
        .write()
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
        .key(world::SECRET, 1000, Duration::from_secs(3600)),
    )
    .await
    .expect("simulator");
    let cfg = config(&redis.url(), &sim.base_url());

    let mut rig = tokio::task::block_in_place(|| Rig::start(redis, cfg, &[]));

    // Tasks ended `quota_exhausted`: `trigger --wait` exits 75.
    let t = tokio::task::block_in_place(|| rig.trigger_expect("trending", 75));
    let summary = t.stdout;
    assert!(
        summary.contains("2 task(s) ended") && summary.contains("quota_exhausted"),
        "{summary}"
    );

    // What the window says, to check the event against.
    let config = Config::load_with_env(&rig.cfg.path(), &|_| None).expect("config");
    let limiter = limiter(&rig.redis, &config).await;
    let used = limiter.peek(world::CREDENTIAL).await.expect("peek").windows[0].used;
    assert_eq!(used, 4);

    // SIGTERM by pid: a clean shutdown, exit 0.
    let daemon = &mut rig.daemon;
    daemon.term();
    let status = daemon
        .wait_exit(Duration::from_secs(15))
        .expect("no exit after SIGTERM");
    assert_eq!(status.code(), Some(0));

    let lines = daemon.stderr_lines();
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
    assert_eq!(e["endpoint"], world::ENDPOINT, "{e}");
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
        lines.iter().all(|l| !l.contains(world::SECRET)),
        "secret in the log"
    );
    sim.shutdown().await;
}
