//! `quota-worker spend ENDPOINT [--cost N] [--reserve P%] [--json]`: one
//! spend, for shell scripts and other tools. Exit 0 allowed, 75 rejected, 69
//! Redis unreachable, 64 a cost that can never fit (or an endpoint or
//! tenant the config does not have). An endpoint of a template credential
//! spends from one tenant's windows: `spend 'ig.media[account=123]'`. On an
//! endpoint with a concurrent window an admitted spend holds a lease, named
//! by its id (`lease`), until `quota-worker settle ENDPOINT ID COST` returns
//! it or it lapses. A shadow window (`mode = "shadow"`) never refuses: the
//! spend names those that would have (`shadow_refused`).

use std::sync::Arc;

use serde_json::json;

use super::{Exit, outln};
use crate::config::{Config, Reserve, fmt_duration};
use crate::quota::{Decision, Quotas, RejectedBy, Spent};

/// Runs the command.
pub async fn run(
    config: &Config,
    name: &str,
    cost: Option<u64>,
    reserve: Reserve,
    as_json: bool,
) -> Exit {
    let (endpoint, tenant) = match super::tenant::endpoint_or_exit(config, name, "spend") {
        Ok(found) => found,
        Err(code) => return code,
    };
    let endpoint = endpoint.as_str();
    // A cost that can never fit is a usage error, found before touching Redis.
    let quotas = Arc::new(Quotas::new(config));
    let cost = match quotas.checked_cost(endpoint, cost, reserve) {
        Ok(c) => c,
        Err(e) => return super::quota_error(config, &e),
    };
    let limiter = match super::limiter(config, quotas) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let id = crate::quota::request_id();
    let options = crate::quota::SpendOptions::new()
        .cost(cost)
        .reserve(reserve)
        .tenant(tenant.as_deref());
    let spent = match limiter.spend_shadowed(endpoint, &id, options).await {
        Ok(s) => s,
        Err(e) => return super::limiter_failure(config, &e).await,
    };
    report(config, name, endpoint, cost, &id, &spent, as_json)
}

/// Prints `spent` (text or JSON) and returns its exit code.
fn report(
    config: &Config,
    name: &str,
    endpoint: &str,
    cost: u64,
    id: &str,
    spent: &Spent,
    as_json: bool,
) -> Exit {
    let (decision, shadow) = (&spent.decision, &spent.shadow_refused);
    let windows = config.windows_of(&config.endpoints[endpoint]);
    // Whether an admitted spend holds a lease, and how long it lasts
    // unreturned (the longest of its concurrent windows').
    let lease = (windows.iter())
        .filter_map(|(_, w)| w.lease_for(&config.endpoints[endpoint]))
        .max()
        .map(|l| l.as_millis() as u64);
    match decision {
        Decision::Allowed { remaining } => {
            if as_json {
                let mut out = json!({"allowed": true, "remaining": remaining, "retry_after_ms": 0,
                                     "rejecting_window": 0, "request_id": id,
                                     "shadow_refused": shadow});
                if let Some(ms) = lease {
                    out["lease"] = json!(id);
                    out["lease_ms"] = json!(ms);
                }
                outln!("{out}");
            } else {
                outln!(
                    "allowed: spent {cost} units on {name}; {remaining} left in the tightest window (request {id})"
                );
                print_notes(&windows, shadow, lease, name, id);
            }
            Exit::Ok
        }
        Decision::Unchecked => {
            if as_json {
                outln!(
                    "{}",
                    json!({"allowed": true, "remaining": null, "retry_after_ms": 0,
                           "rejecting_window": 0, "request_id": id, "unchecked": true,
                           "shadow_refused": []})
                );
            } else {
                outln!(
                    "allowed UNCHECKED: Redis is unavailable and {endpoint} is fail-open; nothing was recorded"
                );
            }
            Exit::Ok
        }
        Decision::Rejected(r) => {
            let ms = r.retry_after.as_millis() as u64;
            if as_json {
                outln!(
                    "{}",
                    json!({"allowed": false, "remaining": r.remaining, "retry_after_ms": ms,
                           "rejecting_window": r.by.window_number(), "request_id": id,
                           "blocked": r.by == RejectedBy::Blocked, "shadow_refused": []})
                );
            } else {
                let why = match r.by {
                    RejectedBy::Blocked => "the upstream throttled this credential".to_owned(),
                    RejectedBy::Window(n) | RejectedBy::InFlight(n) => {
                        let (scope, w) = &windows[n - 1];
                        format!("window {n} ({scope} {})", w.describe())
                    }
                };
                outln!(
                    "rejected: retry after {} ({ms} ms); refused by {why}; {} units left",
                    fmt_duration(r.retry_after),
                    r.remaining
                );
            }
            Exit::TempFail
        }
    }
}

/// Under an admitted spend's line: a line per shadow window (`shadow`:
/// their 1-based numbers among `windows`) that would have refused it, and
/// the lease it holds (`lease`: how long it lasts unreturned, ms).
fn print_notes(
    windows: &[(crate::config::Scope, &crate::config::Window)],
    shadow: &[usize],
    lease: Option<u64>,
    name: &str,
    id: &str,
) {
    for &n in shadow {
        let (scope, w) = &windows[n - 1];
        outln!(
            "shadow window {n} ({scope} {}) would have refused it (mode = \"shadow\": counted, not enforced)",
            w.describe()
        );
    }
    if let Some(ms) = lease {
        outln!(
            "lease {id} held until `quota-worker settle '{name}' {id} COST` returns it, or for {}",
            fmt_duration(std::time::Duration::from_millis(ms))
        );
    }
}
