//! Promise: spends a sliding window refused wait in turn. A refused spend
//! that will come back (a task of a job with `on_quota_exhausted = "defer"`)
//! is promised the moment the units ahead of it leave — the units promised
//! to the spends refused before it counted — so a herd of deferred tasks
//! wakes spread, a few at a time, instead of all at once to be refused
//! again; a fresh spend waits behind the line; the line never admits
//! anything the window itself would not (`lua/spend.lua`, "Waiting line").

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::outcome::OutcomeKind;
use quota_worker::quota::{Decision, Limiter, Rejection, SpendOptions, request_id};

use crate::support::pipeline::Pipeline;
use crate::support::world;
use crate::support::{self, ConfigBuilder, Job, RedisServer, Sink, TestConfig, Window, machine};

const CONFIG: &str = r#"
[credentials.k]
secret_env = "K"
windows = [{ units = 2, per = "2s" }]

[endpoints.e]
credential = "k"
cost = 1

[credentials.b]
secret_env = "B"
windows = [{ kind = "bucket", units = 4, per = "2s" }]

[endpoints.eb]
credential = "b"
cost = 1

[credentials.f]
secret_env = "F"
windows = [{ kind = "fixed", units = 2, per = "2s" }]

[endpoints.ef]
credential = "f"
cost = 1
"#;

/// A spend of one unit of `e` in the line as `ticket` ("": a spend that
/// respects the line but will not come back).
async fn spend(limiter: &Limiter, ticket: &str) -> Decision {
    spend_on(limiter, "e", ticket).await
}

/// [`spend`] on `endpoint`.
async fn spend_on(limiter: &Limiter, endpoint: &str, ticket: &str) -> Decision {
    (limiter.spend_with(endpoint, &request_id(), SpendOptions::new().in_line(ticket)))
        .await
        .expect("spend")
}

/// A Redis of its own and a limiter on [`CONFIG`] (keep the first two
/// alive while the limiter is used).
async fn start() -> (RedisServer, TestConfig, Limiter) {
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    (server, cfg, limiter)
}

fn admitted(d: Decision, who: &str) {
    assert!(
        matches!(d, Decision::Allowed { .. }),
        "{who}: expected admitted, got {d:?}"
    );
}

fn refused(d: Decision, who: &str) -> Rejection {
    match d {
        Decision::Rejected(r) => r,
        other => panic!("{who}: expected a refusal, got {other:?}"),
    }
}

/// Two units per 2 s, spent 600 ms apart; two spends refused then are
/// promised one unit each, in turn: the first when the first unit leaves,
/// the second when the second does (without the line both are told the
/// first unit's moment, and one of them is refused again). When the first
/// unit has left, a fresh spend is refused (that unit is the first
/// waiter's) and the waiter is admitted; then the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_spends_are_promised_turns_in_order_and_a_fresh_spend_waits_behind_them() {
    let _machine = machine::timing();
    let (server, _cfg, limiter) = start().await;

    admitted(spend(&limiter, "a").await, "a");
    tokio::time::sleep(Duration::from_millis(600)).await;
    admitted(spend(&limiter, "b").await, "b");
    let c = refused(spend(&limiter, "c").await, "c");
    let d = refused(spend(&limiter, "d").await, "d");
    let lines = &limiter.quotas().endpoint("e").expect("e").plan.lines;
    for line in lines {
        let ttl: i64 = server.cmd(&["PTTL", line.as_str()]);
        assert!(ttl > 0, "{line} expires by itself: PTTL {ttl}");
    }
    assert!(
        d.retry_after >= c.retry_after + Duration::from_millis(400),
        "the second waiter is promised the second unit, ~600 ms after the first: c {c:?}, d {d:?}"
    );
    assert!(
        c.retry_after <= Duration::from_millis(1_700),
        "the first waiter waits for the first unit only: {c:?}"
    );

    tokio::time::sleep(c.retry_after).await;
    let fresh = refused(spend(&limiter, "").await, "a fresh spend at c's turn");
    assert!(
        fresh.retry_after >= Duration::from_millis(1_000),
        "a fresh spend waits behind both waiters (for c's unit to leave again): {fresh:?}"
    );
    admitted(spend(&limiter, "c").await, "c at its turn");
    let now_d = refused(spend(&limiter, "d").await, "d, early");
    assert!(
        now_d.retry_after <= d.retry_after,
        "an early waiter keeps its turn: {now_d:?} (promised {d:?})"
    );
    tokio::time::sleep(now_d.retry_after).await;
    admitted(spend(&limiter, "d").await, "d at its turn");
}

