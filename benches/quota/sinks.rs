//! Section `sinks`: the postgres sink beside the SQLite sink, on the same
//! pages, in the same run.
//!
//! 1. **Records/s through `Sinks::write`**: the daemon's own sink code, as a
//!    worker calls it after a fetch, without the rest of the pipeline. Each
//!    writer (a Tokio task) writes its own item's pages of 50 video-like
//!    records (about 700 bytes of JSON each) one after another; 1 and 8
//!    writers; keyed with a search field (`key = "/id"`, `search =
//!    ["/snippet/title", "/snippet/tags"]`, the layout `search` uses) and
//!    plain appends (no key, no search). Both durable per page: SQLite in
//!    WAL with `synchronous = FULL`, PostgreSQL with `fsync` and
//!    `synchronous_commit` on (its defaults), its data on the same disk.
//! 2. **End-to-end tasks/s**: section `e2e`'s pipeline (tick → queue →
//!    spend → HTTP → sink, one page of one record per task) with the sink a
//!    jsonl file, a SQLite table and a PostgreSQL table (keyed), spend on.
//!
//! Every run is checked: the sink holds every record once (rows = records
//! written, none spooled), else the run fails the benchmark.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use quota_worker::config::Config;
use quota_worker::sink::{PageRef, Sinks};
use serde::Serialize;
use serde_json::{Value, json};

use crate::Ctx;
use crate::common::{connect, flushall, median, min_max, thousands};
use crate::e2e::{self, Store, pg_query};
use crate::report::{Section, Target};
use crate::support::postgres::Postgres;
use crate::support::{
    ConfigBuilder, Credential, Endpoint, Job, RedisServer, Request, Sink, TestConfig, Window,
    Worker,
};

const ROLE: &str = "bench";
const PASSWORD: &str = "bench-pg-password";
const PER_PAGE: usize = 50;
const WRITERS: [usize; 2] = [1, 8];
const E2E_CONCURRENCY: [usize; 2] = [8, 32];
/// How long the first task may take (section `e2e` cuts a run short after
/// 1 s, its sign of a lost wake-up): a fresh daemon's first postgres pages
/// open their pool's connections (a SCRAM login each) and create the table.
const FIRST_DONE: std::time::Duration = std::time::Duration::from_secs(15);

/// Keyed with search fields, or plain appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Mode {
    Keyed,
    Append,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Keyed => "key + search",
            Mode::Append => "append",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Kind {
    Sqlite,
    Postgres,
}

/// One timed write run.
#[derive(Debug, Clone, Serialize)]
struct WriteRun {
    round: usize,
    kind: Kind,
    mode: Mode,
    writers: usize,
    records: usize,
    secs: f64,
    records_per_s: f64,
}

/// One pipeline run.
#[derive(Debug, Clone, Serialize)]
struct PipelineRun {
    round: usize,
    sink: &'static str,
    concurrency: usize,
    tasks_per_s: f64,
}

