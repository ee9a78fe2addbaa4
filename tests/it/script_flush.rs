//! Promise: `SCRIPT FLUSH` (or a Redis restart that loses the script cache)
//! never fails a spend: EVALSHA falls back to EVAL on NOSCRIPT, and the
//! count stays exact while another client flushes the cache over and over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Decision, request_id};

use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(600, "1h"))
                .window(Window::fixed(5000, "24h")),
        )
        .endpoint(Endpoint::new("one", "k", 1).window(Window::sliding(1000, "10m")))
        .write()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spends_survive_script_flush_with_exact_count() {
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;

    let stop = Arc::new(AtomicBool::new(false));
    let flushes = Arc::new(AtomicU64::new(0));
    let flusher = {
        let (stop, flushes) = (stop.clone(), flushes.clone());
        let mut conn = server.conn();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query(&mut conn)
                    .expect("SCRIPT FLUSH");
                flushes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };

    let mut tasks = Vec::new();
    for _ in 0..32 {
        let l = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let (mut allowed, mut errors) = (0u32, Vec::new());
            for _ in 0..30 {
                match l.spend("one", None, &request_id()).await {
                    Ok(Decision::Allowed { .. }) => allowed += 1,
                    Ok(_) => {}
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (allowed, errors)
        }));
    }
    let (mut allowed, mut errors) = (0, Vec::new());
    for t in tasks {
        let (a, e) = t.await.expect("task");
        allowed += a;
        errors.extend(e);
    }
    stop.store(true, Ordering::Relaxed);
    flusher.join().expect("flusher");

    assert!(
        flushes.load(Ordering::Relaxed) > 50,
        "the cache was flushed only {} times: the test proves nothing",
        flushes.load(Ordering::Relaxed)
    );
    assert!(
        errors.is_empty(),
        "{} of 960 spends failed while the script cache was flushed, e.g. {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(allowed, 600, "960 spends on a 600-unit window");
    let usage = limiter.peek("k").await.expect("peek");
    let used: Vec<u64> = usage.windows.iter().map(|w| w.used).collect();
    assert_eq!(used, [600, 600, 600]);
}

#[test]
fn cli_spend_after_script_flush() {
    // A fresh process meets an empty cache too (EVALSHA first, then EVAL).
    let server = RedisServer::start();
    let cfg = config();
    for _ in 0..3 {
        let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
        let out = cfg.run_on(&server, &["spend", "one", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
        assert_eq!(support::json(&out)["allowed"], true);
    }
}
