//! Promise: a rolling deploy loses no task. Two daemons on one Redis and
//! prefix, A with job `onlya` and B without: every task of `onlya` that B
//! takes is given back (queued again after 1 s, no attempt counted) until A
//! runs it, so `trigger onlya --wait` ends with every task `done`. With no
//! daemon that has the job, its tasks end `failed` once `unknown_job_grace`
//! has passed, saying why, after a handful of give-backs each (each wait
//! twice the last), never a hot loop.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::config::{ConfigBuilder, TestConfig, Worker};
use crate::support::keys::keys;
use crate::support::process::Proc;
use crate::support::rig::{self, Rig};
use crate::support::upstream::Upstream;
use crate::support::wait_until;
use crate::support::world;
use simulator::Fault;

const ITEMS: usize = 10;
const GIVEN_BACK: &str =
    "job not in this daemon's configuration: task given back for a daemon that has it";

/// Daemon A's config: job `onlya`, `ITEMS` items of 2 pages.
fn with_onlya(upstream: &Upstream, worker: Worker) -> TestConfig {
    let regions: Vec<String> = (0..ITEMS).map(|i| format!("R{i}")).collect();
    let regions: Vec<&str> = regions.iter().map(String::as_str).collect();
    ConfigBuilder::new()
        .worker(worker)
        .credential(world::credential(world::wide()))
        .endpoint(world::endpoint())
        .job(world::videos_job(
            "onlya",
            world::ENDPOINT,
            &upstream.base_url(),
            &regions,
            2,
        ))
        .write()
}

/// Daemon B's config: the same credential and endpoint, another job.
fn without_onlya(upstream: &Upstream, worker: Worker) -> TestConfig {
    ConfigBuilder::new()
        .worker(worker)
        .credential(world::credential(world::wide()))
        .endpoint(world::endpoint())
        .job(world::videos_job(
            "other",
            world::ENDPOINT,
            &upstream.base_url(),
            &["US"],
            1,
        ))
        .write()
}

/// Give-backs per task id root, from a daemon's log.
fn give_backs(d: &Proc) -> HashMap<String, Vec<Value>> {
    let mut per: HashMap<String, Vec<Value>> = HashMap::new();
    for e in d.messages(GIVEN_BACK) {
        let task = e["task"].as_str().unwrap_or_default();
        // A given-back copy is `<root>:b<seq>`.
        let root = task.split(":b").next().unwrap_or(task).to_owned();
        per.entry(root).or_default().push(e);
    }
    per
}

/// The issue's case (hardening 2, item 6): 4 done, 6 failed ("not in the
/// configuration any more") before the fix.
#[test]
fn a_task_of_a_job_only_another_daemon_has_is_given_back_until_that_daemon_runs_it() {
    let upstream = Upstream::start(2, 2);
    // B takes most tasks: eight at once against A's one. A is the rig's
    // daemon, B another version of the config on its Redis.
    let rig = Rig::new(with_onlya(&upstream, Worker::default().concurrency(1)));
    let b_cfg = without_onlya(&upstream, Worker::default().concurrency(8));
    let b = rig.another_on("B", &b_cfg);
    let a = &rig.daemon;
    // Every answer takes 300 ms: A works through the tasks one at a time
    // while B, idle, keeps taking the others.
    upstream.inject(Fault::Delay(Duration::from_millis(300)), 1_000);

    let t = rig.trigger_expect("onlya", 0);
    let (out, err) = (&t.stdout, &t.stderr);
    assert!(
        out.contains(&format!("{ITEMS} task(s) ended: {ITEMS} done")),
        "{out}"
    );
    // A has the job: no reload is needed, and trigger does not say so.
    assert!(!err.contains("has it loaded"), "{err}");
    let done_by_a = (a.outcomes().iter())
        .filter(|o| o["job"] == "onlya" && o["outcome"] == "done")
        .count();
    assert_eq!(done_by_a, ITEMS, "{}", a.log());
    assert!(
        b.outcomes().iter().all(|o| o["job"] != "onlya"),
        "{}",
        b.log()
    );

    let per = give_backs(&b);
    let total: usize = per.values().map(Vec::len).sum();
    let most = per.values().map(Vec::len).max().unwrap_or(0);
    eprintln!(
        "B gave back {total} time(s), {} task(s), at most {most} time(s) one task",
        per.len()
    );
    assert!(
        total > 0,
        "B took no task of onlya: the test proves nothing"
    );
    for backs in per.values() {
        for (n, e) in backs.iter().enumerate() {
            // A has the job: each give-back waits 1 s, no more, so A never
            // sits idle for long while tasks wait.
            assert_eq!(e["requeued_in_ms"].as_u64(), Some(1000), "{e}");
            assert!(e["given_back"].as_u64() >= Some(n as u64 + 1), "{e}");
        }
    }
}

/// With no daemon that has the job, its tasks wait `unknown_job_grace` for
/// one (a reload, or the rest of a deploy), then end `failed` saying why.
#[test]
fn a_task_of_a_job_no_daemon_has_fails_after_the_grace_and_gives_back_a_few_times_only() {
    let upstream = Upstream::start(2, 2);
    let a_cfg = with_onlya(&upstream, Worker::default());
    // B is the rig's daemon; A's config is only triggered.
    let rig = Rig::new(without_onlya(
        &upstream,
        Worker::default().concurrency(4).unknown_job_grace("15s"),
    ));
    let (redis, b) = (&rig.redis, &rig.daemon);
    // B has said what it has loaded (its first announcement).
    assert!(wait_until(Duration::from_secs(10), || {
        let mut conn = redis.conn();
        redis::cmd("HLEN")
            .arg(keys().daemons())
            .query::<u64>(&mut conn)
            .is_ok_and(|n| n == 1)
    }));

    let t = Instant::now();
    let t_a = rig::trigger(redis, &a_cfg, "onlya");
    let took = t.elapsed();
    assert_eq!(t_a.code, Some(1), "{t_a:#?}");
    let (out, err) = (&t_a.stdout, &t_a.stderr);
    assert!(
        out.contains(&format!("{ITEMS} task(s) ended: {ITEMS} failed")),
        "{out}"
    );
    assert!(
        err.contains("none of the 1 daemon(s) running on this Redis has it loaded"),
        "trigger says a reload is needed:\n{err}"
    );
    let failed: Vec<Value> = (b.outcomes().into_iter())
        .filter(|o| o["job"] == "onlya")
        .collect();
    assert_eq!(failed.len(), ITEMS, "{}", b.log());
    for o in &failed {
        assert_eq!(o["outcome"], "failed", "{o}");
        let why = o["message"].as_str().unwrap_or_default();
        assert!(
            why.contains("job \"onlya\" is in no running daemon's configuration")
                && why.contains("unknown_job_grace (15s")
                && why.contains("no daemon on this Redis and prefix has had it"),
            "{why}"
        );
    }
    // Not before the grace; and no hot loop: 1 + 2 + 4 + 8 s of waits fill
    // the 15 s grace, so each task was given back about four times.
    assert!(took >= Duration::from_secs(15), "failed after {took:?}");
    let per = give_backs(b);
    let total: usize = per.values().map(Vec::len).sum();
    let most = per.values().map(Vec::len).max().unwrap_or(0);
    eprintln!(
        "failed after {took:?}; {total} give-back(s) of {} task(s), at most {most} of one",
        per.len()
    );
    assert_eq!(per.len(), ITEMS);
    assert!(most <= 6, "a task was given back {most} times in 15 s");
    assert_eq!(upstream.fetched(), 0, "nothing was fetched");
}
