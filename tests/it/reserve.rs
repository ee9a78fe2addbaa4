//! Promise: a priority reserve. A spend with `reserve = P%` is admitted only
//! while every window it touches keeps at least P% of its units free after
//! it; spends without one can take everything. Its retry-after is exact for
//! the reduced limit. The same holds from the CLI (`spend --reserve`), from
//! another language (`keys --reserve`), and for a job's `reserve` in the
//! daemon; `check` shows it; a reserve that leaves no room is refused.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use quota_worker::config::{Config, Reserve};
use quota_worker::outcome::OutcomeKind;
use quota_worker::quota::{Decision, QuotaError, RejectedBy, SpendOptions, request_id};
use simulator::SimConfig;

use crate::support::keys;
use crate::support::pipeline::{Pipeline, kinds};
use crate::support::seed::spend_time_us;
use crate::support::world;
use crate::support::{self, ConfigBuilder, Job, RedisServer, Sink, TestConfig, Window, machine};

const CONFIG: &str = r#"
[credentials.k]
secret_env = "K"
windows = [{ units = 10, per = "1h" }]

[endpoints.e]
credential = "k"
cost = 1
windows = [{ units = 100, per = "1d", kind = "fixed" }]

[credentials.s]
secret_env = "S"
windows = [{ units = 10, per = "3s" }]

[endpoints.short]
credential = "s"
cost = 1
"#;

