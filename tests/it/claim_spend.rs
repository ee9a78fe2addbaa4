//! Promise (issue 11 item 5): a task's first page costs no spend round trip
//! of its own — its spend rides in the call that claims its item
//! (the spend core's claim, `lua/spend/claim.lua`) — and every rule of the spend holds unchanged; a
//! spend made at the claim that the task then does not use is given back
//! before the task's outcome is told.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use quota_worker::keys::KeySpace;
use quota_worker::outcome::OutcomeKind;
use quota_worker::queue::Origin;

use crate::support::pipeline::Pipeline;
use crate::support::world;
use crate::support::{ConfigBuilder, Job, RedisServer, Sink, Window};

fn config(sim: &str, regions: &[&str], pages: u32) -> ConfigBuilder {
    ConfigBuilder::new()
        .worker(world::quick_worker(2))
        .credential(world::credential(Window::sliding(100, "1h")))
        .endpoint(world::endpoint())
        .job(
            Job::videos("two", world::ENDPOINT, sim)
                .fan_out("region", regions.iter().copied())
                .pages(pages)
                .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
        )
}

/// MONITOR on a test's Redis: every command it runs, scripts' own included,
/// as Redis saw them, one line each.
struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Monitor {
    /// On once this returns (Redis acknowledged MONITOR).
    async fn start(redis: &RedisServer) -> Monitor {
        let client = redis::Client::open(redis.url()).expect("client");
        let monitor = client.get_async_monitor().await.expect("monitor");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let reader = {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut feed = monitor.into_on_message::<String>();
                while let Some(line) = feed.next().await {
                    lines.lock().expect("lines").push(line);
                }
            })
        };
        Monitor { lines, reader }
    }

    /// Stops it once every command Redis ran before this call has arrived
    /// (Redis sends MONITOR lines in the order it runs commands: a marker
    /// sent now, seen, is the last of them); every line.
    async fn stop(self, redis: &RedisServer) -> String {
        const MARKER: &str = "qw-test-monitor-marker";
        let _: String = redis.cmd(&["ECHO", MARKER]);
        let seen = async {
            while !self
                .lines
                .lock()
                .expect("lines")
                .iter()
                .any(|l| l.contains(MARKER))
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let arrived = tokio::time::timeout(Duration::from_secs(10), seen).await;
        self.reader.abort();
        assert!(arrived.is_ok(), "MONITOR did not show {MARKER} within 10 s");
        self.lines.lock().expect("lines").join("\n")
    }
}

/// The request ids of the spends in a MONITOR log (client calls only, not
/// the commands scripts run; by FCALL, or by EVALSHA where Redis runs no
/// functions): those that rode in an item claim's call, and those that were
/// a call of their own. A call NOSCRIPT made the client repeat appears
/// twice: the ids are a set.
fn spends(log: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut with_claim, mut alone) = (BTreeSet::new(), BTreeSet::new());
    for line in log.lines() {
        let called = [r#" "EVALSHA" "#, r#" "EVAL" "#, r#" "FCALL" "#];
        if !called.iter().any(|c| line.contains(c)) {
            continue;
        }
        let Some(at) = line.find(r#""spend" ""#) else {
            continue;
        };
        let rest = &line[at + r#""spend" ""#.len()..];
        let id = rest[..rest.find('"').expect("closing quote")].to_owned();
        if line.contains(r#""claim""#) && line.contains(":lock:two:") {
            with_claim.insert(id);
        } else {
            alone.insert(id);
        }
    }
    (with_claim, alone)
}

/// Four items of two pages: each task's page 1 is spent in its claim's
/// call, page 2 in a call of its own; the window counts every page once,
/// the upstream saw every page once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_pages_spend_rides_in_the_item_claim() {
    let regions = ["a", "b", "c", "d"];
    let p = Pipeline::start(world::sim(2, 2), |sim| config(sim, &regions, 2)).await;
    let monitor = Monitor::start(&p.redis).await;
    let seen = p.tick("two", 4, Duration::from_secs(30)).await;
    let log = monitor.stop(&p.redis).await;
    let done = seen
        .iter()
        .filter(|s| s.kind() == OutcomeKind::Done)
        .count();
    assert_eq!(done, 4, "{seen:?}");

    let (with_claim, alone) = spends(&log);
    assert_eq!(
        with_claim.len(),
        4,
        "one first-page spend per task, in its claim: {with_claim:?}"
    );
    assert!(
        with_claim.iter().all(|id| id.contains(":p1:")),
        "{with_claim:?}"
    );
    assert_eq!(
        alone.len(),
        4,
        "page 2 spends in a call of its own: {alone:?}"
    );
    assert!(alone.iter().all(|id| id.contains(":p2:")), "{alone:?}");

    let used = p.used(world::CREDENTIAL).await;
    assert_eq!(used, 8, "8 pages, 8 units");
    assert_eq!(p.sim_stats().charges.len(), 8, "the upstream saw 8 pages");
}

