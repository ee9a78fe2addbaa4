//! Promise (SPEC Part 2, "Status page"): the metrics listener serves `GET /`,
//! a page a person reads in a real browser, and `GET /api/status`, its data
//! as JSON. On a running daemon (the real binary on the simulator) with a
//! window half used, a credential blocked by the upstream and a job whose
//! fan-out item, read from a CSV file, is `<script>alert(1)</script>`,
//! headless Chromium's DOM shows
//! the windows, the block and why, and the jobs with their ticks and last
//! error; the item shows as text, no secret is anywhere on the page or in
//! the JSON, each item it names links to that item's state
//! (`/api/state/JOB?item=...`, issue 35), the page is read-only (POST,
//! PUT, DELETE: 405), and it works behind a path prefix. A screenshot is saved as `target/status-page.png`.

use std::time::Duration;

use quota_worker::config::Scope;
use serde_json::Value;
use simulator::SimConfig;

use crate::support;
use crate::support::browser::Chromium;
use crate::support::http::{self, http_request};
use crate::support::keys::keys;
use crate::support::upstream::Upstream;
use crate::support::world;
use crate::support::{
    ConfigBuilder, Credential, Endpoint, Job, RedisServer, Request, Sink, Window, free_port,
    wait_until,
};

const MAIN_SECRET: &str = "main-secret-7c1e0f";
const LIMITED_SECRET: &str = "limited-secret-93ab2d";
const AUX_SECRET: &str = "aux-secret-51f04e";
const SECRETS: [&str; 3] = [MAIN_SECRET, LIMITED_SECRET, AUX_SECRET];
/// A fan-out value as it could come from a CSV cell.
const XSS: &str = "<script>alert(1)</script>";
/// `trending`: 4 regions × 5 pages at cost 1 = 20 units of `main`'s 40.
const REGIONS: [&str; 4] = ["US", "GB", "DE", "FR"];
const PAGES: u32 = 5;
const MAIN_UNITS: u64 = 40;
/// `main`'s shadow window: 15 an hour, tried beside the enforced 40.
const SHADOW_UNITS: u64 = 15;

/// `fan_out_from = { csv = path }`.
fn csv_source(path: &str) -> toml::Value {
    let mut t = toml::Table::new();
    t.insert("csv".into(), toml::Value::String(path.into()));
    toml::Value::Table(t)
}

/// A daemon with three credentials: `main` (its window to be half used by
/// `trending`), `limited` (the upstream allows its key 1 request an hour, so
/// `hot`'s second request is refused and the credential blocked) and `aux`
/// (`broken` asks for a path the upstream does not have, for the one item of
/// its CSV: XSS).
/// The shared rig on the simulator, with the three jobs and the page's
/// port.
struct Rig {
    rig: support::rig::Rig,
    port: u16,
    _upstream: Upstream,
}

