//! Promise (SPEC Part 4, "Redis that fails over"): the daemon follows the
//! Redis master. Through Sentinel (`[redis] sentinels`), a `SENTINEL
//! FAILOVER` or a SIGKILLed master mid-tick loses no item of the tick, fans
//! no tick out twice (`queue_replicas = 1`), never restarts a daemon, and
//! `/readyz` is back to 200 within 30 s of the promotion. With a plain
//! `url`, a master demoted under the daemon makes it unready (503) and it
//! carries on once the server is promoted back; a managed Redis's name that
//! moves to the new primary (a TCP proxy here) is followed: the connection
//! left on the demoted old primary is dropped on READONLY and made again
//! through the same name.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::support::daemon::{self, tick_claims, tick_outcomes, wait_ticks_ended};
use crate::support::http::{self, http_get};
use crate::support::keys::keys;
use crate::support::machine;
use crate::support::process::{Proc, run_cli};
use crate::support::proxy::Proxy;
use crate::support::redis_server::redis_conn;
use crate::support::sentinel::{Failover, MASTER_NAME};
use crate::support::upstream::Upstream;
use crate::support::world::{self, JOB, REGIONS};
use crate::support::{ConfigBuilder, RedisServer, TestConfig, free_port, wait_until};

const PAGES: u32 = 3;
const ITEMS: i64 = REGIONS.len() as i64;
/// How long the simulator holds each answer: a tick of 8 items × 3 pages on
/// two daemons of two slots each lasts a few seconds, long enough to fail
/// over in its middle.
const HOLD: Duration = Duration::from_millis(400);

/// The `/readyz` status of the daemon whose metrics listen on `port`.
fn readyz(port: u16) -> Option<u16> {
    http_get(port, "/readyz").map(|r| r.0)
}

/// A daemon on `cfg` with its metrics on a port of its own.
fn daemon(label: &str, cfg: &TestConfig, redis_url: Option<&str>) -> (Proc, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = Proc::daemon(
        label,
        cfg,
        redis_url,
        &[("QUOTA_WORKER_METRICS_LISTEN", &listen)],
    );
    (d, port)
}

/// Waits up to `timeout` until every port's `/readyz` says `status`; how
/// long it took.
fn wait_readyz(ports: &[u16], status: u16, timeout: Duration) -> Option<Duration> {
    let t = Instant::now();
    wait_until(timeout, || ports.iter().all(|p| readyz(*p) == Some(status))).then(|| t.elapsed())
}

/// Worker restarts (not process restarts) a daemon logged, for the record.
fn worker_restarts(d: &Proc) -> usize {
    d.messages("worker stopped on an error; restarting").len()
        + d.messages("worker stopped; restarting").len()
}

/// A replica `replica` of `master`, in sync.
fn replica_of(master: &RedisServer) -> RedisServer {
    let r = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
    let synced = wait_until(Duration::from_secs(20), || {
        r.try_cmd::<String>(&["INFO", "replication"])
            .is_some_and(|i| i.contains("master_link_status:up"))
    });
    assert!(synced, "the replica did not sync:\n{}", r.log());
    r
}

/// `server REPLICAOF NO ONE` or `REPLICAOF 127.0.0.1 <of>`.
fn replicaof(server: &RedisServer, of: Option<&RedisServer>) {
    match of {
        None => server.cmd::<String>(&["REPLICAOF", "NO", "ONE"]),
        Some(m) => server.cmd::<String>(&["REPLICAOF", "127.0.0.1", &m.port().to_string()]),
    };
}

/// The one tick `trigger` queued (its claim), read from `server`.
fn the_tick(server: &RedisServer) -> i64 {
    let claims = tick_claims(&mut redis_conn(&server.url()));
    assert_eq!(claims.len(), 1, "one tick: {claims:?}");
    *claims.keys().next().expect("a tick")
}

/// The world's job, 3 pages of 2 items a region, on `upstream`.
fn config(upstream: &Upstream) -> ConfigBuilder {
    world::config(world::job(&upstream.base_url()).pages(PAGES))
        .worker(world::quick_worker(2).recover_after("6s"))
}

fn slow_upstream() -> Upstream {
    Upstream::with(world::sim(PAGES, 2).hold(HOLD))
}

