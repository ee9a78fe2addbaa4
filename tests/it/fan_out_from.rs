//! Promise: a job's items can come from data (`[job.fan_out_from]`): the
//! rows of a CSV file or of one read-only SQLite query, each column a
//! placeholder, read at every tick (edits apply without a restart), times
//! the static `fan_out` lists. A write query is refused at load (exit 78,
//! file:line:col and field). A source with too many rows, or one that
//! cannot be read, fans out nothing, is logged and counted, and the daemon
//! keeps running. One job's SQLite sink feeds another job's fan-out.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use quota_worker::outcome::OutcomeKind;
use toml::Value;

use crate::support::config::NEVER;
use crate::support::keys::{any_tick, keys};
use crate::support::pipeline::{Pipeline, kinds};
use crate::support::process;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world::{self, KEY_ENV, SECRET};
use crate::support::{self, ConfigBuilder, Job, RedisServer, Request, Sink, TestConfig};
use crate::support::{machine, procfs};

/// A job over the simulator's videos list, records into `sink`. The
/// simulator pages per `regionCode`, so `scope` (a template) names what each
/// task's request carried.
fn job(name: &str, base: &str, scope: &str, sink: Sink) -> Job {
    Job::new(name, world::ENDPOINT)
        .request(Request::get(&format!("{base}/youtube/v3/videos")).query(&[
            ("chart", "mostPopular"),
            ("regionCode", scope),
            ("maxResults", "5"),
            ("key", "{secret}"),
        ]))
        .sink(sink.records("/items"))
}

fn jsonl() -> Sink {
    Sink::jsonl("data/{job}.jsonl")
}

