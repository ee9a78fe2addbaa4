//! `quota-worker state JOB [ITEM] [--json]`: where each item of a job
//! stands — its last run (tick, outcome, when it ended), where its next run
//! resumes (page and cursor, or page 1), `{since}`, page 1's validators,
//! and whether a task holds it now (on which host). `quota-worker state
//! reset JOB [ITEM] [--since VALUE]`: starts the item (or every item of the
//! job) over, so its next run fetches everything: a backfill.
//!
//! The items are the ones the job's fan-out gives now (its `fan_out`
//! lists and `fan_out_from` rows, read as a tick reads them) and the ones
//! Redis still holds state for (`item_state::held_items`: a bounded `SCAN`).
//! Exit 0; 64 for an unknown job or item (or a `--since` that is not a
//! time); 69 when Redis is unreachable; `reset`: 75 when a task holds an
//! item (that item is left as it is); 65 when the fan-out's source cannot
//! be read for a reset of every item.

use std::time::Duration;

use crate::conn::Conn;
use chrono::{DateTime, NaiveDate};
use tracing::warn;

use super::{Exit, outln};
use crate::config::{Config, Job, fmt_duration, parse_duration};
use crate::item_state::reset::{Forgot, Reply, Reset};
use crate::item_state::{self, ItemState, items, rfc3339, tick_time};
use crate::keys::KeySpace;
use crate::worker::{Checkpoint, Holder};

/// Most items without a fan-out row that `state` lists from Redis.
const HELD_MAX: usize = 100_000;

/// `state JOB [ITEM] [--json]`.
pub async fn show(config: &Config, job: &str, item: Option<&str>, json: bool) -> Exit {
    let mut target = match Target::open(config, job, item, false).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    let name = target.job.name.clone();
    let states = match item_state::read(&mut target.conn, &target.keys, &name, &target.items).await
    {
        Ok(s) => s,
        Err(e) => return redis_failure(config, &e),
    };
    if json {
        let out = item_state::Listing {
            job: &name,
            items: &states,
            complete: None,
            every_item: None,
        };
        outln!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        print_states(target.job, &states, item.is_none());
    }
    if target.more {
        eprintln!(
            "warning: Redis holds state for more than {HELD_MAX} items of job {name} outside its fan-out; the first {HELD_MAX} are shown"
        );
    }
    Exit::Ok
}

/// `state reset JOB [ITEM] [--since VALUE]`.
pub async fn reset(config: &Config, job: &str, item: Option<&str>, since: Option<&str>) -> Exit {
    let since = match since.map(SinceArg::parse).transpose() {
        Ok(s) => s,
        Err(why) => {
            eprintln!("error: {why}");
            return Exit::Usage;
        }
    };
    let mut target = match Target::open(config, job, item, true).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    let since = match since {
        Some(s) => match s.resolve(&mut target.conn).await {
            Ok(Ok(at)) => Some(at),
            Ok(Err(why)) => {
                eprintln!("error: {why}; nothing was reset");
                return Exit::Usage;
            }
            Err(e) => return redis_failure(config, &e),
        },
        None => None,
    };
    let user = super::operator();
    let mut tally = Tally::default();
    for (item, _) in &target.items {
        let r = Reset::new(&target.keys, &target.job.name, item, since);
        match r.invoke(&mut target.conn).await {
            Ok(Reply::Held(by)) => tally.held(target.job, item, &by),
            Ok(Reply::Forgot(f)) => tally.forgot(target.job, item, &f, since, &user),
            Err(e) => {
                tally.summary(target.job);
                return redis_failure(config, &e);
            }
        }
    }
    tally.summary(target.job);
    if tally.held > 0 {
        Exit::TempFail
    } else {
        Exit::Ok
    }
}

/// The job, its Redis, and the items the command is about.
struct Target<'c> {
    job: &'c Job,
    conn: Conn,
    keys: KeySpace,
    /// Each item, and whether the fan-out gives it now.
    items: Vec<(String, bool)>,
    /// More items hold state in Redis than [`HELD_MAX`].
    more: bool,
}

