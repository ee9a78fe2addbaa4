//! A private `redis-server` on 127.0.0.1 for one test: started with no
//! persistence on a free port, retried on another port when the first was
//! taken, its log printed when it fails to start, stopped by its pid on
//! `Drop`. It can be stopped, killed, hung (SIGSTOP), restarted on the same
//! port, and started with its wall clock shifted (a fake clock through
//! `LD_PRELOAD`). Several of them make a Redis Cluster: [`super::cluster`].
//!
//! Under [`by_evalsha`], every server a test starts refuses `FUNCTION` and
//! `FCALL` to its default user (the user every test connects as), a real
//! Redis 7 that runs no functions for us, as a Redis 6 or a user without
//! them would: the spend core then runs as its one script by `EVALSHA`.
//! [`evalsha_too!`](crate::evalsha_too) runs a module's tests both ways.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A private `redis-server` on 127.0.0.1.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// Started under [`by_evalsha`]: refuses FUNCTION and FCALL, again
    /// after a restart.
    no_functions: bool,
}

thread_local! {
    static NO_FUNCTIONS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `test` with every Redis it starts (on this thread) refusing
/// `FUNCTION` and `FCALL` to its default user: the spend core runs by
/// `EVALSHA`, as on a Redis 6.
pub fn by_evalsha(test: impl FnOnce()) {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            NO_FUNCTIONS.set(false);
        }
    }
    NO_FUNCTIONS.set(true);
    let _reset = Reset;
    test();
}

/// Whether this test runs under [`by_evalsha`].
pub fn evalsha_only() -> bool {
    NO_FUNCTIONS.get()
}

/// Runs each named test of the calling module a second time under
/// [`by_evalsha`], in a child module `by_evalsha`: the same test, unchanged,
/// with the spend core by `EVALSHA` instead of `FCALL`.
#[macro_export]
macro_rules! evalsha_too {
    ($($test:ident),+ $(,)?) => {
        /// The module's tests again, the spend core by EVALSHA.
        mod by_evalsha {
            $(
                #[test]
                fn $test() {
                    $crate::support::redis_server::by_evalsha(super::$test);
                }
            )+
        }
    };
}

/// Ports of the servers this process started and has not dropped. A
/// stopped server keeps its port for `restart`, and the test that stopped
/// it expects "Redis is down" there: another test's server started on that
/// port meanwhile would answer for it (seen once under a full run:
/// `quota k` exited 0 seconds after `quota` had exited 69 on the stopped
/// port). [`free_port`] never hands one out.
static HELD: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());

fn held() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    // A test that panicked holding it left a set that is still right.
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A free loopback port (the kernel picks it; we release it for the
/// server), never one a server of this process holds while stopped.
pub fn free_port() -> u16 {
    // The rejected ports stay bound until one is found, so the kernel
    // offers another each time.
    let mut rejected = Vec::new();
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local addr").port();
        if !held().contains(&port) {
            return port;
        }
        rejected.push(l);
    }
}

/// A free loopback port, different from every port in `taken`.
pub fn free_port_except(taken: &[u16]) -> u16 {
    loop {
        let p = free_port();
        if !taken.contains(&p) {
            return p;
        }
    }
}

/// The `redis-server` to run: `$REDIS_SERVER`, else the one on `PATH`.
pub fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

