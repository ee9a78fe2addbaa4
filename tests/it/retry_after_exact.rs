//! Promise: a rejection's retry-after is exact for weighted costs: when a
//! spend of the same cost would be admitted if nobody else spent, not merely
//! when the oldest entry expires.

use quota_worker::config::Config;
use quota_worker::quota::{Decision, RejectedBy, Rejection};

use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

const PER_US: i64 = 3_000_000;

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(Window::sliding(10, "3s")))
        .endpoint(Endpoint::new("e", "k", 3))
        .write()
}

fn rejected(d: Decision, what: &str) -> Rejection {
    match d {
        Decision::Rejected(r) => r,
        other => panic!("{what}: expected a rejection, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_retry_after_waits_for_enough_units_not_the_oldest_entry() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let window = support::keys::window(&config, "k", None, 0);

    // Three spends of 3, 300 ms apart: 9 of 10 units used.
    let mut spent_at = Vec::new();
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        if i > 0 {
            // About time: the spends' spacing is the point.
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let d = limiter.spend("e", None, id).await.expect("spend");
        assert_eq!(
            d,
            Decision::Allowed {
                remaining: 7 - 3 * i as u64
            }
        );
        spent_at.push(support::seed::spend_time_us(&server, &window, id).expect("spent"));
    }

    // Cost 7 needs 6 units freed: the oldest entry (3) is not enough, the
    // second one is. The answer is when "b" expires, not when "a" does.
    let frees = spent_at[1] + PER_US;
    let t0 = server.time_us();
    let r = rejected(
        limiter.spend("e", Some(7), "d").await.expect("spend"),
        "cost 7",
    );
    let t1 = server.time_us();
    assert_eq!(r.by, RejectedBy::Window(1));
    assert_eq!(r.remaining, 1);
    let ms = r.retry_after.as_millis() as i64;
    let (lo, hi) = ((frees - t1) / 1000 - 2, (frees - t0) / 1000 + 2);
    assert!(
        (lo..=hi).contains(&ms),
        "retry_after {ms} ms; the second entry expires in {lo}..={hi} ms \
         (the oldest would say {} ms)",
        (spent_at[0] + PER_US - t0) / 1000
    );

    // A little before that moment it is still refused (the oldest entry has
    // gone by then), and just after it, admitted.
    server.sleep_until_us(frees - 150_000);
    let t0 = server.time_us();
    assert!(
        t0 > spent_at[0] + PER_US,
        "the oldest entry has expired by now"
    );
    let r = rejected(
        limiter.spend("e", Some(7), "d").await.expect("spend"),
        "150 ms before",
    );
    assert_eq!(
        r.remaining, 4,
        "6 units left in the window after 'a' expired"
    );
    assert!(
        (100..=160).contains(&(r.retry_after.as_millis() as i64)),
        "{:?}",
        r.retry_after
    );

    server.sleep_until_us(frees + 10_000);
    let d = limiter.spend("e", Some(7), "d").await.expect("spend");
    assert_eq!(
        d,
        Decision::Allowed { remaining: 0 },
        "admitted once 'b' expired"
    );
    let used = limiter.peek("k").await.expect("peek").windows[0].used;
    assert_eq!(used, 10, "'c' (3) and 'd' (7)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_from_the_cli_matches_the_window() {
    let _machine = machine::timing();
    // Same arithmetic through `spend --json`: three spends of 3 in one burst,
    // then a cost of 7 must wait for the second one (all three expire at
    // about the same time, so the bound is the window, within the burst).
    let server = RedisServer::start();
    let cfg = config();
    for _ in 0..3 {
        let out = cfg.run_on(&server, &["spend", "e", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    }
    let out = cfg.run_on(&server, &["spend", "e", "--cost", "7", "--json"]);
    assert_eq!(out.status.code(), Some(75));
    let j = support::json(&out);
    assert_eq!(j["allowed"], false);
    assert_eq!(j["rejecting_window"], 1);
    assert_eq!(j["remaining"], 1);
    let ms = j["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!((2_000..=3_000).contains(&ms), "{ms}");
    let out = cfg.run_on(&server, &["spend", "e", "--cost", "7"]);
    let text = support::stdout(&out);
    assert!(
        text.contains("rejected: retry after") && text.contains("window 1"),
        "{text}"
    );
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    weighted_retry_after_waits_for_enough_units_not_the_oldest_entry,
    retry_after_from_the_cli_matches_the_window,
);
