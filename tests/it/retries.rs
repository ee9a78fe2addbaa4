//! Promise: network errors and 5xx are retried with exponential backoff and
//! bounded attempts, then `failed`; units of a request that never reached
//! the upstream are refunded, a 5xx keeps its units (it may have been
//! charged) unless the upstream reports what it really charged.

use std::time::Duration;

use quota_worker::outcome::OutcomeKind;
use simulator::{Fault, SimConfig};

use crate::support::machine;
use crate::support::pipeline::{Pipeline, kinds};
use crate::support::world;
use crate::support::{Endpoint, free_port};

/// The job `flaky` over `regions` against `base` (`None`: the simulator),
/// three attempts 200 ms apart, on the endpoint `endpoint`.
async fn start(
    endpoint: Endpoint,
    base: Option<&str>,
    regions: &[&str],
    sim: SimConfig,
) -> Pipeline {
    let sim = sim.key(world::SECRET, 1000, Duration::from_secs(3600));
    Pipeline::start(sim, |sim| {
        let job = world::one_file_job("flaky", base.unwrap_or(sim), regions.iter().copied());
        world::answering(endpoint, job.retry(3, Some("200ms"), None))
    })
    .await
}

fn sim() -> SimConfig {
    SimConfig {
        pages_per_query: 1,
        items_per_page: 2,
        ..SimConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_errors_are_retried_with_backoff_until_the_fault_clears() {
    let _machine = machine::timing();
    let mut p = start(world::endpoint().timeout("5s"), None, &["US"], sim()).await;
    p.sim.inject(Fault::Status(503), 2);
    let evs = p.tick("flaky", 1, Duration::from_secs(10)).await;
    let k: Vec<_> = evs.iter().map(|s| s.kind()).collect();
    assert_eq!(
        k,
        [
            OutcomeKind::Retrying,
            OutcomeKind::Retrying,
            OutcomeKind::Done
        ],
        "{evs:?}"
    );
    assert_eq!(evs[0].ev.outcome.status, Some(503));
    assert_eq!(
        evs[0].ev.outcome.requeued_in,
        Some(Duration::from_millis(200))
    );
    assert_eq!(
        evs[1].ev.outcome.requeued_in,
        Some(Duration::from_millis(400))
    );
    // The backoff was honoured (and not much more: no heartbeat waits).
    let gap1 = evs[1].at - evs[0].at;
    let gap2 = evs[2].at - evs[1].at;
    assert!(
        gap1 >= Duration::from_millis(180) && gap1 < Duration::from_millis(1500),
        "{gap1:?}"
    );
    assert!(
        gap2 >= Duration::from_millis(380) && gap2 < Duration::from_millis(1700),
        "{gap2:?}"
    );
    // Three requests, three spends: a 5xx may have been charged, so its
    // units stay spent.
    assert_eq!(p.used(world::CREDENTIAL).await, 3);
    let stats = p.sim_stats();
    assert_eq!(
        (stats.key(world::SECRET).injected, stats.charges.len()),
        (2, 1)
    );
    assert_eq!(p.sink_records().len(), 2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attempts_used_up_is_failed_and_server_errors_keep_their_units() {
    let mut p = start(world::endpoint().timeout("5s"), None, &["US"], sim()).await;
    p.sim.inject(Fault::Status(500), 3);
    let tick = p.trigger("flaky").await;
    let evs = p.wait_tick("flaky", tick, 1, Duration::from_secs(10)).await;
    let k: Vec<_> = evs.iter().map(|s| s.kind()).collect();
    assert_eq!(
        k,
        [
            OutcomeKind::Retrying,
            OutcomeKind::Retrying,
            OutcomeKind::Failed
        ],
        "{evs:?}"
    );
    let last = &evs[2].ev.outcome;
    assert_eq!(last.status, Some(500));
    assert!(last.detail.contains("attempts used up"), "{}", last.detail);
    // Nothing more is queued for it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(p.of_tick("flaky", tick).len(), 3);
    assert_eq!(p.used(world::CREDENTIAL).await, 3, "a 5xx keeps its units");
    assert!(p.sim_stats().charges.is_empty());
    p.stop().await;
}

/// Connection refused: the request never left, so every attempt's units are
/// given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unreachable_upstream_refunds_every_attempt() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let mut p = start(
        world::endpoint().timeout("5s"),
        Some(&dead),
        &["US", "GB", "DE"],
        sim(),
    )
    .await;
    let evs = p.tick("flaky", 3, Duration::from_secs(15)).await;
    let k = kinds(&evs);
    assert_eq!(k.get("retrying"), Some(&6), "{evs:?}");
    assert_eq!(k.get("failed"), Some(&3), "{evs:?}");
    for s in &evs {
        assert_eq!(s.ev.outcome.units, 0, "refunded: {s:?}");
        assert!(s.ev.outcome.detail.contains("refunded"), "{s:?}");
    }
    let usage = p.peek(world::CREDENTIAL).await;
    assert_eq!(usage.windows[0].used, 0, "{usage:?}");
    p.stop().await;
}

/// Regression (bug: 5xx units never settled to the reported cost): when the
/// endpoint names a cost header and the upstream reports it charged 0 for
/// its 5xx, the units are given back; a 2xx is settled to what it reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_error_reporting_zero_cost_is_refunded() {
    let mut p = start(
        world::endpoint().timeout("5s").cost_header("x-quota-cost"),
        None,
        &["US"],
        SimConfig {
            cost_header: true,
            ..sim()
        },
    )
    .await;
    p.sim.inject(Fault::Status(503), 3);
    let tick = p.trigger("flaky").await;
    let evs = p.wait_tick("flaky", tick, 1, Duration::from_secs(10)).await;
    assert_eq!(
        evs.last().map(|s| s.kind()),
        Some(OutcomeKind::Failed),
        "{evs:?}"
    );
    assert_eq!(evs.len(), 3);
    for s in &evs {
        assert_eq!(s.ev.outcome.units, 0, "settled to the reported 0: {s:?}");
    }
    assert_eq!(
        p.used(world::CREDENTIAL).await,
        0,
        "the upstream said it charged nothing"
    );

    // A 2xx is settled to its reported cost too (here the configured 1).
    let tick = p.trigger("flaky").await;
    let evs = p.wait_tick("flaky", tick, 1, Duration::from_secs(10)).await;
    assert_eq!(evs[0].kind(), OutcomeKind::Done, "{evs:?}");
    assert_eq!(p.used(world::CREDENTIAL).await, 1);
    p.stop().await;
}

/// A 2xx whose reported cost differs from the configured one is settled to
/// the report: the window holds what the upstream really charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ok_answer_is_settled_to_its_reported_cost() {
    let mut p = start(
        world::endpoint().timeout("5s").cost_header("x-quota-cost"),
        None,
        &["US", "GB"],
        SimConfig {
            cost_header: true,
            ..sim()
        }
        // The upstream charges 3 where we budget 1.
        .cost("/youtube/v3/videos", 3),
    )
    .await;
    let evs = p.tick("flaky", 2, Duration::from_secs(10)).await;
    assert!(evs.iter().all(|s| s.kind() == OutcomeKind::Done), "{evs:?}");
    assert!(evs.iter().all(|s| s.ev.outcome.units == 3), "{evs:?}");
    assert_eq!(p.used(world::CREDENTIAL).await, 6);
    assert_eq!(p.sim_stats().key(world::SECRET).units, 6);
    p.stop().await;
}
