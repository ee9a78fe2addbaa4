//! Promise: when the upstream throttles a credential — 429 with Retry-After,
//! 403 with a quota reason, or GitHub-style headers reporting 0 remaining —
//! the credential is blocked in Redis for every worker (and every other
//! spender: `quota`, `spend`) until then, the upstream sees no request for
//! that key meanwhile, and the task ends `upstream_throttled`.

use std::time::{Duration, Instant};

use quota_worker::outcome::OutcomeKind;
use quota_worker::quota::{Decision, RejectedBy, request_id};
use simulator::{Fault, SimConfig};

use crate::support::machine;
use crate::support::pipeline::{Pipeline, Seen, kinds};
use crate::support::world;
use crate::support::{self, Endpoint};

const FOUR: [&str; 4] = ["US", "GB", "DE", "FR"];

/// The job `hot` over `regions`, up to `pages` pages, on `endpoint`.
async fn start(endpoint: Endpoint, regions: &[&str], pages: u32, sim: SimConfig) -> Pipeline {
    Pipeline::start(sim, |sim| {
        let job = world::one_file_job("hot", sim, regions.iter().copied());
        world::answering(endpoint, job.pages(pages))
    })
    .await
}

fn sim(pages: u32) -> SimConfig {
    SimConfig {
        pages_per_query: pages,
        items_per_page: 2,
        ..SimConfig::default()
    }
}

