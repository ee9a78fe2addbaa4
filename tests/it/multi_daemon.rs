//! Promise: several daemons on one config and one Redis fan each cron tick out
//! exactly once, and every (tick, item, page) is fetched exactly once — the
//! real binary, three processes, a real redis-server and the simulated
//! upstream over loopback.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::daemon::{self, sink_records, tick_claims};
use crate::support::machine;
use crate::support::process::Proc;
use crate::support::rig::Rig;
use crate::support::upstream::{Upstream, page_counts};
use crate::support::world::{JOB, REGIONS};
use crate::support::{RedisServer, holds_for, wait_until};

const PAGES: u32 = 3;
const ITEMS_PER_PAGE: u32 = 2;
const TICKS: u32 = 5;

#[test]
fn three_daemons_fan_each_tick_out_once_and_fetch_each_page_once() {
    let _machine = machine::timing();
    // Five ticks 2 s apart at known times: the test knows exactly which
    // ticks exist, so "exactly once" can be checked, not just "at most".
    let ((rig, others, upstream), ticks) =
        daemon::start_before_first_tick(TICKS, 2, Duration::from_secs(4), |schedule| {
            let upstream = Upstream::start(PAGES, ITEMS_PER_PAGE);
            let cfg = daemon::on_ticks(&upstream.base_url(), PAGES, &schedule);
            let (rig, others) = Rig::start_n(RedisServer::start(), cfg, 3, &[]);
            (rig, others, upstream)
        });
    let daemons: Vec<&Proc> = std::iter::once(&rig.daemon).chain(&others).collect();
    let now = chrono::Utc::now().timestamp_millis();
    assert!(
        now < ticks[0],
        "the daemons took too long to start: the first tick is already past"
    );

    let mut conn = rig.conn();
    let last = *ticks.last().expect("ticks");
    let wait = Duration::from_millis((last - now).max(0) as u64) + Duration::from_secs(20);
    let outcomes = rig.wait_ticks(&ticks, REGIONS.len() as i64, wait);
    let expected: HashMap<String, i64> = [("#items", 8), ("done", 8)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    // A quiet period, in which a tick claimed again or a task run twice
    // would show.
    let quiet = holds_for(Duration::from_secs(1), || {
        let claims = tick_claims(&mut conn);
        claims.len() == ticks.len()
            && (ticks.iter()).all(|t| daemon::tick_outcomes(&mut conn, *t) == expected)
    });
    assert!(
        quiet,
        "after every tick ended: claims {:?}, outcomes {:?}",
        tick_claims(&mut conn),
        (ticks.iter())
            .map(|t| daemon::tick_outcomes(&mut conn, *t))
            .collect::<Vec<_>>()
    );

    // Each tick fanned out exactly once: one claim per tick, nothing else.
    let claims = tick_claims(&mut conn);
    let claimed: BTreeMap<i64, String> = claims.clone().into_iter().collect();
    assert_eq!(
        claimed.keys().copied().collect::<Vec<_>>(),
        ticks,
        "claims: {claimed:?}"
    );
    for (tick, o) in &outcomes {
        let now: HashMap<String, i64> = daemon::tick_outcomes(&mut conn, *tick);
        assert_eq!(now, expected, "tick {tick}: outcome hash {o:?} -> {now:?}");
    }

    // Every task ran (ended) exactly once, across the three processes.
    let mut ran: HashMap<(i64, String), usize> = HashMap::new();
    let mut per_daemon = Vec::new();
    // The outcome lines reach the daemons' logs after Redis's records.
    let tasks = TICKS as usize * REGIONS.len();
    wait_until(Duration::from_secs(10), || {
        daemons.iter().map(|d| d.outcomes().len()).sum::<usize>() >= tasks
    });
    for d in &daemons {
        let outs = d.outcomes();
        per_daemon.push((d.label.clone(), outs.len()));
        for o in outs {
            assert_eq!(o["outcome"], "done", "{}: {o}", d.label);
            assert_eq!(o["pages"], PAGES, "{}: {o}", d.label);
            let tick = o["tick"].as_i64().expect("tick");
            let item = o["item"].as_str().expect("item").to_owned();
            *ran.entry((tick, item)).or_insert(0) += 1;
        }
    }
    let expected_tasks: HashSet<(i64, String)> = ticks
        .iter()
        .flat_map(|t| REGIONS.iter().map(move |r| (*t, format!("region={r}"))))
        .collect();
    assert_eq!(
        ran.keys().cloned().collect::<HashSet<_>>(),
        expected_tasks,
        "tasks run"
    );
    let twice: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "tasks run more than once: {twice:?}");
    assert_eq!(ran.len(), (TICKS as usize) * REGIONS.len());

    // The upstream saw every page of every region once per tick, and no more.
    let stats = upstream.stats();
    assert_eq!(
        stats.charges.len(),
        (TICKS * PAGES) as usize * REGIONS.len(),
        "pages fetched"
    );
    let counts = page_counts(&stats);
    assert_eq!(counts.len(), PAGES as usize * REGIONS.len());
    for (page, n) in &counts {
        assert_eq!(*n, TICKS as usize, "{page:?} fetched {n} times");
    }
    // And within each tick: charges between a tick and the next belong to it
    // (a tick's 24 pages take milliseconds, ticks are 2 s apart).
    let mut per_tick: BTreeMap<i64, Vec<(String, Option<String>)>> = BTreeMap::new();
    for c in &stats.charges {
        let at = c.time.timestamp_millis();
        let tick = ticks
            .iter()
            .rev()
            .find(|t| **t <= at)
            .unwrap_or_else(|| panic!("a page fetched at {at}, before the first tick"));
        per_tick
            .entry(*tick)
            .or_default()
            .push((c.scope.clone(), c.page_token.clone()));
    }
    for (tick, pages) in &per_tick {
        let distinct: HashSet<_> = pages.iter().collect();
        assert_eq!(
            distinct.len(),
            pages.len(),
            "tick {tick}: a page fetched twice: {pages:?}"
        );
        assert_eq!(pages.len(), (PAGES as usize) * REGIONS.len(), "tick {tick}");
    }

    // The sink holds each page's records once per tick.
    let records = sink_records(&rig.cfg);
    assert_eq!(
        records.len(),
        (TICKS * PAGES * ITEMS_PER_PAGE) as usize * REGIONS.len()
    );
    let mut by_id: HashMap<(String, String), usize> = HashMap::new();
    for r in records {
        *by_id.entry(r).or_insert(0) += 1;
    }
    assert!(by_id.values().all(|n| *n == TICKS as usize), "{by_id:?}");

    // All three are still up, and stop cleanly.
    let daemon = rig.daemon;
    let mut daemons: Vec<Proc> = std::iter::once(daemon).chain(others).collect();
    for d in &mut daemons {
        assert!(d.running(), "{} died", d.label);
        d.term();
    }
    let t = Instant::now();
    for d in &mut daemons {
        let status = d.wait_exit(Duration::from_secs(15));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{} exit", d.label);
    }
    let winners: HashSet<&String> = claims.values().collect();
    eprintln!(
        "{TICKS} ticks of {JOB}: claimed by {} distinct daemon(s); outcomes per daemon {per_daemon:?}; all stopped in {:?}",
        winners.len(),
        t.elapsed()
    );
}
