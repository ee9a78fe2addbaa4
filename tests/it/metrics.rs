//! `/metrics` tells the truth: during an end-to-end run of two daemons on one
//! Redis (a job fanning out over four regions, three pages each, against the
//! simulated upstream, the quota running out partway), the counters add up
//! to what the upstream saw, the window gauges equal `quota --json` and are
//! the same on both daemons (read from Redis at scrape time), queue depth and
//! in-flight tasks show tasks stuck on a silent upstream, and the spend
//! latency histogram is there.

use std::time::{Duration, Instant};

use simulator::SimConfig;

use crate::support::http::{self, Metrics, scrape, scrape_until};
use crate::support::process::Proc;
use crate::support::redis_server::free_port_except;
use crate::support::rig::Rig;
use crate::support::upstream::{Blackhole, Upstream};
use crate::support::world;
use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window, Worker, free_port,
    wait_every, wait_until,
};

const KEY: &str = "metrics-sim-key";
const REGIONS: [&str; 4] = ["US", "GB", "DE", "FR"];
const PAGES: u32 = 3;
const ITEMS: u32 = 5;
/// Fewer units than the job needs (4 regions × 3 pages = 12).
const UNITS: u64 = 10;
const TERMINAL: [&str; 5] = [
    "done",
    "quota_exhausted",
    "upstream_throttled",
    "failed",
    "superseded",
];

fn config(upstream: &str, blackhole: &str) -> TestConfig {
    let job = world::videos_job;
    ConfigBuilder::new()
        .worker(Worker::default().concurrency(8).shutdown_timeout("1s"))
        .metrics_listen("127.0.0.1:9464")
        .credential(world::credential(Window::sliding(UNITS, "1h")).secret(KEY))
        .credential(Credential::env("slow", world::KEY_ENV).window(Window::sliding(1000, "1h")))
        .endpoint(world::endpoint())
        .endpoint(Endpoint::new("slow.videos", "slow", 1).timeout("120s"))
        .job(job("trending", world::ENDPOINT, upstream, &REGIONS, PAGES))
        .job(job("stalled", "slow.videos", blackhole, &["XX", "YY"], 1))
        .write()
}

fn terminal_tasks(m: &Metrics, job: &str) -> f64 {
    TERMINAL
        .iter()
        .map(|o| m.sum("qw_tasks_total", &[("qw_job", job), ("outcome", o)]))
        .sum()
}

