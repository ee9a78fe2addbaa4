//! Promise: a bucket window (`kind = "bucket"`, a leaky bucket / GCRA) admits
//! a burst of `units`, then refills continuously at `units / per`, weighted,
//! with an exact retry-after, all or nothing with the other windows of the
//! same spend, its clock Redis's; `quota` shows it as `kind: "bucket"`;
//! settling gives units back at once (as Shopify's own bucket does); a
//! bucket whose configuration can never admit a spend is a config error.

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{RejectedBy, request_id};

use crate::support::{self, RedisServer, TestConfig, machine};

/// 10 units per second: one unit refills every 100 ms.
const CONFIG: &str = r#"
[credentials.shop]
secret_env = "S"
windows = [{ kind = "bucket", units = 10, per = "1s" }]

[endpoints.gql]
credential = "shop"
cost = 1

[credentials.both]
secret_env = "B"
windows = [{ kind = "bucket", units = 10, per = "1s" }, { units = 15, per = "1h" }]

[endpoints.mixed]
credential = "both"
cost = 1
"#;

/// The level drains from the first spend of the burst on: a retry-after of
/// `full` ms from then, asked `elapsed` ms later, is `full - elapsed`, within
/// the time the calls took.
fn assert_refill(ms: u128, full: i64, elapsed: (i64, i64), what: &str) {
    let ms = ms as i64;
    assert!(
        (full - elapsed.1..=full - elapsed.0 + 1).contains(&ms),
        "{what}: retry_after {ms} ms, expected {full} ms less {}..{} ms",
        elapsed.0,
        elapsed.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_admits_its_burst_then_refills_at_its_rate_with_exact_retry_after() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let bucket = support::keys::window(&config, "shop", None, 0);

    // The burst: 10 units at once. The level drains from the first spend on
    // (its time is in the bucket's id log).
    for i in 0..10 {
        let d = limiter
            .spend("gql", None, &format!("burst-{i}"))
            .await
            .expect("spend");
        assert!(d.is_allowed(), "spend {i} of the burst: {d:?}");
    }
    let start =
        support::seed::spend_time_us(&server, &bucket, "burst-0").expect("the first spend's time");
    let ms_since = |t: i64| (t - start) / 1000;
    let before = server.time_us();
    let r = support::rejected(limiter.spend("gql", None, "x1").await.expect("spend"));
    let after = server.time_us();
    assert_eq!(r.by, RejectedBy::Window(1));
    assert_eq!(r.remaining, 0);
    // One unit refills 100 ms after the burst began.
    assert_refill(
        r.retry_after.as_millis(),
        100,
        (ms_since(before), ms_since(after) + 1),
        "cost 1",
    );

    // Cost 3 waits for three units to refill: 300 ms.
    let before = server.time_us();
    let r3 = support::rejected(limiter.spend("gql", Some(3), "x3").await.expect("spend"));
    let after = server.time_us();
    assert_refill(
        r3.retry_after.as_millis(),
        300,
        (ms_since(before), ms_since(after) + 1),
        "cost 3",
    );

    // At that time a cost-3 spend is admitted, and no earlier.
    let at = before + r3.retry_after.as_micros() as i64;
    server.sleep_until_us(at - 40_000);
    let early = limiter.spend("gql", Some(3), "early").await.expect("spend");
    assert!(
        !early.is_allowed() || server.time_us() >= at - 1_000,
        "40 ms before the retry-after, 3 units have not refilled: {early:?}"
    );
    // A loaded machine may run the early probe late, past `at`: then it took
    // the 3 units itself, at its time, which is the promise.
    if !early.is_allowed() {
        server.sleep_until_us(at + 1_000);
        let d = limiter
            .spend("gql", Some(3), "on-time")
            .await
            .expect("spend");
        assert!(d.is_allowed(), "{d:?}");
    }

    // Refill never goes past the burst: after 2 s idle, 10 units, not 20.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let u = limiter.peek("shop").await.expect("peek");
    assert_eq!((u.windows[0].used, u.windows[0].remaining), (0, 10));
    support::admit_n(&limiter, "gql", 10).await;
    assert!(
        !limiter
            .spend("gql", None, &request_id())
            .await
            .expect("spend")
            .is_allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_and_a_sliding_window_admit_all_or_nothing() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let (bucket, hourly) = (
        support::keys::window(&config, "both", None, 0),
        support::keys::window(&config, "both", None, 1),
    );
    let used = || async {
        let u = limiter.peek("both").await.expect("peek");
        u.windows.iter().map(|w| w.used).collect::<Vec<_>>()
    };

    // The bucket refuses first: the sliding window records nothing.
    assert!(
        limiter
            .spend("mixed", Some(10), "a")
            .await
            .expect("spend")
            .is_allowed()
    );
    let r = support::rejected(limiter.spend("mixed", Some(2), "b").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::Window(1), "the bucket");
    // The bucket drains a unit every 100 ms meanwhile, so its level is read
    // with that slack; that no window recorded b is exact.
    let in_bucket = |id: &str| support::seed::spend_time_us(&server, &bucket, id);
    let in_hourly = |id: &str| support::seed::spend_time_us(&server, &hourly, id);
    assert!(in_bucket("a").is_some() && in_hourly("a").is_some());
    assert_eq!((in_bucket("b"), in_hourly("b")), (None, None));
    let u = used().await;
    assert!(u[0] <= 10 && u[1] == 10, "{u:?}");

    // Refilled, the sliding window (15 per hour) refuses: the bucket keeps
    // its level as it drains, nothing added.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let r = support::rejected(limiter.spend("mixed", Some(6), "c").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::Window(2), "the hourly window");
    assert!(
        r.retry_after > Duration::from_secs(3_500),
        "{:?}",
        r.retry_after
    );
    assert_eq!(used().await, [0, 10]);
    assert_eq!((in_bucket("c"), in_hourly("c")), (None, None));
    assert!(
        limiter
            .spend("mixed", Some(5), "d")
            .await
            .expect("spend")
            .is_allowed()
    );
    assert!(in_bucket("d").is_some() && in_hourly("d").is_some());
    let u = used().await;
    assert!((1..=5).contains(&u[0]) && u[1] == 15, "{u:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_a_bucket_spend_gives_units_back_at_once() {
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;

    // A query that asked for 8 and cost 2: 6 come back at once.
    assert!(
        limiter
            .spend("gql", Some(8), "q")
            .await
            .expect("spend")
            .is_allowed()
    );
    assert_eq!(limiter.settle("gql", "q", 2).await.expect("settle"), 1);
    let w = &limiter.peek("shop").await.expect("peek").windows[0];
    assert!(w.used <= 2, "{w:?}");
    assert!(
        limiter
            .spend("gql", Some(8), "r")
            .await
            .expect("spend")
            .is_allowed(),
        "the 6 units given back are there to spend"
    );
    // Settling again to the same cost changes nothing; a retried spend of
    // the same id is not charged again.
    assert_eq!(limiter.settle("gql", "q", 2).await.expect("settle"), 1);
    assert!(
        limiter
            .spend("gql", Some(8), "r")
            .await
            .expect("spend")
            .is_allowed()
    );
    let r = support::rejected(limiter.spend("gql", Some(8), "s").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::Window(1));
}

#[test]
fn the_cli_spends_from_a_bucket_and_quota_shows_it() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let before = server.time_us();
    let out = cfg.run_on(&server, &["spend", "gql", "--cost", "10", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let out = cfg.run_on(&server, &["spend", "gql", "--cost", "4", "--json"]);
    let elapsed_ms = (server.time_us() - before) / 1000;
    assert_eq!(out.status.code(), Some(75));
    let j = support::json(&out);
    assert_eq!(j["rejecting_window"], 1);
    let retry = j["retry_after_ms"].as_u64().expect("retry_after_ms") as i64;
    // Less what drained while the two processes started (slow on a loaded
    // machine), but never less than the 4 units' 400 ms minus that.
    assert!(
        retry <= 400 && retry >= 400 - elapsed_ms - 1,
        "4 units refill in 400 ms, {elapsed_ms} ms after the burst: {retry}"
    );

    let out = cfg.run_on(&server, &["quota", "shop", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let w = &support::json(&out)["credentials"][0]["windows"][0];
    assert_eq!(w["kind"], "bucket", "{w}");
    assert_eq!(w["units"], 10);
    assert_eq!(w["period_ms"], 1000);
    let used = w["used"].as_u64().expect("used");
    assert!((7..=10).contains(&used), "{w}");
    assert_eq!(w["remaining"].as_u64(), Some(10 - used));
    let frees = w["frees_in_ms"].as_u64().expect("frees_in_ms");
    assert!(
        (1..=100).contains(&frees),
        "the next unit drains within 100 ms: {w}"
    );

    let out = cfg.run_on(&server, &["quota", "shop"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("10/1s bucket"), "{text}");
}

#[test]
fn a_bucket_that_can_never_admit_is_a_config_error() {
    for (window, field, why) in [
        (
            r#"{ kind = "bucket", units = 5, per = "1s" }"#,
            "endpoints.e.cost",
            "more than the smallest window",
        ),
        (
            r#"{ kind = "bucket", units = 50, per = "1s", reset = "00:00" }"#,
            "credentials.c.windows[0].reset",
            "only fixed windows reset",
        ),
        (
            r#"{ kind = "bucket", units = 9000000000000, per = "24h" }"#,
            "credentials.c.windows[0]",
            "below 2^53",
        ),
        (
            r#"{ kind = "leaky", units = 50, per = "1s" }"#,
            "credentials.c.windows[0].kind",
            "\"bucket\"",
        ),
    ] {
        let cfg = TestConfig::new(
            &format!(
                "[credentials.c]\nsecret_env = \"C\"\nwindows = [{window}]\n\n\
                 [endpoints.e]\ncredential = \"c\"\ncost = 10\n"
            ),
            &[],
        );
        let out = cfg.run(&["check"], &[("C", "x")]);
        let err = support::stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{window}: {err}");
        assert!(err.contains("config.toml:"), "{err}");
        assert!(err.contains(field), "{window}: {err}");
        assert!(err.contains(why), "{window}: {err}");
    }
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    a_bucket_admits_its_burst_then_refills_at_its_rate_with_exact_retry_after,
    a_bucket_and_a_sliding_window_admit_all_or_nothing,
    settling_a_bucket_spend_gives_units_back_at_once,
);
