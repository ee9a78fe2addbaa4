//! Promise (SPEC Part 4, "Sinks that cannot be written, for good"; issue
//! 37): a page a sink can never take is neither retried for ever nor
//! counted as written. It is kept under `<state_dir>/spool/%rejected/<job>/`
//! with its error, the task ends `failed` naming the error, `{since}` stays,
//! the item's later pages are not held back, and no later tick spends units
//! to fetch the item again until `quota-worker spool retry JOB` (or a
//! reload) — shown on `/api/status` and in `qw_sink_rejected_pages_total`.
//! What PostgreSQL cannot hold that JSON allows is written so that it can:
//! U+0000 as U+FFFD (counted), a key of any length. Errors that heal (the
//! server down, too many connections, a serialization failure, a full
//! disk) keep Part 2's spool. The real binary as a daemon, a real
//! `redis-server` and PostgreSQL, the hostile upstream's canned answers.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::canned::CannedRig;
use crate::support::hostile::Hostile;
use crate::support::http::{http_get, scrape};
use crate::support::keys::keys;
use crate::support::postgres::Postgres;
use crate::support::process::run_cli;
use crate::support::{Sink, wait_until};

/// The role the sink logs in as, and its database.
const ROLE: &str = "ingest";
/// Its password.
const PASSWORD: &str = "pg-Pw-37-refused";
/// The canned rig's job (and so its table).
const JOB: &str = "leak";

/// A page of `records`, pointing at the canned answer `next` when given.
fn page(records: Value, next: Option<&str>) -> String {
    match next {
        Some(n) => json!({ "items": records, "next": format!("/canned/{n}") }),
        None => json!({ "items": records }),
    }
    .to_string()
}

/// The daemon paging canned answers into a PostgreSQL table `leak`, over
/// `v = values`, pages followed by `next` (a relative URL), up to 5 a run.
struct PgRig {
    pg: Postgres,
    upstream: Hostile,
    rig: CannedRig,
}

impl PgRig {
    fn start(values: &[&str], sink: impl FnOnce(Sink) -> Sink) -> Self {
        let pg = Postgres::start();
        pg.role(ROLE, PASSWORD);
        Self::start_on(pg, values, sink)
    }

    fn start_on(pg: Postgres, values: &[&str], sink: impl FnOnce(Sink) -> Sink) -> Self {
        let upstream = Hostile::start();
        let base = Sink::postgres(&pg.url(ROLE, ROLE))
            .password_file("secrets/pg")
            .records("/items");
        let job = CannedRig::job(&upstream)
            .fan_out("v", values.iter().copied())
            .pagination("style", "next_url")
            .pagination("next", "/next")
            .pagination("max_pages", 5)
            .sink(sink(base));
        let password = format!("{PASSWORD}\n");
        let rig = CannedRig::start_job(
            "k3y-for-37",
            CannedRig::endpoint(),
            job,
            &[("secrets/pg", &password)],
        );
        PgRig { pg, upstream, rig }
    }

    /// Runs `sql` as the superuser in the sink's database.
    fn sql(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.pg.query(ROLE, sql)
    }

    /// One tick of `items` tasks: their outcomes (this tick's only).
    fn tick(&self, items: usize) -> Vec<Value> {
        let before = before_terminal(&self.rig);
        let (outcomes, _) = self.rig.tick(before + items);
        outcomes[before..].to_vec()
    }

    /// How many times the upstream was asked for the canned answer `name`.
    fn asked(&self, name: &str) -> usize {
        let path = format!("/canned/{name}");
        self.upstream
            .seen()
            .iter()
            .filter(|s| s.path() == path)
            .count()
    }

    /// `SELECT record::text FROM leak`, each parsed, ordered by key.
    fn records(&self) -> Vec<Value> {
        self.sql("SELECT record::text FROM leak ORDER BY key, fetched_at")
            .into_iter()
            .filter_map(|r| r.into_iter().next().flatten())
            .map(|t| serde_json::from_str(&t).expect("a stored record is JSON"))
            .collect()
    }

