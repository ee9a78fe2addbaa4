//! Quota windows and the spend: weighted units taken atomically from a
//! credential's shared windows in Redis by the spend core (`lua/spend/`, a
//! function library on Redis 7, one script by EVALSHA on Redis 6).
//!
//! This module knows no HTTP and no queue. Every spend is an [`Operation`]
//! laid out in one place ([`Plan::layout`]), made ready by
//! `Limiter::prepare` (its cost checked, its KEYS and ARGV) and decided by
//! `Limiter::conclude` (the reply, counted in the metrics). The CLI's
//! `spend`, the workers and the benchmarks call [`Limiter::spend`] (or
//! [`Limiter::spend_with`] with [`SpendOptions`]: a cost, a job's priority
//! reserve, a tenant, a waiting line), which runs both; a task's first
//! page's spend rides in the item claim's call between the two instead
//! (`worker::lock`, where `Limiter::rides_along` says it may). A decision
//! is data ([`Decision`]); a
//! cost that can never fit is an error of its own
//! ([`QuotaError::CostTooLarge`]), as in governor's `InsufficientCapacity`.
//! [`Limiter::sync`] records drift when the upstream reports fewer units left
//! than a window would admit.
//!
//! The windows live in the queue's Redis or on a Redis Cluster
//! (`[redis] quota_nodes`): [`backend`] connects to either, and the Limiter
//! works the same on both. With `[redis] quota_replicas = 1` an admitted
//! spend is acknowledged by a replica (`WAIT`) before the Limiter says yes.

pub mod backend;
mod block;
mod library;
mod operation;
pub(crate) mod ring;
mod shadow;
pub(crate) mod tz;

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;
use redis::{RedisResult, RetryMethod, Value};

use crate::config::{Config, LimiterUnavailable, Reserve, Scope, Window, WindowKind};
use crate::conn::Functions;
use crate::keys::KeySpace;
use backend::Durable;
pub use backend::{ProbeError, QuotaConn, QuotaTarget};

pub(crate) use block::BlockNote;
pub use block::{BlockFor, BlockReason, Blocked, ResourceBlock, STREAK_MEMORY};

pub(crate) use library::claim as claim_function;
pub use library::{Op, SCRIPT, library, script};
pub use operation::{Layout, Operation, SpendOptions};

/// Every script that runs where the windows live (the ACL check of a
/// `[redis] quota_nodes` cluster asks about the commands they call).
pub(crate) const SCRIPTS: [&str; 3] = [SCRIPT, block::BLOCK_SOURCE, block::BLOCKS_SOURCE];

/// Runs one call (`op`'s function, by `FCALL`, or by `EVALSHA` where `how`
/// says Redis runs no functions) with `layout`'s KEYS and ARGV; with
/// `then`, that command runs right after it on the same connection and its
/// reply comes back too.
async fn eval(
    conn: &mut QuotaConn,
    how: &Functions,
    op: Op,
    layout: &Layout,
    then: Option<&redis::Cmd>,
) -> RedisResult<(Value, Option<RedisResult<Value>>)> {
    let mut call = op.function().call();
    call.key(&layout.keys).arg(&layout.args);
    match then {
        None => Ok((call.invoke(conn, how).await?, None)),
        Some(then) => {
            let (script, then) = call.invoke_then(conn, how, then).await?;
            Ok((script, Some(then)))
        }
    }
}

/// How long the `WAIT` after an admitted spend waits for replicas, for a
/// call that may take `timeout` in all: a third of it. A call can hold two
/// `WAIT`s: on NOSCRIPT the pipeline runs again with `EVAL`, and the first
/// one's `WAIT` (with nothing new to wait for) still waits when the master
/// has no replica. So with no replica answering, both return (0) before the
/// call times out, and the spend is refunded rather than left in doubt.
/// Never 0, which would make `WAIT` wait forever.
pub fn replica_wait(timeout: Duration) -> Duration {
    // Whole milliseconds: what `WAIT` takes, and what the error then says.
    Duration::from_millis((timeout.as_millis() / 3).max(1) as u64)
}

/// A fresh request id: unique across processes and hosts.
pub fn request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// What a spend decided.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Recorded in every window.
    Allowed {
        /// Units left in the tightest window after this spend.
        remaining: u64,
    },
    /// Redis could not answer and the endpoint is `fail-open`: let through
    /// without being recorded.
    Unchecked,
    /// Not recorded anywhere.
    Rejected(Rejection),
}

impl Decision {
    /// Whether the request may go to the upstream.
    pub fn is_allowed(&self) -> bool {
        !matches!(self, Decision::Rejected(_))
    }

    /// This decision, a refusal by one of `plan`'s concurrent windows
    /// named as such ([`RejectedBy::InFlight`]).
    fn in_flight(self, plan: &Plan) -> Self {
        match self {
            Decision::Rejected(
                r @ Rejection {
                    by: RejectedBy::Window(n),
                    ..
                },
            ) if plan
                .windows
                .get(n - 1)
                .is_some_and(|w| w.window.is_concurrent()) =>
            {
                Decision::Rejected(Rejection {
                    by: RejectedBy::InFlight(n),
                    ..r
                })
            }
            other => other,
        }
    }
}

