//! The scheduler loop: fires each job's cron ticks and fans them out into
//! the queue. Several daemons may run it on one Redis: each tick is claimed
//! once (its first chunk, [`Queue::fan_out_chunk`]), so exactly one fans it
//! out; a fan-out whose daemon died part-way is finished by another (or by
//! the same one restarted) once its lease runs out ([`Scheduler::resume`]).
//!
//! The config comes through a watch channel: a reload sends a new one. Each
//! job's loop reads its job again at every wake (at least once a second),
//! so a changed schedule, time zone or fan-out applies from its next tick,
//! and a job removed (or made manual) stops its loop; a tick being fanned
//! out when the reload lands is fanned out as it began. A job added gets a
//! loop of its own from [`Scheduler::run`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use super::source::SourceError;
use super::{FanOutCause, Fanned, TickItems, next_fires, queue_tick};
use crate::config::{Config, Job};
use crate::liveness::Health;
use crate::queue::{Origin, Queue, TakeOver, TickFanOut};

/// Most fan-outs of one job under way at once (`Scheduler::job_loop`).
const FAN_OUTS_AT_ONCE: usize = 4;

/// How often a daemon looks for fan-outs whose enqueuer died.
const RESUME_EVERY: Duration = Duration::from_secs(5);

/// What every job's loop shares.
#[derive(Clone)]
pub(crate) struct Scheduler {
    pub(crate) queue: Queue,
    pub(crate) health: Arc<Health>,
    /// Who claims the ticks (host:pid), for the claim's value.
    pub(crate) who: String,
    /// Ends every loop when it turns true.
    pub(crate) stop: watch::Receiver<bool>,
}

