//! The one process supervisor: the real `quota-worker` binary as a child,
//! started on a config with a given environment and nothing inherited that
//! would change what it does; its stdout and stderr read line by line while
//! it runs (JSON log lines parsed on demand); signalled by its pid; reaped
//! with its exit status. A child still running when its `Proc` drops is
//! SIGKILLed, and its log is printed when the test panics (or always, with
//! `QW_TEST_LOGS=1`).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::config::TestConfig;
use super::world::{KEY_ENV, SECRET};
use super::{bin, wait_until};

/// The environment variables a test must not inherit from whoever runs it.
const SCRUBBED: [&str; 7] = [
    "QUOTA_WORKER_REDIS_URL",
    "QUOTA_WORKER_CONFIG",
    "QUOTA_WORKER_METRICS_LISTEN",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "RUST_LOG",
];

/// `quota-worker -c config ARGS` with `RUST_LOG=info` and then `env`,
/// nothing inherited that would change its behaviour; stdin closed, stdout
/// and stderr piped.
pub fn command(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("-c").arg(config).args(args);
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

/// Lines read from a child's stream, shared with the thread that reads them.
type Lines = Arc<Mutex<Vec<String>>>;

/// Reads `r` line by line into a shared buffer, on a thread that ends at EOF.
pub fn collect_lines<R: Read + Send + 'static>(r: R) -> (Lines, JoinHandle<()>) {
    let lines = Lines::default();
    let out = lines.clone();
    let handle = std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            out.lock().expect("lines").push(line);
        }
    });
    (lines, handle)
}

/// The real binary as a supervised child.
pub struct Proc {
    /// Names it in messages.
    pub label: String,
    child: Child,
    status: Option<ExitStatus>,
    stdout: Lines,
    stderr: Lines,
    /// The threads reading stdout and stderr (finished at EOF).
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    /// Starts `quota-worker -c cfg ARGS` with the config's secrets and `env`.
    pub fn start(label: &str, cfg: &TestConfig, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut all = cfg.env();
        all.extend_from_slice(env);
        Self::start_at(label, &cfg.path(), args, &all)
    }

    /// Starts `quota-worker -c config ARGS` with `env`.
    pub fn start_at(label: &str, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut child = command(config, args, env)
            .spawn()
            .expect("spawn quota-worker");
        let (stdout, o) = collect_lines(child.stdout.take().expect("stdout"));
        let (stderr, e) = collect_lines(child.stderr.take().expect("stderr"));
        Proc {
            label: label.to_owned(),
            child,
            status: None,
            stdout,
            stderr,
            readers: vec![o, e],
        }
    }

    /// `quota-worker --log-format json run` on `cfg` with the simulator's
    /// key [`SECRET`] in [`KEY_ENV`] (unless the config gives that variable
    /// its own secret), on the Redis at `redis_url` (`None`: the config's,
    /// i.e. the embedded one), and `env`.
    pub fn daemon(
        label: &str,
        cfg: &TestConfig,
        redis_url: Option<&str>,
        env: &[(&str, &str)],
    ) -> Proc {
        Self::sim_cli(label, cfg, redis_url, &["--log-format", "json", "run"], env)
    }

    /// Any command of the binary on `cfg`, with the environment of
    /// [`Proc::daemon`].
    pub fn sim_cli(
        label: &str,
        cfg: &TestConfig,
        redis_url: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        // The config's own secrets come after the default key: a test that
        // spells its own secret in KEY_ENV keeps it.
        let mut all = vec![(KEY_ENV, SECRET)];
        all.extend(cfg.env());
        if let Some(url) = redis_url {
            all.push(("QUOTA_WORKER_REDIS_URL", url));
        }
        all.extend_from_slice(env);
        Self::start_at(label, &cfg.path(), args, &all)
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

    /// Sends `sig` to it, by pid, if it still runs.
    pub fn signal(&mut self, sig: i32) {
        if self.running() {
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe { libc::kill(self.child.id() as i32, sig) };
        }
    }

    /// SIGTERM.
    pub fn term(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.wait_exit(Duration::from_secs(10));
    }

    /// Waits up to `timeout` for it to exit; once it has, also until its
    /// output is read to the end.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if !super::wait_every(timeout, Duration::from_millis(10), || !self.running()) {
            return None;
        }
        // Let the readers reach EOF; bounded, as a grandchild that inherited
        // the pipes (none should) would hold them open.
        let readers = &self.readers;
        super::wait_every(Duration::from_secs(5), Duration::from_millis(5), || {
            readers.iter().all(|r| r.is_finished())
        });
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

    /// Its log (stderr) so far, as one string.
    pub fn log(&self) -> String {
        self.stderr.lock().expect("stderr").join("\n")
    }

    /// Its stdout so far, as one string.
    pub fn stdout(&self) -> String {
        self.stdout.lock().expect("stdout").join("\n")
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

    /// Every JSON log line so far.
    pub fn events(&self) -> Vec<Value> {
        self.stderr
            .lock()
            .expect("stderr")
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect()
    }

    /// The log lines with `message`.
    pub fn messages(&self, message: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["message"].as_str() == Some(message))
            .collect()
    }

    /// Every task outcome line so far.
    pub fn outcomes(&self) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e.get("outcome").is_some())
            .collect()
    }

    /// Waits up to `timeout` for the daemon to say it runs (JSON logs).
    pub fn wait_running(&mut self, timeout: Duration) {
        let ok = wait_until(timeout, || {
            !self.messages("quota-worker running").is_empty()
        });
        assert!(
            ok,
            "{} did not start within {timeout:?}; log:\n{}",
            self.label,
            self.log()
        );
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.running() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
            let _ = self.child.wait();
        }
        // QW_TEST_LOGS=1 shows every child's log, not only a failed test's.
        if std::thread::panicking() || std::env::var_os("QW_TEST_LOGS").is_some() {
            let log = self.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(150)..];
            eprintln!(
                "----- {} (pid {}) log, last {} lines -----\n{}\n----- end of {} -----",
                self.label,
                self.child.id(),
                tail.len(),
                tail.join("\n"),
                self.label
            );
        }
    }
}

/// Runs a command of the binary on `cfg` to completion (killed after
/// `timeout`) with the environment of [`Proc::daemon`]: its exit code
/// (`None` if it had to be killed), stdout and stderr.
pub fn run_cli(
    cfg: &TestConfig,
    redis_url: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> (Option<i32>, String, String) {
    let mut p = Proc::sim_cli(&format!("{args:?}"), cfg, redis_url, args, &[]);
    let status = p.wait_exit(timeout);
    if status.is_none() {
        p.kill();
    }
    (status.and_then(|s| s.code()), p.stdout(), p.log())
}
