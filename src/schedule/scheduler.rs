//! The scheduler loop: fires each job's cron ticks and fans them out into
//! the queue. Several daemons may run it on one Redis: each tick is claimed
//! once ([`Queue::enqueue_tick`]), so exactly one fans it out.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{next_fires, tick_tasks};
use crate::config::{Config, Job};
use crate::ops::Health;
use crate::queue::{Origin, Queue};

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
    /// Runs one loop per job until `stop`. Only the next tick after now is
    /// ever fired: a daemon that was down does not replay the ticks it missed.
    pub(crate) async fn run(self, config: Arc<Config>) {
        let loops: Vec<_> = (config.jobs.values())
            .map(|job| tokio::spawn(self.clone().job_loop(job.clone())))
            .collect();
        if loops.is_empty() {
            // No jobs: stay alive for the watchdog, as a pure worker.
            let mut stop = self.stop.clone();
            loop {
                Health::beat(&self.health.scheduler);
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
        for l in loops {
            let _ = l.await;
        }
    }

    async fn job_loop(mut self, job: Job) {
        loop {
            Health::beat(&self.health.scheduler);
            let Some(next) = next_fires(&job, Utc::now(), 1).pop() else {
                info!(job = %job.name, "schedule has no future fire time");
                return;
            };
            let wait = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            // Wake at least every second, so the watchdog sees the loop alive.
            let nap = wait.min(Duration::from_secs(1));
            tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(nap) => {}
            }
            if nap < wait {
                continue;
            }
            if !self.fan_out(&job, next.timestamp_millis()).await {
                return;
            }
        }
    }

    /// Claims the tick and queues its tasks. A failed claim is retried
    /// briefly: another daemon may win meanwhile, and then this one stands
    /// down. Shutdown cuts the attempts short, even one stuck on a Redis that
    /// does not answer: the claim is one script, it happened or not. Returns
    /// false on shutdown.
    async fn fan_out(&mut self, job: &Job, tick: i64) -> bool {
        let tasks = tick_tasks(job, tick, Origin::Tick);
        for attempt in 0..5 {
            let claimed = tokio::select! {
                _ = self.stop.wait_for(|s| *s) => return false,
                r = self.queue.enqueue_tick(&job.name, tick, &tasks, &self.who) => r,
            };
            match claimed {
                Ok(Some(n)) => {
                    info!(job = %job.name, tick, tasks = n, "tick fanned out");
                    return true;
                }
                Ok(None) => {
                    debug!(job = %job.name, tick, "tick already fanned out by another daemon");
                    return true;
                }
                Err(e) => {
                    warn!(job = %job.name, tick, attempt, error = %e, "could not fan the tick out; retrying");
                    tokio::select! {
                        _ = self.stop.wait_for(|s| *s) => return false,
                        _ = tokio::time::sleep(Duration::from_millis(500 << attempt)) => {}
                    }
                }
            }
        }
        true
    }
}
