//! Promise: one tenant of a template credential is addressable by the
//! commands other tools use: `spend 'ig.media[account=123]'` spends from
//! that tenant's windows (exit 0, then 75 at its limit), `keys` on the same
//! name prints the keys that spend touched (and, on a cluster, the tenant's
//! hash tag), `quota 'ig[account=123]'` reads them, `unblock
//! 'ig[account=123]'` lifts that tenant's block; other tenants are not
//! touched. A name the config cannot take (no tenant where the template
//! needs one, a wrong placeholder, a value no tenant can have, a tenant of a
//! plain credential, a credential where an endpoint is wanted) is refused
//! with what to write instead (exit 64) and writes nothing. No output holds
//! a token.

use std::time::Duration;

use crate::support::keys;
use crate::support::process::run_cli;
use crate::support::{ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

const LIMIT: u64 = 3;
const TOKEN: &str = "tok-secret-4711";

fn config(extra: impl FnOnce(ConfigBuilder) -> ConfigBuilder) -> TestConfig {
    let builder = ConfigBuilder::new()
        .credential(
            Credential::template("ig", "account", "tokens/{account}")
                .window(Window::sliding(LIMIT, "1h")),
        )
        .endpoint(Endpoint::new("ig.media", "ig", 1))
        .credential(
            Credential::env("plain", "PLAIN_KEY")
                .secret(TOKEN)
                .window(Window::sliding(5, "1h")),
        )
        .endpoint(Endpoint::new("p", "plain", 1));
    let cfg = extra(builder).write();
    std::fs::create_dir_all(cfg.join("tokens")).expect("mkdir tokens");
    for t in ["123", "456", "b}{x"] {
        std::fs::write(cfg.join(format!("tokens/{t}")), format!("{TOKEN}\n")).expect("token");
    }
    cfg
}

fn cli(cfg: &TestConfig, redis: &RedisServer, args: &[&str]) -> (Option<i32>, String, String) {
    let (code, out, err) = run_cli(cfg, Some(&redis.url()), args, Duration::from_secs(30));
    assert!(
        !out.contains(TOKEN) && !err.contains(TOKEN),
        "{args:?} printed a token:\n{out}\n{err}"
    );
    (code, out, err)
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

fn used(cfg: &TestConfig, redis: &RedisServer, tenant: &str) -> u64 {
    let (code, out, err) = cli(cfg, redis, &["quota", tenant, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let q = json(&out);
    assert_eq!(q["credentials"][0]["name"], tenant, "{out}");
    q["credentials"][0]["windows"][0]["used"]
        .as_u64()
        .expect("used")
}

#[test]
fn spend_keys_and_quota_address_one_tenant() {
    let redis = RedisServer::start();
    let cfg = config(|b| b);

    let (code, out, err) = cli(&cfg, &redis, &["keys", "ig.media[account=123]"]);
    assert_eq!(code, Some(0), "{err}");
    let keys = json(&out);
    assert_eq!(keys["tenant"], "ig[account=123]");
    let mut listed: Vec<String> = keys["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k.as_str().expect("key").to_owned())
        .collect();
    assert!(
        listed
            .iter()
            .all(|k| k.starts_with(&keys::credential_prefix("ig[account=123]"))),
        "{listed:?}"
    );

    for i in 0..LIMIT {
        let (code, out, err) = cli(&cfg, &redis, &["spend", "ig.media[account=123]", "--json"]);
        assert_eq!(code, Some(0), "spend {i}: {out}{err}");
        assert_eq!(json(&out)["remaining"], LIMIT - i - 1, "{out}");
    }
    let (code, out, _) = cli(&cfg, &redis, &["spend", "ig.media[account=123]"]);
    assert_eq!(code, Some(75), "the tenant's window is full: {out}");
    assert_eq!(used(&cfg, &redis, "ig[account=123]"), LIMIT);
    assert_eq!(used(&cfg, &redis, "ig[account=456]"), 0, "another tenant");

    // The keys `keys` printed are the keys the spends wrote (those that
    // exist: a window keeps some only when it needs them).
    let written = redis.keys(&keys::all());
    assert!(!written.is_empty());
    listed.sort();
    for k in &written {
        assert!(
            listed.contains(k),
            "{k} was written but `keys` did not list it: {listed:?}"
        );
    }

    // A value with braces, as written or percent-encoded: one tenant.
    let (code, _, err) = cli(&cfg, &redis, &["spend", "ig.media[account=b}{x]"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = cli(&cfg, &redis, &["spend", "ig.media[account=b%7D%7Bx]"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(used(&cfg, &redis, "ig[account=b%7D%7Bx]"), 2);
}

#[test]
fn keys_on_a_cluster_names_the_tenants_hash_tag() {
    let cfg = config(|b| {
        b.redis_url("redis://127.0.0.1:1/0")
            .quota_nodes(["redis://127.0.0.1:7000"])
    });
    let (code, out, err) = run_cli(
        &cfg,
        None,
        &["keys", "ig.media[account=123]"],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{err}");
    let keys = json(&out);
    assert_eq!(keys["cluster"]["hash_tag"], "{ig[account=123]}", "{out}");
}

#[test]
fn a_name_the_config_cannot_take_is_refused_with_what_to_write() {
    let redis = RedisServer::start();
    let cfg = config(|b| b);
    for (args, says) in [
        (
            &["spend", "ig[account=123]"][..],
            "names credential ig, and spend takes an endpoint (its cost and windows); ig's endpoints: ig.media (quota-worker spend 'ig.media[account=123]')",
        ),
        (
            &["spend", "ig.media"][..],
            "endpoint ig.media spends from template credential ig: name one tenant, as 'ig.media[account=VALUE]'",
        ),
        (
            &["keys", "ig.media"][..],
            "endpoint ig.media spends from template credential ig: name one tenant, as 'ig.media[account=VALUE]'",
        ),
        (
            &["spend", "ig.media[acct=123]"][..],
            "credential ig is a template on {account}, not {acct}: write 'ig.media[account=VALUE]'",
        ),
        (
            &["quota", "ig[acct=123]"][..],
            "credential ig is a template on {account}, not {acct}: write 'ig[account=VALUE]'",
        ),
        (
            &["spend", "ig.media[account=..]"][..],
            "the value cannot name a token file",
        ),
        (
            &["keys", "ig.media[account=a%2Fb]"][..],
            "the value cannot name a token file",
        ),
        (
            &["quota", "ig[account=]"][..],
            "the value cannot name a token file",
        ),
        (
            &["spend", "ig.media[account=%FF]"][..],
            "a tenant is written ig.media[account=VALUE], the value as is or percent-encoded UTF-8",
        ),
        (
            &["spend", "p[account=1]"][..],
            "credential plain is not a template, so it has no tenants; write \"p\"",
        ),
        (
            &["quota", "plain[account=1]"][..],
            "credential plain is not a template, so it has no tenants; write \"plain\"",
        ),
    ] {
        let (code, out, err) = cli(&cfg, &redis, args);
        assert_eq!(code, Some(64), "{args:?}: {out}{err}");
        assert!(err.contains(says), "{args:?} should say {says:?}:\n{err}");
    }
    assert_eq!(redis.dbsize(), 0, "a refused name writes nothing");
}

/// Blocks tenant `name`'s default resource for ten minutes, as an
/// upstream's 429 would (its block key and reason, on Redis's clock).
fn block_tenant(redis: &RedisServer, name: &str) {
    let t: Vec<String> = redis.cmd(&["TIME"]);
    let now_us: u64 =
        t[0].parse::<u64>().expect("s") * 1_000_000 + t[1].parse::<u64>().expect("µs");
    let ks = keys::keys();
    let until = (now_us + 600_000_000).to_string();
    let _: () = redis.cmd(&["SET", &ks.blocked(name), &until, "PX", "600000"]);
    let _: () = redis.cmd(&["SET", &ks.block_kind(name), "429", "PX", "600000"]);
}

fn blocked_ms(cfg: &TestConfig, redis: &RedisServer, tenant: &str) -> u64 {
    let (code, out, err) = cli(cfg, redis, &["quota", tenant, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    json(&out)["credentials"][0]["blocked_for_ms"]
        .as_u64()
        .expect("blocked_for_ms")
}

/// `unblock` takes one tenant of a template (`ig[account=123]`) and lifts
/// that tenant's block only; the template's bare name, whose keys no tenant
/// uses, is refused with what to write (exit 64) rather than "lifting"
/// nothing with exit 0.
#[test]
fn unblock_lifts_one_tenants_block_and_refuses_the_bare_template() {
    let redis = RedisServer::start();
    let cfg = config(|b| b);
    block_tenant(&redis, "ig[account=123]");
    block_tenant(&redis, "ig[account=456]");
    assert!(blocked_ms(&cfg, &redis, "ig[account=123]") > 0);

    let (code, out, err) = cli(&cfg, &redis, &["unblock", "ig"]);
    assert_eq!(code, Some(64), "{out}{err}");
    assert!(
        err.contains("credential \"ig\" is a template: name one tenant, as ig[account=VALUE]")
            && !err.contains("known"),
        "{err}"
    );
    let (code, out, err) = cli(&cfg, &redis, &["unblock", "ig[acct=123]"]);
    assert_eq!(code, Some(64), "{out}{err}");

    let (code, out, err) = cli(&cfg, &redis, &["unblock", "ig[account=123]"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("ig[account=123]: resource default unblocked; it was blocked for"),
        "{out}"
    );
    assert!(out.contains("(429)"), "the reason: {out}");
    assert_eq!(blocked_ms(&cfg, &redis, "ig[account=123]"), 0);
    assert!(
        blocked_ms(&cfg, &redis, "ig[account=456]") > 0,
        "another tenant's block stays"
    );
}
