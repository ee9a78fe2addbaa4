//! Promise: a job's records land in a PostgreSQL table (`kind =
//! "postgres"`), through the real binary against a real server: every
//! served record once, upserted by key or appended; a page written twice (a
//! daemon killed between the write and its checkpoint) adds nothing, whether
//! the killed task or a newer tick's task takes the run up; a
//! server stopped during a tick costs no page again (spooled, written when
//! it is back); `search` finds records by their title words; a table of
//! other columns is refused at `check` and `run` (exit 78) with what
//! differs; the password is in no output, log, metric or Redis key.

use std::collections::BTreeSet;
use std::time::Duration;

use simulator::Fault;

use crate::support::http::http_get;
use crate::support::postgres::{Postgres, TlsFiles};
use crate::support::process::{Proc, run_cli};
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world::{self, JOB};
use crate::support::{RedisServer, Sink, TestConfig, Worker, free_port, styles, wait_until};

/// The role the sinks log in as, and its database.
const ROLE: &str = "ingest";
/// Its password: distinctive, so a leak is found by a plain search.
const PASSWORD: &str = "pg-Pw-7f3c9d1e";
/// Regions, pages per run and records per page the simulator serves.
const REGIONS: [&str; 3] = ["US", "GB", "DE"];
const PAGES: u32 = 3;
const ITEMS: u32 = 4;

/// A server with the role [`ROLE`] and its database.
fn server() -> Postgres {
    let pg = Postgres::start();
    pg.role(ROLE, PASSWORD);
    pg
}

/// The sink every test starts from: the table `trending` in [`ROLE`]'s
/// database, logged in with the password in `secrets/pg`.
fn sink(pg: &Postgres) -> Sink {
    Sink::postgres(&pg.url(ROLE, ROLE))
        .password_file("secrets/pg")
        .records("/items")
}

/// [`world::config`]'s job on `regions`, `PAGES` pages of `ITEMS` items
/// into `sink`, its spool in `state/`, the password file written.
fn config(upstream: &Upstream, regions: &[&str], sink: Sink) -> TestConfig {
    let cfg = world::config(
        world::job(&upstream.base_url())
            .fan_out("region", regions.iter().copied())
            .pages(PAGES)
            .sink(sink),
    )
    .state_dir("state")
    .write();
    write_password(&cfg, PASSWORD);
    cfg
}

fn write_password(cfg: &TestConfig, password: &str) {
    std::fs::create_dir_all(cfg.join("secrets")).expect("mkdir secrets");
    std::fs::write(cfg.join("secrets/pg"), format!("{password}\n")).expect("write password");
}

/// The record ids the simulator serves for `regions`: `<region>-p<n>-i<k>`.
fn ids(regions: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in regions {
        for n in 1..=PAGES {
            for k in 1..=ITEMS {
                out.insert(format!("{r}-p{n}-i{k}"));
            }
        }
    }
    out
}

/// `SELECT record->>'id' FROM table`: every stored id, repeats included.
fn stored_ids(pg: &Postgres, table: &str) -> Vec<String> {
    let mut ids: Vec<String> = pg
        .try_query(ROLE, &format!("SELECT record->>'id' FROM \"{table}\""))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect();
    ids.sort();
    ids
}

fn rows(pg: &Postgres, table: &str) -> i64 {
    pg.count(ROLE, &format!("SELECT count(*) FROM \"{table}\""))
}

/// `trigger JOB --wait` on the rig: its exit code and both streams.
fn trigger(rig: &Rig) -> (Option<i32>, String) {
    let t = rig.trigger(JOB);
    (
        t.code,
        format!("stdout:\n{}\nstderr:\n{}", t.stdout, t.stderr),
    )
}

/// Asserts that every id of `regions` is stored exactly once in `table`.
fn every_record_once(pg: &Postgres, table: &str, regions: &[&str]) {
    let stored = stored_ids(pg, table);
    let unique: BTreeSet<String> = stored.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        stored.len(),
        "a record was stored twice: {stored:?}"
    );
    assert_eq!(unique, ids(regions));
}

