//! Section `bucket`: a bucket window (leaky bucket / GCRA) against a
//! one-window sliding spend, ours both, interleaved in the same rounds over
//! the same connection: the bucket keeps one level per window but also
//! remembers request ids (for idempotent retries and settles), so it should
//! cost about what a sliding spend costs. Neither window ever fills.

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Limiter, Quotas};
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Plan, Rounds, TIMEOUT, drive, percentiles, thousands};
use crate::report::{Section, Target};
use crate::support::TestConfig;

/// A bucket no benchmark fills (a billion units a second) and a sliding hour
/// of a trillion (the anatomy section spends from the bucket too).
pub const CONFIG: &str = r#"
[redis]
key_prefix = "qwbk"

[credentials.bk]
secret_env = "BENCH_UNUSED"
windows = [{ kind = "bucket", units = 1000000000, per = "1s" }]

[credentials.sl]
secret_env = "BENCH_UNUSED"
windows = [{ units = 1000000000000, per = "1h" }]

[endpoints.bk]
credential = "bk"
cost = 1

[endpoints.sl]
credential = "sl"
cost = 1
"#;

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::quick_or(
        ctx.quick,
        Plan {
            callers: vec![8, 64],
            rounds: 3,
            round: Duration::from_millis(600),
        },
    );
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("bucket bench config");
    let mut conn = common::connect(&ctx.redis).await;
    common::flushall(&mut conn).await;
    let limiter = Limiter::new(
        conn.clone(),
        std::sync::Arc::new(Quotas::new(&config)),
        TIMEOUT,
    )
    .without_history();

    let mut md = String::from(
        "Spends/s (p50 µs) of `Limiter::spend` at N callers over one shared connection, \
         median of interleaved rounds; bucket ÷ sliding is per round (target: ≥ 0.9×, within 10%).\n\n\
         | cost | callers | bucket /s (p50 µs) | sliding, 1 window /s (p50 µs) | bucket ÷ sliding |\n\
         |---:|---:|---:|---:|---:|\n",
    );
    let mut targets = Vec::new();
    let mut data = Vec::new();
    for cost in [1u64, 100] {
        for &n in &plan.callers {
            let mut rounds = [0, 1].map(|_| Rounds {
                rates: Vec::new(),
                p50_us: Vec::new(),
            });
            for r in 0..plan.rounds + 1 {
                for (k, endpoint) in ["bk", "sl"].into_iter().enumerate() {
                    let limiter = limiter.clone();
                    let (calls, secs, ns) = drive(n, plan.round, move || {
                        let limiter = limiter.clone();
                        async move { common::spend_admitted(&limiter, endpoint, Some(cost)).await }
                    })
                    .await;
                    // Round 0 warms up and is dropped.
                    if r > 0 {
                        rounds[k].rates.push(calls as f64 / secs);
                        rounds[k].p50_us.push(percentiles(&ns).p50_us);
                    }
                }
            }
            let (ratio, lo, hi) = rounds[0].ratio(&rounds[1]);
            md.push_str(&format!(
                "| {cost} | {n} | {} ({}) | {} ({}) | **{ratio:.2}×** ({lo:.2}–{hi:.2}) |\n",
                thousands(rounds[0].median_rate()),
                thousands(rounds[0].median_p50_us()),
                thousands(rounds[1].median_rate()),
                thousands(rounds[1].median_p50_us()),
            ));
            eprintln!("  cost {cost}, {n} callers: bucket ÷ sliding {ratio:.2}×");
            if n == *plan.callers.last().expect("callers") {
                targets.push(Target::new(
                    format!(
                        "bucket window spends/s ÷ one-window sliding, cost {cost}, {n} callers"
                    ),
                    "≥ 0.9×",
                    format!(
                        "{ratio:.2}× ({} vs {} /s; rounds {lo:.2}–{hi:.2})",
                        thousands(rounds[0].median_rate()),
                        thousands(rounds[1].median_rate())
                    ),
                    ratio >= 0.9,
                ));
            }
            data.push(json!({
                "cost": cost,
                "callers": n,
                "bucket": rounds[0],
                "sliding": rounds[1],
                "bucket_vs_sliding": { "median": ratio, "min": lo, "max": hi },
            }));
        }
    }
    common::flushall(&mut conn).await;
    Section {
        key: "bucket",
        title: "Bucket windows against a sliding spend".into(),
        markdown: md,
        data: json!({
            "rounds": plan.rounds,
            "round_ms": plan.round.as_millis() as u64,
            "cells": data,
        }),
        targets,
    }
}