impl RedisServer {
    /// Starts a server with no persistence.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (`--appendonly yes`, ...).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_env(extra, Vec::new())
    }

    /// Starts a server on a given port (a cluster node needs port + 10000
    /// free for its bus, so the caller picks).
    pub fn start_on_port(port: u16, extra: &[&str]) -> Self {
        let mut s = RedisServer {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            no_functions: evalsha_only(),
        };
        if !s.spawn() {
            panic!(
                "redis-server did not start on port {port}; log:\n{}",
                s.log()
            );
        }
        held().insert(port);
        s
    }

    /// Starts a server whose wall clock (`TIME`, key expiry) reads `start`
    /// now and runs on in real time from there, through [`fake_clock_lib`].
    pub fn start_at(start: chrono::DateTime<chrono::Utc>) -> Self {
        let lib = fake_clock_lib();
        let s = Self::start_env(
            &[],
            vec![
                ("LD_PRELOAD".into(), lib.to_string_lossy().into_owned()),
                (
                    "QW_FAKE_START_US".into(),
                    start.timestamp_micros().to_string(),
                ),
            ],
        );
        let now = s.time_us();
        let want = start.timestamp_micros();
        assert!(
            (want..want + 10_000_000).contains(&now),
            "the fake clock did not take: redis TIME is {now} µs, expected about {want}"
        );
        s
    }

    fn start_env(extra: &[&str], env: Vec<(String, String)>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = RedisServer {
            child: None,
            port: 0,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env,
            no_functions: evalsha_only(),
        };
        for _ in 0..5 {
            s.port = free_port();
            if s.spawn() {
                held().insert(s.port);
                return s;
            }
        }
        panic!("redis-server did not start on 5 ports; log:\n{}", s.log());
    }

    fn spawn(&mut self) -> bool {
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(redis_server_bin());
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &self.dir.path().to_string_lossy()])
            .args(["--logfile", &log.to_string_lossy()])
            .args(&self.extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => panic!(
                "cannot run redis-server ({e}): install it (apt-get install redis-server) or set REDIS_SERVER"
            ),
        };
        self.child = Some(child);
        let mut exited = false;
        let up = super::wait_every(Duration::from_secs(5), Duration::from_millis(10), || {
            exited = (self.child.as_mut()).is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            exited || self.ping()
        });
        if exited {
            self.child = None;
            return false;
        }
        if !up {
            self.kill();
        } else if self.no_functions {
            let _: String = self.cmd(&[
                "ACL",
                "SETUSER",
                "default",
                "-function",
                "-fcall",
                "-fcall_ro",
            ]);
        }
        up
    }

    fn ping(&self) -> bool {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    }

    /// `redis://127.0.0.1:PORT/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's pid (while running).
    #[allow(dead_code, reason = "the benchmark reads it, the tests do not")]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// A synchronous connection.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to test redis")
    }

    /// Runs one command.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// Commands Redis ran since its start or the last `CONFIG RESETSTAT`
    /// (`INFO commandstats`: every kind, scripts' inner commands included),
    /// the tests' own `INFO` and `CONFIG` left out; and the stats as read,
    /// to print when an assertion fails.
    pub fn command_calls(&self) -> (u64, String) {
        let stats: String = self.cmd(&["INFO", "commandstats"]);
        let total = (stats.lines())
            .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
            .filter(|(name, _)| *name != "info" && *name != "config")
            .filter_map(|(_, rest)| {
                rest.split(',')
                    .find_map(|f| f.strip_prefix("calls="))?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        (total, stats)
    }

    /// Clients blocked in a command now (`INFO clients`: a blocking
    /// `XREAD`, `BLPOP`, ...), the sign that a waiting client went to sleep
    /// on Redis.
    pub fn blocked_clients(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "clients"]);
        (info.lines())
            .find_map(|l| l.strip_prefix("blocked_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO clients: blocked_clients")
    }

    /// Runs one command, or `None` when the server does not answer it
    /// within a second (killed, hung, refusing it).
    pub fn try_cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> Option<T> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut conn).ok()
    }

    /// The server's clock (`TIME`), in µs since the epoch.
    pub fn time_us(&self) -> i64 {
        let t: Vec<i64> = self.cmd(&["TIME"]);
        t[0] * 1_000_000 + t[1]
    }

    /// Sleeps until the server's clock reads at least `at_us`.
    pub fn sleep_until_us(&self, at_us: i64) {
        loop {
            let left = at_us - self.time_us();
            if left <= 0 {
                return;
            }
            std::thread::sleep(Duration::from_micros(left as u64));
        }
    }

    /// `DBSIZE`.
    pub fn dbsize(&self) -> i64 {
        self.cmd(&["DBSIZE"])
    }

    /// Every key matching `pattern`, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self.cmd(&["KEYS", pattern]);
        keys.sort();
        keys
    }

    /// SIGTERM by pid, and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) with a pid we spawned and still own.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }

    /// SIGKILL by pid, and wait.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the server stays up but answers nothing.
    pub fn pause(&self) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) with a pid we spawned and still own.
            unsafe { libc::kill(c.id() as i32, libc::SIGSTOP) };
        }
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        if let Some(c) = &self.child {
            // SAFETY: as above.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
        }
    }

    /// Restarts it with its wall clock reading `start` (a server started by
    /// [`RedisServer::start_at`]): the clock can step backwards, as after an
    /// NTP step or a failover to a replica whose clock is behind. `SAVE` first
    /// to keep the data.
    pub fn restart_at(&mut self, start: chrono::DateTime<chrono::Utc>) {
        let at = self
            .env
            .iter_mut()
            .find(|(k, _)| k == "QW_FAKE_START_US")
            .expect("restart_at needs a server from start_at");
        at.1 = start.timestamp_micros().to_string();
        self.restart();
    }

    /// Starts it again on the same port (after `stop`/`kill`).
    pub fn restart(&mut self) {
        self.stop();
        // The port may still be held by the old server's sockets a moment.
        if super::wait_every(Duration::from_secs(15), Duration::from_millis(100), || {
            self.spawn()
        }) {
            return;
        }
        panic!(
            "redis-server did not restart on port {}; log:\n{}",
            self.port,
            self.log()
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        held().remove(&self.port);
    }
}

