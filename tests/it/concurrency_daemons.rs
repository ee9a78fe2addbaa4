//! Promise: a concurrent window caps the requests in flight across every
//! daemon, measured at the upstream — three daemons of `concurrency = 8` each
//! never have more than its units (weighted by cost) in flight at the
//! simulator, which holds every request open; every task ends `done` and
//! `trigger --wait` exits 0, tasks refused for want of a lease coming back by
//! themselves (whatever `on_quota_exhausted` says); and a daemon SIGKILLed
//! while holding leases stops blocking the others once its leases lapse.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use simulator::{CHANNELS, Logged, SimConfig, VIDEOS};

use crate::support::daemon;
use crate::support::keys;
use crate::support::machine;
use crate::support::process::Proc;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world::{self, REGIONS, SECRET};
use crate::support::{
    ConfigBuilder, Endpoint, Job, RedisServer, Request, Sink, TestConfig, Window, Worker,
};

/// Units in flight the credential allows.
const CAP: u64 = 4;
const PAGES: u32 = 3;

/// The simulator: 3 pages per region, videos cost 1, channels cost 2, every
/// answer held open `hold`.
fn upstream(hold: Duration) -> Upstream {
    Upstream::with(
        SimConfig {
            pages_per_query: PAGES,
            items_per_page: 2,
            ..SimConfig::default()
        }
        .key(SECRET, 1_000_000, Duration::from_secs(3600))
        .cost(CHANNELS, 2)
        .hold(hold),
    )
}

/// A job paging `path` per region of `regions`, on `endpoint`.
fn job(name: &str, endpoint: &str, base: &str, path: &str, regions: &[&str]) -> Job {
    Job::new(name, endpoint)
        .request(Request::get(&format!("{base}{path}")).query(&[
            ("regionCode", "{region}"),
            ("maxResults", "50"),
            ("key", "{secret}"),
        ]))
        .sink(Sink::jsonl("data/{job}/{region}.jsonl").records("/items"))
        .fan_out("region", regions.iter().copied())
        .pages(PAGES)
}

/// Credential `sim` with [`CAP`] in flight (`lease`, if given), its
/// endpoints `videos` (cost 1) and `channels` (cost 2), and the jobs
/// `trending` (videos) and `chans` (channels) over every region.
fn config(base: &str, lease: Option<&str>) -> TestConfig {
    let mut inflight = Window::concurrent(CAP);
    if let Some(l) = lease {
        inflight = inflight.lease(l);
    }
    ConfigBuilder::new()
        .worker(Worker::default().concurrency(8).recover_after("3s"))
        .credential(world::credential(world::wide()).window(inflight))
        .endpoint(Endpoint::new("videos", world::CREDENTIAL, 1).timeout("10s"))
        .endpoint(Endpoint::new("channels", world::CREDENTIAL, 2).timeout("10s"))
        .job(job("trending", "videos", base, VIDEOS, &REGIONS))
        .job(job("chans", "channels", base, CHANNELS, &REGIONS))
        .write()
}

/// A request's units at the upstream (its path's cost).
fn units(r: &Logged) -> u64 {
    if r.path == CHANNELS { 2 } else { 1 }
}

/// The most units in flight at once among `requests` (each in flight from
/// when it came in to when it was answered), and when that was first reached.
fn peak(requests: &[&Logged]) -> (u64, Option<DateTime<Utc>>) {
    // Ends before starts at the same instant: back-to-back is not overlap.
    let mut events: Vec<(DateTime<Utc>, i64)> = Vec::new();
    for r in requests {
        events.push((r.received, units(r) as i64));
        events.push((r.time, -(units(r) as i64)));
    }
    events.sort_by_key(|(t, d)| (*t, *d));
    let (mut now, mut best, mut at) = (0i64, 0i64, None);
    for (t, d) in events {
        now += d;
        if now > best {
            (best, at) = (now, Some(t));
        }
    }
    (best as u64, at)
}

/// The credential's concurrent window (its second), as `quota --json`
/// shows it.
fn concurrent_window(cfg: &TestConfig, redis: &RedisServer) -> serde_json::Value {
    let q = cfg.run(
        &["quota", world::CREDENTIAL, "--json"],
        &[("QUOTA_WORKER_REDIS_URL", &redis.url())],
    );
    crate::support::json(&q)["credentials"][0]["windows"][1].clone()
}

/// Every tick outcome hash of `job` in Redis, summed per field.
fn outcomes(redis: &RedisServer, job: &str) -> HashMap<String, i64> {
    let mut sum = HashMap::new();
    for key in redis.keys(&keys::any_tick(|t| keys::keys().tick_outcomes(job, t))) {
        let h: HashMap<String, i64> = redis.cmd(&["HGETALL", &key]);
        for (k, v) in h {
            *sum.entry(k).or_insert(0) += v;
        }
    }
    sum
}

