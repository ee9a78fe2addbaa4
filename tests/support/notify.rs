//! A Unix datagram socket that plays systemd's `NOTIFY_SOCKET`: a thread
//! reads every datagram and records each line with when it came and which
//! pid sent it (`SCM_CREDENTIALS`), as systemd's `NotifyAccess=main` checks.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::wait_until;

/// One line of one notify datagram.
#[derive(Debug, Clone)]
pub struct Notice {
    /// When it arrived.
    pub at: Instant,
    /// The sender's pid, from `SCM_CREDENTIALS`.
    pub pid: Option<u32>,
    /// `READY=1`, `WATCHDOG=1`, `STATUS=...`, `STOPPING=1`.
    pub line: String,
}

/// A bound `NOTIFY_SOCKET`: a thread reads every datagram into a list.
pub struct NotifySocket {
    dir: tempfile::TempDir,
    notices: Arc<Mutex<Vec<Notice>>>,
    stop: Arc<AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// `recvmsg` with the sender's credentials.
fn recv_with_pid(sock: &UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, Option<u32>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // u64s, for the alignment cmsghdr needs.
    let mut control = [0u64; 16];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at buffers that live across the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut pid = None;
    // SAFETY: walking the control messages the kernel just wrote into
    // `control`, with the libc macros made for it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                pid = Some(cred.pid as u32);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, pid))
}

impl NotifySocket {
    /// Binds `notify.sock` in a new temp dir.
    pub fn bind() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind notify socket");
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with a pointer to a c_int that outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_PASSCRED: {}", std::io::Error::last_os_error());
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .expect("read timeout");
        let notices = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (out, done) = (notices.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            while !done.load(Ordering::Relaxed) {
                match recv_with_pid(&sock, &mut buf) {
                    Ok((n, pid)) => {
                        let at = Instant::now();
                        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                        let mut out = out.lock().expect("notices");
                        for line in text.lines().filter(|l| !l.is_empty()) {
                            out.push(Notice {
                                at,
                                pid,
                                line: line.to_owned(),
                            });
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock
                                | std::io::ErrorKind::TimedOut
                                | std::io::ErrorKind::Interrupted
                        ) => {}
                    Err(e) => panic!("notify socket: {e}"),
                }
            }
        });
        NotifySocket {
            dir,
            notices,
            stop,
            reader: Some(reader),
        }
    }

    /// The socket's path, for `NOTIFY_SOCKET`.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("notify.sock")
    }

    /// Everything received so far.
    pub fn notices(&self) -> Vec<Notice> {
        self.notices.lock().expect("notices").clone()
    }

    /// The received lines equal to `line`.
    pub fn count(&self, line: &str) -> usize {
        self.notices().iter().filter(|n| n.line == line).count()
    }

    /// Waits up to `timeout` until `line` has arrived `n` times; returns when
    /// the n-th one did.
    pub fn wait_for(&self, line: &str, n: usize, timeout: Duration) -> Option<Instant> {
        let mut found = None;
        wait_until(timeout, || {
            found = self
                .notices()
                .iter()
                .filter(|x| x.line == line)
                .nth(n - 1)
                .map(|x| x.at);
            found.is_some()
        });
        found
    }

    /// The notices as one printable list (for assertion messages).
    pub fn dump(&self, since: Instant) -> String {
        self.notices()
            .iter()
            .map(|n| {
                format!(
                    "{:>8.3}s pid {:?}: {}",
                    n.at.saturating_duration_since(since).as_secs_f64(),
                    n.pid,
                    n.line
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}