impl<'c> Target<'c> {
    /// `job` (64 when unknown), Redis (69 when unreachable) and the items:
    /// `item` (64 when neither the fan-out nor Redis has it), or every
    /// one. `strict`: a fan-out source that cannot be read is an error
    /// (65) for every item, not a warning.
    async fn open(
        config: &'c Config,
        job: &str,
        item: Option<&str>,
        strict: bool,
    ) -> Result<Target<'c>, Exit> {
        let Some(job) = config.jobs.get(job) else {
            let known: Vec<_> = config.jobs.keys().map(String::as_str).collect();
            eprintln!("error: unknown job {job:?} (known: {})", known.join(", "));
            return Err(Exit::Usage);
        };
        let url = super::redis_master(config);
        let mut conn = match crate::conn::connect(&url, config.redis.timeout, "cli").await {
            Ok(c) => c,
            Err(e) => return Err(redis_failure(config, &e)),
        };
        let keys = KeySpace::new(config.redis.key_prefix.clone());
        let fanned = items::fan_out(job).await;
        let (items, more) = match item {
            Some(item) => match items::find(&mut conn, &keys, job, item, &fanned).await {
                Ok(Some(one)) => (vec![one], false),
                Ok(None) => return Err(unknown_item(item, fanned)),
                Err(e) => return Err(redis_failure(config, &e)),
            },
            None => {
                let fanned = match fanned {
                    Ok(f) => f,
                    Err(why) if strict => {
                        eprintln!("error: job {}: {why}; nothing was reset", job.name);
                        return Err(Exit::DataErr);
                    }
                    Err(why) => {
                        eprintln!(
                            "warning: job {}: {why}; only the items Redis holds state for are shown",
                            job.name
                        );
                        Vec::new()
                    }
                };
                let held = item_state::held_items(&mut conn, &keys, &job.name, HELD_MAX).await;
                let (held, more) = held.map_err(|e| redis_failure(config, &e))?;
                (items::every_item(fanned, held), more)
            }
        };
        Ok(Target {
            job,
            conn,
            keys,
            items,
            more,
        })
    }
}

/// Says that `item` is neither in the fan-out (`fanned`) nor in Redis: 64.
fn unknown_item(item: &str, fanned: Result<Vec<String>, String>) -> Exit {
    let known = match fanned {
        Ok(f) if f.is_empty() => "its fan-out gives none now".to_owned(),
        Ok(f) => {
            let some: Vec<&str> = f.iter().take(8).map(String::as_str).collect();
            let more = if f.len() > 8 { ", ..." } else { "" };
            format!("its {} item(s): {}{more}", f.len(), some.join(", "))
        }
        Err(why) => format!("its fan-out could not be read: {why}"),
    };
    eprintln!(
        "error: unknown item {item:?}: not in the job's fan-out, and Redis holds no state for it ({known}); write it as `trigger --wait` names it, like region=US"
    );
    Exit::Usage
}

/// `--since`, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SinceArg {
    /// A time, epoch s.
    At(i64),
    /// That long before now (Redis's clock).
    Ago(Duration),
}

impl SinceArg {
    /// RFC 3339 (`2026-11-01T00:00:00Z`, any offset; a fraction of a second
    /// is dropped, as `{since}` has whole seconds), a date (`2026-11-01`:
    /// its midnight, UTC), or an age in the config's duration grammar
    /// (`30d`: that long before now).
    fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(t) = DateTime::parse_from_rfc3339(s) {
            return Ok(SinceArg::At(t.timestamp()));
        }
        if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
            let midnight = d.and_hms_opt(0, 0, 0).map(|t| t.and_utc().timestamp());
            return midnight
                .map(SinceArg::At)
                .ok_or_else(|| format!("--since {s:?}: no such day"));
        }
        if let Ok(d) = parse_duration(s) {
            return Ok(SinceArg::Ago(d));
        }
        Err(format!(
            "--since {s:?} is not a time: write RFC 3339 (2026-11-01T00:00:00Z), a date (2026-11-01, midnight UTC) or an age (30d: that long before now)"
        ))
    }

    /// The time, epoch s, by Redis's clock; `Err` for one in the future
    /// (the item's next run would ask for nothing).
    async fn resolve(self, conn: &mut Conn) -> redis::RedisResult<Result<i64, String>> {
        let (now, _): (i64, i64) = redis::cmd("TIME").query_async(conn).await?;
        let at = match self {
            SinceArg::At(at) => at,
            SinceArg::Ago(d) => now.saturating_sub(i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
        };
        Ok(if at > now {
            Err(format!(
                "--since {} is in the future (Redis's clock says {}): the item's next run would ask for nothing",
                rfc3339(at),
                rfc3339(now)
            ))
        } else {
            Ok(at)
        })
    }
}

