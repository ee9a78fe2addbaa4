//! Section `bucket`: a bucket window (leaky bucket / GCRA) against a
//! one-window sliding spend, ours both, interleaved in the same rounds over
//! the same connection: the bucket keeps one level per window but also
//! remembers request ids (for idempotent retries and settles), so it should
//! cost about what a sliding spend costs. Neither window ever fills.

use std::time::Duration;

use serde_json::json;

use crate::Ctx;
use crate::common::{self, Plan, VersusSliding};
use crate::report::Section;
use crate::support::{TestConfig, Window};

/// A bucket no benchmark fills (a billion units a second) and a sliding hour
/// of a trillion (the anatomy section spends from the bucket too).
pub fn config() -> TestConfig {
    common::versus_sliding("qwbk", "bk", Window::bucket(1_000_000_000, "1s"))
}

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::quick_or(
        ctx.quick,
        Plan {
            callers: vec![8, 64],
            rounds: 3,
            round: Duration::from_millis(600),
        },
    );
    let (limiter, mut conn) = common::limiter_on(&ctx.redis, &config()).await;
    let mut table = VersusSliding::new(
        "bucket",
        "bucket window spends/s",
        "Spends/s (p50 µs) of `Limiter::spend` at N callers over one shared connection, \
         median of interleaved rounds; bucket ÷ sliding is per round (target: ≥ 0.9×, within 10%).\n\n\
         | cost | callers | bucket /s (p50 µs) | sliding, 1 window /s (p50 µs) | bucket ÷ sliding |\n\
         |---:|---:|---:|---:|---:|\n"
            .into(),
    );
    for cost in [1u64, 100] {
        for &n in &plan.callers {
            let l = limiter.clone();
            let r = common::rounds(&plan, n, ["bk", "sl"], move |endpoint| {
                let l = l.clone();
                async move { common::spend_admitted(&l, endpoint, Some(cost)).await }
            })
            .await;
            let last = n == *plan.callers.last().expect("callers");
            table.row(cost, n, last, &r);
        }
    }
    common::flushall(&mut conn).await;
    Section {
        key: "bucket",
        title: "Bucket windows against a sliding spend".into(),
        markdown: table.markdown,
        data: json!({
            "rounds": plan.rounds,
            "round_ms": plan.round.as_millis() as u64,
            "cells": table.data,
        }),
        targets: table.targets,
    }
}
