//! Section `e2e`: what the limiter costs end to end. Tasks per second
//! through the whole daemon — tick → fan-out → queue → spend → HTTP to the
//! simulated upstream (on loopback, answering at once) → jsonl sink — with
//! the spend step on, and with it switched off by the bench-only
//! test hook `daemon::Hooks::skip_spend`, at `concurrency` 8 and 32.
//!
//! Every run is a fresh daemon (`daemon::run`, in this process) on this
//! section's own `redis-server` (FLUSHALL between runs), a fresh simulator
//! and a fresh config dir. One job fans out N items of one page each, so
//! tasks = requests. Timing starts where the scheduler's tick starts (the
//! fan-out, then the claim and enqueue) and stops at the N-th `done`
//! outcome. A run counts only if the upstream saw exactly N requests, the
//! sink holds N lines, and Redis recorded N × cost units (0 with the spend
//! off). The sink syncs each page, so the pipeline is measured twice: with
//! its directory on the local disk (as deployed) and on tmpfs (no disk
//! wait, the limiter's share of the CPU-bound rest). Redis
//! `INFO commandstats` and the CPU time of Redis and of this process, per
//! task, say where the time goes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quota_worker::config::{Config, RedisUrl};
use quota_worker::conn::Conn;
use quota_worker::daemon::{Hooks, RunOptions, Shared};
use quota_worker::keys::KeySpace;
use quota_worker::outcome::OutcomeEvent;
use quota_worker::outcome::OutcomeKind;
use quota_worker::queue::{Origin, Queue};
use quota_worker::quota::{Limiter, Quotas};
use serde::Serialize;
use simulator::{SimConfig, Simulator};
use tokio::sync::{broadcast, oneshot};

use crate::Ctx;
use crate::common::{connect, flushall, info_field, median, min_max, reset_stats, thousands};
use crate::report::{Section, Target};
use crate::support::in_process::InProcess;
use crate::support::{
    ConfigBuilder, Credential, Endpoint, Job, RedisServer, Request, Sink, Window, Worker,
};

const CONCURRENCY: [usize; 2] = [8, 32];
/// The endpoint's cost: weighted, so a lost or doubled unit would show.
const COST: u64 = 3;
const JOB: &str = "e2e";
const CREDENTIAL: &str = "bench";
/// How often the workers and the feeder poll Redis when they find nothing
/// (the daemon's default is 200 ms). Short, so the run measures the work
/// and not the wait for the first poll after the tick.
const POLL: &str = "10ms";
/// A run with no task ended this long after the tick has stalled: the
/// first normally ends after 20–120 ms. This benchmark found apalis pitfall
/// 13 this way (one 2,000-task run in five to ten started one heartbeat,
/// 6.00 s, late: apalis's interval strategy lost its wake-up when a fetch
/// outlasted `poll_interval` behind the fan-out's script). `queue::wake`
/// fixes it (`tests/it/queue_pitfalls.rs`); should a stall come back, such a
/// run is cut short, counted in the report, and run again (at most 3 tries).
const STALL: Duration = Duration::from_secs(1);
/// The limiter's target: at most this share of end-to-end throughput.
const MAX_COST: f64 = 0.10;

/// Where the jsonl sink writes. The sink syncs every page to disk, and on
/// a disk that wait can bound the whole pipeline; on tmpfs it costs nothing,
/// which leaves the limiter's share of the remaining (CPU) work in view.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SinkDir {
    /// `disk` or `tmpfs`.
    pub(crate) name: &'static str,
    #[serde(skip)]
    pub(crate) base: PathBuf,
    /// The file system, from /proc/mounts (`ext4 on /`).
    pub(crate) fs: String,
}

/// What a pipeline run's job writes to: the jsonl file of section `e2e`,
/// or the SQLite or PostgreSQL sink of section `sinks` (a record per task,
/// keyed, as a real ingestion would).
#[derive(Debug, Clone)]
pub(crate) enum Store {
    Jsonl,
    Sqlite,
    /// A server and a role: `url` logs in with `password` (its file is
    /// written in the run's config dir).
    Postgres {
        url: String,
        password: String,
    },
}

