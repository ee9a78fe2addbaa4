//! Promise: a job with `schedule = "manual"` never fires by itself, while
//! the daemon's other jobs tick; `trigger` runs it like any job; `check`
//! prints "manual" for its next fire times. A job whose schedule fires no
//! more (its dates are past) is said so once, not every second.

use std::time::Duration;

use crate::support::config::ConfigBuilder;
use crate::support::keys::{any_tick, keys};
use crate::support::process::run_cli;
use crate::support::redis_server::redis_conn;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world;
use crate::support::{RedisServer, wait_until};

/// Ticks of `job` claimed in Redis (one key per tick).
fn ticks_of(redis: &RedisServer, job: &str) -> usize {
    let mut conn = redis_conn(&redis.url());
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(any_tick(|t| keys().tick_claim(job, t)))
        .query(&mut conn)
        .expect("KEYS");
    // `*` also matches the tick's other keys (`…:outcomes`): a claim's
    // name ends in the tick.
    (keys.iter())
        .filter(|k| {
            k.rsplit(':')
                .next()
                .is_some_and(|s| s.parse::<i64>().is_ok())
        })
        .count()
}

#[test]
fn a_manual_job_never_fires_by_itself_and_trigger_runs_it() {
    let redis = RedisServer::start();
    let upstream = Upstream::start(1, 2);
    let base = upstream.base_url();
    let cfg = ConfigBuilder::new()
        .credential(world::credential(world::wide()))
        .endpoint(world::endpoint())
        .job(world::videos_job("every", world::ENDPOINT, &base, &["US"], 1).schedule("* * * * * *"))
        .job(
            world::videos_job("backfill", world::ENDPOINT, &base, &["GB", "DE"], 1)
                .schedule("manual"),
        )
        .job(
            world::videos_job("bygone", world::ENDPOINT, &base, &["FR"], 1)
                .schedule("0 0 0 1 1 * 2020"),
        )
        .write();

    let (code, out, err) = run_cli(
        &cfg,
        Some(&redis.url()),
        &["check"],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let backfill = out
        .split("\njob ")
        .find(|j| j.starts_with("backfill "))
        .unwrap_or_else(|| panic!("no job backfill in:\n{out}"));
    assert!(
        backfill.contains("next: manual (only `quota-worker trigger` runs it"),
        "{out}"
    );

    let rig = Rig::start(redis, cfg, &[]);
    let (redis, d) = (&rig.redis, &rig.daemon);
    // Three ticks of the cron job: the scheduler runs and fires.
    let ticked = wait_until(Duration::from_secs(60), || {
        (d.outcomes().iter())
            .filter(|o| o["job"] == "every" && o["outcome"] == "done")
            .count()
            >= 3
    });
    assert!(ticked, "the cron job did not tick:\n{}", d.log());
    assert_eq!(
        ticks_of(redis, "backfill"),
        0,
        "the manual job fired by itself"
    );
    // Three seconds of ticks: the scheduler's loop went round at least
    // three times, and said that `bygone` fires no more only once.
    let said = d.messages(
        "schedule has no future fire time: the job fires no more until the config changes",
    );
    let said: Vec<_> = (said.iter()).filter(|e| e["job"] == "bygone").collect();
    assert_eq!(said.len(), 1, "said once: {said:?}\n{}", d.log());
    assert_eq!(ticks_of(redis, "bygone"), 0, "a bygone schedule fired");
    assert!(
        !d.outcomes().iter().any(|o| o["job"] == "backfill"),
        "{}",
        d.log()
    );

    let out = rig.trigger_expect("backfill", 0).stdout;
    assert!(out.contains("2 task(s) ended: 2 done"), "{out}");
    assert_eq!(ticks_of(redis, "backfill"), 1);
}
