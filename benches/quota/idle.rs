//! Section `idle`: the first spend after an idle gap, when the window's
//! entries have expired. A wholly expired window is dropped in O(1); a
//! window whose oldest 100k entries expired under 1k live ones moves its
//! base past them in O(log n) (bisection on positions) and drops their
//! stream entries by whole nodes; their ids leave the log 1,024 per call
//! over the next calls. Target: at least as fast as the naive log's first
//! spend with live entries mixed in.

use std::time::Instant;

use quota_worker::conn::Conn;
use quota_worker::quota::{Limiter, request_id};
use serde_json::json;

use crate::Ctx;
use crate::common::{self, TIMEOUT, median, min_max, thousands};
use crate::growth::{
    HUGE, PER_US, fill_naive, fill_ours, ms, naive_key, naive_spend, ours_keys, quotas, short,
    stream_len, unlink, used_units, wait_lazyfree, zcard,
};
use crate::report::{Section, Target};

const CRED: &str = "idle";
/// Live entries beside the expired ones in the batched cases.
const LIVE: usize = 1_000;

struct Plan {
    /// Expired cost-1 entries of the 100k cases.
    n: usize,
    reps: usize,
    /// Whether to run the 1M wholly expired case.
    big: bool,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                n: 10_000,
                reps: 1,
                big: false,
            }
        } else {
            Plan {
                n: 100_000,
                reps: 3,
                big: true,
            }
        }
    }
}

/// One idle-gap case: `expired` spends of `cost` units, all older than the
/// window, then `live` spends of 1 unit within it.
struct Gap {
    key: String,
    label: String,
    expired: usize,
    cost: u64,
    live: usize,
}