/// Two units per 2 s, full; four spends refused then are promised turns:
/// `c` and `d` the two units as they leave, `e` and `f` the units `c` and
/// `d` will spend. `c` and `d` come back late, 500 ms apart, so at `e` and
/// `f`'s turn the window is full of their units: each is told when the
/// units ahead of it leave, `f` after `e` (not both the window's next unit,
/// to come back together and `f` be refused again: a herd in small), and
/// each is admitted then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_whose_turn_finds_the_units_held_late_are_told_their_own_units_in_turn() {
    let _machine = machine::timing();
    let (_server, _cfg, limiter) = start().await;

    for who in ["a", "b"] {
        admitted(spend(&limiter, who).await, who);
    }
    let mut turns = Vec::new();
    for who in ["c", "d", "e", "f"] {
        turns.push(refused(spend(&limiter, who).await, who).retry_after);
    }
    let told = tokio::time::Instant::now();
    // `c` and `d` spend 500 ms and 1 s after their turn (woken late).
    tokio::time::sleep_until(told + turns[0] + Duration::from_millis(500)).await;
    admitted(spend(&limiter, "c").await, "c, late");
    tokio::time::sleep(Duration::from_millis(500)).await;
    admitted(spend(&limiter, "d").await, "d, later");

    // `e` and `f`'s turn: the window holds `c` and `d` for another ~500
    // and ~1,000 ms.
    tokio::time::sleep_until(told + turns[3]).await;
    let e = refused(spend(&limiter, "e").await, "e at its turn");
    let f = refused(spend(&limiter, "f").await, "f at its turn");
    assert!(
        f.retry_after >= e.retry_after + Duration::from_millis(400),
        "f waits for d's unit, e for c's, ~500 ms apart: e {e:?}, f {f:?}"
    );
    let back = tokio::time::Instant::now();
    tokio::time::sleep_until(back + e.retry_after).await;
    admitted(spend(&limiter, "e").await, "e when c's unit left");
    tokio::time::sleep_until(back + f.retry_after).await;
    admitted(spend(&limiter, "f").await, "f when d's unit left");
}

/// A bucket of 4 units refilled at 2 per second, emptied: three spends
/// refused then are promised its next three units, one every 500 ms, in
/// turn (without the line all three are told the first unit's moment, and
/// two of them are refused again); at the first one's turn a fresh spend is
/// refused (that unit is the waiter's) and the waiter is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_promises_its_refill_to_the_refused_spends_in_turn() {
    let _machine = machine::timing();
    let (_server, _cfg, limiter) = start().await;

    for i in 0..4 {
        let who = format!("full{i}");
        admitted(spend_on(&limiter, "eb", &who).await, &who);
    }
    let mut turns = Vec::new();
    for who in ["w1", "w2", "w3"] {
        turns.push(refused(spend_on(&limiter, "eb", who).await, who).retry_after);
    }
    assert!(turns[0] <= Duration::from_millis(700), "{turns:?}");
    for pair in turns.windows(2) {
        assert!(
            pair[1] >= pair[0] + Duration::from_millis(400),
            "each waiter is promised the unit after the one before it: {turns:?}"
        );
    }
    tokio::time::sleep(turns[0]).await;
    refused(
        spend_on(&limiter, "eb", "").await,
        "a fresh spend at w1's turn",
    );
    admitted(spend_on(&limiter, "eb", "w1").await, "w1 at its turn");
}

