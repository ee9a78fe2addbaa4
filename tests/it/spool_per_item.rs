//! Issue 22, item 2: one item whose pages cannot be written never stops
//! another item's. The spool keeps pages in fetch order per item, not per
//! job; a page whose path can never exist (a file name over 255 bytes) is
//! not spooled at all, its task fails and the other items go on; and
//! `check` refuses a static `fan_out` value that makes such a path. The real
//! binary as a daemon, a real `redis-server`, the hostile upstream's canned
//! answers on loopback.

use std::path::Path;

use crate::support::canned::CannedRig;
use crate::support::hostile::Hostile;
use crate::support::{TestConfig, wait_until};

/// One page with one record, `id`.
fn page(id: &str) -> String {
    serde_json::json!({ "items": [{ "id": id }] }).to_string()
}

/// The ids in a JSON lines sink file, in order.
fn ids(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            v["record"]["id"].as_str().unwrap_or("").to_owned()
        })
        .collect()
}

/// The page files waiting in the spool, all jobs.
fn spooled(cfg: &TestConfig) -> usize {
    let dir = cfg.join("state/spool/leak");
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .count()
        })
        .unwrap_or(0)
}

/// Issue 22, item 2: with `fan_out_from` values `"L" × 300` and `short`,
/// the long item's page failed with ENAMETOOLONG and was spooled; replay
/// was oldest first per job, so every later page of every item queued
/// behind it: after three ticks `short.jsonl` had 1 line and the spool 5
/// pages. Now the long item's task fails (its path can never exist, nothing
/// spooled) and `short` writes every tick. Since issue 37 the refused page
/// is kept under `spool/%rejected/` and holds its item: it is fetched once.
#[test]
fn issue_22_2_a_path_that_cannot_exist_fails_only_its_own_item() {
    let upstream = Hostile::start();
    let long = "L".repeat(300);
    let job = CannedRig::job(&upstream).set(
        "fan_out_from",
        toml::Value::Table(toml::map::Map::from_iter([(
            "csv".to_owned(),
            toml::Value::String("items.csv".into()),
        )])),
    );
    let csv = format!("v\n{long}\nshort\n");
    let rig = CannedRig::start_job(
        "k3y-for-item-2",
        CannedRig::endpoint(),
        job,
        &[("items.csv", &csv)],
    );
    for tick in 1..=3 {
        upstream.answer(&long, 200, &[], page(&format!("long-{tick}")));
        upstream.answer("short", 200, &[], page(&format!("short-{tick}")));
        let (outcomes, _) = rig.tick(2 * tick);
        let this: Vec<_> = outcomes[outcomes.len() - 2..].to_vec();
        let l = CannedRig::outcome(&this, &long);
        assert_eq!(l["outcome"], "failed", "{l}");
        assert!(
            CannedRig::message(l).contains("this item's sink path cannot exist"),
            "{l}"
        );
        assert_eq!(CannedRig::outcome(&this, "short")["outcome"], "done");
        let want: Vec<String> = (1..=tick).map(|t| format!("short-{t}")).collect();
        assert_eq!(
            ids(&rig.cfg.join("data/leak/short.jsonl")),
            want,
            "tick {tick}"
        );
    }
    assert_eq!(
        spooled(&rig.cfg),
        0,
        "nothing is spooled for a path that cannot exist"
    );
    // Issue 37: the page is kept as refused for good, and it holds its
    // item: ticks 2 and 3 fetched nothing for it (no unit spent).
    let asked = upstream
        .seen()
        .iter()
        .filter(|s| s.path() == format!("/canned/{long}"))
        .count();
    assert_eq!(asked, 1, "the long item was fetched once, then held");
    let kept = std::fs::read_dir(rig.cfg.join("state/spool/%rejected/leak"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(kept, 1, "the refused page is kept, once");
}

/// Issue 22, item 2: an item whose file cannot be written for now (here a
/// directory stands where its file goes) spools its pages, and only its
/// own: the other item's pages are written at each tick. Once the file can
/// be written, its spooled pages arrive in fetch order.
#[test]
fn issue_22_2_an_item_that_cannot_be_written_holds_back_only_its_own_pages() {
    let upstream = Hostile::start();
    let rig = CannedRig::start(
        &upstream,
        "k3y-for-item-2",
        CannedRig::endpoint(),
        &["bad", "good"],
    );
    let blocker = rig.cfg.join("data/leak/bad.jsonl");
    std::fs::create_dir_all(blocker.join("in-the-way")).expect("a directory where a file goes");
    for tick in 1..=3 {
        upstream.answer("bad", 200, &[], page(&format!("bad-{tick}")));
        upstream.answer("good", 200, &[], page(&format!("good-{tick}")));
        let (outcomes, _) = rig.tick(2 * tick);
        for o in &outcomes[outcomes.len() - 2..] {
            assert_eq!(o["outcome"], "done", "a spooled page is stored: {o}");
        }
        let want: Vec<String> = (1..=tick).map(|t| format!("good-{t}")).collect();
        assert_eq!(
            ids(&rig.cfg.join("data/leak/good.jsonl")),
            want,
            "tick {tick}"
        );
        assert_eq!(spooled(&rig.cfg), tick, "bad's pages wait, and only they");
    }
    std::fs::remove_dir_all(&blocker).expect("clear the way");
    let want = ["bad-1", "bad-2", "bad-3"];
    let arrived = wait_until(std::time::Duration::from_secs(30), || ids(&blocker) == want);
    assert!(
        arrived,
        "bad.jsonl: {:?}\n{}",
        ids(&blocker),
        rig.daemon.log()
    );
    assert!(wait_until(std::time::Duration::from_secs(10), || spooled(
        &rig.cfg
    ) == 0));
}

/// Issue 22, item 2: a static `fan_out` value that makes a file name over
/// 255 bytes can be known before anything runs: `check` (and `run`) refuse
/// it at the job's `sink.path`, exit 78.
#[test]
fn issue_22_2_check_refuses_a_static_value_whose_sink_path_cannot_exist() {
    let long = "L".repeat(300);
    let main = r#"jobs = "jobs/*.toml"

[credentials.h]
secret_env = "HKEY"
windows = [{ units = 1000, per = "1h" }]

[endpoints.h]
credential = "h"
cost = 1
"#;
    let job = format!(
        r#"[leak]
schedule = "0 0 0 1 1 * 2099"
endpoint = "h"
fan_out = {{ v = ["short", "{long}"] }}

[leak.request]
url = "http://127.0.0.1:9/{{v}}"

[leak.sink]
kind = "jsonl"
path = "data/{{job}}/{{v}}.jsonl"
"#
    );
    let cfg = TestConfig::new(main, &[("leak.toml", &job)]);
    for cmd in ["check", "run"] {
        let out = cfg.run(
            &[cmd],
            &[
                ("HKEY", "x"),
                ("QUOTA_WORKER_REDIS_URL", "redis://127.0.0.1:9/"),
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{cmd}: {err}");
        assert!(
            err.contains("leak.toml:11:") && err.contains("leak.sink.path"),
            "{cmd}: {err}"
        );
        assert!(
            err.contains("a file name of this path would be 306 bytes")
                && err.contains("v = \"LLLL")
                && err.contains("at most 255 bytes"),
            "{cmd}: {err}"
        );
    }
}
