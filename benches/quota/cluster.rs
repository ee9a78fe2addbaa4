//! Section `cluster` (issue 15): spends per second and latency over 100
//! credentials on one standalone Redis against a 3-master Redis Cluster,
//! each with and without `quota_replicas = 1` (the spend pipelined with
//! `WAIT 1`), in interleaved rounds of the same run; and each master's Redis
//! CPU per spend (`INFO cpu` and `INFO commandstats` deltas), from which the
//! cluster's ceiling on hardware with a core per master can be computed.
//!
//! On a 2-core machine the cluster cannot show its scaling: six servers,
//! their replication and the client share two cores, so its spends/s here
//! say what a cluster costs per spend, not what it can carry.

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Limiter, Quotas};
use serde::Serialize;
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Plan, TIMEOUT, drive, median, percentiles, thousands};
use crate::report::{Section, Target};
use crate::support::cluster::{self, Cluster};
use crate::support::{
    ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window, wait_until,
};

/// Credentials the spends spread over, round robin.
const CREDENTIALS: usize = 100;

/// 100 credentials with a window no run fills, an endpoint each; on the
/// cluster of `nodes` when there are any.
fn config(nodes: &[String], replicas: u8) -> TestConfig {
    let mut b = ConfigBuilder::new().key_prefix("qwcl").redis_timeout("10s");
    if !nodes.is_empty() {
        b = b.quota_nodes(nodes).quota_replicas(i64::from(replicas));
    }
    for i in 0..CREDENTIALS {
        let name = format!("c{i:03}");
        b = b
            .credential(
                Credential::env(&name, "BENCH_UNUSED")
                    .window(Window::sliding(1_000_000_000_000, "1h")),
            )
            .endpoint(Endpoint::new(&name, &name, 1));
    }
    b.write()
}

/// Where the spends go, and the masters that run them.
struct Place<'a> {
    name: &'static str,
    limiter: Limiter,
    masters: Vec<&'a RedisServer>,
}

