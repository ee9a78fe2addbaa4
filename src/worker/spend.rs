//! A task's side of the quota before each request: the spend
//! ([`Admission`]: admitted, refused with a wait, or the limiter could not
//! answer), the first page's spend made ready to ride in the item claim's
//! call ([`FirstSpend`]), the hold this daemon keeps itself when Redis did
//! not take a block ([`Worker::held_here`]), and the refund of a request
//! that never left. What an answer then does to the quota is `account`'s.
//!
//! Nothing here ends a task or touches its progress: the step
//! (`step::decide`) says what an admission or an answer means for the task,
//! and the run (`run::Worker::attempt`, `run::Worker::end`) adds the units
//! these functions return to the task's progress.

use std::time::{Duration, Instant};

use tracing::error;

use super::Worker;
use super::lease::{self, Lease};
use super::memory::{Flying, resource_key};
use crate::config::{Credential, Endpoint, Job, Secret};
use crate::queue::TaskArgs;
use crate::quota::{Decision, PreparedSpend, QuotaError, RejectedBy, SpendOptions};
use crate::stats::Stats;

/// Counts a settle's `change` to a spend of `endpoint` in
/// `qw_units_settled_total` (so what was finally charged is spent − refund
/// + raise), and returns it.
pub(super) fn settled(endpoint: &Endpoint, change: i64) -> i64 {
    let kind = if change < 0 { "refund" } else { "raise" };
    if change != 0 {
        metrics::counter!("qw_units_settled_total", "credential" => endpoint.credential.clone(),
                          "endpoint" => endpoint.name.clone(), "change" => kind)
        .increment(change.unsigned_abs());
    }
    change
}

/// A spend's request id: the task's id, the page (as the step knows it),
/// and a random part, unique across hosts.
fn spend_id(task: &TaskArgs, page: &str) -> String {
    let nonce = crate::quota::request_id();
    format!("{}:p{page}:{}", task.id, &nonce[..12])
}

/// The task's ticket in the windows' waiting lines (`lua/spend/line.lua`,
/// "Waiting line"): its item of its tick, the same for every copy of it,
/// so the deferred copy comes back as the one that was promised a turn.
/// Only a job that defers comes back; the others respect the lines
/// without taking a turn in them (`""`).
fn ticket(task: &TaskArgs, job: &Job) -> String {
    if job.defers() {
        format!("{}:{}:{}", task.job, task.tick, task.index)
    } else {
        String::new()
    }
}

/// The most units a request is ever settled to: Lua numbers are doubles,
/// exact up to 2^53.
pub(super) const MAX_SETTLE: u64 = (1 << 53) - 1;

/// Whose windows a run's requests spend from: the task, its job and
/// endpoint, the endpoint's credential, and the credential as `quota`
/// names it. Looked up once per task (`claim::payer`).
#[derive(Clone)]
pub(super) struct Payer<'a> {
    pub(super) task: &'a TaskArgs,
    pub(super) job: &'a Job,
    pub(super) endpoint: &'a Endpoint,
    /// The endpoint's credential as configured (its secret, its template).
    pub(super) cred: &'a Credential,
    /// The credential spent: the endpoint's, or for a template credential
    /// this item's tenant (`ig[account=123]`).
    pub(super) credential: String,
    /// A template credential's tenant: the item's value of its placeholder.
    pub(super) tenant: Option<String>,
}

impl Payer<'_> {
    /// The credential and the endpoint's resource, as this daemon's own
    /// memories key them.
    fn resource_key(&self) -> String {
        resource_key(&self.credential, self.endpoint.resource.as_deref())
    }
}

/// A page's spend, admitted.
pub(super) struct Spent {
    /// The spend's request id, for a settle or refund.
    pub(super) request_id: String,
    /// Whether the windows recorded it (not when Redis could not answer on a
    /// `fail-open` endpoint): only a recorded spend is settled or refunded.
    pub(super) recorded: bool,
    /// Its units, counted as unanswered until the page's step ends.
    pub(super) flying: Flying,
    /// When its spend was asked for, at or before its admission in Redis
    /// (the claim's call, for a first spend): a throttle streak this daemon
    /// saw begin after it is one its answer cannot end (`memory::Remembered::
    /// streak_ends`). Not when its request left: a first spend's request
    /// leaves after the claim, and under load a throttle answered in
    /// between made its success end a streak it was admitted before (the
    /// next throttle then blocked 60 s, not 120 s).
    pub(super) at: Instant,
    /// The tenant it was spent on (template credentials), settled there.
    pub(super) tenant: Option<String>,
    /// Its lease in the endpoint's concurrent windows, until a settle
    /// returns it (`lease::settle`; dropped unreturned, it is returned by a
    /// spawned settle).
    pub(super) lease: Option<Lease>,
}

