//! Helpers for the operations tests (notify, watchdog, metrics, health,
//! secrets, logs): the real `quota-worker` binary as a supervised child, a
//! Unix datagram socket that plays systemd's `NOTIFY_SOCKET` (and records
//! which pid sent each message, as systemd's `NotifyAccess=main` does), the
//! real simulated metered API on loopback, a plain HTTP/1.0 GET for
//! `/metrics`, `/healthz` and `/readyz`, and a parser for the Prometheus text
//! format. Every process is stopped by its pid on `Drop`.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{TestConfig, bin, collect_lines, wait_until};

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

/// The real binary as a child, its stdout and stderr collected line by line.
pub struct Proc {
    /// Names it in messages.
    pub label: String,
    child: Child,
    status: Option<ExitStatus>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

/// The environment variables a test must not inherit from whoever runs it.
const SCRUBBED: [&str; 8] = [
    "QUOTA_WORKER_REDIS_URL",
    "QUOTA_WORKER_CONFIG",
    "QUOTA_WORKER_METRICS_LISTEN",
    "QUOTA_WORKER_FAULT",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "RUST_LOG",
];

/// `quota-worker -c cfg ARGS` with `env` (and `RUST_LOG=info` unless `env`
/// sets it), nothing inherited that would change its behaviour.
pub fn command(cfg: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("-c").arg(cfg).args(args);
    for k in SCRUBBED {
        cmd.env_remove(k);
    }
    cmd.env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

impl Proc {
    /// Starts `quota-worker -c cfg ARGS`.
    pub fn start(label: &str, cfg: &TestConfig, args: &[&str], env: &[(&str, &str)]) -> Proc {
        Self::start_at(label, &cfg.path(), args, env)
    }

    /// Starts `quota-worker -c config ARGS`.
    pub fn start_at(label: &str, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = command(config, args, env)
            .spawn()
            .expect("spawn quota-worker");
        let stdout = collect_lines(child.stdout.take().expect("stdout"));
        let stderr = collect_lines(child.stderr.take().expect("stderr"));
        Proc {
            label: label.to_owned(),
            child,
            status: None,
            stdout,
            stderr,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs (reaps it once it exited).
    pub fn running(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.status = Some(s);
        }
        self.status.is_none()
    }

    /// SIGTERM, by pid, if it still runs.
    pub fn term(&mut self) {
        if self.running() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
    }

    /// Waits up to `timeout` for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.running() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let the readers reach EOF.
        std::thread::sleep(Duration::from_millis(50));
        self.status
    }

    /// stderr lines so far.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().expect("stderr").clone()
    }

    /// stdout lines so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().expect("stdout").clone()
    }

    /// stderr so far, as one string.
    pub fn log(&self) -> String {
        self.stderr_lines().join("\n")
    }

    /// Waits up to `timeout` for a stderr line containing `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || {
            self.stderr
                .lock()
                .expect("stderr")
                .iter()
                .any(|l| l.contains(needle))
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(80)..];
            eprintln!(
                "----- {} (pid {}) stderr, last {} lines -----\n{}\n----- end of {} -----",
                self.label,
                self.child.id(),
                tail.len(),
                tail.join("\n"),
                self.label
            );
        }
    }
}

/// The simulated metered API on loopback, on a runtime of its own (not every
/// test file that includes this module uses it).
#[allow(unused_imports)]
pub use crate::support::daemon::Upstream;

/// A job that pages the simulator's videos list per region into
/// `data/{job}/{region}.jsonl`, never fired by its schedule (`trigger` it).
pub fn job_toml(name: &str, endpoint: &str, url: &str, regions: &[&str], max_pages: u32) -> String {
    let regions: Vec<String> = regions.iter().map(|r| format!("{r:?}")).collect();
    format!(
        r#"[{name}]
schedule = "0 0 0 1 1 * 2099"
endpoint = "{endpoint}"
fan_out = {{ region = [{regions}] }}
retry = {{ attempts = 3, backoff = "100ms", max_backoff = "200ms" }}

[{name}.request]
method = "GET"
url = "{url}/youtube/v3/videos"
query = {{ chart = "mostPopular", regionCode = "{{region}}", part = "snippet", maxResults = "50", key = "{{secret}}" }}

[{name}.pagination]
cursor = "/nextPageToken"
param = "pageToken"
max_pages = {max_pages}

[{name}.sink]
kind = "jsonl"
path = "data/{{job}}/{{region}}.jsonl"
records = "/items"
"#,
        regions = regions.join(", "),
    )
}

/// `GET path` on `127.0.0.1:port` (HTTP/1.0, 5 s timeouts): status and body,
/// `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with `_bucket`, `_sum`, `_count` suffixes as written).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Every sample, in page order.
    pub samples: Vec<Sample>,
    /// The page as served.
    pub text: String,
}

impl Metrics {
    /// Parses the text format (labels values without escaped quotes, which
    /// is all the product writes).
    pub fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad metrics line {line:?}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("bad labels in {line:?}"));
                    let mut labels = BTreeMap::new();
                    for pair in body.split("\",").filter(|p| !p.is_empty()) {
                        let (k, v) = pair
                            .split_once("=\"")
                            .unwrap_or_else(|| panic!("bad label {pair:?} in {line:?}"));
                        labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
                    }
                    (name.to_owned(), labels)
                }
            };
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Metrics {
            samples,
            text: text.to_owned(),
        }
    }

    /// Samples of `name` whose labels include all of `want`.
    pub fn select(&self, name: &str, want: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && want
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The sum of [`Metrics::select`] (0 when none).
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.select(name, want).iter().map(|s| s.value).sum()
    }

    /// The one sample of `name` with labels `want`; panics unless exactly one.
    pub fn one(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        let found = self.select(name, want);
        assert_eq!(
            found.len(),
            1,
            "expected one {name}{want:?}, found {found:?}; page:\n{}",
            self.text
        );
        found[0].value
    }
}

/// Scrapes `/metrics` on `port` (panics unless it answers 200).
pub fn scrape(port: u16) -> Metrics {
    match http_get(port, "/metrics") {
        Some((200, body)) => Metrics::parse(&body),
        other => panic!("GET /metrics on port {port}: {other:?}"),
    }
}

/// A free loopback port, different from every port in `taken`.
pub fn free_port_except(taken: &[u16]) -> u16 {
    loop {
        let p = crate::support::free_port();
        if !taken.contains(&p) {
            return p;
        }
    }
}

/// Waits up to `timeout` until `port` serves `/healthz`.
pub fn wait_http(port: u16, timeout: Duration) -> bool {
    wait_until(timeout, || {
        matches!(http_get(port, "/healthz"), Some((200, _)))
    })
}

/// Pids of the children of `parent` whose command name is `comm`.
pub fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split at ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) && name == comm {
            out.push(pid);
        }
    }
    out
}

/// The environment of process `pid`, as `NAME=value` strings.
pub fn environ(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/environ: {e}"));
    raw.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// A loopback HTTP "upstream" that accepts connections and never answers:
/// a task fetching from it stays in flight until its request times out.
pub struct Blackhole {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Blackhole {
    /// Listens on a free port of 127.0.0.1.
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !done.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => held.push(s),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Blackhole {
            port,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