    /// The ids stored, in key order.
    fn ids(&self) -> Vec<String> {
        self.records()
            .iter()
            .map(|r| r["id"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    fn spool_retry(&self) -> (Option<i32>, String) {
        let (code, out, err) = run_cli(
            &self.rig.cfg,
            Some(&self.rig.redis.url()),
            &["spool", "retry", JOB],
            Duration::from_secs(60),
        );
        (code, format!("stdout:\n{out}\nstderr:\n{err}"))
    }

    fn spool_list(&self) -> (Option<i32>, String) {
        let (code, out, err) = run_cli(
            &self.rig.cfg,
            None,
            &["spool", "list"],
            Duration::from_secs(60),
        );
        (code, format!("{out}{err}"))
    }
}

/// Outcomes that ended (done, failed, ...) so far.
fn before_terminal(rig: &CannedRig) -> usize {
    rig.daemon
        .outcomes()
        .iter()
        .filter(|o| crate::support::daemon::TERMINAL.contains(&o["outcome"].as_str().unwrap_or("")))
        .count()
}

/// Page files (`*.json`) in a directory of the rig's config dir.
fn files(rig: &CannedRig, dir: &str) -> usize {
    std::fs::read_dir(rig.cfg.join(dir))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    !n.starts_with('.') && n.ends_with(".json")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Pages waiting in the retry spool, and pages kept as refused.
fn spooled(rig: &CannedRig) -> usize {
    files(rig, "state/spool/leak")
}

fn kept(rig: &CannedRig) -> usize {
    files(rig, "state/spool/%rejected/leak")
}

/// `/api/status`'s `rejected_pages` for the job.
fn rejected_on_status(rig: &CannedRig) -> Option<u64> {
    let (status, body) = http_get(rig.port, "/api/status")?;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).expect("status JSON");
    v["jobs"]
        .as_array()?
        .iter()
        .find(|j| j["name"] == JOB)
        .and_then(|j| j["rejected_pages"].as_u64())
}

/// The item's `{since}` in Redis.
fn since(rig: &CannedRig, v: &str) -> Option<String> {
    rig.redis
        .cmd(&["GET", &keys().since(JOB, &format!("v={v}"))])
}

/// Waits until the clock is past the second `since` names (seconds since
/// the epoch): a run completed from then on would move `{since}`.
fn past_second(since: &str) {
    let at: i64 = since.parse().expect("{since} in seconds");
    assert!(
        wait_until(Duration::from_secs(3), || chrono::Utc::now().timestamp()
            > at),
        "the clock did not pass {at}"
    );
}

fn message(o: &Value) -> &str {
    o["message"].as_str().unwrap_or("")
}

/// Issue 37, item 1: `{"id": "1", "t": "a\u0000b"}` into PostgreSQL was
/// refused for ever (SQLSTATE 22P05), spooled and retried every 10 s, and
/// the item's later pages queued behind it: the table held 0 rows while
/// `trigger --wait` said done. U+0000 (in values and in keys) is written as
/// U+FFFD, counted, and the item's later page lands too (with a number
/// past `numeric`'s range, written as a string of its digits); a JSON
/// lines sink keeps the record as it came.
#[test]
fn issue_37_1_a_nul_lands_as_the_replacement_character_and_the_items_later_pages_too() {
    let t = PgRig::start(&["a"], |s| s.key("/id"));
    t.upstream.answer(
        "a",
        200,
        &[],
        page(
            json!([{"id": "1", "t": "a\u{0}b", "k\u{0}": ["x\u{0}"]}, {"id": "2", "t": "fine"}]),
            Some("a-2"),
        ),
    );
    // And a number PostgreSQL's numeric cannot hold (JSON allows it).
    t.upstream.answer(
        "a-2",
        200,
        &[],
        r#"{"items": [{"id": "3", "t": "later", "big": 1e200000, "n": 12.30}]}"#,
    );
    let ended = t.tick(1);
    assert_eq!(ended[0]["outcome"], "done", "{}", t.rig.daemon.log());
    assert_eq!(t.ids(), ["1", "2", "3"], "{}", t.rig.daemon.log());
    let first = &t.records()[0];
    assert_eq!(first["t"], "a\u{FFFD}b");
    assert_eq!(first["k\u{FFFD}"], json!(["x\u{FFFD}"]));
    let third = &t.records()[2];
    assert_eq!(third["big"], "1e+200000", "its digits, as a string");
    assert_eq!(
        third["n"].to_string(),
        "12.30",
        "a number numeric holds stays one"
    );
    assert_eq!(spooled(&t.rig), 0, "nothing waits in the spool");
    assert_eq!(kept(&t.rig), 0, "nothing is refused");
    let m = scrape(t.rig.port);
    assert_eq!(
        m.sum(
            "qw_records_altered_total",
            &[("qw_job", JOB), ("reason", "nul")]
        ),
        1.0,
        "one record altered"
    );
    assert_eq!(
        m.sum(
            "qw_records_altered_total",
            &[("qw_job", JOB), ("reason", "numeric_range")]
        ),
        1.0
    );

    // A JSON lines sink keeps the record as it came.
    let upstream = Hostile::start();
    let rig = CannedRig::start(&upstream, "k3y-for-37", CannedRig::endpoint(), &["a"]);
    upstream.answer(
        "a",
        200,
        &[],
        page(json!([{"id": "1", "t": "a\u{0}b"}]), None),
    );
    let (outcomes, _) = rig.tick(1);
    assert_eq!(outcomes[0]["outcome"], "done");
    let line = std::fs::read_to_string(rig.cfg.join("data/leak/a.jsonl")).expect("the jsonl");
    assert!(line.contains(r#""t":"a\u0000b""#), "{line}");
}

/// Issue 37, item 2: a page the sink refuses for good (here a CHECK
/// constraint an operator added) is not spooled and does not count as
/// written: the task ends `failed` naming the error, `{since}` stays, the
/// page is kept with its error, counted and shown; the next tick spends
/// nothing on the item (another item goes on); `spool list` shows it and,
/// after the cause is fixed, `spool retry` writes it once and lifts the
/// hold, and the item's next run goes on.
#[test]
fn issue_37_2_a_page_refused_for_good_is_kept_holds_its_item_and_is_written_by_spool_retry() {
    let t = PgRig::start(&["a", "b"], |s| s.key("/id"));
    t.upstream
        .answer("a", 200, &[], page(json!([{"id": "a-1"}]), Some("a-2")));
    t.upstream
        .answer("a-2", 200, &[], page(json!([{"id": "a-2"}]), None));
    t.upstream
        .answer("b", 200, &[], page(json!([{"id": "b-1"}]), None));
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
    assert_eq!(t.ids(), ["a-1", "a-2", "b-1"]);
    let since_before = since(&t.rig, "a").expect("a complete run leaves {since}");

    // An operator's rule the next page of item a breaks.
    t.sql("ALTER TABLE leak ADD CONSTRAINT no_bad CHECK (record->>'id' NOT LIKE 'bad%') NOT VALID");
    t.upstream.answer(
        "a",
        200,
        &[],
        page(json!([{"id": "bad-1"}, {"id": "a-1"}]), Some("a-2")),
    );
    t.upstream
        .answer("b", 200, &[], page(json!([{"id": "b-2"}]), None));
    // {since} is in seconds: a run completed now would move it.
    past_second(&since_before);
    let ended = t.tick(2);
    let a = CannedRig::outcome(&ended, "a");
    assert_eq!(a["outcome"], "failed", "{a}");
    let why = message(a);
    assert!(
        why.starts_with("the sink refused this page for good: postgres ")
            && why.contains("no_bad")
            && why.contains("SQLSTATE 23514")
            && why.contains("state/spool/%rejected/leak/")
            && why.contains("quota-worker spool retry leak"),
        "{why}"
    );
    assert_eq!(CannedRig::outcome(&ended, "b")["outcome"], "done");
    assert_eq!(
        t.ids(),
        ["a-1", "a-2", "b-1", "b-2"],
        "no row of the refused page"
    );
    assert_eq!(
        since(&t.rig, "a").as_deref(),
        Some(since_before.as_str()),
        "{{since}} stays"
    );
    assert_eq!(spooled(&t.rig), 0, "not spooled");
    assert_eq!(kept(&t.rig), 1, "kept");
    assert_eq!(rejected_on_status(&t.rig), Some(1));
    let (_, html) = http_get(t.rig.port, "/").expect("the status page");
    assert!(
        html.contains("Pages refused") && html.contains(r#"class="num rejected-pages""#),
        "{html}"
    );
    let m = scrape(t.rig.port);
    assert_eq!(
        m.sum("qw_sink_rejected_pages_total", &[("qw_job", JOB)]),
        1.0
    );

    // The next tick spends nothing on item a; item b goes on.
    let asked = t.asked("a");
    t.upstream
        .answer("b", 200, &[], page(json!([{"id": "b-3"}]), None));
    let ended = t.tick(2);
    let a = CannedRig::outcome(&ended, "a");
    assert_eq!(a["outcome"], "failed", "{a}");
    assert!(
        message(a).starts_with("sink: held: the sink refused a page of this item for good")
            && message(a).contains("SQLSTATE 23514"),
        "{a}"
    );
    assert_eq!(t.asked("a"), asked, "item a was not fetched");
    assert_eq!(a["units"], 0, "{a}");
    assert_eq!(CannedRig::outcome(&ended, "b")["outcome"], "done");
    assert!(t.ids().contains(&"b-3".to_owned()));
    assert_eq!(
        kept(&t.rig),
        1,
        "the spool never grows from a page it cannot write"
    );

    let (code, out) = t.spool_list();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("leak  v=a  page 1 of the run of ")
            && out.contains("2 record(s)")
            && out.contains("SQLSTATE 23514")
            && out.contains("holds its item"),
        "{out}"
    );

    // Still refused: kept, the command says why, exit 1.
    let (code, out) = t.spool_retry();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("refused  v=a  still: ") && out.contains("23514"),
        "{out}"
    );
    assert_eq!(kept(&t.rig), 1);

    // Fixed: written once, the files gone, the hold lifted.
    t.sql("ALTER TABLE leak DROP CONSTRAINT no_bad");
    let (code, out) = t.spool_retry();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("1 of 1 page(s) written"), "{out}");
    assert_eq!(kept(&t.rig), 0);
    assert!(t.ids().contains(&"bad-1".to_owned()), "{:?}", t.ids());
    assert!(
        wait_until(Duration::from_secs(5), || rejected_on_status(&t.rig)
            == Some(0)),
        "status still shows a refused page"
    );
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
    assert!(t.asked("a") > asked, "item a is fetched again");
    let ids = t.ids();
    assert_eq!(
        ids.iter().filter(|i| *i == "bad-1").count(),
        1,
        "upserted, once: {ids:?}"
    );
}

/// Issue 37, item 2: an error of the table itself (a column's type an
/// operator changed: SQLSTATE 42804) would refuse every item's pages: the
/// page is kept and holds the whole job, so the next tick fetches no item
/// of it; once the column is put back, `spool retry` writes it.
#[test]
fn issue_37_2_a_table_that_refuses_every_page_holds_the_whole_job() {
    let t = PgRig::start(&["a", "b"], |s| s);
    for v in ["a", "b"] {
        t.upstream
            .answer(v, 200, &[], page(json!([{"id": format!("{v}-1")}]), None));
    }
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
    t.sql("ALTER TABLE leak ALTER COLUMN fetched_at TYPE integer USING 0");
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "failed"), "{ended:#?}");
    assert!(
        ended.iter().any(|o| message(o).contains("SQLSTATE 42804")
            && message(o).contains("nothing more of this job is fetched")),
        "{ended:#?}"
    );
    let refused = kept(&t.rig);
    assert!((1..=2).contains(&refused), "{refused}");
    let asked = (t.asked("a"), t.asked("b"));
    let ended = t.tick(2);
    for o in &ended {
        assert!(
            message(o).starts_with("sink: held: the sink refused a page of this job for good"),
            "{o}"
        );
    }
    assert_eq!((t.asked("a"), t.asked("b")), asked, "no item fetched");
    t.sql("ALTER TABLE leak ALTER COLUMN fetched_at TYPE timestamptz USING now()");
    let (code, out) = t.spool_retry();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(kept(&t.rig), 0);
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
}

/// Issue 37, item 2: a permission on the table revoked (`permission denied
/// for table leak`, SQLSTATE 42501) heals only when an operator grants it
/// again, and would refuse every item's pages: the page is kept and holds
/// the whole job, nothing is spooled, nothing more is fetched; once
/// granted, `spool retry` writes it once and the job goes on.
#[test]
fn issue_37_2_a_permission_revoked_on_the_table_holds_the_job_until_spool_retry() {
    let t = PgRig::start(&["a", "b"], |s| s.key("/id"));
    for v in ["a", "b"] {
        t.upstream
            .answer(v, 200, &[], page(json!([{"id": format!("{v}-1")}]), None));
    }
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
    let since_before = since(&t.rig, "a").expect("{since}");
    t.sql(&format!("REVOKE INSERT, UPDATE ON leak FROM {ROLE}"));
    for v in ["a", "b"] {
        t.upstream
            .answer(v, 200, &[], page(json!([{"id": format!("{v}-2")}]), None));
    }
    past_second(&since_before);
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "failed"), "{ended:#?}");
    assert!(
        ended
            .iter()
            .any(|o| message(o).contains("permission denied for table leak")
                && message(o).contains("SQLSTATE 42501")
                && message(o).contains("nothing more of this job is fetched")),
        "{ended:#?}"
    );
    let refused = kept(&t.rig);
    assert!((1..=2).contains(&refused), "{refused}");
    assert_eq!(spooled(&t.rig), 0, "not spooled");
    assert_eq!(since(&t.rig, "a"), Some(since_before), "{{since}} stays");
    assert_eq!(rejected_on_status(&t.rig), Some(refused as u64));
    let asked = (t.asked("a"), t.asked("b"));
    let ended = t.tick(2);
    assert!(
        ended
            .iter()
            .all(|o| message(o)
                .starts_with("sink: held: the sink refused a page of this job for good")),
        "{ended:#?}"
    );
    assert_eq!((t.asked("a"), t.asked("b")), asked, "no item fetched");
    assert_eq!(kept(&t.rig), refused, "nothing more kept");
    t.sql(&format!("GRANT INSERT, UPDATE ON leak TO {ROLE}"));
    let (code, out) = t.spool_retry();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(kept(&t.rig), 0);
    let ended = t.tick(2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
    let ids = t.ids();
    for id in ["a-2", "b-2"] {
        assert_eq!(ids.iter().filter(|i| *i == id).count(), 1, "{id}: {ids:?}");
    }
}

