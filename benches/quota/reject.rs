//! Section `reject`: what a refused spend costs, at cost 1 and at cost 100,
//! on a window full of cost-1 entries (10,000 of them) and on one full of
//! cost-100 entries (100 of them), the same 10,000 units. Rejections are what
//! every worker and every other-language client sends while a quota is
//! exhausted, so they must not cost more for a bigger spend: spend.lua finds
//! the entry that frees `need` units with one lookup on positions, O(log n)
//! whatever the cost (the script before issue 11 read up to `cost` entries).
//!
//! Beside ours, in the same rounds over the same connection:
//! - the naive weighted log (`benches/baseline/naive_log.lua`, one zset
//!   member per unit, the design a published PHP weighted Lua limiter uses);
//! - a moving window on a list (`benches/baseline/moving_window_list.lua`),
//!   the algorithm the Python `limits` library documents, written here from
//!   that description.
//!
//! Nothing here asserts a speed; a call that is not refused panics.

use std::time::Duration;

use quota_worker::conn::Conn;
use quota_worker::conn::Lua;
use quota_worker::quota::{Decision, Limiter, request_id};
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Plan, Rounds, TIMEOUT, drive, percentiles, thousands};
use crate::growth::{NAIVE, PER_MS, PER_US, fill_naive, fill_ours, naive_key, ours_keys, quotas};
use crate::report::{Section, Target};

static MOVING: std::sync::LazyLock<Lua> =
    std::sync::LazyLock::new(|| Lua::new(include_str!("../baseline/moving_window_list.lua")));

/// Units in every window, and so in every fill.
const UNITS: u64 = 10_000;

/// A full window: its name and how it was filled.
struct Fill {
    name: &'static str,
    label: &'static str,
    entry_cost: u64,
    /// `stream-node-max-entries` while the window is filled (None: the
    /// server's default, 100): the entries a stream node holds.
    node_entries: Option<u32>,
}

/// The node size docs/redis.md ("Stream node size") offers for a Redis
/// with windows of many small entries.
const SMALL_NODES: u32 = 32;

const FILLS: [Fill; 3] = [
    Fill {
        name: "rj1",
        label: "full of 10,000 entries of 1 unit",
        entry_cost: 1,
        node_entries: None,
    },
    Fill {
        name: "rj100",
        label: "full of 100 entries of 100 units",
        entry_cost: 100,
        node_entries: None,
    },
    Fill {
        name: "rj1n",
        label: "full of 10,000 entries of 1 unit, stream-node-max-entries 32",
        entry_cost: 1,
        node_entries: Some(SMALL_NODES),
    },
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Imp {
    Ours,
    Naive,
    Moving,
}

impl Imp {
    const ALL: [Imp; 3] = [Imp::Ours, Imp::Naive, Imp::Moving];

    fn key(self) -> &'static str {
        match self {
            Imp::Ours => "ours",
            Imp::Naive => "naive weighted log",
            Imp::Moving => "moving window (list)",
        }
    }
}

fn list_key(name: &str) -> String {
    format!("mw:{{{name}}}:list")
}

/// One refused spend of `cost` by `imp` on window `name`.
async fn refuse(limiter: &Limiter, conn: &mut Conn, imp: Imp, name: &str, cost: u64) {
    let allowed = match imp {
        Imp::Ours => {
            let d = limiter
                .spend(name, Some(cost), &request_id())
                .await
                .expect("spend");
            !matches!(d, Decision::Rejected(_))
        }
        Imp::Naive => {
            let r: Vec<i64> = NAIVE
                .call()
                .key(naive_key(name))
                .arg(request_id())
                .arg(cost)
                .arg(UNITS)
                .arg(PER_MS)
                .invoke(conn)
                .await
                .expect("naive spend");
            r[0] == 1
        }
        Imp::Moving => {
            let r: Vec<i64> = MOVING
                .call()
                .key(list_key(name))
                .arg(UNITS)
                .arg(PER_MS)
                .arg(cost)
                .invoke(conn)
                .await
                .expect("moving window spend");
            r[0] == 1
        }
    };
    assert!(
        !allowed,
        "{}: a spend on a full window was admitted",
        imp.key()
    );
}

