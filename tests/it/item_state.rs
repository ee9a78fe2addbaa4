//! Promise (SPEC Part 4 "Item state", issue 35): `quota-worker state JOB
//! [ITEM] [--json]` shows where each item stands — after a run stopped by
//! the quota, the page its next run resumes at and the cursor — and
//! `state reset` starts it over: its next run fetches from page 1 with
//! `{since}` forgotten, or with the `{since}` given (the upstream's log
//! shows both). A reset while a task holds the item exits 75 and changes
//! nothing; an unknown job or item exits 64; Redis down exits 69. The
//! items are the fan-out's now (rows of a CSV too) and those Redis still
//! holds state for. All through the real binary.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use simulator::Logged;

use crate::support::keys::keys;
use crate::support::process::run_cli;
use crate::support::rig::Rig;
use crate::support::styles::{self, NUMERIC, job, sim};
use crate::support::upstream::{Blackhole, Upstream};
use crate::support::world;
use crate::support::{
    ConfigBuilder, Credential, Endpoint, Job, RedisServer, Request, Sink, TestConfig, Window,
    wait_every, wait_until,
};

const WAIT: Duration = Duration::from_secs(60);
/// The job's one item (`fan_out = { repo = ["o/a"] }`), as `state` names it.
const ITEM: &str = "repo=o/a";
/// What `state reset --since` sets in the first test.
const SINCE: &str = "2026-01-02T03:04:05Z";

/// `args` of the binary on `cfg` and `redis`: exit code, stdout, stderr.
fn cli(cfg: &TestConfig, redis: &RedisServer, args: &[&str]) -> (Option<i32>, String, String) {
    run_cli(cfg, Some(&redis.url()), args, WAIT)
}

/// `state JOB [ITEM] --json`, which must exit 0.
fn state_json(cfg: &TestConfig, redis: &RedisServer, args: &[&str]) -> Value {
    let mut all = vec!["state"];
    all.extend_from_slice(args);
    all.push("--json");
    let (code, out, err) = cli(cfg, redis, &all);
    assert_eq!(code, Some(0), "state: {out}\n{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("state --json: {e}: {out}"))
}

/// The `{since}` query parameter of each request.
fn sinces(requests: &[Logged]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            (r.query.iter())
                .find(|(k, _)| k == "since")
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no since in {r:?}"))
        })
        .collect()
}

/// The pages requests asked for.
fn pages(requests: &[Logged]) -> Vec<Option<u32>> {
    requests.iter().map(|r| r.page).collect()
}

/// The tick `trigger` printed ("queued 1 task(s) of job J (tick T)").
fn tick_of(out: &str) -> i64 {
    let at = out
        .find("(tick ")
        .unwrap_or_else(|| panic!("no tick in {out}"));
    let rest = &out[at + 6..];
    rest[..rest.find(')').expect(")")].parse().expect("tick")
}

/// The world's credential with 2 units per 2 s, and job `issues` paging a
/// numeric cursor over 4 pages of one repo, `{since}` in its query,
/// `since_initial = "2h"`: a run spends its 2 units on pages 1 and 2 and
/// stops at page 3.
fn two_pages_a_run(base: &str, redis: &RedisServer) -> TestConfig {
    let issues = job(
        "issues",
        &NUMERIC,
        base,
        &["o/a"],
        &[("since", "{since}")],
        10,
    )
    .set("since_initial", "2h");
    styles::config(world::SECRET, Window::sliding(2, "2s"), |e| e, [issues])
        .redis_url(&redis.url())
        .write()
}

