//! A task's side of the quota, as data: the spend before each request
//! ([`Admission`]: admitted, refused with a wait, or the limiter could not
//! answer), and after its answer what the upstream's own accounting says
//! ([`Worker::account`], the one place a [`Verdict`] is applied): the settle
//! to what the request really cost (the change in units), the resync of
//! the `upstream = true` windows of the resource the answer speaks for
//! (drift, ending at the upstream's reset when it gave one), and the block
//! of that resource (or of every resource, for a token-wide limit) when
//! the upstream says wait ([`Applied`]), at least `min_block` and doubled
//! for each throttle in a row, held by this daemon itself when Redis does
//! not take it ([`LocalBlocks`]); a successful answer ends the throttle
//! streak; and the refund of a request that never left.
//!
//! Nothing here ends a task or touches its progress: the step
//! (`step::decide`) says what an admission or an answer means for the task,
//! and the run (`run::Worker::attempt`, `run::Worker::end`) adds the units
//! these functions return to the task's progress.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use super::Worker;
use super::lease::{self, Lease};
use crate::accounting::{Block, Resync, Used, Verdict};
use crate::config::{Credential, Endpoint, Job, Scope, Secret};
use crate::fetch::Reply;
use crate::queue::TaskArgs;
use crate::quota::{
    BlockFor, BlockNote, BlockReason, Decision, PreparedSpend, QuotaError, RejectedBy,
    STREAK_MEMORY, SpendOptions,
};
use crate::stats::Stats;

/// Counts a settle's `change` to a spend of `endpoint` in
/// `qw_units_settled_total` (so what was finally charged is spent − refund
/// + raise), and returns it.
fn settled(endpoint: &Endpoint, change: i64) -> i64 {
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
const MAX_SETTLE: u64 = (1 << 53) - 1;

/// Whose windows a run's requests spend from: the task, its job and
/// endpoint, and the credential as `quota` names it.
pub(super) struct Payer<'a> {
    pub(super) task: &'a TaskArgs,
    pub(super) job: &'a Job,
    pub(super) endpoint: &'a Endpoint,
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
    request_id: String,
    /// Whether the windows recorded it (not when Redis could not answer on a
    /// `fail-open` endpoint): only a recorded spend is settled or refunded.
    recorded: bool,
    /// Its units, counted as unanswered until the page's step ends.
    flying: Flying,
    /// When it was admitted, just before its request left.
    at: Instant,
    /// The tenant it was spent on (template credentials), settled there.
    tenant: Option<String>,
    /// Its lease in the endpoint's concurrent windows, until a settle
    /// returns it (`lease::settle`; dropped unreturned, it is returned by a
    /// spawned settle).
    lease: Option<Lease>,
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

/// One resource of one credential, as this daemon's own memories key it
/// (a tenant's credential by its name, `ig[account=123]`; `None`: the
/// credential's default resource).
fn resource_key(credential: &str, resource: Option<&str>) -> String {
    match resource {
        None => credential.to_owned(),
        // A NUL is in neither a credential's nor a resource's name.
        Some(r) => format!("{credential}\0{r}"),
    }
}

/// Units this daemon has spent per credential and resource whose requests
/// have not been answered yet. An answer's "this much is left" was written
/// before the upstream saw them, so a resync leaves room for them:
/// otherwise the window would admit them twice (once in flight, once after
/// the resync).
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
            landed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The units of `credential` unanswered now.
    fn units(&self, credential: &str) -> u64 {
        let m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        m.get(credential).copied().unwrap_or(0)
    }
}

/// One request's units in [`Unanswered`], until its answer is in
/// ([`Flying::land`]) or it is dropped (however its task ends, a panic
/// included).
#[must_use = "the units count as unanswered only while this lives"]
struct Flying {
    all: Arc<Unanswered>,
    credential: String,
    units: u64,
    /// Whether its units have left [`Unanswered`] already.
    landed: std::sync::atomic::AtomicBool,
}

impl Flying {
    /// The answer is in: its units are no longer unanswered (the sooner
    /// they leave, the less another answer's resync holds back for them).
    fn land(&self) {
        if self.landed.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let mut m = self.all.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = m.get_mut(&self.credential) {
            *n = n.saturating_sub(self.units);
            if *n == 0 {
                m.remove(&self.credential);
            }
        }
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        if *self.landed.get_mut() {
            return;
        }
        let mut m = self.all.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = m.get_mut(&self.credential) {
            *n = n.saturating_sub(self.units);
            if *n == 0 {
                m.remove(&self.credential);
            }
        }
    }
}

