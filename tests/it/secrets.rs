//! Secrets never appear (SPEC: "Secrets never appear in logs, errors,
//! metrics or Redis keys"). An end-to-end run sends a distinctive API key in
//! the request query (`key={secret}`) through every path that can print a
//! URL or an error — success, quota exhaustion, injected 5xx and 429, a body
//! that is not JSON, an upstream that refuses the key, a port where nothing
//! listens — at `RUST_LOG=debug`, in text and JSON log formats. Then every
//! line the daemon and the CLI commands (check, keys, spend, quota, trigger)
//! wrote, the `/metrics` page, every Redis key and value, and every file the
//! run left behind are searched for the secret.

use std::path::Path;
use std::time::Duration;

use simulator::{Fault, SimConfig};

use crate::support::http::{self, wait_http};
use crate::support::keys::keys;
use crate::support::process::{Proc, command};
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world;
use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window, Worker, free_port,
};

/// The credential's window: the `trending` job needs 12 units a tick (4
/// regions × 3 pages) and the injected faults cost 4, so the quota runs out
/// within two ticks while some regions get all their pages.
const UNITS: u64 = 14;

fn config(upstream: &str, closed: &str) -> TestConfig {
    let job = world::videos_job;
    ConfigBuilder::new()
        .state_dir("state")
        .worker(Worker::default().concurrency(4).shutdown_timeout("2s"))
        .metrics_listen("127.0.0.1:9464")
        // The world's credential; its secret is the test's own (in `env`).
        .credential(world::credential(Window::sliding(UNITS, "1h")))
        .credential(Credential::env("spare", world::KEY_ENV).window(Window::sliding(1000, "1h")))
        .credential(Credential::env("wrong", "QW_WRONG_KEY").window(Window::sliding(1000, "1h")))
        .endpoint(world::endpoint().throttle_block("1s"))
        .endpoint(Endpoint::new("spare.videos", "spare", 1).timeout("2s"))
        .endpoint(Endpoint::new("wrong.videos", "wrong", 1))
        .job(job(
            world::JOB,
            world::ENDPOINT,
            upstream,
            &["US", "GB", "DE", "FR"],
            3,
        ))
        // Nothing listens there: connection refused, retried, then failed.
        .job(job("unreachable", "spare.videos", closed, &["US"], 1))
        // The upstream answers 400 keyInvalid for this key.
        .job(job("refused", "wrong.videos", upstream, &["US"], 1))
        .write()
}

/// Every line of output, labelled with where it came from.
#[derive(Default)]
struct Seen {
    lines: Vec<(String, String)>,
}

impl Seen {
    fn add(&mut self, source: &str, text: &str) {
        for l in text.lines() {
            self.lines.push((source.to_owned(), l.to_owned()));
        }
    }

    fn add_lines(&mut self, source: &str, lines: &[String]) {
        for l in lines {
            self.lines.push((source.to_owned(), l.clone()));
        }
    }

    fn count(&self, source_prefix: &str) -> usize {
        self.lines
            .iter()
            .filter(|(s, _)| s.starts_with(source_prefix))
            .count()
    }
}

fn contains_secret(text: &str, secrets: &[&str]) -> bool {
    let lower = text.to_lowercase();
    secrets.iter().any(|s| lower.contains(&s.to_lowercase()))
}

/// Runs a CLI command to completion (bounded) and records its output.
fn cli(
    seen: &mut Seen,
    cfg: &TestConfig,
    format: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Option<i32> {
    let mut full = vec!["--log-format", format];
    full.extend_from_slice(args);
    let mut p = Proc::start(&format!("cli {args:?}"), cfg, &full, env);
    let status = p
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("`{}` did not end within 60 s", args.join(" ")));
    let name = format!("cli {}", args.join(" "));
    seen.add_lines(&format!("{name} (stdout)"), &p.stdout_lines());
    seen.add_lines(&format!("{name} (stderr)"), &p.stderr_lines());
    status.code()
}

/// Every key of the Redis at `redis`, and every value whatever its type.
pub(crate) fn redis_dump(redis: &RedisServer) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for key in redis.keys("*") {
        let kind: String = redis.cmd(&["TYPE", &key]);
        let value: Vec<String> = match kind.as_str() {
            "string" => {
                let v: Option<Vec<u8>> = redis.cmd(&["GET", &key]);
                vec![String::from_utf8_lossy(&v.unwrap_or_default()).into_owned()]
            }
            "hash" => bytes_list(redis.cmd(&["HGETALL", &key])),
            "list" => bytes_list(redis.cmd(&["LRANGE", &key, "0", "-1"])),
            "set" => bytes_list(redis.cmd(&["SMEMBERS", &key])),
            "zset" => bytes_list(redis.cmd(&["ZRANGE", &key, "0", "-1", "WITHSCORES"])),
            "stream" => {
                let v: redis::Value = redis.cmd(&["XRANGE", &key, "-", "+"]);
                vec![format!("{v:?}")]
            }
            other => vec![format!("(type {other})")],
        };
        out.push((format!("key {key}"), key.clone()));
        for v in value {
            out.push((format!("value of {key} ({kind})"), v));
        }
    }
    out
}