/// Issue 37, item 2: a spooled page (the server refused the login while
/// it was fetched) that the sink then refuses for good on replay leaves the
/// spool for the kept pages, and the item's later spooled page is written
/// rather than held back behind it.
#[test]
fn issue_37_2_a_spooled_page_refused_on_replay_leaves_the_spool_and_holds_nothing_back() {
    let t = PgRig::start(&["a"], |s| s.key("/id"));
    t.upstream
        .answer("a", 200, &[], page(json!([{"id": "a-0"}]), None));
    assert_eq!(t.tick(1)[0]["outcome"], "done");
    // Logins refused from now on (transient: spooled).
    t.sql(&format!(
        "ALTER ROLE {ROLE} NOLOGIN; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{ROLE}'"
    ));
    t.upstream
        .answer("a", 200, &[], page(json!([{"id": "bad-1"}]), Some("a-2")));
    t.upstream
        .answer("a-2", 200, &[], page(json!([{"id": "a-2"}]), None));
    let ended = t.tick(1);
    assert_eq!(
        ended[0]["outcome"], "done",
        "spooled pages count as written"
    );
    assert_eq!(spooled(&t.rig), 2, "{}", t.rig.daemon.log());
    t.sql("ALTER TABLE leak ADD CONSTRAINT no_bad CHECK (record->>'id' NOT LIKE 'bad%') NOT VALID");
    t.sql(&format!("ALTER ROLE {ROLE} LOGIN"));
    let replayed = wait_until(Duration::from_secs(40), || {
        spooled(&t.rig) == 0 && kept(&t.rig) == 1
    });
    assert!(
        replayed,
        "spooled {}, kept {}; log:\n{}",
        spooled(&t.rig),
        kept(&t.rig),
        t.rig.daemon.log()
    );
    assert_eq!(t.ids(), ["a-0", "a-2"], "the later page was written");
}

