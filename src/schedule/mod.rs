//! Cron schedules: when a job fires, how much it can spend per window, and
//! where a tick becomes tasks.
//!
//! - this file: fire times, and worst-case spending per window (`check`);
//! - `fan_out`: a tick's items (rows of `fan_out_from` × combinations of
//!   `fan_out`) and how they are queued in bounded chunks (the daemon's
//!   scheduler and `trigger` both use it);
//! - `source`: `fan_out_from`'s CSV and SQLite sources, read at every tick;
//! - `scheduler`: the daemon's loop that fires ticks and fans them out into
//!   the queue, each tick claimed once across daemons.

mod fan_out;
mod scheduler;
pub mod source;

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{Config, Job, Window, WindowKind};

pub use fan_out::{FanOutCause, FanOutError, Fanned, Item, TickItems, queue_tick, tick_tasks};
pub(crate) use scheduler::Scheduler;

/// The next `n` fire times of `job` after `after`.
pub(crate) fn next_fires(job: &Job, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
    job.schedule
        .after(&after.with_timezone(&job.timezone))
        .take(n)
        .map(|t| t.with_timezone(&Utc))
        .collect()
}

/// Fire times of `job` in `[from, to)`, at most `cap` of them.
pub(crate) fn fires_between(
    job: &Job,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    cap: usize,
) -> Vec<DateTime<Utc>> {
    // `after` is exclusive: start a hair before `from`.
    let start = from - chrono::Duration::milliseconds(1);
    job.schedule
        .after(&start.with_timezone(&job.timezone))
        .map(|t| t.with_timezone(&Utc))
        .take_while(|t| *t < to)
        .take(cap)
        .collect()
}

const TICK_CAP: usize = 200_000;

/// The most ticks of `job` in any span `per` long, over the next two spans
/// (or a week, whichever is longer). Schedules too dense to enumerate are
/// extrapolated from their rate.
pub(crate) fn worst_ticks(job: &Job, per: Duration, from: DateTime<Utc>) -> u64 {
    let per_c = chrono::Duration::from_std(per).unwrap_or(chrono::Duration::MAX);
    let horizon = per_c.max(chrono::Duration::hours(84)) * 2;
    let fires = fires_between(job, from, from + horizon, TICK_CAP);
    if fires.len() == TICK_CAP {
        let span = (fires[fires.len() - 1] - fires[0])
            .num_milliseconds()
            .max(1) as f64;
        let rate = fires.len() as f64 / span;
        return (rate * per.as_millis() as f64).ceil() as u64;
    }
    let mut best = 0;
    let mut j = 0;
    for i in 0..fires.len() {
        while j < fires.len() && fires[j] < fires[i] + per_c {
            j += 1;
        }
        best = best.max(j - i);
    }
    best as u64
}

/// Worst-case units one run of `job` spends: items × max pages × cost.
pub(crate) fn worst_per_run(config: &Config, job: &Job) -> u64 {
    let cost = config.endpoints[&job.endpoint].cost.get();
    job.items()
        .saturating_mul(u64::from(job.max_pages()))
        .saturating_mul(cost)
}

/// When, starting from an empty window at `from` (for a fixed window: its next
/// reset), the worst-case spending of `jobs` on `window` would run out: the
/// first tick that no longer fits, and its job.
pub(crate) fn exhausted_at<'a>(
    config: &Config,
    jobs: &[&'a Job],
    window: &Window,
    from: DateTime<Utc>,
) -> Option<(DateTime<Utc>, &'a Job)> {
    let start = match &window.kind {
        WindowKind::Sliding => from,
        WindowKind::Fixed { .. } => next_reset(window, from).unwrap_or(from),
    };
    let end = start + chrono::Duration::from_std(window.per).ok()?;
    let mut ticks: Vec<(DateTime<Utc>, &Job)> = jobs
        .iter()
        .flat_map(|j| {
            fires_between(j, start, end, TICK_CAP)
                .into_iter()
                .map(move |t| (t, *j))
        })
        .collect();
    ticks.sort_by_key(|(t, _)| *t);
    let mut spent = 0u64;
    for (t, job) in ticks {
        spent = spent.saturating_add(worst_per_run(config, job));
        if spent > window.units.get() {
            return Some((t, job));
        }
    }
    None
}

/// The next reset of a fixed window after `from`.
pub(crate) fn next_reset(window: &Window, from: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let WindowKind::Fixed { reset, timezone } = &window.kind else {
        return None;
    };
    use chrono::TimeZone;
    let local = from.with_timezone(timezone).date_naive();
    let per = chrono::Duration::from_std(window.per).ok()?;
    let reset = chrono::Duration::from_std(*reset).ok()?;
    // Walk the day's period starts (and the next day's) for the first after `from`.
    for day in [local, local.succ_opt()?] {
        let midnight = day.and_hms_opt(0, 0, 0)?;
        let mut t = midnight
            + chrono::Duration::milliseconds(
                reset.num_milliseconds() % per.num_milliseconds().max(1),
            );
        while t < midnight + chrono::Duration::days(1) {
            if let Some(utc) = timezone.from_local_datetime(&t).earliest() {
                let utc = utc.with_timezone(&Utc);
                if utc > from {
                    return Some(utc);
                }
            }
            t += per.min(chrono::Duration::days(1));
        }
    }
    None
}