fn bytes_list(v: Vec<Vec<u8>>) -> Vec<String> {
    v.into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect()
}

/// Every regular file under `dir`, with its content.
fn files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                let body = std::fs::read(&p).unwrap_or_default();
                out.push((
                    format!("file {}", p.display()),
                    String::from_utf8_lossy(&body).into_owned(),
                ));
            }
        }
    }
    out
}

fn never_leaks(format: &str) {
    let secret = format!("SeCrEt-{}", uuid::Uuid::new_v4().simple());
    let wrong = format!("SeCrEt-wrong-{}", uuid::Uuid::new_v4().simple());
    let secrets = [secret.as_str(), wrong.as_str()];
    let redis = RedisServer::start();
    let upstream = Upstream::with(
        SimConfig {
            pages_per_query: 3,
            items_per_page: 3,
            ..SimConfig::default()
        }
        .key(&secret, 1_000_000, Duration::from_secs(3600)),
    );
    let closed = format!("http://127.0.0.1:{}", free_port());
    let cfg = config(&upstream.base_url(), &closed);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = redis.url();
    let env = [
        ("QUOTA_WORKER_REDIS_URL", url.as_str()),
        ("QUOTA_WORKER_METRICS_LISTEN", listen.as_str()),
        (world::KEY_ENV, secret.as_str()),
        ("QW_WRONG_KEY", wrong.as_str()),
        ("RUST_LOG", "debug"),
    ];
    let mut seen = Seen::default();

    let mut rig = Rig::start_args(redis, cfg, &["--log-format", format, "run"], &env);
    let (cfg, redis, daemon) = (&mut rig.cfg, &mut rig.redis, &mut rig.daemon);
    assert!(wait_http(port, Duration::from_secs(20)));

    assert_eq!(cli(&mut seen, cfg, format, &env, &["check"]), Some(0));
    assert_eq!(
        cli(&mut seen, cfg, format, &env, &["keys", world::ENDPOINT]),
        Some(0)
    );
    assert_eq!(
        cli(
            &mut seen,
            cfg,
            format,
            &env,
            &["spend", "spare.videos", "--json"]
        ),
        Some(0)
    );
    assert_eq!(
        cli(
            &mut seen,
            cfg,
            format,
            &env,
            &["spend", "spare.videos", "--cost", "5000"]
        ),
        Some(64),
        "a cost that can never fit"
    );

    // A port where nothing listens, and an upstream that refuses the key.
    for job in ["unreachable", "refused"] {
        assert_eq!(
            cli(&mut seen, cfg, format, &env, &["trigger", job, "--wait"]),
            Some(1),
            "{job}: its task failed"
        );
    }
    // Faults on the way, then the quota runs out.
    upstream.inject(Fault::Status(500), 1);
    upstream.inject(
        Fault::TooManyRequests {
            retry_after_secs: 1,
        },
        1,
    );
    upstream.inject(Fault::Status(503), 1);
    upstream.inject(Fault::Garbage, 1);
    // Ticks until the quota has run out and some regions got all their
    // pages (the credential's 429 block lasts 1 s; the quota, being spent,
    // runs out within a few ticks).
    let has = |log: &str, outcome: &str| {
        log.contains(&format!("outcome=\"{outcome}\""))
            || log.contains(&format!("\"outcome\":\"{outcome}\""))
    };
    for _ in 0..6 {
        let code = cli(
            &mut seen,
            cfg,
            format,
            &env,
            &["trigger", world::JOB, "--wait"],
        );
        // 0, 75 or 1 by how this tick's tasks ended (trigger_exit_codes).
        assert!(matches!(code, Some(0 | 1 | 75)), "{code:?}");
        let log = daemon.log();
        if has(&log, "done") && has(&log, "quota_exhausted") {
            break;
        }
        // The next tick once the credential's block (a 429's, 1 s), if
        // any, has ended.
        let blocked = keys().blocked(world::CREDENTIAL);
        let unblocked = support::wait_until(Duration::from_secs(10), || {
            let end: Option<i64> = redis.cmd(&["GET", &blocked]);
            end.is_none_or(|end| end <= redis.time_us())
        });
        assert!(unblocked, "the credential's block did not end");
    }
    // The whole window's worth cannot fit any more: rejected, with its retry-after.
    let rejected = cli(
        &mut seen,
        cfg,
        format,
        &env,
        &["spend", world::ENDPOINT, "--cost", "14"],
    );
    assert_eq!(
        rejected,
        Some(75),
        "the window is partly spent: the CLI's spend is rejected"
    );
    assert_eq!(cli(&mut seen, cfg, format, &env, &["quota"]), Some(0));
    assert_eq!(
        cli(&mut seen, cfg, format, &env, &["quota", "--json"]),
        Some(0)
    );
    // The CLI against a Redis that is gone: errors name the URL, not the key.
    let gone = [("QUOTA_WORKER_REDIS_URL", closed.replace("http", "redis"))];
    let gone_env: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| *k != "QUOTA_WORKER_REDIS_URL")
        .copied()
        .chain(gone.iter().map(|(k, v)| (*k, v.as_str())))
        .collect();
    assert_eq!(cli(&mut seen, cfg, format, &gone_env, &["quota"]), Some(69));
    assert_eq!(
        cli(&mut seen, cfg, format, &gone_env, &["trigger", world::JOB]),
        Some(69)
    );

    let metrics = http::http_get(port, "/metrics").expect("/metrics");
    assert_eq!(metrics.0, 200);
    seen.add("/metrics", &metrics.1);
    for path in ["/healthz", "/readyz"] {
        seen.add(path, &http::http_get(port, path).expect("answers").1);
    }

    daemon.term();
    assert_eq!(
        daemon
            .wait_exit(Duration::from_secs(20))
            .and_then(|s| s.code()),
        Some(0)
    );
    seen.add_lines("daemon (stdout)", &daemon.stdout_lines());
    seen.add_lines("daemon (stderr)", &daemon.stderr_lines());
    // Also a config error, as printed by `check`: the request template, not its value.
    let bad = TestConfig::new(
        &std::fs::read_to_string(cfg.path())
            .expect("config")
            .replace("cost = 1\nthrottle_block", "cost = 9999\nthrottle_block"),
        &[],
    );
    let o = command(&bad.path(), &["--log-format", format, "check"], &env)
        .output()
        .expect("check");
    assert_eq!(o.status.code(), Some(78));
    seen.add("cli check, invalid config (stdout)", &support::stdout(&o));
    seen.add("cli check, invalid config (stderr)", &support::stderr(&o));

    // The scenario went where it was meant to, so the search means something.
    let sim = upstream.stats();
    assert!(sim.key(&secret).ok > 0, "the secret reached the upstream");
    assert!(sim.invalid_keys > 0, "the wrong key reached the upstream");
    assert_eq!(
        sim.key(&secret).injected,
        4,
        "every injected fault was served"
    );
    let daemon_log = daemon.log();
    for outcome in [
        "quota_exhausted",
        "retrying",
        "upstream_throttled",
        "failed",
        "done",
    ] {
        assert!(
            has(&daemon_log, outcome),
            "the run has a {outcome} outcome; log:\n{daemon_log}"
        );
    }
    for (job, outcome) in [
        ("unreachable", "retrying"),
        ("unreachable", "failed"),
        ("refused", "failed"),
    ] {
        let line = daemon.stderr_lines().into_iter().find(|l| {
            (l.contains(&format!("job={job} ")) || l.contains(&format!("\"job\":\"{job}\"")))
                && has(l, outcome)
        });
        assert!(line.is_some(), "job {job} has a {outcome} outcome line");
    }
    assert!(
        daemon_log.contains("DEBUG") || daemon_log.contains("\"level\":\"DEBUG\""),
        "RUST_LOG=debug took effect"
    );
    assert!(
        seen.count("daemon (stderr)") > 50,
        "the daemon wrote its log"
    );
    for cmd in [
        "cli check",
        "cli keys",
        "cli spend",
        "cli quota",
        "cli trigger",
    ] {
        assert!(seen.count(cmd) > 0, "{cmd} printed something");
    }

    // The search.
    let mut leaks: Vec<String> = Vec::new();
    for (source, line) in &seen.lines {
        if contains_secret(line, &secrets) {
            leaks.push(format!("{source}: {line}"));
        }
    }
    let dump = redis_dump(redis);
    assert!(dump.len() > 10, "Redis holds the run's state");
    for (source, text) in dump.iter().chain(files(cfg.dir.path()).iter()) {
        if contains_secret(text, &secrets) {
            leaks.push(format!("{source}: {text}"));
        }
    }
    assert!(
        leaks.is_empty(),
        "the secret appears in {} place(s):\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    eprintln!(
        "{format}: searched {} output lines, {} Redis keys and values, {} files; no secret",
        seen.lines.len(),
        dump.len(),
        files(cfg.dir.path()).len()
    );
}

#[test]
fn secrets_never_appear_in_text_logs_cli_output_metrics_redis_or_files() {
    never_leaks("text");
}

#[test]
fn secrets_never_appear_in_json_logs_cli_output_metrics_redis_or_files() {
    never_leaks("json");
}
