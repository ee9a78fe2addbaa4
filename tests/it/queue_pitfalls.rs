//! Regression tests for the apalis-redis 1.0 pitfalls not pinned elsewhere
//! (see `../shared/notes/apalis-1.0.md` and docs/queue.md "The queue, and
//! apalis-redis"): finished tasks are trimmed without touching waiting ones
//! (5), a worker keeps its heartbeat while a long task holds every slot (9),
//! a task id pushed twice runs once (3), every apalis key lives under our
//! explicit queue name (12), and an idle worker whose fetch outlasted the
//! poll interval still wakes on the next one (13).

use std::time::{Duration, Instant};

use quota_worker::queue::{Origin, RETENTION, TaskArgs};
use simulator::{Fault, SimConfig};

use crate::support::keys::{self, apalis};
use crate::support::machine;
use crate::support::pipeline::{Pipeline, kinds};
use crate::support::world;
use crate::support::{self, ConfigBuilder, Job, Sink, Window, Worker};

/// Every task's metadata hash in apalis.
fn meta_pattern() -> String {
    format!("{}:*", apalis().job_meta_hash())
}

/// The job `j` over `regions`, one page of two records each.
async fn start(worker: Worker, regions: &[&str]) -> Pipeline {
    let sim = SimConfig {
        pages_per_query: 1,
        items_per_page: 2,
        ..SimConfig::default()
    }
    .key(world::SECRET, 100_000, Duration::from_secs(3600));
    Pipeline::start(sim, |sim| {
        ConfigBuilder::new()
            .worker(worker)
            .credential(world::credential(Window::sliding(100_000, "1h")))
            .endpoint(world::endpoint().timeout("20s"))
            .job(
                Job::videos("j", world::ENDPOINT, sim)
                    .fan_out("region", regions.iter().copied())
                    .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
            )
    })
    .await
}

fn keys_like(pl: &Pipeline, pattern: &str) -> Vec<String> {
    pl.redis.keys(pattern)
}

/// apalis pitfall 5: done/dead sets, task data and metadata are never
/// trimmed, and apalis's `vacuum` also deletes tasks waiting to run. Our trim
/// drops finished tasks (data, metadata, set members) and leaves a task that
/// waits in the queue alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apalis_pitfall_5_trim_drops_finished_tasks_and_keeps_waiting_ones() {
    let mut pl = start(
        Worker::default().concurrency(4),
        &["US", "GB", "DE", "FR", "IN"],
    )
    .await;
    let tick = pl.trigger("j").await;
    let seen = pl.wait_tick("j", tick, 5, Duration::from_secs(20)).await;
    assert_eq!(kinds(&seen).get("done"), Some(&5), "{seen:?}");
    pl.stop().await;
    // apalis acks after our handler returns: give the last ack a moment.
    assert!(support::wait_until(Duration::from_secs(5), || {
        pl.redis.cmd::<i64>(&["SCARD", &apalis().done_jobs_set()]) == 5
    }));
    assert_eq!(keys_like(&pl, &meta_pattern()).len(), 5);

    // A task that waits in apalis (the daemon is stopped, so nobody takes it).
    let waiting = TaskArgs::first(
        "j",
        tick + 1,
        0,
        vec![("region".into(), "BR".into())],
        Origin::Trigger,
    );
    pl.queue
        .enqueue(&[(waiting.clone(), Duration::ZERO)])
        .await
        .expect("enqueue");
    assert_eq!(pl.queue.feed().await.expect("feed").moved, 1);

    // Within the retention nothing goes.
    let (dropped, _) = pl.queue.trim(RETENTION).await.expect("trim");
    assert_eq!(dropped, 0);
    assert_eq!(
        pl.redis.cmd::<i64>(&["SCARD", &apalis().done_jobs_set()]),
        5
    );

    // Past it (retention 0, and a second for done_at's whole seconds), the
    // finished tasks go in full passes; the waiting one stays.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut total = 0;
    for _ in 0..10 {
        let (n, wrapped) = pl.queue.trim(Duration::ZERO).await.expect("trim");
        total += n;
        if wrapped {
            break;
        }
    }
    assert_eq!(total, 5);
    assert_eq!(
        pl.redis.cmd::<i64>(&["SCARD", &apalis().done_jobs_set()]),
        0
    );
    assert!(
        keys_like(&pl, &meta_pattern())
            .iter()
            .all(|k| k.ends_with(&waiting.id))
    );
    let data: Vec<String> = pl.redis.cmd(&["HKEYS", &apalis().job_data_hash()]);
    assert_eq!(
        data,
        vec![waiting.id.clone()],
        "only the waiting task's data is left"
    );
    let active: Vec<String> = pl
        .redis
        .cmd(&["LRANGE", &apalis().active_jobs_list(), "0", "-1"]);
    let scheduled: Vec<String> =
        pl.redis
            .cmd(&["ZRANGE", &apalis().scheduled_jobs_set(), "0", "-1"]);
    assert!(
        active.contains(&waiting.id) || scheduled.contains(&waiting.id),
        "the waiting task is still queued: active {active:?} scheduled {scheduled:?}"
    );
}

