//! Promise: a job's items can come from a PostgreSQL query (`fan_out_from =
//! { postgres = URL, query = "SELECT …" }`), read at every tick in a
//! read-only transaction: one job's postgres sink feeds another job's
//! fan-out (parent → child). A query that writes is a config error at load
//! (exit 78, at the field `query`) when it can be seen to write (its first
//! keyword, its plan), and is refused by the server at the tick when it
//! cannot (a function that writes): the tick fans out nothing, nothing is
//! written.

use std::collections::BTreeSet;
use std::time::Duration;

use toml::Value;

use crate::support::postgres::Postgres;
use crate::support::process::run_cli;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world;
use crate::support::{Job, RedisServer, Sink, TestConfig};

const ROLE: &str = "ingest";
const PASSWORD: &str = "pg-Pw-fan-0ut";

/// `fan_out_from = { postgres = url, password_file, query, columns }`.
fn from_postgres(pg: &Postgres, query: &str) -> Value {
    let mut t = toml::map::Map::new();
    t.insert("postgres".into(), Value::String(pg.url(ROLE, ROLE)));
    t.insert("password_file".into(), Value::String("secrets/pg".into()));
    t.insert("query".into(), Value::String(query.into()));
    // The parent's table exists only once it ran.
    t.insert(
        "columns".into(),
        Value::Array(vec![Value::String("region".into())]),
    );
    Value::Table(t)
}

/// `repos` (the parent): the simulator's US videos, one page of 3, into
/// the table `repos`; `issues` (the child): one task per id the query
/// reads from it, each asking the simulator for that id's videos.
fn config(pg: &Postgres, upstream: &Upstream, query: &str) -> TestConfig {
    let base = upstream.base_url();
    let parent = Job::videos("repos", world::ENDPOINT, &base)
        .fan_out("region", ["US"])
        .pages(1)
        .sink(
            Sink::postgres(&pg.url(ROLE, ROLE))
                .password_file("secrets/pg")
                .records("/items")
                .key("/id"),
        );
    let child = Job::videos("issues", world::ENDPOINT, &base)
        .pages(1)
        .set("fan_out_from", from_postgres(pg, query));
    let cfg = world::config(parent).job(child).write();
    std::fs::create_dir_all(cfg.join("secrets")).expect("mkdir");
    std::fs::write(cfg.join("secrets/pg"), PASSWORD).expect("password");
    cfg
}

fn server() -> Postgres {
    let pg = Postgres::start();
    pg.role(ROLE, PASSWORD);
    pg
}

/// `trigger JOB --wait` with no daemon running (a tick refused before it
/// queues anything).
fn trigger(cfg: &TestConfig, redis: &RedisServer, job: &str) -> (Option<i32>, String) {
    let (code, out, err) = run_cli(
        cfg,
        Some(&redis.url()),
        &["trigger", job, "--wait"],
        Duration::from_secs(90),
    );
    (code, format!("{out}\n{err}"))
}

/// The scopes the simulator was asked for, besides `US`.
fn child_scopes(upstream: &Upstream) -> BTreeSet<String> {
    (upstream.stats().requests.iter())
        .map(|r| r.scope.clone())
        .filter(|s| s != "US")
        .collect()
}

/// repositories → their issues: the child's tick fans out one task per
/// row the query reads from the parent's table.
#[test]
fn a_postgres_query_fans_out_the_rows_of_another_jobs_table() {
    let pg = server();
    let redis = RedisServer::start();
    let upstream = Upstream::start(1, 3);
    let cfg = config(
        &pg,
        &upstream,
        "SELECT key AS region FROM repos WHERE item = '{\"region\":\"US\"}' ORDER BY key",
    );
    let mut rig = Rig::start(redis, cfg, &[]);
    // Before the parent ran: its table (made when `run` started) is empty.
    let t = rig.trigger_expect("issues", 0);
    assert!(t.stdout.contains("queued 0 task(s)"), "{t:#?}");
    rig.trigger_expect("repos", 0);
    rig.trigger_expect("issues", 0);
    let want: BTreeSet<String> = (1..=3).map(|i| format!("US-p1-i{i}")).collect();
    assert_eq!(child_scopes(&upstream), want);
    // `check` reads it as a tick would.
    let (code, out, err) = rig.cli(&["check"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("3 row(s) now"), "{out}");
    rig.daemon.term();
    let _ = rig.daemon.wait_exit(Duration::from_secs(20));
}

/// A write is refused: at load when the query shows it (its first keyword,
/// or a data-modifying WITH in its plan), at the tick by the read-only
/// transaction when a function hides it. Nothing is deleted.
#[test]
fn a_query_that_writes_is_refused_at_load_and_at_the_tick() {
    let pg = server();
    pg.query(
        ROLE,
        "CREATE TABLE repos (item text, key text, page_id text, fetched_at timestamptz, record jsonb);
         INSERT INTO repos (item, key) VALUES ('{}', 'a'), ('{}', 'b');
         ALTER TABLE repos OWNER TO ingest;
         CREATE FUNCTION sneaky() RETURNS SETOF text LANGUAGE sql
           AS 'DELETE FROM repos RETURNING key';
         ALTER FUNCTION sneaky() OWNER TO ingest;",
    );
    let redis = RedisServer::start();
    let upstream = Upstream::start(1, 3);
    for query in [
        "DELETE FROM repos RETURNING key AS region",
        "WITH d AS (DELETE FROM repos RETURNING key) SELECT key AS region FROM d",
        "SELECT key AS region FROM repos FOR UPDATE",
    ] {
        let cfg = config(&pg, &upstream, query);
        let (code, out, err) = run_cli(
            &cfg,
            Some(&redis.url()),
            &["check"],
            Duration::from_secs(60),
        );
        assert_eq!(code, Some(78), "{query}: {out}\n{err}");
        assert!(err.contains("issues.fan_out_from.query"), "{query}: {err}");
        assert!(err.contains("the query must only read"), "{query}: {err}");
    }
    // A function that writes looks like a read; the server refuses it.
    let cfg = config(&pg, &upstream, "SELECT sneaky() AS region");
    let (code, out) = trigger(&cfg, &redis, "issues");
    assert_eq!(code, Some(65), "{out}");
    assert!(out.contains("the query must only read"), "{out}");
    assert_eq!(pg.count(ROLE, "SELECT count(*) FROM repos"), 2);
    assert!(child_scopes(&upstream).is_empty());
}
