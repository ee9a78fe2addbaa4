//! Promise: a concurrent window (`kind = "concurrent"`) admits at most
//! `units` (weighted by cost) in flight at once: a spend takes a lease of its
//! cost, all or nothing with every other window of the spend; any settle of
//! the spend returns the lease (0 refunds its units too); a lease nobody
//! returns lapses after `lease`, dropped lazily and at most 128 a call; a
//! refusal names the window and waits until the earliest lease expires, at
//! most 1,000 ms; a retried spend is not leased twice; the keys go when
//! nothing is in flight and expire when idle; `quota` shows the leases; and
//! the CLI takes a lease (`spend`) and returns it (`settle ENDPOINT ID COST`);
//! a credential's concurrent window caps every resource's requests unless
//! it names one.

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Limiter, RejectedBy, SpendOptions, request_id};

use crate::support::keys;
use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window, machine,
};

/// `k`: 5 in flight and 100 units an hour; `one` costs 1, `two` costs 2;
/// `own` has a concurrent window of its own (2 in flight, lease 300 ms)
/// on credential `solo` (6 an hour).
fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(100, "1h"))
                .window(Window::concurrent(5)),
        )
        .endpoint(Endpoint::new("one", "k", 1).timeout("2s"))
        .endpoint(Endpoint::new("two", "k", 2))
        .credential(Credential::env("solo", "S").window(Window::sliding(6, "1h")))
        .endpoint(Endpoint::new("own", "solo", 1).window(Window::concurrent(2).lease("300ms")))
        .write()
}

async fn limiter(server: &RedisServer, cfg: &TestConfig) -> Limiter {
    support::limiter(server, &Config::load(&cfg.path()).expect("config")).await
}

/// (units in flight, leases held) of credential `c`'s window `i` (0-based).
async fn in_flight(limiter: &Limiter, c: &str, i: usize) -> (u64, u64) {
    let w = &limiter.peek(c).await.expect("peek").windows[i];
    assert!(w.window.is_concurrent(), "{w:?}");
    (w.used, w.leases)
}

/// Spends on `ep` and asserts the spend was admitted.
async fn admits(limiter: &Limiter, ep: &str, cost: Option<u64>, id: &str) {
    let d = limiter.spend(ep, cost, id).await.expect("spend");
    assert!(d.is_allowed(), "{ep} {id}: {d:?}");
}

#[tokio::test]
async fn leases_are_weighted_all_or_nothing_and_returned_by_any_settle() {
    let server = RedisServer::start();
    let cfg = config();
    let limiter = limiter(&server, &cfg).await;

    // 2 + 2 + 1 = 5 in flight: full.
    for (ep, id) in [("two", "a"), ("two", "b"), ("one", "c")] {
        let d = limiter.spend(ep, None, id).await.expect("spend");
        assert!(d.is_allowed(), "{ep} {id}: {d:?}");
    }
    assert_eq!(in_flight(&limiter, "k", 1).await, (5, 3));
    let r = support::rejected(limiter.spend("one", None, "d").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::InFlight(2), "{r:?}");
    assert_eq!(r.remaining, 0);
    // The earliest lease expires in timeout + 5 s (7 s for `one`, 35 s
    // for `two`): the wait is capped at 1 s.
    assert_eq!(r.retry_after, Duration::from_millis(1000), "{r:?}");
    // All or nothing: the refused spend took nothing from the hour.
    let u = limiter.peek("k").await.expect("peek");
    assert_eq!(
        u.windows[0].used, 5,
        "the hour holds the three admitted spends"
    );

    // A settle to 0 returns the lease and refunds the units.
    assert_eq!(limiter.settle("two", "a", 0).await.expect("settle"), 2);
    assert_eq!(in_flight(&limiter, "k", 1).await, (3, 2));
    assert_eq!(limiter.peek("k").await.expect("peek").windows[0].used, 3);
    // Weighted: 2 fit now, 3 do not.
    let r = support::rejected(limiter.spend("one", Some(3), "e").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::InFlight(2));
    admits(&limiter, "two", None, "f").await;
    assert_eq!(in_flight(&limiter, "k", 1).await, (5, 3));

    // A settle to any other cost (the answer was read) returns the lease
    // too, and the hour keeps what the request really cost.
    assert_eq!(limiter.settle("one", "c", 4).await.expect("settle"), 2);
    assert_eq!(in_flight(&limiter, "k", 1).await, (4, 2));
    assert_eq!(
        limiter.peek("k").await.expect("peek").windows[0].used,
        3 + 2 + 3
    );
    // A second settle of it finds no lease: only the hour adjusts.
    assert_eq!(limiter.settle("one", "c", 1).await.expect("settle"), 1);
    assert_eq!(in_flight(&limiter, "k", 1).await, (4, 2));

    // A retry of an admitted spend (its reply was lost) is not leased twice.
    admits(&limiter, "two", None, "f").await;
    assert_eq!(in_flight(&limiter, "k", 1).await, (4, 2));
    // ... even when the window is full by then.
    admits(&limiter, "one", None, "g").await;
    assert_eq!(in_flight(&limiter, "k", 1).await, (5, 3));
    admits(&limiter, "one", None, "g").await;
    assert_eq!(in_flight(&limiter, "k", 1).await, (5, 3));
}

