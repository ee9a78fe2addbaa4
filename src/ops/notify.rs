//! The systemd notify protocol: `READY=1`, `STOPPING=1`, `WATCHDOG=1` while
//! the daemon's loops beat, and a `STATUS=` line every 5 s.
//!
//! Messages go to the socket systemd names in `NOTIFY_SOCKET`; a daemon run
//! in-process by a test is given its own socket instead
//! ([`Notifier::to`], through `daemon::Hooks`), as the environment is shared
//! by everything in a process.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::watch;
use tracing::warn;

use super::{OpsState, peek_all};
use crate::stats::Stats;

/// Where notify messages go, and how often the watchdog wants a ping.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    /// `None`: not run by systemd; nothing is sent.
    socket: Option<PathBuf>,
    /// `None`: no watchdog; no pings.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// As systemd set this process up: `NOTIFY_SOCKET`, and `WATCHDOG_USEC`
    /// when `WATCHDOG_PID` is unset or this process.
    pub(crate) fn from_env() -> Self {
        Notifier {
            socket: std::env::var_os("NOTIFY_SOCKET").map(PathBuf::from),
            watchdog: sd_notify::watchdog_enabled(),
        }
    }

    /// Messages to `socket`, with the watchdog's interval `watchdog`: for a
    /// daemon run in-process by a test.
    #[doc(hidden)]
    pub fn to(socket: PathBuf, watchdog: Option<Duration>) -> Self {
        Notifier {
            socket: Some(socket),
            watchdog,
        }
    }

    /// Sends one message; systemd not listening is not an error of ours.
    fn send(&self, state: NotifyState<'_>) {
        self.send_all(&[state]);
    }

    /// Sends `states` in one message (one datagram): systemd reads
    /// `RELOADING=1` and its `MONOTONIC_USEC=` together.
    fn send_all(&self, states: &[NotifyState<'_>]) {
        let Some(socket) = &self.socket else { return };
        let message: String = states.iter().map(|s| format!("{s}\n")).collect();
        let sent = (|| {
            let sock = UnixDatagram::unbound()?;
            // `@name` is an abstract socket (sd_notify(3)).
            let addr = match socket.to_str().and_then(|s| s.strip_prefix('@')) {
                Some(name) => SocketAddr::from_abstract_name(name)?,
                None => SocketAddr::from_pathname(socket)?,
            };
            sock.send_to_addr(message.as_bytes(), &addr)
        })();
        if let Err(e) = sent {
            tracing::debug!(error = %e, "cannot notify systemd");
        }
    }

    /// `READY=1`: Redis answers and the worker runs.
    pub(crate) fn ready(&self) {
        self.send(NotifyState::Ready);
    }

    /// `RELOADING=1` with `MONOTONIC_USEC=` (systemd's notify-reload
    /// protocol, systemd.service(5)): a reload begins; [`Notifier::ready`]
    /// ends it, whatever it came to.
    pub(crate) fn reloading(&self) {
        let mut states = vec![NotifyState::Reloading];
        states.extend(NotifyState::monotonic_usec_now().ok());
        self.send_all(&states);
    }

    /// `STOPPING=1`.
    pub(crate) fn stopping(&self) {
        self.send(NotifyState::Stopping);
    }

    /// Sends `WATCHDOG=1` at half the watchdog interval while the loops beat,
    /// and every 5 s a `STATUS=` line ("8 workers, 3 in flight, yt-key1
    /// 412/9500 units"). The status line reads Redis, so it is written by a
    /// task of its own: a Redis that hangs must not delay a ping (systemd
    /// would kill the daemon for what is `/readyz`'s business).
    pub(crate) async fn run(
        self,
        state: OpsState,
        concurrency: usize,
        mut stop: watch::Receiver<bool>,
    ) {
        let status = tokio::spawn(self.clone().status_loop(
            state.clone(),
            concurrency,
            stop.clone(),
        ));
        if let Some(watchdog) = self.watchdog {
            let every = (watchdog / 2).max(Duration::from_millis(100));
            let mut warned = false;
            loop {
                if state.health.loops_alive() {
                    self.send(NotifyState::Watchdog);
                    warned = false;
                } else if !warned {
                    warn!(
                        "a loop stopped beating: withholding the watchdog ping so systemd restarts the service"
                    );
                    warned = true;
                }
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        }
        let _ = status.await;
    }

    /// Writes the `STATUS=` line every 5 s, its quota figures read live
    /// (a peek per credential); not at all when no systemd listens, so an
    /// idle daemon run otherwise leaves Redis alone.
    async fn status_loop(
        self,
        state: OpsState,
        concurrency: usize,
        mut stop: watch::Receiver<bool>,
    ) {
        if self.socket.is_none() {
            return;
        }
        loop {
            let line = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                line = status_line(&state, concurrency) => line,
            };
            self.send(NotifyState::Status(&line));
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
    }
}
async fn status_line(state: &OpsState, concurrency: usize) -> String {
    let mut parts = vec![format!(
        "{concurrency} workers, {} in flight",
        Stats::get(&state.stats.in_flight)
    )];
    for (name, usage) in peek_all(&state.live().limiter).await {
        match usage.as_ref().and_then(|u| Some((u, u.windows.first()?))) {
            Some((u, w)) => {
                let blocked = if u.blocked_for.is_zero() {
                    ""
                } else {
                    " (blocked)"
                };
                parts.push(format!(
                    "{name} {}/{} units{blocked}",
                    w.used, w.window.units
                ));
            }
            None if usage.is_none() => parts.push(format!("{name} ? units (Redis unreachable)")),
            None => {}
        }
    }
    parts.join(", ")
}