/// Issue 37, item 3: errors that heal stay in the spool and are written
/// once: too many connections for the role (SQLSTATE 53300, a real
/// refusal: `CONNECTION LIMIT 0`), and, raised by an operator's trigger
/// once, a serialization failure (40001) and a full disk (53100). (The
/// server down: `postgres_sink::a_server_stopped_during_a_tick_…`; a full
/// or read-only disk under JSON lines and SQLite: `sink_unwritable`.)
#[test]
fn issue_37_3_errors_that_heal_are_spooled_and_written_once() {
    let t = PgRig::start(&["a"], |s| s.key("/id"));
    t.upstream
        .answer("a", 200, &[], page(json!([{"id": "a-0"}]), None));
    assert_eq!(t.tick(1)[0]["outcome"], "done");
    t.sql("CREATE SEQUENCE fail_once");
    t.sql(&format!("GRANT USAGE ON SEQUENCE fail_once TO {ROLE}"));
    t.sql("CREATE TABLE fail_code (code text)");
    t.sql(&format!("GRANT SELECT ON fail_code TO {ROLE}"));
    t.sql(
        "CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE c text;
         BEGIN
           SELECT code INTO c FROM fail_code;
           IF c IS NOT NULL AND nextval('fail_once') = 1 THEN
             RAISE EXCEPTION 'injected by the test' USING ERRCODE = c;
           END IF;
           RETURN NULL;
         END $$;
         CREATE TRIGGER fail_once BEFORE INSERT ON leak FOR EACH STATEMENT EXECUTE FUNCTION fail_once()",
    );
    // Each case: the SQLSTATE, and the SQL that makes the next write meet it.
    let cases = [
        (
            "53300",
            format!(
                "ALTER ROLE {ROLE} CONNECTION LIMIT 0; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{ROLE}'"
            ),
        ),
        (
            "40001",
            "DELETE FROM fail_code; INSERT INTO fail_code VALUES ('40001'); SELECT setval('fail_once', 1, false)".to_owned(),
        ),
        (
            "53100",
            "DELETE FROM fail_code; INSERT INTO fail_code VALUES ('53100'); SELECT setval('fail_once', 1, false)".to_owned(),
        ),
    ];
    for (n, (code, break_it)) in cases.iter().enumerate() {
        t.sql(break_it);
        let id = format!("r-{n}");
        t.upstream
            .answer("a", 200, &[], page(json!([{ "id": id }]), None));
        let asked = t.asked("a");
        let ended = t.tick(1);
        assert_eq!(ended[0]["outcome"], "done", "{code}: {ended:#?}");
        assert!(
            t.rig.daemon.log().contains(&format!("SQLSTATE {code}")),
            "{code}: the refusal is logged\n{}",
            t.rig.daemon.log()
        );
        if *code == "53300" {
            assert_eq!(spooled(&t.rig), 1, "{code}: spooled");
            t.sql(&format!("ALTER ROLE {ROLE} CONNECTION LIMIT -1"));
        }
        let written = wait_until(Duration::from_secs(40), || {
            spooled(&t.rig) == 0 && t.ids().contains(&id)
        });
        assert!(written, "{code}: not written; log:\n{}", t.rig.daemon.log());
        assert_eq!(kept(&t.rig), 0, "{code}: nothing refused for good");
        assert_eq!(t.asked("a"), asked + 1, "{code}: fetched once");
        let ids = t.ids();
        assert_eq!(ids.iter().filter(|i| **i == id).count(), 1, "{code}: once");
    }
}