/// What an answer's accounting did: the change in the request's units (a
/// settle to its reported cost) and the block it asked for, as recorded.
#[must_use]
pub(super) struct Accounted {
    /// Units added to (or, negative, taken from) the request's cost.
    pub(super) change: i64,
    /// The block, if the accounting asked for one.
    pub(super) blocked: Option<Applied>,
}

/// A block the upstream's accounting asked for, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Applied {
    /// The block in force (this one, or a longer one already there).
    pub(super) blocked: Duration,
    /// Why.
    pub(super) reason: BlockReason,
    /// What the upstream said, for the outcome line.
    pub(super) detail: Option<String>,
    /// Which resource, named when the credential has more than one (the
    /// outcome line says "credential" alone otherwise).
    pub(super) resource: Option<String>,
    /// Every resource of the credential (a token-wide limit).
    pub(super) token_wide: bool,
    /// Throttles in a row on the resource, this one included (0: the
    /// block is no throttle).
    pub(super) streak: u32,
}

/// Resources of credentials blocked in this process only: when Redis does
/// not take a block (it is down, or the script failed), this daemon still
/// spends nothing on the resource until the block's end. Other daemons do
/// not see it; the upstream will throttle them too, and they block it
/// themselves. Keyed by [`resource_key`].
#[derive(Debug, Default)]
pub(crate) struct LocalBlocks(Mutex<HashMap<String, Instant>>);

/// What this daemon remembers of the upstream from one answer to the next.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    /// Resources ([`resource_key`]) this daemon saw blocked after a
    /// throttle, or refused a spend on for a block, and when: its next
    /// successful answer there ends the throttle streak in Redis (one call,
    /// only then: most answers end no streak).
    streaks: Mutex<HashMap<String, Instant>>,
    /// GitHub GraphQL: each token's last `x-ratelimit-used`, for a query
    /// that does not ask for its own cost.
    used: Mutex<HashMap<String, Used>>,
    /// Resources an answer named that no window or endpoint of its
    /// credential has (logged once each).
    unmirrored: Mutex<HashSet<String>>,
}

impl Remembered {
    /// A throttle streak may run on `key` now.
    fn streak_seen(&self, key: String) {
        let mut m = self.streaks.lock().unwrap_or_else(PoisonError::into_inner);
        m.insert(key, Instant::now());
    }

    /// Whether a successful answer to a request spent at `sent` ends a
    /// streak on `key`: one may run there, and the request left after this
    /// daemon saw it begin (an answer to a request already in flight when
    /// the upstream throttled says nothing about the wait: it ends no
    /// streak, as a throttle answered then lengthens none). Forgotten once
    /// it has.
    fn streak_ends(&self, key: &str, sent: Instant) -> bool {
        let mut m = self.streaks.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(seen) = m.get(key).copied() else {
            return false;
        };
        // A streak is remembered an hour after its block: past a day, the
        // memory is stale whatever it says.
        if seen.elapsed() > STREAK_MEMORY * 24 {
            m.remove(key);
            return false;
        }
        if sent <= seen {
            return false;
        }
        m.remove(key);
        true
    }

    /// What a GraphQL query cost by the token's `x-ratelimit-used`: the
    /// change since its last answer within the same period (answers that
    /// arrive out of order, or a new period, say nothing).
    fn used_since(&self, token: &str, now: Used) -> Option<u64> {
        let mut m = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let before = m.get(token).copied();
        match before {
            Some(b) if b.reset == now.reset && now.used <= b.used => None,
            _ => {
                m.insert(token.to_owned(), now);
                before
                    .filter(|b| b.reset == now.reset)
                    .map(|b| now.used - b.used)
            }
        }
    }

