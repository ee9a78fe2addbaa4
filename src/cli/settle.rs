//! `quota-worker settle ENDPOINT ID COST [--json]`: settles the spend `ID`
//! (what `spend` printed) to `COST` units, the CLI face of the settle the
//! worker makes after every request: `0` refunds its units, any cost ends
//! its lease in the endpoint's concurrent windows. Exit 0 settled, 64 an
//! endpoint (or tenant) the config does not have or an id no window holds
//! (never spent, refunded, or expired), 69 Redis unreachable.

use std::sync::Arc;

use serde_json::json;

use super::{Exit, outln};
use crate::config::Config;
use crate::quota::Quotas;

/// Runs the command.
pub async fn run(config: &Config, name: &str, id: &str, cost: u64, as_json: bool) -> Exit {
    let (endpoint, tenant) = match super::tenant::endpoint_or_exit(config, name, "settle") {
        Ok(found) => found,
        Err(code) => return code,
    };
    // The script takes a cost below 2^53 and an id it could have spent:
    // anything else is a bad command line, said before touching Redis.
    if cost >= 1 << 53 {
        eprintln!("error: cost {cost} is too large: a settle takes 0 to 2^53 - 1 units");
        return Exit::Usage;
    }
    if id.is_empty() || id.starts_with('#') {
        eprintln!("error: {id:?} is no spend's id: `quota-worker spend` prints one");
        return Exit::Usage;
    }
    let quotas = Arc::new(Quotas::new(config));
    let limiter = match super::limiter(config, quotas) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let settled = limiter
        .settle_for(&endpoint, tenant.as_deref(), id, cost)
        .await;
    let windows = match settled {
        Ok(n) => n,
        Err(e) => return super::limiter_failure(config, &e).await,
    };
    if windows == 0 {
        eprintln!(
            "error: no window of {name} holds spend {id:?}: it was never made there, was refunded, or has expired"
        );
        return Exit::Usage;
    }
    if as_json {
        outln!(
            "{}",
            json!({"settled": true, "request_id": id, "cost": cost, "windows": windows})
        );
    } else if cost == 0 {
        outln!(
            "refunded spend {id} on {name} in {windows} window(s); its lease, if it held one, is returned"
        );
    } else {
        outln!(
            "settled spend {id} on {name} to {cost} units in {windows} window(s); its lease, if it held one, is returned"
        );
    }
    Exit::Ok
}
