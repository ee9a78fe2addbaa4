//! Promise (SPEC Part 2 "Incremental and conditional fetching", issue 12
//! items 3, 4 and 7): `{since}` is when the item's last run that ended
//! `done` started (before any: now − `since_initial`), and a run resumed
//! after the quota keeps the `{since}` it started with; a conditional
//! endpoint's `304` is `done`, writes nothing, is logged `not_modified`,
//! and costs `not_modified_cost` (0: the window's `used` does not move);
//! `quota_reasons` also match an error's `message`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use quota_worker::outcome::OutcomeKind;
use simulator::{Fault, Logged, SimStyle};

use crate::support::pipeline::Pipeline;
use crate::support::rig::Rig;
use crate::support::styles::{self, GITHUB, NUMERIC, Style, config, job, sim};
use crate::support::upstream::Upstream;
use crate::support::world;
use crate::support::{Endpoint, Job, RedisServer, Window};

const WAIT: Duration = Duration::from_secs(30);
/// `{since}` and `{since_epoch}` in the query, as GitHub's `since` and a
/// second parameter to compare it with.
const SINCE: &[(&str, &str)] = &[("since", "{since}"), ("since_epoch", "{since_epoch}")];

/// The daemon in-process on `style`'s simulator of `pages` pages, the
/// credential with `window`, the endpoint as `endpoint` makes it, running
/// the job `job` builds.
async fn start(
    style: &Style,
    pages: u32,
    window: Window,
    endpoint: impl FnOnce(Endpoint) -> Endpoint,
    job: impl FnOnce(&str) -> Job,
) -> Pipeline {
    styles::pipeline(style, pages, world::SECRET, window, endpoint, |base| {
        vec![job(base)]
    })
    .await
}

/// The `{since}` every request of `requests` sent (one value, checked
/// against `{since_epoch}` and the format), as a time.
fn since_of(requests: &[Logged]) -> DateTime<Utc> {
    let get = |r: &Logged, name: &str| {
        r.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {r:?}"))
    };
    assert!(!requests.is_empty());
    let since = get(&requests[0], "since");
    for r in requests {
        assert_eq!(
            get(r, "since"),
            since,
            "one {{since}} per run: {requests:#?}"
        );
    }
    // RFC 3339, UTC, whole seconds: 2026-11-23T02:00:00Z.
    assert_eq!(since.len(), 20, "{since}");
    assert!(
        since.ends_with('Z') && since.as_bytes()[10] == b'T',
        "{since}"
    );
    let t = DateTime::parse_from_rfc3339(&since)
        .expect("RFC 3339")
        .to_utc();
    assert_eq!(get(&requests[0], "since_epoch"), t.timestamp().to_string());
    t
}

/// The whole second before `t`: a run's start is Redis's clock in whole
/// seconds, so it is at least this.
fn floor(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp() - 1, 0).expect("time")
}

/// Run 1 asks for 24 h back; run 2 for the start of run 1 (and, the items
/// not being updated since, gets one empty page); after the items change,
/// run 3 gets them all again, asking from the start of run 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn since_is_the_start_of_the_items_last_done_run() {
    let mut p = start(
        &GITHUB,
        3,
        world::wide(),
        |e| e,
        |base| job("issues", &GITHUB, base, &["o/a"], SINCE, 10),
    )
    .await;
    // Updated before run 1 starts (`since` is "updated at or after").
    p.sim.touch_at(Utc::now() - chrono::Duration::hours(1));

    let before1 = Utc::now();
    let tick = p.trigger("issues").await;
    let evs = p.wait_tick("issues", tick, 1, WAIT).await;
    assert_eq!(evs[0].kind(), OutcomeKind::Done, "{evs:?}");
    let run1 = p.sim_stats().requests.clone();
    assert_eq!(run1.len(), 3);
    let since1 = since_of(&run1);
    let day = chrono::Duration::hours(24);
    assert!(
        since1 >= floor(before1) - day && since1 <= run1[0].time - day,
        "run 1: since_initial (24h) back from its start: {since1} (run began {before1})"
    );

    let tick = p.trigger("issues").await;
    let evs = p.wait_tick("issues", tick, 1, WAIT).await;
    assert_eq!(evs[0].kind(), OutcomeKind::Done, "{evs:?}");
    assert_eq!(evs[0].ev.outcome.records, 0, "nothing updated since run 1");
    let run2 = p.sim_stats().requests[3..].to_vec();
    assert_eq!(run2.len(), 1, "one empty page: {run2:#?}");
    let since2 = since_of(&run2);
    assert!(
        since2 >= floor(before1) && since2 <= run1[0].time,
        "run 2: the start of run 1 ({before1} .. {}), got {since2}",
        run1[0].time
    );

    p.sim.touch();
    let tick = p.trigger("issues").await;
    let evs = p.wait_tick("issues", tick, 1, WAIT).await;
    assert_eq!(evs[0].ev.outcome.records, 6, "{evs:?}");
    let since3 = since_of(&p.sim_stats().requests[4..]);
    assert!(
        since3 >= since2 && since3 <= run2[0].time,
        "run 3: the start of run 2"
    );
    p.stop().await;
}