impl Store {
    /// The job's sink.
    fn sink(&self, table: &str) -> Sink {
        match self {
            Store::Jsonl => Sink::jsonl("data/{job}.jsonl").records("/items"),
            Store::Sqlite => Sink::sqlite("data/{job}.sqlite")
                .records("/items")
                .key("/id"),
            Store::Postgres { url, .. } => Sink::postgres(url)
                .password_file("pg-password")
                .table(table)
                .records("/items")
                .key("/id"),
        }
    }

    /// The records the run's sink holds.
    async fn stored(&self, dir: &Path, table: &str) -> usize {
        match self {
            Store::Jsonl => std::fs::read_to_string(dir.join(format!("data/{JOB}.jsonl")))
                .expect("read the sink")
                .lines()
                .count(),
            Store::Sqlite => {
                let db = dir.join(format!("data/{JOB}.sqlite"));
                let n: i64 = rusqlite::Connection::open(db)
                    .and_then(|c| {
                        c.query_row(&format!("SELECT count(*) FROM \"{JOB}\""), [], |r| r.get(0))
                    })
                    .expect("count the sqlite rows");
                n as usize
            }
            Store::Postgres { url, password } => {
                pg_query(url, password, &format!("SELECT count(*) FROM \"{table}\""))
                    .await
                    .parse::<usize>()
                    .expect("a count")
            }
        }
    }
}

/// A run cut short by a stall (see [`STALL`]).
#[derive(Debug, Clone, Serialize)]
struct Stall {
    round: usize,
    sink: &'static str,
    concurrency: usize,
    spend: bool,
}

/// One run of the pipeline.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Run {
    round: usize,
    sink: &'static str,
    concurrency: usize,
    spend: bool,
    tasks: usize,
    secs: f64,
    pub(crate) tasks_per_s: f64,
    /// Seconds from the tick to the first `done`.
    first_done_secs: f64,
    /// The longest wait between two `done`s (s), and how many were done
    /// before it: a stall of the queue shows here.
    longest_gap_secs: f64,
    longest_gap_after: usize,
    /// Redis commands per task (commands inside scripts included), by name.
    redis_calls_per_task: BTreeMap<String, f64>,
    /// All of them.
    redis_calls_per_task_total: f64,
    /// EVALSHA / EVAL calls per task: the client's script round trips.
    script_calls_per_task: f64,
    /// Redis's own time in scripts per task (µs, `usec` of EVALSHA + EVAL).
    script_usec_per_task: f64,
    /// redis-server CPU (user + sys) per task, µs.
    redis_cpu_us_per_task: f64,
    /// This process's CPU (user + sys: daemon, simulator, bench) per task, µs.
    process_cpu_us_per_task: f64,
    /// Units Redis recorded in the credential's window after the run.
    units_recorded: u64,
}

/// One row of the table: a sink and a concurrency, spend on and off.
#[derive(Debug, Serialize)]
struct Cell {
    sink: &'static str,
    concurrency: usize,
    on_tasks_per_s: f64,
    off_tasks_per_s: f64,
    on_range: (f64, f64),
    off_range: (f64, f64),
    /// Median of the per-round ratios on ÷ off.
    ratio: f64,
    ratios: Vec<f64>,
    /// 1 − ratio.
    limiter_cost: f64,
    /// Per task, medians over rounds.
    on: PerTask,
    off: PerTask,
}

/// Per task, median over a cell's rounds.
#[derive(Debug, Serialize)]
struct PerTask {
    redis_calls: f64,
    script_calls: f64,
    script_usec: f64,
    redis_cpu_us: f64,
    process_cpu_us: f64,
}

