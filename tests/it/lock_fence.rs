//! Promise: a task whose item lock lapsed (Redis stalled past its TTL) and
//! was taken by another task writes none of the item's state. Its
//! checkpoint is refused, and so is what its end would leave (a complete
//! run deletes the checkpoint and sets `{since}`): the new holder's run
//! goes on from its own checkpoint. The stale task ends `superseded` at
//! the checkpoint it could not save; a complete run still ends `done`.
//! A lock nobody holds (the write that took it lost in a failover) is taken
//! again, and its task goes on to the end. A lock another delivery of the
//! same task holds (the queue handed the task out again after a failover,
//! and this one's lock write was lost) makes this one step aside without
//! an outcome: the other records the task's end, once.
//!
//! The lapse is made, not waited for: while each task's page 1 is held open
//! by a slow upstream, the test writes into Redis what another task's claim
//! writes (the lock with its own value) and that task's checkpoint, or
//! deletes the lock.

use std::time::Duration;

use crate::support::config::Job;
use crate::support::keys::keys;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::{RedisServer, wait_until, world};

/// Another task's lock value and checkpoint.
const OTHER: &str = "other:task#1";
const THEIRS: &str = r#"{"tick":1,"page":2,"token":"theirs","since":1,"started":1,"run":1}"#;

#[test]
fn a_task_whose_lock_another_took_writes_none_of_the_items_state() {
    let upstream = Upstream::with(world::sim(3, 2).hold(Duration::from_secs(3)));
    let base = upstream.base_url();
    let cfg = world::config(
        Job::videos("three", world::ENDPOINT, &base)
            .fan_out("region", ["US"])
            .pages(3),
    )
    .job(
        Job::videos("one", world::ENDPOINT, &base)
            .fan_out("region", ["GB"])
            .pages(1),
    )
    .job(
        Job::videos("lost", world::ENDPOINT, &base)
            .fan_out("region", ["DE"])
            .pages(3),
    )
    .job(
        Job::videos("copy", world::ENDPOINT, &base)
            .fan_out("region", ["FR"])
            .pages(3),
    )
    .worker(world::quick_worker(4).recover_after("6s"))
    .write();
    let rig = Rig::start(RedisServer::start(), cfg, &[]);
    let items = [("three", "region=US"), ("one", "region=GB")];
    for job in ["three", "one", "lost", "copy"] {
        let (code, out, err) = rig.cli(&["trigger", job]);
        assert_eq!(code, Some(0), "trigger {job}: {out}{err}");
    }
    // The tasks hold their item, and their page 1 is in flight for 3 s.
    let locks = items.map(|(job, item)| keys().item_lock(job, item));
    let lost = keys().item_lock("lost", "region=DE");
    let copy = keys().item_lock("copy", "region=FR");
    let held = wait_until(Duration::from_secs(30), || {
        (locks.iter().chain([&lost, &copy])).all(|l| rig.redis.keys(l).len() == 1)
    });
    assert!(held, "the tasks hold their item:\n{}", rig.daemon.log());
    let _: i64 = rig.redis.cmd(&["DEL", &lost]);
    // The same task id, another delivery's nonce and host.
    let value: String = rig.redis.cmd(&["GET", &copy]);
    let (task, _) = value.split_once('#').expect("task#nonce@host");
    let other_delivery = format!("{task}#other@elsewhere:1");
    let _: () = rig
        .redis
        .cmd(&["SET", &copy, &other_delivery, "PX", "60000"]);
    let cursors = items.map(|(job, item)| keys().cursor(job, item));
    for (lock, cursor) in locks.iter().zip(&cursors) {
        let _: () = rig.redis.cmd(&["SET", lock, OTHER, "PX", "60000"]);
        let _: () = rig.redis.cmd(&["SET", cursor, THEIRS, "EX", "600"]);
    }

    let ended = wait_until(Duration::from_secs(60), || {
        ["three", "one", "lost"]
            .iter()
            .all(|job| !rig.ended(job).is_empty())
    });
    assert!(ended, "the tasks end:\n{}", rig.daemon.log());
    let aside = "another delivery of this task holds the item (the queue handed it out again, and this one's lock was lost in a failover): this one steps aside, and the other records the task's end";
    let stepped = wait_until(Duration::from_secs(30), || {
        !rig.daemon.messages(aside).is_empty()
    });
    assert!(
        stepped,
        "the copy's first delivery stepped aside:\n{}",
        rig.daemon.log()
    );
    assert_eq!(
        rig.daemon.messages(aside)[0]["task"],
        task,
        "the task named"
    );
    assert!(
        rig.outcomes().iter().all(|o| o.job != "copy"),
        "a delivery that stepped aside records no outcome: {:?}",
        rig.outcomes()
    );
    let went_on = &rig.ended("lost")[0];
    assert_eq!(went_on.kind, "done", "{:?}", went_on.line);
    assert_eq!(went_on.pages, 3, "{:?}", went_on.line);
    let three = &rig.ended("three")[0];
    assert_eq!(three.kind, "superseded", "{:?}", three.line);
    assert_eq!(three.pages, 1, "it wrote the page it had: {:?}", three.line);
    let one = &rig.ended("one")[0];
    assert_eq!(one.kind, "done", "{:?}", one.line);
    for ((job, item), (lock, cursor)) in items.iter().zip(locks.iter().zip(&cursors)) {
        let now: Option<String> = rig.redis.cmd(&["GET", cursor]);
        assert_eq!(
            now.as_deref(),
            Some(THEIRS),
            "{job} {item}: the new holder's checkpoint stays"
        );
        let holder: Option<String> = rig.redis.cmd(&["GET", lock]);
        assert_eq!(holder.as_deref(), Some(OTHER), "{job}: still theirs");
    }
    let since: Option<String> = rig.redis.cmd(&["GET", &keys().since("one", "region=GB")]);
    assert_eq!(since, None, "the stale complete run set no {{since}}");
}
