//! Promise (SPEC Part 4, "The spend script as a Redis function library"):
//! on Redis 7 the spend core runs by `FCALL` of a function library that
//! quota-worker loads where it is missing — again after `FUNCTION FLUSH`,
//! with no spend failing and the count exact; a Redis user that may not run
//! `FUNCTION` or `FCALL` spends by `EVALSHA` of the one script built from
//! the same files, just as exactly, and `check` tells it what to grant; and
//! during a rolling deploy an old version (the script as it was before the
//! library, by `EVALSHA`) and the new one, or two library versions loaded
//! side by side, spend from the same windows, both exactly — call by call,
//! and as two daemon processes fetching one job's pages under one window.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use quota_worker::config::{Config, Reserve};
use quota_worker::conn::{Function, Functions, Library, Lua};
use quota_worker::quota::{Decision, Limiter, Op, Operation, library, request_id, script};

use crate::support::redis_server::by_evalsha;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

pub(crate) fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(600, "1h"))
                .window(Window::fixed(5000, "24h")),
        )
        .endpoint(Endpoint::new("one", "k", 1).window(Window::sliding(1000, "10m")))
        .write()
}

/// Calls of `command` (lower case, as `INFO commandstats` names it).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let (_, stats) = server.command_calls();
    (stats.lines())
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// 960 spends from 32 tasks on a 600-unit window while `flush` runs over
/// and over on another connection: none fails, exactly 600 are admitted.
pub(crate) async fn spend_while_flushing(
    server: &RedisServer,
    limiter: &Limiter,
    flush: &'static [&str],
) {
    let stop = Arc::new(AtomicBool::new(false));
    let flushes = Arc::new(AtomicU64::new(0));
    let flusher = {
        let (stop, flushes) = (stop.clone(), flushes.clone());
        let mut conn = server.conn();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut cmd = redis::cmd(flush[0]);
                cmd.arg(&flush[1..]);
                let _: () = cmd.query(&mut conn).expect("flush");
                flushes.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let l = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let (mut allowed, mut errors) = (0u32, Vec::new());
            for _ in 0..30 {
                match l.spend("one", None, &request_id()).await {
                    Ok(Decision::Allowed { .. }) => allowed += 1,
                    Ok(_) => {}
                    Err(e) => errors.push(e.to_string()),
                }
            }
            (allowed, errors)
        }));
    }
    let (mut allowed, mut errors) = (0, Vec::new());
    for t in tasks {
        let (a, e) = t.await.expect("task");
        allowed += a;
        errors.extend(e);
    }
    stop.store(true, Ordering::Relaxed);
    flusher.join().expect("flusher");
    assert!(
        flushes.load(Ordering::Relaxed) > 50,
        "{flush:?} ran only {} times: the test proves nothing",
        flushes.load(Ordering::Relaxed)
    );
    assert!(
        errors.is_empty(),
        "{} of 960 spends failed under {flush:?}, e.g. {:?}",
        errors.len(),
        errors.first()
    );
    assert_eq!(allowed, 600, "960 spends on a 600-unit window");
    let usage = limiter.peek("k").await.expect("peek");
    let used: Vec<u64> = usage.windows.iter().map(|w| w.used).collect();
    assert_eq!(used, [600, 600, 600]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_spend_core_runs_by_fcall_and_is_loaded_again_after_function_flush() {
    let server = RedisServer::start();
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    // A call whose library was flushed loads it and calls again; flushed
    // again in between, that one call runs as the script.
    spend_while_flushing(&server, &limiter, &["FUNCTION", "FLUSH"]).await;
    assert!(
        calls(&server, "fcall") >= 960,
        "{}",
        server.command_calls().1
    );
    // Once nobody flushes, every call is an FCALL again.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.conn())
        .expect("flush");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.conn())
        .expect("resetstat");
    for _ in 0..20 {
        let d = limiter
            .spend("one", None, &request_id())
            .await
            .expect("spend");
        assert!(!d.is_allowed(), "the window is full");
    }
    assert_eq!(calls(&server, "fcall"), 21, "{}", server.command_calls().1);
    assert_eq!(calls(&server, "function|load"), 1);
    assert_eq!(
        calls(&server, "evalsha") + calls(&server, "eval"),
        0,
        "no call ran as the script"
    );
    // Loaded under the name this version carries, with every operation.
    let names: Vec<String> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(library().name())
        .query::<redis::Value>(&mut server.conn())
        .map(|v| format!("{v:?}"))
        .into_iter()
        .collect();
    for op in Op::ALL {
        assert!(names[0].contains(op.function().name()), "{names:?}");
    }
}

