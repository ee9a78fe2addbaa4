//! Promise (SPEC Part 2, "Upstream accounting", `accounting = "meta"`):
//! the usage percentages of `X-App-Usage` and `X-Business-Use-Case-Usage`
//! resync the mirrored window (the largest percentage of its units is
//! used), so the Graph API never answers "too many calls" after the first
//! answer; at `throttle_at` percent, or when the answer gives an
//! `estimated_time_to_regain_access`, the credential is blocked for that
//! many minutes (`usage`).

use std::time::Duration;

use simulator::{SimAccounting, SimConfig, SimStyle};

use crate::accounting::{Rig, config, job, paged};
use crate::support::Window;
use crate::support::world::SECRET;

/// Instagram's business use case: 20 calls per 60 s (sliding), paged by
/// `paging.next`.
fn meta(pages: u32) -> SimConfig {
    SimConfig {
        pages_per_query: pages,
        items_per_page: 2,
        style: SimStyle::NextUrl,
        accounting: SimAccounting::Meta,
        ..SimConfig::default()
    }
    .key(SECRET, 20, Duration::from_secs(60))
}

fn rig(burn: u64, regions: &[&str], pages: u32) -> Rig {
    Rig::start(
        meta(pages),
        |up| assert_eq!(up.burn(SECRET, burn), burn),
        |base| {
            let style = [("style", "next_url"), ("next", "/paging/next")];
            let j = paged(job(base, regions), &style, pages)
                .sink(crate::support::Sink::jsonl("data/{job}/{region}.jsonl").records("/data"));
            config(
                Window::sliding(20, "60s").upstream(),
                1,
                |e| e.set("accounting", "meta"),
                j,
            )
        },
    )
}

#[test]
fn usage_percentages_resync_and_100_percent_blocks_for_the_regain_time() {
    let _machine = crate::support::machine::timing();
    // Another app used 10 of the 20 calls (50%); the job wants 2 x 10 pages.
    let rig = rig(10, &["US", "GB"], 10);
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(75), "{summary}");
    let m = rig.measure("meta");
    assert_eq!(m.over_limit, 0, "Meta answered 'too many calls': {m:?}");
    assert_eq!(m.used + m.burned + m.left, 20, "{m:?}");
    assert!(m.left <= 1, "{m:?}");
    let q = rig.quota();
    let drift = q["windows"][0]["drift"].as_u64().expect("drift");
    assert!(
        (10..=11).contains(&drift),
        "the other app's 50% of 20 calls: {q}"
    );
    assert_eq!(q["windows"][0]["remaining"], 0, "{q}");
    // At 100%: blocked for the time to regain access (1 minute: the
    // window frees within it).
    let (blocked, why) = rig.blocked();
    if m.left == 0 {
        assert_eq!(why.as_deref(), Some("usage"));
        assert!(
            blocked > Duration::from_secs(55) && blocked <= Duration::from_secs(60),
            "{blocked:?}"
        );
    }
}

#[test]
fn too_many_calls_blocks_for_the_regain_time_and_ends_throttled() {
    let _machine = crate::support::machine::timing();
    // Another app used every call: the first answer is Meta's error 80002
    // with 100% and a time to regain access.
    let rig = rig(20, &["US"], 3);
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(75), "{summary}");
    let o = &rig.outcomes()[0];
    assert_eq!(o.kind, "upstream_throttled", "{o}");
    assert_eq!(o.status, Some(400));
    assert_eq!(
        o.retry_after_ms,
        Some(60_000),
        "1 minute to regain access: {o}"
    );
    let msg = o.message.as_str();
    assert!(
        msg.contains("(error code 80002)") && msg.contains("(usage)"),
        "{msg}"
    );
    let (blocked, why) = rig.blocked();
    assert_eq!(why.as_deref(), Some("usage"));
    assert!(blocked > Duration::from_secs(55), "{blocked:?}");
    let q = rig.quota();
    assert_eq!(q["windows"][0]["remaining"], 0, "resynced to 100%: {q}");
    let m = rig.measure("meta (already at 100%)");
    assert_eq!((m.over_limit, m.over_limit_after_first), (1, 0), "{m:?}");
}
