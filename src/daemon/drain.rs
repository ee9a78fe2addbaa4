//! A graceful stop of an apalis worker that does not wait out the shutdown
//! timeout when many tasks end during it (apalis pitfall 14).
//!
//! apalis-core 1.0 sends every task's ack (`TaskEvent::Complete`) into a
//! bounded channel of `batch_size × 4` slots (`Persisted::layer`), which only
//! the worker's `poll_ready` and `poll_close` empty. Once a worker is
//! stopped, `CallAll::poll_next` calls neither until every task future has
//! ended; but a task future whose ack finds the channel full waits for a slot
//! and never ends. With batch 1, a fifth task ending during the drain hung
//! the worker until our shutdown timeout dropped it, with the acks lost.
//!
//! So a stop is two steps. First the worker is *paused*: it takes no new
//! task, but keeps polling the backend, which empties the channel (writing
//! the acks) and heartbeats. Once every task it started has been seen
//! through the whole service stack, acks included ([`Drain::settled`]), it
//! is *stopped*: nothing is left in flight, so the close is immediate.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use apalis::prelude::{Event, Layer, Service, WorkerContext};
use tokio::sync::Notify;

/// Counts the tasks a worker started and has not yet finished, acks
/// included.
#[derive(Debug, Default)]
pub(super) struct Drain {
    /// Started (counted by [`CountStarts`]) and not yet seen out of the
    /// service stack (counted by [`Drain::on_event`]).
    outstanding: AtomicUsize,
    /// Told whenever a task finishes.
    finished: Notify,
}

impl Drain {
    /// The worker's event listener: a task's result event is emitted once
    /// its whole future, ack included, has ended.
    pub(super) fn on_event(&self, _: &WorkerContext, event: &Event) {
        if matches!(event, Event::Success(_) | Event::Error(_)) {
            // Saturating: a result we did not count (none exists today)
            // must not wrap the count around.
            let _ = self
                .outstanding
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            self.finished.notify_waiters();
        }
    }

    /// Resolves once no started task is outstanding. Call it on a paused
    /// worker, or new tasks may start meanwhile.
    pub(super) async fn settled(&self) {
        loop {
            let finished = self.finished.notified();
            tokio::pin!(finished);
            // Registered before the check: a task finishing between the
            // check and the wait still wakes us.
            finished.as_mut().enable();
            if self.outstanding.load(Ordering::SeqCst) == 0 {
                return;
            }
            finished.await;
        }
    }

    /// Tasks started and not yet finished.
    pub(super) fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }
}

/// Pauses `ctx` (no new task; acks and heartbeats go on), waits until every
/// started task has finished through the whole service stack, then stops
/// it, so that the worker's close has nothing left to wait for.
pub(super) async fn stop(ctx: &WorkerContext, drain: &Drain) {
    // A worker that is not running (not started yet, stopped by an error)
    // has nothing to pause; stopping is all there is to do.
    if ctx.pause().is_ok() {
        drain.settled().await;
    }
    let _ = ctx.stop();
}

/// The middleware that counts task starts: it sits inside apalis's
/// persistence layer, so its `call` runs once per task the worker starts.
#[derive(Debug, Clone)]
pub(super) struct CountStarts(pub(super) Arc<Drain>);

impl<S> Layer<S> for CountStarts {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Counted {
            inner,
            drain: self.0.clone(),
        }
    }
}

/// A service counted by [`CountStarts`].
#[derive(Debug, Clone)]
pub(super) struct Counted<S> {
    inner: S,
    drain: Arc<Drain>,
}

impl<S, Req> Service<Req> for Counted<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.drain.outstanding.fetch_add(1, Ordering::SeqCst);
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn settled_waits_for_every_started_task_to_finish() {
        let drain = Arc::new(Drain::default());
        let ctx = WorkerContext::new("drain-test");
        drain.outstanding.store(2, Ordering::SeqCst);
        let waiter = tokio::spawn({
            let drain = drain.clone();
            async move { drain.settled().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drain.on_event(&ctx, &Event::Success(Box::new(())));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "one task is still outstanding");
        drain.on_event(&ctx, &Event::Error(Arc::new("boom".into())));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("settled once both finished")
            .unwrap();
        // Other events do not count, nor does a surplus result.
        drain.on_event(&ctx, &Event::HeartBeat);
        drain.on_event(&ctx, &Event::Success(Box::new(())));
        assert_eq!(drain.outstanding(), 0);
    }
}