/// What a spend decided, and which shadow windows would have refused it.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spent {
    /// What the enforced windows decided.
    pub decision: Decision,
    /// The shadow windows (`mode = "shadow"`) that would have refused this
    /// admitted spend, by their 1-based numbers as [`RejectedBy::Window`]
    /// numbers them; empty when none would have, or the spend was refused.
    pub shadow_refused: Vec<usize>,
}

/// Why and for how long a spend was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Units left in the tightest window, as it stands.
    pub remaining: u64,
    /// When a spend of the same cost would be admitted if nobody else spent.
    pub retry_after: Duration,
    /// Which limit frees last.
    pub by: RejectedBy,
}

/// The limit that refused a spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectedBy {
    /// A window, by its 1-based number (credential windows first).
    Window(usize),
    /// A concurrent window, by its 1-based number: as many requests are in
    /// flight as it allows. The wait (at most 1 s) is momentary.
    InFlight(usize),
    /// The credential is blocked after the upstream throttled it.
    Blocked,
}

impl RejectedBy {
    /// The spend script's `rejecting_window` (0 for a block).
    pub(crate) fn window_number(self) -> usize {
        match self {
            RejectedBy::Window(n) | RejectedBy::InFlight(n) => n,
            RejectedBy::Blocked => 0,
        }
    }
}

/// What went wrong talking to the limiter. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// Fix the caller: no such endpoint in the config.
    #[error("unknown endpoint {0:?}")]
    UnknownEndpoint(String),
    /// Fix the caller: no such credential in the config.
    #[error("unknown credential {0:?}")]
    UnknownCredential(String),
    /// Fix the caller: a template credential is spent, peeked and blocked
    /// one tenant at a time (`ig[account=123]`).
    #[error("credential {0:?} is a template: name one tenant, as {0}[{1}=VALUE]")]
    TemplateNeedsTenant(String, String),
    /// Fix the caller: the credential has no such window.
    #[error("credential {credential:?} has no window {window}")]
    UnknownWindow {
        /// The credential.
        credential: String,
        /// The window asked for, described.
        window: String,
    },
    /// Fix the request: it could never be admitted.
    #[error("cost {cost} can never fit: the tightest window that applies is {window}")]
    CostTooLarge {
        /// The cost asked for.
        cost: u64,
        /// The smallest window, described.
        window: String,
    },
    /// Try again later: Redis did not answer in time.
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Try again later: Redis is unreachable, loading, or failing over.
    #[error("Redis is unavailable: {0}")]
    Unavailable(#[source] redis::RedisError),
    /// Try again later: an admitted spend was not acknowledged by a replica
    /// (`[redis] quota_replicas`) in time, so a failover could forget it. On a
    /// fail-closed endpoint the spend has been refunded (when Redis took the
    /// refund) and nothing may be sent.
    #[error(
        "the spend was not acknowledged by {wanted} replica(s) within {waited:?} ({acked} did); a failover could forget it"
    )]
    NotReplicated {
        /// Replicas asked for.
        wanted: u8,
        /// Replicas that acknowledged.
        acked: u64,
        /// How long `WAIT` waited.
        waited: Duration,
    },
    /// A bug: the script refused its arguments or answered nonsense.
    #[error("the spend script failed: {0}")]
    Script(String),
}

impl QuotaError {
    /// Whether the limiter itself could not answer (as opposed to a bad call).
    pub(crate) fn is_unavailable(&self) -> bool {
        matches!(
            self,
            QuotaError::Timeout(_) | QuotaError::Unavailable(_) | QuotaError::NotReplicated { .. }
        )
    }

    fn from_redis(e: redis::RedisError) -> Self {
        // Classified by what redis-rs says to do next, never by message text.
        match e.retry_method() {
            RetryMethod::NoRetry if e.code().is_some() => QuotaError::Script(e.to_string()),
            _ => QuotaError::Unavailable(e),
        }
    }
}

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
    /// The spend history's rings ([`ring`]): one per scope among
    /// the windows (every window of a scope sees the same spends). A spend
    /// or settle passes them after the windows' keys, and the script adds
    /// to them in the same call.
    pub rings: Vec<String>,
    /// The windows' waiting lines (every kind but concurrent), in window
    /// order: a spend that names a ticket ([`Operation::Spend`]) passes
    /// them after the rings.
    pub lines: Vec<String>,
}