#[test]
fn metrics_match_what_the_upstream_saw_and_are_consistent_across_daemons() {
    let upstream = Upstream::with(
        SimConfig {
            pages_per_query: PAGES,
            items_per_page: ITEMS,
            ..SimConfig::default()
        }
        .key(KEY, 1_000_000, Duration::from_secs(3600)),
    );
    let blackhole = Blackhole::start();
    let cfg = config(&upstream.base_url(), &blackhole.base_url());
    let ports = [free_port(), 0];
    let ports = [ports[0], free_port_except(&ports)];
    let listen = ports.map(|p| format!("127.0.0.1:{p}"));
    let rig = Rig::start(
        RedisServer::start(),
        cfg,
        &[("QUOTA_WORKER_METRICS_LISTEN", &listen[0])],
    );
    let other = rig.another_with("daemon-1", &[("QUOTA_WORKER_METRICS_LISTEN", &listen[1])]);
    let (redis, cfg) = (&rig.redis, &rig.cfg);
    let before = scrape(ports[0]);
    assert_eq!(
        before.one(
            "qw_window_used_units",
            &[("credential", world::CREDENTIAL), ("scope", "credential")]
        ),
        0.0
    );
    assert_eq!(
        before.one(
            "qw_window_limit_units",
            &[
                ("credential", world::CREDENTIAL),
                ("scope", "credential"),
                ("window", "10/1h")
            ]
        ),
        UNITS as f64
    );

    // Two tasks that hang on a silent upstream: in flight until the end.
    rig.queue("stalled");
    let mut last = None;
    let stuck = wait_until(Duration::from_secs(20), || {
        let m: Vec<Metrics> = ports.iter().map(|p| scrape(*p)).collect();
        let own: f64 = m.iter().map(|m| m.one("qw_tasks_in_flight", &[])).sum();
        let shared: Vec<f64> = m
            .iter()
            .map(|m| m.one("qw_queue_tasks", &[("state", "in_flight")]))
            .collect();
        last = Some((own, shared.clone()));
        own == 2.0 && shared.iter().all(|s| *s == 2.0)
    });
    assert!(
        stuck,
        "two stalled tasks: in flight (sum of qw_tasks_in_flight, qw_queue_tasks{{state=\"in_flight\"}} per daemon) = {last:?}"
    );

    // The real run: 12 pages wanted, 10 units of quota.
    let started = Instant::now();
    rig.queue("trending");
    let ended = wait_until(Duration::from_secs(30), || {
        ports
            .iter()
            .map(|p| terminal_tasks(&scrape(*p), "trending"))
            .sum::<f64>()
            == REGIONS.len() as f64
    });
    assert!(ended, "the trending tasks did not all end within 30 s");
    eprintln!("run took {:?}", started.elapsed());

    // apalis acknowledges a finished task just after its outcome is
    // counted, and a daemon serves the gauges it reads from Redis for up to
    // a second: wait, on both daemons at once, for scrapes whose gauges
    // were read after the run — the window full (read after the run's last
    // spend) with nothing queued or waiting and only the two stalled tasks
    // in flight (so every task of the run had ended when it was read) —
    // and each daemon's own count of its tasks in flight (not cached) down
    // to the stalled two. A cached read from before the run shows the
    // queue's 2 too, but not the window's 10: the run takes less than the
    // second (87 ms), and such a read, taken for "settled", let a check read
    // 3 from a task of the run still unacknowledged (in CI).
    let window = [("credential", world::CREDENTIAL), ("scope", "credential")];
    let after_run = |m: &Metrics| {
        m.sum("qw_window_used_units", &window) == UNITS as f64
            && m.sum("qw_queue_tasks", &[("state", "in_flight")]) == 2.0
            && m.sum("qw_queue_tasks", &[("state", "queued")]) == 0.0
            && m.sum("qw_queue_tasks", &[("state", "backlog")]) == 0.0
    };
    let mut m: Vec<Metrics> = Vec::new();
    let settled = wait_every(Duration::from_secs(20), Duration::from_millis(50), || {
        m = ports.iter().map(|p| scrape(*p)).collect();
        let own: f64 = m.iter().map(|m| m.sum("qw_tasks_in_flight", &[])).sum();
        m.iter().all(after_run) && own == 2.0
    });
    let seen: Vec<(f64, f64, f64)> = (m.iter())
        .map(|m| {
            let q = |s: &str| m.sum("qw_queue_tasks", &[("state", s)]);
            (
                m.sum("qw_window_used_units", &window),
                q("in_flight"),
                m.sum("qw_tasks_in_flight", &[]),
            )
        })
        .collect();
    assert!(
        settled,
        "after the run, per daemon (window used, queue in flight, own in flight): {seen:?}"
    );

    let sim = upstream.stats();
    let key = sim.key(KEY);
    let quota = support::json(&cfg.run_on(redis, &["quota", world::CREDENTIAL, "--json"]));
    let sum =
        |name: &str, want: &[(&str, &str)]| -> f64 { m.iter().map(|m| m.sum(name, want)).sum() };

    // The upstream's view.
    assert_eq!(
        key.units, UNITS,
        "the limiter let exactly the quota through"
    );
    assert_eq!(
        sum(
            "qw_upstream_responses_total",
            &[("endpoint", world::ENDPOINT), ("status", "200")]
        ),
        key.ok as f64,
        "2xx responses counted = 2xx the upstream sent"
    );
    assert_eq!(
        sum(
            "qw_upstream_responses_total",
            &[("endpoint", world::ENDPOINT)]
        ),
        key.ok as f64,
        "no other statuses were seen"
    );
    assert_eq!(
        sum(
            "qw_units_spent_total",
            &[
                ("credential", world::CREDENTIAL),
                ("endpoint", world::ENDPOINT)
            ]
        ),
        key.units as f64,
        "units spent = units the upstream charged"
    );
    assert_eq!(
        sum(
            "qw_spends_total",
            &[
                ("credential", world::CREDENTIAL),
                ("endpoint", world::ENDPOINT),
                ("result", "allowed")
            ]
        ),
        key.ok as f64
    );
    assert_eq!(
        sum("qw_pages_total", &[("qw_job", "trending")]),
        key.ok as f64
    );
    assert_eq!(
        sum("qw_records_total", &[("qw_job", "trending")]),
        (key.ok * u64::from(ITEMS)) as f64
    );

    // Outcomes: quota ran out partway; each exhausted task had one rejected spend.
    let exhausted = sum(
        "qw_tasks_total",
        &[("qw_job", "trending"), ("outcome", "quota_exhausted")],
    );
    let done = sum(
        "qw_tasks_total",
        &[("qw_job", "trending"), ("outcome", "done")],
    );
    assert!(exhausted > 0.0, "some tasks ended quota_exhausted");
    assert_eq!(exhausted + done, REGIONS.len() as f64);
    assert_eq!(
        sum(
            "qw_spends_total",
            &[("endpoint", world::ENDPOINT), ("result", "rejected")]
        ),
        exhausted
    );

    // The latency histogram: every spend is in it, on the daemon that made it.
    let spends = sum("qw_spends_total", &[]);
    assert!(
        m.iter().any(|mm| !mm
            .select(
                "qw_spend_duration_seconds_bucket",
                &[("endpoint", world::ENDPOINT)]
            )
            .is_empty()),
        "the spend latency histogram has buckets"
    );
    for mm in &m {
        for ep in [world::ENDPOINT, "slow.videos"] {
            let made = mm.sum("qw_spends_total", &[("endpoint", ep)]);
            let timed = mm.sum("qw_spend_duration_seconds_count", &[("endpoint", ep)]);
            let inf = mm.sum(
                "qw_spend_duration_seconds_bucket",
                &[("endpoint", ep), ("le", "+Inf")],
            );
            assert_eq!((timed, inf), (made, made), "{ep}:\n{}", mm.text);
            if made > 0.0 {
                assert!(
                    mm.text
                        .contains("# TYPE qw_spend_duration_seconds histogram")
                );
            }
        }
    }
    assert_eq!(sum("qw_spend_duration_seconds_count", &[]), spends);
    assert!(
        spends >= 10.0 + 2.0 + 1.0,
        "allowed + stalled + rejected spends"
    );

    // Every metric says what it is.
    for mm in &m {
        assert_eq!(mm.one("qw_redis_up", &[]), 1.0);
        for line in mm.text.lines().filter(|l| l.starts_with("# TYPE qw_")) {
            let name = line.split_whitespace().nth(2).expect("a name");
            assert!(
                mm.text.contains(&format!("# HELP {name} ")),
                "{name} has no # HELP line"
            );
        }
    }

    // The windows, as `quota --json` reads them, on both daemons alike.
    let window = &quota["credentials"][0]["windows"][0];
    let used = window["used"].as_f64().expect("used");
    let remaining = window["remaining"].as_f64().expect("remaining");
    assert_eq!(used, UNITS as f64);
    let labels = [
        ("credential", world::CREDENTIAL),
        ("scope", "credential"),
        ("window", "10/1h"),
    ];
    for mm in &m {
        assert_eq!(
            mm.one("qw_window_used_units", &labels),
            used,
            "used units:\n{}",
            mm.text
        );
        assert_eq!(mm.one("qw_window_remaining_units", &labels), remaining);
        assert_eq!(mm.one("qw_window_limit_units", &labels), UNITS as f64);
        let frees = mm.one("qw_window_frees_in_seconds", &labels);
        let want = window["frees_in_ms"].as_f64().expect("frees_in_ms") / 1000.0;
        assert!(
            frees > 0.0 && frees <= 3600.0 && (frees - want).abs() < 5.0,
            "frees in {frees} s, quota says {want} s"
        );
        assert_eq!(
            mm.one(
                "qw_credential_blocked_seconds",
                &[("credential", world::CREDENTIAL)]
            ),
            0.0
        );
        // The stalled job's credential: 2 units spent, 2 tasks in flight.
        assert_eq!(
            mm.one(
                "qw_window_used_units",
                &[("credential", "slow"), ("scope", "credential")]
            ),
            2.0
        );
        assert_eq!(mm.one("qw_queue_tasks", &[("state", "in_flight")]), 2.0);
        assert_eq!(mm.one("qw_queue_tasks", &[("state", "backlog")]), 0.0);
        assert_eq!(mm.one("qw_queue_tasks", &[("state", "queued")]), 0.0);
    }
    let own_in_flight: f64 = m.iter().map(|mm| mm.one("qw_tasks_in_flight", &[])).sum();
    assert_eq!(own_in_flight, 2.0);

    // Both daemons worked on the shared run (or at least neither lost count):
    // each one's counters are its own, and only their sum matches upstream.
    eprintln!(
        "units spent per daemon: {:?}; upstream charged {}",
        m.iter()
            .map(|mm| mm.sum("qw_units_spent_total", &[("credential", world::CREDENTIAL)]))
            .collect::<Vec<_>>(),
        key.units
    );

    // A spend from another process shows on both once their gauges are
    // read again (at most a second later).
    let s = cfg.run_on(redis, &["spend", "slow.videos", "--cost", "5"]);
    assert_eq!(s.status.code(), Some(0), "{s:?}");
    let slow = [("credential", "slow"), ("scope", "credential")];
    for p in ports {
        let m = scrape_until(p, Duration::from_secs(10), |m| {
            m.sum("qw_window_used_units", &slow) == 7.0
        });
        assert_eq!(m.one("qw_window_used_units", &slow), 7.0);
    }
    drop(other);
}

