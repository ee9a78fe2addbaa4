//! The apalis worker that runs tasks ([`Worker::run`]), restarted under a new
//! name with backoff whenever it dies: any Redis error kills an apalis-redis
//! worker (apalis-redis #76).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use apalis::prelude::*;
use tokio::sync::watch;
use tracing::{error, warn};

use crate::config::Config;
use crate::ops::Health;
use crate::queue::{Queue, TaskArgs, Ticker};
use crate::worker::Worker;

/// Runs the apalis worker until `stop`; when it dies, starts a new one.
pub(super) async fn run(
    config: Arc<Config>,
    queue: Queue,
    worker: Arc<Worker>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) {
    let mut incarnation = 0u32;
    let mut backoff = Duration::from_millis(250);
    loop {
        let name = worker_name(incarnation);
        let w = WorkerBuilder::new(name.clone())
            .backend(
                queue
                    .storage()
                    .poll_with_strategy(Ticker::new(config.worker.poll_interval)),
            )
            .concurrency(config.worker.concurrency.get())
            .data(worker.clone())
            .build(handle);
        let started = tokio::time::Instant::now();
        Health::beat(&health.worker);
        let mut stop_signal = stop.clone();
        let run = w.run_until(async move {
            let _ = stop_signal.wait_for(|s| *s).await;
            Ok::<(), std::io::Error>(())
        });
        // Bound the graceful drain by the shutdown timeout.
        let mut stop_timer = stop.clone();
        let result = tokio::select! {
            r = run => Some(r),
            _ = async {
                let _ = stop_timer.wait_for(|s| *s).await;
                tokio::time::sleep(config.worker.shutdown_timeout).await;
            } => None,
        };
        if *stop.borrow() {
            return;
        }
        health.worker.store(0, Ordering::Relaxed);
        match result {
            Some(Err(e)) => {
                error!(worker = %name, error = %e, backoff_ms = backoff.as_millis() as u64, "worker stopped on an error; restarting")
            }
            _ => warn!(worker = %name, "worker stopped; restarting"),
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_millis(250);
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
        incarnation += 1;
    }
}

async fn handle(task: TaskArgs, worker: Data<Arc<Worker>>) -> Result<(), BoxDynError> {
    let w: Arc<Worker> = (*worker).clone();
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
pub(super) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