/// A master's counters: CPU seconds (user + sys) and spend script calls.
fn counters(server: &RedisServer) -> (f64, u64) {
    let cpu: String = server.cmd(&["INFO", "cpu"]);
    let field = |name: &str| -> f64 {
        cpu.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    let calls = stats
        .lines()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            l.split(&[':', ','][..])
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum();
    (field("used_cpu_user") + field("used_cpu_sys"), calls)
}

#[derive(Debug, Clone, Default, Serialize)]
struct Cell {
    rates: Vec<f64>,
    p50_us: Vec<f64>,
    p99_us: Vec<f64>,
    /// Per master, over all measured rounds: CPU seconds and spend calls.
    cpu_s: Vec<f64>,
    calls: Vec<u64>,
}

impl Cell {
    fn cpu_us_per_spend(&self) -> Vec<f64> {
        self.cpu_s
            .iter()
            .zip(&self.calls)
            .map(|(s, n)| if *n == 0 { 0.0 } else { s * 1e6 / *n as f64 })
            .collect()
    }
}

async fn round(target: &Place<'_>, plan: &Plan, cell: Option<&mut Cell>) {
    let before: Vec<(f64, u64)> = target.masters.iter().map(|m| counters(m)).collect();
    let limiter = target.limiter.clone();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (calls, secs, ns) = drive(plan.callers[0], plan.round, move || {
        let limiter = limiter.clone();
        let next = next.clone();
        async move {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % CREDENTIALS;
            common::spend_admitted(&limiter, &format!("c{i:03}"), None).await;
        }
    })
    .await;
    let Some(cell) = cell else { return };
    let after: Vec<(f64, u64)> = target.masters.iter().map(|m| counters(m)).collect();
    cell.rates.push(calls as f64 / secs);
    let lat = percentiles(&ns);
    cell.p50_us.push(lat.p50_us);
    cell.p99_us.push(lat.p99_us);
    if cell.cpu_s.is_empty() {
        cell.cpu_s = vec![0.0; after.len()];
        cell.calls = vec![0; after.len()];
    }
    for (k, (a, b)) in after.iter().zip(&before).enumerate() {
        cell.cpu_s[k] += a.0 - b.0;
        cell.calls[k] += a.1 - b.1;
    }
}

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::quick_or(
        ctx.quick,
        Plan {
            callers: vec![64],
            rounds: 3,
            round: Duration::from_millis(1500),
        },
    );
    // One Redis with a replica (for WAIT), and a 3-master cluster with one
    // replica per master, both private to this section.
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let synced = wait_until(Duration::from_secs(30), || {
        let info: String = primary.cmd(&["INFO", "replication"]);
        info.lines()
            .any(|l| l.starts_with("slave0:") && l.contains("state=online"))
    });
    assert!(synced, "the standalone replica did not sync");
    let cl = Cluster::with_replicas(3);

    let standalone_cfg = config(&[], 0);
    let standalone = Config::load(&standalone_cfg.path()).expect("bench config");
    let quotas = std::sync::Arc::new(Quotas::new(&standalone));
    let conn = common::connect(&primary).await;
    let mut targets = vec![
        Place {
            name: "standalone",
            limiter: Limiter::new(conn.clone(), quotas.clone(), TIMEOUT).without_history(),
            masters: vec![&primary],
        },
        Place {
            name: "standalone, WAIT 1",
            limiter: Limiter::new(conn, quotas, TIMEOUT)
                .without_history()
                .with_replicas(1),
            masters: vec![&primary],
        },
    ];
    let masters: Vec<&RedisServer> = cl.masters().into_iter().map(|i| &cl.nodes[i]).collect();
    for (name, replicas) in [("cluster, 3 masters", 0), ("cluster, 3 masters, WAIT 1", 1)] {
        let cfg = config(&cl.urls(), replicas);
        let c = Config::load(&cfg.path()).expect("bench cluster config");
        targets.push(Place {
            name,
            limiter: cluster::limiter(&c).await,
            masters: masters.clone(),
        });
    }

    let mut cells = vec![Cell::default(); targets.len()];
    // Round 0 warms every target up (connections, script caches) and is dropped.
    for r in 0..plan.rounds + 1 {
        for (t, cell) in targets.iter().zip(cells.iter_mut()) {
            round(t, &plan, (r > 0).then_some(cell)).await;
        }
    }
    drop(replica);

    let rate = |k: usize| median(cells[k].rates.clone());
    let p50 = |k: usize| median(cells[k].p50_us.clone());
    let p99 = |k: usize| median(cells[k].p99_us.clone());
    let mut md = format!(
        "Spends/s and latency of `Limiter::spend` at {} callers, each spend on the next of {CREDENTIALS} \
         credentials (cost 1, windows that never fill), median of {} interleaved rounds of {} ms; \
         a standalone Redis with one replica, and a 3-master cluster with a replica per master \
         (`cluster-node-timeout` 2 s), all on this machine. CPU per spend: each master's \
         `used_cpu_user + used_cpu_sys` delta ÷ its spend script calls (`INFO commandstats`) over \
         the measured rounds.\n\n\
         | target | spends/s | p50 µs | p99 µs | Redis CPU µs per spend, per master |\n\
         |---|---:|---:|---:|---|\n",
        plan.callers[0],
        plan.rounds,
        plan.round.as_millis()
    );
    let mut data = Vec::new();
    for (k, t) in targets.iter().enumerate() {
        let cpu = cells[k].cpu_us_per_spend();
        let cpu_text: Vec<String> = cpu.iter().map(|c| format!("{c:.1}")).collect();
        let share: Vec<String> = cells[k]
            .calls
            .iter()
            .map(|n| thousands(*n as f64))
            .collect();
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} (spends: {}) |\n",
            t.name,
            thousands(rate(k)),
            thousands(p50(k)),
            thousands(p99(k)),
            cpu_text.join(" / "),
            share.join(" / ")
        ));
        data.push(json!({ "target": t.name, "cell": cells[k], "cpu_us_per_spend": cpu }));
    }
    let cluster_vs = rate(2) / rate(0);
    let wait_standalone = (p50(1) - p50(0), p99(1) - p99(0));
    let wait_cluster = (p50(3) - p50(2), p99(3) - p99(2));
    let cpu_master = median(cells[2].cpu_us_per_spend());
    let ceiling = if cpu_master > 0.0 {
        1e6 / cpu_master
    } else {
        0.0
    };
    md.push_str(&format!(
        "\nCluster ÷ standalone: **{cluster_vs:.2}×** spends/s. WAIT 1 adds {:+.0} µs at p50 and {:+.0} µs at p99 \
         on the standalone Redis ({:.2}× its spends/s), {:+.0} µs and {:+.0} µs on the cluster ({:.2}×).\n\n\
         This machine cannot show the cluster's scaling: its {} cores run all six servers, their \
         replication and the client, so spends/s here are what one client process gets, not what \
         the cluster carries. On hardware with a core per master, a master saturates near \
         1 s ÷ its CPU per spend: {:.1} µs here (median over the masters, without WAIT) is about \
         **{} spends/s per master**, and with credentials spread evenly over the slots the \
         cluster carries about masters × that ({} for 3).\n",
        wait_standalone.0,
        wait_standalone.1,
        rate(1) / rate(0),
        wait_cluster.0,
        wait_cluster.1,
        rate(3) / rate(2),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_master,
        thousands(ceiling),
        thousands(3.0 * ceiling),
    ));
    eprintln!(
        "  cluster ÷ standalone {cluster_vs:.2}×; WAIT p50 +{:.0} µs (standalone) +{:.0} µs (cluster)",
        wait_standalone.0, wait_cluster.0
    );
    let spread = cells[2].calls.iter().filter(|n| **n > 0).count();
    let report_targets = vec![
        Target::new(
            "cluster: spends over 100 credentials reach every master",
            "3 of 3",
            format!("{spread} of {}", cells[2].calls.len()),
            spread == 3,
        )
        .correctness(),
    ];
    Section {
        key: "cluster",
        title: "Redis Cluster: standalone vs 3 masters, with and without WAIT (issue 15)".into(),
        markdown: md,
        data: json!({
            "callers": plan.callers[0],
            "rounds": plan.rounds,
            "round_ms": plan.round.as_millis() as u64,
            "credentials": CREDENTIALS,
            "targets": data,
            "cluster_vs_standalone": cluster_vs,
            "wait_p50_us": { "standalone": wait_standalone.0, "cluster": wait_cluster.0 },
            "wait_p99_us": { "standalone": wait_standalone.1, "cluster": wait_cluster.1 },
            "cpu_us_per_spend_per_master": cpu_master,
            "ceiling_per_master": ceiling,
        }),
        targets: report_targets,
    }
}