#[test]
fn three_daemons_never_have_more_in_flight_than_the_window_allows() {
    let _machine = machine::timing();
    let redis = RedisServer::start();
    let upstream = upstream(Duration::from_millis(300));
    let cfg = config(&upstream.base_url(), None);
    let (rig, others) = Rig::start_n(redis, cfg, 3, &[]);
    let (redis, cfg, daemon) = (rig.redis, rig.cfg, rig.daemon);
    let mut daemons: Vec<Proc> = std::iter::once(daemon).chain(others).collect();
    // The daemons' own traffic while idle, to tell it from the tasks'.
    let (idle_from, idle_at) = (redis.command_calls().0, Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let idle_rate = (redis.command_calls().0 - idle_from) as f64 / idle_at.elapsed().as_secs_f64();

    // Both jobs at once: 16 tasks, 48 pages, 72 units of requests.
    let (before, started) = (redis.command_calls().0, Instant::now());
    let mut triggers: Vec<Proc> = ["trending", "chans"]
        .iter()
        .map(|j| Proc::sim_cli(j, &cfg, Some(&redis.url()), &["trigger", j, "--wait"], &[]))
        .collect();
    for t in &mut triggers {
        let status = t.wait_exit(Duration::from_secs(180));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "{}: trigger --wait; its output:\n{}",
            t.label,
            t.stdout()
        );
    }
    let took = started.elapsed();
    let spent_commands = redis.command_calls().0 - before;
    // Every request's lease was returned by its settle (a lease left to
    // lapse would still be held: it lasts 15 s).
    let w = concurrent_window(&cfg, &redis);
    assert_eq!(
        (w["used"].as_u64(), w["leases"].as_u64()),
        (Some(0), Some(0)),
        "{w}"
    );

    let stats = upstream.stats();
    let k = stats.key(SECRET);
    assert!(
        k.max_in_flight_units <= CAP,
        "the upstream saw {} units in flight at once (cap {CAP}): {k:?}",
        k.max_in_flight_units
    );
    assert_eq!(
        k.max_in_flight_units, CAP,
        "the daemons used the whole window: {k:?}"
    );
    // The log agrees (and two channels requests never overlapped a third
    // request: weights are respected).
    let all: Vec<&Logged> = stats.requests.iter().collect();
    assert_eq!(peak(&all).0, CAP);
    // Every page once, none refused by the upstream.
    assert_eq!(stats.charges.len(), 2 * REGIONS.len() * PAGES as usize);
    assert!(
        stats.duplicate_pages().is_empty(),
        "{:?}",
        stats.duplicate_pages()
    );
    assert_eq!(
        stats.requests.len(),
        stats.charges.len(),
        "only charged requests"
    );

    // Every task ended done; the ones refused for a lease came back by
    // themselves (the jobs say on_quota_exhausted = "stop").
    let mut requeued = 0;
    for job in ["trending", "chans"] {
        let o = outcomes(&redis, job);
        assert_eq!(o.get("done"), Some(&(REGIONS.len() as i64)), "{job}: {o:?}");
        for kind in daemon::TERMINAL.iter().filter(|k| **k != "done") {
            assert_eq!(o.get(*kind), None, "{job}: {o:?}");
        }
        requeued += o.get("~deferred").copied().unwrap_or(0);
    }
    for d in &daemons {
        for o in d.outcomes() {
            let kind = o["outcome"].as_str().unwrap_or_default();
            assert!(
                kind == "done" || kind == "quota_exhausted",
                "{}: {o}",
                d.label
            );
            if kind == "quota_exhausted" {
                assert!(
                    o["requeued_in_ms"].as_u64().is_some_and(|ms| ms <= 1_000),
                    "{o}"
                );
            }
        }
    }
    // What it cost (measured, not asserted: BENCHMARKS.md-style numbers for
    // the notes): re-queues, and Redis commands per task and per page, the
    // daemons' idle traffic over the same time taken out.
    let tasks = 2 * REGIONS.len() as u64;
    let idle = (idle_rate * took.as_secs_f64()) as u64;
    let work = spent_commands.saturating_sub(idle);
    eprintln!(
        "concurrency: {tasks} tasks, {} pages in {took:?}; {requeued} re-queues for a lease ({:.1} per task); \
         {spent_commands} Redis commands ({idle} of them the daemons' idle traffic at {idle_rate:.0}/s): \
         {:.1} per task, {:.1} per page, {:.1} per re-queue or page",
        stats.charges.len(),
        requeued as f64 / tasks as f64,
        work as f64 / tasks as f64,
        work as f64 / stats.charges.len() as f64,
        work as f64 / (requeued as f64 + stats.charges.len() as f64),
    );
    for d in &mut daemons {
        d.term();
    }
    for d in &mut daemons {
        assert_eq!(
            d.wait_exit(Duration::from_secs(20)).and_then(|s| s.code()),
            Some(0),
            "{}",
            d.label
        );
    }
}