/// `fan_out_from = { ... }` from `(field, value)` pairs.
fn from(fields: &[(&str, Value)]) -> Value {
    Value::Table(
        fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

fn text(s: &str) -> Value {
    Value::String(s.to_owned())
}

/// The config of the in-process tests: room for everything, quick workers.
fn pipeline(jobs: Vec<Job>) -> ConfigBuilder {
    jobs.into_iter().fold(
        ConfigBuilder::new()
            .worker(world::quick_worker(4))
            .credential(world::credential(world::wide()))
            .endpoint(world::endpoint()),
        ConfigBuilder::job,
    )
}

/// The item keys of a tick's outcomes, sorted.
fn items_of(p: &Pipeline, job: &str, tick: i64) -> Vec<String> {
    let mut items: Vec<String> = p
        .of_tick(job, tick)
        .into_iter()
        .map(|s| s.ev.item)
        .collect();
    items.sort();
    items
}

/// The scopes (`regionCode` values) the simulator was asked for, sorted.
fn scopes(p: &Pipeline) -> Vec<String> {
    let mut s: Vec<String> = p
        .sim_stats()
        .charges
        .iter()
        .map(|c| c.scope.clone())
        .collect();
    s.sort();
    s
}

fn write(path: &Path, text: &str) {
    // Write then rename, as editors and `mv` do: a tick never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write source");
    std::fs::rename(&tmp, path).expect("rename source");
}

/// Waits for the first tick of `job` (fired by the daemon's own schedule)
/// that starts after `after` and whose `n` tasks all ended.
async fn next_tick(p: &Pipeline, job: &str, after: i64, n: usize) -> i64 {
    let mut found = None;
    let ok = p
        .wait_for(Duration::from_secs(30), |seen| {
            let mut ticks: Vec<i64> = seen
                .iter()
                .filter(|s| s.ev.job == job && s.ev.tick > after)
                .map(|s| s.ev.tick)
                .collect();
            ticks.sort();
            ticks.dedup();
            found = ticks.into_iter().find(|t| {
                seen.iter()
                    .filter(|s| s.ev.job == job && s.ev.tick == *t && s.terminal())
                    .count()
                    >= n
            });
            found.is_some()
        })
        .await;
    assert!(
        ok,
        "no tick of {job} after {after} ended with {n} tasks: {:?}",
        kinds(&p.seen())
    );
    found.expect("a tick")
}

/// CSV rows become tasks with their columns as placeholders (times the
/// `fan_out` lists), and an edit of the CSV applies at the daemon's next
/// tick, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn csv_items_fan_out_and_edits_apply_at_the_next_tick() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("channels.csv");
    write(&csv, "channel,region\nUC1,US\nUC2,GB\n");
    let csv_path = csv.display().to_string();
    let mut p = Pipeline::start(world::sim(1, 5), |base| {
        pipeline(vec![
            job("csv", base, "{channel}-{region}-{lang}", jsonl())
                .schedule("*/2 * * * * *")
                .fan_out("lang", ["en", "de"])
                .set("fan_out_from", from(&[("csv", text(&csv_path))])),
        ])
    })
    .await;

    let first = next_tick(&p, "csv", 0, 4).await;
    assert_eq!(
        items_of(&p, "csv", first),
        [
            "channel=UC1,region=US,lang=de",
            "channel=UC1,region=US,lang=en",
            "channel=UC2,region=GB,lang=de",
            "channel=UC2,region=GB,lang=en",
        ]
    );
    assert!(
        p.of_tick("csv", first)
            .iter()
            .all(|s| s.kind() == OutcomeKind::Done)
    );
    // The placeholders reached the request.
    let seen: BTreeSet<String> = scopes(&p).into_iter().collect();
    for s in ["UC1-US-en", "UC1-US-de", "UC2-GB-en", "UC2-GB-de"] {
        assert!(seen.contains(s), "{s} not requested: {seen:?}");
    }

    // Edit: one row gone, one new, one changed in a single column.
    write(&csv, "channel,region\nUC1,FR\nUC3,JP\n");
    let edited = tokio::time::Instant::now();
    let mut later = first;
    let tick = loop {
        let t = next_tick(&p, "csv", later, 4).await;
        let items = items_of(&p, "csv", t);
        if items.iter().any(|i| i.contains("UC3")) {
            break t;
        }
        // A tick that read the file before the edit.
        assert!(
            edited.elapsed() < Duration::from_secs(10),
            "the edit never applied: {items:?}"
        );
        later = t;
    };
    assert_eq!(
        items_of(&p, "csv", tick),
        [
            "channel=UC1,region=FR,lang=de",
            "channel=UC1,region=FR,lang=en",
            "channel=UC3,region=JP,lang=de",
            "channel=UC3,region=JP,lang=en",
        ]
    );
    p.stop().await;
}

/// The item key is every column's value: rows that differ in one column are
/// different items, each with its own state, even when values hold the
/// key's own separators (`,` and `=`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_differing_in_one_column_are_different_items() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("rows.csv");
    // Rows 3 and 4 were one key ("channel=x,region=y,region=z") before
    // values were escaped in item keys.
    write(
        &csv,
        "channel,region\nUC1,US\nUC1,GB\n\"x,region=y\",z\nx,\"y,region=z\"\n",
    );
    let csv_path = csv.display().to_string();
    let mut p = Pipeline::start(world::sim(1, 5), |base| {
        pipeline(vec![
            job("rows", base, "{channel}/{region}", jsonl())
                .set("fan_out_from", from(&[("csv", text(&csv_path))])),
        ])
    })
    .await;
    let evs = p.tick("rows", 4, Duration::from_secs(30)).await;
    assert_eq!(evs.len(), 4, "{:?}", kinds(&evs));
    assert!(
        evs.iter().all(|s| s.kind() == OutcomeKind::Done),
        "{:?}",
        kinds(&evs)
    );
    let items: BTreeSet<String> = evs.iter().map(|s| s.ev.item.clone()).collect();
    assert_eq!(items.len(), 4, "{items:?}");
    // Each item keeps its own state: its own "last run" marker in Redis.
    let ran = p.redis.keys(&keys().item_ran("rows", "*"));
    assert_eq!(ran.len(), 4, "{ran:?}");
    assert_eq!(scopes(&p).len(), 4);
    p.stop().await;
}

/// The chain: job `channels` writes records into a SQLite sink; job
/// `videos` fans out over the distinct channels in it (a read-only query
/// over the sink's table). The database does not exist when the config
/// loads, so `videos` declares its columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sqlite_sink_feeds_another_jobs_fan_out() {
    // The sink's layout (docs/jobs.md, "Fan-out from data"): a table named
    // after the job, each record as JSON in `record`.
    let query = r#"