impl Rig {
    fn start() -> Rig {
        let redis = RedisServer::start();
        let upstream = Upstream::with(
            SimConfig {
                pages_per_query: PAGES,
                items_per_page: 2,
                ..SimConfig::default()
            }
            .key(MAIN_SECRET, 1_000_000, Duration::from_secs(3600))
            .key(LIMITED_SECRET, 1, Duration::from_secs(3600))
            .key(AUX_SECRET, 1_000, Duration::from_secs(3600)),
        );
        let base = upstream.base_url();
        let port = free_port();
        let cfg = ConfigBuilder::new()
            .worker(world::quick_worker(4))
            .metrics_listen(&format!("127.0.0.1:{port}"))
            .credential(
                Credential::env("main", "QW_TEST_MAIN")
                    .secret(MAIN_SECRET)
                    .window(Window::sliding(MAIN_UNITS, "1h"))
                    // A tighter limit tried in shadow (issue 35): of
                    // trending's 20 spends it would have refused 5.
                    .window(Window::sliding(SHADOW_UNITS, "1h").shadow()),
            )
            .credential(
                Credential::env("limited", "QW_TEST_LIMITED")
                    .secret(LIMITED_SECRET)
                    .window(Window::sliding(1000, "1h")),
            )
            .credential(
                Credential::env("aux", "QW_TEST_AUX")
                    .secret(AUX_SECRET)
                    .window(Window::sliding(1000, "24h")),
            )
            .endpoint(Endpoint::new("main.videos", "main", 1).window(Window::sliding(30, "1h")))
            .endpoint(Endpoint::new("limited.videos", "limited", 1).throttle_block("10m"))
            .endpoint(Endpoint::new("aux.videos", "aux", 1))
            .job(
                Job::videos("trending", "main.videos", &base)
                    .fan_out("region", REGIONS)
                    .pages(PAGES),
            )
            .job(Job::videos("hot", "limited.videos", &base).fan_out("region", ["US", "GB"]))
            .job(
                Job::new("broken", "aux.videos")
                    .request(
                        Request::get(&format!("{base}/no/such/path"))
                            .query(&[("key", "{secret}"), ("region", "{region}")]),
                    )
                    .set("fan_out_from", csv_source("items.csv"))
                    .sink(Sink::jsonl("data/{job}.jsonl").records("/items")),
            )
            .redis_url(&redis.url())
            .write();
        // The item comes from data, as an operator's CSV would hold it.
        std::fs::write(cfg.join("items.csv"), format!("region\n{XSS}\n")).expect("write CSV");
        Rig {
            rig: support::rig::Rig::start(redis, cfg, &[]),
            port,
            _upstream: upstream,
        }
    }

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> http::Answer {
        http_request(self.port, "GET", path, headers)
            .unwrap_or_else(|| panic!("GET {path}: no answer"))
    }

    fn api(&self) -> Value {
        let a = self.get("/api/status", &[]);
        assert_eq!(a.header("content-type"), Some("application/json"));
        self.rig.status()
    }

    /// Runs the three jobs; returns the JSON once the spend history caught
    /// up with the windows (it is written off the task's path).
    fn run_jobs(&self) -> Value {
        self.rig.trigger_expect("trending", 0);
        self.rig.trigger_expect("hot", 75);
        self.rig.trigger_expect("broken", 1);
        let mut last = Value::Null;
        let caught_up = wait_until(Duration::from_secs(10), || {
            last = self.api();
            window(&last, "main", "credential")["spent_last_hour"] == 20
        });
        assert!(
            caught_up,
            "the history never showed main's 20 units: {last:#}"
        );
        last
    }
}

fn credential<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["credentials"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no credential {name}: {status:#}"))
}

fn window<'a>(status: &'a Value, name: &str, scope: &str) -> &'a Value {
    credential(status, name)["windows"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["scope"] == scope))
        .unwrap_or_else(|| panic!("no {scope} window of {name}: {status:#}"))
}

fn job<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["jobs"]
        .as_array()
        .and_then(|js| js.iter().find(|j| j["name"] == name))
        .unwrap_or_else(|| panic!("no job {name}: {status:#}"))
}

fn assert_no_secret(what: &str, text: &str) {
    for s in SECRETS {
        assert!(!text.contains(s), "{what} holds the secret {s:?}:\n{text}");
    }
}

/// Where the screenshot goes: `target/status-page.png`, beside the build.
fn screenshot_path() -> std::path::PathBuf {
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("status-page.png")
}

