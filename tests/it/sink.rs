//! Promise: a fetched page lands in its sink whole — JSON lines never torn or
//! interleaved, whatever the number of writing tasks and processes; SQLite
//! upserts by key and its full-text index finds what the search fields hold,
//! and only that.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use quota_worker::config::Item;
use quota_worker::config::{Config, Job};
use quota_worker::sink::{self, PageRef, SinkError, Sinks};
use serde_json::{Value, json};

use crate::support::canned::CannedRig;
use crate::support::hostile::Hostile;
use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, Request, Sink, TestConfig, Window,
};

/// Which page a direct write is: these tests are about the file or table,
/// not the run.
const PAGE: PageRef = PageRef { tick: 0, page: 1 };

/// A job of endpoint `ep` every half hour, fetching `url` into `sink`.
fn sink_job(name: &str, url: &str, sink: Sink) -> support::Job {
    support::Job::new(name, "ep")
        .schedule("0 */30 * * * *")
        .request(Request::get(url))
        .sink(sink)
}

/// Five jobs on one endpoint; `video.search-db` indexes `search`.
fn jobs(search: &[&str]) -> ConfigBuilder {
    ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(Window::sliding(1000, "1h")))
        .endpoint(Endpoint::new("ep", "k", 1))
        .job(
            sink_job(
                "feed",
                "https://example.test/feed?region={region}",
                Sink::jsonl("data/{job}/{region}/{date}.jsonl").records("/items"),
            )
            .fan_out("region", ["US", "GB"]),
        )
        .job(sink_job(
            "whole",
            "https://example.test/whole",
            Sink::jsonl("data/whole.jsonl"),
        ))
        .job(sink_job(
            "contended",
            "https://example.test/c",
            Sink::jsonl("data/contended.jsonl").records("/items"),
        ))
        .job(
            sink_job(
                "video.search-db",
                "https://example.test/v?region={region}",
                Sink::sqlite("db/{job}.db")
                    .records("/items")
                    .key("/id")
                    .search(search),
            )
            .fan_out("region", ["US"]),
        )
        .job(sink_job(
            "contended-db",
            "https://example.test/d",
            Sink::sqlite("db/contended.db")
                .records("/items")
                .search(&["/text"]),
        ))
}

fn setup() -> (TestConfig, Config) {
    let cfg = jobs(&["/snippet/title", "/snippet/tags"]).write();
    let config = Config::load(&cfg.path()).expect("config loads");
    (cfg, config)
}

fn job<'a>(config: &'a Config, name: &str) -> &'a Job {
    config.jobs.get(name).expect("job defined")
}

