//! `quota-worker trigger JOB [--wait]`: enqueues one tick of JOB now; with
//! `--wait`, shows a progress bar until its tasks end, then a one-line
//! summary, and exits by how they ended (`verdict`).

use std::collections::HashMap;
use std::time::Duration;

use crate::conn::Conn;
use indicatif::{ProgressBar, ProgressStyle};

use super::{Exit, outln};
use crate::config::{Config, Job, fmt_duration};
use crate::keys::KeySpace;
use crate::outcome::{DEFERRED, OutcomeKind, RETRY_AT_MS, RETRYING, WAITED};
use crate::queue::known;
use crate::queue::{FAN_OUT_LEASE, Origin, Queue, QueueError, TakeOver, TickFanOut};
use crate::schedule::{FanOutCause, Fanned, TickItems, queue_tick};

/// Outcomes that end a task's chain (retrying and deferred do not).
const TERMINAL: [OutcomeKind; 5] = [
    OutcomeKind::Done,
    OutcomeKind::QuotaExhausted,
    OutcomeKind::UpstreamThrottled,
    OutcomeKind::Failed,
    OutcomeKind::Superseded,
];

/// A tick's outcome hash: field -> count (and `#` fields, see `outcome`).
type Counts = HashMap<String, u64>;

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
    let url = super::redis_master(config);
    let conn = match crate::conn::connect(&url, Duration::from_secs(5), "queue").await {
        Ok(c) => c.with_acks(config.redis.queue_replicas, crate::queue::ACK_WAIT, 1),
        Err(e) if crate::acl::is_auth_failure(&e) => {
            eprintln!("error: {}", crate::acl::refused_credentials(&url, &e));
            return Exit::Config;
        }
        Err(e) => {
            eprintln!("error: cannot reach Redis at {url}: {e}");
            return Exit::Unavailable;
        }
    };
    let keys = KeySpace::new(config.redis.key_prefix.clone());
    let queue = Queue::new(conn.clone(), keys.clone(), config.worker.recover_after);
    let who = format!("trigger:{}", crate::quota::request_id());
    let (tick, total) = match enqueue(&queue, job, &who).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    reload_hint(&mut conn.clone(), &keys, config, job).await;
    if !wait {
        return Exit::Ok;
    }
    let tick = Tick {
        job,
        tick,
        total,
        outcomes: keys.tick_outcomes(&job.name, tick),
        ended: keys.tick_ended(&job.name, tick),
        url,
        queue,
        timeout: config
            .endpoints
            .get(&job.endpoint)
            .map_or(Duration::ZERO, |e| e.timeout),
        recover_after: config.worker.recover_after,
    };
    // The blocked reads of the tick's ends on a connection of their own,
    // whose response timeout outlasts them.
    let blocking = match crate::conn::connect(&tick.url, ENDS_BLOCK * 2, "wake").await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot reach Redis at {}: {e}", tick.url);
            return Exit::Unavailable;
        }
    };
    match tick.wait(conn, blocking).await {
        Ok(counts) => verdict(&counts),
        Err(code) => code,
    }
}

/// How long `trigger --wait` tries again after its reads were cut (a
/// failover: the master found again within seconds) before it gives up.
const CUT_PATIENCE: Duration = Duration::from_secs(15);

/// Whether to try a read again after `e`: a lost connection, within
/// [`CUT_PATIENCE`] of the first one in a row (`since`).
fn patient(since: &mut Option<std::time::Instant>, e: &redis::RedisError) -> bool {
    let cut = e.is_io_error() || e.is_timeout() || e.is_connection_dropped();
    cut && since.get_or_insert_with(std::time::Instant::now).elapsed() < CUT_PATIENCE
}

/// When daemons run on this Redis and prefix and none has `job` loaded (a
/// job added to the files since they started, or since their last reload),
/// says so on stderr: they need a reload, and meanwhile its tasks are given
/// back until one has it, for up to `unknown_job_grace`. Silent when it
/// cannot tell (no daemon announces its jobs: none runs, or they predate
/// the announcement).
async fn reload_hint(conn: &mut Conn, keys: &KeySpace, config: &Config, job: &Job) {
    let Ok((now, live, last)) = known::live_daemons(conn, keys, &job.name).await else {
        return;
    };
    if live.is_empty() || known::has_it_now(now, last) {
        return;
    }
    let older = (live.iter())
        .filter(|(_, l)| l.fingerprint != config.fingerprint)
        .count();
    let why = if older > 0 {
        format!(
            " ({older} of them loaded other files than {} has now)",
            config.path.display()
        )
    } else {
        String::new()
    };
    eprintln!(
        "warning: job {} is in {}, but none of the {} daemon(s) running on this Redis has it loaded{why}: reload them (`systemctl reload quota-worker`, or SIGHUP to each); until one has it, its tasks are given back, for up to unknown_job_grace ({}), then end failed",
        job.name,
        job.file.display(),
        live.len(),
        fmt_duration(config.worker.unknown_job_grace)
    );
}

