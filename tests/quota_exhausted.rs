//! Promise: when the quota says no, a task stops at once — it never sleeps
//! for the retry-after and frees its worker slot — keeping its cursor; with
//! `on_quota_exhausted = "defer"` it comes back by itself at the retry-after,
//! resumes at the page it stopped at, and waiting for quota never uses up
//! its retry attempts.

mod pipeline;
mod support;

use std::time::{Duration, Instant};

use pipeline::{NEVER, Pipeline, Setup, kinds, pages_by_scope, toml_list};
use quota_worker::outcome::OutcomeKind;
use quota_worker::quota::{Decision, request_id};
use quota_worker::simulator::{Fault, SimConfig};
use quota_worker::stats::Stats;

fn config(concurrency: u32, window: &str) -> String {
    format!(
        r#"
jobs = "jobs/*.toml"

[redis]
url = "@REDIS@"

[worker]
concurrency = {concurrency}
poll_interval = "20ms"
shutdown_timeout = "5s"

[metrics]
listen = "off"

[credentials.yt]
secret_env = "QW_TEST_YT"
windows = [{window}]

[endpoints."youtube.videos.list"]
credential = "yt"
cost = 1
"#
    )
}

fn job(name: &str, regions: &str, max_pages: u32, on_exhausted: &str, retry: &str) -> String {
    format!(
        r#"
[{name}]
schedule = "{NEVER}"
endpoint = "youtube.videos.list"
fan_out = {{ region = {regions} }}
on_quota_exhausted = "{on_exhausted}"
retry = {retry}

[{name}.request]
url = "@SIM@/youtube/v3/videos"
query = {{ chart = "mostPopular", regionCode = "{{region}}", maxResults = "2", key = "{{secret}}" }}

[{name}.pagination]
cursor = "/nextPageToken"
param = "pageToken"
max_pages = {max_pages}

[{name}.sink]
kind = "jsonl"
path = "data/{{job}}.jsonl"
records = "/items"
"#
    )
}

fn sim(pages: u32) -> SimConfig {
    SimConfig {
        pages_per_query: pages,
        items_per_page: 2,
        ..SimConfig::default()
    }
    .key("yt-key", 1_000_000, Duration::from_secs(3600))
}

const ENV: &[(&str, &str)] = &[("QW_TEST_YT", "yt-key")];