/// Issue 37, item 4: a 10,000-character `key` refused its whole page for
/// good (`index row requires 11728 bytes, maximum size is 8191`, SQLSTATE
/// 54000) and the job's later pages queued behind it. The unique index is
/// on the first 300 characters and a hash of each of the item and the key:
/// the key is stored, and upserted; one differing from it in its last
/// character only is a row of its own. A
/// table made by the older layout (a B-tree unique index on `(item, key)`
/// and on `page_id`) is moved to the new indexes at start, its rows kept.
#[test]
fn issue_37_4_a_key_of_any_length_is_stored_in_an_old_table_too() {
    let pg = Postgres::start();
    pg.role(ROLE, PASSWORD);
    // The layout before issue 37, as that version made it, with a row.
    pg.query(
        ROLE,
        "CREATE TABLE leak (item text NOT NULL, key text, page_id text NOT NULL,
                            fetched_at timestamptz NOT NULL, record jsonb NOT NULL);
         CREATE INDEX leak_page_id ON leak (page_id);
         CREATE UNIQUE INDEX leak_item_key ON leak (item, key);
         INSERT INTO leak VALUES ('{\"v\":\"a\"}', 'old', 'leak:1:1:{\"v\":\"a\"}', now(), '{\"id\": \"old\"}');",
    );
    pg.query(ROLE, &format!("ALTER TABLE leak OWNER TO {ROLE}"));
    let t = PgRig::start_on(pg, &["a"], |s| s.key("/id"));
    let long = incompressible(10_000);
    // Another key that differs from it in its last character only.
    let mut twin = long.clone();
    twin.pop();
    twin.push(if long.ends_with('x') { 'y' } else { 'x' });
    t.upstream.answer(
        "a",
        200,
        &[],
        page(
            json!([{"id": long, "n": 1}, {"id": "short"}, {"id": twin, "n": 9}]),
            None,
        ),
    );
    assert_eq!(t.tick(1)[0]["outcome"], "done", "{}", t.rig.daemon.log());
    t.upstream
        .answer("a", 200, &[], page(json!([{"id": long, "n": 2}]), None));
    assert_eq!(t.tick(1)[0]["outcome"], "done", "{}", t.rig.daemon.log());
    let stored = t.sql(&format!(
        "SELECT record->>'n' FROM leak WHERE key = '{long}'",
        long = long.replace('\'', "''")
    ));
    assert_eq!(stored, [[Some("2".to_owned())]], "stored once, upserted");
    assert_eq!(
        t.ids().len(),
        4,
        "old, short and the two long keys: {:?}",
        t.ids()
    );
    assert_eq!(kept(&t.rig), 0);
    let indexes = t.sql(
        "SELECT indexname || ' ' || substring(indexdef from 'USING .*') FROM pg_indexes
         WHERE tablename = 'leak' ORDER BY 1",
    );
    let indexes: Vec<String> = indexes.into_iter().flatten().flatten().collect();
    assert_eq!(
        indexes,
        [
            "leak_item_key_hash USING btree (\"left\"(item, 300), hashtextextended(item, (0)::bigint), \"left\"(key, 300), hashtextextended(key, (0)::bigint))",
            "leak_page_id USING hash (page_id)"
        ]
    );
}