impl Plan {
    /// `lease`: a concurrent window's lease when it names none (the
    /// spending endpoint's `timeout` + [`crate::config::LEASE_SLACK`]);
    /// `resource`: whose block the calls check (`None`: the default one).
    fn new(
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
    fn for_credential(&self, ks: &KeySpace, credential: &str) -> Plan {
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
    fn only(&self, ks: &KeySpace, keep: impl Fn(&WindowPlan) -> bool) -> Plan {
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

/// A spend made ready to run (`Limiter::prepare`).
pub(crate) struct PreparedSpend<'a> {
    /// Whether the windows' Redis runs the spend core by FCALL (the
    /// limiter's, for a script of one's own on the same Redis).
    pub(crate) functions: &'a Functions,
    /// The endpoint's plan (a template tenant's own).
    pub(crate) ep: Cow<'a, EndpointPlan>,
    /// Its KEYS and ARGV.
    pub(crate) layout: Layout,
    /// Its cost, checked.
    pub(crate) cost: u64,
}

/// Turns a reply that carried a spend's into the spend's own: its values
/// as numbers, or a script error (`QuotaError::Script`).
pub(crate) fn spend_reply(values: &[String]) -> Result<Vec<i64>, QuotaError> {
    match values {
        [flag, message] if flag == "error" => Err(QuotaError::Script(message.clone())),
        _ => (values.iter())
            .map(|v| v.parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|_| QuotaError::Script(format!("spend returned {values:?}"))),
    }
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

/// Every plan of a config: per endpoint (spend, settle) and per credential
/// (peek, block; all its windows, endpoints' included).
#[derive(Debug, Clone)]
pub struct Quotas {
    keys: KeySpace,
    endpoints: HashMap<String, EndpointPlan>,
    credentials: IndexMap<String, Plan>,
    /// Template credentials by name: their placeholder.
    templates: HashMap<String, String>,
    /// Each credential's resources (`None`: its default one) and their
    /// names, the default first.
    resources: HashMap<String, Vec<(Option<String>, String)>>,
}

impl Quotas {
    /// Builds the plans of `config`.
    pub fn new(config: &Config) -> Self {
        let ks = KeySpace::new(config.redis.key_prefix.clone());
        let endpoints = config
            .endpoints
            .values()
            .map(|e| {
                let windows = config
                    .windows_of(e)
                    .into_iter()
                    .map(|(s, w)| (s, w.clone()))
                    .collect();
                let lease = e.timeout + crate::config::LEASE_SLACK;
                let plan = EndpointPlan {
                    endpoint: e.name.clone(),
                    cost: e.cost,
                    policy: e.limiter_unavailable,
                    plan: Plan::new(&ks, &e.credential, e.resource.clone(), windows, lease),
                };
                (e.name.clone(), plan)
            })
            .collect();
        let credentials = config
            .credentials
            .values()
            .map(|c| {
                let mut windows: Vec<(Scope, Window)> = c
                    .windows
                    .iter()
                    .map(|w| (Scope::Credential, w.clone()))
                    .collect();
                // Peek, block and sync read no lease: any valid one does.
                let mut lease = crate::config::LEASE_SLACK;
                for e in config.endpoints.values().filter(|e| e.credential == c.name) {
                    lease = lease.max(e.timeout + crate::config::LEASE_SLACK);
                    windows.extend(
                        e.windows
                            .iter()
                            .map(|w| (Scope::Endpoint(e.name.clone()), w.clone())),
                    );
                }
                (
                    c.name.clone(),
                    Plan::new(&ks, &c.name, None, windows, lease),
                )
            })
            .collect();
        let templates = config
            .credentials
            .values()
            .filter_map(|c| Some((c.name.clone(), c.template.clone()?)))
            .collect();
        let resources = (config.credentials.values())
            .map(|c| {
                let named = (c.resources(config.endpoints.values()).into_iter())
                    .map(|r| (r.map(str::to_owned), c.resource_name(r).to_owned()))
                    .collect();
                (c.name.clone(), named)
            })
            .collect();
        Quotas {
            keys: ks,
            endpoints,
            credentials,
            templates,
            resources,
        }
    }

    /// The resources of configured credential `family` (a template's, for
    /// its tenants): `None` for the default one, and each one's name; the
    /// default first.
    pub fn resources(&self, family: &str) -> Vec<(Option<String>, String)> {
        self.resources.get(family).cloned().unwrap_or_default()
    }

    /// The name of `resource` of credential `family` (`None`: its default).
    pub fn resource_name<'a>(&'a self, family: &str, resource: Option<&'a str>) -> &'a str {
        match resource {
            Some(r) => r,
            None => (self.resources.get(family))
                .and_then(|rs| rs.first())
                .map_or(crate::config::defaults::RESOURCE, |(_, name)| name.as_str()),
        }
    }

    /// Resource `name` of credential `family` as its keys hold it: `None`
    /// for the default one.
    pub fn resource_of(&self, family: &str, name: &str) -> Option<String> {
        (self.resource_name(family, None) != name).then(|| name.to_owned())
    }

    /// The key space.
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// An endpoint's plan.
    pub fn endpoint(&self, name: &str) -> Result<&EndpointPlan, QuotaError> {
        self.endpoints
            .get(name)
            .ok_or_else(|| QuotaError::UnknownEndpoint(name.to_owned()))
    }

    /// A credential's plan (all its windows).
    pub(crate) fn credential(&self, name: &str) -> Result<&Plan, QuotaError> {
        self.credentials
            .get(name)
            .ok_or_else(|| QuotaError::UnknownCredential(name.to_owned()))
    }

    /// A credential's plan by the name `quota` shows: a configured
    /// credential's, or one tenant's of a template (`ig[account=123]`,
    /// the value as written or percent-encoded). A template's own name is
    /// refused: it has no windows of its own.
    pub(crate) fn plan_for(&self, name: &str) -> Result<Cow<'_, Plan>, QuotaError> {
        if let Some((cred, placeholder, value)) = crate::config::parse_tenant(name)
            && self.templates.get(cred).is_some_and(|p| p == placeholder)
        {
            let tenant = crate::config::tenant_name(cred, placeholder, &value);
            return Ok(Cow::Owned(
                self.credentials[cred].for_credential(&self.keys, &tenant),
            ));
        }
        if let Some(placeholder) = self.templates.get(name) {
            return Err(QuotaError::TemplateNeedsTenant(
                name.to_owned(),
                placeholder.clone(),
            ));
        }
        self.credential(name).map(Cow::Borrowed)
    }

    /// The template placeholder of credential `name`, if it is a template.
    pub(crate) fn template_of(&self, name: &str) -> Option<&str> {
        self.templates.get(name).map(String::as_str)
    }

    /// An endpoint's plan for one tenant `value` of its template
    /// credential; for `None` (or a plain credential) the endpoint's own.
    pub(crate) fn endpoint_for(
        &self,
        endpoint: &str,
        value: Option<&str>,
    ) -> Result<Cow<'_, EndpointPlan>, QuotaError> {
        let ep = self.endpoint(endpoint)?;
        let family = &ep.plan.family;
        match (value, self.templates.get(family)) {
            (None, None) => Ok(Cow::Borrowed(ep)),
            (Some(value), Some(placeholder)) => {
                let tenant = crate::config::tenant_name(family, placeholder, value);
                Ok(Cow::Owned(EndpointPlan {
                    plan: ep.plan.for_credential(&self.keys, &tenant),
                    ..ep.clone()
                }))
            }
            (None, Some(placeholder)) => Err(QuotaError::TemplateNeedsTenant(
                family.clone(),
                placeholder.clone(),
            )),
            (Some(_), None) => Err(QuotaError::UnknownCredential(format!("{family}[...]"))),
        }
    }

    /// Credential names, in config order.
    pub(crate) fn credential_names(&self) -> impl Iterator<Item = &str> {
        self.credentials.keys().map(String::as_str)
    }

    /// The window number (0-based, as [`Limiter::peek`] lists them) of a
    /// credential's window: `scope`'s window of `kind_name` and period `per`.
    pub fn window_index(
        &self,
        credential: &str,
        scope: &Scope,
        window: &Window,
    ) -> Result<usize, QuotaError> {
        let plan = self.plan_for(credential)?;
        plan.windows
            .iter()
            .position(|w| {
                &w.scope == scope
                    && w.window.kind_name() == window.kind_name()
                    && w.window.per == window.per
                    && w.window.resource == window.resource
                    && w.window.units == window.units
            })
            .ok_or_else(|| QuotaError::UnknownWindow {
                credential: credential.to_owned(),
                window: format!("{scope} {}", window.describe()),
            })
    }

    /// The cost a spend would charge, checked against the window that admits
    /// the fewest units with `reserve` kept free.
    pub(crate) fn checked_cost(
        &self,
        endpoint: &str,
        cost: Option<u64>,
        reserve: Reserve,
    ) -> Result<u64, QuotaError> {
        let ep = self.endpoint(endpoint)?;
        let cost = cost.unwrap_or(ep.cost.get());
        if let Some(w) = ep.plan.tightest(reserve)
            && cost > w.admits(reserve)
        {
            let window = if reserve == Reserve::NONE {
                w.describe()
            } else {
                format!(
                    "{} with {reserve} kept free ({} units)",
                    w.describe(),
                    w.admits(reserve)
                )
            };
            return Err(QuotaError::CostTooLarge { cost, window });
        }
        if cost == 0 {
            return Err(QuotaError::CostTooLarge {
                cost,
                window: "a spend costs at least 1 unit".into(),
            });
        }
        Ok(cost)
    }
}

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
    /// history's, [`ring`]); 0 for an enforced window.
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

/// The limiter: spend, settle, block and peek over one connection to where
/// the windows live ([`QuotaConn`]: a standalone Redis or a Redis Cluster),
/// which reconnects by itself.
#[derive(Clone)]
pub struct Limiter {
    conn: QuotaConn,
    /// Whether that Redis runs the spend core by FCALL (learnt at the first
    /// call, shared by this limiter's clones).
    functions: Functions,
    quotas: Arc<Quotas>,
    timeout: Duration,
    /// Replicas that must acknowledge an admitted spend (0: none).
    replicas: u8,
    /// Whether spends and settles write the status page's spend history.
    history: bool,
}

impl Limiter {
    /// A limiter for `quotas` over `conn` (a `Conn` or a cluster
    /// connection); each call waits at most `timeout`.
    pub fn new(conn: impl Into<QuotaConn>, quotas: Arc<Quotas>, timeout: Duration) -> Self {
        Limiter {
            conn: conn.into(),
            functions: Functions::default(),
            quotas,
            timeout,
            replicas: 0,
            history: true,
        }
    }

    /// This limiter, without the status page's spend history: its spends
    /// and settles write the windows only, as a program that calls the
    /// script without the history's KEYS and ARGV does. For measuring the
    /// window arithmetic alone (benches/quota); the daemon keeps it.
    #[must_use]
    pub fn without_history(mut self) -> Self {
        self.history = false;
        self
    }

    /// This limiter, with each admitted spend acknowledged by `replicas`
    /// replicas (`[redis] quota_replicas`) before it counts as admitted: the
    /// spend and a `WAIT replicas <a third of the timeout>` go to the master as
    /// one pipeline on one connection, so `WAIT` counts exactly this
    /// connection's writes, the spend's included. A spend that is not
    /// acknowledged in time is limiter-unavailable (see [`Limiter::spend`]).
    #[must_use]
    pub fn with_replicas(mut self, replicas: u8) -> Self {
        self.replicas = replicas;
        self
    }

    /// This limiter with other plans (a reloaded config's windows and
    /// costs), on the same connection.
    #[must_use]
    pub fn with_quotas(&self, quotas: Arc<Quotas>) -> Self {
        Limiter {
            quotas,
            ..self.clone()
        }
    }

    /// The plans.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The connection to where the windows (and the spend history) live.
    pub(crate) fn conn(&self) -> &QuotaConn {
        &self.conn
    }

    /// Runs `operation` on `plan`'s windows once; a dropped connection is
    /// retried once (the connection has reconnected by then): spend and
    /// settle are idempotent by request id, block and peek by nature.
    async fn call(&self, plan: &Plan, operation: &Operation<'_>) -> Result<Vec<i64>, QuotaError> {
        let layout = plan.layout(operation);
        self.call_then(operation.op(), &layout, None)
            .await
            .map(|(r, _)| r)
    }

    /// One call of `op` with `layout`, with `then` run right after it on
    /// the same connection; its reply (or error) comes back as is.
    async fn call_then(
        &self,
        op: Op,
        layout: &Layout,
        then: Option<&redis::Cmd>,
    ) -> Result<(Vec<i64>, Option<RedisResult<Value>>), QuotaError> {
        let mut last = None;
        for _ in 0..2 {
            let mut conn = self.conn.clone();
            let reply = tokio::time::timeout(
                self.timeout,
                eval(&mut conn, &self.functions, op, layout, then),
            )
            .await;
            match reply {
                Err(_) => return Err(QuotaError::Timeout(self.timeout)),
                Ok(Ok((v, then))) => return Ok((ints(v)?, then)),
                Ok(Err(e)) if e.is_connection_dropped() => last = Some(e),
                Ok(Err(e)) => return Err(QuotaError::from_redis(e)),
            }
        }
        Err(QuotaError::from_redis(last.expect("loop ran")))
    }

    /// Spends `cost` (default: the endpoint's) units from every window that
    /// applies to `endpoint`, all or nothing. When Redis cannot answer, the
    /// endpoint's `limiter_unavailable` policy decides: fail-closed returns
    /// the error, fail-open returns [`Decision::Unchecked`] and logs it.
    ///
    /// With replicas to wait for ([`Limiter::with_replicas`]), an admitted
    /// spend that no replica acknowledged in time counts as the limiter being
    /// unavailable: fail-closed refunds it and returns
    /// [`QuotaError::NotReplicated`]; fail-open logs it and returns
    /// [`Decision::Allowed`] (the spend is recorded on the master; only a
    /// failover before it reaches a replica would forget it).
    pub async fn spend(
        &self,
        endpoint: &str,
        cost: Option<u64>,
        request_id: &str,
    ) -> Result<Decision, QuotaError> {
        self.spend_with(endpoint, request_id, SpendOptions::new().cost(cost))
            .await
    }

    /// [`Limiter::spend`] as `options` say (a cost, a reserve, a tenant, a
    /// waiting line, the history).
    pub async fn spend_with(
        &self,
        endpoint: &str,
        request_id: &str,
        options: SpendOptions<'_>,
    ) -> Result<Decision, QuotaError> {
        (self.spend_shadowed(endpoint, request_id, options).await).map(|s| s.decision)
    }

    /// [`Limiter::spend_with`], with the shadow windows that would have
    /// refused the spend ([`Spent`]).
    pub async fn spend_shadowed(
        &self,
        endpoint: &str,
        request_id: &str,
        options: SpendOptions<'_>,
    ) -> Result<Spent, QuotaError> {
        let spend = self.prepare(endpoint, request_id, options)?;
        let started = std::time::Instant::now();
        let reply = (self.spend_replicated(&spend, request_id)).await;
        self.conclude_spent(&spend, reply, started.elapsed())
    }

    /// A spend made ready to run: checked, with its KEYS and ARGV.
    /// [`Limiter::spend_with`] runs it; the item claim runs it in its own
    /// call instead (the library's claim, `lua/spend/claim.lua`) where
    /// `Limiter::rides_along` says that is sound, and hands the spend's
    /// reply to `Limiter::conclude`.
    pub(crate) fn prepare(
        &self,
        endpoint: &str,
        request_id: &str,
        options: SpendOptions<'_>,
    ) -> Result<PreparedSpend<'_>, QuotaError> {
        let cost = (self.quotas).checked_cost(endpoint, options.cost, options.reserve)?;
        let ep = self.quotas.endpoint_for(endpoint, options.tenant)?;
        let layout = ep.plan.layout(&Operation::Spend {
            request_id,
            cost,
            reserve: options.reserve,
            ticket: options.ticket,
            history: options.history.unwrap_or(self.history),
        });
        Ok(PreparedSpend {
            functions: &self.functions,
            layout,
            cost,
            ep,
        })
    }

    /// Whether a spend may run inside a script on the queue's own
    /// connection: the windows live in the queue's Redis (not on a
    /// cluster), and no replica has to acknowledge the spend (`WAIT`
    /// counts one connection's writes; the Limiter's own call sends it).
    pub(crate) fn rides_along(&self) -> bool {
        matches!(self.conn, QuotaConn::Standalone(_)) && self.replicas == 0
    }

    /// What a prepared spend's reply (the script's, or the error of the
    /// call that carried it) decides, counted in the metrics as every spend
    /// is; `took`: how long the call took. When Redis could not answer, the
    /// endpoint's `limiter_unavailable` policy decides: fail-closed returns
    /// the error, fail-open returns [`Decision::Unchecked`] and logs it.
    pub(crate) fn conclude(
        &self,
        spend: &PreparedSpend<'_>,
        reply: Result<Vec<i64>, QuotaError>,
        took: Duration,
    ) -> Result<Decision, QuotaError> {
        self.conclude_spent(spend, reply, took).map(|s| s.decision)
    }

    /// [`Limiter::conclude`], with the shadow windows that would have
    /// refused the spend (counted in the metrics and the log as they are
    /// named: [`shadow::note`]).
    fn conclude_spent(
        &self,
        spend: &PreparedSpend<'_>,
        reply: Result<Vec<i64>, QuotaError>,
        took: Duration,
    ) -> Result<Spent, QuotaError> {
        let (ep, cost) = (&spend.ep, spend.cost);
        let endpoint = ep.endpoint.as_str();
        metrics::histogram!("qw_spend_duration_seconds", "endpoint" => endpoint.to_owned())
            .record(took.as_secs_f64());
        let result = match &reply {
            Ok(r) if r.first() == Some(&1) => "allowed",
            Ok(_) => "rejected",
            Err(e) if e.is_unavailable() && ep.policy == LimiterUnavailable::FailOpen => {
                "unchecked"
            }
            Err(_) => "error",
        };
        // The configured credential, not the tenant: hundreds of tenants
        // would multiply every counter's series (docs/metrics.md).
        let credential = ep.plan.family.clone();
        metrics::counter!("qw_spends_total", "credential" => credential.clone(), "endpoint" => endpoint.to_owned(), "result" => result)
            .increment(1);
        if result == "allowed" {
            metrics::counter!("qw_units_spent_total", "credential" => credential, "endpoint" => endpoint.to_owned())
                .increment(cost);
        }
        match reply {
            Ok(r) => {
                let decision = decision(&r)?.in_flight(&ep.plan);
                let shadow_refused = shadow::refused(&r, &ep.plan)?;
                shadow::note(&ep.plan, &shadow_refused);
                Ok(Spent {
                    decision,
                    shadow_refused,
                })
            }
            Err(e) if e.is_unavailable() && ep.policy == LimiterUnavailable::FailOpen => {
                tracing::warn!(
                    endpoint,
                    credential = %ep.plan.credential,
                    cost,
                    error = %e,
                    "limiter unavailable; endpoint is fail-open, request allowed unrecorded"
                );
                Ok(Spent {
                    decision: Decision::Unchecked,
                    shadow_refused: Vec::new(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Runs a spend; with replicas to wait for, the `WAIT` after it, and on
    /// an admitted spend that was not acknowledged, what the endpoint's
    /// policy says: fail-open logs it and keeps the admission, fail-closed
    /// refunds the spend and fails. A rejected spend's `WAIT` reply is not
    /// looked at: a rejection stands whatever the replicas say.
    async fn spend_replicated(
        &self,
        spend: &PreparedSpend<'_>,
        request_id: &str,
    ) -> Result<Vec<i64>, QuotaError> {
        let ep = &spend.ep;
        if self.replicas == 0 {
            return (self.call_then(Op::Spend, &spend.layout, None).await).map(|(r, _)| r);
        }
        let waited = replica_wait(self.timeout);
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(waited.as_millis() as u64);
        let (r, acked) = (self.call_then(Op::Spend, &spend.layout, Some(&wait))).await?;
        if r.first() != Some(&1) {
            return Ok(r);
        }
        // An error answer (WAIT on a replica, say) acknowledges nothing.
        let acked = match acked {
            Some(Ok(Value::Int(n))) => n.max(0) as u64,
            _ => 0,
        };
        if acked >= u64::from(self.replicas) {
            return Ok(r);
        }
        let credential = &ep.plan.credential;
        // Labelled by the configured credential, not the tenant (as
        // qw_spends_total is).
        metrics::counter!("qw_replica_wait_failures_total", "credential" => ep.plan.family.clone())
            .increment(1);
        let err = QuotaError::NotReplicated {
            wanted: self.replicas,
            acked,
            waited,
        };
        if ep.policy == LimiterUnavailable::FailOpen {
            tracing::warn!(
                endpoint = %ep.endpoint,
                credential = %credential,
                request_id,
                error = %err,
                "spend admitted on the master but not acknowledged by a replica; endpoint is fail-open, request allowed"
            );
            return Ok(r);
        }
        // Fail-closed: nothing will be sent, so the units go back. A refund
        // Redis does not take leaves them spent, which admits less, never more.
        let refund = Operation::Settle {
            request_id,
            actual: 0,
            history: self.history,
        };
        if let Err(e) = self.call(&ep.plan, &refund).await {
            tracing::error!(
                endpoint = %ep.endpoint,
                credential = %credential,
                request_id,
                error = %e,
                "could not refund a spend that no replica acknowledged; its units stay spent"
            );
        }
        Err(err)
    }

    /// Settles `request_id` to its actual cost in every window its spend
    /// touched: 0 refunds it (the request never reached the upstream), more
    /// or less adjusts it. Returns how many windows still held it.
    pub async fn settle(
        &self,
        endpoint: &str,
        request_id: &str,
        actual: u64,
    ) -> Result<usize, QuotaError> {
        self.settle_for(endpoint, None, request_id, actual).await
    }

    /// [`Limiter::settle`] on one tenant of a template credential.
    pub async fn settle_for(
        &self,
        endpoint: &str,
        tenant: Option<&str>,
        request_id: &str,
        actual: u64,
    ) -> Result<usize, QuotaError> {
        let ep = self.quotas.endpoint_for(endpoint, tenant)?;
        let settle = Operation::Settle {
            request_id,
            actual,
            history: self.history,
        };
        // A refund lost in a failover admits less, never more: no WAIT.
        let r = if actual == 0 {
            self.call(&ep.plan, &settle).await?
        } else {
            self.call_acked(Durable::Settle, &ep.plan, &settle).await?
        };
        Ok(r.first().copied().unwrap_or(0).max(0) as usize)
    }

    /// Blocks `credential` for `for_` (never shortening a longer block), so
    /// no spend anywhere is admitted meanwhile. Returns the block in force.
    /// A template's tenant is named as `quota` shows it (`ig[account=123]`).
    pub async fn block(&self, credential: &str, for_: Duration) -> Result<Duration, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let r = (self.call_acked(Durable::Block, &plan, &Operation::Block(for_))).await?;
        Ok(Duration::from_millis(
            r.first().copied().unwrap_or(0).max(0) as u64,
        ))
    }

    /// Reads a credential's live usage (drops expired entries on the way,
    /// which changes no answer).
    /// A template's tenant is named as `quota` shows it (`ig[account=123]`).
    pub async fn peek(&self, credential: &str) -> Result<CredentialUsage, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let r = self.call(&plan, &Operation::Peek).await?;
        if r.len() != 1 + 5 * plan.windows.len() {
            return Err(QuotaError::Script(format!(
                "peek returned {} values",
                r.len()
            )));
        }
        let u = |x: i64| x.max(0) as u64;
        let windows = plan
            .windows
            .iter()
            .zip(r[1..].chunks(5))
            .map(|(w, c)| WindowUsage {
                scope: w.scope.clone(),
                resource: if w.window.every_resource {
                    EVERY_RESOURCE.to_owned()
                } else {
                    (self.quotas)
                        .resource_name(&plan.family, w.window.resource.as_deref())
                        .to_owned()
                },
                window: w.window.clone(),
                used: u(c[0]),
                remaining: u(c[1]),
                frees_in: Duration::from_millis(u(c[2])),
                drift: u(c[3]),
                leases: u(c[4]),
                shadow_refusals: 0,
            })
            .collect();
        let windows = self.shadow_counts(&plan, windows).await?;
        let blocks = self.read_blocks(&plan).await?;
        let default = blocks.iter().find(|b| b.default);
        Ok(CredentialUsage {
            name: plan.credential.clone(),
            blocked_for: default.map_or(Duration::ZERO, |b| b.blocked_for),
            blocked_reason: default.and_then(|b| b.reason),
            blocks,
            windows,
        })
    }

    /// The upstream reports `upstream_left` units left on the limit that
    /// window `window` of `credential` mirrors (0-based, as [`Limiter::peek`]
    /// lists them; [`Quotas::window_index`] finds it). If the window would
    /// admit more, the difference is recorded as drift: units spent now,
    /// atomically with the window's other state, expiring with them, counted
    /// in `qw_drift_units_total{credential}`. Drift only ever lowers what the
    /// window admits. Returns the drift recorded (0: none needed).
    ///
    /// `resets_in`: when the upstream's count resets, from now, if the
    /// answer said (GitHub's `x-ratelimit-reset`, IETF's `t`): the drift
    /// recorded stops counting then, so from a second after it the window
    /// admits what its own spends allow. Without it, the drift lives as
    /// spends do (a sliding window's `per`).
    pub async fn sync(
        &self,
        credential: &str,
        window: usize,
        upstream_left: u64,
        resets_in: Option<Duration>,
    ) -> Result<u64, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let Some(w) = plan.windows.get(window) else {
            return Err(QuotaError::UnknownWindow {
                credential: credential.to_owned(),
                window: format!("number {window} of {}", plan.windows.len()),
            });
        };
        let sync = Operation::Sync {
            window,
            left: upstream_left,
            resets_in,
        };
        let r = self.call_acked(Durable::Sync, &plan, &sync).await?;
        let drift = r.first().copied().unwrap_or(0).max(0) as u64;
        if drift > 0 {
            metrics::counter!("qw_drift_units_total", "credential" => plan.family.clone())
                .increment(drift);
            tracing::info!(
                credential,
                window = %w.window.describe(),
                scope = %w.scope,
                drift,
                upstream_left,
                resets_in_ms = resets_in.map(|d| d.as_millis() as u64),
                "the upstream reports fewer units left than the window admits; drift recorded"
            );
        }
        Ok(drift)
    }
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

impl Limiter {
    /// Forgets the drift the windows of `resources` of `credential` hold
    /// (an operator's `unblock --drift`): from now they admit what their
    /// own spends allow. Returns each window's forgotten units.
    pub async fn undrift(
        &self,
        credential: &str,
        resources: &[Option<&str>],
    ) -> Result<Vec<Forgotten>, QuotaError> {
        let plan = self.quotas.plan_for(credential)?;
        let plan = plan.only(self.quotas.keys(), |w| {
            resources.contains(&w.window.resource.as_deref())
        });
        if plan.windows.is_empty() {
            return Ok(Vec::new());
        }
        let r = (self.call_acked(Durable::Sync, &plan, &Operation::Undrift)).await?;
        if r.len() != plan.windows.len() {
            return Err(QuotaError::Script(format!("undrift returned {r:?}")));
        }
        Ok(plan
            .windows
            .iter()
            .zip(r)
            .map(|(w, units)| Forgotten {
                scope: w.scope.clone(),
                resource: (self.quotas)
                    .resource_name(&plan.family, w.window.resource.as_deref())
                    .to_owned(),
                window: w.window.clone(),
                units: units.max(0) as u64,
            })
            .collect())
    }
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

impl Limiter {
    /// The tenants of template `credential` that have keys in Redis (a
    /// spend or a block in their windows' lifetime), found by SCAN (in
    /// steps, each within the timeout; nothing blocks Redis), at most
    /// `limit` of them.
    pub async fn tenants(&self, credential: &str, limit: usize) -> Result<Tenants, QuotaError> {
        let Some(placeholder) = self.quotas.template_of(credential) else {
            return Err(QuotaError::UnknownCredential(credential.to_owned()));
        };
        let ks = self.quotas.keys();
        let pattern = ks.tenants_pattern(credential, placeholder);
        let mut found = BTreeSet::new();
        let mut more = false;
        // Every master's keys on a cluster: tenants spread over all of them.
        let scan = self.conn.scan_matching(&pattern, self.timeout, |batch| {
            for key in &batch {
                if let Some(t) = ks.tenant_of(key) {
                    found.insert(t.to_owned());
                }
            }
            more = found.len() > limit;
            !more
        });
        scan.await?;
        Ok(Tenants {
            names: found.into_iter().take(limit).collect(),
            more,
        })
    }
}

fn ints(v: Value) -> Result<Vec<i64>, QuotaError> {
    let Value::Array(items) = v else {
        return Err(QuotaError::Script(format!("expected an array, got {v:?}")));
    };
    items
        .into_iter()
        .map(|i| match i {
            Value::Int(n) => Ok(n),
            other => Err(QuotaError::Script(format!(
                "expected an integer, got {other:?}"
            ))),
        })
        .collect()
}

fn decision(r: &[i64]) -> Result<Decision, QuotaError> {
    // After the four: the shadow windows that would have refused
    // ([`shadow::refused`]).
    let [allowed, remaining, retry_ms, window, ..] = r else {
        return Err(QuotaError::Script(format!("spend returned {r:?}")));
    };
    let remaining = (*remaining).max(0) as u64;
    Ok(if *allowed == 1 {
        Decision::Allowed { remaining }
    } else {
        Decision::Rejected(Rejection {
            remaining,
            retry_after: Duration::from_millis((*retry_ms).max(1) as u64),
            by: if *window > 0 {
                RejectedBy::Window(*window as usize)
            } else {
                RejectedBy::Blocked
            },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_maps_the_script_reply() {
        assert_eq!(
            decision(&[1, 850, 0, 0]).unwrap(),
            Decision::Allowed { remaining: 850 }
        );
        let d = decision(&[0, 50, 59_932, 1]).unwrap();
        assert_eq!(
            d,
            Decision::Rejected(Rejection {
                remaining: 50,
                retry_after: Duration::from_millis(59_932),
                by: RejectedBy::Window(1)
            })
        );
        assert!(!d.is_allowed());
        let blocked = decision(&[0, 50, 5_000, 0]).unwrap();
        assert!(matches!(
            blocked,
            Decision::Rejected(Rejection {
                by: RejectedBy::Blocked,
                ..
            })
        ));
        assert!(decision(&[1, 2]).is_err());
        assert_eq!(
            decision(&[1, 7, 0, 0, 2, 3]).unwrap(),
            Decision::Allowed { remaining: 7 },
            "shadow refusals follow an admitted spend's four values"
        );
    }
}
