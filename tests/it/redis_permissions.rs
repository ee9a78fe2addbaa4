//! Issue 22, Low 2: `check` and `run` verify that the Redis user may run
//! every command quota-worker sends (`EVAL`/`EVALSHA` and the commands its
//! scripts and apalis-redis call: streams, hashes, sorted sets, ...) and
//! name what is missing, exit 78. An ACL user without `@scripting` passed
//! `check` and left `run` restarting its worker for ever. A real
//! `redis-server` with ACL users; the real binary.

use std::time::Duration;

use crate::support::process::{Proc, run_cli};
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world::{self, KEY_ENV, SECRET};
use crate::support::{self, RedisServer, TestConfig};

/// A user `name` with password `pw` on `redis`: every key and channel, every
/// command, then `rules` (`-@scripting`).
fn acl_user(redis: &RedisServer, name: &str, rules: &[&str]) -> String {
    let mut args = vec![
        "ACL", "SETUSER", name, "reset", "on", ">pw", "~*", "&*", "+@all",
    ];
    args.extend_from_slice(rules);
    let _: () = redis.cmd(&args);
    format!("redis://{name}:pw@127.0.0.1:{}/0", redis.port())
}

fn config() -> TestConfig {
    world::config(world::job("http://127.0.0.1:9")).write()
}

/// `check` on `url`: exit code, stdout and stderr.
fn check(cfg: &TestConfig, url: &str) -> (Option<i32>, String) {
    let out = cfg.run(
        &["check"],
        &[("QUOTA_WORKER_REDIS_URL", url), (KEY_ENV, SECRET)],
    );
    let text = format!("{}\n{}", support::stdout(&out), support::stderr(&out));
    (out.status.code(), text)
}

/// `run` on `url`, which must exit by itself: exit code and log.
fn run(cfg: &TestConfig, url: &str) -> (Option<i32>, String) {
    let mut d = Proc::sim_cli("daemon", cfg, Some(url), &["run"], &[]);
    let status = d.wait_exit(Duration::from_secs(60));
    if status.is_none() {
        d.kill();
    }
    (status.and_then(|s| s.code()), d.log())
}

/// Issue 22, Low 2: a user without `@scripting`, and one without `@stream`,
/// are refused by `check` and `run` (exit 78) naming the commands and the
/// categories to grant; a user with every category passes, and says so.
#[test]
fn issue_22_low_2_check_and_run_name_the_permissions_a_redis_user_lacks() {
    let redis = RedisServer::start();
    let cfg = config();
    let noscript = acl_user(&redis, "noscript", &["-@scripting"]);
    let nostream = acl_user(&redis, "nostream", &["-@stream"]);
    let full = acl_user(&redis, "full", &[]);
    // Only the prefix's keys: every command and channel, but not
    // apalis's global key.
    let _: () = redis.cmd(&[
        "ACL",
        "SETUSER",
        "prefixonly",
        "reset",
        "on",
        ">pw",
        "~qw:*",
        "&*",
        "+@all",
    ]);
    let prefix_only = format!("redis://prefixonly:pw@127.0.0.1:{}/0", redis.port());

    let (code, text) = check(&cfg, &noscript);
    assert_eq!(code, Some(78), "{text}");
    assert!(
        text.contains("may not run EVAL")
            && text.contains("EVALSHA")
            && text.contains("+@scripting"),
        "{text}"
    );
    let (code, log) = run(&cfg, &noscript);
    assert_eq!(code, Some(78), "{log}");
    assert!(
        log.contains("may not run EVAL") && log.contains("+@scripting"),
        "{log}"
    );

    let (code, text) = check(&cfg, &nostream);
    assert_eq!(code, Some(78), "{text}");
    assert!(
        text.contains("XADD")
            && text.contains("XRANGE")
            && text.contains("XTRIM")
            && text.contains("+@stream")
            && !text.contains("EVAL"),
        "{text}"
    );
    let (code, log) = run(&cfg, &nostream);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("XADD") && log.contains("+@stream"), "{log}");

    let (code, text) = check(&cfg, &prefix_only);
    assert_eq!(code, Some(78), "{text}");
    assert!(
        text.contains("may not run ZADD core:apalis:queues:list (")
            && text.contains("ACL SETUSER <user> ~core:apalis:queues:list,"),
        "{text}"
    );
    let (code, log) = run(&cfg, &prefix_only);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("ZADD core:apalis:queues:list"), "{log}");

    let (code, text) = check(&cfg, &full);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("may run every command quota-worker sends"),
        "{text}"
    );
    assert_eq!(redis.dbsize(), 0, "the checks write nothing");
}

/// The least-privilege user docs/redis.md tells operators to create (its
/// `ACL SETUSER` line, read from the doc itself so the doc stays true): a
/// daemon on it runs a triggered tick to the end, and `check` passes.
#[test]
fn the_documented_acl_user_runs_a_tick_to_the_end() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/redis.md"))
        .expect("docs/redis.md");
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER quota-worker "))
        .expect("docs/redis.md shows an ACL SETUSER line");
    let redis = RedisServer::start();
    let args: Vec<&str> = line
        .split_whitespace()
        .map(|w| if w == ">PASSWORD" { ">pw" } else { w })
        .collect();
    let _: () = redis.cmd(&args);
    let url = format!("redis://quota-worker:pw@127.0.0.1:{}/0", redis.port());
    let upstream = Upstream::start(1, 2);
    let cfg = world::config(world::job(&upstream.base_url()).pages(1)).write();

    let (code, text) = check(&cfg, &url);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("may run every command quota-worker sends"),
        "{text}"
    );
    // The daemon and the trigger as that user.
    let mut rig = Rig::start(redis, cfg, &[("QUOTA_WORKER_REDIS_URL", &url)]);
    let (code, out, err) = run_cli(
        &rig.cfg,
        Some(&url),
        &["trigger", world::JOB, "--wait"],
        Duration::from_secs(60),
    );
    assert_eq!(
        code,
        Some(0),
        "stdout:\n{out}\nstderr:\n{err}\ndaemon:\n{}",
        rig.daemon.log()
    );
    assert!(
        out.contains(&format!(
            "{} task(s) ended: {} done",
            world::REGIONS.len(),
            world::REGIONS.len()
        )),
        "{out}"
    );
    let d = &mut rig.daemon;
    assert!(!d.log().contains("NOPERM"), "{}", d.log());
    d.kill();
}
