//! Section `tasks`: Redis commands and Redis CPU per one-page task,
//! BENCHMARKS.md §12's method (`INFO commandstats`, scripts' inner commands
//! included, and `used_cpu` ÷ tasks over a 2,000-task tick; the daemon in
//! this process, concurrency 8, no quota in the way), with and without
//! `queue_replicas = quota_replicas = 1` (a replica started beside the
//! master). Run on a commit from before issue 36 (this file and `main.rs`
//! copied there) it gives the "before" of BENCHMARKS.md §17.

use std::time::Duration;

use crate::support::pipeline::Pipeline;
use crate::support::{ConfigBuilder, Job, RedisServer, Sink, Worker, world};

/// One round's numbers.
pub struct PerTask {
    pub commands: f64,
    pub redis_cpu_us: f64,
}

/// One tick of `tasks` one-page items run to their end; with `replicas`,
/// the queue's writes and the spends wait for a replica's acknowledgement.
pub async fn round(tasks: usize, replicas: u8) -> PerTask {
    let regions: Vec<String> = (0..tasks).map(|i| format!("r{i:05}")).collect();
    let mut p = Pipeline::start(world::sim(1, 1), |base| {
        let b = ConfigBuilder::new()
            .worker(Worker::default().concurrency(8))
            .credential(world::credential(world::wide()))
            .endpoint(world::endpoint())
            .job(
                Job::videos("big", world::ENDPOINT, base)
                    .fan_out("region", regions)
                    .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
            );
        match replicas {
            0 => b,
            n => b.queue_replicas(i64::from(n)).quota_replicas(i64::from(n)),
        }
    })
    .await;
    let _replica = (replicas > 0).then(|| {
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &p.redis.port().to_string()])
    });
    // The daemon's start (and the replica's sync) out of the count.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _: String = p.redis.cmd(&["CONFIG", "RESETSTAT"]);
    let cpu0 = crate::redis_cpu_us(&p.redis);
    let tick = p.trigger("big").await;
    let seen = p
        .wait_tick("big", tick, tasks, Duration::from_secs(600))
        .await;
    let (commands, _) = p.redis.command_calls();
    let cpu = crate::redis_cpu_us(&p.redis) - cpu0;
    let ended = seen.iter().filter(|s| s.terminal()).count();
    assert_eq!(ended, tasks, "every task of the tick ended");
    p.stop().await;
    PerTask {
        commands: commands as f64 / tasks as f64,
        redis_cpu_us: cpu / tasks as f64,
    }
}

/// `rounds` rounds each way, printed as they come.
pub async fn section(quick: bool) {
    let (rounds, tasks) = if quick { (1, 50) } else { (3, 2_000) };
    println!(
        "\ntasks: {rounds} rounds of a {tasks}-task tick each way (one-page tasks, concurrency 8)"
    );
    println!("| replicas | round | commands per task | Redis CPU µs per task |");
    println!("|---|---:|---:|---:|");
    for round_no in 1..=rounds {
        for replicas in [0, 1] {
            let r = round(tasks, replicas).await;
            println!(
                "| {replicas} | {round_no} | {:.2} | {:.0} |",
                r.commands, r.redis_cpu_us
            );
        }
    }
}
