//! Tokens that expire: a credential's `secret_command` prints its secret
//! (a GitHub App installation token, an OAuth access token), and the daemon
//! keeps what it printed in memory only, per credential (per tenant of a
//! template), until `secret_ttl` has passed or an answer was `401`.
//!
//! The command runs with no standard input, the daemon's environment and a
//! 10 s limit; it is never run per request, only when a task needs a token
//! and the one kept is missing, past its TTL, or refused with a 401. A
//! failure (exit status other than 0, the time limit, nothing printed) is
//! kept for a minute: tasks meanwhile fail with it and run nothing, so a
//! broken helper is not run by every task of a busy daemon. A 401 re-mints
//! at most once a minute too, so a token the upstream refuses for another
//! reason (a revoked app) does not run the command for every request.
//!
//! The token never leaves the process: not in Redis, files, logs or
//! metrics; the command's standard error is logged with every secret the
//! process knows scrubbed, the new token and the one it replaces included.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};

use tracing::{info, warn};

use crate::config::Secret;
use crate::config::defaults::MAX_SECRET_FILE_BYTES;
use crate::scrub::Scrubber;

/// How long the command may run before it is killed.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(10);
/// After a failure, and between re-mints after a 401: at most once per
/// this, per credential (tenant).
pub(crate) const AGAIN_AFTER: Duration = Duration::from_secs(60);
/// The most of its standard error that is read (and logged).
const MAX_STDERR: u64 = 16 << 10;

// `MintError::TooLong` says "64 KiB".
const _: () = assert!(MAX_SECRET_FILE_BYTES == 64 << 10);

/// Why the command gave no token. Its words never hold what the command
/// printed on its standard output (that would be the secret).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum MintError {
    /// It could not be started (missing, not executable).
    #[error("cannot run {program}: {why}")]
    Spawn { program: String, why: String },
    /// It ended with a status other than 0 (its standard error is logged).
    #[error("{program} exited with {status} (its standard error is in the daemon's log)")]
    Exit { program: String, status: String },
    /// It ran past [`TIMEOUT`] and was killed.
    #[error("{program} did not finish within 10 s and was killed")]
    Timeout { program: String },
    /// It printed nothing but white space.
    #[error("{program} printed nothing on its standard output")]
    Empty { program: String },
    /// It printed more than a token can be (64 KiB).
    #[error("{program} printed more than 64 KiB on its standard output")]
    TooLong { program: String },
    /// What it printed is not UTF-8 text.
    #[error("{program} printed something that is not UTF-8 text")]
    NotText { program: String },
    /// Reading its output failed.
    #[error("reading the output of {program} failed: {why}")]
    Read { program: String, why: String },
}

