//! What a running task must undo however it ends, even by a panic: the
//! background renewal of its item lock, and its count in `in_flight`.
//!
//! Both are guards (`Drop`), not straight-line code after an `.await`: a task
//! that panics mid-page unwinds through them, so its lock stops being renewed
//! (and lapses within its TTL, freeing the item for the next task) and the
//! daemon's in-flight count, which the watchdog's `STATUS=` line, the metrics
//! and the shutdown report read, comes back down.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use tokio_util::task::AbortOnDropHandle;

use crate::stats::Stats;

/// Counts one running task in a counter for as long as it lives.
#[must_use = "the task counts as running only while this lives"]
pub(crate) struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    /// Adds one to `counter` until dropped.
    pub(crate) fn enter(counter: &'a AtomicU64) -> Self {
        Stats::add(counter, 1);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        Stats::sub(self.0, 1);
    }
}

/// A background loop (the item lock's renewal) that runs only while this
/// lives: dropping it aborts the loop.
#[must_use = "dropping it stops the renewal at once"]
pub(crate) struct Renewer {
    _task: AbortOnDropHandle<()>,
    /// Set by the loop when what it renews is gone (the item lock lapsed
    /// and may be another task's now).
    lost: Arc<AtomicBool>,
}

impl Renewer {
    /// Runs `renew` on the runtime until this is dropped.
    #[cfg(test)]
    pub(crate) fn spawn(renew: impl Future<Output = ()> + Send + 'static) -> Self {
        Self::watching(Arc::default(), renew)
    }

    /// Runs `renew`, which sets `lost` when what it renews is gone.
    pub(crate) fn watching(
        lost: Arc<AtomicBool>,
        renew: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Renewer {
            _task: AbortOnDropHandle::new(tokio::spawn(renew)),
            lost,
        }
    }

    /// Set once the loop finds what it renews gone.
    pub(crate) fn lost_flag(&self) -> Arc<AtomicBool> {
        self.lost.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    /// Regression (issue 10): the lock renewer and the in-flight count were
    /// undone by straight-line code after the page loop, so a task that
    /// panicked left its renewer renewing the item lock forever (the item
    /// never ran again) and `in_flight` one too high.
    #[tokio::test]
    async fn a_panicking_task_stops_its_renewer_and_leaves_in_flight() {
        let in_flight = Arc::new(AtomicU64::new(0));
        let renewals = Arc::new(AtomicU64::new(0));
        let task = {
            let (in_flight, renewals) = (in_flight.clone(), renewals.clone());
            tokio::spawn(async move {
                let _renewer = Renewer::spawn(async move {
                    loop {
                        renewals.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                });
                let _running = InFlight::enter(&in_flight);
                tokio::time::sleep(Duration::from_millis(30)).await;
                assert_eq!(
                    in_flight.load(Ordering::Relaxed),
                    1,
                    "counted while running"
                );
                panic!("a bug in a task");
            })
        };
        let joined = task.await;
        assert!(joined.is_err_and(|e| e.is_panic()), "the task panicked");
        assert_eq!(in_flight.load(Ordering::Relaxed), 0, "in_flight back down");

        // Aborting is asynchronous: give the renewer a moment to be dropped,
        // then check it renews no more.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let after = renewals.load(Ordering::Relaxed);
        assert!(after > 0, "the renewer ran while the task did");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            renewals.load(Ordering::Relaxed),
            after,
            "the renewer kept renewing after its task panicked"
        );
        // Its future (and the counter clone it held) is gone.
        assert_eq!(Arc::strong_count(&renewals), 1);
    }

    #[tokio::test]
    async fn a_task_that_ends_normally_undoes_both_too() {
        let in_flight = AtomicU64::new(0);
        let renewals = Arc::new(AtomicU64::new(0));
        {
            let r = renewals.clone();
            let _renewer = Renewer::spawn(async move {
                let _hold = r;
                std::future::pending::<()>().await
            });
            let _running = InFlight::enter(&in_flight);
            let _twice = InFlight::enter(&in_flight);
            assert_eq!(in_flight.load(Ordering::Relaxed), 2);
        }
        assert_eq!(in_flight.load(Ordering::Relaxed), 0);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(Arc::strong_count(&renewals), 1, "renewer dropped");
    }
}