#[test]
fn the_status_page_shows_windows_blocks_and_jobs_in_a_real_browser() {
    let rig = Rig::start();
    let status = rig.run_jobs();

    // The data, as JSON.
    let main = window(&status, "main", "credential");
    assert_eq!(main["used"], 20, "{main:#}");
    assert_eq!(main["units"], MAIN_UNITS);
    assert_eq!(main["remaining"], 20, "{main:#}");
    assert_eq!(main["window"], "40/1h");
    let slots = main["history"]["units"].as_array().expect("history");
    assert_eq!(slots.len(), 288);
    let charted: u64 = slots.iter().filter_map(Value::as_u64).sum();
    assert_eq!(charted, 20, "the chart holds the 20 units spent");
    let own = window(&status, "main", "endpoint:main.videos");
    assert_eq!(
        (&own["used"], &own["remaining"]),
        (&20.into(), &10.into()),
        "{own:#}"
    );
    let shadow = (credential(&status, "main")["windows"].as_array())
        .and_then(|ws| ws.iter().find(|w| w["mode"] == "shadow"))
        .unwrap_or_else(|| panic!("no shadow window of main: {status:#}"));
    assert_eq!(
        (&shadow["used"], &shadow["shadow_refusals"]),
        (&SHADOW_UNITS.into(), &5.into()),
        "it holds what it admits and counts the 5 it would have refused: {shadow:#}"
    );
    // 20 an hour against the 1-hour window's 20 left: not at this rate
    // (units leave as fast); the projection is stated either way.
    assert!(main["runs_out"]["state"].is_string(), "{main:#}");

    let limited = credential(&status, "limited");
    let block = &limited["block"];
    assert!(
        block["blocked_for_ms"].as_u64().unwrap_or(0) > 0,
        "limited is not blocked: {limited:#}"
    );
    assert_eq!(block["reason"]["status"], 403, "{block:#}");
    assert_eq!(block["reason"]["reason"], "quotaExceeded", "{block:#}");
    assert_eq!(block["reason"]["endpoint"], "limited.videos");
    // Why, in its stable word: stored with the block, and in the reason.
    assert_eq!(block["kind"], "quota_reason", "{block:#}");
    assert_eq!(block["reason"]["kind"], "quota_reason", "{block:#}");
    assert!(credential(&status, "main")["block"].is_null());

    let trending = job(&status, "trending");
    let tick = &trending["ticks"][0];
    assert_eq!(tick["items"], 4, "{trending:#}");
    assert_eq!(tick["outcomes"]["done"], 4, "{trending:#}");
    assert_eq!(trending["open_tasks"], 0);
    assert!(trending["last_error"].is_null());
    assert!(
        trending.get("starved").is_none(),
        "no starved items recorded"
    );
    let hot = job(&status, "hot");
    assert_eq!(
        hot["ticks"][0]["outcomes"]["upstream_throttled"], 1,
        "{hot:#}"
    );
    let broken = job(&status, "broken");
    let error = &broken["last_error"];
    assert_eq!(error["outcome"], "failed", "{broken:#}");
    assert_eq!(error["status"], 404);
    assert_eq!(error["item"], format!("region={XSS}"));
    assert_no_secret("/api/status", &status.to_string());

    // The page, as served.
    let page = rig.get("/", &[]);
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.body.contains("would have refused 5 spends in 24 h"),
        "the shadow window's refusals are not on the page:\n{}",
        page.body
    );
    let csp = page.header("content-security-policy").unwrap_or_default();
    assert!(csp.contains("default-src 'none'"), "CSP: {csp}");
    assert!(
        page.body
            .contains("region=&lt;script&gt;alert(1)&lt;/script&gt;"),
        "the item is not shown escaped:\n{}",
        page.body
    );
    assert!(
        !page.body.contains("<script"),
        "a <script> reached the page"
    );
    // The block's kind beside the block, and on the credential.
    for want in [
        " Kind: <code class=\"kind\" data-kind=\"quota_reason\">quota_reason</code>",
        "<span class=\"bad\">blocked (quota_reason)</span>",
    ] {
        assert!(
            page.body.contains(want),
            "the page lacks {want:?}:\n{}",
            page.body
        );
    }
    assert_no_secret("the page", &page.body);

    // Each item the page names links to its state (`state JOB ITEM
    // --json`), the item percent-encoded; each job to all of its items'.
    let href = "api/state/broken?item=region%3D%3Cscript%3Ealert%281%29%3C%2Fscript%3E";
    assert!(
        page.body
            .contains(&format!("<a class=\"item\" href=\"{href}\"")),
        "no link to the item's state:\n{}",
        page.body
    );
    let a = rig.get(&format!("/{href}"), &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("content-type"), Some("application/json"));
    let v: Value = serde_json::from_str(&a.body).expect("JSON");
    let item = &v["items"][0];
    assert_eq!(item["item"], format!("region={XSS}"), "{v:#}");
    assert_eq!(
        (&item["outcome"], &item["in_fan_out"], &item["held_by"]),
        (&"failed".into(), &true.into(), &Value::Null),
        "{v:#}"
    );
    assert_no_secret("/api/state/broken", &a.body);
    let all = rig.get("/api/state/trending", &[]);
    let v: Value = serde_json::from_str(&all.body).expect("JSON");
    let outcomes: Vec<String> = (v["items"].as_array().expect("items").iter())
        .map(|i| format!("{} {}", i["item"], i["outcome"]))
        .collect();
    let all_done = REGIONS.map(|r| format!("\"region={r}\" \"done\""));
    assert_eq!(outcomes, all_done, "{v:#}");
    assert_eq!(v["complete"], true, "{v:#}");
    assert!(
        page.body.contains("href=\"api/state/trending\""),
        "{}",
        page.body
    );
    for missing in [
        "/api/state/nosuchjob",
        "/api/state/trending?item=region%3DXX",
    ] {
        assert_eq!(rig.get(missing, &[]).status, 404, "{missing}");
    }

    // The page, in a real browser.
    let Some(browser) = Chromium::find() else {
        return;
    };
    let url = format!("http://127.0.0.1:{}/", rig.port);
    let dom = browser.dump_dom(&url);
    for want in [
        // The windows: used / limit, both scopes.
        "data-credential=\"main\"",
        "<span class=\"used\">20 / 40</span>",
        "data-scope=\"endpoint:main.videos\"",
        "<svg class=\"chart\"",
        // The block, and why.
        "<div class=\"blocked\" data-credential=\"limited\">",
        "upstream answered 403 (quotaExceeded)",
        "<code class=\"kind\" data-kind=\"quota_reason\">quota_reason</code>",
        // The jobs, their ticks and last error.
        "data-job=\"trending\"",
        "data-job=\"hot\"",
        "data-job=\"broken\"",
        "done 4",
        "upstream_throttled 1",
        "upstream answered 404",
    ] {
        assert!(dom.contains(want), "the DOM lacks {want:?}:\n{dom}");
    }
    // The item is text in the DOM, not an element.
    assert!(dom.contains("region=&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(
        !dom.contains("<script"),
        "a script element in the DOM:\n{dom}"
    );
    assert_no_secret("the DOM", &dom);
    let shot = screenshot_path();
    browser.screenshot(&url, &shot);
    eprintln!("screenshot: {}", shot.display());
}