/// A shared library that shifts a process's wall clock (see
/// `tests/support/fakeclock.c` for why not libfaketime), built with the C
/// compiler Rust already links with (`$CC`, else `cc`) and kept in the target
/// directory under a name derived from its source.
pub fn fake_clock_lib() -> PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/fakeclock.c");
        let code = std::fs::read(&src).expect("read fakeclock.c");
        let hash = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            code.hash(&mut h);
            h.finish()
        };
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let lib = dir.join(format!("fakeclock-{hash:016x}.so"));
        if lib.exists() {
            return lib;
        }
        std::fs::create_dir_all(dir).expect("mkdir target tmpdir");
        // Built under a private name, then renamed into place, so concurrent
        // test binaries never load a half-written file.
        let tmp = dir.join(format!("fakeclock-{hash:016x}.{}.tmp", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cc} to build the fake clock: {e}"));
        assert!(
            out.status.success(),
            "{cc} failed to build {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &lib).expect("rename fake clock library");
        lib
    })
    .clone()
}

/// A synchronous connection to `url` (`redis://...` or `unix://...`).
pub fn redis_conn(url: &str) -> redis::Connection {
    redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// A limiter for `config` on `server`, as the daemon builds it.
pub async fn limiter(
    server: &RedisServer,
    config: &quota_worker::config::Config,
) -> quota_worker::quota::Limiter {
    let conn = quota_worker::conn::connect(
        &quota_worker::conn::Master::Url(quota_worker::config::RedisUrl::new(server.url())),
        Duration::from_secs(2),
        "test",
    )
    .await
    .expect("connect");
    quota_worker::quota::Limiter::new(
        conn,
        std::sync::Arc::new(quota_worker::quota::Quotas::new(config)),
        Duration::from_secs(2),
    )
}

/// The rejection a spend was answered with; panics on any other decision.
pub fn rejected(d: quota_worker::quota::Decision) -> quota_worker::quota::Rejection {
    match d {
        quota_worker::quota::Decision::Rejected(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Spends `endpoint`'s cost `n` times, each with a new request id, and
/// expects every one admitted.
pub async fn admit_n(limiter: &quota_worker::quota::Limiter, endpoint: &str, n: usize) {
    for i in 0..n {
        let d = limiter
            .spend(endpoint, None, &quota_worker::quota::request_id())
            .await
            .expect("spend");
        assert!(d.is_allowed(), "{endpoint}: spend {} of {n}: {d:?}", i + 1);
    }
}