pub async fn run(ctx: &Ctx) -> Section {
    let (n, rounds) = if ctx.quick { (300, 1) } else { (2_000, 9) };
    let sinks = sink_dirs();
    let redis = RedisServer::start();
    let mut conn = connect(&redis).await;
    // On and off of one sink and concurrency run back to back, so their
    // ratio is taken under the same load; which goes first alternates, and
    // the order of the pairs rotates from round to round.
    let pairs: Vec<(&SinkDir, usize)> = sinks
        .iter()
        .flat_map(|s| CONCURRENCY.iter().map(move |&c| (s, c)))
        .collect();

    let mut runs: Vec<Run> = Vec::new();
    let mut stalled: Vec<Stall> = Vec::new();
    for round in 0..rounds {
        let mut order = pairs.clone();
        order.rotate_left(round % pairs.len());
        for (sink, concurrency) in order {
            let spends = if round % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for spend in spends {
                let mut attempt = 0;
                let r = loop {
                    flushall(&mut conn).await;
                    attempt += 1;
                    let r = run_once(
                        &redis,
                        &mut conn,
                        sink,
                        &Store::Jsonl,
                        round,
                        concurrency,
                        spend,
                        n,
                        STALL,
                    )
                    .await;
                    let what = format!(
                        "   round {round}, sink {:<5}, concurrency {concurrency:>2}, spend {:>3}",
                        sink.name,
                        if spend { "on" } else { "off" },
                    );
                    match r {
                        Some(r) => {
                            eprintln!(
                                "{what}: {:>5} tasks in {:.2} s = {} tasks/s (first done after {:.0} ms)",
                                r.tasks,
                                r.secs,
                                thousands(r.tasks_per_s),
                                r.first_done_secs * 1000.0,
                            );
                            break r;
                        }
                        None => {
                            eprintln!(
                                "{what}: stalled, no task done within {} ms; run again",
                                STALL.as_millis()
                            );
                            stalled.push(Stall {
                                round,
                                sink: sink.name,
                                concurrency,
                                spend,
                            });
                            assert!(attempt < 3, "3 stalled runs in a row");
                        }
                    }
                };
                runs.push(r);
            }
        }
    }
    drop(conn);
    drop(redis);

    let cells: Vec<Cell> = pairs
        .iter()
        .map(|(s, c)| cell(&runs, s.name, *c, rounds))
        .collect();

    let mut md = String::new();
    md.push_str(
        "| sink on | concurrency | spend on, tasks/s | spend off, tasks/s | on ÷ off | limiter's cost |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for c in &cells {
        md.push_str(&format!(
            "| {} | {} | {} ({}–{}) | {} ({}–{}) | {:.2} | **{:.1}%** |\n",
            sink_label(&sinks, c.sink),
            c.concurrency,
            thousands(c.on_tasks_per_s),
            thousands(c.on_range.0),
            thousands(c.on_range.1),
            thousands(c.off_tasks_per_s),
            thousands(c.off_range.0),
            thousands(c.off_range.1),
            c.ratio,
            c.limiter_cost * 100.0
        ));
    }
    md.push_str("\nWhere the time goes, per task (medians over rounds):\n\n");
    md.push_str(
        "| sink on | concurrency | spend | Redis commands | of them script calls | Redis time in scripts, µs | Redis CPU, µs | this process's CPU, µs |\n|---|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for c in &cells {
        for (spend, p) in [("on", &c.on), ("off", &c.off)] {
            md.push_str(&format!(
                "| {} | {} | {spend} | {:.1} | {:.2} | {:.0} | {:.0} | {:.0} |\n",
                c.sink,
                c.concurrency,
                p.redis_calls,
                p.script_calls,
                p.script_usec,
                p.redis_cpu_us,
                p.process_cpu_us,
            ));
        }
    }
    let spend_cmds = spend_commands(&runs);
    let cpu = |spend: bool| {
        median(
            runs.iter()
                .filter(|r| r.spend == spend)
                .map(|r| r.redis_cpu_us_per_task + r.process_cpu_us_per_task)
                .collect(),
        )
    };
    let (cpu_on, cpu_off) = (cpu(true), cpu(false));
    md.push_str(&format!(
        "\nThe spend adds {:.0} Redis commands per task ({}; Redis counts the commands a script runs too) \
         and {:.0} µs of CPU per task (Redis + this process, median of all runs: {:.0} vs {:.0} µs), \
         {:.0}% of the CPU a task takes with it.\n",
        spend_cmds.values().sum::<f64>(),
        spend_cmds
            .iter()
            .map(|(k, v)| format!("{k} {v:+.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        cpu_on - cpu_off,
        cpu_on,
        cpu_off,
        (cpu_on - cpu_off) / cpu_on * 100.0
    ));
    md.push_str(&format!(
        "\nMethod: each run is a fresh in-process daemon (`daemon::run`) on a private redis-server \
         (FLUSHALL between runs) and the simulator on 127.0.0.1 with no delay and a quota it never \
         reaches; one job fans out {n} items × 1 page (cost {COST}) to a jsonl sink (which syncs every \
         page), `poll_interval` {POLL}, no log subscriber. Tasks/s = {n} ÷ time from the tick's fan-out \
         to the {n}th `done`; every run checked: upstream requests = sink lines = {n}, units recorded = \
         {n} × {COST} with the spend on, 0 with it off (the hook `daemon::Hooks::skip_spend`). {rounds} rounds; \
         on and off back to back, first in turn, pair order rotated; tasks/s are medians (range in \
         brackets), on ÷ off is the median of the per-round ratios. CPU is the change in user + sys time \
         of redis-server (`INFO cpu`) and of this process (`getrusage`) over the run.\n"
    ));

    if !stalled.is_empty() {
        md.push_str(&format!(
            "\nStalled, cut short and run again: {} of {} runs (no task done {} ms after the tick; {} \
             with the spend on, {} off). The apalis worker then sleeps until its next heartbeat \
             (`recover_after` ÷ 5 = 6 s): pickup latency, not the limiter; see `STALL` in \
             `benches/quota/e2e.rs`.\n",
            stalled.len(),
            runs.len() + stalled.len(),
            STALL.as_millis(),
            stalled.iter().filter(|r| r.spend).count(),
            stalled.iter().filter(|r| !r.spend).count()
        ));
    }

    let targets = cells
        .iter()
        .map(|c| {
            Target::new(
                format!(
                    "limiter's cost in end-to-end tasks/s, concurrency {}, sink on {}",
                    c.concurrency,
                    sink_label(&sinks, c.sink)
                ),
                format!("≤ {:.0}%", MAX_COST * 100.0),
                format!(
                    "{:.1}% ({} vs {} tasks/s)",
                    c.limiter_cost * 100.0,
                    thousands(c.on_tasks_per_s),
                    thousands(c.off_tasks_per_s)
                ),
                c.limiter_cost <= MAX_COST,
            )
        })
        .collect();

    Section {
        key: "e2e",
        title: "End to end: the limiter's share of pipeline throughput".into(),
        markdown: md,
        data: serde_json::json!({
            "tasks_per_run": n,
            "rounds": rounds,
            "cost": COST,
            "poll_interval": POLL,
            "sinks": sinks,
            "cells": cells,
            "spend_adds_redis_calls_per_task": spend_cmds,
            "cpu_us_per_task": { "spend_on": cpu_on, "spend_off": cpu_off },
            "runs": runs,
            "stalled_runs_cut_short": stalled,
        }),
        targets,
    }
}

/// The local disk (the system temp dir) and, when there is one, tmpfs.
pub(crate) fn sink_dirs() -> Vec<SinkDir> {
    let mut out = Vec::new();
    let tmp = std::env::temp_dir();
    out.push(SinkDir {
        name: "disk",
        fs: fs_of(&tmp),
        base: tmp,
    });
    let shm = PathBuf::from("/dev/shm");
    let fs = fs_of(&shm);
    if fs.starts_with("tmpfs") {
        out.push(SinkDir {
            name: "tmpfs",
            base: shm,
            fs,
        });
    }
    out
}

fn sink_label(sinks: &[SinkDir], name: &str) -> String {
    sinks
        .iter()
        .find(|s| s.name == name)
        .map(|s| format!("{} ({})", s.name, s.fs))
        .unwrap_or_else(|| name.to_owned())
}

/// `ext4 on /`: the file system of the longest mount point above `path`.
fn fs_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && path.starts_with(f[1])).then(|| (f[1].to_owned(), f[2].to_owned()))
        })
        .max_by_key(|(m, _)| m.len())
        .map_or_else(|| "?".into(), |(m, t)| format!("{t} on {m}"))
}