#[test]
fn a_redis_user_without_functions_spends_by_evalsha_and_check_says_what_to_grant() {
    by_evalsha(|| {
        let server = RedisServer::start();
        let cfg = config();
        let config = Config::load(&cfg.path()).expect("config");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let limiter = support::limiter(&server, &config).await;
            spend_while_flushing(&server, &limiter, &["SCRIPT", "FLUSH"]).await;
        });
        assert!(
            calls(&server, "evalsha") >= 960,
            "{}",
            server.command_calls().1
        );
        assert_eq!(calls(&server, "fcall"), 0, "FCALL is refused to this user");

        let url = server.url();
        let out = cfg.run(&["check"], &[("K", "x"), ("QUOTA_WORKER_REDIS_URL", &url)]);
        assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
        let said = support::stdout(&out);
        assert!(
            said.contains("may not run FUNCTION LIST, FUNCTION LOAD, FCALL")
                && said.contains("spends by EVALSHA instead")
                && said.contains("+fcall +function"),
            "{said}"
        );
    });
}

/// The spend script as the last release before the library shipped it
/// (`lua/spend.lua` at 00e88bf): what an old daemon runs during a rolling
/// deploy.
static OLD: std::sync::LazyLock<Lua> =
    std::sync::LazyLock::new(|| Lua::new(include_str!("../support/fixtures/spend_before_33.lua")));

fn rolling_config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(30, "1h"))
                .window(Window::fixed(100, "24h"))
                .window(Window::bucket(40, "1h")),
        )
        .endpoint(Endpoint::new("one", "k", 1).window(Window::concurrent(50)))
        .write()
}

/// Runs operation `op` of the old script on `limiter`'s plan of endpoint
/// `one` (`arg`: its request id; `cost`).
async fn old(
    conn: &mut redis::aio::ConnectionManager,
    limiter: &Limiter,
    op: &str,
    arg: &str,
    cost: u64,
) -> Vec<i64> {
    let plan = &limiter.quotas().endpoint("one").expect("one").plan;
    let layout = plan.layout(&match op {
        "spend" => Operation::Spend {
            request_id: arg,
            cost,
            reserve: Reserve::NONE,
            ticket: None,
            history: true,
        },
        "settle" => Operation::Settle {
            request_id: arg,
            actual: cost,
            history: true,
        },
        _ => Operation::Peek,
    });
    let mut call = OLD.call();
    call.key(layout.keys).arg(layout.args);
    call.invoke(conn).await.expect("the old script")
}

