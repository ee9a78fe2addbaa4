//! Promise: a spend stays correct however many entries a window holds. After
//! an idle gap, 100k expired entries are evicted without reading them and the
//! used units stay exact, both when the whole window has expired and when
//! some entries are still live; the expired entries are then dropped a slice
//! per call (so no call holds Redis for long: Lua's `unpack` limit of ~8,000
//! values is one trap, a 100k-member removal in one call the other); a window
//! holding 200k live entries answers exactly, rejections included.
//!
//! Entries are written straight into the script's layout
//! (`support::seed`), next to ones written by real spends, because spending
//! 100k times in a short window could not leave 100k entries to expire at once.

use quota_worker::config::Config;
use quota_worker::quota::{Decision, RejectedBy};

use crate::support::machine;
use crate::support::seed::{Seed, spend_time_us, stream_len};
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

/// `k`'s window, ms. Long enough that the live entries of
/// [`partly_expired_100k_entries_are_evicted_and_count_right`] stay live for
/// the whole test however loaded the machine (with 5 s, seeding 100k
/// entries and a hundred eviction calls could outlast them); the seeded
/// idle gap is twice as long.
const K_PER_MS: u64 = 60_000;
const IDLE_GAP_US: i64 = 2 * K_PER_MS as i64 * 1000;

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(Window::sliding(200_000, "60s")))
        .credential(Credential::env("big", "B").window(Window::sliding(1_000_000, "1h")))
        .endpoint(Endpoint::new("k", "k", 1))
        .endpoint(Endpoint::new("big", "big", 1))
        .write()
}

/// Writes `n` entries `{prefix}{i:07}` of `cost` units into a sliding
/// window, entry `i` spent at `start + i / group * step` µs.
fn seed(
    server: &RedisServer,
    window: &[String],
    prefix: &str,
    n: usize,
    cost: u64,
    at: (i64, i64, usize),
    per_ms: u64,
) {
    let (first_us, step_us, group) = at;
    Seed {
        prefix,
        n,
        cost,
        first_us,
        step_us,
        group,
        per_ms,
    }
    .write(server, window);
}

/// 100k entries of 1 unit into `k`'s window (`window`), all expired:
/// spent an idle gap ago, `group` to each spend time, 1 µs apart.
fn seed_expired(server: &RedisServer, window: &[String], group: usize) {
    let idle_since = server.time_us() - IDLE_GAP_US;
    seed(
        server,
        window,
        "old-",
        100_000,
        1,
        (idle_since, 1, group),
        K_PER_MS,
    );
}

fn zcard(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["ZCARD", key])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wholly_expired_window_of_100k_entries_is_dropped_and_counts_right() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let window = support::keys::window(&config, "k", None, 0);
    let log = &window[1];

    seed_expired(&server, &window, 1);
    assert_eq!(zcard(&server, log), 100_000);

    let d = limiter
        .spend("k", None, "after-the-gap")
        .await
        .expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 199_999 });
    let w = &limiter.peek("k").await.expect("peek").windows[0];
    assert_eq!((w.used, w.remaining), (1, 199_999));
    assert_eq!(zcard(&server, log), 1);
    assert_eq!(stream_len(&server, &window), 1, "only the new entry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partly_expired_100k_entries_are_evicted_and_count_right() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let window = support::keys::window(&config, "k", None, 0);
    let log = window[1].clone();

    // 100k expired entries, a hundred to each spend time, then three live
    // ones of 5 units, then a real spend of 4 (entries are kept in the order
    // they were spent).
    seed_expired(&server, &window, 100);
    let now = server.time_us();
    let live_at = now - 300_000;
    // Every count below assumes the live entries are still live: they are
    // until then (checked at the end).
    let live_until = live_at + K_PER_MS as i64 * 1000;
    seed(&server, &window, "live-", 3, 5, (live_at, 0, 1), K_PER_MS);
    let d = limiter.spend("k", Some(4), "real").await.expect("spend");
    assert_eq!(
        d,
        Decision::Allowed {
            remaining: 200_000 - 15 - 4
        },
        "the seeded entries expired while the spend ran"
    );
    let real = spend_time_us(&server, &window, "real").expect("recorded");
    let after = server.time_us();
    assert!(
        (now..=after).contains(&real),
        "spend times are Redis µs: {real} not in {now}..{after}"
    );

    let d = limiter
        .spend("k", Some(2), "after-the-gap")
        .await
        .expect("spend");
    assert_eq!(
        d,
        Decision::Allowed {
            remaining: 200_000 - 4 - 15 - 2
        },
        "only the live entries count"
    );
    let w = &limiter.peek("k").await.expect("peek").windows[0];
    assert_eq!(w.used, 4 + 15 + 2);
    assert_eq!(stream_len(&server, &window), 5, "five live entries");

    // The expired ids leave the log a slice per call, never all at once.
    let left = zcard(&server, &log);
    assert!(
        (5..100_005).contains(&left),
        "the log dropped {} of the 100k expired ids in the first calls",
        100_005 - left
    );
    let mut calls = 0;
    while zcard(&server, &log) > 5 {
        calls += 1;
        assert!(
            calls <= 100,
            "expired ids still in the log after {calls} calls"
        );
        let w = &limiter.peek("k").await.expect("peek").windows[0];
        assert_eq!(w.used, 4 + 15 + 2, "after {calls} calls");
    }
    let old: Option<f64> = server.cmd(&["ZSCORE", &log, "old-0099999"]);
    assert_eq!(old, None);
    assert!(
        server.time_us() < live_until,
        "the test outlasted the live entries' {K_PER_MS} ms: its counts assumed them live"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_200k_live_entries_answers_exactly() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let window = support::keys::window(&config, "big", None, 0);
    let per = 3_600_000_000i64;

    // ~200k entries of 5 units, 5 ms apart, the oldest 30 minutes old:
    // 999,950 of the 1M units used.
    let now = server.time_us();
    let oldest = now - 1_800_000_000;
    let at = |i: usize| oldest + i as i64 * 5_000;
    seed(
        &server,
        &window,
        "e-",
        199_990,
        5,
        (oldest, 5_000, 1),
        3_600_000,
    );

    let d = limiter.spend("big", Some(1), "fits").await.expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 49 });
    let w = &limiter.peek("big").await.expect("peek").windows[0];
    assert_eq!((w.used, w.remaining), (999_951, 49));

    // A cost needing n units freed waits for the entry that frees the n-th
    // (oldest first, 5 units each), not for the oldest, nor the whole scan.
    for (cost, nth) in [(50, 0), (54, 0), (55, 1), (61, 2), (1_000, 190)] {
        let t0 = server.time_us();
        let r = support::rejected(limiter.spend("big", Some(cost), "x").await.expect("spend"));
        let t1 = server.time_us();
        assert_eq!(r.by, RejectedBy::Window(1));
        assert_eq!(r.remaining, 49);
        let frees = at(nth) + per;
        let ms = r.retry_after.as_millis() as i64;
        assert!(
            ((frees - t1) / 1000 - 2..=(frees - t0) / 1000 + 2).contains(&ms),
            "cost {cost}: retry_after {ms} ms, expected entry {nth} to expire in {} ms",
            (frees - t0) / 1000
        );
    }
    assert_eq!(
        zcard(&server, &window[1]),
        199_991,
        "rejections record nothing"
    );
}
