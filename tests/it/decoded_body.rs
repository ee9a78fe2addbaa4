//! Issue 22, item 3: what decoding an answer builds is bounded, not only
//! the bytes read. A body under `max_body` that would decode to more than
//! 4 × `max_body` of memory, nest deeper than 64 levels, or hold more than
//! the endpoint's `max_records` records ends its task `failed` with the
//! reason, nothing written, and the daemon's memory stays bounded and comes
//! back. The real binary as a daemon, a real `redis-server`, the hostile
//! upstream's canned answers on loopback.

use crate::support::canned::CannedRig;
use crate::support::hostile::Hostile;
use crate::support::machine;
use crate::support::procfs::status_kib;

/// `{"items":[0,0,…]}` with `n` zeros: `2n + 11` bytes.
fn zeros(n: usize) -> Vec<u8> {
    let mut body = b"{\"items\":[".to_vec();
    body.extend_from_slice(&b"0,".repeat(n - 1));
    body.extend_from_slice(b"0]}");
    body
}

/// Issue 22, item 3: 16 MiB of `{"items":[0,0,…]}` (8 million elements,
/// under the default `max_body`) took the peak RSS from 16 MB to 860 MB
/// and wrote 608 MB of jsonl. Now decoding stops at 4 × max_body, the task
/// ends `failed` with the reason, nothing is written, and the memory comes
/// back.
#[test]
fn issue_22_3_a_body_that_decodes_too_large_is_refused_with_memory_bounded() {
    let _machine = machine::heavy();
    let upstream = Hostile::start();
    // 8,388,602 elements: 16 MiB less a byte, under the default max_body.
    let body = zeros(((16 << 20) - 11) / 2);
    assert_eq!(body.len(), (16 << 20) - 1);
    upstream.answer("zeros", 200, &[], body);
    let rig = CannedRig::start(
        &upstream,
        "k3y-for-item-3",
        CannedRig::endpoint(),
        &["zeros"],
    );
    let pid = rig.daemon.pid();
    let before = status_kib(pid, "VmRSS");
    let (outcomes, _) = rig.tick(1);
    let peak = status_kib(pid, "VmHWM");
    let after = status_kib(pid, "VmRSS");
    eprintln!(
        "issue 22 item 3: daemon RSS {} MiB before, peak {} MiB, {} MiB after the page",
        before / 1024,
        peak / 1024,
        after / 1024
    );
    let o = &outcomes[0];
    assert_eq!(o["outcome"], "failed", "{o}");
    assert_eq!(
        CannedRig::message(o),
        "bad response: decoded, the body would take more than 64 MiB of memory (4 x max_body); refused",
        "{o}"
    );
    assert_eq!(o["units"], 1, "the upstream answered: {o}");
    assert!(
        !rig.cfg.join("data/leak/zeros.jsonl").exists(),
        "nothing is written"
    );
    // The body (16 MiB), what decoding built before it stopped (64 MiB as
    // charged) and the daemon itself; 860 MB before the fix.
    assert!(peak < 200 * 1024, "peak RSS {} MiB", peak / 1024);
    assert!(
        after < before + 32 * 1024,
        "RSS {} MiB after the page, {} MiB before it",
        after / 1024,
        before / 1024
    );
}

/// Issue 22, item 3: a page's records are bounded by the endpoint's
/// `max_records` (default 100,000): one with more is refused whole (its
/// records would each become a line of the sink).
#[test]
fn issue_22_3_a_page_over_max_records_is_refused() {
    let upstream = Hostile::start();
    upstream.answer("many", 200, &[], zeros(100_001));
    upstream.answer("few", 200, &[], zeros(4));
    let endpoint = CannedRig::endpoint().set("max_records", 100_000);
    let rig = CannedRig::start(&upstream, "k3y-for-item-3", endpoint, &["many", "few"]);
    let (outcomes, _) = rig.tick(2);
    let many = CannedRig::outcome(&outcomes, "many");
    assert_eq!(many["outcome"], "failed", "{many}");
    assert_eq!(
        CannedRig::message(many),
        "bad response: 100001 records at \"/items\", over the endpoint's max_records 100000; nothing written"
    );
    assert!(!rig.cfg.join("data/leak/many.jsonl").exists());
    let few = CannedRig::outcome(&outcomes, "few");
    assert_eq!(few["outcome"], "done", "{few}");
    let written = std::fs::read_to_string(rig.cfg.join("data/leak/few.jsonl")).expect("few");
    assert_eq!(written.lines().count(), 4);
}

/// Issue 22, item 3: nesting is bounded (64 levels).
#[test]
fn issue_22_3_a_body_nested_too_deep_is_refused() {
    let upstream = Hostile::start();
    let deep = format!("{{\"items\":[{}{}]}}", "[".repeat(64), "]".repeat(64));
    upstream.answer("deep", 200, &[], deep);
    let rig = CannedRig::start(
        &upstream,
        "k3y-for-item-3",
        CannedRig::endpoint(),
        &["deep"],
    );
    let (outcomes, _) = rig.tick(1);
    assert_eq!(outcomes[0]["outcome"], "failed");
    assert_eq!(
        CannedRig::message(&outcomes[0]),
        "bad response: the body nests arrays and objects deeper than 64 levels; refused"
    );
}
