//! What the limiter reports about windows: live usage
//! ([`super::Limiter::peek`]), forgotten drift ([`super::Limiter::undrift`])
//! and a template's tenants ([`super::Limiter::tenants`]).

use std::time::Duration;

use crate::config::{Scope, Window};

use super::{BlockReason, ResourceBlock};

/// [`WindowUsage::resource`] of a credential's concurrent window that caps
/// every resource ([`Window::every_resource`]): no resource name can be it.
pub const EVERY_RESOURCE: &str = "*";

/// Live usage of one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowUsage {
    /// Whose window.
    pub scope: Scope,
    /// The name of the resource it belongs to ([`EVERY_RESOURCE`]: a
    /// credential's concurrent window that names none counts them all).
    pub resource: String,
    /// The window.
    pub window: Window,
    /// Units recorded in it now (concurrent: units in flight).
    pub used: u64,
    /// Units left.
    pub remaining: u64,
    /// Sliding: when its oldest units expire; fixed: when it resets; bucket:
    /// when the next unit drains; concurrent: when its earliest lease
    /// expires (a settle may return one sooner). Zero when empty.
    pub frees_in: Duration,
    /// Units recorded as drift (the upstream reported fewer left than the
    /// window would admit) and still counted in `used`.
    pub drift: u64,
    /// A concurrent window's leases held now (requests in flight); 0 for
    /// the other kinds.
    pub leases: u64,
    /// A shadow window's refusals over the last 24 hours (the spend
    /// history's, [`super::ring`]); 0 for an enforced window.
    pub shadow_refusals: u64,
}

/// Live usage of a credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialUsage {
    /// The credential.
    pub name: String,
    /// How long its default resource stays blocked by an upstream throttle
    /// (zero: not blocked): for a credential of one resource, its block.
    pub blocked_for: Duration,
    /// Why, when it is blocked and the block said why.
    pub blocked_reason: Option<BlockReason>,
    /// Every resource's block, the default first.
    pub blocks: Vec<ResourceBlock>,
    /// Every window, credential's first.
    pub windows: Vec<WindowUsage>,
}

/// A window's drift that `undrift` forgot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    /// Whose window.
    pub scope: Scope,
    /// The name of the resource it belongs to.
    pub resource: String,
    /// The window.
    pub window: Window,
    /// The drift units it held and no longer counts.
    pub units: u64,
}

/// The tenants of a template credential found in Redis, by name, at most
/// `limit` of them, and whether there were more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenants {
    /// Tenant names (`ig[account=123]`), sorted.
    pub names: Vec<String>,
    /// More tenants have keys than `names` holds.
    pub more: bool,
}
