//! The embedded Redis: when `[redis] url` is omitted, the daemon runs its own
//! `redis-server` on a Unix socket in the state directory, with AOF on so
//! quota state survives a restart, and stops it on exit.
//!
//! The child gets SIGTERM when the daemon dies, even by SIGKILL
//! (`PR_SET_PDEATHSIG`), so it flushes its AOF and never outlives us. A
//! redis-server still answering on the socket when its daemon is gone is
//! never adopted: it may be shutting down right now (its daemon was SIGKILLed
//! a moment ago and restarted at once), and an adopted one would not be
//! stopped with us. It is asked to shut down (it flushes its AOF), and once it
//! is gone we start our own on the same files.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::config::RedisUrl;

/// The embedded Redis's socket in `state_dir`.
pub(crate) fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("redis.sock")
}

/// Why the embedded Redis could not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// `redis-server` is not installed.
    #[error(
        "the embedded Redis needs redis-server, which is not installed: install it (Debian/Ubuntu: sudo apt-get install redis-server), or set [redis] url to an existing Redis"
    )]
    NotInstalled,
    /// Another live daemon runs the embedded Redis of this state directory.
    #[error(
        "another quota-worker (pid {0}) runs the embedded Redis in this state directory; to run several daemons, give them one shared Redis with [redis] url (or QUOTA_WORKER_REDIS_URL)"
    )]
    InUse(u32),
    /// The socket path is too long for a Unix socket.
    #[error(
        "the state directory path is too long for a Unix socket ({0}); use a shorter state_dir"
    )]
    PathTooLong(String),
    /// File system trouble.
    #[error("embedded Redis in {path}: {source}")]
    Io {
        /// Where.
        path: String,
        /// What.
        #[source]
        source: std::io::Error,
    },
    /// A redis-server left by a daemon that is gone did not stop.
    #[error(
        "a redis-server left on {0} by a daemon that is gone did not stop within 10 s; stop it, then start again"
    )]
    Stale(String),
    /// It started but never answered.
    #[error(
        "the embedded redis-server did not come up within 10 s; its log ({log}) ends with:\n{tail}"
    )]
    NoAnswer {
        /// The log file.
        log: String,
        /// Its last lines.
        tail: String,
    },
}

/// A running embedded Redis.
pub(crate) struct EmbeddedRedis {
    /// `None` only while it is being (re)started.
    child: Option<Child>,
    /// Its working directory (AOF).
    dir: PathBuf,
    /// Its log file.
    log: PathBuf,
    socket: PathBuf,
    owner_file: PathBuf,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedError + '_ {
    move |source| EmbeddedError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    pid > 0 && unsafe { libc::kill(pid as i32, 0) } == 0
}

async fn answers(socket: &Path) -> bool {
    let Ok(client) = redis::Client::open(format!("unix://{}", socket.display())) else {
        return false;
    };
    let ping = async {
        let mut c = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut c).await
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), ping).await,
        Ok(Ok(_))
    )
}

/// Writes `bytes` to `path`, never through a symbolic link planted there
/// (ELOOP; docs/security.md): a state file is written where it is or not
/// at all.
fn write_no_follow(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => std::io::Error::other(
                "it is a symbolic link, which quota-worker never writes through (docs/security.md); remove it",
            ),
            _ => e,
        })?
        .write_all(bytes)
}

/// Whether `pid` runs (a zombie, dead but not yet reaped, does not).
fn pid_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // pid (comm) state ...: comm may hold spaces and parentheses.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next()),
            Some("Z" | "X")
        ),
        Err(_) => pid_alive(pid),
    }
}

/// Stops the redis-server answering on `socket` (whose daemon is gone) and
/// waits until it has exited, so that two servers never share the AOF.
async fn shut_down_stale(socket: &Path) -> Result<(), EmbeddedError> {
    let url = format!("unix://{}", socket.display());
    let mut pid: Option<u32> = None;
    if let Ok(client) = redis::Client::open(url.as_str()) {
        let ask = async {
            let mut c = client.get_multiplexed_async_connection().await?;
            let info: String = redis::cmd("INFO").arg("server").query_async(&mut c).await?;
            pid = info
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|p| p.trim().parse().ok());
            // It may be shutting down already, and then drops us: fine.
            let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut c).await;
            Ok::<_, redis::RedisError>(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), ask).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !pid.is_some_and(pid_running) && !answers(socket).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(EmbeddedError::Stale(socket.display().to_string()))
}

