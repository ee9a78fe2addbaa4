//! Promise (SPEC Part 2, "Credential templates (many tenants)"): one
//! `[credentials.ig] template = "account"` is a credential per value of
//! `{account}`, each with its own token file, its own windows (each limit
//! admitted exactly, whatever the other tenants spend), its own block and
//! Redis keys tagged by the value, never the token. A tenant without a
//! token fails only its own item; a token file written later is read by
//! the next task, no restart. `quota` shows tenants as `ig[account=a]`;
//! `check` counts the tenants it can see; a job that cannot say which
//! tenant an item is, is a config error (exit 78, file:line:col).

use std::time::Duration;

use simulator::SimConfig;

use crate::support::keys;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, Job, RedisServer, TestConfig, Window, styles,
};

/// Each tenant's window: 5 requests an hour.
const LIMIT: u64 = 5;
/// A value with braces: it must not break the keys' hash tag.
const BRACES: &str = "b}{x";

/// Tenants `a` and [`BRACES`] have tokens; `c` has none (yet).
fn tenants_config(base: &str) -> ConfigBuilder {
    ConfigBuilder::new()
        .credential(
            Credential::template("ig", "account", "tokens/{account}")
                .window(Window::sliding(LIMIT, "1h")),
        )
        .endpoint(Endpoint::new("ig.media", "ig", 1).timeout("30s"))
        .job(
            Job::videos_by("media", "ig.media", base, "account")
                .fan_out("account", ["a", BRACES, "c"])
                .pages(20),
        )
}

fn token(cfg: &TestConfig, account: &str, token: &str) {
    std::fs::create_dir_all(cfg.join("tokens")).expect("mkdir tokens");
    std::fs::write(cfg.join(format!("tokens/{account}")), format!("{token}\n")).expect("token");
}

/// `trigger media --wait`: exit code and summary line.
fn trigger(rig: &Rig) -> (Option<i32>, String) {
    let t = rig.trigger("media");
    assert!(t.summary().contains("task(s) ended"), "{t:#?}");
    (t.code, t.summary().to_owned())
}