#[tokio::test]
async fn all_or_nothing_with_the_other_windows_of_the_spend() {
    let server = RedisServer::start();
    let cfg = ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(4, "1h"))
                .window(Window::concurrent(3)),
        )
        .endpoint(Endpoint::new("two", "k", 2))
        .write();
    let limiter = limiter(&server, &cfg).await;
    let hour = || async { limiter.peek("k").await.expect("peek").windows[0].used };
    admits(&limiter, "two", None, "a").await;
    // Too many in flight: refused, and the hour is not charged.
    let r = support::rejected(limiter.spend("two", None, "b").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::InFlight(2), "{r:?}");
    assert_eq!(
        (hour().await, in_flight(&limiter, "k", 1).await),
        (2, (2, 1))
    );
    // `a` answered, at a cost of 1: its lease is back.
    limiter.settle("two", "a", 1).await.expect("settle");
    admits(&limiter, "two", None, "b").await;
    admits(&limiter, "two", Some(1), "c").await;
    limiter.settle("two", "b", 2).await.expect("settle");
    assert_eq!(
        (hour().await, in_flight(&limiter, "k", 1).await),
        (4, (1, 1))
    );
    // The hour is full: refused, and no lease is taken.
    let r = support::rejected(limiter.spend("two", None, "d").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::Window(1), "{r:?}");
    assert_eq!(
        in_flight(&limiter, "k", 1).await,
        (1, 1),
        "no lease for the refused spend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_nobody_returns_lapses_at_its_expiry() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = config();
    let limiter = limiter(&server, &cfg).await;
    // The first call loads the spend core into Redis: done here, so the
    // calls timed below are the three spends alone.
    assert_eq!(in_flight(&limiter, "solo", 1).await, (0, 0));

    let before = server.time_us();
    for id in ["x", "y"] {
        admits(&limiter, "own", None, id).await;
    }
    let r = support::rejected(limiter.spend("own", None, "z").await.expect("spend"));
    let after = server.time_us();
    // The endpoint's own window is the credential's second (1-based).
    assert_eq!(r.by, RejectedBy::InFlight(2), "{r:?}");
    // The earliest lease expires 300 ms after it was taken.
    let ms = r.retry_after.as_millis() as i64;
    let elapsed = (after - before) / 1000;
    assert!(
        (300 - elapsed - 1..=300).contains(&ms),
        "retry_after {ms} ms, expected 300 ms less the {elapsed} ms the calls took"
    );
    // Each lease's expiry, as the window holds it (µs, Redis's clock): 300
    // ms after its spend, which ran between `before` and `after`; the
    // refusal's wait reaches the earliest.
    let leases = keys::window(&support::load(&cfg), "solo", Some("own"), 0)[1].clone();
    let expiries: Vec<(String, i64)> = server.cmd(&["ZRANGE", &leases, "0", "-1", "WITHSCORES"]);
    let ids: Vec<&str> = expiries.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["x", "y"], "{expiries:?}");
    for (id, at) in &expiries {
        assert!(
            (before + 300_000..=after + 300_000).contains(at),
            "{id}'s lease expires at {at}, not 300 ms after its spend ({before}..{after})"
        );
    }
    assert!(
        after + r.retry_after.as_micros() as i64 >= expiries[0].1,
        "the refusal's wait ends before the earliest lease expires: {r:?}"
    );
    // Nobody settles: by Redis's clock at the later expiry both leases
    // lapse, and a spend fits. (Not `before` + 300 ms and a margin: a
    // lease starts when its spend runs, which a loaded machine can put
    // tens of ms after `before`.)
    server.sleep_until_us(expiries[1].1);
    admits(&limiter, "own", None, "z").await;
    assert_eq!(in_flight(&limiter, "solo", 1).await, (1, 1));
    // A settle of a lapsed lease finds nothing to return (the hour still
    // holds the spend: 1 window).
    assert_eq!(limiter.settle("own", "x", 1).await.expect("settle"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_leases_are_dropped_at_most_128_a_call() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    // A lease long enough for 300 spends to be taken before the first
    // lapses, even on a loaded machine (200 ms was not: 296 of 300 held).
    let cfg = ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(Window::concurrent(1000).lease("2s")))
        .endpoint(Endpoint::new("one", "k", 1))
        .write();
    let limiter = limiter(&server, &cfg).await;
    for _ in 0..300 {
        admits(&limiter, "one", None, &request_id()).await;
    }
    let taken = server.time_us();
    let window = keys::window(&support::load(&cfg), "k", None, 0);
    assert_eq!(server.cmd::<i64>(&["ZCARD", &window[1]]), 300);
    // Every lease lapsed: the last was taken at `taken`.
    server.sleep_until_us(taken + 2_200_000);
    // Each call (a peek brings the window to now too) drops 128 at most;
    // what is left still counts, so the window admits less, never more.
    let mut left = Vec::new();
    for _ in 0..3 {
        let (used, leases) = in_flight(&limiter, "k", 0).await;
        assert_eq!(used, leases, "each lease holds 1 unit");
        left.push(leases);
    }
    assert_eq!(left, [172, 44, 0]);
    for key in &window {
        let kept: i64 = server.cmd(&["EXISTS", key]);
        assert_eq!(kept, 0, "nothing in flight: nothing kept: {key}");
    }
}