/// While the block lasts: a spend from anyone is refused as blocked, `quota
/// --json` shows it, and a whole new tick ends `quota_exhausted` without
/// the upstream seeing a request.
async fn assert_blocked(p: &Pipeline, at_most: Duration) -> Duration {
    let usage = p.peek(world::CREDENTIAL).await;
    assert!(
        usage.blocked_for > Duration::ZERO && usage.blocked_for <= at_most,
        "blocked for {:?}, expected (0, {at_most:?}]",
        usage.blocked_for
    );
    match p
        .limiter
        .spend(world::ENDPOINT, None, &request_id())
        .await
        .expect("spend")
    {
        Decision::Rejected(r) => {
            assert_eq!(r.by, RejectedBy::Blocked);
            assert!(r.retry_after > Duration::ZERO && r.retry_after <= at_most);
        }
        d => panic!("a spend during the block was {d:?}"),
    }
    let out = p.cli(&["quota", world::CREDENTIAL, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("quota --json: {e}: {}", support::stderr(&out)));
    let blocked_ms = json["credentials"][0]["blocked_for_ms"]
        .as_u64()
        .unwrap_or(0);
    assert!(blocked_ms > 0, "quota --json: {json}");

    let charges = p.sim_stats().charges.len();
    let requests = |p: &Pipeline| {
        let s = p.sim_stats();
        let k = s.key(world::SECRET);
        (s.charges.len(), k.injected, k.quota_errors, k.bad_requests)
    };
    let before = requests(p);
    let jobs = p.config.jobs["hot"].items() as usize;
    let evs = p.tick("hot", jobs, Duration::from_secs(10)).await;
    assert_eq!(evs.len(), jobs, "{evs:?}");
    for s in &evs {
        assert_eq!(s.kind(), OutcomeKind::QuotaExhausted, "{s:?}");
        assert_eq!(s.ev.outcome.pages, 0);
        let ra = s.ev.outcome.retry_after.expect("retry-after");
        assert!(ra <= at_most, "retry-after {ra:?} is the block's end");
    }
    assert_eq!(
        requests(p),
        before,
        "the upstream saw a request during the block"
    );
    assert_eq!(p.sim_stats().charges.len(), charges);
    usage.blocked_for
}

/// Waits out the block, then a new tick fetches again: the block ends.
async fn assert_unblocked_after(p: &Pipeline, blocked_for: Duration) -> Vec<Seen> {
    tokio::time::sleep(blocked_for + Duration::from_millis(100)).await;
    assert_eq!(p.peek(world::CREDENTIAL).await.blocked_for, Duration::ZERO);
    let jobs = p.config.jobs["hot"].items() as usize;
    let evs = p.tick("hot", jobs, Duration::from_secs(10)).await;
    assert!(
        evs.iter().all(|s| s.kind() == OutcomeKind::Done),
        "after the block: {:?}",
        kinds(&evs)
    );
    evs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_429_with_retry_after_blocks_the_credential_for_every_worker() {
    let _machine = machine::timing();
    let mut p = start(
        world::endpoint(),
        &FOUR,
        1,
        sim(1).key(world::SECRET, 1000, Duration::from_secs(3600)),
    )
    .await;
    p.sim.inject(
        Fault::TooManyRequests {
            retry_after_secs: 3,
        },
        1,
    );
    let evs = p.tick("hot", 4, Duration::from_secs(10)).await;
    let throttled: Vec<_> = evs
        .iter()
        .filter(|s| s.kind() == OutcomeKind::UpstreamThrottled)
        .collect();
    assert_eq!(throttled.len(), 1, "{evs:?}");
    let t = throttled[0];
    assert_eq!(t.ev.outcome.status, Some(429));
    let ra = t.ev.outcome.retry_after.expect("retry-after");
    assert_eq!(
        ra,
        Duration::from_secs(3),
        "blocked for the upstream's Retry-After"
    );
    // The tasks that had not sent their request yet were refused by the
    // block; one already in flight on the other slot may have gone through.
    for s in &evs {
        assert!(
            matches!(
                s.kind(),
                OutcomeKind::UpstreamThrottled | OutcomeKind::QuotaExhausted | OutcomeKind::Done
            ),
            "{s:?}"
        );
    }
    assert!(
        evs.iter()
            .filter(|s| s.kind() == OutcomeKind::QuotaExhausted)
            .count()
            >= 2,
        "{:?}",
        kinds(&evs)
    );
    let blocked = assert_blocked(&p, ra).await;
    // Nothing reached the upstream from the 429 until the block ended.
    let block_end = t.at + blocked;
    assert!(Instant::now() < block_end, "the checks outlasted the block");
    assert_unblocked_after(&p, block_end - Instant::now()).await;
    let stats = p.sim_stats();
    assert!(
        stats
            .charges
            .iter()
            // A request already in flight on the other slot when the 429
            // came may land just after it.
            .all(|c| c.at < t.at + Duration::from_millis(50)
                || c.at >= block_end - Duration::from_millis(100)),
        "a request reached the upstream during the block"
    );
    assert_eq!(stats.key(world::SECRET).too_many_requests, 1);
    p.stop().await;
}

/// YouTube's way: 403 `quotaExceeded` when the upstream's own quota is
/// tighter than ours. No Retry-After: the endpoint's `throttle_block`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_403_quota_exceeded_blocks_for_throttle_block() {
    let _machine = machine::timing();
    // The upstream allows 2 units an hour; we think 1000.
    let mut p = start(
        world::endpoint().throttle_block("3s"),
        &["US"],
        3,
        sim(3).key(world::SECRET, 2, Duration::from_secs(3600)),
    )
    .await;
    let evs = p.tick("hot", 1, Duration::from_secs(10)).await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    let o = &evs[0].ev.outcome;
    assert_eq!(o.kind, OutcomeKind::UpstreamThrottled, "{o:?}");
    assert_eq!(o.status, Some(403));
    assert!(o.detail.contains("quotaExceeded"), "{}", o.detail);
    assert_eq!((o.page, o.pages), (3, 2));
    assert_eq!(o.retry_after, Some(Duration::from_secs(3)));
    assert_eq!(p.sim_stats().key(world::SECRET).quota_errors, 1);
    assert_blocked(&p, Duration::from_secs(3)).await;
    // The cursor was kept at page 3: the refused page is the next one asked for.
    let cursor: String = p
        .redis
        .cmd(&["GET", &support::keys::keys().cursor("hot", "region=US")]);
    assert!(cursor.contains(r#""page":3"#), "{cursor}");
    assert_eq!(
        p.sim_stats().key(world::SECRET).quota_errors,
        1,
        "no request while blocked"
    );
    p.stop().await;
}

/// 403 `rateLimitExceeded` (YouTube's per-minute limit) blocks the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upstream_403_rate_limit_exceeded_blocks_the_credential() {
    let _machine = machine::timing();
    let mut p = start(
        world::endpoint().throttle_block("2s"),
        &FOUR,
        1,
        sim(1).key(world::SECRET, 1000, Duration::from_secs(3600)),
    )
    .await;
    p.sim.inject(Fault::RateLimitExceeded, 1);
    let evs = p.tick("hot", 4, Duration::from_secs(10)).await;
    let throttled: Vec<_> = evs
        .iter()
        .filter(|s| s.kind() == OutcomeKind::UpstreamThrottled)
        .collect();
    assert_eq!(throttled.len(), 1, "{evs:?}");
    assert_eq!(throttled[0].ev.outcome.status, Some(403));
    assert!(throttled[0].ev.outcome.detail.contains("rateLimitExceeded"));
    let blocked = assert_blocked(&p, Duration::from_secs(2)).await;
    assert_unblocked_after(&p, blocked).await;
    p.stop().await;
}

/// GitHub's way: every answer says how much is left and when it resets.
/// When `remaining` reaches 0 the credential is blocked until the reset, so
/// the upstream never has to refuse anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ratelimit_headers_at_zero_block_until_the_reset() {
    let _machine = machine::timing();
    let per = Duration::from_secs(3);
    let mut p = start(
        world::endpoint().ratelimit_headers("x-ratelimit-remaining", "x-ratelimit-reset"),
        &["US"],
        3,
        SimConfig {
            ratelimit_headers: true,
            ..sim(3)
        }
        .key(world::SECRET, 3, per),
    )
    .await;
    let evs = p.tick("hot", 1, Duration::from_secs(10)).await;
    // All three pages fit the upstream's 3; the third answer said 0 left.
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].kind(), OutcomeKind::Done, "{evs:?}");
    assert_eq!(evs[0].ev.outcome.pages, 3);
    // Reset is in whole epoch seconds, rounded up, plus one: at most per + 2 s.
    let blocked = assert_blocked(&p, per + Duration::from_secs(2)).await;
    let stats = p.sim_stats();
    let first = stats.charges[0].at;
    assert_unblocked_after(&p, blocked).await;
    let stats = p.sim_stats();
    assert_eq!(
        stats.key(world::SECRET).quota_errors,
        0,
        "the upstream never had to refuse"
    );
    assert_eq!(stats.charges.len(), 6);
    assert!(
        stats.charges[3].at - first >= per,
        "the fourth request came {:?} after the first, before the upstream's reset",
        stats.charges[3].at - first
    );
    p.stop().await;
}
