//! Promise: the companion operations on the same windows. *settle* adjusts a
//! request's units in every window its spend touched (0 refunds it; more
//! shrinks what is left; an unknown id changes nothing); *block* stops every
//! spend on a credential, from every endpoint, for the block's length (the
//! rejection names no window: `rejecting_window` 0, `blocked: true`), and a
//! shorter block never shortens a longer one. A settle cost, block length
//! or spend cost the script cannot hold exactly (not whole, or 2^53 and
//! more) is an error the caller sees, and nothing is written.

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Decision, Limiter, QuotaError, RejectedBy};

use crate::support::keys;
use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(100, "1h"))
                .window(Window::fixed(50, "24h")),
        )
        .endpoint(Endpoint::new("e", "k", 10).window(Window::sliding(40, "1h")))
        .endpoint(Endpoint::new("f", "k", 5))
        .write()
}

/// The `used` of every window of `k`: [100/1h, 50/24h fixed, e's 40/1h].
async fn used(limiter: &Limiter) -> Vec<u64> {
    limiter
        .peek("k")
        .await
        .expect("peek")
        .windows
        .iter()
        .map(|w| w.used)
        .collect()
}

/// Every request id every window of `k` remembers (the sliding windows'
/// logs, the fixed window's hash), to see that a refund forgets it.
fn entries(server: &RedisServer, cfg: &TestConfig) -> Vec<(String, i64)> {
    let config = support::load(cfg);
    let logs = [
        keys::window_log(&config, "k", None, 0),
        keys::window_log(&config, "k", Some("e"), 0),
    ];
    let fixed = keys::window(&config, "k", None, 1)[0].clone();
    let mut all: Vec<(String, i64)> = (logs.into_iter())
        .map(|k| {
            let n: i64 = server.cmd(&["ZCARD", &k]);
            (k, n)
        })
        .collect();
    let n: i64 = server.cmd(&["HLEN", &fixed]);
    all.push((fixed, n));
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_refunds_adjusts_and_ignores_unknown_ids() {
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;

    // Refund: the request never reached the upstream.
    let d = limiter.spend("e", None, "a").await.expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 30 });
    assert_eq!(used(&limiter).await, [10, 10, 10]);
    let n = limiter.settle("e", "a", 0).await.expect("settle");
    assert_eq!(n, 3, "every window the spend touched");
    assert_eq!(used(&limiter).await, [0, 0, 0]);
    for (key, n) in entries(&server, &cfg) {
        // Left: no id in a sliding window's log; a fixed window's "#period"
        // and "#used".
        let expect = if key.ends_with(":log") { 0 } else { 2 };
        assert_eq!(n, expect, "{key} still holds the refunded request");
    }

    // Settle up: the upstream said it cost 25, not 10.
    let d = limiter.spend("e", None, "b").await.expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 30 });
    assert_eq!(limiter.settle("e", "b", 25).await.expect("settle"), 3);
    assert_eq!(used(&limiter).await, [25, 25, 25]);
    let d = limiter.spend("f", None, "c").await.expect("spend");
    assert_eq!(
        d,
        Decision::Allowed {
            remaining: 50 - 25 - 5
        },
        "settling up leaves less (it would say 35 unsettled)"
    );
    // ... and down again.
    assert_eq!(limiter.settle("e", "b", 3).await.expect("settle"), 3);
    assert_eq!(used(&limiter).await, [8, 8, 3]);

    // An id nobody spent changes nothing, anywhere.
    let before = (used(&limiter).await, entries(&server, &cfg));
    assert_eq!(limiter.settle("e", "nobody", 7).await.expect("settle"), 0);
    assert_eq!(limiter.settle("e", "nobody", 0).await.expect("settle"), 0);
    assert_eq!((used(&limiter).await, entries(&server, &cfg)), before);

    // A settled-up request still refunds whole.
    assert_eq!(limiter.settle("e", "b", 0).await.expect("settle"), 3);
    assert_eq!(used(&limiter).await, [5, 5, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_stops_every_endpoint_and_is_never_shortened() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;

    let blocked = limiter
        .block("k", Duration::from_millis(1_500))
        .await
        .expect("block");
    assert!(blocked > Duration::from_millis(1_400), "{blocked:?}");

    // e's tightest window is its own 40; f's the credential's 50.
    for (endpoint, room) in [("e", 40), ("f", 50)] {
        let r = support::rejected(limiter.spend(endpoint, None, "x").await.expect("spend"));
        assert_eq!(r.by, RejectedBy::Blocked, "{endpoint}");
        let ms = r.retry_after.as_millis();
        assert!((1_300..=1_500).contains(&ms), "{endpoint}: {ms} ms");
        assert_eq!(r.remaining, room, "{endpoint}: windows untouched");
    }

    // The CLI says so too.
    let out = cfg.run_on(&server, &["spend", "f", "--json"]);
    assert_eq!(out.status.code(), Some(75));
    let j = support::json(&out);
    assert_eq!(j["allowed"], false);
    assert_eq!(j["blocked"], true, "{j}");
    assert_eq!(j["rejecting_window"], 0);
    let ms = j["retry_after_ms"].as_u64().expect("retry");
    assert!((500..=1_500).contains(&ms), "{ms}");
    let out = cfg.run_on(&server, &["quota", "--json"]);
    let left = support::json(&out)["credentials"][0]["blocked_for_ms"]
        .as_u64()
        .expect("blocked_for_ms");
    assert!((500..=1_500).contains(&left), "{left}");

    // A shorter block (another worker's 429) keeps the longer one.
    let kept = limiter
        .block("k", Duration::from_millis(200))
        .await
        .expect("block");
    assert!(kept > Duration::from_millis(500), "{kept:?}");
    // About time: past the shorter block's end.
    std::thread::sleep(Duration::from_millis(300));
    let r = support::rejected(limiter.spend("e", None, "x").await.expect("spend"));
    assert_eq!(
        r.by,
        RejectedBy::Blocked,
        "still blocked after the short one ended"
    );

    // Nothing was recorded while blocked, and the block ends by itself.
    assert_eq!(used(&limiter).await, [0, 0, 0]);
    let until = limiter.peek("k").await.expect("peek").blocked_for;
    // About time: past the block's end.
    std::thread::sleep(until + Duration::from_millis(20));
    let d = limiter.spend("e", None, "x").await.expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 30 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_that_frees_after_the_block_is_named_instead() {
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    for id in ["a", "b", "c", "d"] {
        assert!(
            limiter
                .spend("e", None, id)
                .await
                .expect("spend")
                .is_allowed()
        );
    }
    limiter
        .block("k", Duration::from_secs(2))
        .await
        .expect("block");
    // e's own 40/1h window is full and frees in an hour: after the block.
    let r = support::rejected(limiter.spend("e", None, "x").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::Window(3));
    assert!(
        r.retry_after > Duration::from_secs(3_500),
        "{:?}",
        r.retry_after
    );
    // f has room in its windows: the block is what stops it.
    let r = support::rejected(limiter.spend("f", None, "x").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::Blocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_the_script_cannot_hold_exactly_are_refused_and_change_nothing() {
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    assert!(
        limiter
            .spend("e", None, "a")
            .await
            .expect("spend")
            .is_allowed()
    );
    let blocked_key = keys::keys().blocked("k");

    // Through the library: typed, with the script's reason.
    let err = limiter
        .settle("e", "a", 1 << 53)
        .await
        .expect_err("a settle cost of 2^53");
    assert!(matches!(err, QuotaError::Script(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("settle cost must be a whole number"),
        "{err}"
    );
    let err = limiter
        .block("k", Duration::from_millis(1 << 53))
        .await
        .expect_err("a block of 2^53 ms");
    assert!(matches!(err, QuotaError::Script(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("block duration must be a whole number"),
        "{err}"
    );

    // Through any client, as `keys` lays the call out: what Rust cannot send.
    let out = cfg.run(&["keys", "e"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let spec = support::json(&out);
    let keys: Vec<String> = spec["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k.as_str().expect("key").to_owned())
        .collect();
    assert_eq!(keys[0], blocked_key);
    let args: Vec<String> = spec["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_owned())
        .collect();
    let mut conn = server.conn();
    let script = redis::Script::new(quota_worker::quota::SCRIPT);
    let mut eval = |op: &str, a2: &str, a3: &str| -> Result<Vec<i64>, String> {
        let mut argv = args.clone();
        argv[0] = op.to_owned();
        argv[1] = a2.to_owned();
        argv[2] = a3.to_owned();
        script
            .key(&keys)
            .arg(&argv)
            .invoke::<Vec<i64>>(&mut conn)
            .map_err(|e| e.to_string())
    };
    let beyond = [
        "2.5",
        "1e300",
        "inf",
        "-inf",
        "nan",
        "9007199254740992",
        "9007199254740993",
        "-1",
        "",
        "ten",
    ];
    for bad in beyond {
        let err = eval("settle", "a", bad).expect_err(bad);
        assert!(
            err.contains("settle cost must be a whole number"),
            "{bad}: {err}"
        );
        let err = eval("block", bad, "").expect_err(bad);
        assert!(
            err.contains("block duration must be a whole number"),
            "{bad}: {err}"
        );
        let err = eval("spend", "b", bad).expect_err(bad);
        assert!(
            err.contains("spend cost must be a whole number"),
            "{bad}: {err}"
        );
    }
    let err = eval("block", "0", "").expect_err("a block of 0 ms");
    assert!(err.contains("block duration"), "{err}");

    // Nothing was written: no block, a's 10 units as they were, no b.
    assert_eq!(server.cmd::<i64>(&["EXISTS", &blocked_key]), 0);
    assert_eq!(used(&limiter).await, [10, 10, 10]);

    // The same calls with numbers it can hold go through.
    assert_eq!(
        eval("settle", "a", "9007199254740991").expect("settle 2^53 - 1"),
        [3]
    );
    assert_eq!(eval("settle", "a", "4").expect("settle 4"), [3]);
    assert_eq!(used(&limiter).await, [4, 4, 4]);
    let ms = eval("block", "60000", "").expect("block 1 min")[0];
    assert!((59_000..=60_000).contains(&ms), "{ms}");
    assert_eq!(server.cmd::<i64>(&["EXISTS", &blocked_key]), 1);
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    settle_refunds_adjusts_and_ignores_unknown_ids,
    a_block_stops_every_endpoint_and_is_never_shortened,
    a_window_that_frees_after_the_block_is_named_instead,
);