/// Times of one repetition, ms.
#[derive(Default)]
struct Rep {
    first: f64,
    next: f64,
    naive_first: f64,
    naive_next: f64,
}

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::new(ctx.quick);
    let q = quotas(&[(CRED, HUGE)]);
    let mut conn = common::connect(&ctx.redis).await;
    common::flushall(&mut conn).await;
    let limiter = Limiter::new(conn.clone(), q.clone(), TIMEOUT).without_history();
    let keys = ours_keys(&q, CRED);
    let nkey = naive_key(CRED);
    let mut all = keys.clone();
    all.push(nkey.clone());
    // Scripts cached before anything is timed.
    assert!(
        limiter
            .spend(CRED, Some(1), &request_id())
            .await
            .expect("spend")
            .is_allowed()
    );
    assert!(
        naive_spend(&mut conn, &nkey, &request_id(), 1, HUGE)
            .await
            .0
    );
    unlink(&mut conn, &all).await;

    let n = plan.n;
    let mut cases = vec![
        Gap {
            key: format!("expired_{n}"),
            label: format!("{} cost-1 spends, all expired (whole window)", short(n)),
            expired: n,
            cost: 1,
            live: 0,
        },
        Gap {
            key: format!("expired_{n}_live_{LIVE}"),
            label: format!(
                "{} cost-1 spends expired + {} live (batched eviction)",
                short(n),
                short(LIVE)
            ),
            expired: n,
            cost: 1,
            live: LIVE,
        },
        Gap {
            key: format!("expired_{}_cost_100_live_{LIVE}", n / 10),
            label: format!(
                "{} cost-100 spends expired + {} live (same units, weighted)",
                short(n / 10),
                short(LIVE)
            ),
            expired: n / 10,
            cost: 100,
            live: LIVE,
        },
    ];
    if plan.big {
        cases.push(Gap {
            key: "expired_1000000".into(),
            label: "1M cost-1 spends, all expired (whole window)".into(),
            expired: 1_000_000,
            cost: 1,
            live: 0,
        });
    }

    let mut md = format!(
        "Method: the window (sliding 1h) is filled straight into each layout with entries spent 1–2 h ago (expired) and, \
         in the batched cases, {} of 1 unit in the last 10 min (live); filled afresh for each repetition; \
         then one spend of cost 1 is timed (the first after the gap) and one more (the next); median of {} repetitions. After each, the units used (`quota`'s peek) and the stream's entries are checked.\n\n\
         | case | entries (spend.lua / naive) | spend.lua first spend, ms | next, ms | naive first spend, ms | next, ms | naive ÷ spend.lua, first spend | per expired entry, µs (spend.lua / naive) |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
        thousands(LIVE as f64),
        plan.reps
    );
    let mut data = Vec::new();
    for g in &cases {
        let t = Instant::now();
        let mut reps = Vec::new();
        for _ in 0..plan.reps {
            reps.push(one(&mut conn, &limiter, &keys, &nkey, g).await);
        }
        let col = |f: fn(&Rep) -> f64| reps.iter().map(f).collect::<Vec<_>>();
        let first = col(|r| r.first);
        let naive_first = col(|r| r.naive_first);
        let (f, x) = (median(first.clone()), median(col(|r| r.next)));
        let (v, vx) = (median(naive_first.clone()), median(col(|r| r.naive_next)));
        let ours_entries = g.expired + g.live;
        let naive_members = g.expired * g.cost as usize + g.live;
        md.push_str(&format!(
            "| {} | {} / {} | {f:.2} | {x:.2} | {v:.2} | {vx:.2} | {:.2}× | {} / {} |\n",
            g.label,
            thousands(ours_entries as f64),
            thousands(naive_members as f64),
            v / f,
            small(f * 1000.0 / g.expired as f64),
            small(v * 1000.0 / (g.expired * g.cost as usize) as f64),
        ));
        let (flo, fhi) = min_max(&first);
        let (vlo, vhi) = min_max(&naive_first);
        data.push(json!({
            "case": g.key,
            "label": g.label,
            "expired_entries": g.expired,
            "expired_cost": g.cost,
            "live_entries": g.live,
            "ours_entries": ours_entries,
            "naive_members": naive_members,
            "ours_first_ms": f,
            "ours_first_ms_range": [flo, fhi],
            "ours_next_ms": x,
            "naive_first_ms": v,
            "naive_first_ms_range": [vlo, vhi],
            "naive_next_ms": vx,
            "naive_vs_ours_first": v / f,
            "reps": reps.iter().map(|r| json!({
                "ours_first_ms": r.first, "ours_next_ms": r.next,
                "naive_first_ms": r.naive_first, "naive_next_ms": r.naive_next,
            })).collect::<Vec<_>>(),
        }));
        eprintln!(
            "  {}: {f:.2} / naive {v:.2} ms ({:.1} s)",
            g.label,
            t.elapsed().as_secs_f64()
        );
    }
    md.push_str(
        "\nA wholly expired window is dropped in O(1) (`UNLINK`, freed off the main thread); the naive log frees its members inline. \
         With live entries left, spend.lua finds the last expired entry by bisecting positions in its stream (O(log n), no entry read \
         but the probes), moves its base there (used stays exact without reading costs), trims the stream by whole nodes, and drops \
         the expired ids from its log 1,024 per call (the \"next\" column pays one such slice), so no call holds Redis for all of them.\n",
    );
    unlink(&mut conn, &all).await;
    common::flushall(&mut conn).await;

    let mixed = data
        .iter()
        .find(|c| c["case"] == format!("expired_{n}_live_{LIVE}"))
        .expect("the mixed case");
    let ratio = mixed["naive_vs_ours_first"].as_f64().unwrap_or(0.0);
    let target = Target::new(
        format!(
            "first spend after an idle gap, {} expired cost-1 entries + {} live: naive ÷ spend.lua",
            short(n),
            short(LIVE)
        ),
        "≥ 1×",
        format!(
            "{ratio:.2}× ({:.2} vs {:.2} ms)",
            mixed["ours_first_ms"].as_f64().unwrap_or(0.0),
            mixed["naive_first_ms"].as_f64().unwrap_or(0.0)
        ),
        ratio >= 1.0,
    );

    Section {
        key: "idle",
        title: "First spend after an idle gap".into(),
        markdown: md,
        data: json!({
            "reps": plan.reps,
            "live_entries": LIVE,
            "cases": data,
        }),
        targets: vec![target],
    }
}

