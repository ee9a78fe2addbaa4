//! `quota-worker unblock CREDENTIAL [--resource NAME] [--drift]`: for an
//! operator who knows better than the upstream's last answer. Lifts the
//! credential's blocks (of one resource, or of all), with their reasons
//! and throttle streaks, and with `--drift` forgets the drift its windows
//! hold (of that resource's windows, or of all). Prints what it removed
//! and logs it at WARN with the operator's user name. Exit 0; 64 for an
//! unknown credential or resource; 69 when Redis is unreachable.

use std::sync::Arc;

use tracing::warn;

use super::{Exit, outln};
use crate::config::{Config, fmt_duration};
use crate::quota::{Limiter, Quotas};

/// Runs the command.
pub async fn run(config: &Config, credential: &str, resource: Option<&str>, drift: bool) -> Exit {
    if let Err(e) = super::tenant::credential(config, credential) {
        eprintln!("error: {e}");
        return Exit::Usage;
    }
    let quotas = Arc::new(Quotas::new(config));
    let plan = match quotas.plan_for(credential) {
        Ok(plan) => plan.into_owned(),
        Err(e @ crate::quota::QuotaError::UnknownCredential(_)) => {
            let known: Vec<_> = quotas.credential_names().collect();
            eprintln!("error: {e} (known: {})", known.join(", "));
            return Exit::Usage;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::Usage;
        }
    };
    let resources = quotas.resources(&plan.family);
    let chosen: Vec<Option<&str>> = match resource {
        None => resources.iter().map(|(r, _)| r.as_deref()).collect(),
        Some(name) => match resources.iter().find(|(_, n)| n == name) {
            Some((r, _)) => vec![r.as_deref()],
            None => {
                let known: Vec<&str> = resources.iter().map(|(_, n)| n.as_str()).collect();
                eprintln!(
                    "error: credential {credential} has no resource {name:?} (its resources: {})",
                    known.join(", ")
                );
                return Exit::Usage;
            }
        },
    };
    let limiter = match super::limiter(config, quotas.clone()) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let lifted = match limiter.unblock(credential, &chosen).await {
        Ok(l) => l,
        Err(e) => return super::limiter_failure(config, &e).await,
    };
    let user = super::operator();
    for b in &lifted {
        if b.blocked_for.is_zero() {
            outln!("{credential}: resource {} was not blocked", b.resource);
            continue;
        }
        let why = b.reason.map(|r| format!(" ({r})")).unwrap_or_default();
        let left = fmt_duration(b.blocked_for);
        outln!(
            "{credential}: resource {} unblocked; it was blocked for {left} more{why}",
            b.resource
        );
        warn!(credential, resource = %b.resource, blocked_ms = b.blocked_for.as_millis() as u64,
              reason = b.reason.map(|r| r.as_str()), streak = b.streak, user = %user,
              "an operator lifted the upstream's block");
    }
    if drift {
        return forget_drift(&limiter, credential, &chosen, &user).await;
    }
    Exit::Ok
}

/// `--drift`: forgets the drift of the windows of `resources`.
async fn forget_drift(
    limiter: &Limiter,
    credential: &str,
    resources: &[Option<&str>],
    user: &str,
) -> Exit {
    let forgot = match limiter.undrift(credential, resources).await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return if e.is_unavailable() {
                Exit::Unavailable
            } else {
                Exit::Software
            };
        }
    };
    for f in &forgot {
        let (scope, window, units) = (f.scope.to_string(), f.window.describe(), f.units);
        outln!(
            "{credential}: window {window} ({scope}, resource {}): {units} units of drift forgotten",
            f.resource
        );
        if units > 0 {
            warn!(credential, resource = %f.resource, scope, window, drift = units, user = %user,
                  "an operator made a window forget its drift");
        }
    }
    Exit::Ok
}
