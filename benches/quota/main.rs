//! The benchmark of issues 5 and 11: the spend script against the ceiling
//! Redis itself sets for it, against the naive design and published peers,
//! memory per weighted call, cost as the window grows, what a refused spend
//! costs, bucket windows, concurrent windows, what the limiter costs end to end, exactness
//! under load, where a call's time goes inside Redis — in one run, on one private `redis-server` — the windows
//! on a private Redis Cluster against one Redis (its own servers), and the
//! PostgreSQL sink beside the SQLite sink (a private PostgreSQL server).
//!
//! ```sh
//! cargo bench --bench quota                      # everything (< 10 min on 2 cores)
//! cargo bench --bench quota -- --quick           # smoke run: checks it runs
//! cargo bench --bench quota -- growth memory     # some sections only
//! cargo bench --bench quota -- --out DIR         # default target/quota-bench
//! ```
//!
//! `cargo test --all-targets` runs it too, as the smoke run.
//!
//! Writes `report.md`, `report.json` and `growth.svg` into the output
//! directory and prints the markdown. Nothing here asserts a speed: the
//! targets are checked and reported, met or not (BENCHMARKS.md).

// The integration tests' support library; the benchmark uses a part of it.
#[allow(dead_code, unused_imports)]
#[path = "../../tests/support/mod.rs"]
mod support;

mod anatomy;
mod bucket;
mod cluster;
mod common;
mod concurrent;
mod e2e;
mod exactness;
mod growth;
mod idle;
mod memory;
mod reject;
mod report;
mod sinks;
mod throughput;

use std::path::PathBuf;
use std::time::Instant;

use report::Section;
use support::RedisServer;

/// What every section gets.
pub struct Ctx {
    /// Smoke mode: tiny sizes, seconds in all.
    pub quick: bool,
    /// The private server the spend sections share (each cleans up after itself).
    pub redis: RedisServer,
    /// Where report files go.
    pub out: PathBuf,
}

/// In the issue's order (exactness, its item 5, last of those), then ours,
/// then issue 11's cells (and where their time goes), then issue 15's
/// cluster, then issue 27's PostgreSQL sink, then issue 25's concurrent
/// windows.
const SECTIONS: [&str; 12] = [
    "throughput",
    "memory",
    "growth",
    "e2e",
    "exactness",
    "idle",
    "reject",
    "bucket",
    "anatomy",
    "cluster",
    "sinks",
    "concurrent",
];

fn main() {
    let mut args = std::env::args().skip(1);
    // `cargo bench` passes `--bench`; `cargo test --all-targets` (the test
    // suite, CI) passes nothing and gets the smoke run.
    let mut quick = !std::env::args().any(|a| a == "--bench");
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/quota-bench");
    let mut only = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--out" => out = PathBuf::from(args.next().expect("--out DIR")),
            // cargo bench passes `--bench`.
            "--bench" => {}
            s if SECTIONS.contains(&s) => only.push(s.to_owned()),
            s => {
                eprintln!("unknown argument {s:?}; sections: {}", SECTIONS.join(" "));
                std::process::exit(64);
            }
        }
    }
    std::fs::create_dir_all(&out).expect("create the output directory");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(bench(quick, out, only));
}

async fn bench(quick: bool, out: PathBuf, only: Vec<String>) {
    let started = Instant::now();
    let redis = RedisServer::start();
    let mut machine = machine(&redis);
    let ctx = Ctx { quick, redis, out };
    let want = |s: &str| only.is_empty() || only.iter().any(|o| o == s);

    let mut sections: Vec<Section> = Vec::new();
    for key in SECTIONS {
        if !want(key) {
            continue;
        }
        let t = Instant::now();
        eprintln!("== {key}");
        let s = match key {
            "throughput" => throughput::run(&ctx).await,
            "exactness" => exactness::run(&ctx).await,
            "memory" => memory::run(&ctx).await,
            "growth" => growth::run(&ctx).await,
            "idle" => idle::run(&ctx).await,
            "e2e" => e2e::run(&ctx).await,
            "reject" => reject::run(&ctx).await,
            "bucket" => bucket::run(&ctx).await,
            "anatomy" => anatomy::run(&ctx).await,
            "cluster" => cluster::run(&ctx).await,
            "sinks" => sinks::run(&ctx).await,
            "concurrent" => concurrent::run(&ctx).await,
            _ => unreachable!(),
        };
        eprintln!("== {key}: {:.1} s", t.elapsed().as_secs_f64());
        sections.push(s);
    }
    machine.total_secs = started.elapsed().as_secs_f64();
    machine.load_at_end = loadavg();

    let md = markdown(quick, &machine, &sections);
    let json = serde_json::json!({
        "quick": quick,
        "machine": machine,
        "sections": sections,
    });
    std::fs::write(ctx.out.join("report.md"), &md).expect("write report.md");
    std::fs::write(
        ctx.out.join("report.json"),
        serde_json::to_string_pretty(&json).expect("json"),
    )
    .expect("write report.json");
    println!("{md}");
    eprintln!("report: {}", ctx.out.join("report.md").display());
    let broken: Vec<_> = sections
        .iter()
        .flat_map(|s| &s.targets)
        .filter(|t| t.correctness && !t.met)
        .collect();
    if !broken.is_empty() {
        for t in broken {
            eprintln!(
                "CORRECTNESS: {}: wanted {}, got {}",
                t.what, t.target, t.measured
            );
        }
        std::process::exit(1);
    }
}

#[derive(serde::Serialize)]
struct Machine {
    date: String,
    nproc: usize,
    cpu: String,
    redis: String,
    git: String,
    load_at_start: String,
    load_at_end: String,
    total_secs: f64,
}

fn machine(redis: &RedisServer) -> Machine {
    let info: String = redis.cmd(&["INFO", "server"]);
    let field = |f: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{f}:")))
            .unwrap_or("?")
            .trim()
            .to_owned()
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "?".into());
    let git = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "?".into());
    Machine {
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu,
        redis: format!(
            "redis-server {} ({}), private, no persistence",
            field("redis_version"),
            field("multiplexing_api")
        ),
        git,
        load_at_start: loadavg(),
        load_at_end: String::new(),
        total_secs: 0.0,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn markdown(quick: bool, m: &Machine, sections: &[Section]) -> String {
    let mut s = String::new();
    s.push_str("# quota-worker benchmark\n\n");
    if quick {
        s.push_str("**Smoke run (`--quick`): sizes are tiny, numbers mean nothing.**\n\n");
    }
    s.push_str(&format!(
        "| | |\n|---|---|\n| date | {} |\n| machine | {} × `{}` |\n| Redis | {} |\n| code | `{}` |\n| load average | {} at start, {} at end |\n| run time | {:.0} s |\n\n",
        m.date, m.nproc, m.cpu, m.redis, m.git, m.load_at_start, m.load_at_end, m.total_secs
    ));
    let targets: Vec<_> = sections.iter().flat_map(|s| &s.targets).collect();
    if !targets.is_empty() {
        s.push_str("## Targets\n\n| | target | this run | met |\n|---|---|---|---|\n");
        for t in targets {
            s.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                t.what,
                t.target,
                t.measured,
                if t.met { "yes" } else { "**no**" }
            ));
        }
        s.push('\n');
    }
    for (i, sec) in sections.iter().enumerate() {
        s.push_str(&format!(
            "## {}. {}\n\n{}\n",
            i + 1,
            sec.title,
            sec.markdown.trim_end()
        ));
        s.push('\n');
    }
    s
}
