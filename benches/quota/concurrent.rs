//! Section `concurrent`: a concurrent window's admission (issue 25) beside a
//! one-window sliding spend, ours both, interleaved in the same rounds over
//! the same connection; then what it costs a request: on an endpoint with a
//! concurrent window the daemon settles every request (to return its
//! lease), so a request takes a spend and a settle where a sliding-only
//! endpoint's takes the spend alone. Neither window ever fills; the
//! concurrent one holds 10,000 leases before the first round (a crowd of
//! requests in flight) and more as the rounds admit without returning.

use std::time::Duration;

use quota_worker::quota::{Limiter, request_id};
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Plan, VersusSliding};
use crate::report::Section;
use crate::support::{TestConfig, Window};

/// A concurrent window no benchmark fills (a trillion units in flight,
/// leases of an hour) and a sliding hour of a trillion.
pub fn config() -> TestConfig {
    let window = Window::concurrent(1_000_000_000_000).lease("1h");
    common::versus_sliding("qwcc", "cc", window)
}

/// The concurrent endpoint and the sliding one, in the order the tables
/// compare them.
const ENDPOINTS: [&str; 2] = ["cc", "sl"];

/// Leases held before the first round.
const HELD: u64 = 10_000;

/// One call of what a request costs the limiter: the concurrent
/// endpoint's spend and the settle that returns its lease, or the sliding
/// endpoint's spend alone.
async fn request(limiter: &Limiter, endpoint: &str) {
    let id = request_id();
    let d = limiter.spend(endpoint, None, &id).await.expect("spend");
    assert!(
        d.is_allowed(),
        "{endpoint}: {d:?} on a window that never fills"
    );
    if endpoint == "cc" {
        let n = limiter.settle(endpoint, &id, 1).await.expect("settle");
        assert_eq!(n, 1, "the lease was held");
    }
}

/// The section: takes the held leases, then the admit table, then the
/// request table. Over 80 lines because it is the two tables and their
/// report text in the order the report prints them, as the other sections'
/// `run`s; the calls themselves are `common::rounds` and `request`.
pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::quick_or(
        ctx.quick,
        Plan {
            callers: vec![8, 64],
            rounds: 5,
            round: Duration::from_millis(600),
        },
    );
    let (limiter, mut conn) = common::limiter_on(&ctx.redis, &config()).await;
    let held = if ctx.quick { 100 } else { HELD };
    {
        let limiter = limiter.clone();
        let left = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(held));
        // 32 callers until `held` leases are taken.
        let fill = (0..32).map(|_| {
            let (limiter, left) = (limiter.clone(), left.clone());
            tokio::spawn(async move {
                use std::sync::atomic::Ordering;
                while left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    common::spend_admitted(&limiter, "cc", None).await;
                }
            })
        });
        for f in fill.collect::<Vec<_>>() {
            f.await.expect("fill");
        }
    }
    let leases = || async {
        let u = limiter.peek("cc").await.expect("peek");
        u.windows[0].leases
    };
    assert_eq!(leases().await, held, "the window holds the leases taken");

    let mut table = VersusSliding::new(
        "concurrent",
        "concurrent window admits/s",
        format!(
            "Spends/s (p50 µs) of `Limiter::spend` at N callers over one shared connection, \
             median of {} interleaved rounds of {} ms; concurrent ÷ sliding is per round \
             (target: ≥ 0.9×, within 10%). The concurrent window held {held} leases before the \
             first round and keeps every lease admitted (none returned).\n\n\
             | cost | callers | concurrent /s (p50 µs) | sliding, 1 window /s (p50 µs) | concurrent ÷ sliding |\n\
             |---:|---:|---:|---:|---:|\n",
            plan.rounds,
            plan.round.as_millis()
        ),
    );
    for cost in [1u64, 100] {
        for &n in &plan.callers {
            let l = limiter.clone();
            let r = common::rounds(&plan, n, ENDPOINTS, move |endpoint| {
                let l = l.clone();
                async move { common::spend_admitted(&l, endpoint, Some(cost)).await }
            })
            .await;
            let last = n == *plan.callers.last().expect("callers");
            table.row(cost, n, last, &r);
        }
    }
    let VersusSliding {
        mut markdown,
        targets,
        data,
        ..
    } = table;
    let after = leases().await;

    // A request's limiter calls: spend + settle against spend alone.
    markdown.push_str(&format!(
        "\nWhat a request costs the limiter, in requests/s (p50 µs per request): on the \
         concurrent endpoint a spend and the settle that returns its lease (two calls, as the \
         daemon makes them), on the sliding-only one the spend alone (the daemon settles it only \
         when the upstream reports another cost). Leases held during the table above: {held} \
         to {after}.\n\n\
         | callers | concurrent: spend + settle /s (p50 µs) | sliding: spend /s (p50 µs) | concurrent ÷ sliding |\n\
         |---:|---:|---:|---:|\n",
    ));
    let mut pairs = Vec::new();
    for &n in &plan.callers {
        let l = limiter.clone();
        let r = common::rounds(&plan, n, ENDPOINTS, move |endpoint| {
            let l = l.clone();
            async move { request(&l, endpoint).await }
        })
        .await;
        let (cells, (ratio, lo, hi)) = common::versus_cells(&r);
        markdown.push_str(&format!("| {n} | {cells} |\n"));
        eprintln!("  requests, {n} callers: concurrent ÷ sliding {ratio:.2}×");
        pairs.push(json!({
            "callers": n, "concurrent_spend_settle": r[0], "sliding_spend": r[1],
            "concurrent_vs_sliding": { "median": ratio, "min": lo, "max": hi },
        }));
    }
    assert_eq!(leases().await, after, "every settled lease was returned");
    common::flushall(&mut conn).await;
    Section {
        key: "concurrent",
        title: "Concurrent windows against a sliding spend (issue 25)".into(),
        markdown,
        data: json!({
            "rounds": plan.rounds,
            "round_ms": plan.round.as_millis() as u64,
            "leases_held": { "before": held, "after_admits": after },
            "admits": data,
            "requests": pairs,
        }),
        targets,
    }
}