fn item(pairs: &[(&str, &str)]) -> Item {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn at(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 1, h, m, 0)
        .single()
        .expect("valid time")
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read jsonl");
    assert!(text.ends_with('\n'), "file ends mid-line");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

#[tokio::test]
async fn jsonl_lines_are_whole_objects_with_job_item_time_and_record() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let feed = job(&config, "feed");
    let us = item(&[("region", "US")]);
    let body =
        json!({"items": [{"id": 1, "t": "a\nb"}, {"id": 2}, {"id": 3}], "nextPageToken": "p2"});

    let n = sinks
        .write(feed, &us, PAGE, &body, at(12, 0))
        .await
        .expect("write")
        .stored;
    assert_eq!(n, 3);
    let path = cfg.join("data/feed/US/2024-05-01.jsonl");
    assert_eq!(sinks.path(feed, &us, at(12, 0).date_naive()), path);
    assert_eq!(
        sink::render_path(feed, &us, at(12, 0).date_naive()),
        PathBuf::from("data/feed/US/2024-05-01.jsonl")
    );

    let got = lines(&path);
    assert_eq!(got.len(), 3);
    assert_eq!(
        got[0],
        json!({"job": "feed", "item": {"region": "US"}, "fetched_at": "2024-05-01T12:00:00.000Z",
               "record": {"id": 1, "t": "a\nb"}})
    );
    assert_eq!(got[2]["record"], json!({"id": 3}));
    let first = std::fs::read_to_string(&path).expect("read");
    assert!(first.starts_with(r#"{"job":"feed","item":{"region":"US"},"fetched_at""#));

    // A second page appends; an empty page writes nothing.
    let n = sinks
        .write(feed, &us, PAGE, &json!({"items": [{"id": 4}]}), at(12, 1))
        .await
        .expect("write")
        .stored;
    assert_eq!(n, 1);
    let n = sinks
        .write(feed, &us, PAGE, &json!({"items": []}), at(12, 2))
        .await
        .expect("empty page")
        .stored;
    assert_eq!(n, 0);
    assert_eq!(lines(&path).len(), 4);

    // Another day, another file; an empty page creates none.
    let gb = item(&[("region", "GB")]);
    let next_day = at(23, 59) + chrono::Duration::minutes(2);
    sinks
        .write(feed, &gb, PAGE, &json!({"items": []}), next_day)
        .await
        .expect("empty page");
    assert!(!cfg.join("data/feed/GB").exists());
    sinks
        .write(feed, &gb, PAGE, &json!({"items": [{"id": 5}]}), next_day)
        .await
        .expect("write");
    assert_eq!(lines(&cfg.join("data/feed/GB/2024-05-02.jsonl")).len(), 1);
}

#[tokio::test]
async fn empty_records_pointer_takes_the_whole_body() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let whole = job(&config, "whole");
    let none = item(&[]);
    let path = cfg.join("data/whole.jsonl");

    let n = sinks
        .write(whole, &none, PAGE, &json!({"id": "only"}), at(1, 0))
        .await
        .expect("object")
        .stored;
    assert_eq!(n, 1);
    let n = sinks
        .write(whole, &none, PAGE, &json!([{"id": 1}, "two", 3]), at(1, 0))
        .await
        .expect("array")
        .stored;
    assert_eq!(n, 3);
    let got = lines(&path);
    let records: Vec<_> = got.iter().map(|l| l["record"].clone()).collect();
    assert_eq!(
        records,
        [
            json!({"id": "only"}),
            json!({"id": 1}),
            json!("two"),
            json!(3)
        ]
    );
    assert_eq!(got[0]["item"], json!({}));

    let err = sinks
        .write(whole, &none, PAGE, &json!("just a string"), at(1, 0))
        .await
        .expect_err("a string is no record list");
    assert!(err.is_bad_response(), "{err}");
}

#[tokio::test]
async fn a_records_pointer_that_finds_no_array_is_a_bad_response() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let us = item(&[("region", "US")]);
    for name in ["feed", "video.search-db"] {
        for body in [
            json!({"error": "nope"}),
            json!({"items": {"id": 1}}),
            json!({"items": null}),
            json!([1, 2]),
        ] {
            let err = sinks
                .write(job(&config, name), &us, PAGE, &body, at(12, 0))
                .await
                .expect_err("no array at /items");
            assert!(err.is_bad_response(), "{name}: {err}");
            assert!(matches!(err, SinkError::BadRecords { .. }), "{err:?}");
            assert!(err.to_string().contains("\"/items\""), "{err}");
        }
    }
    assert!(!cfg.join("data").exists(), "nothing written");
    assert!(!cfg.join("db").exists(), "nothing created");
}

#[tokio::test]
async fn fan_out_values_cannot_escape_the_sink_directory() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let feed = job(&config, "feed");
    let body = json!({"items": [{"id": 1}]});
    for (value, dir) in [
        ("..", "%2E%2E"),
        (".", "%2E"),
        ("../../../x", "..%2F..%2F..%2Fx"),
        ("/etc", "%2Fetc"),
        ("a\\b", "a%5Cb"),
    ] {
        let it = item(&[("region", value)]);
        let path = sinks.path(feed, &it, at(0, 0).date_naive());
        assert_eq!(path, cfg.join(format!("data/feed/{dir}/2024-05-01.jsonl")));
        sinks
            .write(feed, &it, PAGE, &body, at(0, 0))
            .await
            .expect("write");
        assert_eq!(lines(&path).len(), 1, "{value:?}");
    }
    let mut top: Vec<_> = std::fs::read_dir(cfg.dir.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, ["config.toml", "data", "jobs"]);
}

// ---- many writers, one file ----------------------------------------------

const PAGES: usize = 20;
const PER_PAGE: usize = 50;
/// About 100 KB a page: far over a pipe buffer or a page of memory, so a
/// torn or split append would show.
const PAD: usize = 2_000;

fn page(writer: &str, page: usize) -> Value {
    let items: Vec<Value> = (0..PER_PAGE)
        .map(|i| {
            json!({"w": writer, "p": page, "i": i, "text": format!("w{writer} p{page} i{i}"),
                   "pad": "x".repeat(PAD)})
        })
        .collect();
    json!({ "items": items })
}

