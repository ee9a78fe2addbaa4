//! `quota-worker quota [CREDENTIAL] [--json]`: used / remaining / frees-in of
//! every window, live from Redis, and the block of each resource (GitHub's
//! `core`, `search`, ...). Exit 0, or 69 when Redis is unreachable.
//!
//! A template credential's tenants are credentials of their own
//! (`ig[account=123]`), found by the keys they have in Redis: `quota` shows
//! the first [`TENANTS_IN_OVERVIEW`] of each template, `quota ig` up to
//! [`TENANTS_LISTED`], `quota 'ig[account=123]'` that one (keys or not).

use std::sync::Arc;

use serde_json::json;

use super::{Exit, out, outln};
use crate::config::{Config, fmt_duration};
use crate::quota::{CredentialUsage, Limiter, QuotaError, Quotas};

/// Tenants of each template `quota` shows without a credential.
pub const TENANTS_IN_OVERVIEW: usize = 10;
/// Tenants `quota TEMPLATE` lists at most.
pub const TENANTS_LISTED: usize = 100;

/// Runs the command.
pub async fn run(config: &Config, credential: Option<&str>, as_json: bool) -> Exit {
    if let Some(c) = credential
        && let Err(e) = super::tenant::credential(config, c)
    {
        eprintln!("error: {e}");
        return Exit::Usage;
    }
    let quotas = Arc::new(Quotas::new(config));
    // What to show: a credential or tenant by name, or a template's tenants
    // (at most so many).
    let wanted: Vec<(String, Option<usize>)> = match credential {
        Some(c) if quotas.template_of(c).is_some() => vec![(c.to_owned(), Some(TENANTS_LISTED))],
        Some(c) => match quotas.plan_for(c) {
            Ok(_) => vec![(c.to_owned(), None)],
            Err(_) => {
                let known: Vec<_> = quotas.credential_names().collect();
                eprintln!(
                    "error: unknown credential {c:?} (known: {}; a template's tenant is named like ig[account=123])",
                    known.join(", ")
                );
                return Exit::Usage;
            }
        },
        None => quotas
            .credential_names()
            .map(|c| {
                let bound = quotas.template_of(c).map(|_| TENANTS_IN_OVERVIEW);
                (c.to_owned(), bound)
            })
            .collect(),
    };
    let limiter = match super::limiter(config, quotas) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let mut usages = Vec::new();
    let mut notes = Vec::new();
    for (name, bound) in &wanted {
        let got = match bound {
            None => limiter.peek(name).await.map(|u| usages.push(u)),
            Some(limit) => tenants(&limiter, name, *limit, &mut usages)
                .await
                .map(|n| notes.push(n)),
        };
        if let Err(e) = got {
            return super::limiter_failure(config, &e).await;
        }
    }
    if as_json {
        let mut out = to_json(&usages);
        // Only with templates: a config without any keeps SPEC's shape.
        if !notes.is_empty() {
            out["templates"] = notes.iter().map(TemplateNote::to_json).collect();
        }
        outln!("{out}");
    } else {
        out!("{}", table(&usages));
        for n in &notes {
            outln!("{}", n.line(credential.is_none()));
        }
    }
    Exit::Ok
}

/// What `quota` found of one template's tenants.
struct TemplateNote {
    name: String,
    placeholder: String,
    shown: usize,
    more: bool,
}

impl TemplateNote {
    fn line(&self, overview: bool) -> String {
        let (name, ph, shown) = (&self.name, &self.placeholder, self.shown);
        let found = match (shown, self.more) {
            (0, _) => "no tenant has keys in Redis yet".to_owned(),
            (n, false) => format!("{n} tenant(s) with keys in Redis, all shown"),
            (n, true) if overview => {
                format!(
                    "more than {n} tenants with keys in Redis, {n} shown; `quota {name}` lists up to {TENANTS_LISTED}"
                )
            }
            (n, true) => format!("more than {n} tenants with keys in Redis, {n} shown"),
        };
        format!("{name}: template on {{{ph}}}: {found}; one tenant: quota '{name}[{ph}=VALUE]'")
    }

    fn to_json(&self) -> serde_json::Value {
        json!({"name": self.name, "placeholder": self.placeholder, "tenants_shown": self.shown, "more": self.more})
    }
}

