//! Promise: a spend stays correct however many entries a window holds. After
//! an idle gap, 100k expired entries are evicted (in batches: Lua's `unpack`
//! limit of ~8,000 values is the trap) and the used counter stays exact, both
//! when the whole window has expired and when some entries are still live;
//! a window holding 200k live entries answers exactly, and its rejection
//! reads only the entries it needs.
//!
//! Entries are written straight into the script's layout (a zset of request
//! id -> spend time in µs, a hash of request id -> units plus "#used"), next
//! to one written by a real spend, because spending 100k times in a short
//! window could not leave 100k entries to expire at once.

use quota_worker::config::Config;
use quota_worker::quota::{Decision, RejectedBy, Rejection};

use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(Window::sliding(200_000, "5s")))
        .credential(Credential::env("big", "B").window(Window::sliding(1_000_000, "1h")))
        .endpoint(Endpoint::new("k", "k", 1))
        .endpoint(Endpoint::new("big", "big", 1))
        .write()
}

/// Writes `n` entries `{prefix}{i:07}` of `cost` units into a sliding
/// window's log and unit hash, entry `i` spent at `start + i / group * step`
/// µs, and adds them to its "#used" counter. Done by a Lua loop in Redis:
/// encoding 100k members in a debug build is slower than the windows here.
fn seed(
    server: &RedisServer,
    base: &str,
    prefix: &str,
    n: usize,
    cost: u64,
    at: (i64, i64, usize),
) {
    const SEED: &str = r"
        local log, units = KEYS[1], KEYS[2]
        local prefix, n, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
        local start, step, group = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
        local z, h = {}, {}
        for i = 0, n - 1 do
          local id = string.format('%s%07d', prefix, i)
          z[#z + 1], z[#z + 2] = start + math.floor(i / group) * step, id
          h[#h + 1], h[#h + 2] = id, cost
          if #z >= 1000 or i == n - 1 then
            redis.call('ZADD', log, unpack(z))
            redis.call('HSET', units, unpack(h))
            z, h = {}, {}
          end
        end
        redis.call('HINCRBY', units, '#used', n * cost)
        redis.call('PEXPIRE', log, 3600000)
        redis.call('PEXPIRE', units, 3600000)
        return n";
    let (start, step, group) = at;
    let written: i64 = redis::cmd("EVAL")
        .arg(SEED)
        .arg(2)
        .arg(format!("{base}:log"))
        .arg(format!("{base}:units"))
        .arg(prefix)
        .arg(n)
        .arg(cost)
        .arg(start)
        .arg(step)
        .arg(group)
        .query(&mut server.conn())
        .expect("seed");
    assert_eq!(written, n as i64);
}

fn zcard(server: &RedisServer, key: &str) -> i64 {
    server.cmd(&["ZCARD", key])
}

fn rejected(d: Decision) -> Rejection {
    match d {
        Decision::Rejected(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wholly_expired_window_of_100k_entries_is_dropped_and_counts_right() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    let base = "qw:{k}:cred:s5000";

    let idle_since = server.time_us() - 20_000_000;
    seed(&server, base, "old-", 100_000, 1, (idle_since, 1, 1));
    assert_eq!(zcard(&server, &format!("{base}:log")), 100_000);

    let d = limiter
        .spend("k", None, "after-the-gap")
        .await
        .expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 199_999 });
    let w = &limiter.peek("k").await.expect("peek").windows[0];
    assert_eq!((w.used, w.remaining), (1, 199_999));
    assert_eq!(zcard(&server, &format!("{base}:log")), 1);
    let fields: i64 = server.cmd(&["HLEN", &format!("{base}:units")]);
    assert_eq!(fields, 3, "the new entry, #used and #expires");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partly_expired_100k_entries_are_evicted_in_batches_and_count_right() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    let base = "qw:{k}:cred:s5000";

    // A real spend first: its entry stays live and fixes the layout. Then
    // 100k expired entries, a hundred to each spend time (ties are ordered
    // by id), and three more live ones.
    let d = limiter.spend("k", Some(4), "real").await.expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 199_996 });
    let real: f64 = server.cmd(&["ZSCORE", &format!("{base}:log"), "real"]);
    let now = server.time_us();
    assert!(
        (now - 1_000_000..=now).contains(&(real as i64)),
        "spend times are Redis µs"
    );
    let idle_since = now - 20_000_000;
    seed(&server, base, "old-", 100_000, 1, (idle_since, 1, 100));
    seed(&server, base, "live-", 3, 5, (now - 300_000, 0, 1));
    assert_eq!(zcard(&server, &format!("{base}:log")), 100_004);
    assert!(server.time_us() < now + 3_000_000, "seeding took too long");
    let tie: Vec<String> = server.cmd(&[
        "ZRANGEBYSCORE",
        &format!("{base}:log"),
        "-inf",
        &idle_since.to_string(),
    ]);
    assert_eq!(
        tie.len(),
        100,
        "a hundred entries share each expired spend time"
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
    assert_eq!(zcard(&server, &format!("{base}:log")), 5);
    let fields: i64 = server.cmd(&["HLEN", &format!("{base}:units")]);
    assert_eq!(fields, 7, "five live entries, #used and #expires");
    let old: i64 = server.cmd(&["HEXISTS", &format!("{base}:units"), "old-0099999"]);
    assert_eq!(old, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_200k_live_entries_answers_exactly() {
    let _machine = machine::heavy();
    let server = RedisServer::start();
    let cfg = config();
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    let base = "qw:{big}:cred:s3600000";
    let per = 3_600_000_000i64;

    // ~200k entries of 5 units, 5 ms apart, the oldest 30 minutes old:
    // 999,950 of the 1M units used.
    let now = server.time_us();
    let oldest = now - 1_800_000_000;
    let at = |i: usize| oldest + i as i64 * 5_000;
    seed(&server, base, "e-", 199_990, 5, (oldest, 5_000, 1));

    let d = limiter.spend("big", Some(1), "fits").await.expect("spend");
    assert_eq!(d, Decision::Allowed { remaining: 49 });
    let w = &limiter.peek("big").await.expect("peek").windows[0];
    assert_eq!((w.used, w.remaining), (999_951, 49));

    // A cost needing n units freed waits for the entry that frees the n-th
    // (oldest first, 5 units each), not for the oldest, nor the whole scan.
    for (cost, nth) in [(50, 0), (54, 0), (55, 1), (61, 2), (1_000, 190)] {
        let t0 = server.time_us();
        let r = rejected(limiter.spend("big", Some(cost), "x").await.expect("spend"));
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
        zcard(&server, &format!("{base}:log")),
        199_991,
        "rejections record nothing"
    );
}
