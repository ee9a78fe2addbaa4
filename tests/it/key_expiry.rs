//! Promise: idle keys expire by themselves, and never while they hold a live
//! entry. The script sets a sliding window's TTL to a window plus some slack
//! and renews it only when a new entry would outlive it, so most spends skip
//! the PEXPIREs; this pins that the renewal happens when it must. The
//! status page's spend history, written by the same call, is kept 24 hours
//! whatever the window (docs/status.md): it expires on its own clock.

use std::time::{Duration, Instant};

use quota_worker::config::{Config, Scope};
use quota_worker::quota::request_id;

use crate::support::keys;
use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("c", "C").window(Window::sliding(10, "6s")))
        .endpoint(Endpoint::new("e", "c", 1))
        .write()
}

/// The spend history's ring: written by every spend, kept 24 h 5 min.
fn ring() -> String {
    keys::keys().spent("c", &Scope::Credential)
}

/// Every key but the history's ring, with its PTTL.
fn pttls(server: &RedisServer) -> Vec<(String, i64)> {
    let mut keys = server.keys(&format!("{}:*", keys::PREFIX));
    keys.retain(|k| *k != ring());
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
    let ring_ttl: i64 = server.cmd(&["PTTL", &ring()]);
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

/// A bucket's counters hold its level, which may outlive every entry's
/// keys (a drift synced onto a bucket with no spend yet): they expire when
/// the level has drained, not before. The script renews their TTL only when
/// that moves (other calls keep it), so this pins the three paths: the
/// spend that sets it, the sync that keeps it, and the sync that must move
/// it. (Bounds allow a slow machine a second between a call and its PTTL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buckets_counters_live_until_its_level_has_drained() {
    let server = RedisServer::start();
    // 100 units per 10 min: a full level drains in 600 s; the bucket's
    // keys outlive an entry by its period plus a quarter (750 s).
    let cfg = ConfigBuilder::new()
        .credential(Credential::env("b", "B").window(Window::bucket(100, "10m")))
        .credential(Credential::env("s", "S").window(Window::bucket(100, "10m")))
        .credential(Credential::env("t", "T").window(Window::bucket(100, "1m")))
        .endpoint(Endpoint::new("e", "b", 1))
        .endpoint(Endpoint::new("f", "t", 1))
        .write();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let meta_ttl = |cred: &str| -> i64 {
        let meta = &keys::window(&config, cred, None, 0)[0];
        server.cmd(&["PTTL", meta])
    };

    // A spend: the keys live 750 s; a sync that fills the level (its drain
    // ends in 600 s, before them) leaves the counters' TTL as it was.
    let d = limiter
        .spend("e", None, &request_id())
        .await
        .expect("spend");
    assert!(d.is_allowed(), "{d:?}");
    let after_spend = meta_ttl("b");
    assert!(
        (745_000..=750_000).contains(&after_spend),
        "{after_spend} ms"
    );
    assert_eq!(limiter.sync("b", 0, 0, None).await.expect("sync"), 99);
    let after_sync = meta_ttl("b");
    assert!(
        (745_000..=after_spend).contains(&after_sync),
        "a sync whose level drains before the keys expire keeps their TTL: {after_sync} ms"
    );

    // A sync onto a bucket with no spend: nothing but the level is live,
    // and the counters keep it until it has drained (600 s, 1 s of slack).
    assert_eq!(limiter.sync("s", 0, 0, None).await.expect("sync"), 100);
    let level_only = meta_ttl("s");
    assert!(
        (599_000..=601_000).contains(&level_only),
        "the counters expire with the level: {level_only} ms"
    );
    let u = limiter.peek("s").await.expect("peek");
    assert_eq!((u.windows[0].used, u.windows[0].drift), (100, 100), "{u:?}");

    // 1 min: a spend's keys live 75 s. 16 s on, a sync that fills the
    // level drains 61 s from then, after the TTL the spend set (59 s left,
    // less if the sleep runs long): the counters' TTL moves to the level's.
    let d = limiter
        .spend("f", None, &request_id())
        .await
        .expect("spend");
    assert!(d.is_allowed(), "{d:?}");
    tokio::time::sleep(Duration::from_secs(16)).await;
    assert_eq!(limiter.sync("t", 0, 0, None).await.expect("sync"), 100);
    let moved = meta_ttl("t");
    assert!(
        (60_000..=61_000).contains(&moved),
        "the counters outlive the level (61 s), not the spend's TTL: {moved} ms"
    );
}

/// The spend history's ring renews its TTL when a new slot begins (the
/// script skips the PEXPIRE for the other writes of a slot): a ring written
/// slot after slot never expires under its writers. Run through the script
/// as another language calls it, with 1 s slots and a 4 s TTL so the test
/// sees a slot go by.
#[test]
fn the_history_ring_renews_its_ttl_when_a_new_slot_begins() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let script = redis::Script::new(quota_worker::quota::SCRIPT);
    let ring = "{h}:ring";
    let keys = [
        "{h}:blocked",
        "{h}:clock",
        "{h}:w:meta",
        "{h}:w:log",
        "{h}:w:ts",
        "{h}:w:adj",
        ring,
    ];
    let mut spend = || {
        let r: Vec<i64> = script
            .key(&keys[..])
            .arg("spend")
            .arg(request_id())
            .arg(1)
            .arg(0)
            .arg(1)
            .arg("sliding:1000:60000")
            .arg(1) // one ring, 1 s slots, 3 slots, a 4 s TTL
            .arg(1_000)
            .arg(3)
            .arg(4_000)
            .invoke(&mut conn)
            .expect("spend");
        assert_eq!(r[0], 1, "admitted: {r:?}");
    };

    spend();
    let first: i64 = server.cmd(&["PTTL", ring]);
    assert!((3_000..=4_000).contains(&first), "{first} ms");
    // 1.2 s on the spend lands in a later slot: the TTL starts again, where
    // without the renewal it would be down to under 2.8 s.
    std::thread::sleep(Duration::from_millis(1_200));
    spend();
    let renewed: i64 = server.cmd(&["PTTL", ring]);
    assert!(
        renewed >= 3_000,
        "the ring's TTL was not renewed when its newest slot changed: {renewed} ms (first {first} ms)"
    );
}
