//! The ops endpoints' HTTP server, with limits no local client can get
//! around: at most [`MAX_CONNECTIONS`] connections at once, and a
//! connection that has not sent a complete request head within
//! [`HEAD_TIMEOUT`] (a new one, or an idle keep-alive one) is dropped. So
//! clients that connect and say nothing cannot take the descriptors the
//! daemon's own upstream requests need (issue 22 item 7: 1,100 of them under
//! a soft limit of 1,024 failed every task with "Too many open files").
//!
//! `axum::serve` cannot do either (it accepts without bound, and its hyper
//! builder has no timer, so no head timeout), hence this loop: hyper's
//! HTTP/1 connection with `header_read_timeout`, and a semaphore taken
//! *before* `accept`, as Go's `netutil.LimitListener` does: past the cap,
//! new connections wait in the kernel's listen queue, holding no descriptor
//! of the daemon, and are served in turn as slots free up. HTTP/1 only:
//! Prometheus, curl and browsers all speak it, and HTTP/2's preface sniffing
//! would wait on a silent client with no timer at all.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};

/// Connections served at once; the rest wait to be accepted.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may take to send a request head, counted from its
/// accept or from the end of its previous answer (keep-alive).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The listen queue: connections past [`MAX_CONNECTIONS`] wait here (the
/// kernel caps it at `net.core.somaxconn`, 4096 on current kernels). The
/// standard library's 128 would refuse the 130th waiting client at once
/// (its SYNs dropped) while the first 256 hold their slots.
const LISTEN_BACKLOG: u32 = 1024;
/// How long connections still open at shutdown get to finish their answer.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// At most one "listener full" warning this often.
const FULL_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Binds `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as the
/// standard library's bind sets it, so a restart rebinds at once).
pub(super) fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves `app` on `listener` until `stop` turns true; then accepts no more
/// and gives open connections [`SHUTDOWN_GRACE`] to finish.
pub(super) async fn run(listener: TcpListener, app: Router, mut stop: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT);
    let mut warned: Option<tokio::time::Instant> = None;
    loop {
        // A slot first, then the accept: while every slot is taken the
        // kernel holds new connections, not this process.
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if warned.is_none_or(|t| t.elapsed() >= FULL_WARNING_EVERY) {
                    warn!(
                        max = MAX_CONNECTIONS,
                        "metrics listener full: new connections wait until one ends (clients that send no request are dropped after {}s)",
                        HEAD_TIMEOUT.as_secs()
                    );
                    warned = Some(tokio::time::Instant::now());
                }
                tokio::select! {
                    slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
                    () = stopped(&mut stop) => break,
                }
            }
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                // A head timeout, a client gone mid-answer: theirs, not ours.
                debug!(error = %e, "metrics connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        debug!("metrics connections still open at shutdown were cut");
    }
}

/// Returns once `stop` is true (the borrow it returns is not `Send`, so it
/// must not live across the loop's other awaits).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// After a failed `accept`: a connection the client gave up on is nothing;
/// anything else (out of descriptors, above all) is logged and waited out
/// for a second, as a busy loop would not free anything.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    warn!(error = %e, "metrics listener cannot accept a connection; trying again in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