/// What a page's spend came to.
#[must_use]
pub(super) enum Admission {
    /// Admitted (or, `fail-open` with Redis away, let through unrecorded).
    /// Boxed: it holds a lease with its limiter, the other variants little.
    Admitted(Box<Spent>),
    /// The quota said no.
    Refused(Refusal),
    /// The limiter could not answer and the endpoint is `fail-closed`.
    Unavailable(QuotaError),
}

/// A spend the quota refused, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Refusal {
    /// Who said no.
    pub(super) by: RefusedBy,
    /// When a spend may fit again.
    pub(super) wait: Duration,
    /// Why, in words, for the outcome.
    pub(super) why: &'static str,
}

/// Who refused a spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RefusedBy {
    /// This daemon holds the credential blocked itself ([`LocalBlocks`]).
    HeldHere,
    /// The credential is blocked in Redis (the upstream throttled it).
    Blocked,
    /// A window is full.
    Window,
    /// A concurrent window has as many requests in flight as it allows:
    /// the wait is momentary, and the task comes back after it whatever
    /// `on_quota_exhausted` says.
    InFlight,
}

/// The first page's spend, made in the item claim's own call
/// (`lua/spend/claim.lua`): one round trip fewer per task. The task's
/// progress owns it: the first page's spend step takes it instead of
/// spending, and the task's one exit refunds one no step took
/// ([`Worker::refund_unsent`]).
pub(super) struct FirstSpend {
    request_id: String,
    endpoint: String,
    tenant: Option<String>,
    /// Its lease, when it was admitted on an endpoint with a concurrent
    /// window.
    lease: Option<Lease>,
    /// The tenant's token, read once when the spend was made ready (the
    /// run uses it rather than reading the file again).
    secret: Option<Secret>,
    decision: Result<Decision, QuotaError>,
    /// When the claim's call that made it began: the spend was admitted no
    /// earlier. Its request may leave much later (the page step takes it
    /// after the claim), but a throttle this daemon saw in between says
    /// nothing its answer could end ([`Spent::at`]).
    asked: Instant,
}

