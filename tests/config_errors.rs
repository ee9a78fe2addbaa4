//! Promise: every configuration error is found before anything runs: the
//! binary exits 78 with one error naming the file, the exact line and the
//! field, and writes nothing to Redis.

mod support;

use std::path::PathBuf;

use support::{RedisServer, TestConfig};

const SECRET_ENV: &str = "QW_TEST_CONFIG_ERRORS_SECRET";

// Line numbers matter below: keep these as they are.
const CONFIG: &str = r#"jobs = "jobs/*.toml"

[credentials.yt]
secret_env = "QW_TEST_CONFIG_ERRORS_SECRET"
windows = [{ units = 950, per = "1h" }]

[endpoints.search]
credential = "yt"
cost = 100
"#;

const JOB: &str = r#"[trending]
schedule = "0 */30 * * * *"
endpoint = "search"
fan_out = { region = ["US", "GB"] }

[trending.request]
url = "https://example.com/videos"
query = { regionCode = "{region}", key = "{secret}" }

[trending.sink]
kind = "jsonl"
path = "data/{job}/{region}.jsonl"
"#;

enum File {
    Config,
    Job,
}

struct Case {
    what: &'static str,
    /// (from, to) replacements in the config and the job file.
    config: &'static [(&'static str, &'static str)],
    job: &'static [(&'static str, &'static str)],
    file: File,
    line: usize,
    field: &'static str,
    says: &'static str,
}

const CASES: &[Case] = &[
    // Regression (this one and the next two): the field read "(top level)".
    Case {
        what: "malformed TOML",
        config: &[("cost = 100", "cost = 100 100")],
        job: &[],
        file: File::Config,
        line: 9,
        field: "endpoints.search.cost",
        says: "",
    },
    Case {
        what: "unknown field",
        config: &[("cost = 100", "cost = 100\ncosts = 5")],
        job: &[],
        file: File::Config,
        line: 10,
        field: "endpoints.search.costs",
        says: "unknown field `costs`",
    },
    Case {
        what: "unknown field in a job file",
        config: &[],
        job: &[("fan_out =", "retry_count = 3\nfan_out =")],
        file: File::Job,
        line: 4,
        field: "trending.retry_count",
        says: "unknown field `retry_count`",
    },
    Case {
        what: "unknown endpoint in a job",
        config: &[],
        job: &[("endpoint = \"search\"", "endpoint = \"serch\"")],
        file: File::Job,
        line: 3,
        field: "trending.endpoint",
        says: "unknown endpoint \"serch\"",
    },
    // Regression: the job using this (defined) endpoint was also reported,
    // as "unknown endpoint \"search\" (known: )"; one error is expected.
    Case {
        what: "unknown credential",
        config: &[("credential = \"yt\"", "credential = \"yt2\"")],
        job: &[],
        file: File::Config,
        line: 8,
        field: "endpoints.search.credential",
        says: "unknown credential \"yt2\"",
    },
    Case {
        what: "bad cron expression",
        config: &[],
        job: &[("0 */30 * * * *", "0 */30 * *")],
        file: File::Job,
        line: 2,
        field: "trending.schedule",
        says: "bad cron expression",
    },
    Case {
        what: "cost larger than the smallest window",
        config: &[("cost = 100", "cost = 951")],
        job: &[],
        file: File::Config,
        line: 9,
        field: "endpoints.search.cost",
        says: "950/1h",
    },
    Case {
        what: "cost larger than the endpoint's own window",
        config: &[(
            "cost = 100",
            "cost = 100\nwindows = [{ units = 50, per = \"1m\" }]",
        )],
        job: &[],
        file: File::Config,
        line: 9,
        field: "endpoints.search.cost",
        says: "50/1m",
    },
    Case {
        what: "placeholder with no value",
        config: &[],
        job: &[("{region}\", key", "{country}\", key")],
        file: File::Job,
        line: 8,
        field: "trending.request.query.regionCode",
        says: "{country} has no value",
    },
    Case {
        what: "the secret in a file name",
        config: &[],
        job: &[("data/{job}", "data/{secret}")],
        file: File::Job,
        line: 12,
        field: "trending.sink.path",
        says: "{secret} may not appear here",
    },
    // Regression (issue 12): "1M" was read as a month of 30.44 days.
    Case {
        what: "an ambiguous duration",
        config: &[("per = \"1h\"", "per = \"1M\"")],
        job: &[],
        file: File::Config,
        line: 5,
        field: "credentials.yt.windows[0].per",
        says: "months have no fixed length: write days, e.g. \"30d\"",
    },
];

