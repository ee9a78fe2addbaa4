//! Promise (issue 12 item 6, docs/jobs.md "The SQLite layout"): a SQLite
//! `key` need only be unique within an item — GitHub's issue `number` is
//! unique per repository — so two items' records with the same key are two
//! rows, and a re-fetch replaces only its own item's row. A table of the
//! first layout (keys unique across the table) is rebuilt into this one
//! without losing a row. `quota-worker search JOB QUERY` (the real binary)
//! finds the records, as text or JSON, across every database file the
//! job's path makes.

use crate::support::{self, TestConfig};
use chrono::{DateTime, TimeZone, Utc};
use quota_worker::config::Item;
use quota_worker::config::{Config, Job};
use quota_worker::sink::{PageRef, Sinks};
use serde_json::{Value, json};

/// Which page a direct write is: these tests are about the file or table,
/// not the run.
const PAGE: PageRef = PageRef { tick: 0, page: 1 };

const CONFIG: &str = r#"
jobs = "jobs/*.toml"

[credentials.gh]
secret_env = "GH_TOKEN"
windows = [{ units = 5000, per = "1h" }]

[endpoints."github.issues"]
credential = "gh"
cost = 1
"#;

const JOBS: &str = r#"
[issues]
schedule = "0 */30 * * * *"
endpoint = "github.issues"
fan_out = { repo = ["rust-lang/rust", "tokio-rs/tokio"] }
request = { url = "https://api.github.com/repos/{+repo}/issues" }
sink = { kind = "sqlite", path = "data/{job}.sqlite", records = "", key = "/number", search = ["/title", "/body"] }

[per-region]
schedule = "0 */30 * * * *"
endpoint = "github.issues"
fan_out = { region = ["US", "GB"] }
request = { url = "https://example.test/{region}" }
sink = { kind = "sqlite", path = "data/{job}/{region}.sqlite", records = "/items", key = "/id", search = ["/title"] }

[dotted]
schedule = "0 */30 * * * *"
endpoint = "github.issues"
fan_out = { region = ["US"] }
request = { url = "https://example.test/{region}" }
sink = { kind = "sqlite", path = "sub/../data/{job}/{region}.sqlite", records = "/items", key = "/id", search = ["/title"] }

[lines]
schedule = "0 */30 * * * *"
endpoint = "github.issues"
request = { url = "https://example.test/lines" }
sink = { kind = "jsonl", path = "data/lines.jsonl" }
"#;

fn setup() -> (TestConfig, Config) {
    let cfg = TestConfig::new(CONFIG, &[("jobs.toml", JOBS)]);
    let config = Config::load(&cfg.path()).expect("config loads");
    (cfg, config)
}

fn job<'a>(config: &'a Config, name: &str) -> &'a Job {
    config.jobs.get(name).expect("job defined")
}

fn repo(name: &str) -> Item {
    vec![("repo".to_owned(), name.to_owned())]
}

fn at(h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2024, 5, 1, h, 0, 0)
        .single()
        .expect("valid time")
}

fn issue(number: u64, title: &str) -> Value {
    json!({"number": number, "title": title, "body": format!("body of {title}")})
}

fn rows(db: &std::path::Path, table: &str) -> Vec<(String, String, String)> {
    let conn = rusqlite::Connection::open(db).expect("open");
    let mut stmt = conn
        .prepare(&format!(
            r#"SELECT item, record_key, json_extract(record, '$.title') FROM "{table}" ORDER BY item, record_key"#
        ))
        .expect("prepare");
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

/// Regression (issue 12): issue #7 of one repository overwrote #7 of the
/// other, because `record_key` was unique across the table.
#[tokio::test]
async fn two_items_with_the_same_key_keep_both_records() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let issues = job(&config, "issues");
    let db = cfg.join("data/issues.sqlite");
    let rust = repo("rust-lang/rust");
    let tokio = repo("tokio-rs/tokio");
    let page = |t: &str| {
        json!([
            issue(7, &format!("{t} seven")),
            issue(8, &format!("{t} eight"))
        ])
    };
    assert_eq!(
        sinks
            .write(issues, &rust, PAGE, &page("rustc"), at(1))
            .await
            .expect("write")
            .stored,
        2
    );
    assert_eq!(
        sinks
            .write(issues, &tokio, PAGE, &page("runtime"), at(2))
            .await
            .expect("write")
            .stored,
        2
    );
    assert_eq!(
        rows(&db, "issues"),
        [
            (
                r#"{"repo":"rust-lang/rust"}"#.into(),
                "7".into(),
                "rustc seven".into()
            ),
            (
                r#"{"repo":"rust-lang/rust"}"#.into(),
                "8".into(),
                "rustc eight".into()
            ),
            (
                r#"{"repo":"tokio-rs/tokio"}"#.into(),
                "7".into(),
                "runtime seven".into()
            ),
            (
                r#"{"repo":"tokio-rs/tokio"}"#.into(),
                "8".into(),
                "runtime eight".into()
            ),
        ]
    );
    // A re-fetch replaces its own item's row only.
    let edited = json!([issue(7, "rustc seven, edited")]);
    assert_eq!(
        sinks
            .write(issues, &rust, PAGE, &edited, at(3))
            .await
            .expect("write")
            .stored,
        1
    );
    let now = rows(&db, "issues");
    assert_eq!(now.len(), 4);
    assert!(now.contains(&(
        r#"{"repo":"rust-lang/rust"}"#.into(),
        "7".into(),
        "rustc seven, edited".into()
    )));
    assert!(now.contains(&(
        r#"{"repo":"tokio-rs/tokio"}"#.into(),
        "7".into(),
        "runtime seven".into()
    )));
}