impl FirstSpend {
    /// The template tenant's token read for this spend, if one was.
    pub(super) fn tenant_secret(&self) -> Option<&Secret> {
        self.secret.as_ref()
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
    pub(super) fn spend_ahead(&self, payer: &Payer<'_>) -> Option<Ahead<'_>> {
        if self.lasting.skip_spend || !self.limiter.rides_along() {
            return None;
        }
        let (cred, job) = (payer.cred, payer.job);
        let secret = match &payer.tenant {
            // A tenant whose token cannot be read fails its item before
            // any page: nothing is spent on it, not even for a moment (it
            // would show in `quota` as a tenant that spent).
            // A minted token is the task's already (`Worker::mint`).
            Some(value) if !cred.minted() => Some(cred.tenant_secret(value).ok()?),
            _ => None,
        };
        if (self.lasting.local_blocks)
            .left(&payer.resource_key(), Instant::now())
            .is_some()
        {
            return None;
        }
        let request_id = spend_id(payer.task, "1");
        let ticket = ticket(payer.task, job);
        let options = SpendOptions::new()
            .tenant(payer.tenant.as_deref())
            .reserve(job.reserve)
            .in_line(&ticket);
        let spend = (self.limiter)
            .prepare(&payer.endpoint.name, &request_id, options)
            .ok()?;
        Some(Ahead {
            request_id,
            tenant: payer.tenant.clone(),
            secret,
            spend,
        })
    }

    /// What the spend that rode in the claim decided (`reply`: its part of
    /// the claim's reply; `took`: the claim's time).
    pub(super) fn first_spend(
        &self,
        ahead: Ahead<'_>,
        reply: Result<Vec<i64>, QuotaError>,
        took: Duration,
    ) -> FirstSpend {
        let decision = self.limiter.conclude(&ahead.spend, reply, took);
        let endpoint = ahead.spend.ep.endpoint.clone();
        let lease = match decision {
            Ok(Decision::Allowed { .. }) => Lease::taken(
                &self.limiter,
                &endpoint,
                ahead.tenant.as_deref(),
                &ahead.request_id,
                ahead.spend.cost,
            ),
            _ => None,
        };
        FirstSpend {
            request_id: ahead.request_id,
            endpoint,
            tenant: ahead.tenant,
            lease,
            secret: ahead.secret,
            decision,
            asked: Instant::now()
                .checked_sub(took)
                .unwrap_or_else(Instant::now),
        }
    }

    /// Refunds a first spend no page step took: nothing was sent for it.
    pub(super) async fn refund_unsent(&self, mut first: FirstSpend) {
        if !matches!(first.decision, Ok(Decision::Allowed { .. })) {
            return;
        }
        let (endpoint, request_id) = (&first.endpoint, &first.request_id);
        let tenant = first.tenant.as_deref();
        let lease = &mut first.lease;
        match lease::settle(&self.limiter, endpoint, tenant, request_id, lease, 0).await {
            Ok(_) => {
                if let Some(ep) = self.config.endpoints.get(endpoint) {
                    settled(ep, -(ep.cost.get().min(MAX_SETTLE) as i64));
                }
            }
            Err(e) => {
                error!(endpoint = %endpoint, request_id, error = %e,
                       "could not refund the first page's spend of a task that sent nothing; its units stay spent");
            }
        }
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

    /// The refusal of any spend on the payer's credential while this
    /// daemon holds it blocked itself (Redis did not take the upstream's
    /// block); checked before a spend, so a first spend stays unused.
    pub(super) fn held_here(&self, payer: &Payer<'_>) -> Option<Refusal> {
        let wait = self
            .lasting
            .local_blocks
            .left(&payer.resource_key(), Instant::now())?;
        Some(Refusal {
            by: RefusedBy::HeldHere,
            wait,
            why: "credential blocked by this daemon (Redis did not take the upstream's block)",
        })
    }

    /// Spends one page's cost from the endpoint's windows: `first`, the
    /// spend made in the claim's call, when there is one, else a call of
    /// its own for page `page`.
    pub(super) async fn spend(
        &self,
        payer: &Payer<'_>,
        page: u32,
        first: Option<FirstSpend>,
    ) -> Admission {
        let (request_id, decision, lease, asked) = match first {
            Some(first) => (first.request_id, first.decision, first.lease, first.asked),
            None => {
                let asked = Instant::now();
                let (id, decision) = self.spend_now(payer, page).await;
                let cost = payer.endpoint.cost.get();
                let lease = match decision {
                    Ok(Decision::Allowed { .. }) => {
                        let (endpoint, tenant) = (&payer.endpoint.name, payer.tenant.as_deref());
                        Lease::taken(&self.limiter, endpoint, tenant, &id, cost)
                    }
                    _ => None,
                };
                (id, decision, lease, asked)
            }
        };
        let recorded = match decision {
            // The spend script recorded it in the status page's history too.
            Ok(Decision::Allowed { .. }) => true,
            Ok(Decision::Unchecked) => false,
            Ok(Decision::Rejected(r)) => {
                Stats::add(&self.lasting.stats.rejected_spends, 1);
                let (by, why) = match r.by {
                    RejectedBy::Blocked => {
                        // Whoever blocked it, this daemon's next success
                        // there ends the streak.
                        self.lasting
                            .remembered
                            .streak_seen(payer.resource_key(), Instant::now());
                        (
                            RefusedBy::Blocked,
                            "credential blocked after the upstream throttled it",
                        )
                    }
                    RejectedBy::Window(_) => {
                        (RefusedBy::Window, "spend rejected by a quota window")
                    }
                    RejectedBy::InFlight(_) => (
                        RefusedBy::InFlight,
                        "as many requests in flight as a concurrent window allows",
                    ),
                };
                let wait = r.retry_after;
                return Admission::Refused(Refusal { by, wait, why });
            }
            Err(e) => return Admission::Unavailable(e),
        };
        let flying =
            (self.lasting.unanswered).fly(&payer.resource_key(), payer.endpoint.cost.get());
        Admission::Admitted(Box::new(Spent {
            request_id,
            recorded,
            flying,
            at: asked,
            tenant: payer.tenant.clone(),
            lease,
        }))
    }

    /// Spends for page `page` in a call of its own.
    async fn spend_now(
        &self,
        payer: &Payer<'_>,
        page: u32,
    ) -> (String, Result<Decision, QuotaError>) {
        let request_id = spend_id(payer.task, &page.to_string());
        if self.lasting.skip_spend {
            return (request_id, Ok(Decision::Unchecked));
        }
        // A tenant's spend keeps the job's reserve free in the tenant's
        // own windows.
        let tenant = payer.tenant.as_deref();
        let ticket = ticket(payer.task, payer.job);
        let options = SpendOptions::new()
            .tenant(tenant)
            .reserve(payer.job.reserve)
            .in_line(&ticket);
        let decision = (self.limiter)
            .spend_with(&payer.endpoint.name, &request_id, options)
            .await;
        (request_id, decision)
    }

    /// Gives back the units of a request that never left; returns the
    /// change in units (minus its cost, or 0 when nothing was given back).
    pub(super) async fn refund(&self, endpoint: &Endpoint, spent: &mut Spent) -> i64 {
        if !spent.recorded {
            return 0;
        }
        let (request_id, tenant) = (&spent.request_id, spent.tenant.as_deref());
        let lease = &mut spent.lease;
        match lease::settle(&self.limiter, &endpoint.name, tenant, request_id, lease, 0).await {
            Ok(_) => settled(endpoint, -(endpoint.cost.get().min(MAX_SETTLE) as i64)),
            Err(e) => {
                error!(endpoint = %endpoint.name, request_id, error = %e,
                       "could not refund a request that never left; its units stay spent");
                0
            }
        }
    }
}
