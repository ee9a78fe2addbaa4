//! Promise: a shadow window (`mode = "shadow"`, SPEC Part 4) is evaluated
//! in the same spend as the enforced windows and records what it would
//! admit, but never refuses: a spend it alone would refuse is admitted and
//! counted as its shadow refusal (the spend's reply, `spend --json`, `quota
//! --json`, `/metrics`, the status page, the log). Switched to enforced
//! (by reload), it keeps its keys and refuses from what it already holds.
//! Every window kind; and through the real daemon, a tick of 30 items.

use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Decision, Limiter, RejectedBy, SpendOptions, Spent, request_id};

use serde_json::{Value, json};

use crate::support::http::{http_get, scrape, wait_http};
use crate::support::process::run_cli;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world;
use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window, free_port,
};

/// Credential `k` with an enforced window of 100 and a shadow one of 10 of
/// the same kind and period (`shadow`: whether the second is a shadow).
fn config(enforced: Window, tried: Window, shadow: bool) -> TestConfig {
    let tried = if shadow { tried.shadow() } else { tried };
    ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(enforced).window(tried))
        .endpoint(Endpoint::new("e", "k", 1))
        .write()
}

async fn limiter(server: &RedisServer, cfg: &TestConfig) -> Limiter {
    let config = Config::load(&cfg.path()).expect("config");
    support::limiter(server, &config).await
}

async fn spend(limiter: &Limiter, id: &str) -> Spent {
    (limiter.spend_shadowed("e", id, SpendOptions::new()).await).expect("spend")
}

/// 30 spends of 1 on windows of 100 (enforced) and 10 (shadow): all 30
/// admitted, the last 20 named as window 2's shadow refusals, and the
/// shadow window holds 10 (what it admitted), the enforced one 30. Returns
/// the ids spent.
async fn thirty(limiter: &Limiter) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..30 {
        let id = request_id();
        let s = spend(limiter, &id).await;
        assert!(
            matches!(s.decision, Decision::Allowed { .. }),
            "spend {i}: {s:?}"
        );
        let want: &[usize] = if i < 10 { &[] } else { &[2] };
        assert_eq!(s.shadow_refused, want, "spend {i}");
        if let Decision::Allowed { remaining } = s.decision {
            // The enforced window's remaining: a shadow window counts in
            // none of a spend's numbers.
            assert_eq!(remaining, 100 - 1 - i as u64, "spend {i}");
        }
        ids.push(id);
    }
    let usage = limiter.peek("k").await.expect("peek");
    let used: Vec<u64> = usage.windows.iter().map(|w| w.used).collect();
    assert_eq!(used, [30, 10], "enforced, shadow");
    assert_eq!(
        (usage.windows.iter().map(|w| w.shadow_refusals)).collect::<Vec<_>>(),
        [0, 20],
        "the shadow window's refusals, from its 24-hour ring"
    );
    ids
}