#[test]
fn a_master_demoted_under_a_daemon_with_a_plain_url_is_503_until_promoted_back_then_it_carries_on()
{
    let _machine = machine::timing();
    let a = RedisServer::start();
    let b = replica_of(&a);
    let upstream = slow_upstream();
    let cfg = config(&upstream).write();
    let (mut d, port) = daemon("daemon", &cfg, Some(&a.url()));
    d.wait_running(Duration::from_secs(20));
    assert!(wait_readyz(&[port], 200, Duration::from_secs(20)).is_some());

    let (code, _, err) = run_cli(
        &cfg,
        Some(&a.url()),
        &["trigger", JOB],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "trigger: {err}");
    assert!(wait_until(Duration::from_secs(20), || upstream.fetched() >= 2));

    // A failover by hand: the replica is promoted and the old master
    // follows it, as an old master that comes back does.
    let fetched_before = upstream.fetched();
    replicaof(&b, None);
    replicaof(&a, Some(&b));
    let unready = wait_readyz(&[port], 503, Duration::from_secs(10));
    let unready = unready.unwrap_or_else(|| {
        panic!(
            "503 once demoted: {:?}\n{}",
            http_get(port, "/readyz"),
            d.log()
        )
    });
    let body = http_get(port, "/readyz").map(|r| r.1).unwrap_or_default();
    // It stays unready, and up, while its Redis is a replica.
    let meanwhile = Instant::now() + Duration::from_secs(4);
    while Instant::now() < meanwhile {
        assert_eq!(
            readyz(port),
            Some(503),
            "503 while the url's Redis is a replica"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(d.running(), "the daemon does not exit on a demoted master");
    let fetched_while_demoted = upstream.fetched() - fetched_before;

    // Promoted back: it carries on without a restart.
    let promoted = Instant::now();
    replicaof(&a, None);
    replicaof(&b, Some(&a));
    let ready = wait_readyz(&[port], 200, Duration::from_secs(30));
    let ready = ready.unwrap_or_else(|| panic!("200 within 30 s of the promotion\n{}", d.log()));
    let tick = the_tick(&a);
    let (ok, outcomes) = wait_ticks_ended(
        &mut redis_conn(&a.url()),
        &[tick],
        ITEMS,
        Duration::from_secs(60),
    );
    assert!(ok, "every item of the tick ends: {outcomes:?}\n{}", d.log());
    let done_after = promoted.elapsed();
    assert_eq!(
        tick_outcomes(&mut redis_conn(&a.url()), tick).get("done"),
        Some(&ITEMS)
    );
    assert!(d.running(), "never restarted");
    let m = http::scrape(port);
    let readonly = m.one("qw_redis_reconnects_total", &[("reason", "readonly")])
        + m.one("qw_redis_reconnects_total", &[("reason", "demoted")]);
    assert!(
        readonly >= 1.0,
        "the demotion dropped a connection: {readonly}"
    );
    eprintln!(
        "demoted: /readyz 503 after {unready:?} ({}), {fetched_while_demoted} pages fetched meanwhile (requests in flight); promoted back: 200 after {ready:?}, all {ITEMS} items done {:?} after the promotion; worker restarts {}",
        body.trim(),
        done_after,
        worker_restarts(&d)
    );
    d.term();
    assert_eq!(
        d.wait_exit(Duration::from_secs(15)).and_then(|s| s.code()),
        Some(0)
    );
}

#[test]
fn a_managed_redis_name_that_moves_is_followed_and_no_task_is_lost() {
    let _machine = machine::timing();
    let x = RedisServer::start();
    let y = replica_of(&x);
    // The name the daemon is given: new connections reach whichever server
    // the proxy points at; old ones stay piped where they were made.
    let name = Proxy::start(x.port());
    let upstream = slow_upstream();
    let cfg = config(&upstream).write();
    let (mut d, port) = daemon("daemon", &cfg, Some(&name.url()));
    d.wait_running(Duration::from_secs(20));
    assert!(wait_readyz(&[port], 200, Duration::from_secs(20)).is_some());
    let (code, _, err) = run_cli(
        &cfg,
        Some(&name.url()),
        &["trigger", JOB],
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(0), "trigger: {err}");
    assert!(wait_until(Duration::from_secs(20), || upstream.fetched() >= 2));

    // The managed failover: the replica is promoted, the name moves to
    // it, and the old primary comes back as its replica.
    let switched = Instant::now();
    replicaof(&y, None);
    name.point_at(y.port());
    replicaof(&x, Some(&y));

    let tick = the_tick(&y);
    let (ok, outcomes) = wait_ticks_ended(
        &mut redis_conn(&y.url()),
        &[tick],
        ITEMS,
        Duration::from_secs(60),
    );
    assert!(
        ok,
        "every item of the tick ends on the new primary: {outcomes:?}\n{}",
        d.log()
    );
    assert_eq!(
        tick_outcomes(&mut redis_conn(&y.url()), tick).get("done"),
        Some(&ITEMS),
        "no task lost"
    );
    let done_after = switched.elapsed();
    assert!(wait_readyz(&[port], 200, Duration::from_secs(30)).is_some());
    assert!(d.running(), "never restarted");
    let m = http::scrape(port);
    let dropped = m.one("qw_redis_reconnects_total", &[("reason", "readonly")])
        + m.one("qw_redis_reconnects_total", &[("reason", "demoted")]);
    assert!(
        dropped >= 1.0,
        "the connection left on the old primary was dropped: {dropped}\n{}",
        d.log()
    );
    // It works through the name afterwards: a new tick runs to its end.
    let (code, out, err) = run_cli(
        &cfg,
        Some(&name.url()),
        &["trigger", JOB, "--wait"],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0), "a tick after the switch: {out}{err}");
    eprintln!(
        "managed name moved: every item done {done_after:?} after the switch; connections dropped on READONLY: {dropped}; worker restarts {}",
        worker_restarts(&d)
    );
}

/// Two daemons through the sentinels, on one cron tick 2 s apart from
/// nothing, `queue_replicas = 1`.
struct Rig {
    failover: Failover,
    _cfg: TestConfig,
    upstream: Upstream,
    daemons: Vec<(Proc, u16)>,
    tick: i64,
}

impl Rig {
    fn start() -> Rig {
        let ((failover, cfg, upstream, daemons), ticks) =
            daemon::start_before_first_tick(1, 2, Duration::from_secs(8), |schedule| {
                let failover = Failover::start();
                let upstream = slow_upstream();
                let cfg = world::config(
                    world::job(&upstream.base_url())
                        .pages(PAGES)
                        .schedule(&schedule),
                )
                .worker(world::quick_worker(2).recover_after("6s"))
                .sentinels(failover.sentinel_urls(), MASTER_NAME)
                .queue_replicas(1)
                .write();
                let mut daemons: Vec<(Proc, u16)> = (0..2)
                    .map(|i| daemon(&format!("daemon-{i}"), &cfg, None))
                    .collect();
                for (d, _) in &mut daemons {
                    d.wait_running(Duration::from_secs(20));
                }
                (failover, cfg, upstream, daemons)
            });
        Rig {
            failover,
            _cfg: cfg,
            upstream,
            daemons,
            tick: ticks[0],
        }
    }

    fn ports(&self) -> Vec<u16> {
        self.daemons.iter().map(|(_, p)| *p).collect()
    }

    /// Waits until the tick is under way: some pages fetched, not all.
    fn wait_mid_tick(&self) {
        let started = wait_until(Duration::from_secs(30), || self.upstream.fetched() >= 3);
        assert!(started, "the tick did not start");
        assert!(
            self.upstream.fetched() < (ITEMS as usize) * PAGES as usize,
            "the tick ended before the failover"
        );
    }

    /// After the failover to the server on `master`: every item of the
    /// tick ends `done`, the tick was claimed and fanned out once, both
    /// daemons run and are ready.
    fn check(&mut self, what: &str, promoted_at: Instant, master: u16) {
        let ready = wait_readyz(&self.ports(), 200, Duration::from_secs(30));
        let ready = ready.unwrap_or_else(|| {
            panic!(
                "{what}: /readyz 200 within 30 s of the promotion: {:?}\n{}",
                self.ports()
                    .iter()
                    .map(|p| http_get(*p, "/readyz"))
                    .collect::<Vec<_>>(),
                self.failover.logs()
            )
        });
        // The server seen promoted, not the sentinels asked again: a
        // sentinel that has not heard of the failover yet names the old
        // master, which (restarted) is then made a replica and resyncs
        // under the test's reads (LOADING).
        let master = (self.failover.servers.iter())
            .find(|s| s.port() == master)
            .expect("the new master is one of ours");
        // Each look on a new connection: under load the new master's
        // first connections were seen cut (EOF) while the sentinels
        // reconfigured the servers; a cut look is looked at again.
        let url = master.url();
        let mut outcomes = HashMap::new();
        let ok = wait_until(Duration::from_secs(90), || {
            let looked = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
                .and_then(|mut c| {
                    redis::cmd("HGETALL")
                        .arg(keys().tick_outcomes(JOB, self.tick))
                        .query::<HashMap<String, i64>>(&mut c)
                });
            match looked {
                Ok(o) => {
                    outcomes = o;
                    daemon::ended(&outcomes) >= ITEMS
                }
                Err(_) => false,
            }
        });
        assert!(ok, "{what}: every item of the tick ends: {outcomes:?}");
        let mut conn = redis_conn(&url);
        let done_after = promoted_at.elapsed();
        let o: HashMap<String, i64> = tick_outcomes(&mut conn, self.tick);
        assert_eq!(
            o.get("done"),
            Some(&ITEMS),
            "{what}: every item done: {o:?}"
        );
        assert_eq!(
            o.get("#items"),
            Some(&ITEMS),
            "{what}: fanned out once: {o:?}"
        );
        let claims = tick_claims(&mut conn);
        assert_eq!(claims.len(), 1, "{what}: one claim: {claims:?}");
        let fanned: usize = (self.daemons.iter())
            .map(|(d, _)| {
                d.messages("tick fanned out")
                    .iter()
                    .filter(|e| e["tick"].as_i64() == Some(self.tick))
                    .count()
            })
            .sum();
        assert_eq!(
            fanned, 1,
            "{what}: the tick fanned out once across the daemons"
        );
        let mut restarts = Vec::new();
        for (d, port) in &mut self.daemons {
            assert!(d.running(), "{what}: {} never exits", d.label);
            let m = http::scrape(*port);
            let reconnects: f64 = (m.select("qw_redis_reconnects_total", &[]).iter())
                .map(|s| s.value)
                .sum();
            restarts.push((d.label.clone(), worker_restarts(d), reconnects));
        }
        eprintln!(
            "{what}: /readyz 200 on both daemons {ready:?} after the promotion; every item done {done_after:?} after it; (daemon, worker restarts, connections dropped): {restarts:?}"
        );
    }
}

#[test]
fn a_sentinel_failover_mid_tick_loses_no_item_and_fans_the_tick_out_once() {
    let _machine = machine::heavy();
    let mut rig = Rig::start();
    rig.wait_mid_tick();
    let old = rig.failover.master_port().expect("a master");
    let asked = Instant::now();
    rig.failover.failover();
    let new = rig.failover.wait_new_master(old, Duration::from_secs(30));
    let new = new.unwrap_or_else(|| {
        panic!(
            "the sentinels promoted the replica:\n{}",
            rig.failover.logs()
        )
    });
    eprintln!("SENTINEL FAILOVER: promoted after {:?}", asked.elapsed());
    rig.check("SENTINEL FAILOVER", Instant::now(), new);
}

#[test]
fn a_sigkilled_master_mid_tick_loses_no_item_and_fans_the_tick_out_once() {
    let _machine = machine::heavy();
    let mut rig = Rig::start();
    rig.wait_mid_tick();
    let old = rig.failover.master_port().expect("a master");
    let index = rig.failover.master_index();
    let killed = Instant::now();
    rig.failover.servers[index].kill();
    let new = rig.failover.wait_new_master(old, Duration::from_secs(30));
    let new = new.unwrap_or_else(|| {
        panic!(
            "the sentinels promoted the replica:\n{}",
            rig.failover.logs()
        )
    });
    let promoted = Instant::now();
    eprintln!("SIGKILL: promoted {:?} after the kill", killed.elapsed());
    // The old master comes back, empty, and the sentinels make it the new
    // master's replica: with queue_replicas = 1 the queue's writes wait
    // for it meanwhile.
    rig.failover.servers[index].restart();
    rig.check("SIGKILL of the master", promoted, new);
}

#[test]
fn every_command_finds_the_master_through_the_sentinels_skipping_one_that_does_not_answer() {
    let f = Failover::start();
    let cfg = world::idle(world::credential(world::wide()))
        .sentinels(f.sentinel_urls(), MASTER_NAME)
        .write();
    // The first sentinel listed is up but silent.
    f.sentinels[0].pause();
    let spend = |what: &str| {
        let (code, out, err) = run_cli(
            &cfg,
            None,
            &["spend", world::ENDPOINT, "--json"],
            Duration::from_secs(20),
        );
        assert_eq!(
            code,
            Some(0),
            "{what}: spend through the sentinels: {out}{err}"
        );
        let j: serde_json::Value = serde_json::from_str(&out).expect("json");
        j["remaining"].as_i64().expect("remaining")
    };
    let first = spend("before the failover");
    let (code, out, err) = run_cli(&cfg, None, &["quota", "--json"], Duration::from_secs(20));
    assert_eq!(code, Some(0), "quota: {out}{err}");
    let (code, out, err) = run_cli(&cfg, None, &["check"], Duration::from_secs(30));
    assert_eq!(code, Some(0), "check: {out}{err}");
    assert!(
        out.contains(MASTER_NAME),
        "check names the master it found: {out}"
    );

    // After a failover, the next command reaches the new master, which
    // has the window's first spend.
    let old = f.master_port().expect("a master");
    f.failover();
    assert!(
        f.wait_new_master(old, Duration::from_secs(30)).is_some(),
        "{}",
        f.logs()
    );
    let second = spend("after the failover");
    assert_eq!(second, first - 1, "the window came along");
    f.sentinels[0].resume();
}

/// The sentinel user docs/redis.md names (its `user quota-worker …` line,
/// read from the page so the page stays true), and the master's own
/// documented user, both with passwords: a daemon and `trigger --wait` run
/// through the sentinels as them, and the daemon hears the sentinels'
/// `+switch-master` across a `SENTINEL FAILOVER`.
#[test]
fn the_documented_sentinel_user_is_enough() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/redis.md"))
        .expect("docs/redis.md");
    let line = |prefix: &str| {
        doc.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("docs/redis.md has a line starting {prefix:?}"))
            .replace(">PASSWORD", ">pw")
    };
    let sentinel_user = line("user quota-worker on ");
    let master_user = line("ACL SETUSER quota-worker ");
    let f = Failover::start_with(&[&sentinel_user], &[]);
    for s in &f.servers {
        let args: Vec<&str> = master_user.split_whitespace().collect();
        let _: () = s.cmd(&args);
    }
    let sentinels: Vec<String> = (f.sentinels.iter())
        .map(|s| format!("redis://quota-worker:pw@127.0.0.1:{}", s.port()))
        .collect();
    let upstream = Upstream::start(1, 2);
    let cfg = world::config(world::job(&upstream.base_url()).pages(1))
        .sentinels(sentinels, MASTER_NAME)
        .redis_url("redis://quota-worker:pw@/0")
        .write();
    let (mut d, port) = daemon("daemon", &cfg, None);
    d.wait_running(Duration::from_secs(30));
    let trigger = || {
        let (code, out, err) = run_cli(
            &cfg,
            None,
            &["trigger", JOB, "--wait"],
            Duration::from_secs(60),
        );
        assert_eq!(
            code,
            Some(0),
            "trigger --wait as the documented users: {out}{err}\n{}",
            d.log()
        );
    };
    trigger();
    let old = f.master_port().expect("a master");
    f.failover();
    assert!(
        f.wait_new_master(old, Duration::from_secs(30)).is_some(),
        "{}",
        f.logs()
    );
    let heard = wait_until(Duration::from_secs(10), || {
        http::scrape(port).one("qw_redis_reconnects_total", &[("reason", "switched")]) >= 1.0
    });
    assert!(
        heard,
        "the daemon heard +switch-master as the documented user\n{}",
        d.log()
    );
    trigger();
    assert!(!d.log().contains("NOPERM"), "{}", d.log());
}