/// A small positive number with 2–3 significant digits.
fn small(x: f64) -> String {
    if x >= 1.0 {
        format!("{x:.2}")
    } else if x >= 0.01 {
        format!("{x:.3}")
    } else {
        format!("{x:.5}")
    }
}

/// One repetition of a case: the window filled afresh in each layout
/// (`expired` entries spent 1–2 h ago, `live` ones in the last 10 minutes),
/// then the first and the next spend on it.
///
/// Filled afresh, not copied: a `COPY`ed zset is laid out anew in memory and
/// frees about twice as fast as a filled one, which would flatter the naive
/// log's inline eviction.
async fn one(conn: &mut Conn, limiter: &Limiter, keys: &[String], nkey: &str, g: &Gap) -> Rep {
    let mut rep = Rep::default();
    let live = g.live as i64;
    let now = common::redis_now_us(conn).await;
    // Expired: spent between 2 h and 1 h + 10 s ago; live: the last 10 min.
    let old = (now - 2 * PER_US, now - PER_US - 10_000_000);
    let recent = (now - 600_000_000, now - 1_000_000);

    fill_ours(conn, keys, 2, g.expired, g.cost, old.0, old.1).await;
    if g.live > 0 {
        fill_ours(conn, keys, 3, g.live, 1, recent.0, recent.1).await;
    }
    // (Not `used`: reading it through the script would evict before the
    // timed spend.)
    assert_eq!(
        (zcard(conn, &keys[1]).await, stream_len(conn, keys).await),
        ((g.expired + g.live) as i64, (g.expired + g.live) as i64),
        "{}: ids and entries after the fill",
        g.label
    );
    wait_lazyfree(conn).await;
    for k in 0..2 {
        let t = Instant::now();
        let d = limiter
            .spend(CRED, Some(1), &request_id())
            .await
            .expect("spend");
        let took = ms(t.elapsed());
        assert!(d.is_allowed(), "{}: spend after the gap: {d:?}", g.label);
        if k == 0 {
            rep.first = took;
        } else {
            rep.next = took;
        }
    }
    // Only the live entries and the two new spends are left, and counted.
    assert_eq!(
        used_units(limiter, CRED).await as i64,
        live + 2,
        "{}: used after eviction",
        g.label
    );
    assert_eq!(
        stream_len(conn, keys).await,
        live + 2,
        "{}: entries after eviction",
        g.label
    );
    unlink(conn, keys).await;

    // The naive log holds one member per unit.
    let members = g.expired * g.cost as usize;
    fill_naive(conn, nkey, 2, members, old.0, old.1).await;
    if g.live > 0 {
        fill_naive(conn, nkey, 3, g.live, recent.0, recent.1).await;
    }
    assert_eq!(
        zcard(conn, nkey).await,
        (members + g.live) as i64,
        "{}: naive members after the fill",
        g.label
    );
    wait_lazyfree(conn).await;
    for k in 0..2 {
        let t = Instant::now();
        let (ok, _) = naive_spend(conn, nkey, &request_id(), 1, HUGE).await;
        let took = ms(t.elapsed());
        assert!(ok, "{}: naive spend after the gap", g.label);
        if k == 0 {
            rep.naive_first = took;
        } else {
            rep.naive_next = took;
        }
    }
    assert_eq!(
        zcard(conn, nkey).await,
        live + 2,
        "{}: naive members after eviction",
        g.label
    );
    unlink(conn, &[nkey.to_owned()]).await;
    rep
}
