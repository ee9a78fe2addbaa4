//! Section `memory`: Redis bytes per admitted call, `lua/spend.lua` against
//! the naive log (one zset member per unit), at cost 1 and cost 100, after
//! 10,000 calls into one sliding 1h window.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use quota_worker::conn::Conn;
use quota_worker::quota::{Limiter, request_id};
use serde_json::json;

use crate::Ctx;
use crate::common::{self, TIMEOUT, thousands};
use crate::growth::{
    HUGE, clock_key, naive_key, naive_spend, ours_keys, quotas, stream_len, unlink, used_units,
    zcard,
};
use crate::report::{Section, Target};

const CRED: &str = "mem";

struct Plan {
    calls: usize,
    clients: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        Plan {
            calls: if quick { 500 } else { 10_000 },
            clients: 8,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Imp {
    Ours,
    Naive,
}

impl Imp {
    fn name(self) -> &'static str {
        match self {
            Imp::Ours => "spend.lua",
            Imp::Naive => "naive log",
        }
    }
}

/// What one implementation holds after the calls.
struct Measured {
    keys: usize,
    usage: i64,
    per_call: f64,
    used_memory_per_call: f64,
    secs: f64,
}

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::new(ctx.quick);
    let q = quotas(&[(CRED, HUGE), ("warm", HUGE)]);
    let mut admin = common::connect(&ctx.redis).await;
    common::flushall(&mut admin).await;

    let mut clients = Vec::new();
    for _ in 0..plan.clients {
        let conn = common::connect(&ctx.redis).await;
        clients.push((
            Limiter::new(conn.clone(), q.clone(), TIMEOUT).without_history(),
            conn,
        ));
    }
    // Both scripts cached and every connection used before anything counts.
    for (limiter, conn) in &mut clients {
        assert!(
            limiter
                .spend("warm", Some(1), &request_id())
                .await
                .expect("spend")
                .is_allowed()
        );
        assert!(
            naive_spend(conn, &naive_key("warm"), &request_id(), 1, HUGE)
                .await
                .0
        );
    }
    common::flushall(&mut admin).await;

    let ours = ours_keys(&q, CRED);
    let naive = vec![naive_key(CRED)];
    let mut rows = Vec::new();
    for cost in [1u64, 100] {
        for imp in [Imp::Ours, Imp::Naive] {
            let keys = if imp == Imp::Ours { &ours } else { &naive };
            let m = measure(&plan, &mut admin, &clients, imp, cost, keys).await;
            eprintln!(
                "  cost {cost}, {}: {:.1} B/call ({:.1} s)",
                imp.name(),
                m.per_call,
                m.secs
            );
            rows.push((cost, imp, m));
        }
    }
    // The credential's clock key: one per credential, whatever the calls.
    let clock = {
        let c = clients[0].0.clone();
        let _ = c.spend(CRED, Some(1), &request_id()).await.expect("spend");
        common::memory_usage(&mut admin, &clock_key(&q, CRED)).await
    };
    common::flushall(&mut admin).await;

    let per_call = |cost: u64, imp: Imp| {
        rows.iter()
            .find(|(c, i, _)| *c == cost && *i == imp)
            .map(|(_, _, m)| m.per_call)
            .expect("measured")
    };
    let pct = |cost: u64| 100.0 * per_call(cost, Imp::Ours) / per_call(cost, Imp::Naive);