/// `trigger --wait` across a `SENTINEL FAILOVER`: its blocked read of the
/// tick's ends is cut, and sent again to the new master; it waits on to the
/// tick's end and exits 0.
#[test]
fn trigger_wait_waits_through_a_failover() {
    let f = Failover::start();
    let upstream = slow_upstream();
    let cfg = config(&upstream)
        .sentinels(f.sentinel_urls(), MASTER_NAME)
        .write();
    let (mut d, _) = daemon("daemon", &cfg, None);
    d.wait_running(Duration::from_secs(30));
    let mut t = Proc::sim_cli(
        "trigger --wait",
        &cfg,
        None,
        &["trigger", JOB, "--wait"],
        &[],
    );
    assert!(wait_until(Duration::from_secs(30), || upstream.fetched() >= 2));
    let old = f.master_port().expect("a master");
    f.failover();
    assert!(
        f.wait_new_master(old, Duration::from_secs(30)).is_some(),
        "{}",
        f.logs()
    );
    let status = t.wait_exit(Duration::from_secs(90));
    let (out, err) = (t.stdout(), t.log());
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "{out}\n{err}\n{}",
        d.log()
    );
    assert!(
        out.contains(&format!("{ITEMS} task(s) ended: {ITEMS} done")),
        "{out}"
    );
}