/// Upsert (`key`) and append (no `key`) both store every served record
/// once; a second tick replaces the keyed rows and appends new pages to the
/// other table.
#[test]
fn every_served_record_lands_once_upserted_or_appended() {
    let pg = server();
    let upstream = Upstream::start(PAGES, ITEMS);
    for (table, keyed) in [("upserted", true), ("appended", false)] {
        let mut s = sink(&pg).table(table);
        if keyed {
            s = s.key("/id");
        }
        let mut rig = Rig::new(config(&upstream, &REGIONS, s));
        let (code, out) = trigger(&rig);
        assert_eq!(code, Some(0), "{out}");
        every_record_once(&pg, table, &REGIONS);
        let (code, out) = trigger(&rig);
        assert_eq!(code, Some(0), "{out}");
        let all = ids(&REGIONS).len() as i64;
        if keyed {
            every_record_once(&pg, table, &REGIONS);
            // Each row was replaced by the second tick's copy.
            let pages = pg.count(
                ROLE,
                &format!("SELECT count(DISTINCT split_part(page_id, ':', 2)) FROM \"{table}\""),
            );
            assert_eq!(pages, 1, "every row is from the newest tick");
        } else {
            assert_eq!(
                rows(&pg, table),
                2 * all,
                "the second tick's pages are appended"
            );
        }
        rig.daemon.term();
        let _ = rig.daemon.wait_exit(Duration::from_secs(20));
    }
}

