//! `quota-worker run`: scheduler and workers in the foreground until SIGTERM
//! or SIGINT; exit 0 on a clean shutdown.

use std::sync::Arc;

use super::Exit;
use crate::config::Config;
use crate::daemon::{self, DaemonError, RunOptions};
use crate::embedded::EmbeddedError;

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed when
/// this is called, not when the future is first polled: a SIGTERM while the
/// daemon still starts (waiting for Redis, say) is a clean shutdown too, not
/// the default action's death by signal.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    async move {
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = int.recv() => tracing::info!("SIGINT received"),
                }
            }
            // No signal handling: never resolve rather than stop at once.
            _ => std::future::pending().await,
        }
    }
}

/// Maps a daemon error to an exit code, logging it: through the log, so that
/// with `--log-format json` the one line that says why the daemon stopped is
/// JSON like every other line a log shipper reads.
pub fn daemon_error(e: &DaemonError) -> Exit {
    tracing::error!(error = %e, "quota-worker cannot run");
    match e {
        DaemonError::Embedded(EmbeddedError::NotInstalled)
        | DaemonError::Embedded(EmbeddedError::InUse(_))
        | DaemonError::Embedded(EmbeddedError::Stale(_))
        | DaemonError::Unreachable { .. } => Exit::Unavailable,
        DaemonError::Embedded(EmbeddedError::PathTooLong(_)) => Exit::Config,
        // Misconfigured, not unavailable: waiting will not fix it, an
        // operator must (EX_CONFIG, like our own config errors).
        DaemonError::UnsafeEviction { .. } => Exit::Config,
        DaemonError::Metrics { .. } => Exit::Unavailable,
        _ => Exit::Software,
    }
}

/// Runs the command.
pub async fn run(config: Config) -> Exit {
    let secrets = match config.secrets() {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("error: {e}");
            }
            return Exit::Config;
        }
    };
    // Test-only fault injection for the watchdog (see daemon::RunOptions).
    let wedge_scheduler = std::env::var("QUOTA_WORKER_FAULT").is_ok_and(|f| f == "wedge-scheduler");
    let opts = RunOptions {
        wedge_scheduler,
        ..RunOptions::default()
    };
    match daemon::run(Arc::new(config), Arc::new(secrets), opts, shutdown_signal()).await {
        Ok(()) => Exit::Ok,
        Err(e) => daemon_error(&e),
    }
}