/// `n` printable ASCII characters PostgreSQL's compression cannot shrink
/// (a B-tree entry is compressed before its size is checked): xorshift.
fn incompressible(n: usize) -> String {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'!' + (x % 90) as u8)
        })
        .collect()
}

/// Issue 37, item 1 ("the other values PostgreSQL refuses"): a record whose
/// `search` fields hold more than 1 MB of distinct words makes a `tsvector`
/// PostgreSQL refuses (`string is too long for tsvector`, SQLSTATE 54000).
/// Nothing in the record can be rewritten for that: the page is refused for
/// good, kept, and the task fails naming the error.
#[test]
fn issue_37_1_search_words_over_a_tsvector_are_refused_for_good() {
    let t = PgRig::start(&["a"], |s| s.key("/id").search(&["/t"]));
    // 80,000 distinct 17-letter words: about 1.9 MB of tsvector.
    let words: Vec<String> = (0..80_000u32)
        .map(|i| format!("w{i:08x}{:08x}", i.wrapping_mul(7919)))
        .collect();
    t.upstream.answer(
        "a",
        200,
        &[],
        page(json!([{"id": "1", "t": words.join(" ")}]), None),
    );
    let ended = t.tick(1);
    assert_eq!(ended[0]["outcome"], "failed", "{ended:#?}");
    assert!(
        message(&ended[0]).contains("string is too long for tsvector")
            && message(&ended[0]).contains("SQLSTATE 54000"),
        "{ended:#?}"
    );
    assert_eq!(kept(&t.rig), 1);
    assert_eq!(spooled(&t.rig), 0);
}