/// A database written before keys were per item (`record_key TEXT UNIQUE`)
/// is rebuilt at the first write: every row kept with its id, the index
/// rebuilt, and from then on keys are per item.
#[tokio::test]
async fn a_table_of_the_first_layout_is_migrated_without_losing_a_row() {
    let (cfg, config) = setup();
    let db = cfg.join("data/issues.sqlite");
    std::fs::create_dir_all(db.parent().expect("dir")).expect("mkdir");
    {
        let conn = rusqlite::Connection::open(&db).expect("create");
        conn.execute_batch(
            r#"PRAGMA journal_mode = WAL;
            CREATE TABLE "quota-worker:meta" (job TEXT PRIMARY KEY, search TEXT NOT NULL);
            INSERT INTO "quota-worker:meta" VALUES ('issues', '["/title","/body"]');
            CREATE TABLE "issues" (id INTEGER PRIMARY KEY, record_key TEXT UNIQUE, job TEXT NOT NULL,
              item TEXT NOT NULL, fetched_at TEXT NOT NULL, record TEXT NOT NULL, search_text TEXT NOT NULL DEFAULT '');
            CREATE VIRTUAL TABLE "issues:fts" USING fts5(search_text, content='issues', content_rowid='id',
              tokenize='unicode61 remove_diacritics 2');
            CREATE TRIGGER "issues:ai" AFTER INSERT ON "issues" BEGIN
              INSERT INTO "issues:fts"(rowid, search_text) VALUES (new.id, new.search_text); END;
            CREATE TRIGGER "issues:ad" AFTER DELETE ON "issues" BEGIN
              INSERT INTO "issues:fts"("issues:fts", rowid, search_text) VALUES ('delete', old.id, old.search_text); END;
            CREATE TRIGGER "issues:au" AFTER UPDATE ON "issues" BEGIN
              INSERT INTO "issues:fts"("issues:fts", rowid, search_text) VALUES ('delete', old.id, old.search_text);
              INSERT INTO "issues:fts"(rowid, search_text) VALUES (new.id, new.search_text); END;
            INSERT INTO "issues" VALUES (5, '7', 'issues', '{"repo":"rust-lang/rust"}', '2024-05-01T00:00:00.000Z',
              '{"number":7,"title":"old seven"}', 'old seven');
            INSERT INTO "issues" VALUES (9, NULL, 'issues', '{"repo":"rust-lang/rust"}', '2024-05-01T00:00:00.000Z',
              '{"title":"keyless"}', 'keyless');"#,
        )
        .expect("first layout");
    }
    let sinks = Sinks::new(config.dir.clone());
    let issues = job(&config, "issues");
    let tokio = repo("tokio-rs/tokio");
    sinks
        .write(
            issues,
            &tokio,
            PAGE,
            &json!([issue(7, "tokio seven")]),
            at(1),
        )
        .await
        .expect("write after migration");
    let conn = rusqlite::Connection::open(&db).expect("open");
    let ids: Vec<(i64, Option<String>)> = conn
        .prepare(r#"SELECT id, record_key FROM "issues" ORDER BY id"#)
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()
        })
        .expect("rows");
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(
        &ids[..2],
        &[(5, Some("7".to_owned())), (9, None)],
        "old rows keep their ids"
    );
    let sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'issues'",
            [],
            |r| r.get(0),
        )
        .expect("schema");
    assert!(sql.contains("UNIQUE (item, record_key)"), "{sql}");
    // The index was rebuilt and is in step with the table.
    conn.execute(
        r#"INSERT INTO "issues:fts"("issues:fts", rank) VALUES ('integrity-check', 1)"#,
        [],
    )
    .expect("index in step");
    let found = quota_worker::sink::search(&db, "issues", "old", 10).expect("search");
    assert_eq!(found, [json!({"number": 7, "title": "old seven"})]);
    let triggers: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'issues'",
            [],
            |r| r.get(0),
        )
        .expect("triggers");
    assert_eq!(triggers, 3);
}

