//! A task's side of the quota: the spend before each request, and after
//! its answer what the upstream's own accounting says ([`Worker::account`],
//! the one place a [`Verdict`] is applied): the settle to what the request
//! really cost, the resync of the `upstream = true` windows (drift), and
//! the credential block when the upstream throttles, held by this daemon
//! itself when Redis does not take it ([`LocalBlocks`]); and the refund of
//! a request that never left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use super::page::{Progress, Run};
use super::{TaskError, Worker};
use crate::accounting::{Block, Left, Verdict};
use crate::config::{Endpoint, Job, Secret};
use crate::fetch::Reply;
use crate::outcome::{Outcome, OutcomeKind};
use crate::queue::TaskArgs;
use crate::quota::{
    BlockFor, BlockNote, BlockReason, Decision, PreparedSpend, QuotaError, RejectedBy,
};
use crate::stats::Stats;

/// A spend's request id: the task's id, the page (as the step knows it),
/// and a random part, unique across hosts.
fn spend_id(task: &TaskArgs, page: &str) -> String {
    let nonce = crate::quota::request_id();
    format!("{}:p{page}:{}", task.id, &nonce[..12])
}

/// The most units a request is ever settled to: Lua numbers are doubles,
/// exact up to 2^53.
const MAX_SETTLE: u64 = (1 << 53) - 1;

/// A page's spend, admitted.
pub(super) struct Spent {
    /// The spend's request id, for a settle or refund.
    request_id: String,
    /// Whether the windows recorded it (not when Redis could not answer on a
    /// `fail-open` endpoint): only a recorded spend is settled or refunded.
    recorded: bool,
    /// Its units, counted as unanswered until the page's step ends.
    flying: Flying,
    /// The tenant it was spent on (template credentials), settled there.
    tenant: Option<String>,
}

/// Units this daemon has spent per credential whose requests have not been
/// answered yet. An answer's "this much is left" was written before the
/// upstream saw them, so a resync leaves room for them: otherwise the
/// window would admit them twice (once in flight, once after the resync).
#[derive(Debug, Default)]
pub(crate) struct Unanswered(Mutex<HashMap<String, u64>>);

impl Unanswered {
    /// Counts `units` of `credential` until the returned guard drops.
    fn fly(self: &Arc<Self>, credential: &str, units: u64) -> Flying {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *m.entry(credential.to_owned()).or_default() += units;
        Flying {
            all: self.clone(),
            credential: credential.to_owned(),
            units,
        }
    }

    /// The units of `credential` unanswered now.
    fn units(&self, credential: &str) -> u64 {
        let m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        m.get(credential).copied().unwrap_or(0)
    }
}

/// One request's units in [`Unanswered`], until dropped (however its task
/// ends, a panic included).
#[must_use = "the units count as unanswered only while this lives"]
struct Flying {
    all: Arc<Unanswered>,
    credential: String,
    units: u64,
}

impl Drop for Flying {
    fn drop(&mut self) {
        let mut m = self.all.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = m.get_mut(&self.credential) {
            *n = n.saturating_sub(self.units);
            if *n == 0 {
                m.remove(&self.credential);
            }
        }
    }
}

/// A block the upstream's accounting asked for, as recorded.
#[derive(Debug, Clone)]
pub(super) struct Applied {
    /// The block in force (this one, or a longer one already there).
    pub(super) blocked: Duration,
    /// Why.
    pub(super) reason: BlockReason,
    /// What the upstream said, for the outcome line.
    pub(super) detail: Option<String>,
}

/// What a page's spend came to.
pub(super) enum Admission {
    Spent(Spent),
    /// The quota said no (or the limiter could not answer): the task ends.
    Refused(Outcome),
}

/// Credentials blocked in this process only: when Redis does not take a
/// block (it is down, or the script failed), this daemon still spends
/// nothing on the credential until the block's end. Other daemons do not
/// see it; the upstream will throttle them too, and they block it themselves.
#[derive(Debug, Default)]
pub(crate) struct LocalBlocks(Mutex<HashMap<String, Instant>>);