/// Issue 37, item 2, SQLite: an operator's trigger that refuses a record
/// (`RAISE(ABORT)`, SQLITE_CONSTRAINT) refuses its page for good: kept, the
/// item held, written by `spool retry` once the trigger is gone.
#[test]
fn issue_37_2_sqlite_refusing_a_page_for_good_keeps_it() {
    let upstream = Hostile::start();
    let job = CannedRig::job(&upstream).fan_out("v", ["a"]).sink(
        Sink::sqlite("data/{job}.sqlite")
            .records("/items")
            .key("/id"),
    );
    let rig = CannedRig::start_job("k3y-for-37", CannedRig::endpoint(), job, &[]);
    upstream.answer("a", 200, &[], page(json!([{"id": "1"}]), None));
    assert_eq!(rig.tick(1).0[0]["outcome"], "done");
    let db = rig.cfg.join("data/leak.sqlite");
    let conn = rusqlite::Connection::open(&db).expect("open the sink's database");
    conn.execute_batch(
        "CREATE TRIGGER no_bad BEFORE INSERT ON leak WHEN NEW.record_key LIKE 'bad%'
         BEGIN SELECT RAISE(ABORT, 'no bad records'); END;",
    )
    .expect("trigger");
    upstream.answer("a", 200, &[], page(json!([{"id": "bad-1"}]), None));
    let (outcomes, _) = rig.tick(2);
    let o = outcomes.last().expect("an outcome");
    assert_eq!(o["outcome"], "failed", "{o}");
    assert!(
        message(o).contains("refused this page for good") && message(o).contains("no bad records"),
        "{o}"
    );
    assert_eq!(kept(&rig), 1);
    assert_eq!(spooled(&rig), 0);
    let asked = upstream.count();
    let (outcomes, _) = rig.tick(3);
    assert!(message(outcomes.last().expect("an outcome")).starts_with("sink: held:"));
    assert_eq!(upstream.count(), asked, "not fetched again");
    conn.execute_batch("DROP TRIGGER no_bad").expect("drop");
    let (code, out, err) = run_cli(
        &rig.cfg,
        None,
        &["spool", "retry", JOB],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(kept(&rig), 0);
    let n: i64 = conn
        .query_row(
            "SELECT count(*) FROM leak WHERE record_key = 'bad-1'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(n, 1);
}

/// How many times `upstream` was asked for the canned answer `name`.
fn asked(upstream: &Hostile, name: &str) -> usize {
    let path = format!("/canned/{name}");
    (upstream.seen().iter())
        .filter(|s| s.path() == path)
        .count()
}

/// One tick of `items` tasks on `rig`'s daemon now: this tick's outcomes.
fn tick_of(rig: &CannedRig, items: usize) -> Vec<Value> {
    let before = before_terminal(rig);
    let (outcomes, _) = rig.tick(before + items);
    outcomes[before..].to_vec()
}

/// Issue 37, item 2, files: a symbolic link where an item's JSON lines
/// file goes (`ELOOP`: the sink never follows one) never heals by waiting.
/// It is refused for good: the task fails naming it, the page is kept,
/// `{since}` and page 1's validators stay, the other item goes on. The
/// hold outlasts a restart (it is read from the kept files); a reload that
/// changes the job lifts it (the item is fetched again, once the link is
/// gone, and written); `spool retry` then writes the kept page once. (A
/// directory where the file goes heals instead, with no command: issue
/// 22's `spool_per_item::issue_22_2_an_item_that_cannot_be_written_…`.)
#[test]
fn issue_37_2_a_link_where_the_file_goes_is_refused_for_good_held_across_a_restart_until_a_reload()
{
    let upstream = Hostile::start();
    let endpoint = CannedRig::endpoint().set("conditional", true);
    let job = CannedRig::job(&upstream).fan_out("v", ["a", "b"]);
    let mut rig = CannedRig::start_job("k3y-for-37", endpoint, job, &[]);
    upstream.answer(
        "a",
        200,
        &[("etag", b"\"a-1\"")],
        page(json!([{"id": "a-1"}]), None),
    );
    upstream.answer("b", 200, &[], page(json!([{"id": "b-1"}]), None));
    let ended = tick_of(&rig, 2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
    let validators = |rig: &CannedRig| -> Option<String> {
        rig.redis.cmd(&["GET", &keys().validators(JOB, "v=a")])
    };
    let since_before = since(&rig, "a").expect("a complete run leaves {since}");
    let validators_before = validators(&rig).expect("page 1's ETag is kept");
    assert!(validators_before.contains("a-1"), "{validators_before}");

    // A link planted where item a's file goes.
    let file = rig.cfg.join("data/leak/a.jsonl");
    std::fs::remove_file(&file).expect("rm a.jsonl");
    let elsewhere = rig.cfg.join("elsewhere.jsonl");
    std::os::unix::fs::symlink(&elsewhere, &file).expect("a link in the way");
    upstream.answer(
        "a",
        200,
        &[("etag", b"\"a-2\"")],
        page(json!([{"id": "a-2"}]), None),
    );
    upstream.answer("b", 200, &[], page(json!([{"id": "b-2"}]), None));
    // {since} is in seconds: a run completed now would move it.
    past_second(&since_before);
    let ended = tick_of(&rig, 2);
    let a = CannedRig::outcome(&ended, "a");
    assert_eq!(a["outcome"], "failed", "{a}");
    let why = message(a);
    assert!(
        why.starts_with("the sink refused this page for good: refused to write ")
            && why.contains("it is a symbolic link, which a sink never follows")
            && why.contains("state/spool/%rejected/leak/")
            && why.contains("quota-worker spool retry leak"),
        "{why}"
    );
    assert_eq!(CannedRig::outcome(&ended, "b")["outcome"], "done");
    assert_eq!((spooled(&rig), kept(&rig)), (0, 1), "kept, not spooled");
    assert_eq!(
        since(&rig, "a"),
        Some(since_before.clone()),
        "{{since}} stays"
    );
    assert_eq!(
        validators(&rig),
        Some(validators_before.clone()),
        "the validators stay"
    );
    assert_eq!(rejected_on_status(&rig), Some(1));

    // Held: the next tick fetches nothing of item a, and keeps nothing more.
    let before = asked(&upstream, "a");
    let ended = tick_of(&rig, 2);
    let a = CannedRig::outcome(&ended, "a");
    assert!(message(a).starts_with("sink: held: "), "{a}");
    assert_eq!(a["units"], 0, "{a}");
    assert_eq!(asked(&upstream, "a"), before, "item a was not fetched");
    assert_eq!((spooled(&rig), kept(&rig)), (0, 1));

    // Across a restart too: the hold is in the kept files.
    rig.rig.daemon.term();
    assert!(rig.rig.daemon.wait_exit(Duration::from_secs(30)).is_some());
    rig.rig.daemon = rig.another("daemon-2");
    let ended = tick_of(&rig, 2);
    let a = CannedRig::outcome(&ended, "a");
    assert!(message(a).starts_with("sink: held: "), "{a}");
    assert_eq!(asked(&upstream, "a"), before, "item a was not fetched");

    // The operator removes the link and changes the job: the
    // reload lifts the hold, and the item's next run is written.
    assert!(!elsewhere.exists(), "the link was never followed");
    std::fs::remove_file(&file).expect("rm the link");
    let job_file = rig.cfg.join("jobs/leak.toml");
    let text = std::fs::read_to_string(&job_file).expect("the job file");
    assert!(text.starts_with("[leak]\n"), "{text}");
    let text = text.replacen("[leak]\n", "[leak]\nsince_initial = \"2d\"\n", 1);
    std::fs::write(&job_file, text).expect("edit the job");
    rig.rig.daemon.signal(libc::SIGHUP);
    assert!(
        rig.daemon
            .wait_log("configuration reloaded", Duration::from_secs(30)),
        "{}",
        rig.daemon.log()
    );
    upstream.answer(
        "a",
        200,
        &[("etag", b"\"a-3\"")],
        page(json!([{"id": "a-3"}]), None),
    );
    let ended = tick_of(&rig, 2);
    assert!(ended.iter().all(|o| o["outcome"] == "done"), "{ended:#?}");
    assert_eq!(asked(&upstream, "a"), before + 1, "fetched again, once");
    assert_eq!(kept(&rig), 1, "the kept page stays for `spool retry`");
    let (code, out, err) = run_cli(
        &rig.cfg,
        None,
        &["spool", "retry", JOB],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 of 1 page(s) written"), "{out}");
    assert_eq!(kept(&rig), 0);
    let lines = std::fs::read_to_string(&file).expect("a.jsonl");
    for id in ["a-2", "a-3"] {
        let n = lines.matches(&format!(r#""id":"{id}""#)).count();
        assert_eq!(n, 1, "{id} once: {lines}");
    }
}