/// apalis pitfall 9: a worker that fetched tasks it cannot start yet stops
/// heartbeating, so a long task looks orphaned and runs twice. With one task
/// per fetch, a worker whose only slot is busy for longer than three
/// heartbeats keeps beating, and the other task waits in the queue and runs
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apalis_pitfall_9_heartbeats_go_on_while_every_slot_is_busy() {
    let _machine = machine::timing();
    // recover_after 3 s: a heartbeat every 0.6 s, dead after 1.8 s of silence.
    let pl = start(
        Worker::default().concurrency(1).recover_after("3s"),
        &["US", "GB"],
    )
    .await;
    pl.sim.inject(Fault::Delay(Duration::from_secs(4)), 2);
    let started = Instant::now();
    let tick = pl.trigger("j").await;

    let score = |pl: &Pipeline| -> Vec<(String, f64)> {
        pl.redis
            .cmd(&["ZRANGE", &apalis().workers_set(), "0", "-1", "WITHSCORES"])
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let early = score(&pl);
    // Mid-way through the first 4 s request: one task held, one waiting.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let late = score(&pl);
    assert_eq!(early.len(), 1, "one worker registered: {early:?}");
    assert_eq!(
        late.len(),
        1,
        "the worker was never declared dead: {late:?}"
    );
    assert!(
        late[0].1 > early[0].1,
        "the heartbeat went on while the slot was busy: {early:?} then {late:?}"
    );
    let queued: i64 = pl.redis.cmd(&["LLEN", &apalis().active_jobs_list()]);
    assert_eq!(
        queued, 1,
        "the second task waits in the queue, not in the busy worker"
    );

    let seen = pl.wait_tick("j", tick, 2, Duration::from_secs(20)).await;
    assert_eq!(kinds(&seen).get("done"), Some(&2), "{seen:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(8),
        "one slot: the two 4 s requests ran one after the other"
    );
    // Delayed answers are not charged by the simulator, but counted: two
    // requests in all, so no task ran twice.
    let stats = pl.sim_stats();
    assert_eq!(
        stats.key(world::SECRET).injected,
        2,
        "{:?}",
        stats.key(world::SECRET)
    );
    assert_eq!(
        pl.sink_records().len(),
        4,
        "2 items x 2 records, each written once"
    );
}

/// apalis pitfall 3: idempotency keys are off unless configured. We do not
/// rely on them: a task id pushed twice (a re-fanned tick, a feeder that
/// died mid-push) is kept once, by our backlog and by apalis's HSETNX.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apalis_pitfall_3_a_task_id_pushed_twice_runs_once() {
    let pl = start(Worker::default().concurrency(2), &["US"]).await;
    let task = TaskArgs::first(
        "j",
        1_000,
        0,
        vec![("region".into(), "US".into())],
        Origin::Trigger,
    );
    let added = pl
        .queue
        .enqueue(&[
            (task.clone(), Duration::ZERO),
            (task.clone(), Duration::ZERO),
        ])
        .await
        .expect("enqueue");
    assert_eq!(added, 1, "one call keeps a task id once");
    // Pushed again at once: while the first copy waits in the backlog, the
    // backlog keeps it once (0); the idle daemon's feeder, woken by the
    // first push, may already have moved it into apalis (1), whose HSETNX
    // then drops the copy when it is fed. Either way it runs once (below).
    let again = pl
        .queue
        .enqueue(&[(task.clone(), Duration::ZERO)])
        .await
        .expect("enqueue");
    assert!(again <= 1, "{again}");
    let seen = pl.wait_tick("j", 1_000, 1, Duration::from_secs(10)).await;
    assert_eq!(seen.len(), 1);
    // Pushed again after it ran: the done marker keeps it from running twice.
    pl.queue
        .enqueue(&[(task, Duration::ZERO)])
        .await
        .expect("enqueue");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(pl.of_tick("j", 1_000).len(), 1, "ran once");
    assert_eq!(pl.sim_stats().charges.len(), 1, "fetched once");
}