/// Peeks the tenants of template `name` found in Redis, at most `limit`.
async fn tenants(
    limiter: &Limiter,
    name: &str,
    limit: usize,
    usages: &mut Vec<CredentialUsage>,
) -> Result<TemplateNote, QuotaError> {
    let found = limiter.tenants(name, limit).await?;
    for tenant in &found.names {
        usages.push(limiter.peek(tenant).await?);
    }
    Ok(TemplateNote {
        name: name.to_owned(),
        placeholder: limiter
            .quotas()
            .template_of(name)
            .unwrap_or_default()
            .to_owned(),
        shown: found.names.len(),
        more: found.more,
    })
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
                    let mut out = json!({
                        "scope": w.scope.to_string(),
                        "resource": w.resource,
                        "kind": w.window.kind_name(),
                        "units": w.window.units.get(),
                        "period_ms": w.window.per.as_millis() as u64,
                        "used": w.used,
                        "remaining": w.remaining,
                        "frees_in_ms": w.frees_in.as_millis() as u64,
                        "drift": w.drift,
                    });
                    // A concurrent window: `used` is units in flight, held
                    // by this many leases (it has no period: 0).
                    if w.window.is_concurrent() {
                        out["leases"] = json!(w.leases);
                    }
                    // A shadow window: what it would have refused over the
                    // last 24 hours (an enforced window has neither field).
                    if w.window.is_shadow() {
                        out["mode"] = json!("shadow");
                        out["shadow_refusals"] = json!(w.shadow_refusals);
                    }
                    out
                })
                .collect();
            let reason = u.blocked_reason.map(|r| r.as_str());
            // Each resource's block; `blocked_for_ms` above is the default
            // resource's (for a credential of one resource, its block).
            let resources: Vec<_> = (u.blocks.iter())
                .map(|b| {
                    json!({
                        "name": b.resource,
                        "default": b.default,
                        "blocked_for_ms": b.blocked_for.as_millis() as u64,
                        "blocked_reason": b.reason.map(|r| r.as_str()),
                        "streak": b.streak,
                    })
                })
                .collect();
            json!({"name": u.name, "blocked_for_ms": u.blocked_for.as_millis() as u64, "blocked_reason": reason, "resources": resources, "windows": windows})
        })
        .collect();
    json!({ "credentials": creds })
}

/// A credential's name and its blocks: one resource's beside the name, as
/// ever; several resources', a line per blocked one.
fn blocks_lines(u: &CredentialUsage) -> String {
    let several = u.blocks.len() > 1;
    let blocked = |b: &crate::quota::ResourceBlock| {
        let why = b.reason.map(|r| format!(" ({r})")).unwrap_or_default();
        let what = if several {
            format!("resource {} ", b.resource)
        } else {
            String::new()
        };
        format!(
            "  {what}BLOCKED by the upstream for {}{why}",
            fmt_duration(b.blocked_for)
        )
    };
    let mut lines = (u.blocks.iter()).filter(|b| !b.blocked_for.is_zero());
    let first = if several {
        String::new()
    } else {
        lines.next().map(blocked).unwrap_or_default()
    };
    let mut out = format!("{}{first}\n", u.name);
    for b in lines {
        out.push_str(&format!("{}\n", blocked(b)));
    }
    out
}

/// A readable table per credential.
pub(crate) fn table(usages: &[CredentialUsage]) -> String {
    let mut out = String::new();
    for u in usages {
        out.push_str(&blocks_lines(u));
        let several = u.blocks.len() > 1;
        // The resource column only where there are several.
        let rows: Vec<Vec<String>> = u
            .windows
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let frees = if w.used == 0 {
                    "-".to_owned()
                } else {
                    fmt_duration(w.frees_in)
                };
                let window = if w.window.is_concurrent() {
                    let s = if w.leases == 1 { "" } else { "s" };
                    format!("{} ({} lease{s} held)", w.window.describe(), w.leases)
                } else {
                    w.window.describe()
                };
                let window = if w.window.is_shadow() {
                    let n = w.shadow_refusals;
                    let s = if n == 1 { "" } else { "s" };
                    format!("{window} SHADOW ({n} refusal{s} in 24 h)")
                } else {
                    window
                };
                let mut row = vec![format!("{}", i + 1), w.scope.to_string()];
                if several {
                    row.push(w.resource.clone());
                }
                row.extend([window, w.used.to_string(), w.remaining.to_string(), frees]);
                row
            })
            .collect();
        let mut header = vec!["#", "scope"];
        if several {
            header.push("resource");
        }
        header.extend(["window", "used", "remaining", "frees in"]);
        let header: Vec<String> = header.into_iter().map(String::from).collect();
        let numbers = if several { 4..=5 } else { 3..=4 };
        let mut widths: Vec<usize> = header.iter().map(String::len).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.len());
            }
        }
        for r in std::iter::once(&header).chain(&rows) {
            out.push_str("  ");
            for (i, (c, w)) in r.iter().zip(&widths).enumerate() {
                let w = *w;
                // numbers right-aligned, text left-aligned
                if numbers.contains(&i) {
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