#[tokio::test]
async fn its_keys_go_when_nothing_is_in_flight_and_expire_when_idle() {
    let server = RedisServer::start();
    let cfg = config();
    let limiter = limiter(&server, &cfg).await;
    admits(&limiter, "one", None, "a").await;
    // The concurrent window's counters, lease expiries, leased units.
    let keys = keys::window(&support::load(&cfg), "k", None, 1);
    assert_eq!(keys.len(), 3, "{keys:?}");
    for key in &keys {
        let ttl: i64 = server.cmd(&["PTTL", key]);
        // The lease (2 s + 5 s) and a quarter of it as slack.
        assert!((7_000..=8_750).contains(&ttl), "{key}: PTTL {ttl} ms");
    }
    assert_eq!(limiter.settle("one", "a", 1).await.expect("settle"), 2);
    for key in &keys {
        assert_eq!(
            server.cmd::<i64>(&["EXISTS", key]),
            0,
            "{key} stays with nothing in flight"
        );
    }
    // Counters lost with leases left (deleted by hand, say): the leases no
    // longer count, rather than counting for ever.
    admits(&limiter, "one", None, "b").await;
    server.cmd::<i64>(&["DEL", &keys[0]]);
    admits(&limiter, "one", None, "c").await;
    assert_eq!(in_flight(&limiter, "k", 1).await, (1, 1));
}

#[tokio::test]
async fn a_template_tenant_has_leases_of_its_own() {
    let server = RedisServer::start();
    let cfg = ConfigBuilder::new()
        .credential(
            Credential::template("ig", "account", "tokens/{account}").window(Window::concurrent(1)),
        )
        .endpoint(Endpoint::new("media", "ig", 1))
        .write();
    let limiter = limiter(&server, &cfg).await;
    for tenant in ["1", "2"] {
        let d = (limiter.spend_with("media", &request_id(), SpendOptions::new().tenant(tenant)))
            .await
            .expect("spend");
        assert!(d.is_allowed(), "tenant {tenant}: {d:?}");
    }
    let r = (limiter.spend_with("media", "again", SpendOptions::new().tenant("1")))
        .await
        .expect("spend");
    assert_eq!(support::rejected(r).by, RejectedBy::InFlight(1));
    assert_eq!(in_flight(&limiter, "ig[account=1]", 0).await, (1, 1));
}

