//! Promise (SPEC Part 2, "Upstream accounting", `accounting = "github"`):
//! with `upstream = true` on the window that mirrors GitHub's limit, the
//! first answer resyncs it to `x-ratelimit-remaining`, so when other
//! programs share the token the drift is recorded (`quota --json`) and
//! GitHub never answers "API rate limit exceeded" to quota-worker; at 0 the
//! credential is blocked until `x-ratelimit-reset` (`headers_at_zero`). A
//! secondary rate limit blocks every worker and the CLI for at least 60 s
//! (`secondary_limit`), twice that on the next one in a row.

use std::time::Duration;

use simulator::{Fault, SimConfig};

use crate::accounting::{Rig, config, job, paged};
use crate::support::Window;
use crate::support::world::{self, SECRET};

const REPOS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// GitHub: `units` requests per hour from the first one, pages by `Link`.
fn github(units: u64, pages: u32) -> SimConfig {
    crate::accounting::github(pages).key(SECRET, units, Duration::from_secs(3600))
}

fn rig(sim: SimConfig, burn: u64, units: u64, pages: u32) -> Rig {
    Rig::start(
        sim,
        |up| assert_eq!(up.burn(SECRET, burn), burn, "the other program's requests"),
        |base| {
            let j = paged(job(base, &REPOS), &[("style", "link")], pages)
                .sink(crate::support::Sink::jsonl("data/{job}/{region}.jsonl"));
            // Four slots: several requests in flight when GitHub's count
            // runs out, as with any real concurrency.
            config(
                Window::sliding(units, "1h").upstream(),
                1,
                |e| e.set("accounting", "github"),
                j,
            )
            .worker(world::quick_worker(4))
        },
    )
}

/// Issue 13: with another program on the token, quota-worker believed it
/// had requests left, sent them, and collected 403s before blocking.
#[test]
fn another_program_on_the_token_is_drift_and_github_never_says_exceeded() {
    let _machine = crate::support::machine::timing();
    // GitHub allows 60 an hour; another program has used 24 of them; the
    // job wants 6 repos x 10 pages = 60.
    let rig = rig(github(60, 10), 24, 60, 10);
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(75), "{summary}");
    let m = rig.measure("github");
    assert_eq!(
        m.over_limit, 0,
        "GitHub answered 'rate limit exceeded' to quota-worker"
    );
    assert_eq!(m.used + m.burned + m.left, 60, "{m:?}");
    // A resync leaves room for the other slots' requests in flight, which
    // GitHub may have counted already: at most those 3 are left unused.
    assert!(
        m.left <= 3,
        "GitHub allowed {} requests that were never sent: {m:?}",
        m.left
    );
    let q = rig.quota();
    let drift = q["windows"][0]["drift"].as_u64().expect("drift");
    assert!(
        (24..=27).contains(&drift),
        "the other program's 24 (and at most 3 in flight): {q}"
    );
    assert_eq!(q["windows"][0]["remaining"], 0, "{q}");
    // When GitHub said 0 left: blocked until its reset, an hour from the
    // first request (the other program's).
    let (blocked, why) = rig.blocked();
    if m.left == 0 {
        assert_eq!(why.as_deref(), Some("headers_at_zero"), "{q}");
        assert!(
            blocked > Duration::from_secs(3500) && blocked <= Duration::from_secs(3602),
            "{blocked:?}"
        );
    }
    // The daemon logged the drift.
    let drift_lines = rig
        .daemon
        .messages("the upstream reports fewer units left than the window admits; drift recorded");
    assert!(!drift_lines.is_empty());
    assert!(
        drift_lines
            .iter()
            .all(|l| l["credential"] == world::CREDENTIAL)
    );
}

/// Issue 13: a secondary rate limit (403, "You have exceeded a secondary
/// rate limit") was logged `failed` with no block.
#[test]
fn a_secondary_limit_blocks_every_worker_and_the_cli_for_60s_then_120s() {
    let _machine = crate::support::machine::timing();
    let sim = github(5000, 1);
    let rig = rig(sim, 0, 5000, 1);
    rig.upstream.inject(
        Fault::GithubSecondary {
            retry_after_secs: None,
        },
        1,
    );
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(75), "{summary}");
    assert!(summary.contains("1 upstream_throttled"), "{summary}");
    let (blocked, why) = rig.blocked();
    assert_eq!(why.as_deref(), Some("secondary_limit"));
    assert!(
        blocked > Duration::from_secs(55) && blocked <= Duration::from_secs(60),
        "{blocked:?}"
    );
    let outcomes = rig.outcomes();
    let throttled: Vec<_> = outcomes
        .iter()
        .filter(|o| o.kind == "upstream_throttled")
        .collect();
    assert_eq!(throttled.len(), 1);
    assert_eq!(throttled[0].status, Some(403));
    assert_eq!(throttled[0].retry_after_ms, Some(60_000));
    let msg = throttled[0].message.as_str();
    assert!(
        msg.contains("(secondary rate limit)") && msg.contains("(secondary_limit)"),
        "{msg}"
    );
    // The other workers' tasks: refused by the block, retry after it.
    for o in outcomes.iter().filter(|o| o.kind == "quota_exhausted") {
        assert!(o.retry_after_ms.is_some_and(|ms| ms > 50_000), "{o}");
    }

    // The CLI is refused too, and a whole new tick sends nothing.
    let out = rig.cfg.run(
        &["spend", world::ENDPOINT],
        &[("QUOTA_WORKER_REDIS_URL", &rig.redis.url())],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        crate::support::stdout(&out)
    );
    let before = rig.upstream.stats().requests.len();
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(75), "{summary}");
    assert!(
        summary.contains(&format!("{} quota_exhausted", REPOS.len())),
        "{summary}"
    );
    assert_eq!(
        rig.upstream.stats().requests.len(),
        before,
        "GitHub saw a request during the block"
    );

    // The next secondary limit in a row blocks twice as long. Every
    // request of this tick is limited: with four slots, a page answered
    // 200 beside the 403 is a success as late as the throttle (sent before
    // it was answered), and whether it ends the streak first depends on
    // which answer the daemon accounts first (SPEC: "a success resets the
    // streak"; 1 run in 4 blocked 60 s when one 403 was injected).
    rig.end_block();
    let before = rig.upstream.stats().requests.len();
    rig.upstream.inject(
        Fault::GithubSecondary {
            retry_after_secs: None,
        },
        REPOS.len() as u32,
    );
    let (code, summary) = rig.trigger();
    rig.upstream.clear_faults();
    assert_eq!(code, Some(75), "{summary}");
    // No success between the two throttles: each request sent was limited.
    let statuses: Vec<u16> = rig.upstream.stats().requests[before..]
        .iter()
        .map(|r| r.status)
        .collect();
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| *s == 403),
        "{statuses:?}: {summary}"
    );
    let (blocked, why) = rig.blocked();
    assert_eq!(why.as_deref(), Some("secondary_limit"));
    assert!(
        blocked > Duration::from_secs(115) && blocked <= Duration::from_secs(120),
        "{blocked:?}"
    );
    // With a retry-after, that is the wait.
    rig.end_block();
    rig.upstream.inject(
        Fault::GithubSecondary {
            retry_after_secs: Some(30),
        },
        1,
    );
    let (code, _) = rig.trigger();
    assert_eq!(code, Some(75));
    let (blocked, _) = rig.blocked();
    assert!(
        blocked > Duration::from_secs(25) && blocked <= Duration::from_secs(30),
        "{blocked:?}"
    );
}