SELECT DISTINCT json_extract(record, '$.snippet.channelId') AS channel
FROM "channels" ORDER BY channel
"#;
    let source = from(&[
        ("sqlite", text("data/playlists.db")),
        ("query", text(query)),
        ("columns", Value::Array(vec![text("channel")])),
    ]);
    let mut p = Pipeline::start(world::sim(1, 5), |base| {
        pipeline(vec![
            job(
                "channels",
                base,
                "US",
                Sink::sqlite("data/playlists.db").key("/id"),
            ),
            job("videos", base, "{channel}", jsonl()).set("fan_out_from", source),
        ])
    })
    .await;

    // Before job A ran, B's source cannot be read: its tick has no tasks.
    assert!(
        quota_worker::schedule::tick_tasks(
            &p.config.jobs["videos"],
            1,
            quota_worker::queue::Origin::Trigger
        )
        .is_empty()
    );

    let tick = p.trigger("channels").await;
    let evs = p
        .wait_tick("channels", tick, 1, Duration::from_secs(30))
        .await;
    assert_eq!(
        evs.first().map(|s| s.kind()),
        Some(OutcomeKind::Done),
        "{evs:?}"
    );

    // What A stored: the channels of its records.
    let conn = rusqlite::Connection::open(p.path().join("data/playlists.db")).expect("open db");
    let mut stmt = conn
        .prepare(r#"SELECT DISTINCT json_extract(record, '$.snippet.channelId') FROM "channels""#)
        .expect("prepare");
    let stored: BTreeSet<String> = stmt
        .query_map([], |r| r.get(0))
        .expect("query")
        .map(Result::unwrap)
        .collect();
    assert!(
        stored.len() >= 3,
        "the simulator's records span several channels: {stored:?}"
    );

    let tick = p.trigger("videos").await;
    let evs = p
        .wait_tick("videos", tick, stored.len(), Duration::from_secs(30))
        .await;
    assert!(
        evs.iter().all(|s| s.kind() == OutcomeKind::Done),
        "{:?}",
        kinds(&evs)
    );
    let items: BTreeSet<String> = evs.iter().map(|s| s.ev.item.clone()).collect();
    let want: BTreeSet<String> = stored.iter().map(|c| format!("channel={c}")).collect();
    assert_eq!(items, want);
    // Each channel was requested once, by job B.
    let asked: Vec<String> = scopes(&p).into_iter().filter(|s| s != "US").collect();
    assert_eq!(asked, stored.into_iter().collect::<Vec<_>>());
    p.stop().await;
}

// ---- the real binary: load errors, `check`, a running daemon ----

const BIN_CONFIG: &str = r#"jobs = "jobs/*.toml"

[worker]
fan_out_warn = 8

[metrics]
listen = "127.0.0.1:@PORT@"

[credentials.sim]
secret_env = "QW_TEST_KEY"
windows = [{ units = 1000000, per = "1h" }]

[endpoints.videos]
credential = "sim"
cost = 1
"#;

/// Line 8 is `query = ...`: errors about the query point there.
fn sql_job(query: &str, extra: &str) -> String {
    format!(
        r#"[feed]
schedule = "{NEVER}"
endpoint = "videos"

[feed.fan_out_from]
sqlite = "data.db"
{extra}
query = "{query}"

[feed.request]
url = "http://127.0.0.1:9/videos"
query = {{ id = "{{channel}}" }}

[feed.sink]
kind = "jsonl"
path = "out/{{job}}.jsonl"
"#
    )
}

fn bin_config(jobs: &[(&str, &str)], port: u16) -> TestConfig {
    TestConfig::new(&BIN_CONFIG.replace("@PORT@", &port.to_string()), jobs)
}

fn make_db(path: &Path) {
    let conn = rusqlite::Connection::open(path).expect("create db");
    conn.execute_batch(
        "CREATE TABLE channels (id TEXT, active INTEGER);
         INSERT INTO channels VALUES ('UC1', 1), ('UC2', 1), ('UC3', 0);",
    )
    .expect("fill db");
}

/// `check`'s report, which must exit 0.
fn check_ok(cfg: &TestConfig, redis: &RedisServer) -> String {
    let out = check(cfg, redis);
    let text = support::stdout(&out);
    let err = support::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{err}");
    text
}

fn check(cfg: &TestConfig, redis: &RedisServer) -> std::process::Output {
    cfg.run(
        &["check"],
        &[("QUOTA_WORKER_REDIS_URL", &redis.url()), (KEY_ENV, SECRET)],
    )
}

