//! The daemon in this process (`daemon::run`), as the pipeline tests and the
//! end-to-end benchmark run it: started, ready, stopped as SIGTERM would.

use std::sync::Arc;
use std::time::Duration;

use quota_worker::config::{Config, Secrets};
use quota_worker::daemon::{self, DaemonError, RunOptions};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running in-process daemon; dropping it asks it to stop.
pub struct InProcess {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), DaemonError>>>,
}

impl InProcess {
    /// Starts `daemon::run` with `opts` (its `ready` is set here) and waits
    /// up to 20 s until it reports ready.
    pub async fn start(config: Arc<Config>, secrets: Secrets, mut opts: RunOptions) -> Self {
        let (ready_tx, mut ready_rx) = tokio::sync::watch::channel(false);
        opts.ready = Some(ready_tx);
        let (stop, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(daemon::run(config, Arc::new(secrets), opts, async move {
            let _ = stop_rx.await;
        }));
        tokio::time::timeout(Duration::from_secs(20), ready_rx.wait_for(|r| *r))
            .await
            .expect("daemon ready within 20 s")
            .expect("daemon ready");
        InProcess {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops it and waits (30 s at most) for a clean exit.
    pub async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("daemon stops within 30 s")
                .expect("daemon task")
                .expect("daemon ran without error");
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