/// A command's argument that [`PeekCounter::sync`] waits to see.
const MARKER: &str = "qw-test-monitor-marker";

/// Counts the `spend.lua` peeks Redis runs (`MONITOR`), from a thread.
struct PeekCounter {
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// [`MARKER`] commands seen.
    marks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PeekCounter {
    fn start(port: u16) -> PeekCounter {
        use std::io::{BufRead, Write};
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let count = std::sync::Arc::new(AtomicUsize::new(0));
        let marks = std::sync::Arc::new(AtomicUsize::new(0));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("monitor");
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s.write_all(b"MONITOR\r\n").unwrap();
        let mut r = std::io::BufReader::new(s);
        let mut first = String::new();
        r.read_line(&mut first).expect("MONITOR answers");
        assert!(first.starts_with("+OK"), "{first}");
        let thread = std::thread::spawn({
            let (count, marks, stop) = (count.clone(), marks.clone(), stop.clone());
            move || {
                let mut line = String::new();
                while !stop.load(Ordering::SeqCst) {
                    match r.read_line(&mut line) {
                        Ok(0) => return,
                        Ok(_) if line.ends_with('\n') => {
                            if line.contains("\"peek\"") {
                                count.fetch_add(1, Ordering::SeqCst);
                            }
                            if line.contains(MARKER) {
                                marks.fetch_add(1, Ordering::SeqCst);
                            }
                            line.clear();
                        }
                        // A timeout mid-line keeps what was read.
                        _ => {}
                    }
                }
            }
        });
        PeekCounter {
            count,
            marks,
            stop,
            thread: Some(thread),
        }
    }

    fn get(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sends [`MARKER`] and waits until MONITOR shows it: Redis sends
    /// MONITOR lines in the order it runs commands, so every command before
    /// it has been counted.
    fn sync(&self, redis: &RedisServer) {
        let seen = self.marks.load(std::sync::atomic::Ordering::SeqCst);
        let _: String = redis.cmd(&["ECHO", MARKER]);
        assert!(
            wait_until(Duration::from_secs(10), || {
                self.marks.load(std::sync::atomic::Ordering::SeqCst) > seen
            }),
            "MONITOR did not show {MARKER}"
        );
    }
}

impl Drop for PeekCounter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Issue 9 (low): every scrape ran one script per credential, so 820
/// scrapes/s took ~80% of Redis. The gauges read from Redis are now reused
/// for a second, and scrapes arriving while they are read wait for that read
/// (one flight, not one per scrape); after the second, a scrape reads fresh
/// numbers again.
#[test]
fn concurrent_scrapes_read_each_credential_at_most_once_a_second() {
    let creds = ["a", "b", "c"];
    let mut builder = ConfigBuilder::new().job(world::videos_job(
        "idle",
        "a.videos",
        "http://127.0.0.1:9",
        &["US"],
        1,
    ));
    for c in creds {
        builder = builder
            .credential(Credential::env(c, world::KEY_ENV).window(Window::sliding(100, "1h")))
            .endpoint(Endpoint::new(&format!("{c}.videos"), c, 1));
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let rig = Rig::start(
        RedisServer::start(),
        builder.write(),
        &[
            ("QUOTA_WORKER_METRICS_LISTEN", &listen),
            (world::KEY_ENV, KEY),
        ],
    );
    let (redis, cfg, port) = (&rig.redis, &rig.cfg, rig.listener());
    // A first scrape loads the spend script (an idle daemon has not run it:
    // it no longer polls), so that no EVALSHA answered NOSCRIPT and sent
    // again as EVAL counts twice below.
    assert!(matches!(http::http_get(port, "/metrics"), Some((200, _))));
    let peeks = PeekCounter::start(redis.port());
    // About time: past the second the first scrape's gauges are served for.
    std::thread::sleep(Duration::from_millis(1_200));

    const ROUNDS: usize = 3;
    const AT_ONCE: usize = 40;
    let before = peeks.get();
    let started = Instant::now();
    for round in 0..ROUNDS {
        if round > 0 {
            // About time: past the second the round before's gauges are
            // served for.
            std::thread::sleep(Duration::from_millis(1_100));
        }
        let scrapers: Vec<_> = (0..AT_ONCE)
            .map(|_| std::thread::spawn(move || http::http_get(port, "/metrics")))
            .collect();
        for s in scrapers {
            let got = s.join().expect("scraper");
            assert!(matches!(got, Some((200, _))), "{got:?}");
        }
    }
    let span = started.elapsed();
    // MONITOR lines trail the commands a little: every one is in once a
    // command sent after them is.
    peeks.sync(redis);
    let reads = peeks.get() - before;
    // Reads are a second apart at least: within `span`, at most
    // span/1s + 1 per credential; and each round after a pause reads once.
    let most = creds.len() * (span.as_secs() as usize + 1);
    eprintln!(
        "MEASURE {} scrapes in {ROUNDS} rounds of {AT_ONCE} at once over {span:?}: {reads} peeks for {} credentials (at most {most})",
        ROUNDS * AT_ONCE,
        creds.len()
    );
    assert!(
        reads >= creds.len() * ROUNDS && reads <= most,
        "{reads} peeks for {} scrapes of {} credentials over {span:?}",
        ROUNDS * AT_ONCE,
        creds.len()
    );

    // Fresh again after the second: a spend shows up (within 1.1 s).
    let spend = cfg.run_on(redis, &["spend", "b.videos"]);
    assert_eq!(spend.status.code(), Some(0), "{spend:?}");
    let used = || {
        scrape(port).one(
            "qw_window_used_units",
            &[("credential", "b"), ("scope", "credential")],
        )
    };
    support::wait_every(
        Duration::from_millis(1_100),
        Duration::from_millis(50),
        || used() == 1.0,
    );
    assert_eq!(used(), 1.0);
}

/// Issue 9 (low): `/metrics` has no authentication, so listening beyond
/// loopback is said at start (and by `check`). The test binds nothing but
/// loopback: it holds the port on 127.0.0.1, so the daemon's bind of
/// 0.0.0.0 fails after the warning (exit 78).
#[test]
fn metrics_listening_beyond_loopback_is_warned_about() {
    let cfg = ConfigBuilder::new()
        .metrics_listen("0.0.0.0:9464")
        .credential(Credential::env("a", world::KEY_ENV).window(Window::sliding(100, "1h")))
        .endpoint(Endpoint::new("a.videos", "a", 1))
        .job(world::videos_job(
            "idle",
            "a.videos",
            "http://127.0.0.1:9",
            &["US"],
            1,
        ))
        .write();
    let out = cfg.run(&["check"], &[(world::KEY_ENV, KEY)]);
    let text = support::stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.lines().any(
            |l| l.starts_with("warning: [metrics] listen = \"0.0.0.0:9464\"")
                && l.contains("without authentication")
        ),
        "{text}"
    );

    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().unwrap().port();
    let listen = format!("0.0.0.0:{port}");
    let mut d = Proc::start(
        "daemon",
        &cfg,
        &["run"],
        &[
            ("QUOTA_WORKER_REDIS_URL", "redis://127.0.0.1:9/0"),
            ("QUOTA_WORKER_METRICS_LISTEN", listen.as_str()),
            (world::KEY_ENV, KEY),
        ],
    );
    let status = d.wait_exit(Duration::from_secs(15));
    assert_eq!(status.and_then(|s| s.code()), Some(78), "{}", d.log());
    let log = d.log();
    let warned = log
        .lines()
        .find(|l| l.contains("without authentication"))
        .unwrap_or_else(|| panic!("no warning:\n{log}"));
    assert!(
        warned.contains(&listen) && warned.contains("WARN"),
        "{warned}"
    );
    drop(held);
}