/// A run stopped by the quota at page 3: `state` shows page 3 and its
/// cursor (text and `--json`), the `{since}` the run kept, how and when it
/// ended. `state reset` forgets them; the next run asks for page 1 with
/// `{since}` = now − since_initial. Before all that, `state reset --since`
/// on an item that never ran makes its first run send that `{since}`.
#[test]
fn state_shows_where_a_quota_stopped_run_resumes_and_reset_starts_it_over() {
    let redis = RedisServer::start();
    let upstream = Upstream::with(sim(NUMERIC.sim, 4, world::SECRET));
    let cfg = two_pages_a_run(&upstream.base_url(), &redis);
    let mut rig = Rig::start(redis, cfg, &[]);
    let (cfg, redis) = (&rig.cfg, &rig.redis);

    // An item that never ran: nothing to forget, {since} set.
    let (code, out, err) = cli(cfg, redis, &["state", "reset", "issues", "--since", SINCE]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains(&format!("issues {ITEM}: forgot nothing; its next run starts at page 1 with {{since}} set to {SINCE}")),
        "{out}"
    );
    assert!(
        err.contains("an operator reset an item's state") && err.contains("user="),
        "logged at WARN with the operator's name: {err}"
    );

    // Run 1: pages 1 and 2 with that {since}, then the quota says no.
    let (code, out, err) = cli(cfg, redis, &["trigger", "issues", "--wait"]);
    assert_eq!(code, Some(75), "stopped by the quota: {out}\n{err}");
    let tick = tick_of(&out);
    let run1 = upstream.stats().requests;
    assert_eq!(pages(&run1), [Some(1), Some(2)], "{run1:#?}");
    assert_eq!(
        sinces(&run1),
        [SINCE, SINCE],
        "--since reached the upstream"
    );

    let v = state_json(cfg, redis, &["issues"]);
    assert_eq!(v["job"], "issues", "{v:#}");
    let items = v["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{v:#}");
    let s = &items[0];
    assert_eq!(s["item"], ITEM, "{s:#}");
    assert_eq!(s["in_fan_out"], true, "{s:#}");
    assert_eq!(s["last_tick"], tick, "{s:#}");
    assert_eq!(s["outcome"], "quota_exhausted", "{s:#}");
    let ended: DateTime<Utc> = s["ended_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("ended_at: {s:#}"));
    let ticked = DateTime::from_timestamp_millis(tick).expect("tick");
    assert!(
        ended >= ticked - chrono::Duration::seconds(1) && ended <= Utc::now(),
        "ended {ended}, tick {ticked}"
    );
    assert_eq!(s["resume_page"], 3, "{s:#}");
    assert_eq!(s["cursor"]["token"], "3", "page 3's cursor: {s:#}");
    assert_eq!(s["since"], SINCE, "the run keeps its {{since}}: {s:#}");
    assert_eq!(s["validators"], Value::Null, "{s:#}");
    assert_eq!(s["held_by"], Value::Null, "{s:#}");
    // The one item, named as `trigger --wait` names it, reads the same.
    assert_eq!(state_json(cfg, redis, &["issues", ITEM])["items"][0], *s);

    let (code, text, err) = cli(cfg, redis, &["state", "issues"]);
    assert_eq!(code, Some(0), "{err}");
    for want in [
        "job issues: 1 item(s), 1 in its fan-out now",
        ITEM,
        "quota_exhausted",
        "resumes at page 3, cursor {\"first\":1,\"token\":\"3\"}",
        &format!("{{since}}:     {SINCE}"),
        "held by:     nobody",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }

    // Start it over: the checkpoint and {since} go.
    let (code, out, err) = cli(cfg, redis, &["state", "reset", "issues", ITEM]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("forgot the checkpoint (tick ")
            && out.contains("resuming at page 3")
            && out.contains(&format!("{{since}} {SINCE}"))
            && out.contains("now − since_initial (2h)"),
        "says what it removed: {out}"
    );
    let s = &state_json(cfg, redis, &["issues"])["items"][0];
    assert_eq!(
        (&s["resume_page"], &s["cursor"], &s["since"]),
        (&Value::Null, &Value::Null, &Value::Null),
        "{s:#}"
    );
    assert_eq!(s["outcome"], "quota_exhausted", "the history stays: {s:#}");

    // Run 2, once the window has room again (2 s after its spends): page
    // 1, {since} 2 h back.
    assert!(
        wait_every(Duration::from_secs(10), Duration::from_millis(100), || rig
            .used(world::CREDENTIAL)
            == 0),
        "the window did not free"
    );
    let before = Utc::now();
    let (code, out, err) = cli(cfg, redis, &["trigger", "issues", "--wait"]);
    assert_eq!(code, Some(75), "{out}\n{err}");
    let run2 = upstream.stats().requests[2..].to_vec();
    assert_eq!(pages(&run2), [Some(1), Some(2)], "from page 1: {run2:#?}");
    let since2: DateTime<Utc> = sinces(&run2)[0].parse().expect("RFC 3339");
    let two_hours = chrono::Duration::hours(2);
    assert!(
        since2 >= before - two_hours - chrono::Duration::seconds(1)
            && since2 <= Utc::now() - two_hours,
        "{{since}} forgotten: now − since_initial, not {SINCE}: {since2}"
    );
    rig.daemon.term();
}

/// While a task holds the item (its request hangs on an upstream that never
/// answers), `state` names the task and its daemon's host, and `state
/// reset` exits 75 saying "in flight on HOST" and leaves `{since}` as it
/// was.
#[test]
fn a_reset_while_a_task_holds_the_item_exits_75_and_changes_nothing() {
    let redis = RedisServer::start();
    let hole = Blackhole::start();
    let cfg = world::config(
        Job::videos("slow", world::ENDPOINT, &hole.base_url()).fan_out("region", ["US"]),
    )
    .redis_url(&redis.url())
    .write();
    let (code, out, err) = cli(&cfg, &redis, &["state", "reset", "slow", "--since", SINCE]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let since_key = keys().since("slow", "region=US");
    let since_before: String = redis.cmd(&["GET", &since_key]);

    let mut rig = Rig::start(redis, cfg, &[]);
    let (cfg, redis, daemon) = (&rig.cfg, &rig.redis, &mut rig.daemon);
    let (code, out, err) = cli(cfg, redis, &["trigger", "slow"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let lock = keys().item_lock("slow", "region=US");
    assert!(
        wait_until(WAIT, || redis.keys(&lock).len() == 1),
        "the task holds the item: {}",
        daemon.log()
    );

    let s = &state_json(cfg, redis, &["slow", "region=US"])["items"][0];
    let host = s["held_by"]["host"]
        .as_str()
        .unwrap_or_else(|| panic!("{s:#}"));
    assert!(
        host.ends_with(&format!(":{}", daemon.pid())),
        "held on the daemon's host:pid: {s:#}"
    );
    assert!(
        s["held_by"]["task"]
            .as_str()
            .is_some_and(|t| t.starts_with("slow:")),
        "{s:#}"
    );

    for args in [
        &["state", "reset", "slow"][..],
        &["state", "reset", "slow", "region=US"],
    ] {
        let (code, out, err) = cli(cfg, redis, args);
        assert_eq!(code, Some(75), "{args:?}: {out}\n{err}");
        assert!(err.contains(&format!("in flight on {host}")), "{err}");
        let since_after: String = redis.cmd(&["GET", &since_key]);
        assert_eq!(since_after, since_before, "nothing changed");
    }
    daemon.kill();
}

/// Items come from the fan-out now (here a CSV's rows, and a template
/// credential's tenants) and from what Redis still holds: a row removed from the CSV is listed as no longer in the
/// fan-out while its state lasts, and is unknown (64) once reset. An
/// unknown job or item, or a `--since` that is no time, exits 64; Redis
/// down exits 69.
#[test]
fn items_come_from_the_fan_out_and_redis_and_bad_names_exit_64() {
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("channels.csv");
    std::fs::write(&csv, "channel\nUC1\nUC2\n").expect("csv");
    let mut from = toml::Table::new();
    from.insert("csv".into(), csv.display().to_string().into());
    let feed = Job::new("feed", world::ENDPOINT)
        .request(
            Request::get("http://127.0.0.1:9/v").query(&[("c", "{channel}"), ("key", "{secret}")]),
        )
        .sink(Sink::jsonl("data/{job}.jsonl").records("/items"))
        .set("fan_out_from", toml::Value::Table(from));
    // A template credential's tenants are items like any other.
    let media = Job::videos_by("media", "ig.media", "http://127.0.0.1:9", "account")
        .fan_out("account", ["a", "b c"]);
    let cfg = ConfigBuilder::new()
        .credential(world::credential(world::wide()))
        .endpoint(world::endpoint())
        .credential(Credential::template("ig", "account", "tokens/{account}").window(world::wide()))
        .endpoint(Endpoint::new("ig.media", "ig", 1))
        .job(feed)
        .job(media)
        .redis_url(&redis.url())
        .write();
    let v = state_json(&cfg, &redis, &["media"]);
    let tenants: Vec<&Value> = v["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| &i["item"])
        .collect();
    assert_eq!(tenants, ["account=a", "account=b c"], "{v:#}");

    let (code, _, err) = cli(
        &cfg,
        &redis,
        &[
            "state",
            "reset",
            "feed",
            "channel=UC2",
            "--since",
            "2026-01-02",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(&csv, "channel\nUC1\n").expect("csv");
    let v = state_json(&cfg, &redis, &["feed"]);
    let listed: Vec<(&str, bool)> = v["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|s| (s["item"].as_str().expect("item"), s["in_fan_out"] == true))
        .collect();
    assert_eq!(
        listed,
        [("channel=UC1", true), ("channel=UC2", false)],
        "{v:#}"
    );
    assert_eq!(v["items"][1]["since"], "2026-01-02T00:00:00Z", "{v:#}");
    assert_eq!(
        state_json(&cfg, &redis, &["feed", "channel=UC2"])["items"][0]["in_fan_out"],
        false
    );

    let (code, out, err) = cli(&cfg, &redis, &["state", "reset", "feed", "channel=UC2"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    for (args, why) in [
        (&["state", "feed", "channel=UC2"][..], "unknown item"),
        (&["state", "nojob"], "unknown job"),
        (&["state", "feed", "channel=UC9"], "unknown item"),
        (&["state", "reset", "nojob"], "unknown job"),
        (&["state", "reset", "feed", "channel=UC9"], "unknown item"),
        (
            &["state", "reset", "feed", "--since", "yesterday"],
            "RFC 3339",
        ),
        (
            &["state", "reset", "feed", "--since", "2999-01-01"],
            "in the future",
        ),
    ] {
        let (code, out, err) = cli(&cfg, &redis, args);
        assert_eq!(code, Some(64), "{args:?}: {out}\n{err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }

    redis.stop();
    for args in [&["state", "feed"][..], &["state", "reset", "feed"]] {
        let (code, out, err) = cli(&cfg, &redis, args);
        assert_eq!(code, Some(69), "{args:?}: {out}\n{err}");
        assert!(err.contains("Redis"), "{err}");
    }
}