/// What a reset did, item by item.
#[derive(Default)]
struct Tally {
    reset: u64,
    nothing: u64,
    held: u64,
}

impl Tally {
    fn held(&mut self, job: &Job, item: &str, by: &Holder) {
        self.held += 1;
        let host = by
            .host
            .as_deref()
            .unwrap_or("a host it does not name (an older daemon)");
        eprintln!(
            "{} {item}: in flight on {host} (task {}): not reset; run `{}` again once it ends",
            job.name,
            by.task,
            item_state::command_line(&["state", "reset", &job.name, item]),
        );
    }

    fn forgot(&mut self, job: &Job, item: &str, f: &Forgot, since: Option<i64>, user: &str) {
        if f.is_empty() && since.is_none() {
            self.nothing += 1;
            return;
        }
        self.reset += 1;
        let removed = removed(f);
        let next = match since {
            Some(at) => format!("{{since}} set to {}", rfc3339(at)),
            None => format!(
                "{{since}} = now − since_initial ({})",
                fmt_duration(job.since_initial)
            ),
        };
        outln!(
            "{} {item}: forgot {}; its next run starts at page 1 with {next}",
            job.name,
            if removed.is_empty() {
                "nothing".to_owned()
            } else {
                removed.join(", ")
            }
        );
        warn!(
            job = %job.name,
            item,
            user,
            checkpoint = f.checkpoint.as_deref(),
            since_was = f.since.as_deref().map(|s| s.parse().map_or(s.to_owned(), rfc3339)),
            validators = f.validators.as_deref(),
            since_set = since.map(rfc3339),
            "an operator reset an item's state: its next run starts at page 1"
        );
    }

    fn summary(&self, job: &Job) {
        let total = self.reset + self.nothing + self.held;
        if total > 1 || self.nothing > 0 {
            outln!(
                "job {}: {} item(s) reset, {} had nothing to forget, {} in flight (not reset)",
                job.name,
                self.reset,
                self.nothing,
                self.held
            );
        }
    }
}

/// What a reset removed, in words.
fn removed(f: &Forgot) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(raw) = &f.checkpoint {
        out.push(match serde_json::from_str::<Checkpoint>(raw) {
            Ok(cp) => format!(
                "the checkpoint (tick {}, resuming at page {}, cursor {}{})",
                tick_time(cp.tick),
                cp.cursor.page,
                item_state::cursor_fields(&cp).unwrap_or_default(),
                cp.since
                    .map(|s| format!(", the run's {{since}} {}", rfc3339(s)))
                    .unwrap_or_default()
            ),
            Err(_) => format!("an unreadable checkpoint ({raw})"),
        });
    }
    if let Some(raw) = &f.since {
        let shown = raw.parse().map(rfc3339).unwrap_or_else(|_| raw.clone());
        out.push(format!("{{since}} {shown}"));
    }
    if let Some(raw) = &f.validators {
        out.push(format!("the validators {raw}"));
    }
    out
}

/// The text for humans: one block per item; a job's every item under a
/// line that counts them.
fn print_states(job: &Job, states: &[ItemState], every: bool) {
    if every {
        let fanned = states.iter().filter(|s| s.in_fan_out).count();
        outln!(
            "job {}: {} item(s), {fanned} in its fan-out now\n",
            job.name,
            states.len()
        );
    }
    for (i, s) in states.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        print_state(job, s);
    }
}

