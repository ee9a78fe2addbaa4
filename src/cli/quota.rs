//! `quota-worker quota [CREDENTIAL] [--json]`: used / remaining / frees-in of
//! every window, live from Redis. Exit 0, or 69 when Redis is unreachable.

use std::sync::Arc;

use serde_json::json;

use super::Exit;
use crate::config::{Config, fmt_duration};
use crate::quota::{CredentialUsage, Quotas};

/// Runs the command.
pub async fn run(config: &Config, credential: Option<&str>, as_json: bool) -> Exit {
    let quotas = Arc::new(Quotas::new(config));
    let names: Vec<String> = match credential {
        Some(c) if quotas.credential(c).is_err() => {
            let known: Vec<_> = quotas.credential_names().collect();
            eprintln!(
                "error: unknown credential {c:?} (known: {})",
                known.join(", ")
            );
            return Exit::Usage;
        }
        Some(c) => vec![c.to_owned()],
        None => quotas.credential_names().map(str::to_owned).collect(),
    };
    let limiter = match super::limiter(config, quotas) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let mut usages = Vec::new();
    for name in &names {
        match limiter.peek(name).await {
            Ok(u) => usages.push(u),
            Err(e) => return super::quota_error(config, &e),
        }
    }
    if as_json {
        println!("{}", to_json(&usages));
    } else {
        print!("{}", table(&usages));
    }
    Exit::Ok
}

/// The `--json` shape of SPEC "Command line".
pub(crate) fn to_json(usages: &[CredentialUsage]) -> serde_json::Value {
    let creds: Vec<_> = usages
        .iter()
        .map(|u| {
            let windows: Vec<_> = u
                .windows
                .iter()
                .map(|w| {
                    json!({
                        "scope": w.scope.to_string(),
                        "kind": w.window.kind_name(),
                        "units": w.window.units.get(),
                        "period_ms": w.window.per.as_millis() as u64,
                        "used": w.used,
                        "remaining": w.remaining,
                        "frees_in_ms": w.frees_in.as_millis() as u64,
                        "drift": w.drift,
                    })
                })
                .collect();
            json!({"name": u.name, "blocked_for_ms": u.blocked_for.as_millis() as u64, "windows": windows})
        })
        .collect();
    json!({ "credentials": creds })
}

/// A readable table per credential.
pub(crate) fn table(usages: &[CredentialUsage]) -> String {
    let mut out = String::new();
    for u in usages {
        let blocked = if u.blocked_for.is_zero() {
            String::new()
        } else {
            format!(
                "  BLOCKED by the upstream for {}",
                fmt_duration(u.blocked_for)
            )
        };
        out.push_str(&format!("{}{blocked}\n", u.name));
        let rows: Vec<[String; 6]> = u
            .windows
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let frees = if w.used == 0 {
                    "-".to_owned()
                } else {
                    fmt_duration(w.frees_in)
                };
                [
                    format!("{}", i + 1),
                    w.scope.to_string(),
                    w.window.describe(),
                    w.used.to_string(),
                    w.remaining.to_string(),
                    frees,
                ]
            })
            .collect();
        let header = ["#", "scope", "window", "used", "remaining", "frees in"].map(String::from);
        let mut widths = header.clone().map(|h| h.len());
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        for r in std::iter::once(&header).chain(&rows) {
            out.push_str("  ");
            for (i, (c, w)) in r.iter().zip(widths).enumerate() {
                // numbers right-aligned, text left-aligned
                if (3..=4).contains(&i) {
                    out.push_str(&format!("{c:>w$}  "));
                } else {
                    out.push_str(&format!("{c:<w$}  "));
                }
            }
            out.truncate(out.trim_end().len());
            out.push('\n');
        }
    }
    out
}
