//! The feeder: waits on Redis for work instead of polling it, moves due
//! tasks from our backlog into apalis a bounded number at a time
//! ([`Queue::feed`], apalis pitfall 4), wakes the daemon's worker when
//! apalis has tasks for it ([`Wake`]), and trims what apalis leaves behind
//! ([`Queue::trim`]).
//!
//! An idle daemon blocks on the wake stream (`queue::wake::WakeStream`, one
//! connection per daemon): every script that makes a task due sooner than
//! the daemons wait for, or that hands apalis tasks, adds an entry, and
//! every daemon reads it. Between entries a daemon sleeps until the next
//! task it knows of is due (a deferral, a retry's backoff), so a delayed
//! task starts on time without anyone polling. While due tasks wait for
//! room in apalis (a large fan-out draining), it looks again every
//! `poll_interval`.

use std::sync::Arc;
use std::time::Duration;

use crate::conn::Conn;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::liveness::Health;
use crate::queue::wake::{WakeStream, Woke};
use crate::queue::{FEED_BATCH, Fed, Queue, RETENTION, Wake};

/// How long the feeder rests between trim passes over apalis's sets.
const TRIM_REST: Duration = Duration::from_secs(60);

/// The longest one blocking read waits: the loop beats at least this often
/// (the watchdog calls a loop stale after `liveness::STALE_AFTER`, 12 s).
pub(super) const BLOCK: Duration = Duration::from_secs(5);

/// The longest an idle daemon goes without looking at the queue itself: a
/// safety net for a wake-up nobody wrote (an older daemon's script during a
/// rolling upgrade, apalis's own re-queues).
const LOOK_EVERY: Duration = Duration::from_secs(30);

/// Runs until `stop`. `conn` is the waiter's own connection (its response
/// timeout outlasts [`BLOCK`]). It stays one loop of a little over 80
/// lines: each of its four awaits is raced against `stop`, and the round,
/// the trim and the wait share its state (when the next round and trim are
/// due, the open stream, whether Redis answers).
pub(super) async fn run(
    queue: Queue,
    wake: Arc<Wake>,
    conn: Conn,
    poll_interval: Duration,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) {
    let mut next_trim = Instant::now() + TRIM_REST;
    let mut stream: Option<WakeStream> = None;
    let mut round_at = Instant::now();
    let mut failing = false;
    loop {
        // Shutdown cuts every wait short, even one stuck on a Redis that
        // does not answer: nothing is left half-done (one script per round).
        if stream.is_none() {
            // Opened before the round: what is written during it is read after.
            let opened = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                s = WakeStream::open(conn.clone(), queue.keys().wake()) => s,
            };
            stream = opened.ok();
        }
        if Instant::now() >= round_at {
            let fed = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                fed = feed(&queue, failing) => fed,
            };
            if fed.is_some() && failing {
                info!("feeder reaches the queue again");
            }
            failing = fed.is_none();
            round_at = match fed {
                Some(fed) => {
                    if fed.ready > 0 {
                        wake.notify();
                    }
                    Instant::now() + until_next(&fed, poll_interval)
                }
                None => Instant::now() + Duration::from_secs(1),
            };
        }
        if !failing && Instant::now() >= next_trim {
            let rest = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                rest = trim(&queue) => rest,
            };
            next_trim = Instant::now() + rest;
        }
        // The loop is alive either way; whether Redis answers is /readyz's business.
        Health::beat(&health.feeder);
        let wait = (round_at.min(next_trim))
            .saturating_duration_since(Instant::now())
            .min(BLOCK);
        let Some(reader) = stream.as_mut() else {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(wait.min(Duration::from_secs(1))) => {}
            }
            continue;
        };
        let woke = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            woke = reader.wait(wait) => woke,
        };
        match woke {
            Ok(woke) => round_at = heed(woke, &wake, round_at),
            Err(e) => {
                if !failing {
                    warn!(error = %e, "feeder cannot wait on the queue's wake stream; retrying");
                }
                // Read again from the newest entry, after a look at the queue.
                stream = None;
                round_at = Instant::now() + Duration::from_secs(1);
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

/// What a read of the wake stream says: wakes the worker when apalis got
/// tasks, and returns when the next round is due (sooner when a task was
/// queued for sooner, at once when the read may have missed entries).
fn heed(woke: Woke, wake: &Wake, round_at: Instant) -> Instant {
    if woke.fetch {
        wake.notify();
    }
    let mut at = round_at;
    if woke.look {
        at = Instant::now();
    }
    if let Some(due_in) = woke.due_in {
        at = at.min(Instant::now() + due_in);
    }
    at
}

/// How long until the next round after `fed`: at once is never needed (a
/// round drains what fits), `poll_interval` while due tasks wait for room,
/// else until the next task is due, and at most [`LOOK_EVERY`].
fn until_next(fed: &Fed, poll_interval: Duration) -> Duration {
    match fed.next_ms {
        Some(next) if next <= fed.now_ms => poll_interval,
        Some(next) => Duration::from_millis((next - fed.now_ms) as u64).min(LOOK_EVERY),
        None => LOOK_EVERY,
    }
}

/// Drains as long as there is room, a few rounds per wake-up: the last
/// round's reply, or `None` when the queue cannot be reached (said once
/// per outage: `quiet` while it lasts).
async fn feed(queue: &Queue, quiet: bool) -> Option<Fed> {
    let mut last = None;
    for _ in 0..10 {
        match queue.feed().await {
            Ok(fed) => {
                if fed.moved > 0 {
                    debug!(tasks = fed.moved, "fed tasks to the queue");
                }
                // A full batch may have left more due tasks behind, with room for them.
                let more = fed.moved >= FEED_BATCH && fed.next_ms.is_some_and(|n| n <= fed.now_ms);
                last = Some(fed);
                if !more {
                    break;
                }
            }
            Err(e) => {
                if !quiet {
                    warn!(error = %e, "feeder cannot reach the queue; retrying");
                }
                return None;
            }
        }
    }
    last
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(now_ms: i64, next_ms: Option<i64>) -> Fed {
        Fed {
            moved: 0,
            now_ms,
            next_ms,
            ready: 0,
        }
    }

    #[test]
    fn the_next_round_is_when_the_next_task_is_due() {
        let poll = Duration::from_millis(200);
        assert_eq!(until_next(&fed(1_000, None), poll), LOOK_EVERY);
        assert_eq!(
            until_next(&fed(1_000, Some(3_500)), poll),
            Duration::from_millis(2_500)
        );
        assert_eq!(until_next(&fed(1_000, Some(999_000)), poll), LOOK_EVERY);
        // Due already: waiting for room in apalis.
        assert_eq!(until_next(&fed(1_000, Some(1_000)), poll), poll);
        assert_eq!(until_next(&fed(1_000, Some(10)), poll), poll);
    }
}
