//! A task's side of the quota: the spend before each request, the settle to
//! what the upstream says a request cost, the refund of a request that never
//! left, and the credential block when the upstream throttles, held by this
//! daemon itself when Redis does not take it ([`LocalBlocks`]).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{debug, error, warn};

use super::page::{Progress, Run};
use super::{TaskError, Worker};
use crate::config::Endpoint;
use crate::history::{self, BlockReason};
use crate::outcome::{Outcome, OutcomeKind};
use crate::quota::{Decision, RejectedBy};
use crate::stats::Stats;

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
    /// The tenant it was spent on (template credentials), settled there.
    tenant: Option<String>,
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

impl Worker {
    /// Spends the page's cost from the endpoint's windows (unless this
    /// daemon holds the credential blocked itself).
    pub(super) async fn spend(&self, run: &Run<'_>, p: &Progress) -> Result<Admission, TaskError> {
        if let Some(left) = self.local_blocks.left(&run.credential) {
            let why = "credential blocked by this daemon (Redis did not take the upstream's block)";
            let kind = OutcomeKind::QuotaExhausted;
            let o = self.wait_for_quota(run, p, kind, left, why).await?;
            return Ok(Admission::Refused(o));
        }
        let request_id = format!(
            "{}:p{}:{}",
            run.task.id,
            p.page,
            &crate::quota::request_id()[..12]
        );
        let decision = if self.skip_spend {
            Ok(Decision::Unchecked)
        } else {
            // A tenant's spend keeps the job's reserve free in the
            // tenant's own windows.
            let tenant = run.tenant.as_deref();
            (self.limiter)
                .spend_for(
                    &run.endpoint.name,
                    tenant,
                    None,
                    &request_id,
                    run.job.reserve,
                )
                .await
        };
        let recorded = match decision {
            Ok(Decision::Allowed { .. }) => {
                let tenant = run.tenant.as_deref();
                self.record_spent(run.endpoint, tenant, run.endpoint.cost.get() as i64);
                true
            }
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
        Ok(Admission::Spent(Spent {
            request_id,
            recorded,
            tenant: run.tenant.clone(),
        }))
    }

    /// The upstream said what a request really cost (a cost header, on any
    /// answer): the windows and the task's count follow. Nothing to settle
    /// for a spend that was not recorded (fail-open).
    pub(super) async fn settle_reported(
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
                self.record_spent(endpoint, tenant, actual as i64 - cost as i64);
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
                self.record_spent(endpoint, tenant, -(endpoint.cost.get() as i64));
            }
            Err(e) => error!(endpoint = %endpoint.name, request_id, error = %e,
                             "could not refund a request that never left; its units stay spent"),
        }
    }

    /// Adds `units` (negative: given back) to the status page's 24-hour
    /// spend history of the endpoint's windows (`crate::history`), off the
    /// task's path: the write runs on its own, and a lost one only thins
    /// the chart. A template's spend is recorded on its tenant (`tenant`:
    /// the value), whose windows they are.
    ///
    /// The one place the history is written. Once spend.lua v2 can run
    /// extra work in its own call, this moves into the spend (and settle)
    /// script and costs no round trip of its own.
    fn record_spent(&self, endpoint: &Endpoint, tenant: Option<&str>, units: i64) {
        let Ok(plan) = self.limiter.quotas().endpoint_for(&endpoint.name, tenant) else {
            return;
        };
        let rings = history::rings(self.keys(), &plan.plan);
        let mut conn = self.conn.clone();
        tokio::spawn(async move {
            if let Err(e) = history::record_spent(&mut conn, &rings, units).await {
                debug!(error = %e, "could not record the spend history");
            }
        });
    }

    /// Blocks the endpoint's credential for `wait` (at most `max_block`)
    /// and returns the block in force, recording `why` for the status page
    /// when this block is the one in force. A block Redis does not take is
    /// never ignored: it is logged as an error and held by this daemon
    /// itself ([`LocalBlocks`]), so no spend of this daemon goes through
    /// meanwhile. A template credential's tenant is blocked alone, and its
    /// reason recorded on the tenant's name.
    pub(super) async fn block(&self, run: &Run<'_>, wait: Duration, why: BlockReason) -> Duration {
        let wait = wait
            .min(run.endpoint.max_block)
            .max(Duration::from_millis(1));
        match self.limiter.block(&run.credential, wait).await {
            Ok(blocked) => {
                // A longer block set by someone else keeps its own reason.
                if blocked <= wait + Duration::from_secs(1) {
                    let mut conn = self.conn.clone();
                    let credential = &run.credential;
                    if let Err(e) =
                        history::record_block(&mut conn, self.keys(), credential, blocked, &why)
                            .await
                    {
                        debug!(error = %e, "could not record why the credential is blocked");
                    }
                }
                blocked
            }
            Err(e) => {
                error!(credential = %run.credential, block_ms = wait.as_millis() as u64, error = %e,
                       "could not record the upstream's block in Redis; this daemon holds the credential blocked itself");
                self.local_blocks.hold(&run.credential, wait);
                wait
            }
        }
    }
}