/// Runs `argv` once (no shell, no standard input, [`TIMEOUT`]) and returns
/// what it printed, trimmed. Its standard error is logged line by line,
/// scrubbed of `known` secrets and of the token it printed; `name` says
/// whose command it is.
///
/// The command runs in a process group of its own, and is judged by its
/// exit status and what it printed before it exited: a background child
/// that still holds its standard output does not make it wait (issue 37,
/// item 4: a helper that printed its token and exited 0 was "killed at
/// 10 s" for that). Once it has exited, and at the timeout, the whole
/// group is killed, so none of its processes outlives it (a `sleep` under
/// `sh` used to live on, one more at every run). More than 64 KiB on its
/// standard output fails at once, "printed more than 64 KiB".
pub(crate) async fn run(
    argv: &[String],
    name: &str,
    known: &[Secret],
) -> Result<Secret, MintError> {
    let program = argv.first().cloned().unwrap_or_default();
    let mut child = tokio::process::Command::new(&program)
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| MintError::Spawn {
            program: program.clone(),
            why: e.to_string(),
        })?;
    let group = Group::of(&child);
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        unreachable!("both were asked for as pipes");
    };
    let out = Collected::spawn(stdout, MAX_SECRET_FILE_BYTES);
    let err = Collected::spawn(stderr, MAX_STDERR);
    let read_error = |e: std::io::Error| MintError::Read {
        program: program.clone(),
        why: e.to_string(),
    };
    let ended = tokio::select! {
        exited = group.exited() => Ended::Exited(exited),
        () = out.overflowed() => Ended::Overflowed,
        () = tokio::time::sleep(TIMEOUT) => Ended::TimedOut,
    };
    // Whatever became of it, nothing of its group is left running (its
    // exited leader, not yet reaped, keeps the group's id from reuse).
    group.kill();
    let status = child.wait().await.map_err(read_error);
    // Reaped: its id may be another group's from now on.
    group.disarm();
    let status = status?;
    let out = out.finish().await;
    let err = err.finish().await;
    match ended {
        Ended::Exited(Err(e)) => return Err(read_error(e)),
        Ended::Overflowed => return Err(MintError::TooLong { program }),
        Ended::TimedOut => return Err(MintError::Timeout { program }),
        Ended::Exited(Ok(())) => {}
    }
    if out.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(MintError::TooLong { program });
    }
    let token = String::from_utf8(out).ok().map(|t| t.trim().to_owned());
    let scrubber = Scrubber::new(known.iter().chain(token.as_ref().map(Secret::new).as_ref()));
    log_stderr(&scrubber, name, &err, status.success());
    if !status.success() {
        let status = status.to_string();
        return Err(MintError::Exit { program, status });
    }
    match token {
        None => Err(MintError::NotText { program }),
        Some(t) if t.is_empty() => Err(MintError::Empty { program }),
        Some(t) => Ok(Secret::new(t)),
    }
}

/// How a command's run ended.
enum Ended {
    /// It exited (`Err`: waiting for it failed).
    Exited(std::io::Result<()>),
    /// It printed more than a token can be.
    Overflowed,
    /// It ran past [`TIMEOUT`].
    TimedOut,
}

/// The command's process group (its id is the command's pid): killed
/// whole, when the command has exited, at the timeout, or when the task
/// that waits for it goes away.
struct Group {
    pid: Option<libc::pid_t>,
}

impl Group {
    fn of(child: &tokio::process::Child) -> Self {
        Group {
            pid: child.id().and_then(|p| libc::pid_t::try_from(p).ok()),
        }
    }

