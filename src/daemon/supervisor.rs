//! The apalis worker that runs tasks ([`Worker::run`]), restarted under a new
//! name with backoff whenever it dies: any Redis error kills an apalis-redis
//! worker (apalis-redis #76).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use apalis::prelude::*;
use tokio::sync::watch;
use tracing::{error, info, warn};

use super::drain::{self, CountStarts, Drain};
use crate::config::Config;
use crate::liveness::Health;
use crate::queue::wake::Woken;
use crate::queue::{Queue, TaskArgs, Wake};
use crate::worker::Worker;

/// How the worker's loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stopped {
    /// Every running task finished, its ack written.
    Drained,
    /// The shutdown timeout passed with tasks still running: they stay in
    /// this worker's hands in Redis, and come back to the queue once its
    /// heartbeats are missed (`recover_after`).
    TimedOut,
}

/// Runs the apalis worker until `stop`; when it dies, starts a new one.
/// On `stop`, lets the running tasks finish within `shutdown_timeout`.
///
/// Over 80 lines, on purpose: the stop path and the restart path both go
/// on driving the one pinned `run` future of an incarnation (the drain
/// needs it polled to write the acks), so they stay side by side here.
pub(super) async fn run(
    config: Arc<Config>,
    queue: Queue,
    worker: watch::Receiver<Arc<Worker>>,
    wake: Arc<Wake>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> Stopped {
    let mut incarnation = 0u32;
    let mut backoff = Duration::from_millis(250);
    loop {
        let name = worker_name(incarnation);
        // Kept to pause and stop the worker ourselves (drain.rs: apalis
        // pitfall 14), instead of `run_until`'s plain stop.
        let ctx = WorkerContext::new(&name);
        let drain = Arc::new(Drain::default());
        let conn = queue.connection();
        let generation = conn.generation();
        let run = build(&ctx, &config, &queue, &worker, &wake, &drain);
        let started = tokio::time::Instant::now();
        Health::beat(&health.worker);
        let mut run = std::pin::pin!(run);
        let stopping = async {
            let _ = stop.wait_for(|s| *s).await;
        };
        let result = tokio::select! {
            r = run.as_mut() => Some(Some(r)),
            // A new master may hold an older copy of the queue than the
            // one this worker saw (what a failover lost): tasks it believes
            // this worker holds would never come back while this name
            // keeps beating. Under a new name they come back after
            // recover_after, as a dead worker's do.
            () = conn.reconnected(generation) => Some(None),
            _ = stopping => None,
        };
        let Some(result) = result else {
            if ctx.is_pending() {
                // Never polled, so never started: nothing to drain.
                return Stopped::Drained;
            }
            // The worker is driven all along: it is what writes the acks of
            // the tasks that end meanwhile.
            let graceful = async {
                tokio::select! {
                    r = run.as_mut() => r,
                    _ = drain::stop(&ctx, &drain) => run.as_mut().await,
                }
            };
            return match tokio::time::timeout(config.worker.shutdown_timeout, graceful).await {
                Ok(Ok(())) => Stopped::Drained,
                Ok(Err(e)) => {
                    // Its tasks run on (they are detached), but their acks
                    // are lost: they come back after recover_after.
                    warn!(worker = %name, error = %e, running = drain.outstanding(), "worker stopped on an error while draining");
                    Stopped::TimedOut
                }
                Err(_) => Stopped::TimedOut,
            };
        };
        if *stop.borrow() {
            return Stopped::Drained;
        }
        let Some(result) = result else {
            info!(worker = %name, "the queue's Redis connection was made again (a failover, a restart): the worker registers again under a new name, so what the master believes it holds comes back to the queue");
            incarnation += 1;
            continue;
        };
        health.worker.store(0, Ordering::Relaxed);
        match result {
            Err(e) => {
                error!(worker = %name, error = %e, backoff_ms = backoff.as_millis() as u64, "worker stopped on an error; restarting")
            }
            Ok(()) => warn!(worker = %name, "worker stopped; restarting"),
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(250);
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Stopped::Drained,
            _ = tokio::time::sleep(backoff) => {}
        }
        // At most the connections' own reconnect backoff: a worker that
        // died on a failover is back within seconds of the new master.
        backoff = (backoff * 2).min(crate::conn::MAX_BACKOFF);
        incarnation += 1;
    }
}

/// One incarnation of the apalis worker, named by `ctx`, its task starts
/// and ends counted in `drain`: its run, to be driven.
fn build(
    ctx: &WorkerContext,
    config: &Config,
    queue: &Queue,
    worker: &watch::Receiver<Arc<Worker>>,
    wake: &Arc<Wake>,
    drain: &Arc<Drain>,
) -> impl std::future::Future<Output = Result<(), WorkerError>> {
    let results = drain.clone();
    WorkerBuilder::new(ctx)
        .backend(
            // Woken by the daemon's feeder, never on a timer (queue::wake).
            queue
                .storage(wake.clone())
                .poll_with_strategy(Woken::new(wake.clone())),
        )
        .layer(CountStarts(drain.clone()))
        .concurrency(config.worker.concurrency.get())
        .data(worker.clone())
        .on_event(move |ctx, event| results.on_event(ctx, event))
        .build(handle)
        .run()
}

/// Runs one task on the worker in force when it starts: the task keeps
/// that worker (and its config) to its end, whatever a reload sends
/// meanwhile.
async fn handle(
    task: TaskArgs,
    worker: Data<watch::Receiver<Arc<Worker>>>,
) -> Result<(), BoxDynError> {
    let w: Arc<Worker> = worker.borrow().clone();
    // Detached: if the apalis worker dies on a Redis error, the page in hand
    // still finishes (sink written, checkpoint saved) instead of being
    // dropped between spend and save.
    let run = tokio::spawn(async move { w.run(&task).await });
    match run.await {
        Ok(Ok(_)) => Ok(()),
        // Bookkeeping failed (Redis): let apalis retry the task later.
        Ok(Err(e)) => Err(Box::new(e)),
        // The task panicked (its guards undid its lock renewal and in-flight
        // count): apalis retries it later too.
        Err(e) => Err(Box::new(e)),
    }
}

/// A name unique to this process and incarnation: apalis refuses to
/// register a worker name seen alive within its threshold (apalis #504).
fn worker_name(incarnation: u32) -> String {
    format!(
        "qw-{}-{}-{incarnation}-{}",
        hostname(),
        std::process::id(),
        &crate::quota::request_id()[..6]
    )
}

/// This host's name (for worker names and tick claims).
pub(super) use crate::host::hostname;