fn cell(runs: &[Run], sink: &'static str, concurrency: usize, rounds: usize) -> Cell {
    let of = |spend: bool| -> Vec<&Run> {
        runs.iter()
            .filter(|r| r.sink == sink && r.concurrency == concurrency && r.spend == spend)
            .collect()
    };
    let (on, off) = (of(true), of(false));
    let rate = |rs: &[&Run]| rs.iter().map(|r| r.tasks_per_s).collect::<Vec<_>>();
    let ratios: Vec<f64> = (0..rounds)
        .map(|round| {
            let pick = |rs: &[&Run]| {
                rs.iter()
                    .find(|r| r.round == round)
                    .map(|r| r.tasks_per_s)
                    .expect("a run per round")
            };
            pick(&on) / pick(&off)
        })
        .collect();
    let ratio = median(ratios.clone());
    let per_task = |rs: &[&Run]| {
        let m = |f: fn(&Run) -> f64| median(rs.iter().map(|r| f(r)).collect());
        PerTask {
            redis_calls: m(|r| r.redis_calls_per_task_total),
            script_calls: m(|r| r.script_calls_per_task),
            script_usec: m(|r| r.script_usec_per_task),
            redis_cpu_us: m(|r| r.redis_cpu_us_per_task),
            process_cpu_us: m(|r| r.process_cpu_us_per_task),
        }
    };
    Cell {
        sink,
        concurrency,
        on_tasks_per_s: median(rate(&on)),
        off_tasks_per_s: median(rate(&off)),
        on_range: min_max(&rate(&on)),
        off_range: min_max(&rate(&off)),
        ratio,
        ratios,
        limiter_cost: 1.0 - ratio,
        on: per_task(&on),
        off: per_task(&off),
    }
}