impl EmbeddedRedis {
    /// Starts the embedded Redis of `state_dir`.
    pub(crate) async fn start(state_dir: &Path) -> Result<Self, EmbeddedError> {
        let dir = state_dir.join("redis");
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let socket = socket_path(state_dir);
        if socket.as_os_str().len() > 100 {
            return Err(EmbeddedError::PathTooLong(socket.display().to_string()));
        }
        let owner_file = dir.join("owner.pid");
        let me = std::process::id();

        if answers(&socket).await {
            let owner = std::fs::read_to_string(&owner_file)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok());
            match owner {
                Some(pid) if pid != me && pid_running(pid) => {
                    return Err(EmbeddedError::InUse(pid));
                }
                _ => {
                    tracing::warn!(socket = %socket.display(), "an embedded Redis of a daemon that is gone still answers: stopping it to start our own");
                    shut_down_stale(&socket).await?;
                }
            }
        }
        write_no_follow(&owner_file, me.to_string().as_bytes()).map_err(io_err(&owner_file))?;
        let mut redis = EmbeddedRedis {
            child: None,
            log: dir.join("redis.log"),
            dir,
            socket,
            owner_file,
        };
        if let Err(e) = redis.launch().await {
            redis.stop().await;
            return Err(e);
        }
        tracing::info!(socket = %redis.socket.display(), "embedded Redis started (AOF on)");
        Ok(redis)
    }

    /// Starts redis-server on our socket and files, and waits until it
    /// answers. The child is kept in `self` as soon as it exists, so that
    /// [`EmbeddedRedis::stop`] stops it whenever this is cancelled.
    async fn launch(&mut self) -> Result<(), EmbeddedError> {
        // A socket nobody answers on is stale.
        let _ = std::fs::remove_file(&self.socket);
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg("0")
            .arg("--unixsocket")
            .arg(&self.socket)
            .arg("--unixsocketperm")
            .arg("700")
            .arg("--dir")
            .arg(&self.dir)
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .args(["--save", ""])
            // Exactness needs every key kept (src/eviction.rs): under memory
            // pressure writes fail loudly instead of windows vanishing.
            .args(["--maxmemory-policy", "noeviction"])
            // Stream nodes of 32 entries, not 100: a refused spend's one
            // XRANGE walks at most 32 entries of a node, so a refusal at any
            // cost costs what one at cost 1 does, for ~10 B more per spend
            // (docs/redis.md, "Stream node size"; BENCHMARKS.md §7).
            .args(["--stream-node-max-entries", "32"])
            .arg("--logfile")
            .arg(&self.log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // redis-server speaks the notify protocol itself: it must not
            // tell systemd (or a test) that *we* are ready.
            .env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; it only asks the kernel to send
        // SIGTERM to the child when the thread that spawns it dies (so the
        // spawning happens on the daemon's main task, never on a pool thread).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        self.child = Some(match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(EmbeddedError::NotInstalled);
            }
            Err(e) => return Err(io_err(&self.dir)(e)),
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if answers(&self.socket).await {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        Err(EmbeddedError::NoAnswer {
            log: self.log.display().to_string(),
            tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        })
    }

    /// Keeps the server up: when it exits on its own (the OOM killer, a
    /// crash), starts it again on the same files (AOF: at most the last
    /// second of writes is lost), with backoff. Never returns: run it beside
    /// the daemon on the same task, drop it, then [`EmbeddedRedis::stop`].
    pub(crate) async fn keep_running(&mut self) -> std::convert::Infallible {
        let mut backoff = Duration::from_millis(100);
        loop {
            let up_since = Instant::now();
            let status = match self.child.as_mut() {
                Some(c) => c.wait().await,
                None => Err(std::io::Error::other("not running")),
            };
            self.child = None;
            if up_since.elapsed() > Duration::from_secs(60) {
                backoff = Duration::from_millis(100);
            }
            tracing::error!(status = ?status, log = %self.log.display(), "the embedded redis-server exited on its own; starting it again");
            loop {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
                match self.launch().await {
                    Ok(()) => {
                        tracing::info!(socket = %self.socket.display(), "embedded Redis started again (AOF on)");
                        break;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot start the embedded redis-server again");
                    }
                }
            }
        }
    }

    /// Its URL.
    pub(crate) fn url(&self) -> RedisUrl {
        RedisUrl::new(format!("unix://{}", self.socket.display()))
    }

    /// Stops it (SIGTERM: it flushes its AOF), waiting up to 10 s.
    pub(crate) async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                // SAFETY: kill(2) on the pid of a child we own and have not reaped.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
        let _ = std::fs::remove_file(&self.owner_file);
    }
}