    /// Waits until the command (the group's leader) has exited, without
    /// reaping it (`waitid` with `WNOWAIT`): while it is a zombie its pid,
    /// the group's id, cannot be reused, so [`Group::kill`] can only reach
    /// its own processes.
    async fn exited(&self) -> std::io::Result<()> {
        let Some(pid) = self.pid else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || {
            loop {
                // SAFETY: a zeroed siginfo_t is a valid out-parameter.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: waits for our own child, writing only into `info`.
                let rc = unsafe {
                    libc::waitid(
                        libc::P_PID,
                        pid as libc::id_t,
                        &mut info,
                        libc::WEXITED | libc::WNOWAIT,
                    )
                };
                if rc == 0 {
                    return Ok(());
                }
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Its leader was reaped: nothing is signalled any more (the id is
    /// free for another group).
    fn disarm(mut self) {
        self.pid = None;
    }

    /// Kills every process of the group (SIGKILL).
    fn kill(&self) {
        if let Some(pid) = self.pid {
            // SAFETY: signals the process group the command leads; none
            // other can have its id while the leader is unreaped.
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // The task went away before the command ended (a daemon shutting
        // down): its group goes too (kill_on_drop reaps the leader).
        self.kill();
    }
}

/// What a command prints on one stream, read as it comes (so a command
/// that exits leaves what it printed, whoever else holds the pipe), at
/// most `limit` bytes and one more to see that it printed more.
struct Collected {
    buf: Arc<Mutex<Vec<u8>>>,
    over: Arc<tokio::sync::Notify>,
    limit: u64,
    reader: tokio::task::JoinHandle<()>,
}

impl Collected {
    fn spawn(mut r: impl AsyncRead + Unpin + Send + 'static, limit: u64) -> Self {
        let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
        let over = Arc::new(tokio::sync::Notify::new());
        let (b, o) = (buf.clone(), over.clone());
        let reader = tokio::spawn(async move {
            let mut chunk = [0u8; 8192];
            loop {
                match r.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let mut b = b.lock().unwrap_or_else(PoisonError::into_inner);
                        let room = (limit + 1).saturating_sub(b.len() as u64) as usize;
                        b.extend_from_slice(&chunk[..n.min(room)]);
                        if b.len() as u64 > limit {
                            o.notify_one();
                            return;
                        }
                    }
                }
            }
        });
        Collected {
            buf,
            over,
            limit,
            reader,
        }
    }

    /// Resolves once more than `limit` bytes came.
    async fn overflowed(&self) {
        self.over.notified().await;
    }

    /// What came: all of it once the pipe closes (the group is killed by
    /// then, so it closes at once unless a process that left the group
    /// holds it), else what came within a moment.
    async fn finish(self) -> Vec<u8> {
        let mut reader = self.reader;
        if tokio::time::timeout(DRAIN, &mut reader).await.is_err() {
            reader.abort();
        }
        let b = self.buf.lock().unwrap_or_else(PoisonError::into_inner);
        let keep = (b.len() as u64).min(self.limit + 1) as usize;
        b[..keep].to_vec()
    }
}

/// How long, once the command has exited and its group was killed, its
/// output may take to arrive (a process that left the group may hold the
/// pipe open for ever).
const DRAIN: Duration = Duration::from_millis(500);

/// The command's standard error, one log line each: WARN when it failed.
fn log_stderr(scrubber: &Scrubber, name: &str, err: &[u8], ok: bool) {
    let text = String::from_utf8_lossy(err);
    for line in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        let line = scrubber.scrub(line);
        if ok {
            info!(credential = %name, stderr = %line, "credential command said");
        } else {
            warn!(credential = %name, stderr = %line, "credential command said");
        }
    }
}

/// What is known of one credential's (tenant's) command.
#[derive(Default)]
struct Slot {
    /// The argv it was last run with: a reload that changes it starts over.
    argv: Vec<String>,
    /// The token and when it was minted.
    token: Option<(Secret, Instant)>,
    /// An answer was 401 with this token: mint another.
    refused: bool,
    /// When a 401 last made it run.
    reminted: Option<Instant>,
    /// When it last failed, and why.
    failed: Option<(Instant, MintError)>,
}

/// Every credential's minted token, shared by the daemon's tasks (and kept
/// across reloads: a reload does not run the commands again unless their
/// argv changed).
#[derive(Default)]
pub(crate) struct Minter {
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
}

/// Why a task has no token: the command's failure, now or kept from a run
/// less than a minute ago.
#[derive(Debug, Clone)]
pub(crate) struct Failed {
    error: MintError,
    /// From an earlier run (less than a minute ago), not this task's.
    kept: bool,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "credential command failed: {}", self.error)?;
        if self.kept {
            f.write_str("; it runs again at most once a minute")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failed {}

/// What this daemon knows of one credential's (tenant's) command, for the
/// status page: when it last printed a token and when it last failed, and
/// why. Never the token.
#[derive(Debug, Clone, Default)]
pub(crate) struct MintState {
    /// How long ago the token in use was minted (`None`: none is kept).
    pub(crate) minted_ago: Option<Duration>,
    /// A `401` refused the token in use: the next task runs the command.
    pub(crate) refused: bool,
    /// The last failure, how long ago (kept a minute: [`AGAIN_AFTER`]).
    pub(crate) failed: Option<(Duration, String)>,
    /// The command is running now (a task waits for it).
    pub(crate) running: bool,
}

impl Minter {
    /// The state of credential (tenant) `key`'s command in this daemon;
    /// `None` when no task has needed its token since the daemon started.
    /// Does not wait for a running command: that is reported as running.
    pub(crate) fn state(&self, key: &str) -> Option<MintState> {
        let slot = {
            let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            slots.get(key)?.clone()
        };
        let Ok(s) = slot.try_lock() else {
            return Some(MintState {
                running: true,
                ..MintState::default()
            });
        };
        let now = Instant::now();
        Some(MintState {
            minted_ago: s.token.as_ref().map(|(_, at)| now.duration_since(*at)),
            refused: s.refused,
            failed: (s.failed.as_ref()).map(|(at, e)| (now.duration_since(*at), e.to_string())),
            running: false,
        })
    }

    fn slot(&self, key: &str) -> Arc<tokio::sync::Mutex<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.entry(key.to_owned()).or_default().clone()
    }

    /// The token of credential (tenant) `key`: the one kept while it is
    /// younger than `ttl` and no 401 refused it, else what `argv` prints
    /// now. Concurrent tasks of one credential wait for one run. `known`:
    /// the secrets to scrub from the command's standard error.
    pub(crate) async fn token(
        &self,
        key: &str,
        argv: &[String],
        ttl: Duration,
        known: &[Secret],
    ) -> Result<Secret, Failed> {
        let slot = self.slot(key);
        let mut s = slot.lock().await;
        if s.argv != argv {
            *s = Slot {
                argv: argv.to_vec(),
                ..Slot::default()
            };
        }
        let now = Instant::now();
        let recently =
            |at: Option<Instant>| at.is_some_and(|t| now.duration_since(t) < AGAIN_AFTER);
        if let Some((token, minted)) = &s.token {
            let fresh = now.duration_since(*minted) < ttl;
            // A refused token is kept while the last 401 re-mint is less
            // than a minute old: the 401 stands.
            if fresh && (!s.refused || recently(s.reminted)) {
                return Ok(token.clone());
            }
        } else if let Some((at, error)) = &s.failed
            && recently(Some(*at))
        {
            let error = error.clone();
            return Err(Failed { error, kept: true });
        }
        if s.refused {
            s.reminted = Some(now);
        }
        let mut scrub: Vec<Secret> = known.to_vec();
        scrub.extend(s.token.as_ref().map(|(t, _)| t.clone()));
        let ran = run(argv, key, &scrub).await;
        metrics::counter!("qw_credential_commands_total",
            "credential" => key.split('[').next().unwrap_or(key).to_owned(),
            "result" => if ran.is_ok() { "minted" } else { "failed" })
        .increment(1);
        match ran {
            Ok(token) => {
                info!(credential = %key, ttl_s = ttl.as_secs(), "credential command minted a token");
                s.token = Some((token.clone(), Instant::now()));
                s.refused = false;
                s.failed = None;
                Ok(token)
            }
            Err(error) => {
                warn!(credential = %key, error = %error, "credential command failed; tasks that need its token fail until it runs again (at most once a minute)");
                // Past its TTL or refused: the old token is not used again.
                s.token = None;
                s.refused = false;
                s.failed = Some((Instant::now(), error.clone()));
                Err(Failed { error, kept: false })
            }
        }
    }

    /// An answer was 401 with `token`: the next [`Minter::token`] runs the
    /// command again (unless a 401 made it run less than a minute ago).
    /// A 401 with a token already replaced changes nothing.
    pub(crate) async fn refused(&self, key: &str, token: &Secret) {
        let slot = self.slot(key);
        let mut s = slot.lock().await;
        if s.token.as_ref().is_some_and(|(t, _)| t == token) {
            s.refused = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script in a temporary directory that counts its runs in `n` and
    /// prints `tok-N` (or fails, or prints nothing, as `body` says).
    struct Script {
        dir: tempfile::TempDir,
    }

    impl Script {
        fn new(body: &str) -> Self {
            use std::os::unix::fs::PermissionsExt;
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("mint");
            let text = format!(
                "#!/bin/sh\nn=$(( $(cat \"$0.n\" 2>/dev/null || echo 0) + 1 ))\necho $n > \"$0.n\"\n{body}\n"
            );
            std::fs::write(&path, text).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            Script { dir }
        }

        fn argv(&self) -> Vec<String> {
            vec![self.dir.path().join("mint").to_string_lossy().into_owned()]
        }

        fn runs(&self) -> u32 {
            std::fs::read_to_string(self.dir.path().join("mint.n"))
                .map_or(0, |t| t.trim().parse().expect("count"))
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_token_is_kept_until_its_ttl_or_a_401() {
        let s = Script::new("echo \"  tok-$n  \"; echo \"minted tok-$n\" >&2");
        let m = Minter::default();
        let kept = async |ttl| {
            let t = m.token("c", &s.argv(), ttl, &[]).await;
            t.expect("a token").expose().to_owned()
        };
        let a = m.token("c", &s.argv(), HOUR, &[]).await.expect("first");
        assert_eq!(a.expose(), "tok-1", "trimmed");
        let again = m.token("c", &s.argv(), HOUR, &[]).await.expect("kept");
        assert_eq!((again.expose(), s.runs()), ("tok-1", 1));
        // A 401 with it: minted again at once.
        m.refused("c", &a).await;
        let b = m.token("c", &s.argv(), HOUR, &[]).await.expect("re-minted");
        assert_eq!((b.expose(), s.runs()), ("tok-2", 2));
        // A late 401 with the old token changes nothing.
        m.refused("c", &a).await;
        assert_eq!(kept(HOUR).await, "tok-2");
        // A second 401 within the minute: the 401 stands, no run.
        m.refused("c", &b).await;
        assert_eq!(kept(HOUR).await, "tok-2");
        assert_eq!(s.runs(), 2);
        // Past its TTL: minted again.
        let short = Duration::from_millis(50);
        tokio::time::sleep(short).await;
        assert_eq!(kept(short).await, "tok-3");
        // Another credential has its own.
        assert_eq!(
            m.token("d", &s.argv(), HOUR, &[])
                .await
                .expect("d")
                .expose(),
            "tok-4"
        );
    }

    #[tokio::test]
    async fn a_failure_is_kept_for_a_minute_and_names_no_output() {
        let s = Script::new("echo not-a-token-$n; echo broken >&2; exit 3");
        let m = Minter::default();
        let e = m.token("c", &s.argv(), HOUR, &[]).await.expect_err("fails");
        let text = e.to_string();
        assert!(text.starts_with("credential command failed: "), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(!text.contains("not-a-token"), "{text}");
        let e = m.token("c", &s.argv(), HOUR, &[]).await.expect_err("kept");
        assert!(e.to_string().ends_with("at most once a minute"), "{e}");
        assert_eq!(s.runs(), 1, "not run again within the minute");
        // A reload that changes the argv starts over.
        let mut other = s.argv();
        other.push("x".into());
        let _ = m.token("c", &other, HOUR, &[]).await;
        assert_eq!(s.runs(), 2);
    }

    #[tokio::test]
    async fn nothing_printed_a_timeout_or_a_missing_program_fail() {
        let empty = Script::new("echo '   '");
        let e = run(&empty.argv(), "c", &[]).await.expect_err("empty");
        assert!(matches!(e, MintError::Empty { .. }), "{e}");
        let slow = Script::new("exec sleep 30");
        let t0 = Instant::now();
        let e = run(&slow.argv(), "c", &[]).await.expect_err("slow");
        assert!(matches!(e, MintError::Timeout { .. }), "{e}");
        assert!(
            t0.elapsed() < Duration::from_secs(25),
            "killed at the limit"
        );
        let e = run(&["/nonexistent/mint".to_owned()], "c", &[])
            .await
            .expect_err("missing");
        assert!(
            e.to_string().starts_with("cannot run /nonexistent/mint: "),
            "{e}"
        );
        // No standard input: a helper that reads it sees its end at once.
        let stdin = Script::new("cat; echo tok");
        assert_eq!(
            run(&stdin.argv(), "c", &[]).await.expect("ran").expose(),
            "tok"
        );
    }
}