pub async fn run(ctx: &Ctx) -> Section {
    let load_start = crate::loadavg();
    // fsync and synchronous_commit on: durable per page, as SQLite's FULL.
    let pg = Postgres::start_with(&[]);
    pg.role(ROLE, PASSWORD);
    let version = pg
        .query(ROLE, "SHOW server_version")
        .into_iter()
        .next()
        .and_then(|r| r.into_iter().next().flatten())
        .unwrap_or_default();
    let url = pg.url(ROLE, ROLE);
    let (pages, rounds) = if ctx.quick { (5, 1) } else { (60, 9) };

    let mut writes: Vec<WriteRun> = Vec::new();
    for round in 0..rounds {
        for mode in [Mode::Keyed, Mode::Append] {
            for writers in WRITERS {
                // Which goes first alternates from round to round.
                let kinds = if round % 2 == 0 {
                    [Kind::Sqlite, Kind::Postgres]
                } else {
                    [Kind::Postgres, Kind::Sqlite]
                };
                for kind in kinds {
                    let r = write_run(&url, round, kind, mode, writers, pages).await;
                    eprintln!(
                        "   round {round}, {:<12}, {writers} writer(s), {:<8}: {} records/s",
                        mode.label(),
                        format!("{kind:?}"),
                        thousands(r.records_per_s)
                    );
                    writes.push(r);
                }
            }
        }
    }

    let pipeline = pipeline_runs(ctx, &url, rounds).await;
    drop(pg);
    let load_end = crate::loadavg();

    let mut md = String::from(
        "Records/s through `Sinks::write` (the daemon's sink code), pages of 50 records, each page one durable transaction:\n\n\
         | mode | writers | SQLite, records/s | PostgreSQL, records/s | PostgreSQL ÷ SQLite |\n|---|---:|---:|---:|---:|\n",
    );
    let mut data_cells = Vec::new();
    for mode in [Mode::Keyed, Mode::Append] {
        for writers in WRITERS {
            let of = |kind: Kind| -> Vec<&WriteRun> {
                (writes.iter())
                    .filter(|r| r.kind == kind && r.mode == mode && r.writers == writers)
                    .collect()
            };
            let (sq, pgr) = (of(Kind::Sqlite), of(Kind::Postgres));
            let rates = |rs: &[&WriteRun]| rs.iter().map(|r| r.records_per_s).collect::<Vec<_>>();
            let ratios: Vec<f64> = (0..rounds)
                .map(|round| {
                    let pick = |rs: &[&WriteRun]| {
                        rs.iter()
                            .find(|r| r.round == round)
                            .map_or(f64::NAN, |r| r.records_per_s)
                    };
                    pick(&pgr) / pick(&sq)
                })
                .collect();
            let (s_rates, p_rates) = (rates(&sq), rates(&pgr));
            let (s_range, p_range, r_range) =
                (min_max(&s_rates), min_max(&p_rates), min_max(&ratios));
            md.push_str(&format!(
                "| {} | {writers} | {} ({}–{}) | {} ({}–{}) | **{:.2}** ({:.2}–{:.2}) |\n",
                mode.label(),
                thousands(median(s_rates.clone())),
                thousands(s_range.0),
                thousands(s_range.1),
                thousands(median(p_rates.clone())),
                thousands(p_range.0),
                thousands(p_range.1),
                median(ratios.clone()),
                r_range.0,
                r_range.1,
            ));
            data_cells.push(json!({
                "mode": mode, "writers": writers,
                "sqlite_records_per_s": median(s_rates), "postgres_records_per_s": median(p_rates),
                "postgres_over_sqlite": median(ratios.clone()), "ratios": ratios,
            }));
        }
    }

    md.push_str(
        "\nEnd to end, tasks/s (section `e2e`'s pipeline, spend on, one record per task, keyed), sink on the local disk:\n\n\
         | sink | concurrency | tasks/s | ÷ jsonl |\n|---|---:|---:|---:|\n",
    );
    let mut pipeline_cells = Vec::new();
    for concurrency in E2E_CONCURRENCY {
        let of = |sink: &str| -> Vec<&PipelineRun> {
            (pipeline.iter())
                .filter(|r| r.sink == sink && r.concurrency == concurrency)
                .collect()
        };
        let jsonl = of("jsonl");
        for sink in ["jsonl", "sqlite", "postgres"] {
            let rs = of(sink);
            let rates: Vec<f64> = rs.iter().map(|r| r.tasks_per_s).collect();
            let ratios: Vec<f64> = (0..rounds)
                .filter_map(|round| {
                    let a = rs.iter().find(|r| r.round == round)?;
                    let b = jsonl.iter().find(|r| r.round == round)?;
                    Some(a.tasks_per_s / b.tasks_per_s)
                })
                .collect();
            let (range, r_range) = (min_max(&rates), min_max(&ratios));
            md.push_str(&format!(
                "| {sink} | {concurrency} | {} ({}–{}) | {:.2} ({:.2}–{:.2}) |\n",
                thousands(median(rates.clone())),
                thousands(range.0),
                thousands(range.1),
                median(ratios.clone()),
                r_range.0,
                r_range.1,
            ));
            pipeline_cells.push(json!({
                "sink": sink, "concurrency": concurrency,
                "tasks_per_s": median(rates), "over_jsonl": median(ratios),
            }));
        }
    }
    md.push_str(&format!(
        "\nMethod: PostgreSQL {} (a private server from `tests/support/postgres.rs`, `fsync` and \
         `synchronous_commit` on, `shared_buffers` 16MB, its data directory on the local disk) and bundled \
         SQLite (WAL, `synchronous = FULL`), both in temporary directories on the same disk; records \
         checked after every run (rows = records written, nothing spooled). Write runs: {pages} pages per \
         writer after one untimed page each (which creates the table and opens the connections); each \
         pair of runs back to back, which goes first alternating; {rounds} rounds; rates are medians \
         (range), the ratio is the median of the per-round ratios. Pipeline: {} tasks per run, {rounds} \
         rounds, the three sinks back to back in each round. Load average {load_start} at the section's \
         start, {load_end} at its end (other work on this machine shares its 2 cores).\n",
        version,
        if ctx.quick { 300 } else { 2_000 },
    ));

    Section {
        key: "sinks",
        title: "PostgreSQL sink beside the SQLite sink".into(),
        markdown: md,
        data: json!({
            "pages_per_writer": pages, "records_per_page": PER_PAGE, "rounds": rounds,
            "cells": data_cells, "pipeline_cells": pipeline_cells,
            "write_runs": writes, "pipeline_runs": pipeline,
            "load_start": load_start, "load_end": load_end,
        }),
        targets: vec![
            Target::new(
                "sinks: every record stored once (rows = records written, none spooled)",
                "all runs",
                "all runs",
                true,
            )
            .correctness(),
        ],
    }
}

