//! Cron schedules: when a job fires, how much it can spend per window, and
//! where a tick becomes tasks.
//!
//! - this file: fire times, and worst-case spending per window (`check`);
//! - `fan_out`: a tick's items (rows of `fan_out_from` × combinations of
//!   `fan_out`) and how they are queued in bounded chunks (the daemon's
//!   scheduler and `trigger` both use it);
//! - `source`: `fan_out_from`'s CSV and SQLite sources, read at every tick;
//! - `fairness`: the rotation that serves items starved last time first,
//!   and the starved items as Redis keeps them;
//! - `scheduler`: the daemon's loop that fires ticks and fans them out into
//!   the queue, each tick claimed once across daemons.

mod csv_rows;
mod fairness;
mod fan_out;
mod scheduler;
pub mod source;

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::config::{Config, Job, Window, WindowKind};

pub(crate) use fairness::share;
pub use fairness::{STARVED_CAP, StarvedItems, starved_items};
pub use fan_out::{FanOutCause, FanOutError, Fanned, TickItems, queue_tick, tick_tasks};
pub(crate) use scheduler::Scheduler;

/// The next `n` fire times of `job` after `after` (none for a manual job).
pub(crate) fn next_fires(job: &Job, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
    let Some(schedule) = job.schedule.cron() else {
        return Vec::new();
    };
    schedule
        .after(&after.with_timezone(&job.timezone))
        .take(n)
        .map(|t| t.with_timezone(&Utc))
        .collect()
}

/// Fire times of `job` in `[from, to)`, at most `cap` of them (none for a
/// manual job).
pub(crate) fn fires_between(
    job: &Job,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    cap: usize,
) -> Vec<DateTime<Utc>> {
    Cron::of(job).map_or_else(Vec::new, |c| c.fires(from, to, cap))
}

/// A cron schedule read in a time zone.
#[derive(Clone, Copy)]
struct Cron<'a> {
    schedule: &'a cron::Schedule,
    timezone: &'a chrono_tz::Tz,
}

impl<'a> Cron<'a> {
    /// The job's cron schedule; `None` for a manual job, which never fires
    /// by itself.
    fn of(job: &'a Job) -> Option<Self> {
        Some(Cron {
            schedule: job.schedule.cron()?,
            timezone: &job.timezone,
        })
    }

    /// Fire times in `[from, to)`, at most `cap` of them.
    fn fires(self, from: DateTime<Utc>, to: DateTime<Utc>, cap: usize) -> Vec<DateTime<Utc>> {
        // `after` is exclusive: start a hair before `from`.
        let start = minus(from, chrono::Duration::milliseconds(1));
        self.schedule
            .after(&start.with_timezone(self.timezone))
            .map(|t| t.with_timezone(&Utc))
            .take_while(|t| *t < to)
            .take(cap)
            .collect()
    }
}

/// Most fire times enumerated per scan; a denser schedule is extrapolated
/// from its rate.
const TICK_CAP: usize = 200_000;

/// How long a job's schedule takes to go through every pattern it can make,
/// by the fields it restricts (a restricted year only removes fire times):
/// times of day repeat daily; weekdays weekly; days of the month and months
/// within a leap cycle (4 years: `29 2` fires once in it); days of the month
/// *and* weekdays within the 28 years after which the calendar's weekdays and
/// leap years line up again (1901–2099, all the `cron` crate goes to).
fn period(schedule: &cron::Schedule) -> chrono::Duration {
    use cron::TimeUnitSpec;
    let dated = !schedule.days_of_month().is_all() || !schedule.months().is_all();
    let weekly = !schedule.days_of_week().is_all();
    chrono::Duration::days(match (dated, weekly) {
        (false, false) => 1,
        (false, true) => 7,
        (true, false) => 4 * 365 + 1,
        (true, true) => 28 * 365 + 7,
    })
}

