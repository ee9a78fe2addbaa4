//! Redis's `maxmemory-policy`, read at start (`run`, `check`) and by
//! `/readyz`: exactness needs a Redis that never evicts.
//!
//! Under memory pressure any policy but `noeviction` deletes keys: the
//! `allkeys-*` policies any key, the `volatile-*` ones keys with a TTL —
//! which is exactly the quota windows (every window key expires when idle),
//! while apalis's queue keys have none. A window that loses its entries
//! admits more than its limit, silently. `noeviction` makes Redis refuse
//! writes instead (a spend then fails, and the endpoint's
//! `limiter_unavailable` decides), which is loud and safe. See docs/redis.md.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::ConnectionLike;

/// The one policy that keeps every key.
pub(crate) const SAFE_POLICY: &str = "noeviction";

/// What the Redis says about its eviction policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// `noeviction`: nothing is ever evicted.
    Safe,
    /// Keys may be evicted under memory pressure (the policy's name).
    Unsafe(String),
    /// The policy could not be read (`CONFIG` renamed or disabled, as managed
    /// Redis services do; a timeout): it cannot be verified.
    Unknown(String),
}

impl Eviction {
    /// The problem in one sentence, with its fix: for `run`'s refusal,
    /// `check` and `/readyz`.
    pub(crate) fn unsafe_reason(policy: &str) -> String {
        format!(
            "Redis maxmemory-policy is {policy}: under memory pressure it evicts keys, the quota windows' among them, and the windows then admit more than their limits; set it to noeviction (`CONFIG SET maxmemory-policy noeviction` and `CONFIG REWRITE`, or `maxmemory-policy noeviction` in redis.conf), or set [redis] unsafe_eviction = \"warn\" to run anyway"
        )
    }
}

/// Reads `maxmemory-policy` with `CONFIG GET`, waiting at most `timeout`.
pub(crate) async fn check<C: ConnectionLike + Send>(conn: &mut C, timeout: Duration) -> Eviction {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let get = cmd.query_async::<HashMap<String, String>>(conn);
    match tokio::time::timeout(timeout, get).await {
        Err(_) => Eviction::Unknown(format!("CONFIG GET timed out after {timeout:?}")),
        Ok(Err(e)) => Eviction::Unknown(format!("CONFIG GET failed: {e}")),
        Ok(Ok(map)) => match map.get("maxmemory-policy") {
            Some(p) if p == SAFE_POLICY => Eviction::Safe,
            Some(p) => Eviction::Unsafe(p.clone()),
            None => Eviction::Unknown("CONFIG GET returned no maxmemory-policy".into()),
        },
    }
}
