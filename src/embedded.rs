//! The embedded Redis: when `[redis] url` is omitted, the daemon runs its own
//! `redis-server` on a Unix socket in the state directory, with AOF on so
//! quota state survives a restart, and stops it on exit.
//!
//! The child gets SIGTERM when the daemon dies, even by SIGKILL
//! (`PR_SET_PDEATHSIG`), so it flushes its AOF and never outlives us. A child
//! left running anyway (another OS, a crash in between) is adopted when the
//! daemon that started it is gone.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::config::RedisUrl;

/// The embedded Redis's socket in `state_dir`.
pub fn socket_path(state_dir: &Path) -> PathBuf {
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
pub struct EmbeddedRedis {
    child: Option<Child>,
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

impl EmbeddedRedis {
    /// Starts (or adopts) the embedded Redis of `state_dir`.
    pub async fn start(state_dir: &Path) -> Result<Self, EmbeddedError> {
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
                Some(pid) if pid != me && pid_alive(pid) => return Err(EmbeddedError::InUse(pid)),
                _ => {
                    tracing::warn!(socket = %socket.display(), "adopting an embedded Redis left running by a daemon that is gone");
                    std::fs::write(&owner_file, me.to_string()).map_err(io_err(&owner_file))?;
                    return Ok(EmbeddedRedis {
                        child: None,
                        socket,
                        owner_file,
                    });
                }
            }
        }
        // A socket nobody answers on is stale.
        let _ = std::fs::remove_file(&socket);

        let log = dir.join("redis.log");
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg("0")
            .arg("--unixsocket")
            .arg(&socket)
            .arg("--unixsocketperm")
            .arg("700")
            .arg("--dir")
            .arg(&dir)
            .args(["--appendonly", "yes", "--appendfsync", "everysec"])
            .args(["--save", ""])
            .arg("--logfile")
            .arg(&log)
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
        // SIGTERM to the child when this thread's process dies.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(EmbeddedError::NotInstalled);
            }
            Err(e) => return Err(io_err(&dir)(e)),
        };
        std::fs::write(&owner_file, me.to_string()).map_err(io_err(&owner_file))?;
        let mut me = EmbeddedRedis {
            child: Some(child),
            socket,
            owner_file,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if answers(&me.socket).await {
                tracing::info!(socket = %me.socket.display(), "embedded Redis started (AOF on)");
                return Ok(me);
            }
            if let Some(c) = me.child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        me.stop().await;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(5).collect();
        Err(EmbeddedError::NoAnswer {
            log: log.display().to_string(),
            tail: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        })
    }

    /// Its URL.
    pub fn url(&self) -> RedisUrl {
        RedisUrl::new(format!("unix://{}", self.socket.display()))
    }

    /// Stops it (SIGTERM: it flushes its AOF), waiting up to 10 s.
    pub async fn stop(mut self) {
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
        } else {
            // Adopted: ask it to shut down over its socket.
            if let Ok(client) = redis::Client::open(self.url().expose())
                && let Ok(mut c) = client.get_multiplexed_async_connection().await
            {
                let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut c).await;
            }
        }
        let _ = std::fs::remove_file(&self.owner_file);
    }
}
