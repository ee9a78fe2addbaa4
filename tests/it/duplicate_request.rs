//! Promise: a request id is charged once. Repeating a spend with the same id
//! (a retry after a lost reply) is admitted without being charged again, in
//! every kind of window, even when the window has since filled up and even
//! when the repeats race each other.

use quota_worker::config::Config;
use quota_worker::quota::{Decision, Limiter};

use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

/// `k`: `first` (10/1h in most tests), then 20 per fixed day; `e`'s own 30/10m.
fn config(first: Window) -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(first)
                .window(Window::fixed(20, "24h")),
        )
        .endpoint(Endpoint::new("e", "k", 1).window(Window::sliding(30, "10m")))
        .write()
}

async fn used(limiter: &Limiter) -> Vec<u64> {
    let usage = limiter.peek("k").await.expect("peek");
    usage.windows.iter().map(|w| w.used).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_request_id_is_admitted_and_charged_once() {
    let server = RedisServer::start();
    let cfg = config(Window::sliding(10, "1h"));
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;

    let first = limiter.spend("e", Some(2), "req-1").await.expect("spend");
    assert_eq!(first, Decision::Allowed { remaining: 8 });
    let again = limiter.spend("e", Some(2), "req-1").await.expect("spend");
    assert_eq!(
        again,
        Decision::Allowed { remaining: 8 },
        "not charged twice"
    );
    assert_eq!(used(&limiter).await, [2, 2, 2]);
    let log = support::keys::window_log(&support::load(&cfg), "k", None, 0);
    let n: i64 = server.cmd(&["ZCARD", &log]);
    assert_eq!(n, 1);

    // Fill the window with other requests: the repeat is still the request
    // that was admitted, not a new one to refuse.
    support::admit_n(&limiter, "e", 8).await;
    assert!(
        !limiter
            .spend("e", None, "req-2")
            .await
            .expect("spend")
            .is_allowed()
    );
    let again = limiter.spend("e", Some(2), "req-1").await.expect("spend");
    assert_eq!(again, Decision::Allowed { remaining: 0 });
    assert_eq!(used(&limiter).await, [10, 10, 10]);

    // A refunded request spent again is a new attempt, charged again.
    assert_eq!(limiter.settle("e", "req-1", 0).await.expect("settle"), 3);
    assert_eq!(used(&limiter).await, [8, 8, 8]);
    let d = limiter.spend("e", Some(2), "req-1").await.expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 0 });
    assert_eq!(used(&limiter).await, [10, 10, 10]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_repeats_of_one_id_are_charged_once() {
    let server = RedisServer::start();
    let cfg = config(Window::sliding(10, "1h"));
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move { l.spend("e", Some(3), "same").await.expect("spend") })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.expect("task"), Decision::Allowed { remaining: 7 });
    }
    assert_eq!(used(&limiter).await, [3, 3, 3]);
}

#[test]
fn a_rejected_id_is_not_remembered() {
    // A refusal records nothing, so the same id is charged once admitted.
    let server = RedisServer::start();
    let cfg = config(Window::sliding(2, "1s"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let limiter = rt.block_on(support::limiter(
        &server,
        &Config::load(&cfg.path()).expect("config"),
    ));
    assert!(
        rt.block_on(limiter.spend("e", Some(2), "fill"))
            .expect("spend")
            .is_allowed()
    );
    let d = rt
        .block_on(limiter.spend("e", Some(1), "late"))
        .expect("spend");
    assert!(!d.is_allowed(), "{d:?}");
    // About time: the 1s window frees.
    std::thread::sleep(std::time::Duration::from_millis(1_050));
    let d = rt
        .block_on(limiter.spend("e", Some(1), "late"))
        .expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 1 });
    let usage = rt.block_on(limiter.peek("k")).expect("peek");
    assert_eq!(usage.windows[0].used, 1, "the 1s window: only 'late'");
    assert_eq!(usage.windows[1].used, 3, "the fixed day: 'fill' and 'late'");
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    a_repeated_request_id_is_admitted_and_charged_once,
    racing_repeats_of_one_id_are_charged_once,
    a_rejected_id_is_not_remembered,
);
