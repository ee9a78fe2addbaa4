//! Promise (SPEC Part 2 "Fairness", issue 13 item 3): when each tick's
//! tasks cannot all be served, the items served first rotate from tick to
//! tick, starting with the ones starved last time, so no item starves tick
//! after tick; every outcome line says how many ticks in a row its item was
//! starved (`starved_ticks`); `check` shows each item's share of ticks.
//! Checked on the real binary (`run --log-format json`, `trigger --wait`,
//! `check`), a real Redis and the simulator.

use std::collections::BTreeMap;
use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::keys::KeySpace;
use serde_json::Value;
use simulator::Simulator;

use crate::support::rig::Rig;
use crate::support::world;
use crate::support::{
    ConfigBuilder, Job, RedisServer, Sink, TestConfig, Window, limiter, stderr, stdout,
};

const ITEMS: [&str; 5] = ["A", "B", "C", "D", "E"];

/// Five one-page items, one task at a time, against a window of 2 units:
/// each tick serves two items and starves three.
fn config(redis: &str, sim: &str) -> TestConfig {
    ConfigBuilder::new()
        .redis_url(redis)
        .worker(world::quick_worker(1))
        .credential(world::credential(Window::sliding(2, "4s")))
        .endpoint(world::endpoint())
        .job(
            Job::videos("rot", world::ENDPOINT, sim)
                .fan_out("region", ITEMS)
                .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
        )
        .write()
}

/// Per tick, in order: item -> (outcome, starved_ticks).
type Ticks = Vec<BTreeMap<String, (String, Option<u64>)>>;

fn by_tick(outcomes: &[Value]) -> Ticks {
    let mut ticks: BTreeMap<i64, BTreeMap<String, (String, Option<u64>)>> = BTreeMap::new();
    for o in outcomes {
        let tick = o["tick"].as_i64().unwrap_or_else(|| panic!("{o}"));
        let item = o["item"].as_str().unwrap_or_else(|| panic!("{o}"));
        let item = item.strip_prefix("region=").unwrap_or(item).to_owned();
        let kind = o["outcome"].as_str().unwrap_or_default().to_owned();
        ticks
            .entry(tick)
            .or_default()
            .insert(item, (kind, o["starved_ticks"].as_u64()));
    }
    ticks.into_values().collect()
}

/// `(served, starved)` as `"AB"`-style strings, starved with their counts.
fn expect(
    served: &[(&str, u64)],
    starved: &[(&str, u64)],
) -> BTreeMap<String, (String, Option<u64>)> {
    let done = served.iter().map(|(i, n)| (i, "done", n));
    let no = starved.iter().map(|(i, n)| (i, "quota_exhausted", n));
    done.chain(no)
        .map(|(i, k, n)| (i.to_string(), (k.to_owned(), Some(*n))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_ticks_that_run_out_part_way_serve_every_item_and_count_starved_ticks() {
    let redis = RedisServer::start();
    let sim = Simulator::start(world::sim(1, 1)).await.expect("simulator");
    let cfg = config(&redis.url(), &sim.base_url());
    let config = Config::load_with_env(&cfg.path(), &|_| None).expect("config");
    let limiter = limiter(&redis, &config).await;

    // check: 5 units of worst case per 4 s against 2: 2 of 5 items fit a
    // tick, so each item is served on 40% of ticks, in rotation.
    let out = tokio::task::block_in_place(|| cfg.run(&["check"], &[]));
    assert_eq!(out.status.code(), Some(0), "check: {}", stderr(&out));
    let report = stdout(&out);
    assert!(
        report.contains(
            "job rot: 2 of 5 item(s) fit per tick at worst: each item's share is 40% of ticks (served at least once every 3 ticks)"
        ),
        "{report}"
    );
    for item in ITEMS {
        assert!(
            report.contains(&format!("    item region={item}: 40% of ticks\n")),
            "{report}"
        );
    }

    let mut rig = tokio::task::block_in_place(|| Rig::start(redis, cfg, &[]));
    for n in 1..=5 {
        // Each tick starts on an empty window (the last tick's 2 units have
        // slid out of it) and runs it out after two items.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        while limiter.peek(world::CREDENTIAL).await.expect("peek").windows[0].used > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the window did not empty before tick {n}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (_, t) = tokio::task::block_in_place(|| rig.tick("rot", 5));
        assert_eq!(t.code, Some(75), "tick {n}: {t:#?}");
    }
    let daemon = &mut rig.daemon;
    let ticks = by_tick(&daemon.outcomes());
    daemon.term();
    assert_eq!(
        daemon
            .wait_exit(Duration::from_secs(15))
            .and_then(|s| s.code()),
        Some(0)
    );

    // Every item served at least once over the five ticks (on main, A and
    // B were served every time and C, D, E never).
    let mut served: BTreeMap<String, u32> = BTreeMap::new();
    for t in &ticks {
        for (item, (kind, _)) in t {
            if kind == "done" {
                *served.entry(item.clone()).or_default() += 1;
            }
        }
    }
    assert_eq!(
        served.keys().cloned().collect::<Vec<_>>(),
        ITEMS.map(String::from),
        "items served over five ticks: {ticks:#?}"
    );
    // Each tick starts where the last one first ran out: A B | C D | E A |
    // B C | D E; starved_ticks counts the ticks in a row an item was
    // starved (on a served task: the run it ends).
    let want = vec![
        expect(&[("A", 0), ("B", 0)], &[("C", 1), ("D", 1), ("E", 1)]),
        expect(&[("C", 1), ("D", 1)], &[("E", 2), ("A", 1), ("B", 1)]),
        expect(&[("E", 2), ("A", 1)], &[("B", 2), ("C", 1), ("D", 1)]),
        expect(&[("B", 2), ("C", 1)], &[("D", 2), ("E", 1), ("A", 1)]),
        expect(&[("D", 2), ("E", 1)], &[("A", 2), ("B", 1), ("C", 1)]),
    ];
    assert_eq!(ticks, want);
    // The upstream saw exactly the served pages: two per tick.
    assert_eq!(sim.stats().charges.len(), 10);

    // The status page's read: the items starved now, most starved first.
    let client = redis::Client::open(rig.redis.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let starved = quota_worker::schedule::starved_items(&mut conn, &KeySpace::new("qw"), "rot", 10)
        .await
        .expect("starved items");
    assert_eq!(starved.total, 3);
    assert_eq!(
        starved.items,
        vec![
            ("region=A".to_owned(), 2),
            ("region=B".to_owned(), 1),
            ("region=C".to_owned(), 1)
        ]
    );
    sim.shutdown().await;
}