/// The page id: `job:tick:page:item`, one per page of a run.
#[test]
fn rows_carry_their_page_id_item_and_fetch_time() {
    let pg = server();
    let upstream = Upstream::start(PAGES, ITEMS);
    let rig = Rig::new(config(&upstream, &["US"], sink(&pg)));
    let (code, out) = trigger(&rig);
    assert_eq!(code, Some(0), "{out}");
    let got = pg.query(
        ROLE,
        "SELECT DISTINCT item, split_part(page_id, ':', 1), split_part(page_id, ':', 3),
                fetched_at > now() - interval '5 minutes'
         FROM trending ORDER BY 3",
    );
    let want: Vec<Vec<Option<String>>> = (1..=PAGES)
        .map(|n| {
            vec![
                Some(r#"{"region":"US"}"#.to_owned()),
                Some(JOB.to_owned()),
                Some(n.to_string()),
                Some("t".to_owned()),
            ]
        })
        .collect();
    assert_eq!(got, want);
    drop(rig);
}

fn done(d: &Proc) -> usize {
    d.outcomes()
        .iter()
        .filter(|o| o["outcome"] == "done")
        .count()
}

/// Times the upstream was asked for each page of `scope` (answered or not).
fn asked(upstream: &Upstream, scope: &str) -> Vec<usize> {
    let per_page = upstream.stats().requests_per_page(0);
    (1..=PAGES)
        .map(|n| per_page.get(&(scope.to_owned(), n)).copied().unwrap_or(0))
        .collect()
}

/// One region of `PAGES` pages into `sink` on a worker of one slot, quick
/// to find a killed daemon's task (`recover_after`), and patient with a
/// Redis that stops answering (so that a page's checkpoint waits, rather
/// than fails, while Redis is held).
fn one_region(upstream: &Upstream, sink: Sink, recover_after: &str) -> TestConfig {
    let cfg = world::config(
        world::job(&upstream.base_url())
            .fan_out("region", ["US"])
            .pages(PAGES)
            .sink(sink),
    )
    .worker(
        Worker::default()
            .concurrency(1)
            .recover_after(recover_after),
    )
    .redis_timeout("60s")
    .state_dir("state")
    .write();
    write_password(&cfg, PASSWORD);
    cfg
}

/// A run stopped between page `page`'s write and its checkpoint, and what
/// stopped it: the daemon was SIGKILLed after the rows committed, Redis
/// restarted from its append-only file. Pages 1 to `page` are in the
/// table; the checkpoint in Redis is the one before `page`'s (none for
/// page 1: a run's first checkpoint follows its first page).
///
/// How the kill lands in that gap, for certain: each page's request up to
/// `page` is held by the upstream (a 2 s delay, the next one queued while
/// the one before is held); while the last is held, Redis is SIGKILLed. The
/// answer then arrives, the sink commits the page (it needs no Redis), and
/// the checkpoint, which needs Redis, reaches no server. The daemon is
/// SIGKILLed as soon as the rows are seen; only then does Redis start again
/// (from its append-only file, fsynced at every write, so the queue and
/// everything acknowledged before are back). Stopping Redis with SIGSTOP
/// instead does not work: the checkpoint waits in the stopped server's
/// socket buffer and is applied when it resumes (the first version of the
/// test below did that, and the run went on at page 2).
struct KilledMidRun {
    pg: Postgres,
    /// Its daemon is the killed one.
    rig: Rig,
    upstream: Upstream,
}

fn kill_between_write_and_checkpoint(page: u32, recover_after: &str) -> KilledMidRun {
    let pg = server();
    let redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let upstream = Upstream::start(PAGES, ITEMS);
    let mut rig = Rig::start(redis, one_region(&upstream, sink(&pg), recover_after), &[]);
    upstream.inject(Fault::Delay(Duration::from_secs(2)), 1);
    rig.queue(JOB);
    let (redis, first) = (&mut rig.redis, &mut rig.daemon);
    for held in 1..=page {
        assert!(
            wait_until(Duration::from_secs(20), || upstream.injected()
                == u64::from(held)),
            "page {held} never reached the upstream; log:\n{}",
            first.log()
        );
        if held < page {
            upstream.inject(Fault::Delay(Duration::from_secs(2)), 1);
        }
    }
    redis.kill();
    let all = i64::from(page * ITEMS);
    let written = wait_until(Duration::from_secs(20), || rows(&pg, JOB) == all);
    first.kill();
    redis.restart();
    assert!(
        written,
        "page {page} was not written; log:\n{}",
        first.log()
    );
    assert_eq!(rows(&pg, JOB), all, "pages 1 to {page} only");
    assert_eq!(done(first), 0);
    KilledMidRun { pg, rig, upstream }
}

/// After the run killed in `k` was taken up by `second`: every record is
/// stored once, one page was written again and added nothing, and the
/// upstream was asked for each page `asked` times (the killed page twice).
fn written_again_once(k: &KilledMidRun, second: &Proc, asked_per_page: [usize; 3]) {
    every_record_once(&k.pg, JOB, &["US"]);
    assert_eq!(
        second
            .messages("this page was written before: nothing added")
            .len(),
        1,
        "{}",
        second.log()
    );
    assert_eq!(
        asked(&k.upstream, "US"),
        asked_per_page,
        "the killed page was fetched again, and only it"
    );
}

/// A daemon killed after its page's rows committed and before the page's
/// checkpoint: the run is taken up again at that page, which is fetched
/// and written again, and adds nothing (append mode: nothing but the page
/// id tells the copies apart).
#[test]
fn a_page_written_again_after_a_kill_before_its_checkpoint_adds_nothing() {
    let k = kill_between_write_and_checkpoint(1, "3s");
    let second = k.rig.spawn_another("second");
    assert!(
        wait_until(Duration::from_secs(90), || done(&second) == 1),
        "the killed daemon's task was not taken up; log:\n{}",
        second.log()
    );
    written_again_once(&k, &second, [2, 1, 1]);
}

/// The same kill at page 2, but the run is taken up by a *newer tick's*
/// task before the killed task is found (`recover_after` 20 s): the newer
/// task takes the run over at page 2 (page 1's checkpoint) and keeps the
/// run's tick, so page 2 written again is the same page and adds nothing;
/// the killed tick's task, found later, ends `superseded` without fetching
/// anything. (Killed at page 1 there is no checkpoint yet, so there is no
/// run to take over: the newer tick starts its own run, and its pages are
/// its own tick's data.)
#[test]
fn a_newer_tick_taking_over_a_killed_run_writes_its_page_once() {
    let k = kill_between_write_and_checkpoint(2, "20s");
    let second = k.rig.another("second");
    let (code, out) = trigger(&k.rig);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(done(&second), 1, "the newer tick's task: {}", second.log());
    written_again_once(&k, &second, [1, 2, 1]);
    // The killed tick's task, once its worker is found dead: superseded,
    // nothing fetched or written.
    let superseded = || {
        (second.outcomes().iter())
            .filter(|o| o["outcome"] == "superseded")
            .count()
    };
    assert!(
        wait_until(Duration::from_secs(90), || superseded() == 1),
        "the killed tick's task did not end superseded; log:\n{}",
        second.log()
    );
    assert_eq!(done(&second), 1);
    assert_eq!(asked(&k.upstream, "US"), [1, 2, 1]);
    every_record_once(&k.pg, JOB, &["US"]);
}

/// PostgreSQL stopped while a tick runs: its pages are spooled, the tasks
/// end `done`, and once the server is back the rows arrive; the upstream
/// was asked for each page once (a server down heals: none is refused for
/// good).
#[test]
fn a_server_stopped_during_a_tick_costs_no_page_again() {
    let mut pg = server();
    let upstream = Upstream::start(PAGES, ITEMS);
    let rig = Rig::new(one_region(&upstream, sink(&pg).key("/id"), "3s"));
    let (cfg, redis, d) = (&rig.cfg, &rig.redis, &rig.daemon);
    // The table exists and the pool holds a connection before the stop.
    assert!(wait_until(Duration::from_secs(10), || {
        pg.count(
            ROLE,
            "SELECT count(*) FROM pg_tables WHERE tablename = 'trending'",
        ) == 1
    }));
    upstream.inject(Fault::Delay(Duration::from_secs(2)), 1);
    let mut tick = Proc::sim_cli(
        "trigger",
        cfg,
        Some(&redis.url()),
        &["trigger", JOB, "--wait"],
        &[],
    );
    assert!(wait_until(Duration::from_secs(20), || upstream.injected() == 1));
    // Page 1 is held at the upstream: the server stops under the tick.
    pg.stop();
    let status = tick.wait_exit(Duration::from_secs(120));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "every task ends done, its pages spooled:\n{}",
        tick.log()
    );
    assert_eq!(spooled(cfg), PAGES as usize, "log:\n{}", d.log());
    assert_eq!(asked(&upstream, "US"), [1, 1, 1]);

    pg.restart();
    let all = ids(&["US"]).len() as i64;
    assert!(
        wait_until(Duration::from_secs(40), || rows(&pg, JOB) >= all),
        "{} of {all} rows after the server came back; log:\n{}",
        rows(&pg, JOB),
        d.log()
    );
    every_record_once(&pg, JOB, &["US"]);
    assert!(wait_until(Duration::from_secs(10), || spooled(cfg) == 0));
    assert_eq!(
        asked(&upstream, "US"),
        [1, 1, 1],
        "no page was fetched again"
    );
    // Issue 37, item 3: a server down (57P01 at the shutdown, then refused
    // connections) heals: nothing is kept as refused for good.
    assert!(
        !cfg.join("state/spool/%rejected").exists(),
        "a page of a server that was down was kept as refused"
    );
    let spooled_errors: Vec<String> = d
        .messages("the sink could not take the page: spooled, and written when it can")
        .iter()
        .map(|e| e["error"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(spooled_errors.len(), PAGES as usize);
    assert!(
        spooled_errors
            .iter()
            .all(|e| e.starts_with(&format!("postgres {}", pg.url(ROLE, ROLE)))),
        "{spooled_errors:?}"
    );
}

/// Pages waiting in `state/spool/trending`.
fn spooled(cfg: &TestConfig) -> usize {
    std::fs::read_dir(cfg.join("state/spool").join(JOB))
        .map(|d| {
            d.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count()
        })
        .unwrap_or(0)
}

/// `search JOB WORDS` reads the table's generated `tsvector`: the words of
/// the titles find their records, best first, in the SQLite search's shape.
#[test]
fn search_finds_records_by_their_title_words() {
    let pg = server();
    let upstream = Upstream::start(PAGES, ITEMS);
    let rig = Rig::new(config(
        &upstream,
        &REGIONS,
        sink(&pg).key("/id").search(&["/snippet/title"]),
    ));
    let cfg = &rig.cfg;
    let (code, out) = trigger(&rig);
    assert_eq!(code, Some(0), "{out}");
    let search = |args: &[&str]| {
        let (code, out, err) = run_cli(cfg, None, args, Duration::from_secs(30));
        assert_eq!(code, Some(0), "{err}");
        out
    };
    // Titles are "Simulated <region> item <rank> (<id>)".
    let v: serde_json::Value = serde_json::from_str(&search(&[
        "search",
        JOB,
        "gb simulated",
        "--limit",
        "100",
        "--json",
    ]))
    .expect("json");
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), (PAGES * ITEMS) as usize, "{v:#}");
    for r in results {
        assert_eq!(r["item"], serde_json::json!({"region": "GB"}), "{r:#}");
        let title = r["record"]["snippet"]["title"].as_str().unwrap_or_default();
        assert!(title.contains("GB"), "{title}");
        assert!(
            r["snippet"].as_str().unwrap_or_default().contains("[GB]"),
            "{r:#}"
        );
        assert!(r["key"].as_str().is_some_and(|k| k.starts_with("GB-")));
        assert!(r["fetched_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    }
    assert_eq!(
        v["databases"][0].as_str(),
        Some(format!("{} table {JOB}", pg.url(ROLE, ROLE)).as_str())
    );
    // websearch syntax: a word that must not match.
    let v: serde_json::Value = serde_json::from_str(&search(&[
        "search",
        JOB,
        "simulated -gb -us",
        "--json",
        "--limit",
        "100",
    ]))
    .expect("json");
    let regions: BTreeSet<String> = (v["results"].as_array().expect("results").iter())
        .map(|r| r["item"]["region"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(regions, BTreeSet::from(["DE".to_owned()]));
    let text = search(&["search", JOB, "nothing-like-this"]);
    assert!(text.starts_with("0 result(s)"), "{text}");
}

/// The password reaches the server and nothing else: not `check`'s or
/// `run`'s output, not the logs of a tick or of a refused login (a wrong
/// password), not `/metrics`, not `search`, not Redis; a URL that holds one
/// is refused without repeating it. `PGPASSFILE` works in place of
/// `password_file`.
#[test]
fn the_password_is_in_no_output_log_metric_or_redis_key() {
    const WRONG: &str = "pg-Wrong-51b0e2aa";
    let pg = server();
    let redis = RedisServer::start();
    let upstream = Upstream::start(PAGES, ITEMS);
    let port = free_port();
    let cfg = world::config(
        world::job(&upstream.base_url())
            .fan_out("region", ["US"])
            .pages(PAGES)
            .sink(sink(&pg).key("/id").search(&["/snippet/title"])),
    )
    .metrics_listen(&format!("127.0.0.1:{port}"))
    .state_dir("state")
    .write();
    write_password(&cfg, PASSWORD);
    let mut seen = Vec::new();
    let (code, out, err) = run_cli(
        &cfg,
        Some(&redis.url()),
        &["check"],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{err}");
    seen.extend([out, err]);
    let mut rig = Rig::start(redis, cfg, &[]);
    let (code, out) = trigger(&rig);
    assert_eq!(code, Some(0), "{out}");
    seen.push(out);
    let (redis, cfg, d) = (&mut rig.redis, &mut rig.cfg, &mut rig.daemon);
    every_record_once(&pg, JOB, &["US"]);
    let (_, metrics) = http_get(port, "/metrics").expect("/metrics");
    assert!(metrics.contains("qw_"), "{metrics}");
    seen.push(metrics);
    let (code, out, err) = run_cli(
        cfg,
        None,
        &["search", JOB, "simulated", "--json"],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{err}");
    seen.extend([out, err]);
    d.term();
    let _ = d.wait_exit(Duration::from_secs(20));
    seen.push(d.log());

    // A wrong password: refused at start, the server's words in the error.
    write_password(cfg, WRONG);
    for cmd in ["check", "run"] {
        let (code, out, err) = run_cli(cfg, Some(&redis.url()), &[cmd], Duration::from_secs(60));
        assert_eq!(code, Some(78), "{cmd}: {out}\n{err}");
        assert!(
            err.contains("password authentication failed"),
            "{cmd}: {err}"
        );
        seen.extend([out, err]);
    }
    // A password written in the URL is refused, and not repeated.
    let inline = pg
        .url(ROLE, ROLE)
        .replace("ingest@", &format!("ingest:{PASSWORD}@"));
    let job = std::fs::read_to_string(cfg.join("jobs/trending.toml"))
        .expect("job")
        .replace(&pg.url(ROLE, ROLE), &inline);
    let config = std::fs::read_to_string(cfg.path()).expect("config");
    let bad = TestConfig::new(&config, &[("trending.toml", &job)]);
    let (code, out, err) = run_cli(&bad, None, &["check"], Duration::from_secs(30));
    assert_eq!(code, Some(78), "{out}\n{err}");
    assert!(err.contains("the URL holds a password"), "{err}");
    seen.extend([out, err]);

    // PGPASSFILE in place of password_file: a libpq password file.
    let pgpass = cfg.join("secrets/pgpass");
    std::fs::write(
        &pgpass,
        format!("127.0.0.1:{}:*:{ROLE}:{PASSWORD}\n", pg.port()),
    )
    .expect("pgpass");
    let job = std::fs::read_to_string(cfg.join("jobs/trending.toml")).expect("job");
    let job: String = job
        .lines()
        .filter(|l| !l.starts_with("password_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(cfg.join("jobs/trending.toml"), job).expect("job");
    let env = [("PGPASSFILE", pgpass.to_str().expect("utf-8"))];
    let mut check = Proc::sim_cli("check", cfg, Some(&redis.url()), &["check"], &env);
    let status = check.wait_exit(Duration::from_secs(60));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", check.log());
    seen.push(check.log());

    seen.extend(styles::everything_in(&redis.url()));
    for text in &seen {
        assert!(!text.contains(PASSWORD), "the password leaked:\n{text}");
        assert!(!text.contains(WRONG), "the wrong password leaked:\n{text}");
    }
}

/// A table that exists with other columns is refused before anything runs:
/// `check` and `run` exit 78, naming the job file's `sink.url`, the table
/// and what differs; nothing is fetched.
#[test]
fn a_table_of_other_columns_is_refused_at_check_and_run() {
    let pg = server();
    pg.query(
        ROLE,
        "CREATE TABLE trending (id integer, item text, record text, owner text NOT NULL);
         ALTER TABLE trending OWNER TO ingest;",
    );
    let redis = RedisServer::start();
    let upstream = Upstream::start(PAGES, ITEMS);
    let cfg = config(&upstream, &["US"], sink(&pg));
    for cmd in ["check", "run"] {
        let (code, out, err) = run_cli(&cfg, Some(&redis.url()), &[cmd], Duration::from_secs(60));
        assert_eq!(code, Some(78), "{cmd}: {out}\n{err}");
        let want = "table trending has no column key (text); has no column page_id (text); \
             has no column fetched_at (timestamp with time zone); \
             has column record of type text, not jsonb; \
             has column owner NOT NULL without a default, which rows of this sink cannot fill";
        assert!(err.contains(want), "{cmd}: {err}");
        assert!(err.contains("jobs/trending.toml:"), "{cmd}: {err}");
        assert!(err.contains("trending.sink.url"), "{cmd}: {err}");
    }
    assert!(upstream.stats().requests.is_empty());
    // The table is as it was.
    assert_eq!(
        pg.count(
            ROLE,
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'trending'"
        ),
        4
    );
}

/// TLS where the URL asks for it, checked as asked: a certificate for
/// `db.example` signed by a private CA. `verify-ca` with that CA as
/// `sslrootcert` logs in over TLS (the server logs "SSL enabled"); the
/// host name 127.0.0.1 is not the certificate's, so `verify-full` refuses,
/// as does `require` without `sslrootcert` (the Mozilla roots do not know
/// the CA): exit 78 at `check`, naming the certificate. Without `sslmode`
/// the connection is plain text.
#[test]
fn tls_is_used_and_checked_where_the_url_asks_for_it() {
    let tls = TlsFiles::new("DNS:db.example");
    let mut settings: Vec<(String, String)> = tls.settings();
    settings.push(("log_connections".into(), "on".into()));
    let settings: Vec<(&str, &str)> = (settings.iter())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let pg = Postgres::start_with(&settings);
    pg.role(ROLE, PASSWORD);
    let redis = RedisServer::start();
    let upstream = Upstream::start(PAGES, ITEMS);
    let ca = tls.ca.display().to_string();
    let check = |query: &str| {
        let url = format!("{}{query}", pg.url(ROLE, ROLE));
        let cfg = config(
            &upstream,
            &["US"],
            Sink::postgres(&url)
                .password_file("secrets/pg")
                .records("/items"),
        );
        let (code, out, err) = run_cli(
            &cfg,
            Some(&redis.url()),
            &["check"],
            Duration::from_secs(60),
        );
        (code, format!("{out}\n{err}"))
    };
    let ssl_logins = || pg.log().matches("SSL enabled").count();

    let (code, out) = check(&format!("?sslmode=verify-ca&sslrootcert={ca}"));
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(ssl_logins(), 1, "{}", pg.log());

    for (query, want) in [
        (
            format!("?sslmode=verify-full&sslrootcert={ca}"),
            "certificate",
        ),
        ("?sslmode=require".to_owned(), "certificate"),
    ] {
        let (code, out) = check(&query);
        assert_eq!(code, Some(78), "{query}: {out}");
        assert!(out.contains(want), "{query}: {out}");
        assert!(out.contains("trending.sink.url"), "{query}: {out}");
    }
    assert_eq!(ssl_logins(), 1, "a refused certificate logs nothing in");

    let (code, out) = check("");
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(ssl_logins(), 1, "no sslmode: plain text");
    assert!(
        pg.log().contains("connection authorized: user=ingest"),
        "{}",
        pg.log()
    );
}

/// Changing `search` re-makes the generated column over the new fields at
/// the next start (its comment says which fields it was built from), and
/// removing `search` drops it; the rows stay.
#[test]
fn changing_the_search_fields_remakes_the_search_column() {
    let pg = server();
    let redis = RedisServer::start();
    let upstream = Upstream::start(1, ITEMS);
    let search = |cfg: &TestConfig, words: &str| -> usize {
        let (code, out, err) = run_cli(
            cfg,
            None,
            &["search", JOB, words, "--json", "--limit", "100"],
            Duration::from_secs(30),
        );
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        v["results"].as_array().map_or(0, Vec::len)
    };
    // `check` passes on each config before the daemon starts on it.
    let url = redis.url();
    let checked = |cfg: TestConfig| {
        let (code, out, err) = run_cli(&cfg, Some(&url), &["check"], Duration::from_secs(60));
        assert_eq!(code, Some(0), "{out}\n{err}");
        cfg
    };
    // Titles: "Simulated US item 1 (US-p1-i1)"; descriptions: "Deterministic item …".
    let cfg = checked(config(
        &upstream,
        &["US"],
        sink(&pg).key("/id").search(&["/snippet/title"]),
    ));
    let mut rig = Rig::start(redis, cfg, &[]);
    let (code, out) = trigger(&rig);
    assert_eq!(code, Some(0), "{out}");
    let stop = |d: &mut Proc| {
        d.term();
        let _ = d.wait_exit(Duration::from_secs(20));
    };
    stop(&mut rig.daemon);
    assert_eq!(search(&rig.cfg, "simulated"), ITEMS as usize);
    assert_eq!(search(&rig.cfg, "deterministic"), 0);

    rig.restart_with(checked(config(
        &upstream,
        &["US"],
        sink(&pg).key("/id").search(&["/snippet/description"]),
    )));
    let d = &mut rig.daemon;
    assert_eq!(
        d.messages("postgres sink: dropped the old search column")
            .len(),
        1,
        "{}",
        d.log()
    );
    stop(d);
    assert_eq!(search(&rig.cfg, "deterministic"), ITEMS as usize);
    assert_eq!(search(&rig.cfg, "simulated"), 0);

    rig.restart_with(checked(config(&upstream, &["US"], sink(&pg).key("/id"))));
    stop(&mut rig.daemon);
    assert_eq!(
        pg.count(ROLE, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'trending' AND column_name = 'search'"),
        0
    );
    assert_eq!(rows(&pg, JOB), i64::from(ITEMS));
}