/// apalis pitfall 12: the default queue name is a Rust type name. Every key
/// apalis writes for us sits under `<prefix>:queue:`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apalis_pitfall_12_queue_keys_use_the_explicit_name() {
    let pl = start(Worker::default().concurrency(2), &["US", "GB"]).await;
    let tick = pl.trigger("j").await;
    pl.wait_tick("j", tick, 2, Duration::from_secs(20)).await;
    let all = keys_like(&pl, "*");
    let queue = format!("{}:", keys::keys().queue());
    assert!(all.iter().any(|k| k.starts_with(&queue)), "{all:?}");
    let ours = format!("{}:", keys::PREFIX);
    let foreign: Vec<&String> = all
        .iter()
        .filter(|k| !k.starts_with(&ours) && k.as_str() != "core:apalis:queues:list")
        .collect();
    assert!(foreign.is_empty(), "keys outside the prefix: {foreign:?}");
    assert!(
        !all.iter()
            .any(|k| k.contains("TaskArgs") || k.contains("::")),
        "{all:?}"
    );
}

/// apalis pitfall 13: apalis-core 1.0's `IntervalStrategy` replaces a fired
/// timer without polling the new one, so when an idle worker's fetch takes
/// longer than `poll_interval` and comes back empty, nothing wakes the worker
/// until its next heartbeat (`recover_after` ÷ 5, 6 s by default): a task
/// queued meanwhile waits that long. Found by the end-to-end benchmark (one
/// 2,000-task fan-out in ten started 6.00 s late). `CLIENT PAUSE` holds the
/// fetch in flight past the interval. Since issue 28 nothing polls: the
/// daemon wakes its worker when tasks arrive, and a fetch that comes back
/// after a newer wake-up wakes the worker again (`queue::wake::Tapped`), so
/// the task still starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apalis_pitfall_13_a_slow_empty_fetch_does_not_put_the_worker_to_sleep() {
    let _machine = machine::timing();
    let mut pl = start(
        Worker::default()
            .concurrency(2)
            .poll_interval("10ms")
            .recover_after("30s"),
        &["US"],
    )
    .await;
    // Warm: the worker is registered and idle.
    let tick = pl.trigger("j").await;
    let seen = pl.wait_tick("j", tick, 1, Duration::from_secs(10)).await;
    assert_eq!(kinds(&seen).get("done"), Some(&1), "{seen:?}");

    let mut late = Vec::new();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Hold every client's next command 50 ms: the idle worker's fetch
        // (one every 10 ms) outlasts its poll interval and returns empty.
        let _: String = pl.redis.cmd(&["CLIENT", "PAUSE", "50", "ALL"]);
        tokio::time::sleep(Duration::from_millis(80)).await;
        let started = Instant::now();
        let tick = pl.trigger("j").await;
        let seen = pl.wait_tick("j", tick, 1, Duration::from_secs(10)).await;
        assert_eq!(kinds(&seen).get("done"), Some(&1), "{seen:?}");
        late.push(started.elapsed());
    }
    pl.stop().await;
    let worst = late.iter().max().expect("five rounds");
    assert!(
        *worst < Duration::from_secs(3),
        "a task waited for the worker's heartbeat after a slow empty fetch: {late:?}"
    );
}