/// Fills the list of the moving window with `n` timestamps (seconds, as it
/// stores them), newest first, spread over [from, to) µs.
async fn fill_list(conn: &mut Conn, key: &str, n: usize, from_us: i64, to_us: i64) {
    for first in (0..n).step_by(1_000) {
        let mut cmd = redis::cmd("RPUSH");
        cmd.arg(key);
        for i in first..(first + 1_000).min(n) {
            // RPUSH from the newest: index 0 is the newest.
            let at = to_us - (to_us - from_us) * i as i64 / n as i64;
            cmd.arg(at as f64 / 1e6);
        }
        let _: i64 = cmd.query_async(conn).await.expect("fill the list");
    }
    let _: bool = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(PER_MS)
        .query_async(conn)
        .await
        .expect("PEXPIRE");
}

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::quick_or(
        ctx.quick,
        Plan {
            callers: vec![1, 64],
            rounds: 3,
            round: Duration::from_millis(500),
        },
    );
    let mut conn = common::connect(&ctx.redis).await;
    common::flushall(&mut conn).await;
    let q = quotas(&FILLS.map(|f| (f.name, UNITS)));
    let limiter = Limiter::new(conn.clone(), q.clone(), TIMEOUT).without_history();

    // Every window exactly full, its entries spread over the last 30 minutes.
    // A stream's nodes are cut as it grows: the node size in force while a
    // window is filled is the one its stream keeps.
    let default_nodes = common::config_get(&mut conn, "stream-node-max-entries").await;
    let mut entry_bytes = Vec::new();
    for f in &FILLS {
        if let Some(n) = f.node_entries {
            common::config_set(&mut conn, "stream-node-max-entries", &n.to_string()).await;
        }
        let now = common::redis_now_us(&mut conn).await;
        let span = (now - PER_US / 2, now - 1_000_000);
        let n = (UNITS / f.entry_cost) as usize;
        fill_ours(
            &mut conn,
            &ours_keys(&q, f.name),
            7,
            n,
            f.entry_cost,
            span.0,
            span.1,
        )
        .await;
        fill_naive(
            &mut conn,
            &naive_key(f.name),
            7,
            UNITS as usize,
            span.0,
            span.1,
        )
        .await;
        fill_list(&mut conn, &list_key(f.name), UNITS as usize, span.0, span.1).await;
        common::config_set(&mut conn, "stream-node-max-entries", &default_nodes).await;
        let u = limiter.peek(f.name).await.expect("peek").windows[0].clone();
        assert_eq!((u.used, u.remaining), (UNITS, 0), "{}: full", f.name);
        if f.entry_cost == 1 {
            let bytes = common::memory_usage(&mut conn, &ours_keys(&q, f.name)[2]).await;
            entry_bytes.push((
                f.node_entries.map_or_else(
                    || format!("{default_nodes} (the default)"),
                    |n| n.to_string(),
                ),
                bytes as f64 / n as f64,
            ));
        }
    }

    let mut md = String::from(
        "Each window (sliding 1 h, 10,000 units) is exactly full; every call is refused. \
         Spends/s at N callers over one shared connection, median of interleaved rounds, p50 µs \
         in brackets; \"c100 ÷ c1\" is ours at cost 100 ÷ ours at cost 1, round by round (the \
         target: ≥ 0.9×, i.e. a bigger refused spend costs no more); \"÷ best peer\" is ours ÷ \
         the faster of the two peers at that cost.\n\n\
         | window | callers | ours, cost 1 | ours, cost 100 | c100 ÷ c1 | naive weighted log, cost 1 / 100 | moving window (list), cost 1 / 100 | ours ÷ best peer, cost 1 / 100 |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut data = Vec::new();
    let mut targets = Vec::new();
    for f in &FILLS {
        for &n in &plan.callers {
            // rounds[imp][cost index]
            let mut rounds: Vec<[Rounds; 2]> = Imp::ALL
                .iter()
                .map(|_| {
                    [0, 1].map(|_| Rounds {
                        rates: Vec::new(),
                        p50_us: Vec::new(),
                    })
                })
                .collect();
            for r in 0..plan.rounds + 1 {
                for (k, imp) in Imp::ALL.iter().enumerate() {
                    for (ci, cost) in [1u64, 100].into_iter().enumerate() {
                        let (limiter, conn) = (limiter.clone(), conn.clone());
                        let (imp, name) = (*imp, f.name);
                        let (calls, secs, ns) = drive(n, plan.round, move || {
                            let (limiter, mut conn) = (limiter.clone(), conn.clone());
                            async move { refuse(&limiter, &mut conn, imp, name, cost).await }
                        })
                        .await;
                        // Round 0 warms up (scripts, connections) and is dropped.
                        if r > 0 {
                            rounds[k][ci].rates.push(calls as f64 / secs);
                            rounds[k][ci].p50_us.push(percentiles(&ns).p50_us);
                        }
                    }
                }
            }
            let cell = |k: usize, ci: usize| {
                format!(
                    "{} ({})",
                    thousands(rounds[k][ci].median_rate()),
                    thousands(rounds[k][ci].median_p50_us())
                )
            };
            let (c, c_lo, c_hi) = rounds[0][1].ratio(&rounds[0][0]);
            let best = |ci: usize| {
                let (a, b) = (&rounds[1][ci], &rounds[2][ci]);
                if a.median_rate() >= b.median_rate() {
                    a
                } else {
                    b
                }
            };
            let vs_peer = [0, 1].map(|ci| rounds[0][ci].ratio(best(ci)).0);
            md.push_str(&format!(
                "| {} | {n} | {} | {} | **{c:.2}×** ({c_lo:.2}–{c_hi:.2}) | {} / {} | {} / {} | {:.2}× / {:.2}× |\n",
                f.label,
                cell(0, 0),
                cell(0, 1),
                thousands(rounds[1][0].median_rate()),
                thousands(rounds[1][1].median_rate()),
                thousands(rounds[2][0].median_rate()),
                thousands(rounds[2][1].median_rate()),
                vs_peer[0],
                vs_peer[1],
            ));
            eprintln!(
                "  {} at {n} callers: ours {} / {} per s (c100 ÷ c1 {c:.2}×)",
                f.label,
                thousands(rounds[0][0].median_rate()),
                thousands(rounds[0][1].median_rate())
            );
            if n == *plan.callers.last().expect("callers") {
                targets.push(Target::new(
                    format!(
                        "refused spends/s, cost 100 ÷ cost 1, window {}, {n} callers",
                        f.label
                    ),
                    "≥ 0.9×",
                    format!("{c:.2}× (rounds {c_lo:.2}–{c_hi:.2})"),
                    c >= 0.9,
                ));
            }
            data.push(json!({
                "window": f.label,
                "entry_cost": f.entry_cost,
                "callers": n,
                "ours_cost_100_vs_cost_1": { "median": c, "min": c_lo, "max": c_hi },
                "ours_vs_best_peer": { "cost_1": vs_peer[0], "cost_100": vs_peer[1] },
                "rounds": Imp::ALL.iter().zip(&rounds).map(|(imp, r)| json!({
                    "implementation": imp.key(),
                    "cost_1": r[0],
                    "cost_100": r[1],
                })).collect::<Vec<_>>(),
            }));
        }
    }
    md.push_str(
        "\nPeers: the naive weighted log is one zset member per unit (ZREMRANGEBYSCORE + ZCARD, and \
         for the retry-after one ZRANGE by rank); the moving window keeps one list entry per unit, \
         newest first, and refuses when the entry at index limit − cost is younger than the window \
         (one LINDEX; it gives no exact weighted retry-after). Neither has request ids, settle, \
         blocks or several windows in one call.\n",
    );
    md.push_str(&format!(
        "\nA stream keeps its entries in nodes of up to `stream-node-max-entries`, and `XRANGE` walks \
         a node from its first entry to the one it returns: a refusal at cost 1 finds its entry at \
         the head of the oldest node, one at cost 100 on cost-1 entries 100 entries on. With \
         smaller nodes the walk is shorter and the stream larger; bytes per entry of the windows \
         of cost-1 entries above (`MEMORY USAGE` of the stream ÷ its entries): {}.\n",
        entry_bytes
            .iter()
            .map(|(nodes, b)| format!("{b:.1} B with {nodes} per node"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    common::flushall(&mut conn).await;
    Section {
        key: "reject",
        title: "Refused spends: cost 1 and cost 100 on full windows".into(),
        markdown: md,
        data: json!({
            "units": UNITS,
            "rounds": plan.rounds,
            "round_ms": plan.round.as_millis() as u64,
            "stream_bytes_per_entry": entry_bytes
                .iter()
                .map(|(nodes, b)| json!({ "stream_node_max_entries": nodes, "bytes": b }))
                .collect::<Vec<_>>(),
            "cells": data,
        }),
        targets,
    }
}
