//! Promise: a window is never overspent, whatever the number of concurrent
//! spenders in one process or across processes.

use quota_worker::config::Config;
use quota_worker::quota::{Decision, request_id};

use crate::support::machine;
use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window, limiter,
};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(Window::sliding(500, "1h")))
        .endpoint(Endpoint::new("one", "k", 1))
        .write()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = limiter(&server, &config).await;
    let mut handles = Vec::new();
    for _ in 0..64 {
        let l = limiter.clone();
        handles.push(tokio::spawn(async move {
            let mut allowed = 0u32;
            for _ in 0..20 {
                if let Decision::Allowed { .. } =
                    l.spend("one", None, &request_id()).await.expect("spend")
                {
                    allowed += 1;
                }
            }
            allowed
        }));
    }
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task");
    }
    assert_eq!(total, 500, "64 tasks x 20 spends on a 500-unit window");
    let usage = limiter.peek("k").await.expect("peek");
    assert_eq!(usage.windows[0].used, 500);
    assert_eq!(usage.windows[0].remaining, 0);
}

#[test]
fn four_processes_admit_exactly_the_limit() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = config();
    let children: Vec<_> = (0..4)
        .map(|_| {
            let path = cfg.path();
            let url = server.url();
            std::thread::spawn(move || {
                let mut allowed = 0;
                for _ in 0..150 {
                    let out = std::process::Command::new(support::bin())
                        .arg("-c")
                        .arg(&path)
                        .args(["spend", "one", "--json"])
                        .env("QUOTA_WORKER_REDIS_URL", &url)
                        .output()
                        .expect("run spend");
                    match out.status.code() {
                        Some(0) => allowed += 1,
                        Some(75) => {}
                        other => panic!("spend exited {other:?}: {}", support::stderr(&out)),
                    }
                }
                allowed
            })
        })
        .collect();
    let total: u32 = children
        .into_iter()
        .map(|c| c.join().expect("thread"))
        .sum();
    assert_eq!(total, 500, "4 processes x 150 spends on a 500-unit window");
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    sixty_four_tasks_admit_exactly_the_limit,
    four_processes_admit_exactly_the_limit,
);