/// A query that writes, or holds two statements, is a config error at load:
/// exit 78, one error at the query's file:line:col and field; the database
/// is left as it was.
#[test]
fn a_write_query_is_refused_at_load() {
    let redis = RedisServer::start();
    for (query, says) in [
        ("DELETE FROM channels", "must only read"),
        ("UPDATE channels SET active = 0", "must only read"),
        ("INSERT INTO channels VALUES ('UC9', 1)", "must only read"),
        ("PRAGMA user_version = 3", "must only read"),
        ("ATTACH 'x.db' AS x", "must only read"),
        (
            "SELECT id AS channel FROM channels; DELETE FROM channels",
            "one statement",
        ),
    ] {
        let cfg = bin_config(&[("feed.toml", &sql_job(query, ""))], 9);
        make_db(&cfg.join("data.db"));
        let out = check(&cfg, &redis);
        let err = support::stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{query}: {err}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "{query}: {err}");
        let at = format!("error: {}:8:", cfg.join("jobs/feed.toml").display());
        assert!(errors[0].starts_with(&at), "{query}: {}", errors[0]);
        assert!(
            errors[0].contains(": feed.fan_out_from.query: "),
            "{}",
            errors[0]
        );
        assert!(errors[0].contains(says), "{query}: {}", errors[0]);
        let conn = rusqlite::Connection::open(cfg.join("data.db")).expect("open");
        let n: i64 = conn
            .query_row("SELECT count(*) FROM channels WHERE active", [], |r| {
                r.get(0)
            })
            .expect("count");
        assert_eq!(n, 2, "{query}: the database was changed");
        assert!(!cfg.join("x.db").exists());
    }
    assert_eq!(redis.dbsize(), 0);
}

/// A source that is not there at load: an error naming the way out
/// (declare `columns`); with `columns` declared, `check` passes and warns.
/// A read-only query over an existing database: `check` shows its rows.
#[test]
fn a_missing_source_needs_declared_columns_and_check_counts_rows() {
    let redis = RedisServer::start();
    let query = "SELECT id AS channel FROM channels WHERE active";
    let cfg = bin_config(&[("feed.toml", &sql_job(query, ""))], 9);
    let out = check(&cfg, &redis);
    let err = support::stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains(": feed.fan_out_from.sqlite: cannot read"),
        "{err}"
    );
    assert!(err.contains("columns = ["), "{err}");
    assert!(!cfg.join("data.db").exists(), "check created the database");

    let cfg = bin_config(
        &[("feed.toml", &sql_job(query, "columns = [\"channel\"]"))],
        9,
    );
    let text = check_ok(&cfg, &redis);
    assert!(text.contains("fan_out_from"), "{text}");
    assert!(text.contains("cannot be read now"), "{text}");
    assert!(text.contains("warning: job feed: cannot read"), "{text}");
    assert!(!cfg.join("data.db").exists(), "check created the database");

    // Declared columns must match the source's.
    make_db(&cfg.join("data.db"));
    let text = check_ok(&cfg, &redis);
    assert!(text.contains("2 row(s) now"), "{text}");
    let cfg = bin_config(&[("feed.toml", &sql_job(query, "columns = [\"chan\"]"))], 9);
    make_db(&cfg.join("data.db"));
    let out = check(&cfg, &redis);
    assert_eq!(out.status.code(), Some(78));
    assert!(
        support::stderr(&out).contains("feed.fan_out_from.columns"),
        "{}",
        support::stderr(&out)
    );
}

const CSV_JOB: &str = r#"[feed]
schedule = "* * * * * *"
endpoint = "videos"
fan_out = { lang = ["en", "de"] }

[feed.fan_out_from]
csv = "channels.csv"
max_items = 3

[feed.request]
url = "@SIM@/youtube/v3/videos"
query = { chart = "mostPopular", regionCode = "{channel}-{lang}", key = "{secret}" }

[feed.sink]
kind = "jsonl"
path = "out/{job}.jsonl"
records = "/items"
"#;