/// A run stopped by the quota at page 3 and resumed later sends the
/// `{since}` it started with (`since_initial = "2h"` back), and only once
/// that run is done does the next one ask from its start — the start of
/// the interrupted run, not of the one that finished it. (A cursor: every
/// page's query is rendered from the template, so each page's `{since}` is
/// the run's own; a next URL would carry page 1's along by itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resumed_run_keeps_its_since() {
    let mut p = start(
        &NUMERIC,
        4,
        Window::sliding(2, "2s"),
        |e| e,
        |base| job("issues", &NUMERIC, base, &["o/a"], SINCE, 10).set("since_initial", "2h"),
    )
    .await;

    let before1 = Utc::now();
    let tick = p.trigger("issues").await;
    let evs = p.wait_tick("issues", tick, 1, WAIT).await;
    assert_eq!(evs[0].kind(), OutcomeKind::QuotaExhausted, "{evs:?}");
    let run1 = p.sim_stats().requests.clone();
    assert_eq!(run1.len(), 2);
    let since1 = since_of(&run1);
    let two_hours = chrono::Duration::hours(2);
    assert!(since1 >= floor(before1) - two_hours && since1 <= run1[0].time - two_hours);

    // The window frees 2 s after the spends, which came before the end.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let tick = p.trigger("issues").await;
    let evs = p.wait_tick("issues", tick, 1, WAIT).await;
    assert_eq!(evs[0].kind(), OutcomeKind::Done, "{evs:?}");
    let run2 = p.sim_stats().requests[2..].to_vec();
    let pages: Vec<Option<u32>> = run2.iter().map(|r| r.page).collect();
    assert_eq!(pages, [Some(3), Some(4)], "resumed at page 3");
    assert_eq!(
        since_of(&run2),
        since1,
        "the resumed run keeps its {{since}}"
    );

    // A new run (it stops at page 3 again: the window holds 2 units).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let tick = p.trigger("issues").await;
    p.wait_tick("issues", tick, 1, WAIT).await;
    let since3 = since_of(&p.sim_stats().requests[4..]);
    assert!(
        since3 >= floor(before1) && since3 <= run1[0].time,
        "the start of the interrupted run ({before1}), not of its resumption ({}): {since3}",
        run2[0].time
    );
    p.stop().await;
}

/// GitHub answers a 403 whose `message` says "API rate limit exceeded",
/// without Google's `errors[].reason`: with `quota_reasons = ["rate limit
/// exceeded"]` it is throttling (the credential blocked), not a failure;
/// another 403 still fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_reasons_match_an_error_message() {
    let reasons = |e: Endpoint| {
        e.set("quota_reasons", vec!["rate limit exceeded"])
            .throttle_block("1m")
    };
    let issues = |base: &str| job("issues", &GITHUB, base, &["o/a"], &[], 10);
    for (message, throttled) in [
        (
            "API rate limit exceeded for user ID 1. (But here's the good news: ...)",
            true,
        ),
        ("Resource not accessible by integration", false),
    ] {
        let mut p = start(&GITHUB, 1, world::wide(), reasons, issues).await;
        p.sim.inject(
            Fault::Message {
                status: 403,
                message: message.into(),
            },
            1,
        );
        let evs = p.tick("issues", 1, WAIT).await;
        let o = &evs[0].ev.outcome;
        let blocked = p.peek(world::CREDENTIAL).await.blocked_for;
        if throttled {
            assert_eq!(o.kind, OutcomeKind::UpstreamThrottled, "{o:?}");
            assert!(o.detail.contains("(rate limit exceeded)"), "{o:?}");
            assert!(blocked > Duration::from_secs(50), "{blocked:?}");
        } else {
            assert_eq!(o.kind, OutcomeKind::Failed, "{o:?}");
            assert_eq!(blocked, Duration::ZERO);
        }
        p.stop().await;
    }
}