#[test]
fn the_status_page_is_read_only_and_works_behind_a_path_prefix() {
    let rig = Rig::start();
    rig.rig.trigger_expect("broken", 1);
    for path in ["/", "/api/status", "/api/state/broken"] {
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let a = http_request(rig.port, method, path, &[])
                .unwrap_or_else(|| panic!("{method} {path}: no answer"));
            assert_eq!(a.status, 405, "{method} {path}: {}", a.body);
        }
    }

    // Every link is relative: a proxy serving the page under any prefix
    // keeps them under it.
    let plain = rig.get("/", &[]);
    for absolute in [
        "href=\"/",
        "src=\"/",
        "action=\"/",
        "href=\"http",
        "src=\"http",
    ] {
        assert!(
            !plain.body.contains(absolute),
            "an absolute link ({absolute}) in the page:\n{}",
            plain.body
        );
    }
    assert!(plain.body.contains("href=\"api/status\""));
    assert!(!plain.body.contains("<base"), "no prefix, no <base>");
    // A proxy that says its prefix gets it as the base of every link.
    let proxied = rig.get("/", &[("X-Forwarded-Prefix", "/ops/quota")]);
    assert!(
        proxied.body.contains("<base href=\"/ops/quota/\">"),
        "{}",
        proxied.body
    );
    // A prefix that would point the links at another site is ignored.
    for hostile in ["//evil.example", "https://evil.example/x", "/x\"><script>"] {
        let a = rig.get("/", &[("X-Forwarded-Prefix", hostile)]);
        assert!(
            !a.body.contains("<base"),
            "{hostile:?} became a base: {}",
            a.body
        );
        assert!(!a.body.contains("evil.example"));
    }
    // `?refresh=N` reloads without a script.
    let refresh = rig.get("/?refresh=2", &[]);
    assert!(
        refresh
            .body
            .contains("<meta http-equiv=\"refresh\" content=\"5\">"),
        "refresh is clamped to 5 s at least: {}",
        refresh.body
    );

    // What the status page keeps in Redis is bounded and expires.
    let mut conn = rig.rig.redis.conn();
    // Every credential's rings, of either scope.
    let mut rings: Vec<String> = Vec::new();
    for scope in [Scope::Credential, Scope::Endpoint("*".into())] {
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(keys().spent("*", &scope))
            .query(&mut conn)
            .expect("KEYS");
        rings.extend(found);
    }
    assert!(!rings.is_empty(), "no spend history recorded");
    for key in rings.iter().chain([keys().job_ticks("broken")].iter()) {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
        assert!(ttl > 0, "{key} has no expiry ({ttl})");
    }
    for ring in &rings {
        let len: u64 = redis::cmd("STRLEN")
            .arg(ring)
            .query(&mut conn)
            .expect("STRLEN");
        assert!(len <= 289 * 4, "{ring} is {len} bytes");
    }
}