/// A window that is full for the next hour: 50 tasks on 2 worker slots all
/// end `quota_exhausted` within seconds. Sleeping until the retry-after
/// (about an hour) would take 25 hours; even one second per task would be 25 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_on_an_exhausted_window_end_at_once_without_sleeping() {
    let regions = toml_list((0..50).map(|i| format!("r{i:02}")));
    let mut p = Pipeline::start(Setup {
        config: &config(2, r#"{ units = 5, per = "1h" }"#),
        jobs: vec![(
            "flood.toml".into(),
            job("flood", &regions, 3, "stop", r#"{ attempts = 3 }"#),
        )],
        sim: sim(3),
        env: ENV,
        base_dir: None,
    })
    .await;
    // Fill the window: the next hour has no room.
    for _ in 0..5 {
        let d = p
            .limiter
            .spend("youtube.videos.list", None, &request_id())
            .await
            .expect("spend");
        assert!(d.is_allowed());
    }
    assert!(matches!(
        p.limiter
            .spend("youtube.videos.list", None, &request_id())
            .await
            .expect("spend"),
        Decision::Rejected(_)
    ));

    let t0 = Instant::now();
    let tick = p.trigger("flood").await;
    let evs = p
        .wait_tick("flood", tick, 50, Duration::from_secs(30))
        .await;
    let took = t0.elapsed();
    assert_eq!(evs.len(), 50, "50 outcomes: {:?}", kinds(&evs));
    println!(
        "no-sleep: 50 quota_exhausted tasks on 2 slots in {:.0} ms ({:.0} tasks/s)",
        took.as_secs_f64() * 1000.0,
        50.0 / took.as_secs_f64()
    );
    for s in &evs {
        assert_eq!(s.kind(), OutcomeKind::QuotaExhausted, "{s:?}");
        assert!(s.terminal());
        assert_eq!(s.ev.outcome.page, 1);
        assert_eq!(s.ev.outcome.pages, 0);
        let ra = s.ev.outcome.retry_after.expect("retry-after");
        assert!(
            ra > Duration::from_secs(3500) && ra <= Duration::from_secs(3600),
            "retry-after is when the window frees (about 1 h): {ra:?}"
        );
    }
    assert!(
        took < Duration::from_secs(5),
        "50 exhausted tasks took {took:?}: something waits for quota"
    );
    assert_eq!(Stats::get(&p.shared.stats.in_flight), 0, "every slot freed");
    assert!(p.sim_stats().charges.is_empty(), "the upstream saw nothing");
    // Cursor kept at page 1, as the next run needs it.
    let cursors = p.redis.keys("qw:cursor:flood:*");
    assert_eq!(cursors.len(), 50, "{cursors:?}");
    p.stop().await;
}

/// `defer`: the task stopped at page 3 runs again by itself once the window
/// frees, and fetches page 3 — pages 1 and 2 exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn defer_reruns_at_the_retry_after_and_resumes_at_the_page() {
    let per = Duration::from_secs(3);
    let mut p = Pipeline::start(Setup {
        config: &config(2, r#"{ units = 2, per = "3s" }"#),
        jobs: vec![(
            "later.toml".into(),
            job("later", r#"["US"]"#, 3, "defer", r#"{ attempts = 3 }"#),
        )],
        sim: sim(3),
        env: ENV,
        base_dir: None,
    })
    .await;
    let tick = p.trigger("later").await;
    let evs = p.wait_tick("later", tick, 1, Duration::from_secs(20)).await;
    p.stop().await;
    let stats = p.sim_stats();

    let first = &evs[0];
    assert_eq!(first.kind(), OutcomeKind::QuotaExhausted, "{evs:?}");
    assert_eq!((first.ev.outcome.page, first.ev.outcome.pages), (3, 2));
    let ra = first.ev.outcome.retry_after.expect("retry-after");
    assert_eq!(
        first.ev.outcome.requeued_in,
        Some(ra),
        "deferred to the retry-after"
    );
    assert!(
        ra > per - Duration::from_millis(500) && ra <= per,
        "retry-after {ra:?} is when page 1's unit leaves the 3 s window"
    );
    let last = evs.last().expect("outcomes");
    assert_eq!(last.kind(), OutcomeKind::Done, "{evs:?}");
    assert_eq!((last.first_page(), last.ev.outcome.page), (3, 3));
    // Every outcome in between is a deferral at page 3 (a rerun that came a
    // hair early may be deferred once more; it must never fetch).
    for s in &evs[1..evs.len() - 1] {
        assert_eq!(s.kind(), OutcomeKind::QuotaExhausted, "{s:?}");
        assert_eq!((s.ev.outcome.page, s.ev.outcome.pages), (3, 0));
    }
    // It came back after the retry-after, and promptly.
    let waited = last.at - first.at;
    assert!(
        waited >= ra - Duration::from_millis(50) && waited < ra + Duration::from_secs(2),
        "deferred copy ran {waited:?} after a retry-after of {ra:?}"
    );

    // Upstream: pages 1, 2, then (after the window freed) 3; none twice.
    assert_eq!(pages_by_scope(&stats)["US"], vec![1, 2, 3]);
    assert!(stats.duplicate_pages().is_empty());
    let at = |i: usize| stats.charges[i].at;
    assert!(
        at(2) - at(0) >= per - Duration::from_millis(300),
        "page 3 was fetched {:?} after page 1, inside the 3 s window",
        at(2) - at(0)
    );
    assert_eq!(stats.key("yt-key").quota_errors, 0);
    let records = p.sink_records();
    assert_eq!(records.len(), 3 * 2, "3 pages of 2 records");
}

/// Waiting for quota is not a failure: with `attempts = 1`, a task deferred
/// three times (one unit per second, four pages) still ends `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deferrals_never_use_up_retry_attempts() {
    let mut p = Pipeline::start(Setup {
        config: &config(2, r#"{ units = 1, per = "1s" }"#),
        jobs: vec![(
            "slow.toml".into(),
            job("slow", r#"["US"]"#, 4, "defer", r#"{ attempts = 1 }"#),
        )],
        sim: sim(4),
        env: ENV,
        base_dir: None,
    })
    .await;
    let tick = p.trigger("slow").await;
    let evs = p.wait_tick("slow", tick, 1, Duration::from_secs(20)).await;
    p.stop().await;
    let k = kinds(&evs);
    assert_eq!(
        evs.last().map(|s| s.kind()),
        Some(OutcomeKind::Done),
        "{k:?}"
    );
    let deferrals = evs
        .iter()
        .filter(|s| s.kind() == OutcomeKind::QuotaExhausted && !s.terminal())
        .count();
    assert!(deferrals >= 3, "deferred {deferrals} times: {k:?}");
    assert_eq!(k.get("retrying"), None);
    assert_eq!(k.get("failed"), None);
    let stats = p.sim_stats();
    assert_eq!(pages_by_scope(&stats)["US"], vec![1, 2, 3, 4]);
}

/// The same with a real failure in the mix: `attempts = 2` allows one
/// failure (a 503), and a 429 deferral plus quota deferrals around it use
/// none of the attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deferrals_and_throttles_around_one_failure_still_end_done() {
    let mut p = Pipeline::start(Setup {
        config: &config(2, r#"{ units = 2, per = "1s" }"#),
        jobs: vec![(
            "mixed.toml".into(),
            job(
                "mixed",
                r#"["US"]"#,
                4,
                "defer",
                r#"{ attempts = 2, backoff = "100ms" }"#,
            ),
        )],
        sim: sim(4),
        env: ENV,
        base_dir: None,
    })
    .await;
    p.sim.inject(
        Fault::TooManyRequests {
            retry_after_secs: 1,
        },
        1,
    );
    p.sim.inject(Fault::Status(503), 1);
    let tick = p.trigger("mixed").await;
    let evs = p.wait_tick("mixed", tick, 1, Duration::from_secs(30)).await;
    p.stop().await;
    let k = kinds(&evs);
    assert_eq!(
        evs.last().map(|s| s.kind()),
        Some(OutcomeKind::Done),
        "{evs:?}"
    );
    assert_eq!(k.get("upstream_throttled"), Some(&1), "{k:?}");
    assert_eq!(k.get("retrying"), Some(&1), "{k:?}");
    assert!(k.get("quota_exhausted").copied().unwrap_or(0) >= 1, "{k:?}");
    assert_eq!(k.get("failed"), None, "{k:?}");
    let stats = p.sim_stats();
    assert_eq!(pages_by_scope(&stats)["US"], vec![1, 2, 3, 4]);
    assert_eq!(stats.key("yt-key").injected, 2);
}
