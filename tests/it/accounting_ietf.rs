//! Promise (SPEC Part 2, "Upstream accounting", `accounting = "ietf"`):
//! the `RateLimit` structured field's `r` resyncs the mirrored window, and
//! `r=0` blocks the credential for `t` seconds (`headers_at_zero`), so the
//! upstream never has to answer 429; after `t` the run goes on.

use std::time::Duration;

use simulator::{SimAccounting, SimConfig};

use crate::accounting::{Rig, config, job};
use crate::support::world::SECRET;
use crate::support::{Window, wait_every};

#[test]
fn r0_blocks_for_t_seconds_and_the_upstream_never_answers_429() {
    let _machine = crate::support::machine::timing();
    // 4 requests per 4 s (from the first); the job wants 6 pages.
    let sim = SimConfig {
        pages_per_query: 6,
        items_per_page: 2,
        accounting: SimAccounting::Ietf,
        ..SimConfig::default()
    }
    .key(SECRET, 4, Duration::from_secs(4));
    let rig = Rig::on(sim, |base| {
        config(
            Window::sliding(100, "4s").upstream(),
            1,
            |e| e.set("accounting", "ietf"),
            job(base, &["US"]).pages(6),
        )
    });
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(75), "{summary}");
    let (blocked, why) = rig.blocked();
    assert_eq!(why.as_deref(), Some("headers_at_zero"));
    // t is whole seconds until the window resets, rounded up: at most 4.
    assert!(
        blocked > Duration::from_millis(1500) && blocked <= Duration::from_secs(4),
        "{blocked:?}"
    );
    let o = rig.outcomes();
    let last = o.last().expect("an outcome");
    assert_eq!(last.kind, "quota_exhausted", "{last}");
    assert_eq!(
        (Some(last.pages), Some(last.page)),
        (Some(4), Some(5)),
        "{last}"
    );
    let ra = last.retry_after_ms.expect("retry_after_ms");
    assert!(ra > 1000 && ra <= 4000, "the block's end: {last}");
    // The mirrored window (100 units, we counted 4) was resynced to r.
    let q = rig.quota();
    assert_eq!(q["windows"][0]["remaining"], 0, "{q}");
    assert!(
        q["windows"][0]["drift"].as_u64().is_some_and(|d| d >= 90),
        "{q}"
    );

    // After t, the run goes on where it stopped: once the block has ended
    // and the drift has left the mirrored sliding window (its 4 s from the
    // resync, just before now).
    let mut q = rig.quota();
    let free = wait_every(Duration::from_secs(10), Duration::from_millis(100), || {
        q = rig.quota();
        q["blocked_for_ms"] == 0 && q["windows"][0]["drift"] == 0
    });
    assert!(free, "the block and the drift outlived t: {q}");
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(0), "{summary}");
    let m = rig.measure("ietf");
    assert_eq!(m.over_limit, 0, "the upstream answered 429: {m:?}");
    assert_eq!(m.used, 6);
}

/// Issue 24, item 3: `RateLimit: "burst";r=50;t=1, "daily";r=0;t=3000`
/// was read as its first limit only, and the next request got a 429.
/// Every listed limit is read: a window with `resource = "burst"` mirrors
/// the limit of that name, an unnamed `upstream = true` window the most
/// restrictive; the limit at 0 blocks until its `t`, and the drift it
/// left ends then.
#[test]
fn every_listed_limit_is_mirrored_and_the_one_at_zero_blocks() {
    let _machine = crate::support::machine::timing();
    // The key's own limit ("default", listed first): 20 per 30 s; "burst":
    // 3 per 2 s. The job wants 8 pages.
    let sim = SimConfig {
        pages_per_query: 8,
        items_per_page: 2,
        accounting: SimAccounting::Ietf,
        ..SimConfig::default()
    }
    .limit("burst", 3, Duration::from_secs(2))
    .key(SECRET, 20, Duration::from_secs(30));
    let rig = Rig::on(sim, |base| {
        config(
            Window::sliding(1000, "1h").upstream(),
            1,
            |e| {
                e.set("accounting", "ietf")
                    .window(Window::sliding(100, "10s").upstream().resource("burst"))
            },
            job(base, &["US"]).pages(8),
        )
    });
    let mut pages = 0;
    for _ in 0..6 {
        let (code, summary) = rig.trigger();
        let last = rig.outcomes().last().cloned().expect("an outcome");
        pages += last.pages;
        if code == Some(0) {
            break;
        }
        assert_eq!(code, Some(75), "{summary}");
        let (blocked, why) = rig.blocked();
        assert_eq!(why.as_deref(), Some("headers_at_zero"), "{summary}");
        // The block lasts until burst resets (t, 2 s at most), not longer.
        assert!(blocked <= Duration::from_secs(2), "{blocked:?}");
        let q = rig.quota();
        let burst = (q["windows"].as_array().expect("windows").iter())
            .find(|w| w["resource"] == "burst")
            .cloned()
            .expect("the burst window");
        assert_eq!(burst["remaining"], 0, "mirrors burst's r=0: {q}");
        // About time: past the block, and a second more for the upstream's
        // burst to have room for a whole burst again.
        std::thread::sleep(blocked + Duration::from_millis(1100));
    }
    assert_eq!(pages, 8, "every page, in bursts of 3");
    let m = rig.measure("ietf, several limits");
    assert_eq!(m.over_limit, 0, "the upstream answered 429: {m:?}");
    assert_eq!(m.used, 8);
    // The drift every answer left ends at its limit's reset (the last
    // answer's most restrictive limit is burst's, 2 s at most): then the
    // credential's hour admits what its own spends allow (within 3.1 s).
    let settled = |q: &serde_json::Value| {
        let hour = &q["windows"][0];
        (hour["used"].as_u64(), hour["drift"].as_u64()) == (Some(8), Some(0))
    };
    wait_every(
        Duration::from_millis(3100),
        Duration::from_millis(100),
        || settled(&rig.quota()),
    );
    let q = rig.quota();
    let hour = &q["windows"][0];
    assert_eq!(
        (hour["used"].as_u64(), hour["drift"].as_u64()),
        (Some(8), Some(0)),
        "{q}"
    );
}