#[test]
fn a_killed_daemons_leases_lapse_and_the_others_reach_full_concurrency() {
    let _machine = machine::timing();
    let redis = RedisServer::start();
    // Answers take 1 s; a lease lasts 3 s unreturned.
    let upstream = upstream(Duration::from_secs(1));
    let cfg = config(&upstream.base_url(), Some("3s"));
    let mut rig = Rig::start(redis, cfg, &[]);
    rig.queue("trending");

    // Killed with the window full of its requests.
    let full =
        crate::support::wait_until(Duration::from_secs(30), || upstream.in_flight().1 == CAP);
    assert!(
        full,
        "the first daemon never had {CAP} in flight: {:?}",
        upstream.in_flight()
    );
    rig.daemon.kill();
    let killed = Utc::now();
    let leases = rig.quota(world::CREDENTIAL)["windows"][1]["leases"].as_u64();
    assert_eq!(leases, Some(CAP), "it died holding its leases");

    let mut others = rig.others(&["daemon-1", "daemon-2"]);
    let redis = &rig.redis;
    // The survivors finish the tick (the dead daemon's tasks recovered).
    let done = crate::support::wait_until(Duration::from_secs(90), || {
        outcomes(redis, "trending").get("done") == Some(&(REGIONS.len() as i64))
    });
    assert!(
        done,
        "the tick did not end: {:?}",
        outcomes(redis, "trending")
    );

    let stats = upstream.stats();
    let after: Vec<&Logged> = stats
        .requests
        .iter()
        .filter(|r| r.received > killed)
        .collect();
    let (peak_after, reached) = peak(&after);
    assert_eq!(peak_after, CAP, "the others used the whole window again");
    let reached = reached.expect("a peak");
    let waited = (reached - killed).to_std().unwrap_or_default();
    // The dead daemon's leases lapse 3 s after they were taken (at most 3 s
    // after the kill); then a refused task comes back within 1 s.
    assert!(
        waited <= Duration::from_secs(3 + 5),
        "full concurrency again {waited:?} after the kill (lease 3 s)"
    );
    assert!(
        stats.key(SECRET).max_in_flight_units <= CAP,
        "{:?}",
        stats.key(SECRET)
    );
    eprintln!("full concurrency again {waited:?} after the kill (lease 3 s)");
    for d in &mut others {
        d.term();
        d.wait_exit(Duration::from_secs(20));
    }
}

/// While requests are in flight, the leases show everywhere an operator
/// looks: `quota --json`, `/metrics` (`qw_window_leases`), `/api/status`
/// and the status page.
#[test]
fn leases_in_flight_show_in_quota_metrics_and_the_status_page() {
    use crate::support::free_port;
    use crate::support::http::{http_get, scrape_until};

    let redis = RedisServer::start();
    // Answers take 4 s: long enough to look at them in flight.
    let upstream = upstream(Duration::from_secs(4));
    let cfg = config(&upstream.base_url(), None);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut rig = Rig::start(redis, cfg, &[("QUOTA_WORKER_METRICS_LISTEN", &listen)]);
    rig.queue("chans");
    let (cfg, redis, d) = (&mut rig.cfg, &mut rig.redis, &mut rig.daemon);
    // Two channels requests (2 units each) fill the window of 4.
    let full =
        crate::support::wait_until(Duration::from_secs(20), || upstream.in_flight() == (2, CAP));
    assert!(full, "{:?}", upstream.in_flight());

    let w = concurrent_window(cfg, redis);
    assert_eq!(
        (w["used"].as_u64(), w["leases"].as_u64()),
        (Some(CAP), Some(2)),
        "{w}"
    );

    let labels = [
        ("credential", world::CREDENTIAL),
        ("scope", "credential"),
        ("window", "4 in flight"),
    ];
    // A daemon serves the gauges it read from Redis for up to a second:
    // wait for a read that sees the leases (they last 4 s).
    let m = scrape_until(port, Duration::from_secs(10), |m| {
        m.sum("qw_window_leases", &labels) == 2.0
    });
    assert_eq!(m.one("qw_window_leases", &labels), 2.0);
    assert_eq!(m.one("qw_window_used_units", &labels), CAP as f64);

    let (status, body) = http_get(port, "/api/status").expect("/api/status");
    assert_eq!(status, 200, "{body}");
    let j: serde_json::Value = serde_json::from_str(&body).expect("json");
    let w = &j["credentials"][0]["windows"][1];
    assert_eq!(w["kind"], "concurrent", "{w}");
    assert_eq!(
        (w["used"].as_u64(), w["leases"].as_u64()),
        (Some(CAP), Some(2)),
        "{w}"
    );
    assert_eq!(w["runs_out"]["state"], "in_flight", "{w}");
    assert!(
        j["credentials"][0]["windows"][0].get("leases").is_none(),
        "only on concurrent windows"
    );

    let (status, page) = http_get(port, "/").expect("status page");
    assert_eq!(status, 200);
    assert!(page.contains("2 requests in flight"), "{page}");
    d.term();
    d.wait_exit(Duration::from_secs(20));
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    three_daemons_never_have_more_in_flight_than_the_window_allows,
    a_killed_daemons_leases_lapse_and_the_others_reach_full_concurrency,
);
