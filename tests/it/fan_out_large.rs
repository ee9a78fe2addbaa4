//! Promise: a huge fan-out is queued in bounded chunks, each one short Redis
//! call that is idempotent under the tick's claim, so an enqueuer killed
//! part-way loses nothing and queues nothing twice: `trigger` run again
//! resumes its tick where it stopped, and a daemon finishes a cron tick
//! whose enqueuer died. Every item ends up queued exactly once.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use quota_worker::outcome::OutcomeKind;
use quota_worker::queue::{Chunk, FAN_OUT_CHUNK, FEED_CAP, Origin, TickFanOut};

use crate::support::keys::{any_tick, apalis, keys};
use crate::support::machine;
use crate::support::pipeline::{Pipeline, kinds};
use crate::support::process::{Proc, run_cli};
use crate::support::redis_server::redis_conn;
use crate::support::world;
use crate::support::{self, ConfigBuilder, Job, RedisServer, Request, Sink, Worker};

/// Rows × langs: 200,000 tasks (max_items is 100,000 by default).
const ROWS: usize = 100_000;
const TASKS: usize = 2 * ROWS;

/// `big`: 100,000 CSV rows x 2 langs, never fired by itself; nothing runs it.
fn big_config() -> ConfigBuilder {
    let mut from = toml::map::Map::new();
    from.insert("csv".into(), toml::Value::String("rows.csv".into()));
    ConfigBuilder::new()
        .credential(world::credential(world::wide()))
        .endpoint(world::endpoint())
        .job(
            Job::new("big", world::ENDPOINT)
                .request(
                    Request::get("http://127.0.0.1:9/videos")
                        .query(&[("id", "{channel}"), ("hl", "{lang}")]),
                )
                .fan_out("lang", ["en", "de"])
                .set("fan_out_from", toml::Value::Table(from))
                .sink(Sink::jsonl("out/{job}.jsonl")),
        )
}

fn hget(conn: &mut redis::Connection, key: &str, field: &str) -> Option<u64> {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query(conn)
        .expect("HGET")
}