    /// Whether `key` is logged as unmirrored for the first time now.
    fn first_unmirrored(&self, key: String) -> bool {
        let mut m = self
            .unmirrored
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        m.insert(key)
    }
}

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
/// (`lua/spend/claim.lua`): one round trip fewer per task. The task's
/// progress owns it: the first page's spend step takes it instead of
/// spending, and the task's one exit gives back one no step took
/// ([`Worker::give_back`]).
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
            // A minted token is the task's already (`Worker::mint`).
            Some(value) if cred.minted() => (cred.tenant(value)?, None),
            Some(value) => (cred.tenant(value)?, Some(cred.tenant_secret(value).ok()?)),
            None => (cred.name.clone(), None),
        };
        let key = resource_key(&credential, endpoint.resource.as_deref());
        if self.local_blocks.left(&key).is_some() {
            return None;
        }
        let request_id = spend_id(task, "1");
        let ticket = ticket(task, job);
        let options = SpendOptions::new()
            .tenant(tenant.as_deref())
            .reserve(job.reserve)
            .in_line(&ticket);
        let spend = (self.limiter)
            .prepare(&endpoint.name, &request_id, options)
            .ok()?;
        Some(Ahead {
            request_id,
            tenant,
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
        }
    }

    /// Gives back a first spend no page step took: nothing was sent for it.
    pub(super) async fn give_back(&self, mut first: FirstSpend) {
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
        let wait = self.local_blocks.left(&payer.resource_key())?;
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
        let (request_id, decision, lease) = match first {
            Some(first) => (first.request_id, first.decision, first.lease),
            None => {
                let (id, decision) = self.spend_now(payer, page).await;
                let cost = payer.endpoint.cost.get();
                let lease = match decision {
                    Ok(Decision::Allowed { .. }) => {
                        let (endpoint, tenant) = (&payer.endpoint.name, payer.tenant.as_deref());
                        Lease::taken(&self.limiter, endpoint, tenant, &id, cost)
                    }
                    _ => None,
                };
                (id, decision, lease)
            }
        };
        let recorded = match decision {
            // The spend script recorded it in the status page's history too.
            Ok(Decision::Allowed { .. }) => true,
            Ok(Decision::Unchecked) => false,
            Ok(Decision::Rejected(r)) => {
                Stats::add(&self.stats.rejected_spends, 1);
                let (by, why) = match r.by {
                    RejectedBy::Blocked => {
                        // Whoever blocked it, this daemon's next success
                        // there ends the streak.
                        self.remembered.streak_seen(payer.resource_key());
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
        let flying = (self.unanswered).fly(&payer.resource_key(), payer.endpoint.cost.get());
        Admission::Admitted(Box::new(Spent {
            request_id,
            recorded,
            flying,
            at: Instant::now(),
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
        if self.skip_spend {
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

    /// Applies what an answer says about the upstream's quota, in this
    /// order: settle the request to what it cost (a 304 the upstream did
    /// not price costs `not_modified_cost`; a GitHub GraphQL query that did
    /// not ask, the change in its token's `x-ratelimit-used`; a request
    /// holding a lease is settled even at its own cost, which returns the
    /// lease: its answer has been read); then resync the `upstream = true`
    /// windows of the resource the answer speaks for to what is left (after
    /// the settle, which the upstream's count already holds); then block
    /// that resource (or every one, for a token-wide limit), or, on a
    /// successful answer, end its throttle streak. Returns the settle's
    /// change and the block, if one was asked for.
    pub(super) async fn account(
        &self,
        payer: &Payer<'_>,
        spent: &mut Spent,
        reply: &Reply,
        verdict: Verdict,
    ) -> Accounted {
        let endpoint = payer.endpoint;
        let cred = &self.config.credentials[&endpoint.credential];
        let resource = self.answered_resource(payer, cred, verdict.resource.as_deref());
        let cost = match (reply, verdict.used) {
            (Reply::NotModified { .. }, _) => verdict.cost.or(Some(endpoint.not_modified_cost)),
            (_, Some(used)) if verdict.cost.is_none() => {
                (self.remembered).used_since(&payer.credential, used)
            }
            _ => verdict.cost,
        };
        let change = self.settle_reported(endpoint, spent, cost).await;
        // Answered: its units are in the upstream's count from now on, at
        // what it cost. Only once settled: while its spend still holds the
        // configured cost, another answer's resync must leave room for it
        // (count it unanswered), or that resync sets the window to the
        // upstream's count (this request at its actual cost) and this
        // settle then refunds the difference a second time: the window
        // admits more than the upstream allows (Shopify THROTTLED).
        spent.flying.land();
        if !verdict.left.is_empty() {
            self.resync(payer, cred, resource.as_deref(), &verdict.left)
                .await;
        }
        let succeeded =
            !verdict.refused && matches!(reply, Reply::Ok { .. } | Reply::NotModified { .. });
        let Some(b) = verdict.block else {
            if succeeded {
                self.end_streak(payer, resource.as_deref(), spent.at).await;
            }
            return Accounted {
                change,
                blocked: None,
            };
        };
        // A refusal's status says what happened; a page with nothing left
        // after it has none to tell.
        let status = if verdict.refused {
            reply.status()
        } else {
            None
        };
        // The answer's resource first: its block is the one reported.
        let mut targets = vec![resource.clone()];
        if b.token_wide {
            let all = self.limiter.quotas().resources(&cred.name);
            targets.extend(all.into_iter().map(|(r, _)| r).filter(|r| *r != resource));
        }
        let (blocked, streak) = self
            .block(payer, &b, verdict.refused, status, &targets)
            .await;
        let several = self.limiter.quotas().resources(&cred.name).len() > 1;
        Accounted {
            change,
            blocked: Some(Applied {
                blocked,
                reason: b.reason,
                detail: b.detail,
                resource: several.then(|| cred.resource_name(resource.as_deref()).to_owned()),
                token_wide: b.token_wide && several,
                streak,
            }),
        }
    }

    /// The resource an answer speaks for (`named`: as the upstream names
    /// it; `None`: the endpoint's), as the credential's keys hold it. A
    /// resource the credential has no window or endpoint of is logged once:
    /// its answers resync nothing and block only it.
    fn answered_resource(
        &self,
        payer: &Payer<'_>,
        cred: &Credential,
        named: Option<&str>,
    ) -> Option<String> {
        let Some(name) = named else {
            return payer.endpoint.resource.clone();
        };
        let resource = cred.resource_of(name);
        let known =
            (self.limiter.quotas().resources(&cred.name).iter()).any(|(r, _)| *r == resource);
        if !known
            && self
                .remembered
                .first_unmirrored(resource_key(&cred.name, Some(name)))
        {
            warn!(
                credential = %cred.name,
                endpoint = %payer.endpoint.name,
                resource = name,
                endpoint_resource = cred.resource_name(payer.endpoint.resource.as_deref()),
                "the upstream counts this endpoint's answers against a resource no window mirrors: they resync nothing and block only that resource; give the endpoint resource = \"{name}\" and the credential a window of it"
            );
        }
        resource
    }

    /// Resyncs the `upstream = true` windows the answer speaks for, of the
    /// payer's credential (a template's: its tenant's): the credential's
    /// windows of the answer's `resource` and the endpoint's own, each to
    /// what its limit has left (an IETF answer's named limit, else the
    /// resource's), less the units this daemon has in flight on that
    /// resource, unanswered (the upstream may not have counted them yet). A window that already admits no more records nothing: drift
    /// only lowers what a window admits. Drift from a limit that said when
    /// it resets ends then.
    async fn resync(
        &self,
        payer: &Payer<'_>,
        cred: &Credential,
        resource: Option<&str>,
        left: &[Resync],
    ) {
        let (endpoint, credential) = (payer.endpoint, &payer.credential);
        let plan = match self.limiter.quotas().plan_for(credential) {
            Ok(plan) => plan,
            Err(e) => {
                warn!(credential = %credential, error = %e, "cannot resync the windows");
                return;
            }
        };
        let own = Scope::Endpoint(endpoint.name.clone());
        for (i, w) in plan.windows.iter().enumerate() {
            if !w.window.upstream || (w.scope != Scope::Credential && w.scope != own) {
                continue;
            }
            let mine = w.window.resource.as_deref();
            // An IETF answer's limit of this window's resource's name, else
            // the resource's count for the windows of the answer's resource
            // (a window of the default resource names no limit: it mirrors
            // the most restrictive, whatever its resource is called).
            let named = left.iter().find(|r| {
                mine.is_some()
                    && (r.limit.as_deref()).is_some_and(|n| cred.resource_of(n).as_deref() == mine)
            });
            let r = named.or_else(|| {
                (mine == resource)
                    .then(|| left.iter().find(|r| r.limit.is_none()))
                    .flatten()
            });
            let Some(r) = r else {
                continue;
            };
            // This request's own units have landed (`account`).
            let others = self.unanswered.units(&resource_key(credential, mine));
            let units = w.window.units.get();
            let target = r.left.of(units).saturating_sub(others);
            if target >= units {
                continue;
            }
            if let Err(e) = self.limiter.sync(credential, i, target, r.resets_in).await {
                warn!(credential = %credential, window = %w.window.describe(), error = %e,
                      "could not resync a window to the upstream's count; it admits what it counted");
            }
        }
    }

    /// A successful answer on `resource` to a request spent at `sent`:
    /// its throttle streak ends, if this daemon saw one begin before the
    /// request left (best effort: a streak left running only makes the
    /// next throttle's block longer).
    async fn end_streak(&self, payer: &Payer<'_>, resource: Option<&str>, sent: Instant) {
        let key = resource_key(&payer.credential, resource);
        if !self.remembered.streak_ends(&key, sent) {
            return;
        }
        if let Err(e) = self.limiter.end_streak(&payer.credential, resource).await {
            debug!(credential = %payer.credential, error = %e, "could not end a throttle streak");
        }
    }

    /// The upstream said what a request really cost (a cost header,
    /// Shopify's `actualQueryCost`, on any answer): the windows follow, and
    /// the change in units is returned for the task's count. Nothing to
    /// settle (0) for a spend that was not recorded (fail-open). A request
    /// holding a lease is settled whatever it cost, to return the lease.
    async fn settle_reported(
        &self,
        endpoint: &Endpoint,
        spent: &mut Spent,
        reported: Option<u64>,
    ) -> i64 {
        let cost = endpoint.cost.get();
        let reported = match reported.filter(|_| spent.recorded) {
            Some(r) => r,
            None if spent.lease.is_some() => cost,
            None => return 0,
        };
        if reported == cost && spent.lease.is_none() {
            return 0;
        }
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
        if actual == cost && spent.lease.is_none() {
            return 0;
        }
        let (request_id, tenant) = (&spent.request_id, spent.tenant.as_deref());
        let lease = &mut spent.lease;
        match lease::settle(
            &self.limiter,
            &endpoint.name,
            tenant,
            request_id,
            lease,
            actual,
        )
        .await
        {
            // Both at most 2^53: exact as i64.
            Ok(_) => settled(endpoint, actual as i64 - cost as i64),
            Err(e) => {
                error!(endpoint = %endpoint.name, request_id, actual, error = %e,
                       "could not settle a request to its reported cost; the windows keep the configured cost");
                0
            }
        }
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

    /// Blocks `resources` of the payer's credential as `b` says (the
    /// upstream's wait at most `max_block`; at least `min_block`, or the
    /// upstream's own first block; a `refused` answer is a throttle, whose
    /// streak doubles that least up to `throttle_block_max`) and returns
    /// the block in force on the first resource. Its reason is kept beside
    /// it in Redis (the stable word, `quota::BlockReason`), and when this
    /// block is the one in force, the status page's account of it
    /// (`quota::BlockNote`: what the upstream answered, on which endpoint).
    /// A block Redis does not take is never ignored: it is logged as an
    /// error and held by this daemon itself ([`LocalBlocks`]), so no spend
    /// of this daemon goes through meanwhile. A template credential's
    /// tenant is blocked alone, its reasons recorded on the tenant's name.
    async fn block(
        &self,
        payer: &Payer<'_>,
        b: &Block,
        refused: bool,
        status: Option<u16>,
        resources: &[Option<String>],
    ) -> (Duration, u32) {
        let endpoint = payer.endpoint;
        let least = (b.first.unwrap_or(endpoint.min_block)).max(endpoint.min_block);
        let for_ = BlockFor {
            wait: b.wait.min(endpoint.max_block),
            least: least.min(endpoint.max_block),
            doubling_to: refused.then_some(
                endpoint
                    .throttle_block_max
                    .max(least)
                    .min(endpoint.max_block),
            ),
        };
        let credential = &payer.credential;
        let targets: Vec<Option<&str>> = resources.iter().map(Option::as_deref).collect();
        match (self.limiter)
            .block_because(credential, &targets, for_, b.reason)
            .await
        {
            Ok(blocked) => {
                info!(credential = %credential, resources = ?targets, reason = %b.reason,
                      blocked_ms = blocked.blocked_for.as_millis() as u64,
                      streak = blocked.streak, "the upstream's accounting blocks the credential");
                if blocked.streak > 0 {
                    for r in &targets {
                        self.remembered.streak_seen(resource_key(credential, *r));
                    }
                }
                if blocked.ours {
                    self.note_block(payer, b, status, &targets, blocked.blocked_for)
                        .await;
                }
                (blocked.blocked_for, blocked.streak)
            }
            Err(e) => {
                let wait = for_.wait.max(for_.least);
                error!(credential = %credential, resources = ?targets, reason = %b.reason, block_ms = wait.as_millis() as u64, error = %e,
                       "could not record the upstream's block in Redis; this daemon holds the credential blocked itself");
                for r in &targets {
                    self.local_blocks.hold(&resource_key(credential, *r), wait);
                }
                (wait, 0)
            }
        }
    }

    /// Records why the payer's credential is blocked, for the status page
    /// (best effort: the block itself is recorded already).
    async fn note_block(
        &self,
        payer: &Payer<'_>,
        b: &Block,
        status: Option<u16>,
        resources: &[Option<&str>],
        blocked: Duration,
    ) {
        let detail = (b.detail.as_ref())
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
            endpoint: payer.endpoint.name.clone(),
            kind: Some(b.reason.as_str().to_owned()),
        };
        for r in resources {
            let mut conn = self.conn.clone();
            let noted = note.record(&mut conn, self.keys(), &payer.credential, *r, blocked);
            if let Err(e) = noted.await {
                debug!(error = %e, "could not record why the credential is blocked");
            }
        }
    }
}