/// A window of `kind` switched from shadow to enforced (a new config on
/// the same keys) refuses from what it holds, naming itself.
async fn switched(server: &RedisServer, enforced: Window, tried: Window) {
    let cfg = config(enforced, tried, false);
    let limiter = limiter(server, &cfg).await;
    let s = spend(&limiter, &request_id()).await;
    match s.decision {
        Decision::Rejected(r) => {
            assert!(
                matches!(r.by, RejectedBy::Window(2) | RejectedBy::InFlight(2)),
                "{r:?}"
            );
        }
        other => panic!("the window switched to enforced admitted: {other:?}"),
    }
    assert!(s.shadow_refused.is_empty());
    let usage = limiter.peek("k").await.expect("peek");
    assert_eq!(usage.windows[1].used, 10, "the state it held as a shadow");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_sliding_window_counts_what_it_would_refuse_and_enforced_refuses_from_it() {
    let server = RedisServer::start();
    let cfg = config(Window::sliding(100, "1h"), Window::sliding(10, "1h"), true);
    thirty(&limiter(&server, &cfg).await).await;
    switched(
        &server,
        Window::sliding(100, "1h"),
        Window::sliding(10, "1h"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_fixed_window_counts_what_it_would_refuse_and_enforced_refuses_from_it() {
    let server = RedisServer::start();
    let cfg = config(Window::fixed(100, "1d"), Window::fixed(10, "1d"), true);
    thirty(&limiter(&server, &cfg).await).await;
    switched(&server, Window::fixed(100, "1d"), Window::fixed(10, "1d")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_bucket_counts_what_it_would_refuse_and_enforced_refuses_from_it() {
    let server = RedisServer::start();
    // Refilled at 10 an hour: nothing drains during the test.
    let cfg = config(Window::bucket(100, "1h"), Window::bucket(10, "1h"), true);
    thirty(&limiter(&server, &cfg).await).await;
    switched(&server, Window::bucket(100, "1h"), Window::bucket(10, "1h")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_concurrent_window_holds_only_the_leases_it_would_grant() {
    let server = RedisServer::start();
    let cfg = config(Window::concurrent(100), Window::concurrent(10), true);
    let limiter = limiter(&server, &cfg).await;
    let ids = thirty(&limiter).await;
    // The 20 it would have refused hold no lease in it: their settles
    // return the enforced window's leases only.
    for id in &ids[10..] {
        limiter.settle("e", id, 1).await.expect("settle");
    }
    let usage = limiter.peek("k").await.expect("peek");
    assert_eq!(usage.windows[0].used, 10);
    assert_eq!(usage.windows[1].used, 10, "its own 10 leases, still held");
    switched(&server, Window::concurrent(100), Window::concurrent(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_spend_is_not_counted_again_and_a_refused_one_is_no_shadow_refusal() {
    let server = RedisServer::start();
    let cfg = ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(3, "1h"))
                .window(Window::sliding(1, "1h").shadow()),
        )
        .endpoint(Endpoint::new("e", "k", 1))
        .write();
    let limiter = limiter(&server, &cfg).await;
    assert!(spend(&limiter, "a").await.shadow_refused.is_empty());
    let b = spend(&limiter, "b").await;
    assert_eq!(b.shadow_refused, [2]);
    // The same request id again: the spend that happened, not a new one.
    let again = spend(&limiter, "b").await;
    assert!(matches!(again.decision, Decision::Allowed { .. }));
    assert!(again.shadow_refused.is_empty(), "{again:?}");
    assert_eq!(spend(&limiter, "c").await.shadow_refused, [2]);
    // The enforced window is full: refused, and no shadow refusal.
    let d = spend(&limiter, "d").await;
    assert!(matches!(d.decision, Decision::Rejected(_)), "{d:?}");
    assert!(d.shadow_refused.is_empty());
    let usage = limiter.peek("k").await.expect("peek");
    assert_eq!(usage.windows[1].shadow_refusals, 2);
    assert_eq!(usage.windows[0].used, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_that_never_fits_a_shadow_window_is_admitted_and_counted() {
    let server = RedisServer::start();
    let cfg = ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::sliding(100, "1h"))
                .window(Window::sliding(5, "1m").shadow()),
        )
        .endpoint(Endpoint::new("e", "k", 8))
        .write();
    let out = cfg.run_on(&server, &["spend", "e", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let j = support::json(&out);
    assert_eq!(j["allowed"], true);
    assert_eq!(j["remaining"], 92);
    assert_eq!(j["shadow_refused"], serde_json::json!([2]));
    let out = cfg.run_on(&server, &["quota", "k", "--json"]);
    let j = support::json(&out);
    let w = &j["credentials"][0]["windows"];
    assert_eq!(w[1]["mode"], "shadow");
    assert_eq!(w[1]["shadow_refusals"], 1);
    assert_eq!(w[1]["used"], 0, "what it would refuse, it does not record");
    assert!(w[0].get("mode").is_none(), "{}", w[0]);
}

/// The daemon's credential: an enforced 100 a minute and a shadow (or,
/// `shadow = false`, enforced) 10 a minute; the metrics and status page on
/// `port`; a job of 30 regions, one page each.
fn daemon_config(upstream: &Upstream, port: u16, shadow: bool) -> ConfigBuilder {
    let tried = Window::sliding(10, "1m");
    let tried = if shadow { tried.shadow() } else { tried };
    let regions: Vec<String> = (1..=30).map(|i| format!("R{i:02}")).collect();
    let regions: Vec<&str> = regions.iter().map(String::as_str).collect();
    ConfigBuilder::new()
        .worker(world::quick_worker(4))
        .metrics_listen(&format!("127.0.0.1:{port}"))
        .credential(world::credential(Window::sliding(100, "1m")).window(tried))
        .endpoint(world::endpoint())
        .job(world::videos_job(
            world::JOB,
            world::ENDPOINT,
            &upstream.base_url(),
            &regions,
            1,
        ))
}

#[test]
fn a_tick_of_30_spends_30_and_every_report_counts_20_shadow_refusals_then_sighup_enforces() {
    let redis = RedisServer::start();
    let upstream = Upstream::with(world::sim(1, 2));
    let port = free_port();
    let cfg = daemon_config(&upstream, port, true).write();
    let mut rig = Rig::start(redis, cfg, &[]);
    let (cfg, redis, d) = (&mut rig.cfg, &mut rig.redis, &mut rig.daemon);
    assert!(wait_http(port, Duration::from_secs(10)));

    let cli = |cfg: &TestConfig, args: &[&str]| {
        run_cli(cfg, Some(&redis.url()), args, Duration::from_secs(90))
    };
    let (code, out, err) = cli(cfg, &["trigger", world::JOB, "--wait"]);
    assert_eq!(code, Some(0), "{out}\n{err}\n{}", d.log());
    // Every item ran: the shadow window refused nothing for real.
    assert_eq!(upstream.fetched(), 30, "the upstream saw every request");
    let done = (d.outcomes().iter())
        .filter(|o| o["outcome"] == "done")
        .count();
    assert_eq!(done, 30, "{}", d.log());

    // quota --json: the shadow window holds the 10 it would have admitted,
    // and counts the 20 it would have refused.
    let (code, out, err) = cli(cfg, &["quota", world::CREDENTIAL, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let j: Value = serde_json::from_str(&out).expect("json");
    let w = &j["credentials"][0]["windows"];
    assert_eq!(w[0]["used"], 30);
    assert_eq!(
        (&w[1]["mode"], &w[1]["used"]),
        (&json!("shadow"), &json!(10))
    );
    assert_eq!(w[1]["shadow_refusals"], 20, "{}", w[1]);
    // quota (text) marks it.
    let (_, text, _) = cli(cfg, &["quota", world::CREDENTIAL]);
    assert!(text.contains("SHADOW (20 refusals in 24 h)"), "{text}");

    // /metrics: the daemon's counter, by credential and window.
    let m = scrape(port);
    let labels = [("credential", world::CREDENTIAL), ("window", "10/1m")];
    assert_eq!(m.one("qw_shadow_refusals_total", &labels), 20.0);

    // The status page: its data and the page itself.
    let (status, body) = http_get(port, "/api/status").expect("/api/status");
    assert_eq!(status, 200);
    let api: Value = serde_json::from_str(&body).expect("status json");
    let cred = (api["credentials"].as_array().expect("credentials").iter())
        .find(|c| c["name"] == world::CREDENTIAL)
        .expect("the credential");
    let sw = &cred["windows"][1];
    assert_eq!(
        (&sw["mode"], &sw["shadow_refusals"]),
        (&json!("shadow"), &json!(20)),
        "{sw}"
    );
    let (_, page) = http_get(port, "/").expect("/");
    assert!(
        page.contains("would have refused 20 spends in 24 h"),
        "{page}"
    );

    // The log: the first shadow refusal at INFO, once within the minute.
    let lines: Vec<String> = (d.stderr_lines().into_iter())
        .filter(|l| l.contains("shadow window would have refused"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("INFO") || lines[0].contains("\"level\":\"INFO\""),
        "{}",
        lines[0]
    );

    // spend --json names the window that would refuse the 31st spend.
    let (code, out, _) = cli(cfg, &["spend", world::ENDPOINT, "--json"]);
    assert_eq!(code, Some(0));
    let s: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(
        (&s["allowed"], &s["shadow_refused"]),
        (&json!(true), &json!([2]))
    );

    // SIGHUP with the window enforced: same keys, so it refuses from the
    // 10 it holds. The next tick fetches nothing.
    cfg.rewrite(&daemon_config(&upstream, port, false));
    let pid = d.pid().to_string();
    let (code, out, err) = cli(cfg, &["reload", "--pid", &pid]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let (code, out, err) = cli(cfg, &["spend", world::ENDPOINT, "--json"]);
    assert_eq!(code, Some(75), "{out}\n{err}");
    let s: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(s["rejecting_window"], 2, "{s}");
    let (code, out, err) = cli(cfg, &["trigger", world::JOB, "--wait"]);
    assert_ne!(code, Some(0), "{out}\n{err}");
    assert_eq!(upstream.fetched(), 30, "nothing more reached the upstream");
    let stopped = (d.outcomes().iter())
        .filter(|o| o["outcome"] == "quota_exhausted")
        .count();
    assert!(stopped > 0, "{}", d.log());
}

#[test]
fn check_judges_a_shadow_window_as_if_enforced_without_failing() {
    let upstream = Upstream::with(world::sim(1, 2));
    let cfg = daemon_config(&upstream, free_port(), true).write();
    let out = cfg.run(&["check"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        support::stderr(&out)
    );
    let line = (text.lines())
        .find(|l| l.contains("10/1m"))
        .unwrap_or_else(|| panic!("no line for the shadow window:\n{text}"));
    assert!(line.contains("would not fit (shadow"), "{line}");
    assert!(text.contains("a shadow window"), "{text}");
}

#[test]
fn a_bad_mode_and_a_window_given_twice_exit_78_at_their_line_and_field() {
    let cfg = TestConfig::new(
        r#"[credentials.k]
secret_env = "K"
windows = [
  { units = 100, per = "1m" },
  { units = 10, per = "1m", mode = "dry-run" },
  { units = 100, per = "1m", mode = "shadow" },
]

[endpoints.e]
credential = "k"
cost = 1
"#,
        &[],
    );
    let out = cfg.run(&["check"], &[("K", "x")]);
    let err = support::stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains(":5:36: credentials.k.windows[1].mode: unknown window mode \"dry-run\": use \"enforce\" or \"shadow\""),
        "{err}"
    );
    assert!(
        err.contains(":6:3: credentials.k.windows[2]: two sliding windows of 100/1m"),
        "{err}"
    );
}
