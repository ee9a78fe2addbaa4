//! Promise: end to end — cron ticks fan out into one task per region, every
//! page is paid for before it is fetched, the upstream never sees more units
//! than the window allows (across ticks too), the sink holds exactly the
//! records the upstream served, and a task stopped by the quota is resumed by
//! a later tick at the page it stopped at.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use quota_worker::outcome::OutcomeKind;
use simulator::{SimConfig, VIDEOS};

use crate::support::machine;
use crate::support::pipeline::{self, Pipeline, kinds, sink_ids};
use crate::support::upstream::{pages_by_scope, served_ids};
use crate::support::world;
use crate::support::{ConfigBuilder, Job, Sink, Window};

const REGIONS: [&str; 8] = ["US", "GB", "DE", "FR", "IN", "BR", "AU", "CA"];
/// Our window: 20 units per 4 s, against 24 units a tick (8 regions x 3 pages).
const LIMIT: u64 = 20;
const PER: Duration = Duration::from_secs(4);
/// The simulator timestamps a request on arrival, a little after Redis
/// admitted it: the upstream's own window is this much shorter than ours.
const ARRIVAL_SLACK: Duration = Duration::from_millis(300);

/// Our window against a fan-out of 8 regions × 3 pages, a tick every 3 s:
/// the second tick finds the first one's units still in the window, so a
/// limiter that forgot them (per-tick counting, say) would let the upstream
/// see 40 units in about 3 s.
fn config(sim: &str) -> ConfigBuilder {
    ConfigBuilder::new()
        .worker(world::quick_worker(4))
        .credential(world::credential(Window::sliding(LIMIT, "4s")))
        .endpoint(world::endpoint())
        .job(
            Job::videos("trending", world::ENDPOINT, sim)
                .schedule("*/3 * * * * *")
                .fan_out("region", REGIONS)
                .on_quota_exhausted("stop")
                .pages(3)
                .sink(Sink::jsonl("data/{job}/{region}/{date}.jsonl").records("/items")),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fan_out_runs_out_mid_run_never_overspends_and_resumes_at_the_page() {
    let _machine = machine::timing();
    let sim = SimConfig {
        pages_per_query: 3,
        items_per_page: 5,
        ..SimConfig::default()
    }
    .key(world::SECRET, LIMIT, PER - ARRIVAL_SLACK);
    let mut p = Pipeline::start(sim, config).await;

    // Run ticks until some item stopped mid-run (page >= 2) has been resumed
    // by a later tick and fetched from that page, and three ticks have ended.
    let started = Instant::now();
    let resumed_mid_run = |seen: &[pipeline::Seen]| {
        let mut last: BTreeMap<&str, &pipeline::Seen> = BTreeMap::new();
        let mut resumed = 0;
        for s in seen {
            if let Some(prev) = last.get(s.ev.item.as_str())
                && prev.kind() == OutcomeKind::QuotaExhausted
                && prev.ev.outcome.page >= 2
                && s.ev.outcome.pages > 0
            {
                resumed += 1;
            }
            last.insert(&s.ev.item, s);
        }
        resumed
    };
    let ok = p
        .wait_for(Duration::from_secs(40), |seen| {
            let ticks: std::collections::BTreeSet<i64> = seen.iter().map(|s| s.ev.tick).collect();
            let complete = ticks
                .iter()
                .filter(|t| seen.iter().filter(|s| s.ev.tick == **t).count() == 8)
                .count();
            // Enough ticks to tell a lost cursor from bad luck.
            (complete >= 3 && resumed_mid_run(seen) >= 1) || complete >= 7
        })
        .await;
    p.stop().await;
    let seen = p.seen();
    println!(
        "e2e: {} ticks' outcomes in {:.1}s: {:?}",
        seen.iter()
            .map(|s| s.ev.tick)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        started.elapsed().as_secs_f64(),
        kinds(&seen)
    );

    // Only done and quota_exhausted: nothing failed, nothing throttled.
    for s in &seen {
        assert!(
            matches!(s.kind(), OutcomeKind::Done | OutcomeKind::QuotaExhausted),
            "unexpected outcome {s:?}"
        );
        assert!(s.terminal(), "on_quota_exhausted = stop requeued: {s:?}");
    }
    // The quota ran out mid-run: 20 of a tick's 24 pages fit, and 20 is not a
    // multiple of 3, so some item stopped after fetching a page or two.
    let first_tick = seen.iter().map(|s| s.ev.tick).min().expect("a tick");
    let first: Vec<_> = seen.iter().filter(|s| s.ev.tick == first_tick).collect();
    assert_eq!(first.len(), 8, "one task per region: {first:?}");
    let mut items: Vec<&str> = first.iter().map(|s| s.ev.item.as_str()).collect();
    items.sort();
    let mut want: Vec<String> = REGIONS.iter().map(|r| format!("region={r}")).collect();
    want.sort();
    assert_eq!(items, want);
    let pages: u32 = first.iter().map(|s| s.ev.outcome.pages).sum();
    assert_eq!(
        pages as u64, LIMIT,
        "the first tick fetches exactly the window"
    );
    assert!(
        first
            .iter()
            .any(|s| s.kind() == OutcomeKind::QuotaExhausted && s.ev.outcome.page >= 2),
        "no task stopped mid-run in the first tick: {first:?}"
    );
    for s in first
        .iter()
        .filter(|s| s.kind() == OutcomeKind::QuotaExhausted)
    {
        let ra =
            s.ev.outcome
                .retry_after
                .expect("quota_exhausted has a retry-after");
        assert!(ra > Duration::ZERO && ra <= PER, "retry-after {ra:?}");
    }

    // Cursor kept: each item's run starts where its previous one stopped
    // (page 1 after a done run).
    let mut last: BTreeMap<String, (OutcomeKind, u32)> = BTreeMap::new();
    for s in &seen {
        let expect = match last.get(&s.ev.item) {
            Some((OutcomeKind::QuotaExhausted, page)) => *page,
            _ => 1,
        };
        assert_eq!(
            s.first_page(),
            expect,
            "{} (tick {}) started at page {} instead of {expect}: {:?}",
            s.ev.item,
            s.ev.tick,
            s.first_page(),
            s.ev.outcome
        );
        last.insert(s.ev.item.clone(), (s.kind(), s.ev.outcome.page));
    }

    assert!(
        ok && resumed_mid_run(&seen) >= 1,
        "no item stopped mid-run was resumed by a later tick; outcomes: {:?}",
        seen.iter()
            .map(|s| (s.ev.tick, s.ev.item.clone(), s.kind(), s.ev.outcome.page))
            .collect::<Vec<_>>()
    );

    // What the upstream saw agrees: per region, pages 1, 2, 3, 1, 2, ... in
    // order — a resumed run never refetches a page, never skips one.
    let stats = p.sim_stats();
    for (region, pages) in pages_by_scope(&stats) {
        let mut expect = 1;
        for (i, page) in pages.iter().enumerate() {
            assert_eq!(
                *page, expect,
                "{region}: fetch #{i} was page {page}, expected {expect}; all: {pages:?}"
            );
            expect = if *page == 3 { 1 } else { page + 1 };
        }
    }
    let charged = stats.charges.len() as u64;
    assert_eq!(
        charged,
        seen.iter()
            .map(|s| u64::from(s.ev.outcome.pages))
            .sum::<u64>(),
        "pages the outcomes report = pages the upstream charged"
    );

    // Never more than the window, in any window, across ticks.
    let ks = stats.key(world::SECRET);
    assert_eq!(ks.quota_errors, 0, "the upstream refused a request: {ks:?}");
    let max = stats.max_units_in_any_window(world::SECRET, PER - ARRIVAL_SLACK);
    assert!(
        max <= LIMIT,
        "the upstream saw {max} units in a window of {LIMIT}"
    );

    // The sink holds exactly the fetched records: one line per record served.
    let records = p.sink_records();
    assert_eq!(records.len() as u64, charged * 5, "lines = records served");
    assert_eq!(sink_ids(&records), served_ids(&stats, 5));
    for r in &records {
        assert_eq!(r["job"], "trending");
    }
    assert!(stats.charges.iter().all(|c| c.path == VIDEOS));
}
