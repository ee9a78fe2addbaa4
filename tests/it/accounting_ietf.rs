//! Promise (SPEC Part 2, "Upstream accounting", `accounting = "ietf"`):
//! the `RateLimit` structured field's `r` resyncs the mirrored window, and
//! `r=0` blocks the credential for `t` seconds (`headers_at_zero`), so the
//! upstream never has to answer 429; after `t` the run goes on.

use std::time::Duration;

use simulator::{SimAccounting, SimConfig};

use crate::accounting::{Rig, config, job};
use crate::support::Window;
use crate::support::upstream::SIM_KEY;

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
    .key(SIM_KEY, 4, Duration::from_secs(4));
    let rig = Rig::start(
        sim,
        |_| {},
        |base| {
            config(
                Window::sliding(100, "4s").upstream(),
                1,
                |e| e.set("accounting", "ietf"),
                job(base, &["US"]).pages(6),
            )
        },
    );
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
    assert_eq!(last["outcome"], "quota_exhausted", "{last}");
    assert_eq!(
        (last["pages"].as_u64(), last["page"].as_u64()),
        (Some(4), Some(5)),
        "{last}"
    );
    let ra = last["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!(ra > 1000 && ra <= 4000, "the block's end: {last}");
    // The mirrored window (100 units, we counted 4) was resynced to r.
    let q = rig.quota();
    assert_eq!(q["windows"][0]["remaining"], 0, "{q}");
    assert!(
        q["windows"][0]["drift"].as_u64().is_some_and(|d| d >= 90),
        "{q}"
    );

    // After t, the run goes on where it stopped. (The drift lives in the
    // mirrored sliding window for its 4 s from the resync, just before now.)
    std::thread::sleep(Duration::from_millis(4300).max(blocked));
    let (code, summary) = rig.trigger();
    assert_eq!(code, Some(0), "{summary}");
    let m = rig.measure("ietf");
    assert_eq!(m.over_limit, 0, "the upstream answered 429: {m:?}");
    assert_eq!(m.used, 6);
}