#[test]
fn each_tenant_spends_its_own_windows_with_its_own_token_and_a_missing_token_fails_only_its_item() {
    let redis = RedisServer::start();
    // Many pages per query: only the windows stop each item.
    let sim = SimConfig {
        pages_per_query: 50,
        items_per_page: 2,
        ..SimConfig::default()
    };
    let hour = Duration::from_secs(3600);
    let upstream = Upstream::with(
        sim.key("tok-a", 1000, hour)
            .key("tok-b", 1000, hour)
            .key("tok-c", 1000, hour),
    );
    let cfg = tenants_config(&upstream.base_url()).write();
    token(&cfg, "a", "tok-a");
    token(&cfg, BRACES, "tok-b");

    let mut rig = Rig::start(redis, cfg, &[]);
    let (cfg, redis, d) = (&rig.cfg, &rig.redis, &rig.daemon);
    let (code, summary) = trigger(&rig);
    assert_eq!(
        code,
        Some(1),
        "a failed item makes the tick exit 1: {summary}"
    );
    assert!(
        summary.contains("3 task(s) ended") && summary.contains("2 quota_exhausted"),
        "{summary}"
    );
    assert!(summary.contains("1 failed"), "{summary}");
    assert!(
        d.wait_log("no secret for ig[account=c]", Duration::from_secs(5)),
        "the failed item says which tenant has no token:\n{}",
        d.log()
    );

    // Each tenant's own limit, exactly, each with its own token.
    let stats = upstream.stats();
    assert_eq!(stats.key("tok-a").units, LIMIT, "tenant a");
    assert_eq!(stats.key("tok-b").units, LIMIT, "tenant {BRACES}");
    assert_eq!(stats.key("tok-c").units, 0, "tenant c has no token file");
    assert_eq!(
        stats.invalid_keys, 0,
        "every request carried its tenant's token"
    );

    // Keys carry the escaped value as their hash tag, never a token.
    let a = redis.keys(&keys::of_credential("ig[account=a]"));
    let b = redis.keys(&keys::of_credential("ig[account=b%7D%7Bx]"));
    assert!(!a.is_empty() && !b.is_empty(), "{a:?} {b:?}");
    for k in redis.keys(&keys::keys().tenants_pattern("ig", "account")) {
        let tag = &k[k.find('{').expect("tag") + 1..k.find('}').expect("tag end")];
        assert!(!tag.contains('{'), "{k}: one hash tag");
    }
    let everything = styles::everything_in(&redis.url());
    for secret in ["tok-a", "tok-b"] {
        for spelling in styles::spellings(secret) {
            let leak = everything.iter().find(|v| v.contains(&spelling));
            assert!(leak.is_none(), "{secret} in Redis: {leak:?}");
        }
    }

    // `quota ig` lists the tenants it finds, each with its own window.
    let out = cfg.run_on(redis, &["quota", "ig", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let j = support::json(&out);
    let shown: Vec<(String, u64)> = (j["credentials"].as_array().expect("credentials").iter())
        .map(|c| {
            let name = c["name"].as_str().expect("name").to_owned();
            (name, c["windows"][0]["used"].as_u64().expect("used"))
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("ig[account=a]".to_owned(), LIMIT),
            ("ig[account=b%7D%7Bx]".to_owned(), LIMIT)
        ],
        "{j}"
    );
    assert_eq!(j["templates"][0]["more"], false, "{j}");
    // One tenant by its value as written; the text table names it.
    let out = cfg.run_on(redis, &["quota", "ig[account=b}{x]"]);
    let text = support::stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    assert!(text.starts_with("ig[account=b%7D%7Bx]\n"), "{text}");
    assert!(text.contains("5/1h") && text.contains("  5  "), "{text}");
    let out = cfg.run_on(redis, &["quota"]);
    let text = support::stdout(&out);
    assert!(
        text.contains("ig[account=a]\n")
            && text.contains("ig: template on {account}: 2 tenant(s) with keys in Redis"),
        "{text}"
    );

    // c's token written now: the next tick's task reads it, no restart;
    // a and b stay refused by their spent windows.
    token(cfg, "c", "tok-c");
    let (code, summary) = trigger(&rig);
    assert_eq!(code, Some(75), "{summary}");
    assert!(summary.contains("3 quota_exhausted"), "{summary}");
    let stats = upstream.stats();
    assert_eq!(
        stats.key("tok-c").units,
        LIMIT,
        "tenant c, with its new token"
    );
    assert_eq!(stats.key("tok-a").units, LIMIT, "tenant a: nothing more");
    assert_eq!(
        stats.key("tok-b").units,
        LIMIT,
        "tenant {BRACES}: nothing more"
    );
    let d = &mut rig.daemon;
    d.term();
    assert!(
        d.wait_exit(Duration::from_secs(20)).is_some(),
        "daemon stops"
    );
}

#[test]
fn check_counts_the_tenants_it_can_see_and_names_those_without_a_token() {
    let cfg = tenants_config("http://127.0.0.1:9").write();
    token(&cfg, "a", "tok-a");
    token(&cfg, BRACES, "tok-b");
    let out = cfg.run(&["check"], &[]);
    let text = support::stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        support::stderr(&out)
    );
    assert!(
        text.contains(
            "template on {account}: 3 tenant(s) in the jobs' items now, 2 with a token file"
        ),
        "{text}"
    );
    // One item per tenant, 20 pages each: 20 units against each tenant's 5.
    assert!(text.contains("worst case        20 units per 1h"), "{text}");
    assert!(
        text.contains("credential ig: 1 tenant(s) have no token file")
            && text.contains("ig[account=c]: cannot read"),
        "{text}"
    );
    assert!(!text.contains("tok-a"), "{text}");
}

const CONFIG: &str = r#"jobs = "jobs/*.toml"

[credentials.ig]
template = "account"
secret_file = "tokens/{account}"
windows = [{ units = 200, per = "1h" }]

[endpoints."ig.media"]
credential = "ig"
cost = 1
"#;

const JOB: &str = r#"[media]
schedule = "0 0 * * * *"
endpoint = "ig.media"
fan_out = { region = ["a", "b"] }

[media.request]
url = "https://graph.example/v1/media"
query = { access_token = "{secret}" }

[media.sink]
kind = "jsonl"
path = "data/{job}/{region}.jsonl"
"#;

/// `check` on `config` and `job`: exit 78 and one error starting with `at`
/// that says `says`.
fn config_error(config: &str, job: &str, at: &str, says: &str) {
    let cfg = TestConfig::new(config, &[("media.toml", job)]);
    let out = cfg.run(&["check"], &[]);
    let err = support::stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    let want = format!("error: {}", cfg.join(at).display());
    assert!(errors[0].starts_with(&want), "{want}\n{err}");
    assert!(errors[0].contains(says), "{says}\n{err}");
}

#[test]
fn a_template_a_job_cannot_fill_is_a_config_error_at_its_line() {
    // The job fans out by region: which tenant is an item?
    config_error(
        CONFIG,
        JOB,
        "jobs/media.toml:3:12: media.endpoint:",
        "this job must provide {account} (a fan_out key or a fan_out_from column)",
    );
    // A template's token file must name the tenant.
    let one_file = CONFIG.replace("tokens/{account}", "tokens/all");
    let job = JOB.replace("region", "account");
    config_error(
        &one_file,
        &job,
        "config.toml:5:15: credentials.ig.secret_file:",
        "must hold {account}",
    );
    // Tokens come from files, one per tenant.
    let env = CONFIG.replace("secret_file = \"tokens/{account}\"", "secret_env = \"IG\"");
    config_error(
        &env,
        &job,
        "config.toml:5:14: credentials.ig.secret_env:",
        "secret_file",
    );
    // A placeholder the product fills itself cannot name tenants.
    let taken = CONFIG
        .replace("\"account\"", "\"secret\"")
        .replace("{account}", "{secret}");
    config_error(
        &taken,
        &job.replace("account", "secret2"),
        "config.toml:4:12: credentials.ig.template:",
        "bad template placeholder \"secret\"",
    );
}

/// A tenant's spend goes through the reserve-aware spend: a 40% reserve
/// keeps 40% of the tenant's own window free, the tenant's plain spends
/// take the rest, and the other tenant's window is untouched by either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_is_kept_free_in_each_tenants_own_windows() {
    use quota_worker::config::{Config, Reserve};
    use quota_worker::quota::{Decision, RejectedBy, SpendOptions, request_id};

    let server = RedisServer::start();
    let cfg = TestConfig::new(
        r#"
[credentials.ig]
template = "account"
secret_file = "tokens/{account}"
windows = [{ units = 5, per = "1h" }]

[endpoints.m]
credential = "ig"
cost = 1
"#,
        &[],
    );
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    let reserve: Reserve = "40%".parse().expect("40%");
    let spend = |tenant: &'static str, reserve: Reserve| {
        let limiter = &limiter;
        async move {
            (limiter.spend_with(
                "m",
                &request_id(),
                SpendOptions::new().tenant(tenant).reserve(reserve),
            ))
            .await
            .expect("spend")
        }
    };
    for i in 0..3u64 {
        assert_eq!(
            spend("a", reserve).await,
            Decision::Allowed { remaining: 2 - i },
            "reserved spend {i} on tenant a"
        );
    }
    let r = support::rejected(spend("a", reserve).await);
    assert_eq!(r.by, RejectedBy::Window(1), "the reserve of a's window");
    for _ in 0..2 {
        assert!(spend("a", Reserve::NONE).await.is_allowed());
    }
    assert!(!spend("a", Reserve::NONE).await.is_allowed(), "a is full");
    // Tenant b's window is its own: the reserve applies there afresh.
    assert_eq!(
        spend("b", reserve).await,
        Decision::Allowed { remaining: 2 }
    );
    let usage = limiter.peek("ig[account=b]").await.expect("peek b");
    assert_eq!(usage.windows[0].used, 1, "{usage:?}");
}
