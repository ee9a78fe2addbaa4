//! What a call on a set of windows sends, built once at load: the
//! windows in the spend core's order, their keys, specs, rings and
//! waiting lines ([`Plan`]), and an endpoint's ([`EndpointPlan`]).

use std::num::NonZeroU64;
use std::time::Duration;

use crate::config::{LimiterUnavailable, Reserve, Scope, Window, WindowKind};
use crate::keys::KeySpace;

use super::tz;

/// One window as the script takes it, with what the reports need.
#[derive(Debug, Clone)]
pub struct WindowPlan {
    /// Whose window.
    pub scope: Scope,
    /// The window.
    pub window: Window,
    /// Its keys, in script order.
    pub keys: Vec<String>,
    /// Its ARGV spec ("sliding:9500:86400000", "bucket:1000:20000").
    pub spec: String,
}

/// Everything a call on one set of windows sends, built once at load.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The credential charged: a tenant's own name for a template's tenant
    /// (`ig[account=123]`).
    pub credential: String,
    /// The configured credential it comes from (`ig`): the `credential`
    /// label of the counters, which never carry a tenant (docs/metrics.md).
    pub family: String,
    /// The resource whose block the calls check (the first key): an
    /// endpoint's; `None`, the credential's default resource.
    pub resource: Option<String>,
    /// KEYS: block, clock, then each window's keys.
    pub keys: Vec<String>,
    /// The windows, numbered from 1 in this order.
    pub windows: Vec<WindowPlan>,
    /// The spend history's rings ([`super::ring`]): one per scope among
    /// the windows (every window of a scope sees the same spends). A spend
    /// or settle passes them after the windows' keys, and the script adds
    /// to them in the same call.
    pub rings: Vec<String>,
    /// The windows' waiting lines (every kind but concurrent), in window
    /// order: a spend that names a ticket ([`super::Operation::Spend`]) passes
    /// them after the rings.
    pub lines: Vec<String>,
}

impl Plan {
    /// `lease`: a concurrent window's lease when it names none (the
    /// spending endpoint's `timeout` + [`crate::config::LEASE_SLACK`]);
    /// `resource`: whose block the calls check (`None`: the default one).
    pub(super) fn new(
        ks: &KeySpace,
        credential: &str,
        resource: Option<String>,
        windows: Vec<(Scope, Window)>,
        lease: Duration,
    ) -> Self {
        let now = chrono::Utc::now();
        let mut keys = vec![
            ks.blocked_in(credential, resource.as_deref()),
            ks.clock(credential),
        ];
        let windows: Vec<WindowPlan> = windows
            .into_iter()
            .map(|(scope, window)| {
                let wkeys = window_keys(ks, credential, &scope, &window);
                keys.extend(wkeys.iter().cloned());
                let per = window.per.as_millis();
                let spec = match &window.kind {
                    WindowKind::Sliding => format!("sliding:{}:{per}", window.units),
                    WindowKind::Bucket => format!("bucket:{}:{per}", window.units),
                    WindowKind::Concurrent { lease: own } => format!(
                        "concurrent:{}:{}",
                        window.units,
                        own.unwrap_or(lease).as_millis()
                    ),
                    WindowKind::Fixed { reset, timezone } => format!(
                        "fixed:{}:{per}:{}:{}",
                        window.units,
                        reset.as_millis(),
                        tz::table(*timezone, now)
                    ),
                };
                // A shadow window's spec says so (lua/spend/core.lua).
                let spec = if window.is_shadow() {
                    format!("shadow:{spec}")
                } else {
                    spec
                };
                WindowPlan {
                    scope,
                    window,
                    keys: wkeys,
                    spec,
                }
            })
            .collect();
        Plan {
            credential: credential.to_owned(),
            family: credential.to_owned(),
            resource,
            rings: rings(ks, credential, &windows),
            lines: lines(ks, credential, &windows),
            keys,
            windows,
        }
    }