fn write(case: &Case) -> TestConfig {
    let mut config = CONFIG.to_owned();
    for (from, to) in case.config {
        assert!(config.contains(from), "{}: {from:?}", case.what);
        config = config.replacen(from, to, 1);
    }
    let mut job = JOB.to_owned();
    for (from, to) in case.job {
        assert!(job.contains(from), "{}: {from:?}", case.what);
        job = job.replacen(from, to, 1);
    }
    TestConfig::new(&config, &[("trending.toml", &job)])
}

fn file_of(cfg: &TestConfig, file: &File) -> PathBuf {
    match file {
        File::Config => cfg.path(),
        File::Job => std::fs::canonicalize(cfg.join("jobs/trending.toml")).expect("job file"),
    }
}

/// Where an error must be, and what it must say.
struct Want<'a> {
    what: &'a str,
    file: PathBuf,
    line: usize,
    field: &'a str,
    says: &'a str,
}

/// Runs `args`; expects exit 78 and exactly one error, as `want` says.
fn expect_error(cfg: &TestConfig, server: &RedisServer, args: &[&str], want: &Want<'_>) {
    let Want {
        what,
        file,
        line,
        field,
        says,
    } = want;
    let out = cfg.run(
        args,
        &[
            ("QUOTA_WORKER_REDIS_URL", &server.url()),
            (SECRET_ENV, "not-a-real-key"),
        ],
    );
    let err = support::stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{what}: {args:?}: {err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{what}: one error, not a cascade: {err}");
    let at = format!("error: {}:{line}:", file.display());
    assert!(
        errors[0].starts_with(&at),
        "{what}: expected {at}...; got: {}",
        errors[0]
    );
    assert!(
        errors[0].contains(&format!(": {field}: ")),
        "{what}: expected the field {field}; got: {}",
        errors[0]
    );
    assert!(errors[0].contains(says), "{what}: expected {says:?}: {err}");
    assert!(
        !err.contains("not-a-real-key"),
        "{what}: the secret leaked: {err}"
    );
}

#[test]
fn the_base_config_is_valid() {
    // So each case below fails for the reason it names.
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[("trending.toml", JOB)]);
    let out = cfg.run(
        &["check"],
        &[
            ("QUOTA_WORKER_REDIS_URL", &server.url()),
            (SECRET_ENV, "not-a-real-key"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert_eq!(server.dbsize(), 0, "check does not write to Redis");
}

#[test]
fn every_config_error_exits_78_at_its_file_line_and_field() {
    let server = RedisServer::start();
    for case in CASES {
        let cfg = write(case);
        for args in [
            &["check"][..],
            &["spend", "search", "--json"],
            &["quota", "--json"],
            &["keys", "search"],
        ] {
            let want = Want {
                what: case.what,
                file: file_of(&cfg, &case.file),
                line: case.line,
                field: case.field,
                says: case.says,
            };
            expect_error(&cfg, &server, args, &want);
        }
    }
    assert_eq!(server.dbsize(), 0, "config errors write nothing to Redis");
}

#[test]
fn a_missing_secret_fails_check_at_its_field() {
    let server = RedisServer::start();
    let cfg = TestConfig::new(
        &CONFIG.replace(SECRET_ENV, "QW_TEST_CONFIG_ERRORS_UNSET"),
        &[("trending.toml", JOB)],
    );
    let want = Want {
        what: "missing secret (env)",
        file: cfg.path(),
        line: 4,
        field: "credentials.yt.secret_env",
        says: "QW_TEST_CONFIG_ERRORS_UNSET is not set",
    };
    expect_error(&cfg, &server, &["check"], &want);

    let cfg = TestConfig::new(
        &CONFIG.replace(
            "secret_env = \"QW_TEST_CONFIG_ERRORS_SECRET\"",
            "secret_file = \"secrets/yt\"",
        ),
        &[("trending.toml", JOB)],
    );
    let want = Want {
        what: "missing secret (file)",
        file: cfg.path(),
        line: 4,
        field: "credentials.yt.secret_file",
        says: "cannot read secret file",
    };
    expect_error(&cfg, &server, &["check"], &want);
    std::fs::create_dir_all(cfg.join("secrets")).expect("mkdir");
    std::fs::write(cfg.join("secrets/yt"), "AIza-test\n").expect("write secret");
    let out = cfg.run(&["check"], &[("QUOTA_WORKER_REDIS_URL", &server.url())]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert_eq!(server.dbsize(), 0);
}