    let mut md = format!(
        "Method: {} calls admitted by {} concurrent clients into one sliding 1h window (limit never reached): \
         spend.lua through `Limiter::spend`, the naive log through `naive_log.lua`; then `MEMORY USAGE key SAMPLES 0` \
         summed over the window's keys (spend.lua: the `meta` string, `log` zset, `ts` stream and `adj` zset; naive: one zset), \
         and `used_memory` before/after, each divided by the calls.\n\n\
         | cost | implementation | keys | MEMORY USAGE, bytes | bytes / call | used_memory Δ / call | spend.lua ÷ naive |\n\
         |---:|---|---:|---:|---:|---:|---:|\n",
        thousands(plan.calls as f64),
        plan.clients
    );
    let mut data_rows = Vec::new();
    for (cost, imp, m) in &rows {
        let rel = if *imp == Imp::Ours {
            format!("**{:.2}%**", pct(*cost))
        } else {
            "".into()
        };
        md.push_str(&format!(
            "| {cost} | {} | {} | {} | {:.1} | {:.1} | {rel} |\n",
            imp.name(),
            m.keys,
            thousands(m.usage as f64),
            m.per_call,
            m.used_memory_per_call
        ));
        data_rows.push(json!({
            "cost": cost,
            "implementation": imp.name(),
            "keys": m.keys,
            "memory_usage_bytes": m.usage,
            "bytes_per_call": m.per_call,
            "used_memory_delta_per_call": m.used_memory_per_call,
            "secs": m.secs,
        }));
    }
    md.push_str(&format!(
        "\nAt cost 100 spend.lua keeps **{:.2}%** of the naive log's bytes per call ({:.0}× less): one log id (request id -> position) and \
         one stream entry (position and time, a few bytes in a listpack) per call against 100 zset members. At cost 1 it keeps **{:.0}%** \
         of the naive log's ({:.2}× more): the stream entry is the price of O(log n) weighted rejections and eviction; the log id that of \
         idempotent ids and settles. The `meta` string (the window's counters) is once per window. \
         Not counted above: the credential's clock key ({clock} B here: only a fixed window writes it), once per credential.\n",
        pct(100),
        per_call(100, Imp::Naive) / per_call(100, Imp::Ours),
        pct(1),
        per_call(1, Imp::Ours) / per_call(1, Imp::Naive),
    ));

    let target = Target::new(
        "Redis bytes per admitted call, cost 100, spend.lua ÷ naive log",
        "≤ 2%",
        format!(
            "{:.2}% ({:.1} vs {} B)",
            pct(100),
            per_call(100, Imp::Ours),
            thousands(per_call(100, Imp::Naive))
        ),
        pct(100) <= 2.0,
    );

    Section {
        key: "memory",
        title: "Memory per admitted call".into(),
        markdown: md,
        data: json!({
            "calls": plan.calls,
            "clients": plan.clients,
            "window": { "kind": "sliding", "per_ms": crate::growth::PER_MS },
            "rows": data_rows,
            "ours_vs_naive_pct": { "cost_1": pct(1), "cost_100": pct(100) },
            "clock_key_bytes": clock,
        }),
        targets: vec![target],
    }
}

/// Admits `plan.calls` spends of `cost` by `imp` from all clients, checks the
/// window holds exactly them, and measures it; then drops the window.
async fn measure(
    plan: &Plan,
    admin: &mut Conn,
    clients: &[(Limiter, Conn)],
    imp: Imp,
    cost: u64,
    keys: &[String],
) -> Measured {
    unlink(admin, keys).await;
    let before = common::used_memory(admin).await;
    let started = std::time::Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let calls = plan.calls;
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .map(|(limiter, mut conn)| {
            let next = next.clone();
            tokio::spawn(async move {
                let nkey = naive_key(CRED);
                while next.fetch_add(1, Ordering::Relaxed) < calls {
                    let id = request_id();
                    let allowed = match imp {
                        Imp::Ours => limiter
                            .spend(CRED, Some(cost), &id)
                            .await
                            .expect("spend")
                            .is_allowed(),
                        Imp::Naive => naive_spend(&mut conn, &nkey, &id, cost, HUGE).await.0,
                    };
                    assert!(allowed, "{} rejected a spend on a huge window", imp.name());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
    let secs = started.elapsed().as_secs_f64();
    let after = common::used_memory(admin).await;

    // Exactly the admitted calls are in the window.
    let n = calls as i64;
    match imp {
        Imp::Ours => {
            let limiter = &clients[0].0;
            assert_eq!(used_units(limiter, CRED).await, n as u64 * cost, "used");
            assert_eq!(zcard(admin, &keys[1]).await, n, "log ids");
            assert_eq!(stream_len(admin, keys).await, n, "stream entries");
        }
        Imp::Naive => {
            assert_eq!(
                zcard(admin, &keys[0]).await,
                n * cost as i64,
                "naive members"
            );
        }
    }
    let mut usage = 0;
    for k in keys {
        usage += common::memory_usage(admin, k).await;
    }
    // Freed inline, so the next `used_memory` baseline is already settled.
    common::del(admin, keys).await;
    Measured {
        keys: keys.len(),
        usage,
        per_call: usage as f64 / calls as f64,
        used_memory_per_call: (after - before) as f64 / calls as f64,
        secs,
    }
}