/// `t + d`, or the latest time there is.
fn plus(t: DateTime<Utc>, d: chrono::Duration) -> DateTime<Utc> {
    t.checked_add_signed(d).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `t - d`, or the earliest time there is.
fn minus(t: DateTime<Utc>, d: chrono::Duration) -> DateTime<Utc> {
    t.checked_sub_signed(d).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Where the worst case of `job` per span `per` is looked for: from its next
/// fire time (which may be years away: a year field) over at least one full
/// [`period`] of its schedule and two spans. `None` when it never fires again.
fn scan_span(
    cron: Cron<'_>,
    per: chrono::Duration,
    from: DateTime<Utc>,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    let first = cron.fires(from, DateTime::<Utc>::MAX_UTC, 1).pop()?;
    let max = chrono::Duration::MAX;
    let two = per.checked_add(&per).unwrap_or(max);
    let long = two.max(period(cron.schedule).checked_add(&per).unwrap_or(max));
    Some((first, plus(first, long)))
}

/// The instants within a year after `from` where `tz`'s offset from UTC
/// changes (daylight saving time), each as the day (in UTC) it falls in.
fn offset_changes(tz: &chrono_tz::Tz, from: DateTime<Utc>) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    use chrono::{Offset, TimeZone};
    let offset = |t: DateTime<Utc>| tz.offset_from_utc_datetime(&t.naive_utc()).fix();
    let day = chrono::Duration::days(1);
    let mut changes = Vec::new();
    let mut t = from;
    for _ in 0..366 {
        let next = plus(t, day);
        if offset(t) != offset(next) {
            changes.push((t, next));
        }
        t = next;
    }
    changes
}

/// The most fire times of `fires` (sorted) in any span `per` long.
fn densest(fires: &[DateTime<Utc>], per: chrono::Duration) -> u64 {
    let mut best = 0;
    let mut j = 0;
    for i in 0..fires.len() {
        while j < fires.len() && fires[j] < plus(fires[i], per) {
            j += 1;
        }
        best = best.max(j - i);
    }
    best as u64
}

/// The most ticks of `job` in any span `per` long, from `from` on: over one
/// full period of its schedule past its next fire time ([`scan_span`]), and
/// around each daylight-saving change of its time zone within a year (a
/// daily 02:30 job fires twice within an hour when the clocks go back).
/// Schedules too dense to enumerate are extrapolated from their rate. A
/// manual job has no ticks: only `trigger` runs it.
pub(crate) fn worst_ticks(job: &Job, per: Duration, from: DateTime<Utc>) -> u64 {
    Cron::of(job).map_or(0, |c| worst_ticks_of(c, per, from))
}

fn worst_ticks_of(cron: Cron<'_>, per: Duration, from: DateTime<Utc>) -> u64 {
    let per_c = chrono::Duration::from_std(per).unwrap_or(chrono::Duration::MAX);
    let Some((first, end)) = scan_span(cron, per_c, from) else {
        return 0;
    };
    let fires = cron.fires(first, end, TICK_CAP);
    let mut best = densest(&fires, per_c);
    if fires.len() == TICK_CAP {
        // A fire time every few minutes or more often: one per real instant
        // at most, so a clock change adds next to nothing.
        let span = (fires[fires.len() - 1] - fires[0])
            .num_milliseconds()
            .max(1) as f64;
        let rate = fires.len() as f64 / span;
        return best.max((rate * per.as_millis() as f64).ceil() as u64);
    }
    for (before, after) in offset_changes(cron.timezone, first) {
        let around = cron.fires(minus(before, per_c), plus(after, per_c), TICK_CAP);
        best = best.max(densest(&around, per_c));
    }
    best
}

/// Worst-case units one run of `job` spends: items × max pages × cost.
pub(crate) fn worst_per_run(config: &Config, job: &Job) -> u64 {
    let cost = config.endpoints[&job.endpoint].cost.get();
    job.items()
        .saturating_mul(u64::from(job.max_pages()))
        .saturating_mul(cost)
}

/// When, starting from an empty window at `from` (for a fixed window: its
/// next reset), the worst-case spending of `jobs` on `window` would first
/// run out: the first tick that no longer fits, and its job. Looked for over
/// the same spans as [`worst_ticks`], every tick spending its worst case.
pub(crate) fn exhausted_at<'a>(
    config: &Config,
    jobs: &[&'a Job],
    window: &Window,
    from: DateTime<Utc>,
) -> Option<(DateTime<Utc>, &'a Job)> {
    let start = match &window.kind {
        WindowKind::Sliding | WindowKind::Bucket => from,
        WindowKind::Fixed { .. } => period_end(window, from).unwrap_or(from),
        // Units in flight come back with every answer: no schedule uses
        // them up (`check` compares the cap with the daemons' concurrency).
        WindowKind::Concurrent { .. } => return None,
    };
    let per = chrono::Duration::from_std(window.per).ok()?;
    let mut ticks: Vec<(DateTime<Utc>, &Job)> = Vec::new();
    // A schedule enumerated only up to the cap is known up to its last tick.
    let mut known_until = DateTime::<Utc>::MAX_UTC;
    for job in jobs {
        let Some((_, end)) = Cron::of(job).and_then(|c| scan_span(c, per, start)) else {
            continue;
        };
        let fires = fires_between(job, start, end, TICK_CAP);
        if fires.len() == TICK_CAP {
            known_until = known_until.min(fires[fires.len() - 1]);
        }
        ticks.extend(fires.into_iter().map(|t| (t, *job)));
    }
    ticks.retain(|(t, _)| *t <= known_until);
    ticks.sort_by_key(|(t, _)| *t);
    let units = window.units.get();
    let cost = |job: &Job| worst_per_run(config, job);
    let mut spent = 0u64;
    match &window.kind {
        WindowKind::Sliding => {
            // A spend at `t` counts until `t + per`.
            let mut oldest = 0;
            for (i, (t, job)) in ticks.iter().enumerate() {
                while plus(ticks[oldest].0, per) <= *t {
                    spent -= cost(ticks[oldest].1);
                    oldest += 1;
                }
                spent = spent.saturating_add(cost(job));
                if spent > units {
                    return Some((*t, ticks[i].1));
                }
            }
        }
        WindowKind::Bucket => {
            // Starts empty and drains continuously at `units / per`, as the
            // script's bucket does; a tick adds its worst case to the level.
            let per_ms = per.num_milliseconds().max(1) as f64;
            let (mut level, mut last) = (0f64, start);
            for (t, job) in &ticks {
                let drained = (*t - last).num_milliseconds() as f64 * units as f64 / per_ms;
                level = (level - drained).max(0.0) + cost(job) as f64;
                last = *t;
                if level > units as f64 {
                    return Some((*t, *job));
                }
            }
        }
        WindowKind::Concurrent { .. } => {}
        WindowKind::Fixed { .. } => {
            let mut reset = period_end(window, start)?;
            for (t, job) in &ticks {
                while *t >= reset {
                    spent = 0;
                    reset = period_end(window, reset)?;
                }
                spent = spent.saturating_add(cost(job));
                if spent > units {
                    return Some((*t, *job));
                }
            }
        }
    }
    None
}

/// When the period of a fixed window that holds `t` ends (its next reset),
/// counted as `lua/spend/fixed.lua` counts periods: in local wall-clock time,
/// `reset + n × per`. A reset the clocks skip comes when they skip it.
pub(crate) fn period_end(window: &Window, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    use chrono::TimeZone;
    let WindowKind::Fixed { reset, timezone } = &window.kind else {
        return None;
    };
    let wall = t
        .with_timezone(timezone)
        .naive_local()
        .and_utc()
        .timestamp_millis();
    let per = i64::try_from(window.per.as_millis()).ok()?.max(1);
    let reset = i64::try_from(reset.as_millis()).ok()?;
    let n = (wall - reset).div_euclid(per);
    let end_wall = DateTime::from_timestamp_millis((n + 1) * per + reset)?.naive_utc();
    // A wall time in a spring-forward gap: the first minute after it.
    let end = (0..=180)
        .map(|m| end_wall + chrono::Duration::minutes(m))
        .find_map(|w| timezone.from_local_datetime(&w).earliest())?
        .with_timezone(&Utc);
    Some(if end > t {
        end
    } else {
        t + chrono::Duration::milliseconds(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn worst(expr: &str, tz: chrono_tz::Tz, per: &str, from: &str) -> u64 {
        let schedule = cron::Schedule::from_str(expr).expect("cron");
        let cron = Cron {
            schedule: &schedule,
            timezone: &tz,
        };
        let per = crate::config::parse_duration(per).expect("per");
        let from = DateTime::parse_from_rfc3339(from).expect("from").to_utc();
        worst_ticks_of(cron, per, from)
    }

    const NOW: &str = "2026-11-23T00:00:00Z";
    const UTC: chrono_tz::Tz = chrono_tz::UTC;

    /// Issue 9, medium 7: the scan stopped 7 days out, so a job whose next
    /// fire time was further away counted 0 ticks.
    #[test]
    fn a_job_firing_less_often_than_weekly_counts_its_tick() {
        // The 1st of each month: next on 2026-12-01, 8 days away.
        assert_eq!(worst("0 0 0 1 * *", UTC, "24h", NOW), 1);
        // Once a year, 11 months away.
        assert_eq!(worst("0 0 12 15 10 *", UTC, "24h", NOW), 1);
        // Only on 29 February: next in 2028.
        assert_eq!(worst("0 0 0 29 2 *", UTC, "24h", NOW), 1);
        // Twice a month, 12 h apart, seen in a 1-day window.
        assert_eq!(worst("0 0 0,12 10 * *", UTC, "1d", NOW), 2);
    }

    #[test]
    fn a_year_field_counts_from_its_first_fire_and_a_schedule_that_never_fires_again_counts_0() {
        assert_eq!(worst("0 0 0 1 1 * 2031", UTC, "24h", NOW), 1);
        assert_eq!(worst("0 0 0,6 1 1 * 2040", UTC, "24h", NOW), 2);
        assert_eq!(worst("0 0 0 1 1 * 2020", UTC, "24h", NOW), 0);
        assert_eq!(worst("0 0 0 1 1 * 2020", UTC, "30d", NOW), 0);
    }

    /// Friday the 13th twice within 28 days happens only in a common year
    /// whose 13 February is a Friday: next in 2037. The scan covers the
    /// whole 28-year calendar cycle when both a day of the month and a
    /// weekday are set.
    #[test]
    fn days_of_the_month_and_weekdays_are_scanned_over_the_calendar_cycle() {
        assert_eq!(worst("0 0 0 13 * FRI", UTC, "28d", NOW), 1);
        assert_eq!(worst("0 0 0 13 * FRI", UTC, "29d", NOW), 2);
    }

    /// When the clocks go back, a daily 02:30 job fires twice, an hour
    /// apart (next in October 2027, 11 months away).
    #[test]
    fn a_clock_change_within_a_year_is_looked_at() {
        let berlin = chrono_tz::Europe::Berlin;
        assert_eq!(worst("0 30 2 * * *", berlin, "2h", NOW), 2);
        assert_eq!(worst("0 30 2 * * *", berlin, "1h", NOW), 1);
        assert_eq!(worst("0 30 2 * * *", UTC, "2h", NOW), 1);
        assert_eq!(worst("0 30 2 * * *", berlin, "24h", NOW), 2);
    }

    #[test]
    fn dense_schedules_are_counted_or_extrapolated() {
        assert_eq!(worst("0 * * * * *", UTC, "1h", NOW), 60);
        assert_eq!(worst("* * * * * *", UTC, "1h", NOW), 3600);
        // Every second of one hour a day: 3600 per day, however long the window.
        assert_eq!(worst("* * 9 * * *", UTC, "24h", NOW), 3600);
    }
}
