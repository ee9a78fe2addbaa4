//! Promise: the boundary demonstration. A full burst one second before a
//! fixed window's boundary and another two seconds after it: the fixed window
//! (`kind = "fixed"`, as some upstreams count) admits twice its limit within
//! those three seconds, the sliding window (the default) exactly its limit.

use quota_worker::config::Config;
use quota_worker::quota::{Decision, Limiter, RejectedBy, request_id};

use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

const PER_US: i64 = 5_000_000;

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("fixed", "F").window(Window::fixed(10, "5s")))
        .credential(Credential::env("sliding", "S").window(Window::sliding(10, "5s")))
        .endpoint(Endpoint::new("f", "fixed", 1))
        .endpoint(Endpoint::new("s", "sliding", 1))
        .write()
}

/// Spends `n` times; the admitted count and the last rejection's retry-after.
async fn burst(limiter: &Limiter, endpoint: &str, n: usize) -> (usize, Option<u128>) {
    let (mut allowed, mut retry) = (0, None);
    for _ in 0..n {
        match limiter
            .spend(endpoint, None, &request_id())
            .await
            .expect("spend")
        {
            Decision::Allowed { .. } => allowed += 1,
            Decision::Rejected(r) => {
                assert_eq!(r.by, RejectedBy::Window(1));
                retry = Some(r.retry_after.as_millis());
            }
            Decision::Unchecked => panic!("unchecked with Redis up"),
        }
    }
    (allowed, retry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_around_a_boundary_fixed_admits_twice_the_limit_sliding_once() {
    let _machine = machine::timing();
    // Redis's clock starts 1.5 s before a boundary, so the test need not wait
    // for one; the boundary is still found from Redis TIME below.
    let start = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:03.500Z")
        .expect("time")
        .to_utc();
    let server = RedisServer::start_at(start);
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;

    // Fixed 5 s periods start at UTC midnight, so on multiples of 5 s since
    // the epoch. Pick a boundary at least 1.2 s away, by Redis's clock.
    let now = server.time_us();
    let mut boundary = (now / PER_US + 1) * PER_US;
    if boundary - now < 1_200_000 {
        boundary += PER_US;
    }

    server.sleep_until_us(boundary - 1_000_000);
    let (fixed_1, f_retry) = burst(&limiter, "f", 15).await;
    let s1_from = server.time_us();
    let (sliding_1, _) = burst(&limiter, "s", 15).await;
    let s1_to = server.time_us();
    assert!(
        server.time_us() < boundary - 500_000,
        "the first burst ran late"
    );
    assert_eq!((fixed_1, sliding_1), (10, 10), "the first burst fills both");
    let f_retry = f_retry.expect("fixed refused the 11th");
    assert!(
        (900..=1_000).contains(&f_retry),
        "a full fixed window frees at its boundary: {f_retry} ms"
    );

    server.sleep_until_us(boundary + 2_000_000);
    let (fixed_2, _) = burst(&limiter, "f", 15).await;
    let s2_from = server.time_us();
    let (sliding_2, s_retry) = burst(&limiter, "s", 15).await;
    let s2_to = server.time_us();
    assert!(server.time_us() < boundary + 2_500_000);
    assert_eq!(
        fixed_1 + fixed_2,
        20,
        "fixed: twice the limit within 3 seconds"
    );
    assert_eq!(
        sliding_1 + sliding_2,
        10,
        "sliding: the limit, in any 5 seconds"
    );
    // The sliding window frees when the first burst's first entry is 5 s
    // old: by the Redis times around both bursts (a loaded machine can
    // stretch either), within these bounds, to the millisecond.
    let s_retry = s_retry.expect("sliding refused") as i64;
    let (earliest, latest) = (
        (s1_from + PER_US - s2_to) / 1000 - 1,
        (s1_to + PER_US - s2_from) / 1000 + 1,
    );
    assert!(
        (earliest..=latest).contains(&s_retry) && (1_400..=2_600).contains(&s_retry),
        "the first burst leaves the sliding window 5 s after it: {s_retry} ms, not in {earliest}..={latest}"
    );
}