/// Queues one tick of `job`, or the rest of an earlier `trigger` of it that
/// stopped part-way (killed, or Redis lost): a retry never fans out twice.
/// Says what was queued; returns the tick and its task count.
async fn enqueue(queue: &Queue, job: &Job, who: &str) -> Result<(i64, u64), Exit> {
    let unavailable = |e: &dyn std::fmt::Display| {
        eprintln!("error: cannot enqueue: {e}");
        Exit::Unavailable
    };
    let resume = unfinished(queue, job, who)
        .await
        .map_err(|e| unavailable(&e))?;
    let mut items = match TickItems::read_async(job).await {
        Ok(items) => items,
        Err(e) => {
            eprintln!("error: job {}: {e}; nothing was queued", job.name);
            return Err(Exit::DataErr);
        }
    };
    if let Some(r) = items.refused() {
        eprintln!(
            "warning: job {}: {} row(s) of its fan_out_from source refused (skipped): {}",
            job.name,
            r.count,
            r.examples.join("; ").escape_debug()
        );
    }
    let bar = ProgressBar::new(items.len());
    bar.set_style(
        ProgressStyle::with_template("{spinner} queuing {bar:30} {pos}/{len} task(s)")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // A manual tick is "now"; on the rare clash with a tick already claimed
    // at that very millisecond, take the next one.
    let (mut tick, start) = resume.unwrap_or((chrono::Utc::now().timestamp_millis(), 0));
    loop {
        let fan = TickFanOut {
            job: &job.name,
            tick,
            origin: Origin::Trigger,
            who,
        };
        let r = queue_tick(queue, &mut items, &fan, start, |n| bar.set_position(n)).await;
        bar.finish_and_clear();
        match r {
            Ok(Fanned::Queued(n)) if start > 0 => {
                outln!(
                    "resumed tick {tick} of job {} at task {start}: queued {} more, {n} task(s) in all",
                    job.name,
                    n.saturating_sub(start)
                );
                return Ok((tick, n));
            }
            Ok(Fanned::Queued(n)) => {
                outln!("queued {n} task(s) of job {} (tick {tick})", job.name);
                return Ok((tick, n));
            }
            Ok(Fanned::Taken { .. }) if start == 0 => tick += 1,
            Ok(Fanned::Taken { by, .. }) => {
                eprintln!(
                    "error: tick {tick} of job {} was taken over by {by}; it queues the rest",
                    job.name
                );
                return Err(Exit::TempFail);
            }
            Err(e) => {
                eprintln!(
                    "error: cannot enqueue: queued {} of {} task(s) of job {} (tick {tick}), then: {}\n\
                     nothing is lost: run `quota-worker trigger {}` again to queue the rest (it resumes tick {tick} at task {})",
                    e.queued, e.total, job.name, e.cause, job.name, e.queued
                );
                return Err(match e.cause {
                    FanOutCause::Source(_) => Exit::DataErr,
                    _ => Exit::Unavailable,
                });
            }
        }
    }
}

/// An earlier `trigger` of `job` that stopped part-way, taken over: its tick
/// and where to go on. One whose enqueuer is still at it is waited for: if
/// it finishes, this is a trigger of its own (`None`).
async fn unfinished(queue: &Queue, job: &Job, who: &str) -> Result<Option<(i64, u64)>, QueueError> {
    let mut said = false;
    for (name, tick, _) in queue.unfinished_fan_outs().await? {
        if name != job.name {
            continue;
        }
        loop {
            match queue
                .take_over(&name, tick, who, Some(Origin::Trigger))
                .await?
            {
                TakeOver::Taken { next, .. } => return Ok(Some((tick, next))),
                TakeOver::Busy { owner, next } => {
                    if !said {
                        eprintln!(
                            "tick {tick} of job {name} is being queued by {owner} ({next} task(s) so far); waiting until it finishes, or its lease ({}) runs out and this resumes it",
                            fmt_duration(FAN_OUT_LEASE)
                        );
                        said = true;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                TakeOver::Finished | TakeOver::NotMine => break,
            }
        }
    }
    Ok(None)
}

/// One triggered tick, waited for.
struct Tick<'a> {
    job: &'a Job,
    tick: i64,
    /// Its tasks.
    total: u64,
    /// Its outcome hash's key.
    outcomes: String,
    /// Its stream of ends, written while it is waited for.
    ended: String,
    url: crate::conn::Master,
    /// What is in flight, when nothing has ended for a while.
    queue: Queue,
    /// Its endpoint's request timeout.
    timeout: Duration,
    /// `[worker] recover_after`: a worker with no heartbeat for this long
    /// is gone.
    recover_after: Duration,
}

impl Tick<'_> {
    /// Shows progress until every task of the tick ended, prints the summary,
    /// and returns the final counts.
    async fn wait(&self, mut conn: Conn, mut blocking: Conn) -> Result<Counts, Exit> {
        let total = self.total;
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} ended  {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let lost = |e: redis::RedisError| {
            // Not through the bar: it draws nothing when stderr is not a
            // terminal (scripts, CI), and this must be seen.
            bar.finish_and_clear();
            let (url, tick) = (&self.url, self.tick);
            eprintln!("error: lost Redis at {url} while waiting for tick {tick}: {e}");
            Exit::Unavailable
        };
        // Tasks that end from here on say so on the tick's stream of ends;
        // the ones that ended before are in the first read of the counts.
        let mut ends = self.watch(&mut conn).await.map_err(lost)?;
        let started = std::time::Instant::now();
        let mut hinted = false;
        // A failover cuts the reads: they are sent again, to the master
        // found again, for a while before the wait gives up.
        let mut cut_since: Option<std::time::Instant> = None;
        loop {
            let counts = match self.read(&mut conn).await {
                Ok(c) => c,
                Err(e) if patient(&mut cut_since, &e) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => return Err(lost(e)),
            };
            let ended: u64 = TERMINAL.iter().map(|k| count(&counts, *k)).sum();
            let summary = summarize(&counts);
            bar.set_position(ended.min(total));
            bar.set_message(summary.clone());
            if ended >= total {
                bar.finish_and_clear();
                let retry = retry_after(&counts, &mut conn).await;
                let (name, tick) = (&self.job.name, self.tick);
                outln!("{name} tick {tick}: {total} task(s) ended: {summary}{retry}");
                return Ok(counts);
            }
            if !hinted
                && started.elapsed() >= NO_DAEMON_HINT
                && counts.keys().all(|k| k.starts_with('#'))
            {
                hinted = true;
                let note = self.nothing_ended().await;
                // `bar.println` is a no-op on a hidden bar (stderr not a
                // terminal): the note must reach scripts and CI logs too.
                bar.suspend(|| eprintln!("{note}"));
            }
            // At most a few reads a second while tasks end; none while
            // nothing happens but the blocked read (the bar's clock ticks on).
            tokio::time::sleep(Duration::from_millis(200)).await;
            match ends.next(&mut blocking).await {
                Ok(()) => cut_since = None,
                Err(e) if patient(&mut cut_since, &e) => {}
                Err(e) => return Err(lost(e)),
            }
        }
    }

    /// Marks the tick as waited for and reads from its stream of ends' newest entry on.
    async fn watch(&self, conn: &mut Conn) -> redis::RedisResult<Ends> {
        redis::AsyncCommands::hset::<_, _, _, ()>(conn, &self.outcomes, WAITED, 1).await?;
        let newest: redis::streams::StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(&self.ended)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(conn)
            .await?;
        let last = newest
            .ids
            .first()
            .map_or_else(|| "0-0".to_owned(), |e| e.id.clone());
        Ok(Ends {
            key: self.ended.clone(),
            last,
        })
    }

    /// What to say when no task has ended after 10 s: what is in flight
    /// (tasks against a slow upstream), or that no worker is alive at all
    /// (none sent a heartbeat within `recover_after`: apalis keeps a dead
    /// daemon's workers registered).
    async fn nothing_ended(&self) -> String {
        let depth = self.queue.depth().await;
        let live = self.queue.live_workers(self.recover_after).await;
        match (depth, live) {
            (Ok(_), Ok(0)) => format!(
                "no task has ended yet, and no worker on this Redis sent a heartbeat in the last {}: is a `quota-worker run` daemon running on it?",
                fmt_duration(self.recover_after)
            ),
            (Ok(d), Ok(workers)) => {
                let waiting = d.queued + d.backlog;
                let flight = if d.in_flight > 0 {
                    format!(
                        "{} task(s) in flight on {} worker(s) (a request waits at most its endpoint's timeout, {} for {})",
                        d.in_flight,
                        workers,
                        fmt_duration(self.timeout),
                        self.job.endpoint
                    )
                } else {
                    format!("none in flight on {workers} worker(s)")
                };
                format!(
                    "no task has ended yet: {flight}, {waiting} waiting to start; still waiting"
                )
            }
            _ => "no task has ended yet: is a `quota-worker run` daemon running on this Redis?"
                .to_owned(),
        }
    }

    async fn read(&self, conn: &mut Conn) -> redis::RedisResult<Counts> {
        redis::AsyncCommands::hgetall(conn, &self.outcomes).await
    }
}

/// A tick's stream of ends, read from its newest entry on.
struct Ends {
    key: String,
    last: String,
}

impl Ends {
    /// Waits until a task ends (or [`ENDS_BLOCK`] passes).
    async fn next(&mut self, conn: &mut Conn) -> redis::RedisResult<()> {
        let reply: Option<redis::streams::StreamReadReply> = redis::cmd("XREAD")
            .arg("BLOCK")
            .arg(ENDS_BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(&self.last)
            .query_async(conn)
            .await?;
        let newest = reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .last();
        if let Some(entry) = newest {
            self.last = entry.id;
        }
        Ok(())
    }
}

/// The longest one blocked read of a tick's ends waits: then the counts are
/// read anyway (a daemon older than this one does not write the stream).
const ENDS_BLOCK: Duration = Duration::from_secs(5);

/// How long before a tick none of whose tasks ended says "is a daemon running?".
const NO_DAEMON_HINT: Duration = Duration::from_secs(10);

fn count(counts: &Counts, kind: OutcomeKind) -> u64 {
    counts.get(kind.as_str()).copied().unwrap_or(0)
}

/// The exit code of a tick whose tasks all ended (SPEC Part 2, "`trigger
/// --wait` exit codes"): 1 when any failed (coming back later will not fix
/// it, so it wins); else 75 (EX_TEMPFAIL) when any ended on a quota's "no";
/// else 0 (all `done` or `superseded`).
fn verdict(counts: &Counts) -> Exit {
    if count(counts, OutcomeKind::Failed) > 0 {
        Exit::Failed
    } else if count(counts, OutcomeKind::QuotaExhausted) > 0
        || count(counts, OutcomeKind::UpstreamThrottled) > 0
    {
        Exit::TempFail
    } else {
        Exit::Ok
    }
}

/// " (retry after 41m 2s)" when a task ended on a quota's "no": the earliest
/// moment any of them may retry (`lua/finish.lua` keeps it on Redis's clock,
/// so it is measured against Redis's clock here too).
async fn retry_after(counts: &Counts, conn: &mut Conn) -> String {
    let quota =
        count(counts, OutcomeKind::QuotaExhausted) + count(counts, OutcomeKind::UpstreamThrottled);
    let Some(at) = counts.get(RETRY_AT_MS).filter(|_| quota > 0) else {
        return String::new();
    };
    let now_ms = match redis::cmd("TIME").query_async::<(u64, u64)>(conn).await {
        Ok((s, us)) => s * 1000 + us / 1000,
        // The summary is printed anyway; only its clock is unknown.
        Err(_) => chrono::Utc::now().timestamp_millis().max(0) as u64,
    };
    let wait = Duration::from_millis(at.saturating_sub(now_ms));
    format!(" (retry after {})", fmt_duration(wait))
}

fn summarize(counts: &Counts) -> String {
    let mut parts: Vec<String> = OutcomeKind::ALL
        .iter()
        .filter(|k| **k != OutcomeKind::Retrying)
        .filter_map(|k| {
            counts
                .get(k.as_str())
                .map(|n| format!("{n} {}", k.as_str()))
        })
        .collect();
    for (field, label) in [(RETRYING, "retries"), (DEFERRED, "deferrals")] {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> Counts {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn the_exit_code_says_how_the_tick_ended() {
        let ok = counts(&[("#items", 3), ("done", 2), ("superseded", 1), (RETRYING, 4)]);
        assert_eq!(verdict(&ok), Exit::Ok);
        let quota = counts(&[("done", 2), ("quota_exhausted", 1)]);
        assert_eq!(verdict(&quota), Exit::TempFail);
        let throttled = counts(&[("done", 2), ("upstream_throttled", 1)]);
        assert_eq!(verdict(&throttled), Exit::TempFail);
        let failed = counts(&[("done", 2), ("failed", 1)]);
        assert_eq!(verdict(&failed), Exit::Failed);
        // Waiting for quota cannot fix a failure: 1 wins over 75.
        let both = counts(&[("quota_exhausted", 1), ("failed", 1)]);
        assert_eq!(verdict(&both), Exit::Failed);
    }
}
