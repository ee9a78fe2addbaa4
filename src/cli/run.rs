//! `quota-worker run`: scheduler and workers in the foreground until SIGTERM
//! or SIGINT; exit 0 on a clean shutdown, else an exit code per cause
//! (`daemon_error`, docs/commands.md).

use std::sync::Arc;

use super::Exit;
use crate::config::Config;
use crate::daemon::{self, DaemonError, RunOptions};
use crate::embedded::EmbeddedError;

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed when
/// this is called, not when the future is first polled: a SIGTERM while the
/// daemon still starts (waiting for Redis, say) is a clean shutdown too, not
/// the default action's death by signal.
pub(crate) fn shutdown_signal() -> impl Future<Output = ()> + Send {
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

/// Counts SIGHUPs: each is a request to reload the config (the daemon's
/// `reload`). Installed when this is called, like [`shutdown_signal`]: a
/// SIGHUP while the daemon still starts is a reload once it runs, not the
/// default action's death by signal.
pub(crate) fn reload_signal() -> tokio::sync::watch::Receiver<u64> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP received");
                    tx.send_modify(|n| *n += 1);
                }
            });
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP: the config cannot be reloaded without a restart")
        }
    }
    rx
}

/// Maps a daemon error to an exit code, logging it: through the log, so that
/// with `--log-format json` the one line that says why the daemon stopped is
/// JSON like every other line a log shipper reads.
///
/// Per sysexits(3): a service the daemon needs that is missing or does not
/// answer (Redis, `redis-server`) is EX_UNAVAILABLE (69); what the config
/// asks for and this host cannot give (a metrics address in use or not
/// local, a state directory too deep for a Unix socket) is EX_CONFIG (78),
/// fixed by changing the config, not by waiting; the rest is EX_SOFTWARE (70).
pub(crate) fn daemon_error(e: &DaemonError) -> Exit {
    tracing::error!(error = %e, "quota-worker cannot run");
    match e {
        DaemonError::Unreachable { .. }
        | DaemonError::QuotaUnreachable { .. }
        | DaemonError::Embedded(
            EmbeddedError::NotInstalled
            | EmbeddedError::InUse(_)
            | EmbeddedError::Stale(_)
            | EmbeddedError::NoAnswer { .. },
        ) => Exit::Unavailable,
        // Misconfigured, not unavailable: waiting will not fix it, an
        // operator must (EX_CONFIG, like our own config errors).
        DaemonError::Metrics { .. }
        | DaemonError::Auth { .. }
        | DaemonError::Permissions { .. }
        | DaemonError::WindowPermissions { .. }
        | DaemonError::UnsafeEviction { .. }
        | DaemonError::QuotaUnsafeEviction { .. }
        | DaemonError::Embedded(EmbeddedError::PathTooLong(_)) => Exit::Config,
        DaemonError::Embedded(EmbeddedError::Io { .. }) | DaemonError::Http(_) => Exit::Software,
    }
}

/// Runs the command.
pub async fn run(config: Config) -> Exit {
    // First: a SIGHUP from here on reloads, never kills.
    let reload = reload_signal();
    let secrets = match config.secrets() {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("error: {e}");
            }
            return Exit::Config;
        }
    };
    if let Err(code) = super::check_sinks(&config) {
        return code;
    }
    match super::check_tables(&config, true).await {
        Err(code) => return code,
        Ok(tables) => crate::sink::log_tables(&tables),
    }
    // Without a spool, a page the sink cannot take ends its task `failed`
    // (cursor kept) instead of waiting there: worth a warning, not a refusal.
    let spool = crate::sink::spool_dir(&config);
    if let Err(e) = crate::sink::probe_dir(&spool) {
        tracing::warn!(dir = %spool.display(), error = %e,
            "the spool directory cannot be written: a page a sink cannot take will be fetched again once it can");
    }
    let opts = RunOptions {
        reload: Some(reload),
        ..RunOptions::default()
    };
    match daemon::run(Arc::new(config), Arc::new(secrets), opts, shutdown_signal()).await {
        Ok(()) => Exit::Ok,
        Err(e) => daemon_error(&e),
    }
}