/// `check` counts a CSV's rows (times the `fan_out` combinations) and warns
/// above `[worker] fan_out_warn`.
#[test]
fn check_counts_csv_rows_and_warns_above_fan_out_warn() {
    let redis = RedisServer::start();
    let cfg = bin_config(
        &[("feed.toml", &CSV_JOB.replace("@SIM@", "http://127.0.0.1:9"))],
        9,
    );
    std::fs::write(cfg.join("channels.csv"), "channel\nUC1\nUC2\nUC3\n").expect("csv");
    let text = check_ok(&cfg, &redis);
    assert!(
        text.contains("3 row(s) now x 2 fan_out combination(s)"),
        "{text}"
    );
    assert!(text.contains("6 task(s) per tick"), "{text}");
    assert!(!text.contains("fan_out_warn"), "{text}");
    std::fs::write(
        cfg.join("channels.csv"),
        "channel\nUC1\nUC2\nUC3\nUC4\nUC5\n",
    )
    .expect("csv");
    let out = check(&cfg, &redis);
    let text = support::stdout(&out);
    assert!(
        text.contains("has more rows than max_items now: a tick fans out nothing"),
        "{text}"
    );
    assert!(text.contains("more than 3 rows (max_items)"), "{text}");
    // Issue 37: such a tick fans out nothing: "6 task(s) per tick" was
    // printed for it.
    assert!(
        text.contains(
            "no task per tick now (its fan_out_from source has more than max_items = 3 rows)"
        ) && !text.contains("task(s) per tick"),
        "{text}"
    );
    // Counted at max_items: 3 x 2 = 6, under the warning's 8; more rows allowed: 10.
    let cfg = bin_config(
        &[(
            "feed.toml",
            &CSV_JOB
                .replace("max_items = 3", "max_items = 10")
                .replace("@SIM@", "http://127.0.0.1:9"),
        )],
        9,
    );
    std::fs::write(
        cfg.join("channels.csv"),
        "channel\nUC1\nUC2\nUC3\nUC4\nUC5\n",
    )
    .expect("csv");
    let text = support::stdout(&check(&cfg, &redis));
    assert!(text.contains("10 task(s) per tick"), "{text}");
    assert!(
        text.contains(
            "warning: job feed: a tick fans out 10 task(s), more than [worker] fan_out_warn = 8"
        ),
        "{text}"
    );
}

/// A column may not take a placeholder the product fills, `{since}` and
/// `{since_epoch}` (the item's last complete run) and `{cursor}` (the
/// page's, issue 32) included: the load fails with exit 78 at the job's
/// `fan_out_from.columns`, naming every taken name.
#[test]
fn a_column_named_like_a_product_placeholder_is_refused() {
    let redis = RedisServer::start();
    for column in ["since", "since_epoch", "secret", "cursor"] {
        let job = CSV_JOB
            .replace("@SIM@", "http://127.0.0.1:9")
            .replace("{channel}", "{lang}");
        let cfg = bin_config(&[("feed.toml", &job)], 9);
        std::fs::write(cfg.join("channels.csv"), format!("{column}\nx\n")).expect("csv");
        let out = check(&cfg, &redis);
        let err = support::stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{column}: {err}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "{column}: {err}");
        assert!(
            errors[0].contains(": feed.fan_out_from.columns: "),
            "{}",
            errors[0]
        );
        assert!(
            errors[0].contains(&format!("column {column:?} cannot be a placeholder")),
            "{}",
            errors[0]
        );
        assert!(
            errors[0].contains("secret, date, job, item, since, since_epoch, cursor are taken"),
            "{}",
            errors[0]
        );
    }
    assert_eq!(redis.dbsize(), 0);
}

/// A tick whose source has too many rows, cannot be read or is not valid
/// CSV fans out nothing; the error is logged and counted in
/// `qw_fan_out_errors_total`, the daemon keeps running, and the next good
/// tick fans out again.
#[test]
fn a_bad_source_fans_out_nothing_and_the_daemon_keeps_running() {
    let redis = RedisServer::start();
    let upstream = Upstream::start(1, 1);
    let port = support::free_port();
    let cfg = bin_config(
        &[("feed.toml", &CSV_JOB.replace("@SIM@", &upstream.base_url()))],
        port,
    );
    let csv = cfg.join("channels.csv");
    write(&csv, "channel\nUC1\n");
    let mut rig = Rig::start(redis, cfg, &[]);
    let mut conn = rig.conn();
    let d = &mut rig.daemon;

    // Good: 1 row x 2 langs.
    let good = |conn: &mut redis::Connection, n: i64| {
        let ticks = tick_claims(conn);
        ticks
            .iter()
            .filter(|t| items_queued(conn, **t) == Some(n))
            .count()
    };
    assert!(
        support::wait_until(Duration::from_secs(10), || good(&mut conn, 2) > 0),
        "{}",
        d.log()
    );

    let mut errors_seen = 0.0;
    for (bad, says) in [
        (
            "channel\nUC1\nUC2\nUC3\nUC4\n",
            "more than 3 rows (max_items)",
        ),
        ("channel\nUC1\nUC2,extra\n", "not valid CSV"),
        ("", "cannot read"),
    ] {
        if bad.is_empty() {
            std::fs::remove_file(&csv).expect("remove csv");
        } else {
            write(&csv, bad);
        }
        let nothing = || {
            (d.log().lines())
                .filter(|l| l.contains(says) && l.contains("fans out nothing"))
                .count()
        };
        // A tick read the bad file: every tick that read the good one has
        // finished queuing (the scheduler fans a job's ticks out in turn).
        let read = support::wait_until(Duration::from_secs(10), || nothing() >= 1);
        assert!(read, "{says}: not logged:\n{}", d.log());
        let before = tick_claims(&mut conn).len();
        let seen = nothing();
        let logged = support::wait_until(Duration::from_secs(10), || nothing() > seen.max(1));
        assert!(logged, "{says}: not logged twice:\n{}", d.log());
        assert_eq!(
            tick_claims(&mut conn).len(),
            before,
            "{says}: a bad tick fanned out"
        );
        let m = support::http::scrape(port);
        let errors = m.one("qw_fan_out_errors_total", &[("qw_job", "feed")]);
        assert!(
            errors >= errors_seen + 2.0,
            "{says}: {errors} after {errors_seen}"
        );
        errors_seen = errors;
        assert!(d.running(), "{says}: the daemon exited");
    }

    // Fixed: the next tick fans out again, with the new rows.
    write(&csv, "channel\nUC7\nUC8\n");
    assert!(
        support::wait_until(Duration::from_secs(10), || good(&mut conn, 4) > 0),
        "{}",
        d.log()
    );
    assert!(d.running());
    d.term();
    d.wait_exit(Duration::from_secs(20));
}