/// A record like a YouTube video's: id, snippet (title, description, tags,
/// channel), statistics.
fn record(writer: usize, page: usize, i: usize) -> Value {
    json!({
        "kind": "youtube#video",
        "etag": format!("XI7nbFXulYBIpL0ayR_gDh3eu1k-{writer}-{page}-{i}"),
        "id": format!("w{writer}-p{page}-i{i}"),
        "snippet": {
            "publishedAt": "2026-11-20T17:00:09Z",
            "channelId": "UC_x5XG1OV2P6uZZ5FSM9Ttw",
            "title": format!("Async Rust in production, part {i}: tokio, pools and back-pressure (page {page})"),
            "description": "A long talk about async Rust, connection pools, back-pressure, quotas and \
                            the things that go wrong at 3 a.m. when an API says no. Links below.",
            "channelTitle": "Rust Conf",
            "tags": ["rust", "async", "tokio", "postgres", "sqlite"],
            "categoryId": "28",
            "liveBroadcastContent": "none"
        },
        "statistics": {"viewCount": "123456", "likeCount": "7890", "commentCount": "321"}
    })
}

fn page(writer: usize, page: usize) -> Value {
    json!({"items": (0..PER_PAGE).map(|i| record(writer, page, i)).collect::<Vec<_>>()})
}

/// A config dir with one job writing to `kind` in `mode` (its password
/// file in it, for postgres), `writers` worker slots.
fn config(url: &str, kind: Kind, mode: Mode, writers: usize, table: &str) -> TestConfig {
    let sink = match kind {
        Kind::Sqlite => Sink::sqlite("data/{job}.sqlite"),
        Kind::Postgres => Sink::postgres(url)
            .password_file("pg-password")
            .table(table),
    }
    .records("/items");
    let sink = match mode {
        Mode::Keyed => sink.key("/id").search(&["/snippet/title", "/snippet/tags"]),
        Mode::Append => sink,
    };
    let cfg = ConfigBuilder::new()
        .state_dir("state")
        .worker(Worker::default().concurrency(writers as u32))
        .credential(Credential::env("c", "QW_BENCH_KEY").window(Window::sliding(1000, "1h")))
        .endpoint(Endpoint::new("e", "c", 1))
        .job(
            Job::new("videos", "e")
                .request(Request::get("http://127.0.0.1:9/"))
                .sink(sink),
        )
        .write();
    std::fs::write(cfg.join("pg-password"), PASSWORD).expect("password");
    cfg
}