/// The lease round trip through the real binary: spend → refused at N →
/// settle → admitted; `quota` shows the leases.
#[test]
fn the_cli_takes_a_lease_and_settle_returns_it() {
    let server = RedisServer::start();
    let cfg = config();
    let spend = |ep: &str| {
        let out = cfg.run_on(&server, &["spend", ep, "--json"]);
        (out.status.code(), support::json(&out))
    };
    let mut leases = Vec::new();
    for _ in 0..5 {
        let (code, j) = spend("one");
        assert_eq!(code, Some(0), "{j}");
        assert_eq!(j["lease"], j["request_id"], "{j}");
        assert_eq!(j["lease_ms"], 7_000, "timeout 2 s + 5 s: {j}");
        leases.push(j["lease"].as_str().expect("lease").to_owned());
    }
    let (code, j) = spend("one");
    assert_eq!(code, Some(75), "{j}");
    assert_eq!(j["rejecting_window"], 2, "{j}");
    assert_eq!(j["retry_after_ms"], 1_000, "{j}");
    assert!(j.get("lease").is_none(), "{j}");

    let out = cfg.run_on(&server, &["quota", "k", "--json"]);
    let w = &support::json(&out)["credentials"][0]["windows"][1];
    assert_eq!(
        (w["kind"].as_str(), w["used"].as_u64(), w["leases"].as_u64()),
        (Some("concurrent"), Some(5), Some(5)),
        "{w}"
    );
    let out = cfg.run_on(&server, &["quota", "k"]);
    assert!(
        support::stdout(&out).contains("5 in flight (5 leases held)"),
        "{}",
        support::stdout(&out)
    );

    let out = cfg.run_on(&server, &["settle", "one", &leases[0], "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert!(
        support::stdout(&out).starts_with("refunded spend"),
        "{}",
        support::stdout(&out)
    );
    let (code, j) = spend("one");
    assert_eq!(code, Some(0), "admitted once a lease is back: {j}");
    let out = cfg.run_on(&server, &["settle", "one", &leases[1], "1", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert_eq!(support::json(&out)["windows"], 2);

    // Unknown id (or one already refunded), unknown endpoint: 64.
    for (args, says) in [
        (
            vec!["settle", "one", &leases[0], "0"],
            "no window of one holds spend",
        ),
        (
            vec!["settle", "one", "nope", "1"],
            "no window of one holds spend",
        ),
        (vec!["settle", "nope", &leases[2], "1"], "unknown endpoint"),
    ] {
        let out = cfg.run_on(&server, &args);
        assert_eq!(
            out.status.code(),
            Some(64),
            "{args:?}: {}",
            support::stdout(&out)
        );
        assert!(
            support::stderr(&out).contains(says),
            "{args:?}: {}",
            support::stderr(&out)
        );
    }
}

/// A task that panics holding a lease (right after its spend, before its
/// request) still returns it, long before it would lapse: the lease's
/// guard hands the settle to the runtime as the task unwinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_holding_a_lease_returns_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use quota_worker::daemon::Hooks;
    use simulator::SimConfig;

    use crate::support::pipeline::Pipeline;

    let panics = Arc::new(AtomicUsize::new(1));
    let hooks = Hooks {
        panic_after_spend: Some(panics.clone()),
        ..Hooks::default()
    };
    let sim = SimConfig::default().key("k-key", 1_000, Duration::from_secs(3600));
    let p = Pipeline::start_hooked(
        sim,
        |base| {
            ConfigBuilder::new()
                .credential(
                    Credential::env("k", "K")
                        .secret("k-key")
                        .window(Window::concurrent(1)),
                )
                // The lease would last 35 s unreturned.
                .endpoint(Endpoint::new("one", "k", 1).timeout("30s"))
                .job(
                    support::Job::videos("j", "one", base)
                        .fan_out("region", ["US"])
                        .pages(1),
                )
        },
        hooks,
    )
    .await;
    let tick = p.trigger("j").await;
    let returned = async {
        loop {
            let gone = panics.load(Ordering::SeqCst) == 0;
            if gone && in_flight(&p.limiter, "k", 0).await == (0, 0) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), returned)
        .await
        .expect("the panicking task's lease was not returned within 10 s (it lapses in 35 s)");
    assert!(
        p.sim.stats().requests.is_empty(),
        "the task panicked before its request"
    );
    let _ = tick;
}

/// A credential's concurrent window that names no resource caps every
/// request on the token, whatever resource the upstream counts it against
/// (GitHub's 100 concurrent requests are the token's, not `core`'s): a
/// search spend waits for a core request's lease. One that names a
/// resource caps only that resource's requests.
#[tokio::test]
async fn a_credentials_concurrent_window_caps_every_resource_unless_it_names_one() {
    let server = RedisServer::start();
    let github = |name: &str, concurrent: Window| {
        Credential::env(name, "GH")
            .window(Window::sliding(5000, "1h"))
            .window(Window::sliding(30, "1m").resource("search"))
            .window(concurrent)
    };
    let endpoints = |b: ConfigBuilder, c: &str| {
        b.endpoint(Endpoint::new(&format!("{c}.repos"), c, 1).set("accounting", "github"))
            .endpoint(
                Endpoint::new(&format!("{c}.search"), c, 1)
                    .set("accounting", "github")
                    .set("resource", "search"),
            )
    };
    let b = ConfigBuilder::new()
        .credential(github("gh", Window::concurrent(1)))
        .credential(github("gs", Window::concurrent(1).resource("search")));
    let cfg = endpoints(endpoints(b, "gh"), "gs").write();
    let limiter = limiter(&server, &cfg).await;

    let d = limiter.spend("gh.repos", None, "a").await.expect("spend");
    assert!(d.is_allowed(), "{d:?}");
    let r = support::rejected(limiter.spend("gh.search", None, "b").await.expect("spend"));
    assert_eq!(
        r.by,
        RejectedBy::InFlight(2),
        "the core request's lease holds the token's one: {r:?}"
    );
    limiter.settle("gh.repos", "a", 1).await.expect("settle");
    let d = limiter.spend("gh.search", None, "c").await.expect("spend");
    assert!(d.is_allowed(), "the lease is back: {d:?}");

    // Named "search": core requests take no lease from it.
    for id in ["d", "e"] {
        let d = limiter.spend("gs.repos", None, id).await.expect("spend");
        assert!(d.is_allowed(), "{id}: {d:?}");
    }
    let d = limiter.spend("gs.search", None, "f").await.expect("spend");
    assert!(d.is_allowed(), "{d:?}");
    let r = support::rejected(limiter.spend("gs.search", None, "g").await.expect("spend"));
    assert_eq!(r.by, RejectedBy::InFlight(2), "{r:?}");

    // `quota` (and /api/status, the metrics' label) names the resource
    // each counts: "*" for every one.
    let resource = |u: &quota_worker::quota::CredentialUsage| {
        (u.windows.iter().find(|w| w.window.is_concurrent()))
            .map(|w| w.resource.clone())
            .expect("a concurrent window")
    };
    assert_eq!(resource(&limiter.peek("gh").await.expect("peek")), "*");
    assert_eq!(resource(&limiter.peek("gs").await.expect("peek")), "search");
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    leases_are_weighted_all_or_nothing_and_returned_by_any_settle,
    all_or_nothing_with_the_other_windows_of_the_spend,
    a_lease_nobody_returns_lapses_at_its_expiry,
    lapsed_leases_are_dropped_at_most_128_a_call,
    its_keys_go_when_nothing_is_in_flight_and_expire_when_idle,
    a_template_tenant_has_leases_of_its_own,
    the_cli_takes_a_lease_and_settle_returns_it,
    a_task_that_panics_holding_a_lease_returns_it,
    a_credentials_concurrent_window_caps_every_resource_unless_it_names_one,
);