/// A `trigger` of 200,000 tasks SIGKILLed part-way, then run again: the
/// second run resumes the same tick at the task where the first stopped,
/// and every task id of the tick is queued exactly once (no second tick).
#[test]
fn a_large_trigger_killed_part_way_is_resumed_by_running_it_again() {
    let _machine = machine::heavy();
    let redis = RedisServer::start();
    let cfg = big_config().write();
    let mut csv = String::from("channel\n");
    for i in 0..ROWS {
        csv.push_str(&format!("UC{i:06}\n"));
    }
    std::fs::write(cfg.join("rows.csv"), csv).expect("csv");
    let mut conn = redis_conn(&redis.url());

    let t0 = Instant::now();
    let url = redis.url();
    let mut first = Proc::start(
        "trigger-1",
        &cfg,
        &["trigger", "big"],
        &[("QUOTA_WORKER_REDIS_URL", &url)],
    );
    // Kill it once some chunks, not all, are queued.
    let mut progress = None;
    let killed = support::wait_until(Duration::from_secs(120), || {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(any_tick(|t| keys().tick_fan_out("big", t)))
            .query(&mut conn)
            .expect("KEYS");
        progress = keys.first().and_then(|k| hget(&mut conn, k, "next"));
        progress.is_some_and(|n| n >= 10_000)
    });
    assert!(killed, "never saw progress; {}", first.log());
    first.kill();
    let queued: u64 = redis::cmd("ZCARD")
        .arg(keys().backlog())
        .query(&mut conn)
        .expect("ZCARD");
    println!(
        "killed after {:?} at {queued} of {TASKS} queued",
        t0.elapsed()
    );
    assert!(queued > 0 && queued < TASKS as u64, "{queued}");
    let claims: Vec<String> = redis::cmd("KEYS")
        .arg(any_tick(|t| keys().tick_claim("big", t)))
        .query(&mut conn)
        .expect("KEYS");
    let of_big = any_tick(|t| keys().tick_claim("big", t)).replace('*', "");
    let tick: i64 = claims
        .iter()
        .find_map(|k| k.strip_prefix(&of_big)?.parse().ok())
        .expect("the claimed tick");

    // Run it again: it waits for the dead one's lease, then goes on.
    let t1 = Instant::now();
    let (code, out, err) = run_cli(
        &cfg,
        Some(&redis.url()),
        &["trigger", "big"],
        Duration::from_secs(180),
    );
    println!("re-run took {:?}: {out}{err}", t1.elapsed());
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains(&format!("resumed tick {tick} of job big at task ")),
        "{out}"
    );
    assert!(out.contains(&format!("{TASKS} task(s) in all")), "{out}");

    // Exactly one tick, every task id of it once, nothing in progress.
    let claims: Vec<String> = redis::cmd("KEYS")
        .arg(any_tick(|t| keys().tick_claim("big", t)))
        .query(&mut conn)
        .expect("KEYS");
    let ticks: BTreeSet<&str> = claims
        .iter()
        .filter_map(|k| k.strip_prefix(&of_big)?.split(':').next())
        .collect();
    assert_eq!(ticks.len(), 1, "{claims:?}");
    assert!(
        !claims.iter().any(|k| k.ends_with(":fan_out")),
        "{claims:?}"
    );
    // Queued: in the backlog, or (the first FEED_CAP, due at once and
    // nothing running them) straight in apalis's active list.
    let mut ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys().backlog())
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("ZRANGE");
    let in_apalis: Vec<String> = redis::cmd("LRANGE")
        .arg(apalis().active_jobs_list())
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("LRANGE");
    assert!(in_apalis.len() <= FEED_CAP, "{}", in_apalis.len());
    ids.extend(in_apalis);
    let prefix = format!("big:{tick}:");
    let mut indexes: Vec<usize> = ids
        .iter()
        .map(|id| {
            id.strip_prefix(&prefix)
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("task {id} is not of tick {tick}"))
        })
        .collect();
    indexes.sort_unstable();
    assert_eq!(indexes.len(), TASKS);
    assert!(
        indexes.iter().enumerate().all(|(n, i)| n == *i),
        "a task is missing or doubled"
    );
    let hlen = |conn: &mut redis::Connection, key: String| -> u64 {
        redis::cmd("HLEN").arg(key).query(conn).expect("HLEN")
    };
    let data = hlen(&mut conn, keys().backlog_data()) + hlen(&mut conn, apalis().job_data_hash());
    assert_eq!(data, TASKS as u64);
    assert_eq!(
        hget(&mut conn, &keys().tick_outcomes("big", tick), "#items"),
        Some(TASKS as u64)
    );
    // Items follow their index: row i / 2, lang i % 2 (the last list fastest).
    for i in [0usize, 1, queued as usize, TASKS - 1] {
        // Ids name their position, zero-padded (docs/jobs.md "Fairness");
        // the first tick starts at item 0.
        let id = format!("{prefix}{i:06}");
        let payload: String = [keys().backlog_data(), apalis().job_data_hash()]
            .iter()
            .find_map(|hash| {
                redis::cmd("HGET")
                    .arg(hash)
                    .arg(&id)
                    .query::<Option<String>>(&mut conn)
                    .expect("HGET payload")
            })
            .unwrap_or_else(|| panic!("no payload for {id}"));
        let task: serde_json::Value = serde_json::from_str(&payload).expect("payload");
        let lang = ["en", "de"][i % 2];
        assert_eq!(
            task["item"],
            serde_json::json!([["channel", format!("UC{:06}", i / 2)], ["lang", lang]]),
            "task {i}"
        );
    }
    let fanning: u64 = redis::cmd("ZCARD")
        .arg(keys().fanning())
        .query(&mut conn)
        .expect("ZCARD");
    assert_eq!(fanning, 0);
}