    /// The same windows on `credential`'s keys: a template's plan for one
    /// of its tenants (the window specs, fixed windows' time zone tables
    /// included, are the template's).
    pub(super) fn for_credential(&self, ks: &KeySpace, credential: &str) -> Plan {
        let mut keys = vec![
            ks.blocked_in(credential, self.resource.as_deref()),
            ks.clock(credential),
        ];
        let windows: Vec<WindowPlan> = self
            .windows
            .iter()
            .map(|w| {
                let wkeys = window_keys(ks, credential, &w.scope, &w.window);
                keys.extend(wkeys.iter().cloned());
                WindowPlan {
                    keys: wkeys,
                    ..w.clone()
                }
            })
            .collect();
        Plan {
            credential: credential.to_owned(),
            family: self.family.clone(),
            resource: self.resource.clone(),
            rings: rings(ks, credential, &windows),
            lines: lines(ks, credential, &windows),
            keys,
            windows,
        }
    }

    /// The same credential with only the windows `keep` keeps (their keys,
    /// and the rings of those left).
    pub(super) fn only(&self, ks: &KeySpace, keep: impl Fn(&WindowPlan) -> bool) -> Plan {
        let windows: Vec<WindowPlan> = self.windows.iter().filter(|w| keep(w)).cloned().collect();
        let mut keys = self.keys[..2].to_vec();
        keys.extend(windows.iter().flat_map(|w| w.keys.iter().cloned()));
        Plan {
            credential: self.credential.clone(),
            family: self.family.clone(),
            resource: self.resource.clone(),
            rings: rings(ks, &self.credential, &windows),
            lines: lines(ks, &self.credential, &windows),
            keys,
            windows,
        }
    }

    /// The enforced window that admits the fewest units to a spend with
    /// `reserve` (a shadow window refuses nothing, a cost it can never fit
    /// included).
    pub(crate) fn tightest(&self, reserve: Reserve) -> Option<&Window> {
        self.windows
            .iter()
            .map(|w| &w.window)
            .filter(|w| !w.is_shadow())
            .min_by_key(|w| w.admits(reserve))
    }
}

/// The spend-history rings of `credential`'s `windows`: one per scope and
/// resource among them, in window order.
fn rings(ks: &KeySpace, credential: &str, windows: &[WindowPlan]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in windows {
        let key = ks.spent_in(credential, &w.scope, w.window.resource.as_deref());
        if !out.contains(&key) {
            out.push(key);
        }
    }
    out
}

/// The waiting lines of `credential`'s `windows`: one per enforced window
/// but concurrent ones, in window order (the kinds that keep one,
/// [`KeySpace::line`]; a shadow window makes no spend wait).
fn lines(ks: &KeySpace, credential: &str, windows: &[WindowPlan]) -> Vec<String> {
    (windows.iter())
        .filter(|w| !w.window.is_shadow())
        .filter_map(|w| ks.line(credential, &w.scope, &w.window))
        .collect()
}

/// A window's keys in the spend core's order: its kind's
/// ([`KeySpace::window`]), then, for a shadow window, the ring of its
/// refusals ([`KeySpace::shadow_refusals`]).
fn window_keys(ks: &KeySpace, credential: &str, scope: &Scope, window: &Window) -> Vec<String> {
    let mut keys = ks.window(credential, scope, window);
    if window.is_shadow() {
        keys.push(ks.shadow_refusals(credential, scope, window));
    }
    keys
}

/// An endpoint's spend plan.
#[derive(Debug, Clone)]
pub struct EndpointPlan {
    /// The endpoint.
    pub endpoint: String,
    /// Its configured cost.
    pub cost: NonZeroU64,
    /// Redis unreachable: reject or allow.
    pub policy: LimiterUnavailable,
    /// Keys and windows.
    pub plan: Plan,
}

impl EndpointPlan {
    /// Whether a spend takes a lease: one of its windows is concurrent, so
    /// the request's settle must follow it (it returns the lease).
    pub fn takes_lease(&self) -> bool {
        self.plan.windows.iter().any(|w| w.window.is_concurrent())
    }
}