fn half() -> Reserve {
    "50%".parse().expect("50%")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_percent_reserve_admits_half_and_plain_spends_take_the_rest() {
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;

    for i in 0..5u64 {
        let d = limiter
            .spend_with(
                "e",
                &request_id(),
                SpendOptions::new().cost(None).reserve(half()),
            )
            .await
            .expect("spend");
        assert_eq!(
            d,
            Decision::Allowed { remaining: 4 - i },
            "reserved spend {i}: `remaining` is what this caller may still take"
        );
    }
    let r = support::rejected(
        limiter
            .spend_with("e", "sixth", SpendOptions::new().cost(None).reserve(half()))
            .await
            .expect("spend"),
    );
    assert_eq!(r.by, RejectedBy::Window(1));
    assert_eq!(r.remaining, 0);
    assert!(r.retry_after > Duration::from_secs(3_500), "{r:?}");

    // The plain spends take the reserved half, and no more.
    for i in 0..5u64 {
        let d = limiter
            .spend("e", None, &request_id())
            .await
            .expect("spend");
        assert_eq!(d, Decision::Allowed { remaining: 4 - i }, "plain spend {i}");
    }
    assert!(
        !limiter
            .spend("e", None, &request_id())
            .await
            .expect("spend")
            .is_allowed()
    );
    let u = limiter.peek("k").await.expect("peek");
    assert_eq!(u.windows[0].used, 10);

    // A cost that cannot fit beside the reserve is refused before Redis.
    let err = limiter
        .spend_with(
            "e",
            "big",
            SpendOptions::new().cost(Some(6)).reserve(half()),
        )
        .await
        .expect_err("6 never fits 10 less 50%");
    assert!(
        matches!(err, QuotaError::CostTooLarge { cost: 6, .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_spend_waits_exactly_for_the_reduced_limit() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let window = keys::window(&config, "s", None, 0);
    let per_us = 3_000_000;

    // Three plain spends of 2, 200 ms apart: 6 of 10 used.
    for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(
            limiter
                .spend("short", Some(2), id)
                .await
                .expect("spend")
                .is_allowed()
        );
    }
    let at = |id| spend_time_us(&server, &window, id).expect("spent");

    // With half kept free a spend may use 5: cost 1 needs 2 units freed (a's),
    // cost 3 needs 4 (a's and b's). Plain, cost 4 fits at once.
    for (cost, frees) in [(1, "a"), (3, "b")] {
        let t0 = server.time_us();
        let r = support::rejected(
            limiter
                .spend_with(
                    "short",
                    "r",
                    SpendOptions::new().cost(Some(cost)).reserve(half()),
                )
                .await
                .expect("spend"),
        );
        let t1 = server.time_us();
        let ms = r.retry_after.as_millis() as i64;
        let expiry = at(frees) + per_us;
        assert!(
            ((expiry - t1) / 1000..=(expiry - t0) / 1000 + 1).contains(&ms),
            "cost {cost}: retry_after {ms} ms, expected {frees}'s expiry in {} ms",
            (expiry - t0) / 1000
        );
        assert_eq!(r.remaining, 0, "5 allowed, 6 used");
    }
    assert!(
        limiter
            .spend("short", Some(4), "plain")
            .await
            .expect("spend")
            .is_allowed()
    );
}

fn client() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/spend_client.py")
}

#[test]
fn the_cli_and_other_languages_spend_with_a_reserve() {
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);

    // `keys --reserve` passes the reserve to the script.
    let out = cfg.run(&["keys", "e", "--reserve", "50%"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let spec = support::json(&out);
    assert_eq!(spec["args"][3], "50", "{spec}");
    let spec_path = cfg.join("keys.json");
    std::fs::write(&spec_path, &out.stdout).expect("write keys.json");
    let python = |id: &str| {
        let out = Command::new("python3")
            .arg(client())
            .arg(&spec_path)
            .arg(server.port().to_string())
            .arg(id)
            .output()
            .expect("run python3");
        assert!(out.status.success(), "{}", support::stderr(&out));
        support::json(&out)
    };

    // Python (reserved) and the CLI (reserved) share the 5 units.
    for i in 0..3 {
        let j = python(&format!("py-{i}"));
        assert_eq!(j["reply"][0], 1, "python spend {i}: {j}");
    }
    for _ in 0..2 {
        let out = cfg.run_on(&server, &["spend", "e", "--reserve", "50%", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    }
    let j = python("py-late");
    assert_eq!(j["reply"][0], 0, "the reserve holds for Python: {j}");
    assert_eq!(j["reply"][1], 0, "{j}");
    let out = cfg.run_on(&server, &["spend", "e", "--reserve", "50%", "--json"]);
    assert_eq!(out.status.code(), Some(75));
    let j = support::json(&out);
    assert_eq!(
        (j["allowed"].clone(), j["rejecting_window"].clone()),
        (false.into(), 1.into())
    );

    // Without a reserve the rest can be spent.
    let out = cfg.run_on(&server, &["spend", "e", "--cost", "5", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert_eq!(support::json(&out)["remaining"], 0);

    // A reserve that is not a whole percent from 0 to 99 is a usage error,
    // and so is a cost that cannot fit beside it.
    for bad in ["100%", "20", "-5%", "12.5%"] {
        let out = cfg.run_on(&server, &["spend", "e", &format!("--reserve={bad}")]);
        assert_eq!(out.status.code(), Some(64), "--reserve {bad}");
        assert!(
            support::stderr(&out).contains("reserve"),
            "{}",
            support::stderr(&out)
        );
    }
    let out = cfg.run_on(&server, &["spend", "e", "--cost", "6", "--reserve", "50%"]);
    assert_eq!(out.status.code(), Some(64));
    let err = support::stderr(&out);
    assert!(
        err.contains("can never fit") && err.contains("50% kept free"),
        "{err}"
    );
    let out = cfg.run(&["keys", "e", "--cost", "6", "--reserve", "50%"], &[]);
    assert_eq!(out.status.code(), Some(64));
}

/// The daemon spends with the job's reserve: of ten one-page tasks on a
/// window of 10, five run and five end `quota_exhausted`, leaving half.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_with_a_reserve_leaves_it_free() {
    let regions: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let sim = SimConfig {
        pages_per_query: 1,
        items_per_page: 1,
        ..SimConfig::default()
    }
    .key(world::SECRET, 1_000_000, Duration::from_secs(3600));
    let mut p = Pipeline::start(sim, |sim| {
        ConfigBuilder::new()
            .worker(world::quick_worker(2))
            .credential(world::credential(Window::sliding(10, "1h")))
            .endpoint(world::endpoint())
            .job(
                Job::videos("crawl", world::ENDPOINT, sim)
                    .fan_out("region", regions.iter().map(String::as_str))
                    .sink(Sink::jsonl("data/{job}.jsonl").records("/items"))
                    .set("reserve", "50%"),
            )
    })
    .await;
    let evs = p.tick("crawl", 10, Duration::from_secs(30)).await;
    let count = |k: OutcomeKind| evs.iter().filter(|s| s.kind() == k).count();
    assert_eq!(
        (count(OutcomeKind::Done), count(OutcomeKind::QuotaExhausted)),
        (5, 5),
        "{:?}",
        kinds(&evs)
    );
    assert_eq!(
        p.used(world::CREDENTIAL).await,
        5,
        "half the window is left"
    );
    p.stop().await;
}

#[test]
fn check_shows_a_jobs_reserve_and_refuses_one_that_leaves_no_room() {
    let job = |reserve: &str| {
        format!(
            "[crawl]\nschedule = \"0 0 * * * *\"\nendpoint = \"e\"\nreserve = \"{reserve}\"\n\n\
             [crawl.request]\nurl = \"http://127.0.0.1:1/x\"\n\n\
             [crawl.sink]\nkind = \"jsonl\"\npath = \"data/{{job}}.jsonl\"\n"
        )
    };
    let main = format!("jobs = \"jobs/*.toml\"\n{CONFIG}");
    let cfg = TestConfig::new(&main, &[("crawl.toml", &job("20%"))]);
    let out = cfg.run(&["check"], &[("K", "x"), ("S", "y")]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("reserve: 20% of every window stays free"),
        "{text}"
    );
    assert!(
        text.contains("job crawl keeps 20% free: spends up to 8 of 10 units"),
        "{text}"
    );
    assert!(
        text.contains("job crawl keeps 20% free: spends up to 80 of 100 units"),
        "{text}"
    );

    for (reserve, why) in [
        ("150%", "whole percent from \"0%\" to \"99%\""),
        ("half", "whole percent"),
        ("95%", "admits 0 units at most, less than e's cost 1"),
    ] {
        let cfg = TestConfig::new(&main, &[("crawl.toml", &job(reserve))]);
        let out = cfg.run(&["check"], &[("K", "x"), ("S", "y")]);
        let err = support::stderr(&out);
        assert_eq!(out.status.code(), Some(78), "{reserve}: {err}");
        assert!(
            err.contains("crawl.toml:4:"),
            "{reserve}: file:line:col: {err}"
        );
        assert!(err.contains("crawl.reserve"), "{reserve}: the field: {err}");
        assert!(err.contains(why), "{reserve}: {err}");
    }

    // An endpoint that does not charge the credential is held only to its
    // own windows: 95% of its 100 leaves 5, though of k's 10 it would leave 0.
    let own = format!(
        "{main}\n[endpoints.own]\ncredential = \"k\"\ncost = 1\ncharge_credential = false\n\
         windows = [{{ units = 100, per = \"1d\", kind = \"fixed\" }}]\n"
    );
    let cfg = TestConfig::new(
        &own,
        &[("crawl.toml", &job("95%").replace("\"e\"", "\"own\""))],
    );
    let out = cfg.run(&["check"], &[("K", "x"), ("S", "y")]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    a_50_percent_reserve_admits_half_and_plain_spends_take_the_rest,
    a_reserved_spend_waits_exactly_for_the_reduced_limit,
    a_job_with_a_reserve_leaves_it_free,
);
