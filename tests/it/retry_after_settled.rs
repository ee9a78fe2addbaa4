//! Promise: a sliding window's retry-after is exact for any cost, whatever
//! the entries hold: a cost-100 spend over 1,000 cost-1 entries waits for the
//! 100th to expire; after refunds and settles (in and out of order, down and
//! up) it waits for exactly the units still counted, so a refunded entry never
//! keeps a later spend waiting; `used` stays exact as settled entries expire,
//! after an idle gap too.

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Limiter, RejectedBy};

use crate::support::seed::{Seed, spend_time_us};
use crate::support::{self, RedisServer, TestConfig, machine};

const CONFIG: &str = r#"
[credentials.big]
secret_env = "B"
windows = [{ units = 1000, per = "1m" }]

[endpoints.big]
credential = "big"
cost = 1

[credentials.k]
secret_env = "K"
windows = [{ units = 20, per = "30s" }]

[endpoints.e]
credential = "k"
cost = 1

[credentials.gap]
secret_env = "G"
windows = [{ units = 200000, per = "10s" }]

[endpoints.g]
credential = "gap"
cost = 1
"#;

/// A rejection's retry-after is `expiry` (µs, Redis time) less the time of
/// the call, to the millisecond.
async fn assert_waits_until(
    server: &RedisServer,
    limiter: &Limiter,
    endpoint: &str,
    cost: u64,
    expiry: i64,
    what: &str,
) {
    let t0 = server.time_us();
    let r = support::rejected(
        limiter
            .spend(endpoint, Some(cost), "probe")
            .await
            .expect("spend"),
    );
    let t1 = server.time_us();
    assert_eq!(r.by, RejectedBy::Window(1), "{what}");
    let ms = r.retry_after.as_millis() as i64;
    assert!(
        ((expiry - t1) / 1000..=(expiry - t0) / 1000 + 1).contains(&ms),
        "{what}, cost {cost}: retry_after {ms} ms, expected {} ms",
        (expiry - t0) / 1000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_100_over_1000_cost_1_entries_waits_for_the_100th() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    // 1,000 entries of 1 unit, 1 ms apart, the oldest 10 s old: full.
    let first = server.time_us() - 10_000_000;
    Seed {
        prefix: "e-",
        n: 1_000,
        cost: 1,
        first_us: first,
        step_us: 1_000,
        group: 1,
        per_ms: 60_000,
    }
    .write(&server, &support::keys::window(&config, "big", None, 0));
    let expiry = |i: i64| first + i * 1_000 + 60_000_000;
    for (cost, nth) in [(1, 0), (100, 99), (1_000, 999), (37, 36)] {
        assert_waits_until(
            &server,
            &limiter,
            "big",
            cost,
            expiry(nth),
            "1,000 entries of 1",
        )
        .await;
    }
}

/// One spend as the test's model of the window sees it.
struct Entry {
    id: &'static str,
    at: i64,
    units: u64,
}

/// When a spend of `cost` fits a window of `limit` units held by `entries`
/// (in time order), by the definition: the expiry of the entry at which the
/// oldest `used + cost - limit` units have expired; None if it fits now.
fn model_frees(entries: &[Entry], limit: u64, cost: u64, per: i64) -> Option<i64> {
    let used: u64 = entries.iter().map(|e| e.units).sum();
    if used + cost <= limit {
        return None;
    }
    let need = used + cost - limit;
    let mut freed = 0;
    for e in entries {
        freed += e.units;
        if freed >= need {
            return Some(e.at + per);
        }
    }
    unreachable!("cost {cost} above the limit")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_entries_count_what_they_settled_to_in_retry_after_and_used() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let window = support::keys::window(&config, "k", None, 0);
    let (limit, per) = (20u64, 30_000_000i64);

    // Eight spends filling the window exactly, 20 ms apart.
    let mut entries = Vec::new();
    for (id, cost) in [
        ("e1", 3),
        ("e2", 1),
        ("e3", 4),
        ("e4", 1),
        ("e5", 5),
        ("e6", 2),
        ("e7", 2),
        ("e8", 2),
    ] {
        let d = limiter.spend("e", Some(cost), id).await.expect("spend");
        assert!(d.is_allowed(), "{id}: {d:?}");
        let at = spend_time_us(&server, &window, id).expect("spent");
        entries.push(Entry {
            id,
            at,
            units: cost,
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Settles, each checked against the model for every cost that is refused:
    // refunds (the oldest first), a settle down, one up, settles out of order
    // (a later entry first), and one settled twice.
    let steps: [(&str, u64); 9] = [
        ("e1", 0),
        ("e6", 1),
        ("e3", 6),
        ("e8", 0),
        ("e5", 2),
        ("e4", 0),
        ("e6", 2),
        ("e2", 3),
        ("e7", 0),
    ];
    for (step, (id, actual)) in steps.into_iter().enumerate() {
        assert_eq!(
            limiter.settle("e", id, actual).await.expect("settle"),
            1,
            "step {step}: {id} is in the window"
        );
        let e = entries.iter_mut().find(|e| e.id == id).expect("known id");
        e.units = actual;
        let used: u64 = entries.iter().map(|e| e.units).sum();
        let w = &limiter.peek("k").await.expect("peek").windows[0];
        assert_eq!(w.used, used, "step {step} ({id} -> {actual}): used");
        for cost in 1..=limit {
            let what = format!("step {step} ({id} -> {actual})");
            match model_frees(&entries, limit, cost, per) {
                Some(expiry) => {
                    assert_waits_until(&server, &limiter, "e", cost, expiry, &what).await
                }
                None => assert!(
                    w.remaining >= cost,
                    "{what}: cost {cost} fits, {} left",
                    w.remaining
                ),
            }
        }
    }
    // A refunded id is forgotten: spent again, it is a new spend.
    assert_eq!(limiter.settle("e", "e1", 5).await.expect("settle"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn used_stays_exact_as_settled_entries_expire_after_an_idle_gap() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let window = support::keys::window(&config, "gap", None, 0);
    let per = 10_000_000;
    let used = || async { limiter.peek("gap").await.expect("peek").windows[0].used };

    // 100k entries of 1 unit spent 6 s ago (a hundred per µs; writing them
    // takes a second or two), four of them settled (to 0, 0, 0 and 5):
    // 100,000 - 4 + 5 units.
    let first = server.time_us() - 6_000_000;
    Seed {
        prefix: "old-",
        n: 100_000,
        cost: 1,
        first_us: first,
        step_us: 1,
        group: 100,
        per_ms: 10_000,
    }
    .write(&server, &window);
    for (id, actual) in [
        ("old-0000007", 0),
        ("old-0050000", 0),
        ("old-0099998", 0),
        ("old-0099999", 5),
    ] {
        assert_eq!(
            limiter.settle("g", id, actual).await.expect("settle"),
            1,
            "{id}"
        );
    }
    assert_eq!(used().await, 100_000 - 4 + 5);
    // A live spend, settled too; then all the others expire (found by
    // bisection, their adjustments with them).
    assert!(
        limiter
            .spend("g", Some(6), "live")
            .await
            .expect("spend")
            .is_allowed()
    );
    assert_eq!(limiter.settle("g", "live", 4).await.expect("settle"), 1);
    let live = spend_time_us(&server, &window, "live").expect("spent");
    assert!(
        live < first + per,
        "the seeding took too long: the old entries expired first"
    );
    server.sleep_until_us(first + 1_000 + per + 50_000);
    assert_eq!(used().await, 4, "only the live spend counts, as settled");

    // And a full window waits for exactly the live units.
    assert!(
        limiter
            .spend("g", Some(199_996), "fill")
            .await
            .expect("spend")
            .is_allowed()
    );
    assert_waits_until(&server, &limiter, "g", 4, live + per, "after the gap").await;
    let fill = spend_time_us(&server, &window, "fill").expect("spent");
    assert_waits_until(&server, &limiter, "g", 5, fill + per, "after the gap").await;
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    cost_100_over_1000_cost_1_entries_waits_for_the_100th,
    settled_entries_count_what_they_settled_to_in_retry_after_and_used,
    used_stays_exact_as_settled_entries_expire_after_an_idle_gap,
);