/// The other version of a rolling deploy: the script as it was before the
/// library, or another library version.
enum Other {
    OldScript,
    Library(&'static Function, Functions),
}

impl Other {
    /// Spends 1 unit of endpoint `one` as request `id`: whether admitted.
    async fn spend(
        &self,
        conn: &mut redis::aio::ConnectionManager,
        limiter: &Limiter,
        id: &str,
    ) -> bool {
        match self {
            Other::OldScript => old(conn, limiter, "spend", id, 1).await[0] == 1,
            Other::Library(spend, how) => {
                let plan = &limiter.quotas().endpoint("one").expect("one").plan;
                let layout = plan.layout(&Operation::Spend {
                    request_id: id,
                    cost: 1,
                    reserve: Reserve::NONE,
                    ticket: None,
                    history: true,
                });
                let mut call = spend.call();
                call.key(layout.keys).arg(layout.args);
                let r: Vec<i64> = call.invoke(conn, how).await.expect("fcall");
                r[0] == 1
            }
        }
    }
}

/// `n` spends of endpoint `one` (ids `<prefix><i>`), every other one by
/// `other`: how many were admitted.
async fn in_turns(
    conn: &mut redis::aio::ConnectionManager,
    limiter: &Limiter,
    other: &Other,
    prefix: &str,
    n: usize,
) -> usize {
    let mut allowed = 0;
    for i in 0..n {
        let id = format!("{prefix}{i}");
        allowed += usize::from(if i % 2 == 0 {
            limiter
                .spend("one", None, &id)
                .await
                .expect("spend")
                .is_allowed()
        } else {
            other.spend(conn, limiter, &id).await
        });
    }
    allowed
}

async fn connect(server: &RedisServer) -> redis::aio::ConnectionManager {
    redis::aio::ConnectionManager::new(redis::Client::open(server.url()).expect("client"))
        .await
        .expect("connect")
}

#[tokio::test]
async fn an_old_and_a_new_version_spend_exactly_from_the_same_windows() {
    let server = RedisServer::start();
    let cfg = rolling_config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let mut conn = connect(&server).await;

    // 40 spends, every other one by the old script: the sliding 30/1h is
    // the tightest, and each version sees what the other spent.
    let (mut new_ids, mut old_ids, mut allowed) = (Vec::new(), Vec::new(), 0);
    for i in 0..40 {
        let id = format!("s{i}");
        let admitted = if i % 2 == 0 {
            let d = limiter.spend("one", None, &id).await.expect("spend");
            new_ids.push(id);
            d.is_allowed()
        } else {
            let r = old(&mut conn, &limiter, "spend", &id, 1).await;
            old_ids.push(id);
            r[0] == 1
        };
        allowed += usize::from(admitted);
    }
    assert_eq!(allowed, 30, "30 of 40 on the 30-per-hour window");
    let used = |u: &quota_worker::quota::CredentialUsage| -> Vec<u64> {
        u.windows.iter().map(|w| w.used).collect()
    };
    let usage = limiter.peek("k").await.expect("peek");
    assert_eq!(
        used(&usage),
        [30, 30, 30, 30],
        "sliding, fixed, bucket, leases"
    );
    // The old script reads the same windows the same way.
    let peeked = old(&mut conn, &limiter, "peek", "", 0).await;
    let old_used: Vec<i64> = peeked[1..].chunks(5).map(|w| w[0]).collect();
    assert_eq!(old_used, [30, 30, 30, 30], "{peeked:?}");

    // Each refunds what the other spent (the lease returned, the units
    // given back), and a retried id is never charged twice.
    for id in &old_ids[..5] {
        assert_eq!(limiter.settle("one", id, 0).await.expect("settle"), 4);
    }
    for id in &new_ids[..5] {
        let r = old(&mut conn, &limiter, "settle", id, 0).await;
        assert_eq!(r, [4], "{id}");
    }
    let usage = limiter.peek("k").await.expect("peek");
    assert_eq!(used(&usage), [20, 20, 20, 20]);
    let again = old(&mut conn, &limiter, "spend", &new_ids[6], 1).await;
    assert_eq!(again[0], 1, "a retry of an admitted id");
    let d = limiter
        .spend("one", None, &old_ids[6])
        .await
        .expect("spend");
    assert!(d.is_allowed());
    let usage = limiter.peek("k").await.expect("peek");
    assert_eq!(used(&usage), [20, 20, 20, 20], "neither retry charged");

    // The rest of the window, between both: exactly 10 more.
    let more = in_turns(&mut conn, &limiter, &Other::OldScript, "t", 16).await;
    assert_eq!(more, 10);
}

#[tokio::test]
async fn two_library_versions_load_side_by_side_and_spend_from_the_same_windows() {
    let server = RedisServer::start();
    let cfg = rolling_config();
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    // Another version of the library: the same operations under another
    // name (a text that differs, as the next release's will).
    let body: String = library()
        .source()
        .lines()
        .skip(2)
        .collect::<Vec<_>>()
        .join("\n");
    let next: &'static Library = Box::leak(Box::new(Library::new(
        "qw",
        &format!("{body}\n-- the next release\n"),
    )));
    assert_ne!(next.name(), library().name());
    let spend = Box::leak(Box::new(next.function("spend", script())));
    let other = Other::Library(spend, Functions::default());
    let mut conn = connect(&server).await;
    let allowed = in_turns(&mut conn, &limiter, &other, "v", 40).await;
    assert_eq!(allowed, 30);
    let Other::Library(_, how) = &other else {
        unreachable!("a library")
    };
    assert_eq!(how.fcall(), Some(true), "the next version ran by FCALL");
    let libs: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg("qw_*")
        .query(&mut server.conn())
        .expect("function list");
    assert_eq!(libs.len(), 2, "both versions loaded: {libs:?}");
}

/// The window a daemon-level rolling deploy shares: fewer units than the
/// job's pages (8 regions x 3 pages), so that the window, not the job,
/// decides how many pages are fetched.
const DEPLOY_UNITS: usize = 20;