/// `#items` of `feed`'s tick `tick`: set once all its tasks are queued.
fn items_queued(conn: &mut redis::Connection, tick: i64) -> Option<i64> {
    redis::cmd("HGET")
        .arg(keys().tick_outcomes("feed", tick))
        .arg("#items")
        .query(conn)
        .expect("HGET")
}

/// Every claimed tick of job `feed`.
fn tick_claims(conn: &mut redis::Connection) -> Vec<i64> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(any_tick(|t| keys().tick_claim("feed", t)))
        .query(conn)
        .expect("KEYS");
    keys.iter()
        .filter_map(|k| k.rsplit(':').next()?.parse().ok())
        .collect()
}

/// Issue 22, item 4: a `fan_out_from` CSV row was read whole before its
/// 1,024-byte check, so one 150 MB cell took `check` to 421 MB and each
/// tick to 425 MB. Records are read field by field with a bounded buffer:
/// the row is refused naming its line, the other rows fan out, and neither
/// `check` nor `trigger` (which reads the source as a tick does) grows
/// with the cell.
#[test]
fn issue_22_4_a_150_mb_csv_cell_is_refused_naming_its_line_in_bounded_memory() {
    use std::io::Write;
    let _machine = machine::heavy();
    let redis = RedisServer::start();
    let cfg = bin_config(
        &[("feed.toml", &CSV_JOB.replace("@SIM@", "http://127.0.0.1:9"))],
        9,
    );
    let mut csv = std::io::BufWriter::new(std::fs::File::create(cfg.join("channels.csv")).unwrap());
    csv.write_all(b"channel\nUC1\n\"").unwrap();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..150 {
        csv.write_all(&chunk).unwrap();
    }
    csv.write_all(b"\"\nUC3\n").unwrap();
    csv.flush().unwrap();
    drop(csv);

    let url = redis.url();
    let env = [
        ("RUST_LOG", "warn"),
        ("QUOTA_WORKER_REDIS_URL", url.as_str()),
        (KEY_ENV, SECRET),
    ];
    let refused = "line 3: column channel: longer than 1024 bytes";
    let run = |args: &[&str]| {
        let (code, out, err, peak) =
            procfs::run_with_peak_kib(process::command(&cfg.path(), args, &env));
        eprintln!("issue 22 item 4: {args:?} peak RSS {} MiB", peak / 1024);
        (code, format!("{out}\n{err}"), peak)
    };
    let (code, text, peak) = run(&["check"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("2 row(s) now x 2 fan_out combination(s)"),
        "{text}"
    );
    assert!(text.contains(refused), "{text}");
    assert!(peak < 64 * 1024, "check: peak RSS {} MiB", peak / 1024);

    let (code, text, peak) = run(&["trigger", "feed"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains(refused), "{text}");
    assert!(peak < 64 * 1024, "trigger: peak RSS {} MiB", peak / 1024);
}
