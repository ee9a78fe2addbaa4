//! The limiter: every operation on the windows as one call over one
//! connection, its reply decided and counted in the metrics, with the
//! replica wait and the fail-open/fail-closed policy around a spend.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use redis::{RedisResult, Value};

use crate::config::LimiterUnavailable;
use crate::conn::Functions;

use super::backend::Durable;
use super::decision::decision;
use super::{
    CredentialUsage, Decision, EVERY_RESOURCE, EndpointPlan, Forgotten, Layout, Op, Operation,
    Plan, QuotaConn, QuotaError, Quotas, SpendOptions, Spent, Tenants, WindowUsage, replica_wait,
    shadow,
};

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
/// The limiter: spend, settle, block and peek over one connection to where
/// the windows live ([`QuotaConn`]: a standalone Redis or a Redis Cluster),
/// which reconnects by itself.
#[derive(Clone)]
pub struct Limiter {
    pub(super) conn: QuotaConn,
    /// Whether that Redis runs the spend core by FCALL (learnt at the first
    /// call, shared by this limiter's clones).
    pub(super) functions: Functions,
    pub(super) quotas: Arc<Quotas>,
    pub(super) timeout: Duration,
    /// Replicas that must acknowledge an admitted spend (0: none).
    pub(super) replicas: u8,
    /// Whether spends and settles write the status page's spend history.
    pub(super) history: bool,
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
    pub(super) async fn call(
        &self,
        plan: &Plan,
        operation: &Operation<'_>,
    ) -> Result<Vec<i64>, QuotaError> {
        let layout = plan.layout(operation);
        self.call_then(operation.op(), &layout, None)
            .await
            .map(|(r, _)| r)
    }

    /// One call of `op` with `layout`, with `then` run right after it on
    /// the same connection; its reply (or error) comes back as is.
    pub(super) async fn call_then(
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
                Err(_) => return Err(self.conn.timed_out(self.timeout)),
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