impl LocalBlocks {
    /// Holds `credential` blocked for `wait` (never shortening a longer hold).
    fn hold(&self, credential: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let at = held.entry(credential.to_owned()).or_insert(until);
        *at = (*at).max(until);
    }

    /// How long `credential` stays held, if it is.
    fn left(&self, credential: &str) -> Option<Duration> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let left = held
            .get(credential)
            .map(|until| until.saturating_duration_since(Instant::now()));
        match left {
            Some(d) if d.is_zero() => {
                held.remove(credential);
                None
            }
            other => other,
        }
    }
}

/// The first page's spend, made in the item claim's own call
/// (`lua/claim_spend.lua`): one round trip fewer per task. The first page's
/// spend step takes it instead of spending; one no step took (the run was
/// superseded, its request could not be built, its sink could take
/// nothing) is refunded when the task ends ([`Worker::refund_untaken`]).
pub(super) struct FirstSpend {
    request_id: String,
    endpoint: String,
    tenant: Option<String>,
    /// The tenant's token, read once when the spend was made ready (the
    /// run uses it rather than reading the file again).
    secret: Option<Secret>,
    decision: Result<Decision, QuotaError>,
}

/// Where a task keeps its [`FirstSpend`] until its first spend step.
#[derive(Default)]
pub(super) struct FirstSpendSlot(Mutex<Option<FirstSpend>>);

impl FirstSpendSlot {
    fn take(&self) -> Option<FirstSpend> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// The template tenant's token read for the spend in the claim, if one
    /// was.
    pub(super) fn tenant_secret(&self) -> Option<Secret> {
        let first = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        first.as_ref().and_then(|f| f.secret.clone())
    }
}

/// A spend made ready to ride in the claim ([`Worker::spend_ahead`]).
pub(super) struct Ahead<'a> {
    request_id: String,
    tenant: Option<String>,
    secret: Option<Secret>,
    pub(super) spend: PreparedSpend<'a>,
}