/// Fixed periods of 2 s holding 2 units: with the period full, three
/// spends refused are promised periods by what is left of each: the first
/// two the next period, the third the one after (without the line all three
/// are told the next reset, and one of them is refused again then). At the
/// next period a fresh spend is refused (its units are the two waiters'),
/// the two are admitted, and the third, early, is told its own period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_promises_each_period_to_as_many_waiters_as_it_fits() {
    let _machine = machine::timing();
    let (_server, _cfg, limiter) = start().await;

    // Periods start on multiples of 2 s since the epoch (UTC midnight);
    // start just after one, so the test's first steps share a period.
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    tokio::time::sleep(Duration::from_millis((2_000 - ms % 2_000) as u64 + 50)).await;
    for who in ["f0", "f1"] {
        admitted(spend_on(&limiter, "ef", who).await, who);
    }
    let c = refused(spend_on(&limiter, "ef", "c").await, "c");
    let d = refused(spend_on(&limiter, "ef", "d").await, "d");
    let e = refused(spend_on(&limiter, "ef", "e").await, "e");
    assert!(c.retry_after <= Duration::from_secs(2), "{c:?}");
    assert!(
        d.retry_after <= c.retry_after + Duration::from_millis(10),
        "c {c:?}, d {d:?}"
    );
    assert!(
        e.retry_after >= c.retry_after + Duration::from_millis(1_900),
        "the third waiter is promised the period after: c {c:?}, e {e:?}"
    );

    tokio::time::sleep(c.retry_after).await;
    refused(
        spend_on(&limiter, "ef", "").await,
        "a fresh spend in the promised period",
    );
    for who in ["c", "d"] {
        admitted(spend_on(&limiter, "ef", who).await, who);
    }
    let early = refused(spend_on(&limiter, "ef", "e").await, "e, early");
    assert!(
        early.retry_after <= Duration::from_secs(2),
        "e is told its own period: {early:?}"
    );
}

/// Eight windows' worth of one-page tasks (64 on 8 units per 2 s, 8 worker
/// slots) with `on_quota_exhausted = "defer"`: the first 8 fit, the other 56
/// are refused once each and come back in turn. A waiter woken late (a
/// loaded machine) makes the one promised its unit wait once more; that
/// one is then told when its own units leave, not the window's next unit
/// (which sent a whole wave back together, all but one refused again: 131
/// refusals under load, 3 to 5 for some tasks). So at most 2 refusals per
/// task in all, the issue's goal, whatever the machine's load. (A task can
/// still be refused a third time when a waiter behind it comes back first
/// and the window admits that one: the line never holds back a unit the
/// window has.) Without the line each refused task came back when the next
/// unit freed, all of them at once, and 8 fit: ~N²/2U refusals (~4 per
/// task here). A count, not a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deferred_herd_is_refused_at_most_twice_per_task() {
    let _machine = machine::timing();
    const N: usize = 64;
    let regions: Vec<String> = (0..N).map(|i| format!("r{i:02}")).collect();
    let mut p = Pipeline::start(world::sim(1, 1), |sim| {
        ConfigBuilder::new()
            .worker(world::quick_worker(8))
            .credential(world::credential(Window::sliding(8, "2s")))
            .endpoint(world::endpoint())
            .job(
                Job::videos("herd", world::ENDPOINT, sim)
                    .fan_out("region", regions)
                    .on_quota_exhausted("defer")
                    .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
            )
    })
    .await;
    let tick = p.trigger("herd").await;
    let all_done = p
        .wait_for(Duration::from_secs(120), |seen| {
            let done = seen
                .iter()
                .filter(|s| s.ev.tick == tick && s.kind() == OutcomeKind::Done);
            done.count() >= N
        })
        .await;
    let seen = p.of_tick("herd", tick);
    let refusals = seen
        .iter()
        .filter(|s| s.kind() == OutcomeKind::QuotaExhausted)
        .count();
    let upstream = p.sim_stats().charges.len();
    p.stop().await;
    assert!(all_done, "every task ends done");
    assert_eq!(upstream, N, "each item fetched once");
    assert!(
        refusals >= N - 8,
        "all but the first window's tasks are refused once: {refusals}"
    );
    assert!(
        refusals <= N * 2,
        "{refusals} refusals for {N} tasks: more than 2 per task"
    );
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    refused_spends_are_promised_turns_in_order_and_a_fresh_spend_waits_behind_them,
    a_bucket_promises_its_refill_to_the_refused_spends_in_turn,
    a_fixed_window_promises_each_period_to_as_many_waiters_as_it_fits,
    a_deferred_herd_is_refused_at_most_twice_per_task,
    waiters_whose_turn_finds_the_units_held_late_are_told_their_own_units_in_turn,
);