fn search_cli(cfg: &TestConfig, args: &[&str]) -> std::process::Output {
    let mut all = vec!["search"];
    all.extend_from_slice(args);
    cfg.run(&all, &[])
}

/// `quota-worker search` reads every database the job's path makes, best
/// match first, as text or JSON; it needs no Redis and no secret.
#[tokio::test]
async fn the_search_command_finds_records_in_every_database_of_the_job() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let regions = job(&config, "per-region");
    let us = vec![("region".to_owned(), "US".to_owned())];
    let gb = vec![("region".to_owned(), "GB".to_owned())];
    let video = |id: &str, title: &str| json!({"id": id, "title": title});
    sinks
        .write(
            regions,
            &us,
            PAGE,
            &json!({"items": [video("u1", "Guitar lesson"), video("u2", "Cooking")]}),
            at(1),
        )
        .await
        .expect("write US");
    sinks
        .write(
            regions,
            &gb,
            PAGE,
            &json!({"items": [video("g1", "guitar guitar guitar"), video("g2", "Tea")]}),
            at(2),
        )
        .await
        .expect("write GB");

    let o = search_cli(&cfg, &["per-region", "guitar", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
    let v = support::json(&o);
    assert_eq!(v["job"], "per-region");
    assert_eq!(v["databases"].as_array().map(Vec::len), Some(2));
    let results = v["results"].as_array().expect("results");
    let keys: Vec<&str> = results
        .iter()
        .map(|r| r["key"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(keys, ["g1", "u1"], "both databases, the better match first");
    assert_eq!(results[0]["item"], json!({"region": "GB"}));
    assert_eq!(results[0]["record"], video("g1", "guitar guitar guitar"));
    assert_eq!(results[1]["fetched_at"], "2024-05-01T01:00:00.000Z");
    assert!(
        results[1]["snippet"]
            .as_str()
            .is_some_and(|s| s.contains("[Guitar]")),
        "{results:?}"
    );

    let o = search_cli(&cfg, &["per-region", "guitar", "--limit", "1"]);
    assert_eq!(o.status.code(), Some(0));
    let text = support::stdout(&o);
    assert!(
        text.starts_with("1 result(s) for \"guitar\" in job per-region\n"),
        "{text}"
    );
    assert!(text.contains("region=GB  key g1"), "{text}");
    assert!(!text.contains("u1"), "{text}");

    let o = search_cli(&cfg, &["per-region", "walrus", "--json"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(support::json(&o)["results"], json!([]));

    // Nothing stored yet: no results, said on stderr.
    let o = search_cli(&cfg, &["issues", "anything"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        support::stderr(&o).contains("has stored nothing yet"),
        "{}",
        support::stderr(&o)
    );

    let o = search_cli(&cfg, &["nope", "x"]);
    assert_eq!(o.status.code(), Some(64));
    assert!(
        support::stderr(&o)
            .contains("unknown job \"nope\"; known jobs: issues, per-region, dotted, lines"),
        "{}",
        support::stderr(&o)
    );
    let o = search_cli(&cfg, &["lines", "x"]);
    assert_eq!(o.status.code(), Some(64));
    assert!(
        support::stderr(&o).contains("writes JSON lines"),
        "{}",
        support::stderr(&o)
    );
}

/// Issue 24, item 9: `search --json` printed the path as the template
/// joined it (`…/config/../data/github.db`), not the file's.
#[tokio::test]
async fn search_json_names_each_database_by_its_real_path() {
    let (cfg, config) = setup();
    let sinks = Sinks::new(config.dir.clone());
    let us = vec![("region".to_owned(), "US".to_owned())];
    let page = json!({"items": [{"id": "u1", "title": "Guitar lesson"}]});
    (sinks
        .write(job(&config, "dotted"), &us, PAGE, &page, at(1))
        .await)
        .expect("write");
    let o = search_cli(&cfg, &["dotted", "guitar", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
    let v = support::json(&o);
    let db = v["databases"][0].as_str().expect("a database");
    let want = std::fs::canonicalize(config.dir.join("data/dotted/US.sqlite")).expect("the file");
    assert_eq!(std::path::Path::new(db), want, "{v}");
    assert!(!db.contains(".."), "{db}");
    assert_eq!(v["results"][0]["database"], db);
}
