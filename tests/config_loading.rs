//! Promise: what the loader reads and prints is bounded and safe. A config
//! path that is a device or a huge file is refused (exit 78, naming the file)
//! before it is read; a Redis URL never prints its password, in any of the
//! forms redis-rs accepts; a malformed Redis URL says which forms are
//! accepted; a duration whose unit is ambiguous ("1M") is an error that says
//! what to write instead.

mod support;

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use support::TestConfig;

const SECRET_ENV: &str = "QW_TEST_CONFIG_LOADING_SECRET";

const CONFIG: &str = r#"jobs = "jobs/*.toml"

[credentials.yt]
secret_env = "QW_TEST_CONFIG_LOADING_SECRET"
windows = [{ units = 950, per = "1h" }]

[endpoints.search]
credential = "yt"
cost = 100
"#;

const JOB: &str = r#"[trending]
schedule = "0 */30 * * * *"
endpoint = "search"

[trending.request]
url = "https://example.com/videos"
query = { key = "{secret}" }

[trending.sink]
kind = "jsonl"
path = "data/{job}.jsonl"
"#;

/// The binary with `args`, its address space capped at 1 GiB so that a
/// regression that reads a device to the end fails fast instead of taking
/// the machine's memory.
fn run_capped(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(support::bin());
    cmd.args(args)
        .env_remove("QUOTA_WORKER_REDIS_URL")
        .env_remove("QUOTA_WORKER_CONFIG")
        .env_remove("QUOTA_WORKER_METRICS_LISTEN")
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1 << 30,
                rlim_max: 1 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("run quota-worker")
}

/// Exit 78 and one `error:` line that starts with `file` and says `says`.
fn assert_config_error(out: &Output, file: &str, says: &str) {
    let err = support::stderr(out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error: {err}");
    assert!(
        errors[0].starts_with(&format!("error: {file}")),
        "names {file}: {err}"
    );
    assert!(errors[0].contains(says), "says {says:?}: {err}");
}

#[test]
fn a_device_given_as_the_config_is_refused_unread() {
    // Regression: `-c /dev/zero` read 2.1 GB before failing.
    let out = run_capped(&["-c", "/dev/zero", "check"], &[]);
    assert_config_error(&out, "/dev/zero", "not a regular file");
}

#[test]
fn a_config_or_job_file_over_the_size_limit_is_refused() {
    // 1 MiB of comments and one byte more: valid TOML, refused for its size.
    let big = format!("{}\n", "#".repeat(1 << 20));
    let cfg = TestConfig::new(&format!("{CONFIG}{big}"), &[("trending.toml", JOB)]);
    let path = cfg.path();
    let out = run_capped(
        &["-c", path.to_str().expect("utf-8"), "check"],
        &[(SECRET_ENV, "k")],
    );
    assert_config_error(&out, path.to_str().expect("utf-8"), "1 MiB");

    let cfg = TestConfig::new(CONFIG, &[("trending.toml", &format!("{JOB}{big}"))]);
    let job = std::fs::canonicalize(cfg.join("jobs/trending.toml")).expect("job file");
    let out = cfg.run(&["check"], &[(SECRET_ENV, "k")]);
    assert_config_error(&out, job.to_str().expect("utf-8"), "1 MiB");

    // The same job file without the padding is valid: the size is the reason.
    let cfg = TestConfig::new(CONFIG, &[("trending.toml", JOB)]);
    let out = cfg.run(&["check"], &[(SECRET_ENV, "k")]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
}

#[test]
fn a_redis_url_never_prints_its_password_in_any_form() {
    // Each URL points at nothing that answers, so `quota` prints it in its
    // "Redis at URL: unreachable" error (exit 69).
    let missing = tempfile::tempdir().expect("tempdir");
    let sock = missing.path().join("r.sock");
    let sock = sock.display();
    let cases = [
        "redis://user:hunter2-a@127.0.0.1:1/0".to_owned(),
        "rediss://:hunter2-b@127.0.0.1:1/0".to_owned(),
        format!("unix://{sock}?db=1&pass=hunter2-c"),
        format!("redis+unix://{sock}?user=u&pass=hunter2-d"),
        format!("unix://{sock}?password=hunter2-e"),
        format!("valkey+unix://{sock}?pa%73s=hunter2-f"),
    ];
    let cfg = TestConfig::new(CONFIG, &[]);
    for url in &cases {
        let out = cfg.run(
            &["quota", "--json"],
            &[("QUOTA_WORKER_REDIS_URL", url), (SECRET_ENV, "k")],
        );
        let all = format!("{}{}", support::stdout(&out), support::stderr(&out));
        assert_eq!(out.status.code(), Some(69), "{url}: {all}");
        assert!(
            all.contains("Redis at "),
            "{url}: the URL is printed, so the test means something: {all}"
        );
        assert!(
            !all.contains("hunter2"),
            "{url}: the password leaked: {all}"
        );
    }
}

#[test]
fn a_malformed_redis_url_names_the_accepted_forms() {
    // In the file: positioned at redis.url.
    let cfg = TestConfig::new(
        &format!("{CONFIG}\n[redis]\nurl = \"http://127.0.0.1:6379\"\n"),
        &[("trending.toml", JOB)],
    );
    let out = cfg.run(&["check"], &[(SECRET_ENV, "k")]);
    let file = format!("{}:12:7: redis.url: ", cfg.path().display());
    assert_config_error(&out, &file, "redis://");
    for form in ["rediss://", "unix://", "redis+unix://"] {
        assert!(support::stderr(&out).contains(form), "{form}");
    }

    // From the environment: named as such, and the password is not shown.
    let cfg = TestConfig::new(CONFIG, &[("trending.toml", JOB)]);
    let out = cfg.run(
        &["check"],
        &[
            ("QUOTA_WORKER_REDIS_URL", "http://:hunter2@127.0.0.1:6379"),
            (SECRET_ENV, "k"),
        ],
    );
    assert_config_error(
        &out,
        &cfg.path().display().to_string(),
        "QUOTA_WORKER_REDIS_URL",
    );
    let err = support::stderr(&out);
    assert!(err.contains("rediss://"), "{err}");
    assert!(!err.contains("hunter2"), "the password leaked: {err}");
}

#[test]
fn ambiguous_durations_are_config_errors_that_say_what_to_write() {
    for (per, says) in [
        ("1M", "months have no fixed length"),
        ("2months", "months have no fixed length"),
        ("1y", "years have no fixed length"),
        ("500us", "the smallest unit is ms"),
        ("5x", "use ms, s, m, h, d or w"),
    ] {
        let cfg = TestConfig::new(
            &CONFIG.replace("per = \"1h\"", &format!("per = \"{per}\"")),
            &[("trending.toml", JOB)],
        );
        let out = cfg.run(&["check"], &[(SECRET_ENV, "k")]);
        let file = format!("{}:5:", cfg.path().display());
        assert_config_error(&out, &file, says);
        assert!(
            support::stderr(&out).contains(": credentials.yt.windows[0].per: "),
            "{per}: names the field: {}",
            support::stderr(&out)
        );
    }
    // What the messages suggest is accepted.
    for per in ["30d", "1m", "90 minutes", "1h 30m", "1.5h", "2w"] {
        let cfg = TestConfig::new(
            &CONFIG.replace("per = \"1h\"", &format!("per = \"{per}\"")),
            &[("trending.toml", JOB)],
        );
        let out = cfg.run(&["check"], &[(SECRET_ENV, "k")]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{per}: {}",
            support::stderr(&out)
        );
    }
}
