//! Promise: idle keys expire by themselves, and never while they hold a live
//! entry. The script sets a sliding window's TTL to a window plus some slack
//! and renews it only when a new entry would outlive it, so most spends skip
//! the PEXPIREs; this pins that the renewal happens when it must. The
//! status page's spend history, written by the same call, is kept 24 hours
//! whatever the window (docs/status.md): it expires on its own clock.

use std::time::{Duration, Instant};

use quota_worker::config::Config;
use quota_worker::quota::request_id;

use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("c", "C").window(Window::sliding(10, "6s")))
        .endpoint(Endpoint::new("e", "c", 1))
        .write()
}

/// The spend history's ring: written by every spend, kept 24 h 5 min.
const RING: &str = "qw:{c}:spent:cred";

/// Every key but the history's ring, with its PTTL.
fn pttls(server: &RedisServer) -> Vec<(String, i64)> {
    let mut keys = server.keys("qw:*");
    keys.retain(|k| k != RING);
    keys.sort();
    keys.into_iter()
        .map(|k| {
            let ttl: i64 = server.cmd(&["PTTL", &k]);
            (k, ttl)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_outlive_their_newest_entry_by_a_window_then_expire() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    let spend = || async {
        let d = limiter
            .spend("e", None, &request_id())
            .await
            .expect("spend");
        assert!(d.is_allowed(), "{d:?}");
    };

    // A 6 s window: TTL 6 s + 1.5 s of slack (a quarter window).
    let start = Instant::now();
    spend().await;
    let first = pttls(&server);
    assert_eq!(
        first.len(),
        3,
        "counters, id log and entry stream: {first:?}"
    );
    for (k, ttl) in &first {
        assert!((6_900..=7_500).contains(ttl), "{k}: {ttl} ms");
    }
    let ring_ttl: i64 = server.cmd(&["PTTL", RING]);
    assert!(
        (86_000_000..=86_700_000).contains(&ring_ttl),
        "the history's ring expires 24 h 5 min after its last write: {ring_ttl} ms"
    );

    // 4 s on, a second entry: the keys' TTL would end 3.5 s from now,
    // before this entry's window does (6 s), so this spend renews it.
    tokio::time::sleep_until((start + Duration::from_millis(4_000)).into()).await;
    spend().await;
    for (k, ttl) in pttls(&server) {
        assert!(
            ttl >= 5_900,
            "{k} would expire before its newest entry: {ttl} ms"
        );
    }

    // Past the first TTL (7.5 s) and within the second entry's window (10 s):
    // the first entry has expired, the second is still counted.
    tokio::time::sleep_until((start + Duration::from_millis(8_300)).into()).await;
    let u = limiter.peek("c").await.expect("peek");
    assert!(
        start.elapsed() < Duration::from_millis(9_800),
        "the test ran late"
    );
    assert_eq!(u.windows[0].used, 1, "{u:?}");

    // Idle: everything goes by itself.
    assert!(
        support::wait_until(Duration::from_secs(8), || pttls(&server).is_empty()),
        "keys left behind: {:?}",
        pttls(&server)
    );
}