/// A job's tick record (`lua/finish.lua`, KEYS[3]) keeps the outcome counts
/// of its newest 10 ticks, whichever order their tasks end in, and the last
/// error with the Redis time it was recorded at.
#[test]
fn a_jobs_tick_record_keeps_its_newest_ten_ticks_and_last_error() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    let finish = redis::Script::new(include_str!("../../lua/finish.lua"));
    // Ticks 1..=12, ended newest first then oldest first; tick 12 twice.
    let order = [12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 12];
    for (i, tick) in order.iter().enumerate() {
        let error = if i == 5 {
            r#"{"outcome":"failed","item":"region=US","tick":7,"status":400,"detail":"upstream answered 400"}"#
        } else {
            ""
        };
        let () = finish
            .key(keys().task_done(&format!("t{i}")))
            .key(keys().tick_outcomes("j", *tick))
            .key(keys().job_ticks("j"))
            .arg("done")
            .arg("done")
            .arg(60)
            .arg("")
            .arg(*tick)
            .arg(10)
            .arg(3600)
            .arg(error)
            .invoke(&mut conn)
            .expect("finish.lua");
    }
    let record: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys().job_ticks("j"))
        .query(&mut conn)
        .expect("HGETALL");
    let ticks: Vec<i64> = record.keys().filter_map(|k| k.parse().ok()).collect();
    let mut sorted = ticks.clone();
    sorted.sort();
    assert_eq!(sorted, (3..=12).collect::<Vec<i64>>(), "{record:?}");
    let twelve: Value = serde_json::from_str(&record["12"]).expect("JSON");
    assert_eq!(twelve["done"], 2, "{record:?}");
    assert!(record["#error"].contains("upstream answered 400"));
    let at: i64 = record["#error_at_ms"].parse().expect("#error_at_ms");
    let now_ms = redis.time_us() / 1000;
    assert!((now_ms - 60_000..=now_ms).contains(&at), "{at} vs {now_ms}");
    let ttl: i64 = redis::cmd("TTL")
        .arg(keys().job_ticks("j"))
        .query(&mut conn)
        .expect("TTL");
    assert!((1..=3600).contains(&ttl), "TTL {ttl}");
}

