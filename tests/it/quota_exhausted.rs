//! Promise: when the quota says no, a task stops at once — it never sleeps
//! for the retry-after and frees its worker slot — keeping its cursor; with
//! `on_quota_exhausted = "defer"` it comes back by itself at the retry-after,
//! resumes at the page it stopped at, and waiting for quota never uses up
//! its retry attempts.

use std::time::{Duration, Instant};

use quota_worker::outcome::OutcomeKind;
use quota_worker::quota::{Decision, request_id};
use quota_worker::stats::Stats;
use simulator::Fault;

use crate::support::keys::keys;
use crate::support::machine;
use crate::support::pipeline::{Pipeline, kinds};
use crate::support::upstream::pages_by_scope;
use crate::support::world;
use crate::support::{ConfigBuilder, Job, Sink, Window};

/// `concurrency` slots, the credential's one `window`, and `job`.
fn config(concurrency: u32, window: Window, job: Job) -> ConfigBuilder {
    ConfigBuilder::new()
        .worker(world::quick_worker(concurrency))
        .credential(world::credential(window))
        .endpoint(world::endpoint())
        .job(job)
}

/// The job `name` over `regions`, up to `max_pages` pages of two records.
fn job(sim: &str, name: &str, regions: &[&str], max_pages: u32, on_exhausted: &str) -> Job {
    Job::videos(name, world::ENDPOINT, sim)
        .fan_out("region", regions.iter().copied())
        .on_quota_exhausted(on_exhausted)
        .pages(max_pages)
        .sink(Sink::jsonl("data/{job}.jsonl").records("/items"))
}

/// A window that is full for the next hour: 50 tasks on 2 worker slots all
/// end `quota_exhausted` within seconds. Sleeping until the retry-after
/// (about an hour) would take 25 hours; even one second per task would be 25 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_tasks_on_an_exhausted_window_end_at_once_without_sleeping() {
    let _machine = machine::timing();
    let regions: Vec<String> = (0..50).map(|i| format!("r{i:02}")).collect();
    let regions: Vec<&str> = regions.iter().map(String::as_str).collect();
    let mut p = Pipeline::start(world::sim(3, 2), |sim| {
        config(
            2,
            Window::sliding(5, "1h"),
            job(sim, "flood", &regions, 3, "stop").retry(3, None, None),
        )
    })
    .await;
    // Fill the window: the next hour has no room.
    for _ in 0..5 {
        let d = p
            .limiter
            .spend(world::ENDPOINT, None, &request_id())
            .await
            .expect("spend");
        assert!(d.is_allowed());
    }
    assert!(matches!(
        p.limiter
            .spend(world::ENDPOINT, None, &request_id())
            .await
            .expect("spend"),
        Decision::Rejected(_)
    ));

    let t0 = Instant::now();
    let evs = p.tick("flood", 50, Duration::from_secs(30)).await;
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
    let cursors = p.redis.keys(&keys().cursor("flood", "*"));
    assert_eq!(cursors.len(), 50, "{cursors:?}");
    p.stop().await;
}

/// `defer`: the task stopped at page 3 runs again by itself once the window
/// frees, and fetches page 3 — pages 1 and 2 exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn defer_reruns_at_the_retry_after_and_resumes_at_the_page() {
    let _machine = machine::timing();
    let per = Duration::from_secs(3);
    let mut p = Pipeline::start(world::sim(3, 2), |sim| {
        config(
            2,
            Window::sliding(2, "3s"),
            job(sim, "later", &["US"], 3, "defer").retry(3, None, None),
        )
    })
    .await;
    let evs = p.tick("later", 1, Duration::from_secs(20)).await;
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
    assert_eq!(stats.key(world::SECRET).quota_errors, 0);
    let records = p.sink_records();
    assert_eq!(records.len(), 3 * 2, "3 pages of 2 records");
}

/// Waiting for quota is not a failure: with `attempts = 1`, a task deferred
/// three times (one unit per second, four pages) still ends `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deferrals_never_use_up_retry_attempts() {
    let mut p = Pipeline::start(world::sim(4, 2), |sim| {
        config(
            2,
            Window::sliding(1, "1s"),
            job(sim, "slow", &["US"], 4, "defer").retry(1, None, None),
        )
    })
    .await;
    let evs = p.tick("slow", 1, Duration::from_secs(20)).await;
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
    let mut p = Pipeline::start(world::sim(4, 2), |sim| {
        config(
            2,
            Window::sliding(2, "1s"),
            job(sim, "mixed", &["US"], 4, "defer").retry(2, Some("100ms"), None),
        )
    })
    .await;
    p.sim.inject(
        Fault::TooManyRequests {
            retry_after_secs: 1,
        },
        1,
    );
    p.sim.inject(Fault::Status(503), 1);
    let evs = p.tick("mixed", 1, Duration::from_secs(30)).await;
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
    assert_eq!(stats.key(world::SECRET).injected, 2);
}