/// Redis commands per task that the spend adds (mean over runs with the
/// spend on, minus the mean with it off), those that moved by ≥ 0.5.
fn spend_commands(runs: &[Run]) -> BTreeMap<String, f64> {
    let mean = |spend: bool| {
        let rs: Vec<&Run> = runs.iter().filter(|r| r.spend == spend).collect();
        let mut sum: BTreeMap<String, f64> = BTreeMap::new();
        for r in &rs {
            for (k, v) in &r.redis_calls_per_task {
                *sum.entry(k.clone()).or_default() += v / rs.len() as f64;
            }
        }
        sum
    };
    let (on, off) = (mean(true), mean(false));
    on.iter()
        .map(|(k, v)| (k.clone(), v - off.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| d.abs() >= 0.5)
        .map(|(k, d)| (k, (d * 10.0).round() / 10.0))
        .collect()
}

/// The pipeline's config: `concurrency` worker slots polling every
/// [`POLL`], a window no run fills, and the job [`JOB`] fanning the
/// simulator at `sim_url` out over `n` regions into `sink`, never fired by
/// itself (the bench fans the tick out).
fn config(
    redis_url: &str,
    concurrency: usize,
    sim_url: &str,
    n: usize,
    sink: Sink,
) -> ConfigBuilder {
    let regions = (0..n).map(|i| format!("r{i:05}"));
    let request = Request::get(&format!("{sim_url}/youtube/v3/videos")).query(&[
        ("chart", "mostPopular"),
        ("regionCode", "{region}"),
        ("maxResults", "1"),
        ("key", "{secret}"),
    ]);
    ConfigBuilder::new()
        .redis_url(redis_url)
        .worker(
            Worker::default()
                .concurrency(concurrency as u32)
                .poll_interval(POLL)
                .shutdown_timeout("10s"),
        )
        .credential(
            Credential::env(CREDENTIAL, "QW_BENCH_KEY")
                .window(Window::sliding(1_000_000_000_000, "1h")),
        )
        .endpoint(Endpoint::new("youtube.videos.list", CREDENTIAL, COST))
        .job(
            Job::new(JOB, "youtube.videos.list")
                .fan_out("region", regions)
                .request(request)
                .sink(sink),
        )
}

/// One pipeline run of `n` tasks into `store` (its files under `sink`);
/// `None` when no task was done `stall` after the tick ([`STALL`] here). Its table, for a postgres store, is `table`
/// (fresh per run: the page ids of two runs' ticks differ anyway, but a
/// count must be of this run's rows).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_once(
    redis: &RedisServer,
    conn: &mut Conn,
    sink: &SinkDir,
    store: &Store,
    round: usize,
    concurrency: usize,
    spend: bool,
    n: usize,
    stall: Duration,
) -> Option<Run> {
    let table = format!("e2e_{}", uuid::Uuid::new_v4().simple());
    let sim = Simulator::start(
        SimConfig {
            pages_per_query: 1,
            items_per_page: 1,
            ..SimConfig::default()
        }
        .cost(simulator::VIDEOS, COST)
        .key("bench-key", u64::MAX / 4, Duration::from_secs(3600)),
    )
    .await
    .expect("start the simulator");
    let sink_of = store.sink(&table);
    let cfg = config(&redis.url(), concurrency, &sim.base_url(), n, sink_of).write_in(&sink.base);
    let dir = &cfg.dir;
    if let Store::Postgres { password, .. } = store {
        std::fs::write(dir.path().join("pg-password"), password).expect("write the password");
    }
    // Only this variable: nothing leaks in from the environment.
    let lookup = |name: &str| (name == "QW_BENCH_KEY").then(|| "bench-key".to_owned());
    let config = Config::load_with_env(&dir.path().join("config.toml"), &lookup)
        .unwrap_or_else(|e| panic!("e2e config: {e:?}"));
    let secrets = config
        .secrets_with_env(&lookup)
        .unwrap_or_else(|e| panic!("e2e secrets: {e:?}"));
    let config = Arc::new(config);

    // The N-th `done` of this tick ends the run; anything else is a bug.
    let (events, mut rx) = broadcast::channel::<OutcomeEvent>(n + 1024);
    let (done_tx, done_rx) = oneshot::channel::<Result<Dones, String>>();
    let (first_tx, first_rx) = oneshot::channel::<()>();
    let mut first_tx = Some(first_tx);
    let collector = tokio::spawn(async move {
        let mut d: Option<Dones> = None;
        loop {
            match rx.recv().await {
                Ok(ev) if ev.outcome.kind == OutcomeKind::Done => {
                    let at = Instant::now();
                    let d = d.get_or_insert(Dones {
                        count: 0,
                        first: at,
                        last: at,
                        gap: Duration::ZERO,
                        gap_after: 0,
                    });
                    if at - d.last > d.gap {
                        (d.gap, d.gap_after) = (at - d.last, d.count);
                    }
                    d.count += 1;
                    d.last = at;
                    if let Some(tx) = first_tx.take() {
                        let _ = tx.send(());
                    }
                    if d.count == n {
                        let _ = done_tx.send(Ok(d.clone()));
                        return;
                    }
                }
                Ok(ev) => {
                    let _ = done_tx.send(Err(format!("unexpected outcome {ev:?}")));
                    return;
                }
                Err(e) => {
                    let _ = done_tx.send(Err(format!("outcome events: {e}")));
                    return;
                }
            }
        }
    });
    let opts = RunOptions {
        shared: Shared {
            events: Some(events),
            ..Shared::default()
        },
        hooks: Hooks {
            skip_spend: !spend,
            ..Hooks::default()
        },
        ..RunOptions::default()
    };
    let mut daemon = InProcess::start(config.clone(), secrets, opts).await;

    let url = RedisUrl::new(redis.url());
    let own = quota_worker::conn::connect(
        &quota_worker::conn::Master::Url(url.clone()),
        Duration::from_secs(10),
        "test",
    )
    .await
    .expect("connect");
    let queue = Queue::new(
        own.clone(),
        KeySpace::new(config.redis.key_prefix.clone()),
        config.worker.recover_after,
    );
    let limiter = Limiter::new(own, Arc::new(Quotas::new(&config)), Duration::from_secs(10));
    let job = &config.jobs[JOB];

    // Counters from here: the daemon's start-up is not the pipeline's work.
    reset_stats(conn).await;
    let redis_cpu0 = redis_cpu_us(conn).await;
    let cpu0 = process_cpu_us();
    // What the scheduler does on a tick: fan out, claim the tick, enqueue.
    let t0 = Instant::now();
    let tick = chrono::Utc::now().timestamp_millis();
    let tasks = quota_worker::schedule::tick_tasks(job, tick, Origin::Tick);
    let queued = queue
        .enqueue_tick(JOB, tick, &tasks, "bench")
        .await
        .expect("enqueue the tick");
    assert_eq!(queued, Some(n), "the tick fanned out {n} tasks");
    let stalled = tokio::time::timeout_at((t0 + stall).into(), first_rx)
        .await
        .is_err();
    if stalled {
        daemon.stop().await;
        collector.abort();
        sim.shutdown().await;
        return None;
    }
    let dones = tokio::time::timeout(Duration::from_secs(300), done_rx)
        .await
        .unwrap_or_else(|_| panic!("{n} tasks did not finish within 300 s"))
        .expect("collector")
        .unwrap_or_else(|e| panic!("e2e run: {e}"));
    let cpu1 = process_cpu_us();
    let redis_cpu1 = redis_cpu_us(conn).await;
    let stats = commandstats(conn).await;
    let secs = (dones.last - t0).as_secs_f64();

    daemon.stop().await;
    collector.abort();

    // The run counts only if the pipeline did all of its work, once.
    let sim_stats = sim.stats();
    assert_eq!(sim_stats.charges.len(), n, "upstream requests");
    assert!(
        sim_stats.duplicate_pages().is_empty(),
        "a page fetched twice"
    );
    assert_eq!(sim_stats.key("bench-key").quota_errors, 0);
    assert_eq!(
        store.stored(dir.path(), &table).await,
        n,
        "records in the sink"
    );
    let used = limiter
        .peek(CREDENTIAL)
        .await
        .expect("peek the credential")
        .windows[0]
        .used;
    let want = if spend { n as u64 * COST } else { 0 };
    assert_eq!(used, want, "units recorded (spend {spend})");
    sim.shutdown().await;

    let per = |x: f64| x / n as f64;
    let scripts = ["evalsha", "eval", "fcall"];
    Some(Run {
        round,
        sink: sink.name,
        concurrency,
        spend,
        tasks: n,
        secs,
        tasks_per_s: n as f64 / secs,
        first_done_secs: (dones.first - t0).as_secs_f64(),
        longest_gap_secs: dones.gap.as_secs_f64(),
        longest_gap_after: dones.gap_after,
        redis_calls_per_task_total: per(stats.values().map(|s| s.0 as f64).sum()),
        script_calls_per_task: per(scripts
            .iter()
            .filter_map(|c| stats.get(*c))
            .map(|s| s.0 as f64)
            .sum()),
        script_usec_per_task: per(scripts
            .iter()
            .filter_map(|c| stats.get(*c))
            .map(|s| s.1 as f64)
            .sum()),
        redis_calls_per_task: stats
            .iter()
            .map(|(k, s)| (k.clone(), per(s.0 as f64)))
            .collect(),
        redis_cpu_us_per_task: per((redis_cpu1 - redis_cpu0) as f64),
        process_cpu_us_per_task: per((cpu1 - cpu0) as f64),
        units_recorded: used,
    })
}