/// A template credential's tenants on the page (SPEC Part 2, "Credential
/// templates", "Status page"): with `ig` templated on `{account}` and two
/// tenants spending — `a` 3 pages of its 5-unit window, `b` refused by the
/// upstream on its second request (403 quotaExceeded) and so blocked — the
/// page and `/api/status` list each tenant under its `ig[account=…]` name
/// with its own windows, used and remaining, its spend history and its
/// block with its kind; no tenant's token is anywhere on the page or in the
/// JSON.
#[test]
fn the_status_page_lists_each_tenant_of_a_template_credential() {
    const TOK_A: &str = "tenant-token-a-5d2c91";
    const TOK_B: &str = "tenant-token-b-e07a44";
    const LIMIT: u64 = 5;
    let redis = RedisServer::start();
    let hour = Duration::from_secs(3600);
    let upstream = Upstream::with(
        SimConfig {
            pages_per_query: 3,
            items_per_page: 2,
            ..SimConfig::default()
        }
        .key(TOK_A, 1_000, hour)
        .key(TOK_B, 1, hour),
    );
    let base = upstream.base_url();
    let port = free_port();
    let cfg = ConfigBuilder::new()
        .worker(world::quick_worker(2))
        .metrics_listen(&format!("127.0.0.1:{port}"))
        .credential(
            Credential::template("ig", "account", "tokens/{account}")
                .window(Window::sliding(LIMIT, "1h")),
        )
        .endpoint(Endpoint::new("ig.media", "ig", 1).throttle_block("10m"))
        .job(
            Job::videos_by("media", "ig.media", &base, "account")
                .fan_out("account", ["a", "b"])
                .pages(3),
        )
        .redis_url(&redis.url())
        .write();
    std::fs::create_dir_all(cfg.join("tokens")).expect("mkdir tokens");
    for (account, token) in [("a", TOK_A), ("b", TOK_B)] {
        std::fs::write(cfg.join(format!("tokens/{account}")), token).expect("token");
    }
    let rig = support::rig::Rig::start(redis, cfg, &[]);
    let t = rig.trigger("media");
    assert_eq!(t.code, Some(75), "a done, b throttled: {t:#?}");
    let stats = upstream.stats();
    assert_eq!(
        (stats.key(TOK_A).units, stats.key(TOK_B).units),
        (3, 1),
        "each tenant's own token"
    );

    let api = || {
        let a = http_request(port, "GET", "/api/status", &[]).expect("GET /api/status");
        assert_eq!(a.status, 200, "{}", a.body);
        (
            serde_json::from_str::<Value>(&a.body).unwrap_or_else(|e| panic!("{e}: {}", a.body)),
            a.body,
        )
    };
    // The spend history is written off the task's path: wait for it.
    let mut last = (Value::Null, String::new());
    let caught_up = wait_until(Duration::from_secs(10), || {
        last = api();
        last.0["credentials"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["name"] == "ig[account=a]" && c["windows"][0]["spent_last_hour"] == 3)
        })
    });
    let (status, body) = last;
    assert!(
        caught_up,
        "tenant a's history never showed 3 units: {status:#}"
    );
    let names: Vec<&str> = status["credentials"]
        .as_array()
        .expect("credentials")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["ig[account=a]", "ig[account=b]"], "{status:#}");

    let a = window(&status, "ig[account=a]", "credential");
    assert_eq!(
        (&a["used"], &a["remaining"], &a["window"]),
        (&3.into(), &2.into(), &Value::from("5/1h")),
        "{a:#}"
    );
    assert!(credential(&status, "ig[account=a]")["block"].is_null());
    let b = credential(&status, "ig[account=b]");
    let bw = &b["windows"][0];
    assert_eq!(
        bw["used"].as_u64().unwrap_or(0) + bw["remaining"].as_u64().unwrap_or(0),
        LIMIT,
        "{b:#}"
    );
    assert!(bw["used"].as_u64().unwrap_or(0) >= 1, "{b:#}");
    let block = &b["block"];
    assert!(block["blocked_for_ms"].as_u64().unwrap_or(0) > 0, "{b:#}");
    assert_eq!(block["kind"], "quota_reason", "{block:#}");
    assert_eq!(block["reason"]["status"], 403, "{block:#}");
    assert_eq!(block["reason"]["endpoint"], "ig.media", "{block:#}");
    // The job names the credential its endpoint charges: the template.
    assert_eq!(job(&status, "media")["credential"], "ig");

    let page = http_request(port, "GET", "/", &[]).expect("GET /");
    assert_eq!(page.status, 200);
    for want in [
        "<article class=\"credential\" data-credential=\"ig[account=a]\">",
        "<article class=\"credential\" data-credential=\"ig[account=b]\">",
        "<div class=\"blocked\" data-credential=\"ig[account=b]\">",
        "<span class=\"used\">3 / 5</span>",
        "<code class=\"kind\" data-kind=\"quota_reason\">quota_reason</code>",
    ] {
        assert!(
            page.body.contains(want),
            "the page lacks {want:?}:\n{}",
            page.body
        );
    }
    for (what, text) in [("/api/status", &body), ("the page", &page.body)] {
        for token in [TOK_A, TOK_B] {
            assert!(!text.contains(token), "{what} holds {token}:\n{text}");
        }
    }
}

