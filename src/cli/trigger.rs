//! `quota-worker trigger JOB [--wait]`: enqueues one tick of JOB now; with
//! `--wait`, shows a progress bar until its tasks end, then a one-line summary.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::Exit;
use crate::config::{Config, fmt_duration};
use crate::daemon::tick_tasks;
use crate::keys::KeySpace;
use crate::queue::{Origin, Queue};
use crate::stats::OutcomeKind;

/// Outcomes that end a task's chain (retrying and deferred do not).
const TERMINAL: [OutcomeKind; 5] = [
    OutcomeKind::Done,
    OutcomeKind::QuotaExhausted,
    OutcomeKind::UpstreamThrottled,
    OutcomeKind::Failed,
    OutcomeKind::Superseded,
];

/// Runs the command.
pub async fn run(config: &Config, job_name: &str, wait: bool) -> Exit {
    let Some(job) = config.jobs.get(job_name) else {
        let known: Vec<_> = config.jobs.keys().map(String::as_str).collect();
        eprintln!(
            "error: unknown job {job_name:?} (known: {})",
            known.join(", ")
        );
        return Exit::Usage;
    };
    let url = super::redis_url(config);
    let conn = match crate::conn::connect(&url, Duration::from_secs(5), 1).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot reach Redis at {url}: {e}");
            return Exit::Unavailable;
        }
    };
    let keys = KeySpace::new(config.redis.key_prefix.clone());
    let queue = Queue::new(conn.clone(), keys.clone(), config.worker.recover_after);
    let who = format!("trigger:{}", crate::quota::request_id());
    // A manual tick is "now"; on the rare clash with a tick already claimed
    // at that very millisecond, take the next one.
    let mut tick = chrono::Utc::now().timestamp_millis();
    let n = loop {
        let tasks = tick_tasks(job, tick, Origin::Trigger);
        match queue.enqueue_tick(&job.name, tick, &tasks, &who).await {
            Ok(Some(n)) => break n,
            Ok(None) => tick += 1,
            Err(e) => {
                eprintln!("error: cannot enqueue: {e}");
                return Exit::Unavailable;
            }
        }
    };
    println!("queued {n} task(s) of job {} (tick {tick})", job.name);
    if !wait {
        return Exit::Ok;
    }
    let total = job.items();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} ended  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let outcomes_key = keys.tick_outcomes(&job.name, tick);
    let mut conn = conn;
    let mut quiet_for = 0u32;
    loop {
        let counts: std::collections::HashMap<String, u64> =
            match redis::AsyncCommands::hgetall(&mut conn, &outcomes_key).await {
                Ok(c) => c,
                Err(e) => {
                    // Not through the bar: it draws nothing when stderr is
                    // not a terminal (scripts, CI), and this must be seen.
                    bar.finish_and_clear();
                    eprintln!("error: lost Redis at {url} while waiting for tick {tick}: {e}");
                    return Exit::Unavailable;
                }
            };
        let ended: u64 = TERMINAL
            .iter()
            .map(|k| counts.get(k.as_str()).copied().unwrap_or(0))
            .sum();
        let summary = summarize(&counts);
        bar.set_position(ended.min(total));
        bar.set_message(summary.clone());
        if ended >= total {
            bar.finish_and_clear();
            let retry = counts
                .get("#retry_after_ms")
                .filter(|_| {
                    counts.contains_key("quota_exhausted")
                        || counts.contains_key("upstream_throttled")
                })
                .map(|ms| {
                    format!(
                        " (retry after {})",
                        fmt_duration(Duration::from_millis(*ms))
                    )
                })
                .unwrap_or_default();
            println!(
                "{} tick {tick}: {total} task(s) ended: {summary}{retry}",
                job.name
            );
            return Exit::Ok;
        }
        if ended == 0 && counts.keys().all(|k| k.starts_with('#')) {
            quiet_for += 1;
            if quiet_for == 50 {
                // `bar.println` is a no-op on a hidden bar (stderr not a
                // terminal): the hint must reach scripts and CI logs too.
                bar.suspend(|| {
                    eprintln!(
                        "no task has ended yet: is a `quota-worker run` daemon running on this Redis?"
                    )
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn summarize(counts: &std::collections::HashMap<String, u64>) -> String {
    let mut parts: Vec<String> = OutcomeKind::ALL
        .iter()
        .filter(|k| **k != OutcomeKind::Retrying)
        .filter_map(|k| {
            counts
                .get(k.as_str())
                .map(|n| format!("{n} {}", k.as_str()))
        })
        .collect();
    for (field, label) in [("~retrying", "retries"), ("~deferred", "deferrals")] {
        if let Some(n) = counts.get(field) {
            parts.push(format!("{n} {label}"));
        }
    }
    if parts.is_empty() {
        "waiting for workers".into()
    } else {
        parts.join(", ")
    }
}