impl Worker {
    /// The first page's spend, ready to ride in the item claim's call, when
    /// it may: the spend is on, the windows live in the queue's Redis with
    /// no replica to wait for ([`crate::quota::Limiter::rides_along`]), and
    /// this daemon does not hold the credential blocked itself. `None`: the
    /// first page spends in its own call, as every later page does.
    pub(super) fn spend_ahead(&self, task: &TaskArgs, job: &Job) -> Option<Ahead<'_>> {
        if self.skip_spend || !self.limiter.rides_along() {
            return None;
        }
        let endpoint = self.config.endpoints.get(&job.endpoint)?;
        let cred = self.config.credentials.get(&endpoint.credential)?;
        let tenant =
            (cred.template.as_ref()).map(|placeholder| task.value_of(placeholder).to_owned());
        let (credential, secret) = match &tenant {
            // A tenant whose token cannot be read fails its item before
            // any page: nothing is spent on it, not even for a moment (it
            // would show in `quota` as a tenant that spent).
            Some(value) => (cred.tenant(value)?, Some(cred.tenant_secret(value).ok()?)),
            None => (cred.name.clone(), None),
        };
        if self.local_blocks.left(&credential).is_some() {
            return None;
        }
        let request_id = spend_id(task, "1");
        let spend = (self.limiter)
            .prepare(
                &endpoint.name,
                tenant.as_deref(),
                None,
                &request_id,
                job.reserve,
            )
            .ok()?;
        Some(Ahead {
            request_id,
            tenant,
            secret,
            spend,
        })
    }

    /// What the spend that rode in the claim decided (`reply`: its part of
    /// the claim's reply; `took`: the claim's time), for the first page's
    /// spend step to take.
    pub(super) fn first_spend(
        &self,
        ahead: Ahead<'_>,
        reply: Result<Vec<i64>, QuotaError>,
        took: Duration,
    ) -> FirstSpendSlot {
        let decision = self.limiter.conclude(&ahead.spend, reply, took);
        FirstSpendSlot(Mutex::new(Some(FirstSpend {
            request_id: ahead.request_id,
            endpoint: ahead.spend.ep.endpoint.clone(),
            tenant: ahead.tenant,
            secret: ahead.secret,
            decision,
        })))
    }

    /// Gives back a spend that rode in a claim whose reply could not be
    /// read: it may or may not have been made, and a settle of a request
    /// the windows do not hold changes nothing.
    pub(super) async fn refund_unknown(&self, ahead: Ahead<'_>) {
        let (endpoint, request_id) = (&ahead.spend.ep.endpoint, &ahead.request_id);
        let tenant = ahead.tenant.as_deref();
        if let Err(e) = (self.limiter)
            .settle_for(endpoint, tenant, request_id, 0)
            .await
        {
            error!(endpoint = %endpoint, request_id, error = %e,
                   "could not give back the first page's spend of an unreadable claim; its units may stay spent");
        }
    }

    /// Refunds a first spend no page step took: nothing was sent for it.
    pub(super) async fn refund_untaken(&self, slot: &FirstSpendSlot) {
        let Some(first) = slot.take() else {
            return;
        };
        if !matches!(first.decision, Ok(Decision::Allowed { .. })) {
            return;
        }
        let (endpoint, request_id) = (&first.endpoint, &first.request_id);
        let tenant = first.tenant.as_deref();
        if let Err(e) = (self.limiter)
            .settle_for(endpoint, tenant, request_id, 0)
            .await
        {
            error!(endpoint = %endpoint, request_id, error = %e,
                   "could not refund the first page's spend of a task that sent nothing; its units stay spent");
        }
    }

    /// Spends the page's cost from the endpoint's windows (unless this
    /// daemon holds the credential blocked itself): for the task's first
    /// spend step, the spend made in the claim's call when there is one.
    pub(super) async fn spend(&self, run: &Run<'_>, p: &Progress) -> Result<Admission, TaskError> {
        if let Some(left) = self.local_blocks.left(&run.credential) {
            let why = "credential blocked by this daemon (Redis did not take the upstream's block)";
            let kind = OutcomeKind::QuotaExhausted;
            let o = self.wait_for_quota(run, p, kind, left, why).await?;
            return Ok(Admission::Refused(o));
        }
        let (request_id, decision) = match run.first_spend.take() {
            Some(first) => (first.request_id, first.decision),
            None => self.spend_now(run, p).await,
        };
        let recorded = match decision {
            // The spend script recorded it in the status page's history too.
            Ok(Decision::Allowed { .. }) => true,
            Ok(Decision::Unchecked) => false,
            Ok(Decision::Rejected(r)) => {
                Stats::add(&self.stats.rejected_spends, 1);
                let why = match r.by {
                    RejectedBy::Blocked => "credential blocked after the upstream throttled it",
                    RejectedBy::Window(_) => "spend rejected by a quota window",
                };
                let kind = OutcomeKind::QuotaExhausted;
                let o = self
                    .wait_for_quota(run, p, kind, r.retry_after, why)
                    .await?;
                return Ok(Admission::Refused(o));
            }
            Err(e) => return Ok(Admission::Refused(self.limiter_down(run, p, &e).await?)),
        };
        let flying = (self.unanswered).fly(&run.credential, run.endpoint.cost.get());
        Ok(Admission::Spent(Spent {
            request_id,
            recorded,
            flying,
            tenant: run.tenant.clone(),
        }))
    }

    /// Spends for page `p` in a call of its own.
    async fn spend_now(
        &self,
        run: &Run<'_>,
        p: &Progress,
    ) -> (String, Result<Decision, QuotaError>) {
        let request_id = spend_id(run.task, &p.page.to_string());
        if self.skip_spend {
            return (request_id, Ok(Decision::Unchecked));
        }
        // A tenant's spend keeps the job's reserve free in the tenant's
        // own windows.
        let tenant = run.tenant.as_deref();
        let decision = (self.limiter)
            .spend_for(
                &run.endpoint.name,
                tenant,
                None,
                &request_id,
                run.job.reserve,
            )
            .await;
        (request_id, decision)
    }

    /// Applies what an answer says about the upstream's quota, in this
    /// order: settle the request to what it cost (a 304 the upstream did
    /// not price costs `not_modified_cost`); then resync every
    /// `upstream = true` window of the spend to what is left (after the
    /// settle, which the upstream's count already holds); then block the
    /// credential. Returns the block, if one was asked for.
    pub(super) async fn account(
        &self,
        run: &Run<'_>,
        spent: &Spent,
        reply: &Reply,
        verdict: Verdict,
        p: &mut Progress,
    ) -> Option<Applied> {
        let endpoint = run.endpoint;
        let cost = match reply {
            Reply::NotModified { .. } => verdict.cost.or(Some(endpoint.not_modified_cost)),
            _ => verdict.cost,
        };
        self.settle_reported(endpoint, spent, cost, p).await;
        if let Some(left) = verdict.left {
            self.resync(run, spent, left).await;
        }
        let b = verdict.block?;
        // A refusal's status says what happened; a page with nothing left
        // after it has none to tell.
        let status = if verdict.refused {
            reply.status()
        } else {
            None
        };
        let blocked = self.block(run, &b, status).await;
        Some(Applied {
            blocked,
            reason: b.reason,
            detail: b.detail,
        })
    }

    /// Resyncs every `upstream = true` window of the run's spend (a
    /// template's: its tenant's) to what the upstream says is left, less
    /// the units this daemon has in flight on the credential besides this
    /// request (the upstream has not counted them yet). A window that
    /// already admits no more records nothing: drift only lowers what a
    /// window admits.
    async fn resync(&self, run: &Run<'_>, spent: &Spent, left: Left) {
        let (endpoint, credential) = (run.endpoint, &run.credential);
        let others = (self.unanswered.units(credential)).saturating_sub(spent.flying.units);
        for (scope, w) in self.config.windows_of(endpoint) {
            if !w.upstream {
                continue;
            }
            let target = left.of(w.units.get()).saturating_sub(others);
            if target >= w.units.get() {
                continue;
            }
            let synced = match self.limiter.quotas().window_index(credential, &scope, w) {
                Ok(i) => self.limiter.sync(credential, i, target).await,
                Err(e) => Err(e),
            };
            if let Err(e) = synced {
                warn!(credential = %credential, window = %w.describe(), error = %e,
                      "could not resync a window to the upstream's count; it admits what it counted");
            }
        }
    }

    /// The upstream said what a request really cost (a cost header,
    /// Shopify's `actualQueryCost`, on any answer): the windows and the
    /// task's count follow. Nothing to settle for a spend that was not
    /// recorded (fail-open).
    async fn settle_reported(
        &self,
        endpoint: &Endpoint,
        spent: &Spent,
        reported: Option<u64>,
        p: &mut Progress,
    ) {
        let cost = endpoint.cost.get();
        let Some(reported) = reported.filter(|a| spent.recorded && *a != cost) else {
            return;
        };
        // More than the largest window fills every window: settling more
        // says nothing new, and a huge number would fail the script (its
        // numbers are doubles).
        let most = (self.config.windows_of(endpoint).iter())
            .map(|(_, w)| w.units.get())
            .max()
            .unwrap_or(cost)
            .max(cost)
            .min(MAX_SETTLE);
        let actual = reported.min(most);
        if actual < reported {
            warn!(endpoint = %endpoint.name, reported, settled = actual,
                  "the upstream reported a cost above the largest window; settled to that window's units");
        }
        if actual == cost {
            return;
        }
        let request_id = &spent.request_id;
        let tenant = spent.tenant.as_deref();
        match (self.limiter)
            .settle_for(&endpoint.name, tenant, request_id, actual)
            .await
        {
            Ok(_) => {
                p.units = p.units - cost + actual;
            }
            Err(e) => error!(endpoint = %endpoint.name, request_id, actual, error = %e,
                             "could not settle a request to its reported cost; the windows keep the configured cost"),
        }
    }

    /// Gives back the units of a request that never left.
    pub(super) async fn refund(&self, endpoint: &Endpoint, spent: &Spent, p: &mut Progress) {
        if !spent.recorded {
            return;
        }
        let request_id = &spent.request_id;
        let tenant = spent.tenant.as_deref();
        match (self.limiter)
            .settle_for(&endpoint.name, tenant, request_id, 0)
            .await
        {
            Ok(_) => {
                p.units -= endpoint.cost.get();
            }
            Err(e) => error!(endpoint = %endpoint.name, request_id, error = %e,
                             "could not refund a request that never left; its units stay spent"),
        }
    }

    /// Blocks the endpoint's credential as `b` says (at most `max_block`)
    /// and returns the block in force. Its reason is kept beside it in
    /// Redis (the stable word, `quota::BlockReason`), and when this block
    /// is the one in force, the status page's account of it
    /// (`quota::BlockNote`: what the upstream answered, on which
    /// endpoint). A block Redis does not take is never ignored: it is
    /// logged as an error and held by this daemon itself ([`LocalBlocks`]),
    /// so no spend of this daemon goes through meanwhile. A template
    /// credential's tenant is blocked alone, its reasons recorded on the
    /// tenant's name.
    async fn block(&self, run: &Run<'_>, b: &Block, status: Option<u16>) -> Duration {
        let endpoint = run.endpoint;
        let bound = |d: Duration| d.min(endpoint.max_block).max(Duration::from_millis(1));
        let for_ = match b.for_ {
            BlockFor::Fixed(d) => BlockFor::Fixed(bound(d)),
            BlockFor::Doubling { first, cap } => BlockFor::Doubling {
                first: bound(first),
                cap: bound(cap),
            },
        };
        let credential = &run.credential;
        match self.limiter.block_because(credential, for_, b.reason).await {
            Ok(blocked) => {
                info!(credential = %credential, reason = %b.reason, blocked_ms = blocked.blocked_for.as_millis() as u64,
                      streak = blocked.streak, "the upstream's accounting blocks the credential");
                if blocked.ours {
                    let detail = b
                        .detail
                        .as_ref()
                        .map(|d| format!(" ({d})"))
                        .unwrap_or_default();
                    let said = match status {
                        Some(s) => format!("upstream answered {s}{detail}"),
                        None => format!("upstream reports nothing left ({})", b.reason),
                    };
                    let note = BlockNote {
                        why: said,
                        status,
                        reason: b.detail.clone(),
                        endpoint: endpoint.name.clone(),
                        kind: Some(b.reason.as_str().to_owned()),
                    };
                    let mut conn = self.conn.clone();
                    let noted =
                        note.record(&mut conn, self.keys(), credential, blocked.blocked_for);
                    if let Err(e) = noted.await {
                        debug!(error = %e, "could not record why the credential is blocked");
                    }
                }
                blocked.blocked_for
            }
            Err(e) => {
                let wait = match for_ {
                    BlockFor::Fixed(d) | BlockFor::Doubling { first: d, .. } => d,
                };
                error!(credential = %credential, reason = %b.reason, block_ms = wait.as_millis() as u64, error = %e,
                       "could not record the upstream's block in Redis; this daemon holds the credential blocked itself");
                self.local_blocks.hold(credential, wait);
                wait
            }
        }
    }
}