/// Every record of every writer exactly once, and each page's lines
/// contiguous and in order.
fn check_contended_file(path: &Path, writers: &[String]) {
    let got = lines(path);
    assert_eq!(got.len(), writers.len() * PAGES * PER_PAGE);
    let mut seen = HashSet::new();
    let mut prev: Option<(String, u64, u64)> = None;
    for (n, line) in got.iter().enumerate() {
        let r = &line["record"];
        let key = (
            r["w"].as_str().expect("w").to_owned(),
            r["p"].as_u64().expect("p"),
            r["i"].as_u64().expect("i"),
        );
        assert_eq!(r["pad"].as_str().map(str::len), Some(PAD), "line {n}");
        if key.2 > 0 {
            let want = (key.0.clone(), key.1, key.2 - 1);
            assert_eq!(prev.as_ref(), Some(&want), "line {n}: page interleaved");
        }
        assert!(seen.insert(key.clone()), "line {n}: duplicate {key:?}");
        prev = Some(key);
    }
    for w in writers {
        for p in 0..PAGES as u64 {
            for i in 0..PER_PAGE as u64 {
                assert!(seen.contains(&(w.clone(), p, i)), "missing {w} {p} {i}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_tasks_append_whole_pages() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let contended = job(&config, "contended").clone();
    let writers: Vec<String> = (0..16).map(|w| format!("t{w}")).collect();
    let mut tasks = Vec::new();
    for w in writers.clone() {
        let (sinks, job) = (sinks.clone(), contended.clone());
        tasks.push(tokio::spawn(async move {
            for p in 0..PAGES {
                let n = sinks
                    .write(&job, &Vec::new(), PAGE, &page(&w, p), Utc::now())
                    .await
                    .expect("write")
                    .stored;
                assert_eq!(n, PER_PAGE);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    check_contended_file(&cfg.join("data/contended.jsonl"), &writers);
}

/// Environment of a child writer process (see [`child_writer`]).
const CHILD_ENV: &str = "QW_SINK_TEST_CHILD";

/// Runs only as a child of the multi-process tests: writes `PAGES` pages
/// as writer `id` to job `job`, once the file `go` exists.
#[test]
#[ignore = "a child process of the multi-process sink tests"]
fn child_writer() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let [config, job_name, id, go]: [&str; 4] = spec
        .split('|')
        .collect::<Vec<_>>()
        .try_into()
        .expect("config|job|id|go");
    let config = Config::load(Path::new(config)).expect("config");
    let job = job(&config, job_name);
    let sinks = Sinks::new(config.dir.clone());
    assert!(
        support::wait_until(Duration::from_secs(30), || Path::new(go).exists()),
        "no go signal"
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        for p in 0..PAGES {
            let n = sinks
                .write(job, &Vec::new(), PAGE, &page(id, p), Utc::now())
                .await
                .expect("write")
                .stored;
            assert_eq!(n, PER_PAGE);
        }
    });
}

/// Starts `n` child writers on `job`, lets them go at once, and waits.
fn run_children(cfg: &TestConfig, job: &str, ids: &[String]) -> std::thread::JoinHandle<()> {
    let go = cfg.join(format!("go-{job}"));
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = ids
        .iter()
        .map(|id| {
            let spec = format!("{}|{job}|{id}|{}", cfg.path().display(), go.display());
            Command::new(&exe)
                .args(["sink::child_writer", "--exact", "--ignored", "--nocapture"])
                .env(CHILD_ENV, spec)
                .env("RUST_LOG", "warn")
                // The harness's chatter; a failing child's panic goes to stderr.
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn child writer")
        })
        .collect();
    std::fs::write(&go, "").expect("go");
    std::thread::spawn(move || {
        for mut c in children {
            let status = c.wait().expect("wait child");
            assert!(status.success(), "child writer failed: {status}");
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_processes_append_whole_pages() {
    let (cfg, config) = setup();
    let procs: Vec<String> = (0..4).map(|w| format!("proc{w}")).collect();
    let children = run_children(&cfg, "contended", &procs);
    // This process writes alongside them, from several tasks.
    let sinks = Sinks::new(config.dir.clone());
    let contended = job(&config, "contended").clone();
    let tasks: Vec<String> = (0..4).map(|w| format!("task{w}")).collect();
    let mut handles = Vec::new();
    for w in tasks.clone() {
        let (sinks, job) = (sinks.clone(), contended.clone());
        handles.push(tokio::spawn(async move {
            for p in 0..PAGES {
                sinks
                    .write(&job, &Vec::new(), PAGE, &page(&w, p), Utc::now())
                    .await
                    .expect("write");
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    tokio::task::spawn_blocking(move || children.join())
        .await
        .expect("join")
        .expect("children succeeded");
    let all: Vec<String> = procs.into_iter().chain(tasks).collect();
    check_contended_file(&cfg.join("data/contended.jsonl"), &all);
}

#[tokio::test]
async fn a_torn_last_line_never_swallows_the_next_page() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let path = cfg.join("data/contended.jsonl");
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    // What a writer killed mid-write leaves behind.
    std::fs::write(&path, "{\"job\":\"contended\",\"rec").expect("torn");
    sinks
        .write(
            job(&config, "contended"),
            &Vec::new(),
            PAGE,
            &json!({"items": [{"id": 1}, {"id": 2}]}),
            at(3, 0),
        )
        .await
        .expect("write");
    let text = std::fs::read_to_string(&path).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(serde_json::from_str::<Value>(lines[0]).is_err());
    for l in &lines[1..] {
        let v: Value = serde_json::from_str(l).expect("whole line");
        assert_eq!(v["job"], "contended");
    }
}

// ---- SQLite ---------------------------------------------------------------

fn video(id: &str, title: &str, tags: &[&str], description: &str) -> Value {
    json!({"id": id, "snippet": {"title": title, "tags": tags, "description": description}})
}

fn ids(records: &[Value]) -> Vec<&str> {
    records.iter().filter_map(|r| r["id"].as_str()).collect()
}

fn count(db: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(db).expect("open db");
    conn.query_row(sql, [], |r| r.get(0)).expect("count")
}

#[tokio::test]
async fn sqlite_stores_upserts_by_key_and_searches_the_search_fields_only() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let videos = job(&config, "video.search-db");
    let us = item(&[("region", "US")]);
    let db = cfg.join("db/video.search-db.db");
    assert_eq!(sinks.path(videos, &us, at(0, 0).date_naive()), db);

    let page1 = json!({"items": [
        video("a", "Funny cats compilation", &["pets"], "walrus"),
        video("b", "Cooking pasta", &["food", "italian"], "nothing"),
        video("c", "Cats and dogs", &[], "x"),
    ]});
    let n = sinks
        .write(videos, &us, PAGE, &page1, at(10, 0))
        .await
        .expect("write")
        .stored;
    assert_eq!(n, 3);

    // The table is named after the job (quoted: it holds '.' and '-').
    assert_eq!(count(&db, r#"SELECT count(*) FROM "video.search-db""#), 3);
    let conn = rusqlite::Connection::open(&db).expect("open");
    let (job_col, item_col, fetched, record): (String, String, String, String) = conn
        .query_row(
            r#"SELECT job, item, fetched_at, record FROM "video.search-db" WHERE record_key = 'b'"#,
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .expect("row b");
    assert_eq!(job_col, "video.search-db");
    assert_eq!(item_col, r#"{"region":"US"}"#);
    assert_eq!(fetched, "2024-05-01T10:00:00.000Z");
    assert_eq!(
        serde_json::from_str::<Value>(&record).expect("json"),
        video("b", "Cooking pasta", &["food", "italian"], "nothing")
    );
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("mode");
    assert_eq!(mode, "wal");
    drop(conn);

    let search = |q: &str| sink::search(&db, "video.search-db", q, 10).expect("search");
    let mut cats = ids(&search("CATS"))
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    cats.sort();
    assert_eq!(cats, ["a", "c"]);
    assert_eq!(ids(&search("italian")), ["b"], "tags are indexed");
    assert_eq!(ids(&search("cat*")).len(), 2, "prefix");
    assert_eq!(ids(&search("funny cats")), ["a"], "all words must match");
    assert!(
        search("walrus").is_empty(),
        "description is not a search field"
    );
    assert!(search("US").is_empty(), "nor is the item");
    assert!(search("   ").is_empty());
    assert!(
        search(r#"x-y "unbalanced NOT ("#).is_empty(),
        "any input is a query"
    );
    assert_eq!(
        sink::search(&db, "video.search-db", "cats", 1)
            .expect("search")
            .len(),
        1,
        "limit"
    );

    // Re-fetched "a" replaces the stored copy, in the table and the index.
    let page2 = json!({"items": [video("a", "Sleepy dogs", &[], "walrus"), video("d", "New one", &[], "")]});
    let n = sinks
        .write(videos, &us, PAGE, &page2, at(11, 0))
        .await
        .expect("upsert")
        .stored;
    assert_eq!(n, 2);
    assert_eq!(count(&db, r#"SELECT count(*) FROM "video.search-db""#), 4);
    assert_eq!(ids(&search("cats")), ["c"]);
    let mut dogs = ids(&search("dogs"))
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    dogs.sort();
    assert_eq!(dogs, ["a", "c"]);
    assert_eq!(
        search("sleepy")[0],
        video("a", "Sleepy dogs", &[], "walrus")
    );

    // A late write of an older fetch does not overwrite the newer copy.
    let stale = json!({"items": [video("a", "Stale cats", &[], "")]});
    let w = sinks
        .write(videos, &us, PAGE, &stale, at(10, 30))
        .await
        .expect("stale");
    // The page held a record (a page-number run goes on), none was stored.
    assert_eq!((w.on_page, w.stored), (1, 0));
    assert!(search("stale").is_empty());
    assert_eq!(ids(&search("sleepy")), ["a"]);

    // Records without a key value are kept, each its own row.
    let keyless = json!({"items": [{"snippet": {"title": "no id"}}, {"id": null, "snippet": {"title": "no id"}}]});
    let n = sinks
        .write(videos, &us, PAGE, &keyless, at(12, 0))
        .await
        .expect("keyless")
        .stored;
    assert_eq!(n, 2);
    assert_eq!(count(&db, r#"SELECT count(*) FROM "video.search-db""#), 6);
    assert_eq!(search("id").len(), 2);

    // The index matches the table exactly (integrity-check of the external content).
    let conn = rusqlite::Connection::open(&db).expect("open");
    conn.execute(
        r#"INSERT INTO "video.search-db:fts"("video.search-db:fts", rank) VALUES ('integrity-check', 1)"#,
        [],
    )
    .expect("fts index in sync with the table");
}

#[tokio::test]
async fn search_ranks_better_matches_first() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let videos = job(&config, "video.search-db");
    let us = item(&[("region", "US")]);
    let page = json!({"items": [
        video("once", "guitar lesson for beginners with many other words in the title", &[], ""),
        video("thrice", "guitar guitar guitar", &[], ""),
    ]});
    sinks
        .write(videos, &us, PAGE, &page, at(9, 0))
        .await
        .expect("write");
    let db = cfg.join("db/video.search-db.db");
    let got = sink::search(&db, "video.search-db", "guitar", 10).expect("search");
    assert_eq!(ids(&got), ["thrice", "once"]);
}

#[tokio::test]
async fn search_without_an_index_says_so() {
    let (cfg, config) = setup();
    let db = cfg.join("db/video.search-db.db");
    let err = sink::search(&db, "video.search-db", "x", 10).expect_err("no db yet");
    assert!(matches!(err, SinkError::NoIndex { .. }), "{err:?}");
    assert!(!db.exists(), "search creates nothing");

    let sinks = Sinks::new(config.dir.clone());
    sinks
        .write(
            job(&config, "video.search-db"),
            &item(&[("region", "US")]),
            PAGE,
            &json!({"items": []}),
            at(0, 0),
        )
        .await
        .expect("empty page");
    assert_eq!(
        sink::search(&db, "video.search-db", "x", 10).expect("empty index"),
        Vec::<Value>::new()
    );
    let err = sink::search(&db, "other", "x", 10).expect_err("unknown job");
    assert!(matches!(err, SinkError::NoIndex { .. }), "{err:?}");
    assert!(!err.is_bad_response());
}

#[tokio::test]
async fn changing_the_search_fields_reindexes_stored_records() {
    let (mut cfg, config) = setup();
    let us = item(&[("region", "US")]);
    let page = json!({"items": [video("a", "cats", &[], "walrus")]});
    Sinks::new(config.dir.clone())
        .write(job(&config, "video.search-db"), &us, PAGE, &page, at(1, 0))
        .await
        .expect("write");
    let db = cfg.join("db/video.search-db.db");
    assert!(
        sink::search(&db, "video.search-db", "walrus", 10)
            .expect("search")
            .is_empty()
    );

    // The operator indexes the description too; the daemon restarts.
    cfg.rewrite(&jobs(&["/snippet/title", "/snippet/description"]));
    let config = Config::load(&cfg.path()).expect("config");
    Sinks::new(config.dir.clone())
        .write(
            job(&config, "video.search-db"),
            &us,
            PAGE,
            &json!({"items": []}),
            at(2, 0),
        )
        .await
        .expect("write");
    assert_eq!(
        ids(&sink::search(&db, "video.search-db", "walrus", 10).expect("search")),
        ["a"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_takes_writers_from_several_processes() {
    let (cfg, config) = setup();
    let procs: Vec<String> = (0..3).map(|w| format!("proc{w}")).collect();
    let children = run_children(&cfg, "contended-db", &procs);
    let sinks = Sinks::new(config.dir.clone());
    let contended = job(&config, "contended-db").clone();
    let mut handles = Vec::new();
    for w in 0..4 {
        let (sinks, job) = (sinks.clone(), contended.clone());
        handles.push(tokio::spawn(async move {
            for p in 0..PAGES {
                let n = sinks
                    .write(
                        &job,
                        &Vec::new(),
                        PAGE,
                        &page(&format!("task{w}"), p),
                        Utc::now(),
                    )
                    .await
                    .expect("write")
                    .stored;
                assert_eq!(n, PER_PAGE);
            }
        }));
    }
    for h in handles {
        h.await.expect("task");
    }
    tokio::task::spawn_blocking(move || children.join())
        .await
        .expect("join")
        .expect("children succeeded");
    let db = cfg.join("db/contended.db");
    let total = (procs.len() + 4) * PAGES * PER_PAGE;
    assert_eq!(
        count(&db, r#"SELECT count(*) FROM "contended-db""#),
        total as i64
    );
    let found = sink::search(&db, "contended-db", "wproc2 p7", 1000).expect("search");
    assert_eq!(found.len(), PER_PAGE);
    assert!(found.iter().all(|r| r["w"] == "proc2" && r["p"] == 7));
}

/// Issue 22, Low 4: the JSON lines sink followed symbolic links:
/// `data/echo/one.jsonl -> victim.txt` appended records to `victim.txt`.
/// The final component is opened with `O_NOFOLLOW`: the page is refused
/// (the item's task fails, naming the link), the target untouched, nothing
/// spooled for it.
#[test]
fn issue_22_low_4_the_jsonl_sink_never_follows_a_symlink() {
    let upstream = Hostile::start();
    upstream.answer("one", 200, &[], r#"{"items":[{"id":"x"}]}"#);
    let rig = CannedRig::start(&upstream, "k3y-low-4", CannedRig::endpoint(), &["one"]);
    let victim = rig.cfg.join("victim.txt");
    std::fs::write(&victim, "precious\n").expect("victim");
    let link = rig.cfg.join("data/leak/one.jsonl");
    std::fs::create_dir_all(link.parent().expect("dir")).expect("mkdir");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    let (outcomes, _) = rig.tick(1);
    let o = &outcomes[0];
    assert_eq!(o["outcome"], "failed", "{o}");
    assert!(
        CannedRig::message(o).contains("it is a symbolic link, which a sink never follows"),
        "{o}"
    );
    assert_eq!(
        std::fs::read_to_string(&victim).expect("victim"),
        "precious\n"
    );
    let spooled = std::fs::read_dir(rig.cfg.join("state/spool/leak"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(spooled, 0, "nothing spooled for a link");
}

/// Issue 22, Low 4, the SQLite sink: a symbolic link where its database
/// goes was followed, SQLite writing its tables into the link's target. The
/// database is opened with `SQLITE_OPEN_NOFOLLOW`: the page is refused as
/// the jsonl sink's (the task fails, naming the link), the target untouched.
#[tokio::test]
async fn issue_22_low_4_the_sqlite_sink_never_follows_a_symlink() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let db_job = job(&config, "contended-db");
    let victim = cfg.join("victim.db");
    std::fs::write(&victim, "").expect("victim");
    let db = cfg.join("db/contended.db");
    std::fs::create_dir_all(db.parent().expect("dir")).expect("mkdir");
    std::os::unix::fs::symlink(&victim, &db).expect("symlink");
    let page = json!({"items": [{"text": "hello"}]});
    let e = sinks
        .write(db_job, &item(&[]), PAGE, &page, at(10, 0))
        .await
        .expect_err("a link is refused");
    assert!(matches!(e, SinkError::Symlink { .. }), "{e:?}");
    assert!(e.fails_the_task(), "{e}");
    assert!(
        e.to_string()
            .contains("it is a symbolic link, which a sink never follows"),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&victim).expect("victim").len(), 0);
}
