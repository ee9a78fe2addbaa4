//! The feeder: moves due tasks from our backlog into apalis, a bounded
//! number at a time ([`Queue::feed`], apalis pitfall 4), and trims what
//! apalis leaves behind ([`Queue::trim`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::ops::Health;
use crate::queue::{Queue, RETENTION};

/// How long the feeder rests between trim passes over apalis's sets.
const TRIM_REST: Duration = Duration::from_secs(60);

/// Runs until `stop`, one round every `poll_interval` (every second while
/// the queue cannot be reached).
pub(super) async fn run(
    queue: Queue,
    poll_interval: Duration,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) {
    let mut next_trim = tokio::time::Instant::now() + TRIM_REST;
    let mut failing = false;
    loop {
        // Shutdown cuts a round short, even one stuck on a Redis that does
        // not answer: a lease left behind expires and another feeder takes it.
        let ok = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            ok = feed(&queue, failing) => ok,
        };
        // The loop is alive either way; whether Redis answers is /readyz's business.
        Health::beat(&health.feeder);
        if ok && failing {
            info!("feeder reaches the queue again");
        }
        failing = !ok;
        if ok && tokio::time::Instant::now() >= next_trim {
            let rest = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                rest = trim(&queue) => rest,
            };
            next_trim = tokio::time::Instant::now() + rest;
        }
        let wait = if ok {
            poll_interval
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Drains as long as there is room, a few rounds per wake-up. False when the
/// queue cannot be reached (said once per outage: `quiet` while it lasts).
async fn feed(queue: &Queue, quiet: bool) -> bool {
    for _ in 0..10 {
        match queue.feed().await {
            Ok(0) => break,
            Ok(n) => debug!(tasks = n, "fed tasks to the queue"),
            Err(e) => {
                if !quiet {
                    warn!(error = %e, "feeder cannot reach the queue; retrying");
                }
                return false;
            }
        }
    }
    true
}

/// One bounded trim step. Returns how long to wait before the next: a
/// second while a pass is under way, [`TRIM_REST`] once every member has
/// been looked at (or the step failed).
async fn trim(queue: &Queue) -> Duration {
    match queue.trim(RETENTION).await {
        Ok((n, wrapped)) => {
            if n > 0 {
                debug!(tasks = n, "trimmed finished tasks");
            }
            if wrapped {
                TRIM_REST
            } else {
                Duration::from_secs(1)
            }
        }
        Err(e) => {
            warn!(error = %e, "trim failed");
            TRIM_REST
        }
    }
}