/// GitHub's conditional requests, through the real binary: run 1 fetches
/// three pages (3 units); run 2 sends page 1's `ETag` as `If-None-Match`,
/// gets a `304`, and is `done` with nothing written, its log line saying
/// `not_modified`, the window's `used` unchanged (`not_modified_cost = 0`)
/// and `trigger --wait` exiting 0. Once the items change, run 3 fetches
/// them all again.
#[test]
fn a_304_is_done_writes_nothing_and_costs_not_modified_cost() {
    let mut sim_config = sim(SimStyle::Link, 3, world::SECRET);
    sim_config.etag = true;
    let upstream = Upstream::with(sim_config);
    let redis = RedisServer::start();
    let conditional = |e: Endpoint| e.set("conditional", true).set("not_modified_cost", 0);
    let issues = job("issues", &GITHUB, &upstream.base_url(), &["o/a"], &[], 10);
    let cfg = config(world::SECRET, world::wide(), conditional, [issues])
        .redis_url(&redis.url())
        .write();
    let port = crate::support::redis_server::free_port();
    let listen = format!("127.0.0.1:{port}");
    let env = [
        (world::KEY_ENV, world::SECRET),
        ("QUOTA_WORKER_METRICS_LISTEN", listen.as_str()),
    ];
    let rig = Rig::start(redis, cfg, &env);
    let used = || rig.used(world::CREDENTIAL);
    let lines = || {
        std::fs::read_to_string(rig.cfg.join("data/issues/o%2Fa.jsonl"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    // A tick, which must exit 0, and the outcome it ended with.
    let run = |what: &str| {
        let (o, t) = rig.tick("issues", 1);
        assert_eq!(t.code, Some(0), "{what}: {t:#?}");
        o.into_iter().next().expect("one outcome")
    };

    let o = run("run 1");
    assert_eq!((o.kind.as_str(), o.pages), ("done", 3), "{o}");
    assert_eq!(used(), 3);
    assert_eq!(lines(), 6);

    let o = run("run 2");
    assert_eq!(o.kind, "done", "{o}");
    assert_eq!(o.line["not_modified"], true, "{o}");
    assert_eq!((o.pages, o.records), (0, 0), "{o}");
    assert_eq!(o.units, 0, "{o}");
    assert_eq!(o.status, Some(304), "{o}");
    assert_eq!(used(), 3, "a 304 costs not_modified_cost = 0");
    assert_eq!(lines(), 6, "nothing written");
    // Issue 24, item 9: the metrics count what was finally charged:
    // spent (4, at the configured cost) less what settles gave back (1).
    // Counters, kept in the daemon and counted before the task's outcome
    // (which `tick` waited for): any scrape shows them.
    let m = crate::support::http::scrape(port);
    let of = |name: &str, extra: &[(&str, &str)]| {
        let mut want = vec![("endpoint", world::ENDPOINT)];
        want.extend_from_slice(extra);
        m.sum(name, &want)
    };
    assert_eq!(of("qw_units_spent_total", &[]), 4.0);
    assert_eq!(of("qw_units_settled_total", &[("change", "refund")]), 1.0);
    assert_eq!(of("qw_units_settled_total", &[("change", "raise")]), 0.0);
    let stats = upstream.stats();
    let r = &stats.requests[3];
    assert_eq!((r.page, r.status), (Some(1), 304), "{r:?}");
    assert!(
        r.if_none_match
            .as_deref()
            .is_some_and(|e| e.starts_with("W/\"o/a-p1-")),
        "{r:?}"
    );
    assert_eq!(stats.requests.len(), 4, "run 2 made one request");
    assert_eq!(stats.charges.len(), 3, "the upstream charged no 304");
    println!(
        "304: run 2 sent If-None-Match {:?}; units the simulator charged for it: {}; window used before/after: 3/3",
        r.if_none_match,
        stats.charges.len() - 3
    );

    upstream.touch();
    let o = run("run 3");
    assert_eq!((o.kind.as_str(), o.pages), ("done", 3), "{o}");
    assert!(o.line.get("not_modified").is_none(), "{o}");
    assert_eq!(used(), 6);
    assert_eq!(lines(), 12);
    let mut rig = rig;
    rig.daemon.term();
    assert!(rig.daemon.wait_exit(Duration::from_secs(20)).is_some());
}