impl Scheduler {
    /// Runs one loop per job with a schedule (a manual job never fires by
    /// itself: `trigger` runs it) until `stop`, starting one for each job
    /// a reload adds. Only the next tick after now is ever fired: a daemon
    /// that was down does not replay the ticks it missed. With no such job
    /// this loop still beats, for the watchdog, as a pure worker.
    pub(crate) async fn run(self, mut config: watch::Receiver<Arc<Config>>) {
        let mut loops: HashMap<String, JoinHandle<()>> = HashMap::new();
        // Jobs whose schedule fires no more (a cron of past dates): said
        // once, not every second, until a reload changes the config.
        let mut spent: HashSet<String> = HashSet::new();
        let mut seen: Option<Arc<Config>> = None;
        let resume = tokio::spawn(self.clone().resume(config.clone()));
        let mut stop = self.stop.clone();
        loop {
            let current = config.borrow_and_update().clone();
            if !seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, &current)) {
                spent.clear();
                seen = Some(current.clone());
            }
            loops.retain(|_, l| !l.is_finished());
            for job in (current.jobs.values()).filter(|j| !j.schedule.is_manual()) {
                if !loops.contains_key(&job.name) && !spent.contains(&job.name) {
                    if next_fires(job, Utc::now(), 1).is_empty() {
                        info!(job = %job.name, "schedule has no future fire time: the job fires no more until the config changes");
                        spent.insert(job.name.clone());
                        continue;
                    }
                    let l = tokio::spawn(self.clone().job_loop(job.name.clone(), config.clone()));
                    loops.insert(job.name.clone(), l);
                }
            }
            Health::beat(&self.health.scheduler);
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                r = config.changed() => if r.is_err() { break },
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        for (_, l) in loops {
            let _ = l.await;
        }
        let _ = resume.await;
    }

    /// Fires job `name`'s ticks, reading the job from the config in force
    /// at every wake; returns once the job is gone (removed by a reload, or
    /// made manual), has no future fire time, or on `stop`.
    async fn job_loop(mut self, name: String, mut config: watch::Receiver<Arc<Config>>) {
        let mut job = match config.borrow_and_update().jobs.get(&name) {
            Some(j) => j.clone(),
            None => return,
        };
        let mut next = next_fires(&job, Utc::now(), 1).pop();
        // Fan-outs under way: they end by themselves on `stop`.
        let mut fanning: std::collections::VecDeque<JoinHandle<()>> = Default::default();
        loop {
            Health::beat(&self.health.scheduler);
            if config.has_changed().unwrap_or(false) {
                match config.borrow_and_update().jobs.get(&name) {
                    Some(j) if !j.schedule.is_manual() => job = j.clone(),
                    _ => {
                        info!(job = %name, "the job is no longer scheduled here (reloaded): its loop ends");
                        return;
                    }
                }
                next = next_fires(&job, Utc::now(), 1).pop();
            }
            let Some(at) = next else {
                // Said by `run`, once.
                return;
            };
            let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            // Wake at least every second, so the watchdog sees the loop
            // alive and a reload is seen within a second.
            let nap = wait.min(Duration::from_secs(1));
            tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(nap) => {}
            }
            if nap < wait {
                continue;
            }
            // Each tick's fan-out on a task of its own: one that waits for
            // Redis (a failover; with queue_replicas, no replica in sync
            // yet) retries without making the next ticks late, let alone
            // skipped. A few at most at once: past that the loop waits for
            // the oldest, and fires late rather than piling fan-outs up.
            fanning.retain(|f| !f.is_finished());
            if fanning.len() >= FAN_OUTS_AT_ONCE
                && let Some(oldest) = fanning.pop_front()
            {
                tokio::select! {
                    _ = self.stop.wait_for(|s| *s) => return,
                    _ = oldest => {}
                }
            }
            let (mut fan, j) = (self.clone(), job.clone());
            let tick = at.timestamp_millis();
            fanning.push_back(tokio::spawn(async move {
                fan.fan_out(&j, tick).await;
            }));
            next = next_fires(&job, Utc::now(), 1).pop();
        }
    }

    /// Reads the job's items, claims the tick and queues its tasks in
    /// chunks. A source that cannot be read fans out nothing (logged and
    /// counted). A chunk that fails is retried briefly (each is idempotent,
    /// so the fan-out goes on where it stopped); another daemon may win the
    /// claim meanwhile, and then this one stands down. Shutdown cuts it
    /// short, even mid-fan-out: the rest is taken over once the lease runs
    /// out. Returns false on shutdown.
    async fn fan_out(&mut self, job: &Job, tick: i64) -> bool {
        let read = tokio::select! {
            _ = self.stop.wait_for(|s| *s) => return false,
            r = TickItems::read_async(job) => r,
        };
        let mut items = match read {
            Ok(items) => items,
            Err(e) => {
                source_failed(job, tick, &e);
                return true;
            }
        };
        refused_rows(&items, tick);
        self.queue_items(&mut items, tick, Origin::Tick, 0).await
    }

    /// Queues `items` from `start` on; false on shutdown.
    async fn queue_items(
        &mut self,
        items: &mut TickItems<'_>,
        tick: i64,
        origin: Origin,
        mut start: u64,
    ) -> bool {
        let name = items.job().name.clone();
        let who = self.who.clone();
        let fan = TickFanOut {
            job: &name,
            tick,
            origin,
            who: &who,
        };
        for attempt in 0..5 {
            let r = tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return false,
                r = queue_tick(&self.queue, items, &fan, start, |_| {}) => r,
            };
            match r {
                Ok(Fanned::Queued(n)) => {
                    info!(job = %name, tick, tasks = n, from = start, "tick fanned out");
                    return true;
                }
                Ok(Fanned::Taken { by, queued }) => {
                    debug!(job = %name, tick, by, ?queued, "tick fanned out by another enqueuer");
                    return true;
                }
                Err(e) => {
                    let retry = matches!(e.cause, FanOutCause::Queue(_)) && attempt < 4;
                    warn!(
                        job = %name, tick, attempt, queued = e.queued, total = e.total, error = %e.cause,
                        "could not fan the tick out; {}",
                        if retry { "retrying" } else { "a daemon takes the rest over when its lease runs out" }
                    );
                    if !retry {
                        return true;
                    }
                    start = e.queued;
                    tokio::select! {
                        _ = self.stop.wait_for(|s| *s) => return false,
                        _ = tokio::time::sleep(Duration::from_millis(500 << attempt)) => {}
                    }
                }
            }
        }
        true
    }

    /// Finishes cron ticks' fan-outs whose enqueuer went silent (died,
    /// stopped, lost Redis for longer than its retries): every
    /// [`RESUME_EVERY`], each one whose lease ran out is taken over and
    /// queued on from where it stopped, with the source as it reads now.
    /// `trigger`'s own fan-outs are left to `trigger` run again.
    async fn resume(mut self, config: watch::Receiver<Arc<Config>>) {
        loop {
            tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(RESUME_EVERY) => {}
            }
            // Redis's clock only when there is a lease to compare with it.
            let list = match self.queue.unfinished_fan_outs().await {
                Ok(list) if !list.is_empty() => list,
                _ => continue,
            };
            let Ok(now) = self.queue.redis_now_ms().await else {
                continue;
            };
            let config = config.borrow().clone();
            for (name, tick, lease_end) in list {
                let Some(job) = config.jobs.get(&name).filter(|_| lease_end <= now) else {
                    continue;
                };
                let taken = self
                    .queue
                    .take_over(&name, tick, &self.who, Some(Origin::Tick));
                let Ok(TakeOver::Taken { next, origin }) = taken.await else {
                    continue;
                };
                info!(job = %name, tick, from = next, "taking over a fan-out whose enqueuer went silent");
                let mut items = match TickItems::read_async(job).await {
                    Ok(items) => items,
                    Err(e) => {
                        source_failed(job, tick, &e);
                        continue;
                    }
                };
                if !self.queue_items(&mut items, tick, origin, next).await {
                    return;
                }
            }
        }
    }
}

/// A tick whose source cannot be read fans out nothing: said and counted.
fn source_failed(job: &Job, tick: i64, e: &SourceError) {
    error!(job = %job.name, tick, error = %e, "fan-out source cannot be read: this tick fans out nothing");
    metrics::counter!("qw_fan_out_errors_total", "qw_job" => job.name.clone()).increment(1);
}

/// Rows skipped for a bad value: said (the first few) and counted.
fn refused_rows(items: &TickItems<'_>, tick: i64) {
    let Some(refused) = items.refused() else {
        return;
    };
    let job = &items.job().name;
    error!(
        job = %job, tick, refused = refused.count, examples = %refused.examples.join("; ").escape_debug(),
        "fan-out rows refused (skipped): values must be non-empty text without control characters"
    );
    metrics::counter!("qw_fan_out_errors_total", "qw_job" => job.clone()).increment(1);
}