/// Rolling deploy, two daemons (issue 33, "Done when"): two processes of
/// this binary on one Redis run the same job on one credential, the second
/// with its library under another version name (the test-only
/// `QUOTA_WORKER_TEST_LIBRARY`, src/quota/library.rs). Each daemon loads
/// and calls its own library (both are loaded, and `SLOWLOG` shows calls of
/// each one's functions), and together they fetch exactly the window's
/// units: the upstream is charged `DEPLOY_UNITS` times, never more, and the
/// window counts exactly that. What this proves: two library versions
/// loaded side by side, each daemon calling only its own, read and write the
/// same windows and count each other's spends exactly, under real
/// concurrency (claims with their first spend, spends, refusals). The code
/// of both is this release's; that an older release's code reads and writes
/// the same windows exactly is `an_old_and_a_new_version_spend_...` above
/// (call by call, the script as it shipped before the library).
#[test]
fn two_daemons_on_two_library_versions_fetch_exactly_what_one_window_allows() {
    use crate::support::rig::Rig;
    use crate::support::upstream::Upstream;
    use crate::support::world;

    let server = RedisServer::start();
    // Every command into the slow log, with its arguments: which library's
    // functions each daemon called.
    let _: () = server.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let _: () = server.cmd(&["CONFIG", "SET", "slowlog-max-len", "100000"]);
    // Answers take 100 ms: both daemons have tasks in flight at once.
    let upstream = Upstream::with(world::sim(3, 2).hold(Duration::from_millis(100)));
    let cfg = ConfigBuilder::new()
        .worker(world::quick_worker(2))
        .credential(world::credential(Window::sliding(
            DEPLOY_UNITS as u64,
            "1h",
        )))
        .endpoint(world::endpoint())
        .job(world::job(&upstream.base_url()))
        .write();
    // The old version (this release's library name), and the new one on the
    // same Redis and config under the next version's name.
    let rig = Rig::start(server, cfg, &[]);
    let _new = rig.another_with("new", &[("QUOTA_WORKER_TEST_LIBRARY", "next")]);

    // Every task of the tick ends (the pages past the window's units end
    // quota_exhausted: exit 75); after that nothing fetches, so a page
    // either version admitted in excess would be counted below.
    let t = rig.trigger_expect(world::JOB, 75);
    assert_eq!(
        upstream.fetched(),
        DEPLOY_UNITS,
        "the window's units, no more: {t:#?}"
    );
    let server = &rig.redis;

    // Both versions loaded, each called by its daemon.
    let names: Vec<String> = (redis::cmd("FUNCTION").arg("LIST"))
        .query::<Vec<redis::Value>>(&mut server.conn())
        .expect("function list")
        .iter()
        .filter_map(|lib| match lib {
            redis::Value::Array(fields) => fields.chunks(2).find_map(|kv| match kv {
                [redis::Value::BulkString(k), redis::Value::BulkString(v)]
                    if k.as_slice() == b"library_name" =>
                {
                    String::from_utf8(v.clone()).ok()
                }
                _ => None,
            }),
            _ => None,
        })
        .filter(|n| n.starts_with("qw_"))
        .collect();
    assert_eq!(names.len(), 2, "two versions loaded: {names:?}");
    assert!(names.contains(&library().name().to_owned()), "{names:?}");
    let slow: Vec<redis::Value> = server.cmd(&["SLOWLOG", "GET", "100000"]);
    let called = |lib: &str| {
        slow.iter()
            .filter(|e| {
                let redis::Value::Array(e) = e else {
                    return false;
                };
                let Some(redis::Value::Array(args)) = e.get(3) else {
                    return false;
                };
                matches!(
                    (args.first(), args.get(1)),
                    (Some(redis::Value::BulkString(c)), Some(redis::Value::BulkString(f)))
                        if c.eq_ignore_ascii_case(b"fcall") && f.starts_with(format!("{lib}_").as_bytes())
                )
            })
            .count()
    };
    for name in &names {
        assert!(called(name) > 0, "no FCALL of {name}'s functions");
    }

    // The window counts exactly what was fetched.
    let w = &rig.quota(world::CREDENTIAL)["windows"][0];
    assert_eq!(w["used"].as_u64(), Some(DEPLOY_UNITS as u64), "{w}");
}