/// Issue 24: a credential with several resources (GitHub's core and search,
/// and the token's cap on requests in flight) shows each on the page and in
/// `/api/status`: a search block (as an upstream's 429 leaves it in Redis) is
/// search's, core is not blocked, and every window names its resource, the
/// token's concurrent cap "*" (the page: "every resource").
#[test]
fn the_status_page_names_each_resource_and_its_block() {
    let redis = RedisServer::start();
    let port = free_port();
    let cfg = ConfigBuilder::new()
        .worker(world::quick_worker(1))
        .metrics_listen(&format!("127.0.0.1:{port}"))
        .credential(
            Credential::env("gh", "QW_TEST_STATUS_GH")
                .secret(MAIN_SECRET)
                .window(Window::sliding(5000, "1h").upstream())
                .window(Window::sliding(30, "1m").upstream().resource("search"))
                .window(Window::concurrent(100)),
        )
        .endpoint(Endpoint::new("gh.repos", "gh", 1).set("accounting", "github"))
        .endpoint(
            Endpoint::new("gh.search", "gh", 1)
                .set("accounting", "github")
                .set("resource", "search"),
        )
        .job(
            Job::videos("find", "gh.search", "http://127.0.0.1:9")
                .fan_out("region", ["US"])
                .schedule("manual"),
        )
        .redis_url(&redis.url())
        .write();
    let t: Vec<String> = redis.cmd(&["TIME"]);
    let now_us = t[0].parse::<u64>().expect("s") * 1_000_000 + t[1].parse::<u64>().expect("µs");
    let ks = keys();
    let until = (now_us + 600_000_000).to_string();
    let _: () = redis.cmd(&[
        "SET",
        &ks.blocked_in("gh", Some("search")),
        &until,
        "PX",
        "600000",
    ]);
    let _: () = redis.cmd(&[
        "SET",
        &ks.block_kind_in("gh", Some("search")),
        "429",
        "PX",
        "600000",
    ]);
    let _rig = support::rig::Rig::start(redis, cfg, &[]);

    let a = http_request(port, "GET", "/api/status", &[]).expect("GET /api/status");
    assert_eq!(a.status, 200, "{}", a.body);
    let status: Value = serde_json::from_str(&a.body).unwrap_or_else(|e| panic!("{e}: {}", a.body));
    let gh = credential(&status, "gh");
    assert_eq!(
        gh["resources"],
        serde_json::json!(["core", "search"]),
        "{gh:#}"
    );
    assert!(gh["block"].is_null(), "core is not blocked: {gh:#}");
    let blocks = gh["blocks"].as_array().expect("blocks");
    assert_eq!(blocks.len(), 1, "{gh:#}");
    assert_eq!(blocks[0]["resource"], "search");
    assert_eq!(blocks[0]["kind"], "429");
    assert!(
        blocks[0]["blocked_for_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 500_000),
        "{gh:#}"
    );
    let resources: Vec<(&str, &str)> = (gh["windows"].as_array().expect("windows").iter())
        .map(|w| {
            (
                w["window"].as_str().unwrap_or(""),
                w["resource"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        resources,
        [
            ("5000/1h", "core"),
            ("30/1m", "search"),
            ("100 in flight", "*")
        ],
        "{gh:#}"
    );
    assert_no_secret("/api/status", &a.body);

    let page = http_request(port, "GET", "/", &[]).expect("GET /");
    assert_eq!(page.status, 200);
    let text = page.body;
    assert!(
        text.contains("(resource <code>search</code>) is blocked until"),
        "{text}"
    );
    assert!(text.contains("credential, resource search"), "{text}");
    assert!(text.contains("credential, every resource"), "{text}");
    assert!(!text.contains("resource *"), "{text}");
    assert_no_secret("the page", &text);
}
