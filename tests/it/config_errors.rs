//! Promise: every configuration error is found before anything runs: the
//! binary exits 78 with one error naming the file, the exact line and the
//! field, and writes nothing to Redis. And what the loader reads and prints
//! is bounded and safe: a config path that is a device or a huge file is
//! refused before it is read; a Redis URL never prints its password, in any
//! form redis-rs accepts; a malformed one says which forms are accepted; an
//! ambiguous duration ("1M") says what to write instead.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output};

use crate::support::{self, RedisServer, TestConfig};

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
    // Issue 15: the windows on a Redis Cluster.
    Case {
        what: "a cluster with no node",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nquota_nodes = []\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.quota_nodes",
        says: "names no node",
    },
    Case {
        what: "a cluster node on a Unix socket",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nquota_nodes = [\"redis://127.0.0.1:7000\", \"unix:///run/r.sock\"]\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.quota_nodes[1]",
        says: "a cluster node is reached over TCP",
    },
    Case {
        what: "a cluster node on database 3",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nquota_nodes = [\"redis://127.0.0.1:7000/3\"]\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.quota_nodes[0]",
        says: "only database 0",
    },
    Case {
        what: "cluster nodes with different passwords",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nquota_nodes = [\"redis://:a@127.0.0.1:7000\", \"redis://:b@127.0.0.1:7001\"]\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.quota_nodes",
        says: "different password",
    },
    // A user with no password: redis-rs would log nobody in, and the
    // daemon would run as Redis's default user (`[redis] url`: below).
    Case {
        what: "a cluster node naming a user and no password",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nquota_nodes = [\"redis://ingest@127.0.0.1:7000\"]\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.quota_nodes[0]",
        says: "would run as the default user",
    },
    Case {
        what: "two replicas to wait for",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nquota_replicas = 2\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.quota_replicas",
        says: "must be 0 or 1",
    },
    // Issue 36: a Redis that fails over.
    Case {
        what: "sentinels without the master's name",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nsentinels = [\"redis://127.0.0.1:26379\"]\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 2,
        field: "redis.master_name",
        says: "is missing: with [redis] sentinels, name the master they monitor",
    },
    Case {
        what: "a master's name without sentinels",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nmaster_name = \"qw\"\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.master_name",
        says: "[redis] sentinels lists none",
    },
    Case {
        what: "a sentinel on a Unix socket",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nmaster_name = \"qw\"\nsentinels = [\"unix:///run/sentinel.sock\"]\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 4,
        field: "redis.sentinels[0]",
        says: "a sentinel is reached over TCP",
    },
    Case {
        what: "two replicas to wait for in the queue",
        config: &[(
            "\n\n[credentials.yt]",
            "\n[redis]\nqueue_replicas = 2\n[credentials.yt]",
        )],
        job: &[],
        file: File::Config,
        line: 3,
        field: "redis.queue_replicas",
        says: "must be 0 or 1",
    },
    // Issue 12: pagination styles, `{since}`, conditional requests.
    Case {
        what: "an unknown pagination style",
        config: &[],
        job: &[(
            "[trending.sink]",
            "[trending.pagination]\nstyle = \"cursors\"\nmax_pages = 2\n\n[trending.sink]",
        )],
        file: File::Job,
        line: 11,
        field: "trending.pagination.style",
        says: r#"unknown pagination style "cursors": use "cursor", "next_url", "link" or "page""#,
    },
    Case {
        what: "a field of another pagination style",
        config: &[],
        job: &[(
            "[trending.sink]",
            "[trending.pagination]\nstyle = \"link\"\ncursor = \"/next\"\nmax_pages = 2\n\n[trending.sink]",
        )],
        file: File::Job,
        line: 12,
        field: "trending.pagination.cursor",
        says: r#"style = "link" has no cursor"#,
    },
    Case {
        what: "a next_url style without next",
        config: &[],
        job: &[(
            "[trending.sink]",
            "[trending.pagination]\nstyle = \"next_url\"\nmax_pages = 2\n\n[trending.sink]",
        )],
        file: File::Job,
        line: 10,
        field: "trending.pagination.next",
        says: "missing: a JSON pointer like \"/paging/next\"",
    },
    Case {
        what: "not_modified_cost on an endpoint that is not conditional",
        config: &[("cost = 100", "cost = 100\nnot_modified_cost = 0")],
        job: &[],
        file: File::Config,
        line: 10,
        field: "endpoints.search.not_modified_cost",
        says: "set conditional = true",
    },
    Case {
        what: "a mirrored window nothing resyncs",
        config: &[("per = \"1h\" }", "per = \"1h\", upstream = true }")],
        job: &[],
        file: File::Config,
        line: 5,
        field: "credentials.yt.windows[0].upstream",
        says: "give it accounting or ratelimit_headers",
    },
    Case {
        what: "unknown accounting",
        config: &[("cost = 100", "cost = 100\naccounting = \"gitlab\"")],
        job: &[],
        file: File::Config,
        line: 10,
        field: "endpoints.search.accounting",
        says: "unknown accounting \"gitlab\": use \"ietf\", \"github\", \"github-graphql\", \"shopify-graphql\" or \"meta\"",
    },
    // Issue 24: resources.
    Case {
        what: "a resource name that cannot be part of a key",
        config: &[(
            "per = \"1h\" }",
            "per = \"1h\", resource = \"Search API\" }",
        )],
        job: &[],
        file: File::Config,
        line: 5,
        field: "credentials.yt.windows[0].resource",
        says: "bad resource name \"Search API\"",
    },
    Case {
        what: "an endpoint of a resource no window has",
        config: &[("cost = 100", "cost = 100\nresource = \"search\"")],
        job: &[],
        file: File::Config,
        line: 7,
        field: "endpoints.search",
        says: "the endpoint spends from resource \"search\", which credential \"yt\" has no window of",
    },
    Case {
        what: "an endpoint of a resource only the token's concurrent cap applies to",
        config: &[
            (
                "per = \"1h\" }",
                "per = \"1h\" }, { kind = \"concurrent\", units = 10 }",
            ),
            ("cost = 100", "cost = 100\nresource = \"search\""),
        ],
        job: &[],
        file: File::Config,
        line: 7,
        field: "endpoints.search",
        says: "the endpoint spends from resource \"search\", which credential \"yt\" has no window of",
    },
    Case {
        what: "min_block above throttle_block_max",
        config: &[("cost = 100", "cost = 100\nmin_block = \"20m\"")],
        job: &[],
        file: File::Config,
        line: 10,
        field: "endpoints.search.min_block",
        says: "at most throttle_block_max (15m)",
    },
    Case {
        what: "throttle_at without Meta",
        config: &[(
            "cost = 100",
            "cost = 100\naccounting = \"github\"\nthrottle_at = 90",
        )],
        job: &[],
        file: File::Config,
        line: 11,
        field: "endpoints.search.throttle_at",
        says: "set accounting = \"meta\"",
    },
    Case {
        what: "throttle_at beyond 100%",
        config: &[(
            "cost = 100",
            "cost = 100\naccounting = \"meta\"\nthrottle_at = 120",
        )],
        job: &[],
        file: File::Config,
        line: 11,
        field: "endpoints.search.throttle_at",
        says: "120 is not a percentage from 1 to 100",
    },
    Case {
        what: "ratelimit_headers beside an adapter",
        config: &[(
            "cost = 100",
            "cost = 100\naccounting = \"ietf\"\nratelimit_headers = { remaining = \"a\", reset = \"b\" }",
        )],
        job: &[],
        file: File::Config,
        line: 11,
        field: "endpoints.search.ratelimit_headers",
        says: "remove ratelimit_headers",
    },
    Case {
        what: "{since} in a file name",
        config: &[],
        job: &[("data/{job}", "data/{since}")],
        file: File::Job,
        line: 12,
        field: "trending.sink.path",
        says: "{since} may only appear in the request",
    },
];

/// Issue 22, Low 1: values `check` accepted that cannot work. A zero
/// `timeout` failed every request at once, its unit kept; a `cost` above
/// 2^53 failed every spend with a script error and retried for ever; window
/// `units` of 2^63 - 1 made `quota` report 0 left while admitting.
const ISSUE_22_LOW_CASES: &[Case] = &[
    Case {
        what: "a zero request timeout",
        config: &[("cost = 100", "cost = 100\ntimeout = \"0s\"")],
        job: &[],
        file: File::Config,
        line: 10,
        field: "endpoints.search.timeout",
        says: "must be more than 0",
    },
    Case {
        what: "a cost above 2^53",
        config: &[
            ("units = 950", "units = 9007199254740991"),
            ("cost = 100", "cost = 9007199254740993"),
        ],
        job: &[],
        file: File::Config,
        line: 9,
        field: "endpoints.search.cost",
        says: "must be at most 2^53 - 1",
    },
    Case {
        what: "window units that a double cannot hold exactly",
        config: &[("units = 950", "units = 9223372036854775807")],
        job: &[],
        file: File::Config,
        line: 5,
        field: "credentials.yt.windows[0].units",
        says: "must be at most 2^53 - 1",
    },
];

/// A GraphQL request on line 9 of the job file: its variable `after` is
/// the cursor.
const GRAPHQL_AFTER: &str = r#"key = "{secret}" }
graphql = { query = "query($after: String) { a(after: $after) { id } }", variables = { after = "{cursor}" } }"#;

/// Issue 32: what `check` refuses of GraphQL requests and page flags, each
/// error naming both fields of a pair (or the placeholder).
const ISSUE_32_CASES: &[Case] = &[
    Case {
        what: "graphql and body",
        config: &[],
        job: &[(
            "key = \"{secret}\" }",
            "key = \"{secret}\" }\nbody = '{{}}'\ngraphql = { query = \"{ a }\" }",
        )],
        file: File::Job,
        line: 9,
        field: "trending.request.body",
        says: "graphql and body cannot both be written",
    },
    Case {
        what: "a {cursor} variable without pagination",
        config: &[],
        job: &[("key = \"{secret}\" }", GRAPHQL_AFTER)],
        file: File::Job,
        line: 9,
        field: "trending.request.graphql.variables.after",
        says: "{cursor} has no value: it is the cursor of trending.pagination style = \"cursor\" (cursor or cursor_record), and trending.pagination has no table at all",
    },
    Case {
        what: "a {cursor} variable with a pagination that has no cursor",
        config: &[],
        job: &[
            ("key = \"{secret}\" }", GRAPHQL_AFTER),
            (
                "[trending.sink]",
                "[trending.pagination]\nstyle = \"link\"\nmax_pages = 2\n\n[trending.sink]",
            ),
        ],
        file: File::Job,
        line: 9,
        field: "trending.request.graphql.variables.after",
        says: "trending.pagination has style = \"link\": it has no cursor",
    },
    Case {
        what: "more and last",
        config: &[],
        job: &[(
            "[trending.sink]",
            "[trending.pagination]\ncursor = \"/next\"\nparam = \"after\"\nmore = \"/more\"\nlast = \"/isLast\"\nmax_pages = 2\n\n[trending.sink]",
        )],
        file: File::Job,
        line: 14,
        field: "trending.pagination.last",
        says: "more and last cannot both be written",
    },
    Case {
        what: "a placeholder in the query",
        config: &[],
        job: &[(
            "key = \"{secret}\" }",
            "key = \"{secret}\" }\ngraphql = { query = \"query { a(r: \\\"{region}\\\") { id } }\" }",
        )],
        file: File::Job,
        line: 9,
        field: "trending.request.graphql.query",
        says: "the query takes no placeholders: {region} would be sent as written; pass the value as a variable: variables = { region = \"{region}\" }",
    },
    Case {
        what: "cursor and cursor_record",
        config: &[],
        job: &[(
            "[trending.sink]",
            "[trending.pagination]\ncursor = \"/next\"\ncursor_record = \"/id\"\nparam = \"after\"\nmax_pages = 2\n\n[trending.sink]",
        )],
        file: File::Job,
        line: 12,
        field: "trending.pagination.cursor_record",
        says: "cursor and cursor_record cannot both be written",
    },
    Case {
        what: "graphql with GET",
        config: &[],
        job: &[(
            "url = ",
            "method = \"GET\"\ngraphql = { query = \"{ a }\" }\nurl = ",
        )],
        file: File::Job,
        line: 7,
        field: "trending.request.method",
        says: "graphql is sent with POST, not GET",
    },
    Case {
        what: "a cursor style that sends its cursor nowhere",
        config: &[],
        job: &[(
            "[trending.sink]",
            "[trending.pagination]\ncursor = \"/next\"\nmax_pages = 2\n\n[trending.sink]",
        )],
        file: File::Job,
        line: 10,
        field: "trending.pagination.param",
        says: "must name the query parameter that carries the cursor",
    },
];

/// Issue 32: each of [`ISSUE_32_CASES`] is a config error at its file,
/// line and field, exit 78, for `check` and `run` alike.
#[test]
fn issue_32_graphql_and_page_flag_refusals_are_config_errors() {
    refused_by_check_and_run(ISSUE_32_CASES);
}

/// Issue 22, Low 1: each of [`ISSUE_22_LOW_CASES`] is a config error at its
/// file, line and field, exit 78, for `check` and `run` alike.
#[test]
fn issue_22_low_1_values_that_cannot_work_are_config_errors() {
    refused_by_check_and_run(ISSUE_22_LOW_CASES);
}

/// Each of `cases` is a config error at its file, line and field, exit 78,
/// for `check` and `run` alike, and nothing is written to Redis.
fn refused_by_check_and_run(cases: &[Case]) {
    let server = RedisServer::start();
    for case in cases {
        let cfg = write(case);
        for args in [&["check"][..], &["run"]] {
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

/// A `[redis] url` naming a user and no password: redis-rs would send no
/// login, so the daemon would run as Redis's `default` user, not the one
/// named. Refused at the field, in the file, with sentinels, and from the
/// environment.
#[test]
fn a_redis_url_with_a_user_and_no_password_is_refused() {
    for redis in [
        "url = \"redis://ingest@127.0.0.1:6379/0\"",
        "url = \"redis://ingest@/0\"\nmaster_name = \"qw\"\nsentinels = [\"redis://127.0.0.1:26379\"]",
    ] {
        let cfg = TestConfig::new(
            &format!("{CONFIG}\n[redis]\n{redis}\n"),
            &[("trending.toml", JOB)],
        );
        let out = cfg.run(&["check"], &[(SECRET_ENV, "k")]);
        let file = format!("{}:12:7: redis.url: ", cfg.path().display());
        assert_config_error(&out, &file, "names user \"ingest\" and no password");
        assert!(support::stderr(&out).contains("default user"));
    }
    let cfg = TestConfig::new(CONFIG, &[("trending.toml", JOB)]);
    let out = cfg.run(
        &["check"],
        &[
            ("QUOTA_WORKER_REDIS_URL", "redis://ingest@127.0.0.1:6379"),
            (SECRET_ENV, "k"),
        ],
    );
    assert_config_error(
        &out,
        &cfg.path().display().to_string(),
        "QUOTA_WORKER_REDIS_URL",
    );
    assert!(support::stderr(&out).contains("and no password"));
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

/// Issue 36: with sentinels, `url` names no host (the sentinels say where
/// the master is); `QUOTA_WORKER_REDIS_URL` with a host names the Redis to
/// use instead of asking them.
#[test]
fn a_url_with_a_host_beside_sentinels_is_an_error_unless_the_variable_names_the_redis() {
    let config = CONFIG.replace(
        "\n\n[credentials.yt]",
        "\n[redis]\nmaster_name = \"qw\"\nsentinels = [\"redis://127.0.0.1:9\"]\nurl = \"redis://:hunter2@10.0.0.1:6379/0\"\n[credentials.yt]",
    );
    let cfg = TestConfig::new(&config, &[("trending", JOB)]);
    let out = cfg.run(&["check"], &[(SECRET_ENV, "k")]);
    let err = support::stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    let at = format!("error: {}:5:", cfg.path().display());
    assert!(
        err.contains(&at) && err.contains("redis.url: ") && err.contains("names a host"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");

    let server = RedisServer::start();
    let out = cfg.run(
        &["check"],
        &[(SECRET_ENV, "k"), ("QUOTA_WORKER_REDIS_URL", &server.url())],
    );
    let (text, err) = (support::stdout(&out), support::stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}{err}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", server.port())),
        "checks the variable's Redis: {text}"
    );
}
