//! A quota window (`[[...windows]]`): its kind, mode, limit and period;
//! a job's priority [`Reserve`]; whose window it is ([`Scope`]); what may
//! name a resource.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use chrono_tz::Tz;

use super::{Endpoint, fmt_duration};

/// A quota window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// At most this many units...
    pub units: NonZeroU64,
    /// ...per this period (zero for a concurrent window: it has none).
    pub per: Duration,
    /// Trailing (sliding), calendar-aligned (fixed) or a leaky bucket.
    pub kind: WindowKind,
    /// `upstream = true`: it mirrors the upstream's own limit, so every
    /// answer that reports what the upstream has left resyncs it (drift).
    pub upstream: bool,
    /// The upstream resource it belongs to and mirrors (GitHub's `search`,
    /// an IETF limit's name); `None`: its credential's default resource
    /// ([`Credential::default_resource`]). A credential's window is spent
    /// by the endpoints of its resource; an endpoint's own window (whose
    /// resource is the endpoint's unless it names one) only says which
    /// limit it mirrors.
    pub resource: Option<String>,
    /// A credential's concurrent window that names no resource: it caps
    /// the requests in flight on the token whatever resource each counts
    /// against (GitHub's 100 concurrent requests are the token's, not
    /// `core`'s), so every endpoint of the credential spends it. Its keys
    /// are the default resource's.
    pub every_resource: bool,
    /// `mode = "shadow"`: evaluated and recorded with the others, never
    /// refusing; a spend it alone would refuse is admitted and counted as
    /// its shadow refusal (SPEC Part 4, "Shadow windows").
    pub mode: WindowMode,
    /// Its keys carry its units: an earlier window of its list has its
    /// resource, kind and period (a shadow window trying another number of
    /// units for the same limit). Set by the list, not the mode, so that a
    /// change of `mode` keeps the window's keys and state.
    pub keyed_by_units: bool,
}

/// Whether a window refuses what it would not admit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WindowMode {
    /// `"enforce"` (the default): it refuses.
    #[default]
    Enforce,
    /// `"shadow"`: it only records and counts what it would have refused.
    Shadow,
}

/// How a window's period is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowKind {
    /// Any trailing `per` (exact).
    Sliding,
    /// Calendar periods starting at `reset` (local time of day) in `timezone`.
    Fixed {
        /// Offset of the reset from local midnight.
        reset: Duration,
        /// The time zone the reset is in.
        timezone: Tz,
    },
    /// A leaky bucket (GCRA): at most `units` at once, refilled continuously
    /// at `units / per`.
    Bucket,
    /// At most `units` (weighted by cost) in flight at once: a spend takes a
    /// lease that its settle returns, or that lapses after `lease` (none
    /// written: the spending endpoint's `timeout` + [`LEASE_SLACK`]).
    Concurrent {
        /// How long a lease lasts when nothing returns it.
        lease: Option<Duration>,
    },
}

/// What a concurrent window's lease lasts beyond the endpoint's `timeout`
/// when the window names no `lease`: a request's answer is read (and its
/// lease returned) within the timeout, so a lease still held after it
/// belongs to a process that died.
pub const LEASE_SLACK: Duration = Duration::from_secs(5);

impl Window {
    /// Whether it is a shadow window (`mode = "shadow"`).
    pub fn is_shadow(&self) -> bool {
        self.mode == WindowMode::Shadow
    }

    /// "9500/24h", "100/1h fixed at 00:00 America/Los_Angeles", "8 in flight".
    pub fn describe(&self) -> String {
        let base = format!("{}/{}", self.units, fmt_duration(self.per));
        match &self.kind {
            WindowKind::Sliding => base,
            WindowKind::Bucket => format!("{base} bucket"),
            WindowKind::Concurrent { lease: None } => format!("{} in flight", self.units),
            WindowKind::Concurrent { lease: Some(l) } => {
                format!("{} in flight (lease {})", self.units, fmt_duration(*l))
            }
            WindowKind::Fixed { reset, timezone } => {
                let s = reset.as_secs();
                format!(
                    "{base} fixed, resets {:02}:{:02} {timezone}",
                    s / 3600,
                    s / 60 % 60
                )
            }
        }
    }

    /// "sliding", "fixed", "bucket" or "concurrent".
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            WindowKind::Sliding => "sliding",
            WindowKind::Fixed { .. } => "fixed",
            WindowKind::Bucket => "bucket",
            WindowKind::Concurrent { .. } => "concurrent",
        }
    }

    /// Whether a credential's window is spent by the endpoints of
    /// `resource` (`None`: the default one).
    pub fn serves(&self, resource: Option<&str>) -> bool {
        self.every_resource || self.resource.as_deref() == resource
    }

    /// Whether it counts requests in flight rather than units per period.
    pub fn is_concurrent(&self) -> bool {
        matches!(self.kind, WindowKind::Concurrent { .. })
    }

    /// A concurrent window's lease for a spend by `endpoint`: its own
    /// `lease`, else the endpoint's `timeout` + [`LEASE_SLACK`]. `None`
    /// for the other kinds.
    pub fn lease_for(&self, endpoint: &Endpoint) -> Option<Duration> {
        match self.kind {
            WindowKind::Concurrent { lease } => {
                Some(lease.unwrap_or(endpoint.timeout + LEASE_SLACK))
            }
            _ => None,
        }
    }

    /// The units a spend with `reserve` may take: all of them less the
    /// reserve's share, rounded so that at least that share stays free.
    pub fn admits(&self, reserve: Reserve) -> u64 {
        let u = self.units.get();
        let p = u64::from(reserve.percent());
        u - (u / 100 * p + (u % 100 * p).div_ceil(100))
    }
}

/// A job's priority reserve (`reserve = "20%"`): its spends are admitted only
/// while every window they touch keeps at least this share of its units free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Reserve(u8);

impl Reserve {
    /// No reserve: the whole window may be spent.
    pub const NONE: Reserve = Reserve(0);

    /// A reserve of `percent` (0–99).
    pub fn new(percent: u8) -> Option<Self> {
        (percent <= 99).then_some(Reserve(percent))
    }

    /// The share kept free, in percent.
    pub fn percent(self) -> u8 {
        self.0
    }
}

impl FromStr for Reserve {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid reserve {s:?}: write a whole percent from \"0%\" to \"99%\"");
        let n = s.trim().strip_suffix('%').ok_or_else(bad)?;
        n.trim()
            .parse::<u8>()
            .ok()
            .and_then(Reserve::new)
            .ok_or_else(bad)
    }
}

impl fmt::Display for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0)
    }
}

/// Whether `name` can name a resource: 1 to 64 of `a-z`, `0-9`, `_`, `-`,
/// `.` (GitHub's `core`, `code_search`; it is part of Redis keys and a
/// metric label).
pub fn resource_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && (name.bytes())
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b))
}

/// Whose window it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The credential's: every endpoint charged to it counts.
    Credential,
    /// One endpoint's own.
    Endpoint(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Credential => f.write_str("credential"),
            Scope::Endpoint(e) => write!(f, "endpoint:{e}"),
        }
    }
}