/// Writes `pages` pages per writer, timed, after one untimed page each.
async fn write_run(
    url: &str,
    round: usize,
    kind: Kind,
    mode: Mode,
    writers: usize,
    pages: usize,
) -> WriteRun {
    let table = format!("w_{}", uuid::Uuid::new_v4().simple());
    let cfg = config(url, kind, mode, writers, &table);
    let dir = &cfg.dir;
    let config = Config::load_with_env(&cfg.path(), &|_| None)
        .unwrap_or_else(|e| panic!("sinks config: {e:?}"));
    let config = Arc::new(config);
    let sinks = Sinks::for_config(&config);
    let tick = Utc::now().timestamp_millis();
    let write = move |w: usize, p: usize| {
        let (sinks, config) = (sinks.clone(), config.clone());
        let body = page(w, p);
        async move {
            let job = &config.jobs["videos"];
            let item = vec![("region".to_owned(), format!("w{w}"))];
            let at = PageRef {
                tick,
                page: p as u32 + 1,
            };
            sinks
                .write(job, &item, at, &body, Utc::now())
                .await
                .expect("write a page");
        }
    };
    for w in 0..writers {
        write(w, 0).await;
    }
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let write = write.clone();
            tokio::spawn(async move {
                for p in 1..=pages {
                    write(w, p).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    let secs = t0.elapsed().as_secs_f64();
    let records = writers * pages * PER_PAGE;
    // Every record once, none waiting in the spool.
    let spooled = std::fs::read_dir(dir.path().join("state/spool/videos"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(spooled, 0, "{kind:?}: pages were spooled");
    let rows = match kind {
        Kind::Sqlite => rusqlite::Connection::open(dir.path().join("data/videos.sqlite"))
            .and_then(|c| {
                c.query_row("SELECT count(*) FROM \"videos\"", [], |r| {
                    r.get::<_, i64>(0)
                })
            })
            .expect("count sqlite rows") as usize,
        Kind::Postgres => pg_query(url, PASSWORD, &format!("SELECT count(*) FROM \"{table}\""))
            .await
            .parse()
            .expect("a count"),
    };
    assert_eq!(rows, records + writers * PER_PAGE, "{kind:?} rows");
    WriteRun {
        round,
        kind,
        mode,
        writers,
        records,
        secs,
        records_per_s: records as f64 / secs,
    }
}

/// Section `e2e`'s pipeline into jsonl, SQLite and PostgreSQL, back to
/// back in each round.
async fn pipeline_runs(ctx: &Ctx, url: &str, rounds: usize) -> Vec<PipelineRun> {
    let n = if ctx.quick { 300 } else { 2_000 };
    let disk = e2e::sink_dirs().into_iter().next().expect("the disk");
    let redis = RedisServer::start();
    let mut conn = connect(&redis).await;
    let stores = [
        ("jsonl", Store::Jsonl),
        ("sqlite", Store::Sqlite),
        (
            "postgres",
            Store::Postgres {
                url: url.to_owned(),
                password: PASSWORD.to_owned(),
            },
        ),
    ];
    let mut out = Vec::new();
    for round in 0..rounds {
        for concurrency in E2E_CONCURRENCY {
            let mut order: Vec<&(&str, Store)> = stores.iter().collect();
            order.rotate_left(round % stores.len());
            for (name, store) in order {
                let mut tries = 0;
                let r = loop {
                    flushall(&mut conn).await;
                    tries += 1;
                    let run = e2e::run_once(
                        &redis,
                        &mut conn,
                        &disk,
                        store,
                        round,
                        concurrency,
                        true,
                        n,
                        FIRST_DONE,
                    );
                    match run.await {
                        Some(r) => break r,
                        None => assert!(tries < 3, "3 stalled runs in a row"),
                    }
                };
                eprintln!(
                    "   round {round}, pipeline into {name:<8}, concurrency {concurrency:>2}: {} tasks/s",
                    thousands(r.tasks_per_s)
                );
                out.push(PipelineRun {
                    round,
                    sink: name,
                    concurrency,
                    tasks_per_s: r.tasks_per_s,
                });
            }
        }
    }
    out
}