/// A cron tick's enqueuer dies after its first chunks (here: chunks queued
/// under another daemon's name, which never comes back). A live daemon
/// takes the rest over once the dead one's lease has run out, and every
/// item of the tick runs exactly once. A chunk sent twice (a lost reply)
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_daemon_finishes_a_tick_whose_enqueuer_died() {
    const N: usize = 2_000;
    let regions: Vec<String> = (0..N).map(|i| format!("r{i:04}")).collect();
    let mut p = Pipeline::start(world::sim(1, 1), |base| {
        let worker = Worker::default().concurrency(16).poll_interval("10ms");
        world::fan_out(base, worker, "big", regions)
    })
    .await;
    let tick = chrono::Utc::now().timestamp_millis();
    let tasks = quota_worker::schedule::tick_tasks(&p.config.jobs["big"], tick, Origin::Tick);
    assert_eq!(tasks.len(), N);
    let dead = TickFanOut {
        job: "big",
        tick,
        origin: Origin::Tick,
        who: "dead-host:1",
    };
    let chunk = |from: usize| -> Vec<(String, String)> {
        tasks[from..from + FAN_OUT_CHUNK]
            .iter()
            .map(|t| (t.id.clone(), serde_json::to_string(t).expect("json")))
            .collect()
    };
    assert_eq!(FAN_OUT_CHUNK, 200, "the numbers below assume chunks of 200");
    let first = p
        .queue
        .fan_out_chunk(&dead, 0, false, &chunk(0))
        .await
        .expect("chunk");
    assert_eq!(first, Chunk::Queued(FAN_OUT_CHUNK as u64));
    // Its reply was "lost": sent again, nothing changes.
    let again = p
        .queue
        .fan_out_chunk(&dead, 0, false, &chunk(0))
        .await
        .expect("chunk");
    assert_eq!(again, Chunk::Queued(FAN_OUT_CHUNK as u64));
    let second = p
        .queue
        .fan_out_chunk(&dead, FAN_OUT_CHUNK as u64, false, &chunk(FAN_OUT_CHUNK))
        .await
        .expect("chunk");
    assert_eq!(second, Chunk::Queued(2 * FAN_OUT_CHUNK as u64));
    // Another daemon's scheduler firing the same tick stands down.
    let other = TickFanOut {
        who: "other:2",
        ..dead
    };
    let lost = p
        .queue
        .fan_out_chunk(&other, 0, false, &chunk(0))
        .await
        .expect("chunk");
    assert!(
        matches!(
            lost,
            Chunk::Taken {
                queued: Some(400),
                ..
            }
        ),
        "{lost:?}"
    );

    // The dead one's lease (10 s) runs out; the daemon resumes within 5 s more.
    let evs = p.wait_tick("big", tick, N, Duration::from_secs(90)).await;
    assert_eq!(evs.len(), N, "{:?}", kinds(&evs));
    assert!(
        evs.iter().all(|s| s.kind() == OutcomeKind::Done),
        "{:?}",
        kinds(&evs)
    );
    let items: BTreeSet<&str> = evs.iter().map(|s| s.ev.item.as_str()).collect();
    assert_eq!(items.len(), N, "each item ran once");
    assert_eq!(
        p.sim_stats().charges.len(),
        N,
        "the upstream saw each item once"
    );
    let mut conn = redis_conn(&p.redis.url());
    assert_eq!(
        hget(&mut conn, &keys().tick_outcomes("big", tick), "#items"),
        Some(N as u64)
    );
    let fanning: u64 = redis::cmd("ZCARD")
        .arg(keys().fanning())
        .query(&mut conn)
        .expect("ZCARD");
    assert_eq!(fanning, 0);
    // The dead enqueuer, back, queues nothing more: it hears the tick is
    // complete.
    let late = p
        .queue
        .fan_out_chunk(
            &dead,
            2 * FAN_OUT_CHUNK as u64,
            false,
            &chunk(2 * FAN_OUT_CHUNK),
        )
        .await
        .expect("chunk");
    assert_eq!(late, Chunk::Complete(N as u64));
    let backlog_and_done = p.queue.depth().await.expect("depth");
    assert_eq!(backlog_and_done.backlog, 0, "{backlog_and_done:?}");
    p.stop().await;
}
