//! Redis key names as the product names them: tests ask [`KeySpace`] (the
//! one place key names are built, `src/keys.rs`) and the queue's apalis
//! config instead of spelling `qw:…` themselves, so a test follows a change
//! of layout instead of pinning the old one.

use quota_worker::config::{Config, Scope};
use quota_worker::keys::{KeySpace, glob_literal};

/// The key prefix of every test config (the default `[redis] key_prefix`).
pub const PREFIX: &str = "qw";

/// Key names under [`PREFIX`].
pub fn keys() -> KeySpace {
    KeySpace::new(PREFIX)
}

/// The names apalis-redis gives the queue's keys (`quota_worker::queue`
/// sets the queue's name to `KeySpace::queue`).
pub fn apalis() -> apalis_redis::Config {
    apalis_redis::Config::default().queue(keys().queue())
}

/// A KEYS / SCAN pattern for `key` of any tick: the name built for a tick
/// no test uses, that tick then `*` (`any_tick(|t| keys().tick_fan_out("big",
/// t))` matches every fan-out progress hash of job `big`).
pub fn any_tick(key: impl Fn(i64) -> String) -> String {
    const PROBE: i64 = 987_654_321_987;
    key(PROBE).replace(&PROBE.to_string(), "*")
}

/// What every key of `credential` starts with (its hash tag).
pub fn credential_prefix(credential: &str) -> String {
    format!("{PREFIX}:{}:", KeySpace::hash_tag(credential))
}

/// Every key of `credential`: a KEYS / SCAN pattern (a tenant's brackets
/// taken literally).
pub fn of_credential(credential: &str) -> String {
    format!("{}*", glob_literal(&credential_prefix(credential)))
}

/// Every key under [`PREFIX`]: a KEYS / SCAN pattern.
pub fn all() -> String {
    format!("{}:*", glob_literal(PREFIX))
}

/// The keys of window `n` (0-based, in config order) of `credential`, or
/// with `endpoint` of that endpoint's own windows, as the spend script
/// takes them (`keys::KeySpace::window`): counters, log, stream, settled
/// entries for a sliding or bucket window; the state hash of a fixed one;
/// counters, lease expiries and leased units of a concurrent one.
pub fn window(config: &Config, credential: &str, endpoint: Option<&str>, n: usize) -> Vec<String> {
    let (scope, windows) = match endpoint {
        None => (Scope::Credential, &config.credentials[credential].windows),
        Some(e) => (Scope::Endpoint(e.to_owned()), &config.endpoints[e].windows),
    };
    keys().window(credential, &scope, &windows[n])
}

/// The log of window `n` (as [`window`]): its spends by request id.
pub fn window_log(config: &Config, credential: &str, endpoint: Option<&str>, n: usize) -> String {
    window(config, credential, endpoint, n)[1].clone()
}