/// A task whose item a newer tick's run already completed is superseded:
/// the spend its claim made is refunded before its outcome is told, so the
/// windows show only what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_superseded_task_gives_back_the_spend_its_claim_made() {
    let p = Pipeline::start(world::sim(1, 2), |sim| config(sim, &["a"], 1)).await;
    let tick = p.trigger("two").await;
    let seen = p.wait_tick("two", tick, 1, Duration::from_secs(30)).await;
    assert_eq!(seen[0].kind(), OutcomeKind::Done, "{seen:?}");

    // An older tick's copy, redelivered late.
    let old = tick - 60_000;
    let tasks = quota_worker::schedule::tick_tasks(&p.config.jobs["two"], old, Origin::Trigger);
    let queued: Vec<_> = tasks.into_iter().map(|t| (t, Duration::ZERO)).collect();
    p.queue.enqueue(&queued).await.expect("enqueue");
    let seen = p.wait_tick("two", old, 1, Duration::from_secs(30)).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].kind(), OutcomeKind::Superseded, "{seen:?}");
    assert_eq!(seen[0].ev.outcome.units, 0);

    // Read right after the outcome: already given back.
    let used = p.used(world::CREDENTIAL).await;
    assert_eq!(used, 1, "only the page that was sent");
    assert_eq!(p.sim_stats().charges.len(), 1);
}

/// A spend that fails inside the claim's call (here: a window key of the
/// wrong type) still returns the claim: the task ends through the limiter's
/// error path with its outcome, instead of erroring the whole call and being
/// redelivered onto its own lock. Nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spend_that_fails_inside_the_claim_ends_the_task_and_sends_nothing() {
    let p = Pipeline::start(world::sim(1, 2), |sim| {
        ConfigBuilder::new()
            .worker(world::quick_worker(2))
            .credential(world::credential(Window::fixed(100, "24h")))
            .endpoint(world::endpoint())
            .job(
                Job::videos("two", world::ENDPOINT, sim)
                    .fan_out("region", ["a"])
                    .pages(1)
                    .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
            )
    })
    .await;
    // The fixed window's hash as a string: the spend's HMGET on it raises
    // WRONGTYPE inside the script.
    let plan = &p
        .limiter
        .quotas()
        .endpoint(world::ENDPOINT)
        .expect("endpoint")
        .plan;
    let fixed = plan.keys[2].clone();
    assert!(fixed.ends_with(":fixed"), "{fixed}");
    let _: String = p.redis.cmd(&["SET", &fixed, "x"]);
    let seen = p.tick("two", 1, Duration::from_secs(15)).await;
    assert!(
        !seen.is_empty(),
        "the task told no outcome (redelivered onto its own lock?)"
    );
    assert_ne!(seen[0].kind(), OutcomeKind::Done, "{seen:?}");
    assert!(seen[0].ev.outcome.detail.contains("WRONGTYPE"), "{seen:?}");
    assert_eq!(p.sim_stats().requests.len(), 0, "nothing sent");
}

/// Regression (issue 23 item 8): a checkpoint that did not parse was read as
/// none, and the item's run silently started over at page 1. The task ends
/// `failed` naming the key, sends nothing, gives back the spend its claim
/// made, and leaves the checkpoint as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreadable_checkpoint_ends_the_task_failed_and_sends_nothing() {
    let p = Pipeline::start(world::sim(2, 2), |sim| config(sim, &["a"], 2)).await;
    let cursor = KeySpace::new("qw").cursor("two", "region=a");
    let _: String = p
        .redis
        .cmd(&["SET", &cursor, "{written by another version"]);
    let seen = p.tick("two", 1, Duration::from_secs(15)).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    let o = &seen[0].ev.outcome;
    assert_eq!(o.kind, OutcomeKind::Failed, "{seen:?}");
    assert!(
        o.detail
            .starts_with(&format!("unreadable checkpoint at {cursor}: ")),
        "{}",
        o.detail
    );
    assert_eq!((o.pages, o.units), (0, 0));
    assert!(p.sim_stats().charges.is_empty(), "the upstream saw nothing");
    let used = p.used(world::CREDENTIAL).await;
    assert_eq!(used, 0, "the claim's spend was given back");
    let kept: String = p.redis.cmd(&["GET", &cursor]);
    assert_eq!(
        kept, "{written by another version",
        "the checkpoint is left as it was"
    );
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    the_first_pages_spend_rides_in_the_item_claim,
    a_superseded_task_gives_back_the_spend_its_claim_made,
    a_spend_that_fails_inside_the_claim_ends_the_task_and_sends_nothing,
    an_unreadable_checkpoint_ends_the_task_failed_and_sends_nothing,
);