/// One value (the first column of the first row, as text) that `sql`
/// returns on the server at `url`.
pub(crate) async fn pg_query(url: &str, password: &str, sql: &str) -> String {
    let mut config: tokio_postgres::Config = url.parse().expect("a postgres URL");
    config.password(password);
    let (client, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect to postgres");
    let driver = tokio::spawn(conn);
    let rows = client.simple_query(sql).await.expect("postgres query");
    drop(client);
    let _ = driver.await;
    rows.into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default()
}

/// The `done` outcomes of a run, as they arrived.
#[derive(Debug, Clone)]
struct Dones {
    count: usize,
    first: Instant,
    last: Instant,
    /// The longest wait between two of them, and how many came before it.
    gap: Duration,
    gap_after: usize,
}

/// `INFO commandstats`: command -> (calls, usec). Inner commands of scripts
/// are counted under their own names, and their time under the script too.
async fn commandstats(conn: &mut Conn) -> BTreeMap<String, (u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Our own INFO / CONFIG calls are not the pipeline's.
        if matches!(name, "info" | "config") {
            continue;
        }
        out.insert(name.to_owned(), (field("calls"), field("usec")));
    }
    out
}

/// redis-server's CPU time so far (user + sys), µs.
async fn redis_cpu_us(conn: &mut Conn) -> i64 {
    let mut secs = 0.0;
    for field in ["used_cpu_user", "used_cpu_sys"] {
        secs += info_field(conn, "cpu", field)
            .await
            .parse::<f64>()
            .expect("INFO cpu");
    }
    (secs * 1e6) as i64
}

/// This process's CPU time so far (user + sys), µs.
fn process_cpu_us() -> i64 {
    // SAFETY: getrusage only writes into the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec * 1_000_000 + t.tv_usec;
    us(ru.ru_utime) + us(ru.ru_stime)
}