fn print_state(job: &Job, s: &ItemState) {
    let gone = if s.in_fan_out {
        ""
    } else {
        " (not in the fan-out now; Redis still holds its state)"
    };
    outln!("{}{gone}", s.item);
    let last = match (s.last_tick, &s.outcome) {
        (None, _) => "none recorded".to_owned(),
        (Some(t), None) => format!(
            "tick {}: no end recorded (running now, or its daemon stopped before it ended)",
            tick_time(t)
        ),
        (Some(t), Some(o)) => {
            let ended = s
                .ended_at
                .as_deref()
                .map(|e| format!(", ended {e}"))
                .unwrap_or_default();
            format!("tick {}: {o}{ended}", tick_time(t))
        }
    };
    outln!("  last run:    {last}");
    if let Some(d) = &s.detail {
        outln!("               {d}");
    }
    let next = match (s.resume_page, &s.cursor) {
        (Some(p), Some(c)) => format!("resumes at page {p}, cursor {c}"),
        (Some(p), None) => format!("resumes at page {p}"),
        (None, _) => "start (page 1)".to_owned(),
    };
    outln!("  next run:    {next}");
    let since = s.since.clone().unwrap_or_else(|| {
        format!(
            "none: now − since_initial ({})",
            fmt_duration(job.since_initial)
        )
    });
    outln!("  {{since}}:     {since}");
    let validators = match &s.validators {
        None => "none".to_owned(),
        Some(v) => [("ETag", &v.etag), ("Last-Modified", &v.last_modified)]
            .iter()
            .filter_map(|(n, v)| v.as_ref().map(|v| format!("{n} {v}")))
            .collect::<Vec<_>>()
            .join(", "),
    };
    outln!("  validators:  {validators}");
    let held = match &s.held_by {
        None => "nobody".to_owned(),
        Some(h) => match &h.host {
            Some(host) => format!("task {} on {host}", h.task),
            None => format!(
                "task {} (its daemon does not name its host: an older version)",
                h.task
            ),
        },
    };
    outln!("  held by:     {held}");
    for u in &s.unreadable {
        outln!(
            "  unreadable:  {u} (the worker fails this item's tasks until `state reset` clears it)"
        );
    }
}

/// The exit for a Redis error: refused credentials are a config error
/// (78); a Redis that does not answer is unavailable (69); a reply this
/// binary cannot read is a bug (70).
fn redis_failure(config: &Config, e: &redis::RedisError) -> Exit {
    let url = super::redis_master(config);
    if crate::acl::is_auth_failure(e) {
        eprintln!("error: {}", crate::acl::refused_credentials(&url, e));
        return Exit::Config;
    }
    eprintln!("error: Redis at {url}: {e}");
    let unavailable = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error();
    if unavailable {
        if config.redis.url.is_none() {
            eprintln!(
                "hint: [redis] url is not set, so this uses the embedded Redis of a running `quota-worker run`; start the daemon or set {}",
                crate::config::REDIS_URL_ENV
            );
        }
        Exit::Unavailable
    } else {
        Exit::Software
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_a_time_a_date_or_an_age() {
        assert_eq!(
            SinceArg::parse("2026-01-02T03:04:05Z"),
            Ok(SinceArg::At(1_767_323_045))
        );
        assert_eq!(
            SinceArg::parse("2026-01-02T05:04:05.9+02:00"),
            Ok(SinceArg::At(1_767_323_045))
        );
        assert_eq!(
            SinceArg::parse("2026-01-02"),
            Ok(SinceArg::At(1_767_312_000))
        );
        assert_eq!(
            SinceArg::parse("30d"),
            Ok(SinceArg::Ago(Duration::from_secs(30 * 86_400)))
        );
        for bad in ["yesterday", "2026-13-01", "2026-01-02 03:04", "", "1M"] {
            let e = SinceArg::parse(bad).expect_err(bad);
            assert!(e.contains("RFC 3339"), "{bad}: {e}");
        }
    }
}
