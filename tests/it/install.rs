//! The installed layout of docs/service.md works, with what
//! systemd would provide emulated (no systemd runs here): the shipped
//! `config/quota-worker.toml` and `jobs/trending.toml` copied to
//! `/etc/quota-worker/{config,jobs}/` (under a temp root), the API key as
//! the file `LoadCredential=` would put in `$CREDENTIALS_DIRECTORY`, state in
//! `$STATE_DIRECTORY`, `NOTIFY_SOCKET` and `WATCHDOG_USEC` set, and the
//! unit's own `ExecStart=` command line and `Environment=`. The daemon
//! becomes ready, fetches (the job's Google URL pointed at the simulator, and
//! nothing else changed) and writes its records under `$STATE_DIRECTORY`.
//! From a checkout, the same config reads `../secrets/yt-key1`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use simulator::SimConfig;

use crate::support::http::http_get;
use crate::support::notify::NotifySocket;
use crate::support::process::{Proc, command};
use crate::support::upstream::Upstream;
use crate::support::{self, RedisServer, free_port, wait_until};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `Key=value` of the unit's `[Service]` section (the first with that key).
fn unit_value(key: &str) -> String {
    let text =
        std::fs::read_to_string(repo().join("systemd/quota-worker.service")).expect("read unit");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .to_owned()
}

struct Installed {
    root: tempfile::TempDir,
}

impl Installed {
    /// `/etc/quota-worker` as README installs it, under a temp root, with
    /// the job's upstream pointed at `upstream`.
    fn new(upstream: &str) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let etc = root.path().join("etc/quota-worker");
        std::fs::create_dir_all(etc.join("config")).expect("mkdir");
        std::fs::create_dir_all(etc.join("jobs")).expect("mkdir");
        std::fs::create_dir_all(etc.join("credentials")).expect("mkdir");
        std::fs::copy(
            repo().join("config/quota-worker.toml"),
            etc.join("config/quota-worker.toml"),
        )
        .expect("copy config");
        let job = std::fs::read_to_string(repo().join("jobs/trending.toml")).expect("read job");
        assert!(job.contains("https://www.googleapis.com/youtube/v3/videos"));
        let job = job.replace("https://www.googleapis.com", upstream);
        std::fs::write(etc.join("jobs/trending.toml"), job).expect("write job");
        Installed { root }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.path().join(p)
    }

    /// The unit's ExecStart arguments, paths under the temp root.
    fn exec_args(&self) -> Vec<String> {
        let exec = unit_value("ExecStart");
        let mut words = exec.split_whitespace();
        assert_eq!(words.next(), Some("/usr/local/bin/quota-worker"));
        words
            .map(|w| match w.strip_prefix('/') {
                Some(abs) => self.path(abs).display().to_string(),
                None => w.to_owned(),
            })
            .collect()
    }
}

#[test]
fn the_service_layout_runs_with_what_systemd_provides() {
    const KEY: &str = "install-test-key";
    let redis = RedisServer::start();
    let upstream = Upstream::with(
        SimConfig {
            pages_per_query: 2,
            items_per_page: 3,
            ..SimConfig::default()
        }
        .key(KEY, 100_000, Duration::from_secs(86_400)),
    );
    let inst = Installed::new(&upstream.base_url());
    // What LoadCredential=yt-key1:/etc/quota-worker/credentials/yt-key1 does.
    let load = unit_value("LoadCredential");
    let (id, source) = load.split_once(':').expect("ID:PATH");
    let source = inst.path(source.trim_start_matches('/'));
    std::fs::write(&source, format!("{KEY}\n")).expect("write key");
    let creds = inst.path("run/credentials/quota-worker.service");
    std::fs::create_dir_all(&creds).expect("mkdir");
    std::fs::copy(&source, creds.join(id)).expect("load credential");
    // StateDirectory=quota-worker.
    let state = inst.path(&format!("var/lib/{}", unit_value("StateDirectory")));
    std::fs::create_dir_all(&state).expect("mkdir");

    let args = inst.exec_args();
    let (cmd, rest) = args.split_first().expect("a command");
    assert_eq!(cmd, "run");
    assert_eq!(rest[0], "-c");
    let config = PathBuf::from(&rest[1]);
    let notify = NotifySocket::bind();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = redis.url();
    let rust_log = unit_value("Environment");
    let rust_log = rust_log
        .strip_prefix("RUST_LOG=")
        .expect("Environment=RUST_LOG=...");
    let notify_path = notify.path();
    let env = [
        ("CREDENTIALS_DIRECTORY", creds.to_str().expect("utf-8")),
        ("STATE_DIRECTORY", state.to_str().expect("utf-8")),
        ("NOTIFY_SOCKET", notify_path.to_str().expect("utf-8")),
        ("WATCHDOG_USEC", "30000000"),
        ("RUST_LOG", rust_log),
        // The shipped config's Redis and port are the host's; here, ours.
        ("QUOTA_WORKER_REDIS_URL", url.as_str()),
        ("QUOTA_WORKER_METRICS_LISTEN", listen.as_str()),
    ];

    // `check` first, as the README says.
    let o = command(&config, &["check"], &env).output().expect("check");
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
    assert!(support::stdout(&o).contains("trending"));

    let mut d = Proc::start_at("daemon", &config, &["run"], &env);
    assert!(
        notify
            .wait_for("READY=1", 1, Duration::from_secs(20))
            .is_some(),
        "READY=1"
    );
    assert!(
        notify
            .wait_for("WATCHDOG=1", 1, Duration::from_secs(20))
            .is_some()
    );
    assert!(wait_until(Duration::from_secs(10), || {
        http_get(port, "/readyz").is_some_and(|r| r.0 == 200)
    }));
    let t = command(&config, &["trigger", "trending", "--wait"], &env)
        .output()
        .expect("trigger");
    assert_eq!(t.status.code(), Some(0), "{}", support::stderr(&t));
    assert_eq!(upstream.stats().key(KEY).ok, 16, "8 regions × 2 pages");
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let us = state.join(format!("data/trending/US/{date}.jsonl"));
    let lines = std::fs::read_to_string(&us)
        .unwrap_or_else(|e| panic!("records under $STATE_DIRECTORY ({}): {e}", us.display()));
    assert_eq!(lines.lines().count(), 6, "2 pages × 3 records");
    d.term();
    let status = d.wait_exit(Duration::from_secs(40)).expect("exits");
    assert_eq!(status.code(), Some(0));
    assert_eq!(notify.count("STOPPING=1"), 1);
    // Nothing was written next to the config: state went to $STATE_DIRECTORY.
    assert!(!inst.path("etc/quota-worker/state").exists());
}

#[test]
fn from_a_checkout_the_same_config_reads_its_key_from_secrets_next_to_it() {
    let inst = Installed::new("http://127.0.0.1:9");
    let etc = inst.path("etc/quota-worker");
    std::fs::create_dir_all(etc.join("secrets")).expect("mkdir");
    let config = etc.join("config/quota-worker.toml");
    // No key file yet: `check` names what is missing.
    let o = command(&config, &["check"], &[]).output().expect("check");
    assert_eq!(o.status.code(), Some(78), "{}", support::stderr(&o));
    assert!(
        support::stderr(&o).contains("secrets/yt-key1"),
        "{}",
        support::stderr(&o)
    );
    std::fs::write(etc.join("secrets/yt-key1"), "k\n").expect("write key");
    let o = command(&config, &["check"], &[]).output().expect("check");
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
}
