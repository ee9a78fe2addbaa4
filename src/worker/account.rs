//! What an answer does to the quota, as data. The upstream's accounting
//! reads an answer as a [`Verdict`] (`crate::accounting`); [`plan`] turns
//! it, with what the config and this daemon's memories say ([`Facts`]),
//! into an [`AccountPlan`]: the settle to what the request really cost
//! (clamped to the largest window), the `upstream = true` windows to resync
//! and to what, the block to record (its least, its doubling, the resources
//! it covers: one, or every one for a token-wide limit) and whether the
//! answer ends a throttle streak. `plan` is pure, unit-tested per adapter
//! below: answer in, plan out, no Redis. [`Worker::account`] carries a
//! plan out, in this order: settle, land the request's units, resync,
//! block or end the streak.
//!
//! `plan` reads no clock: every wait in a [`Verdict`] is a duration the
//! adapter read at the answer's own time, and what depends on the time
//! between answers (streaks, holds) is in `memory`, which takes its `now`
//! from the caller.

use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use super::Worker;
use super::lease;
use super::memory::{UNMIRRORED_REMEMBERED, UNUSABLE_LOGGED, Unmirrored, resource_key};
use super::spend::{MAX_SETTLE, Payer, Spent, settled};
use crate::accounting::{Used, Verdict};
use crate::config::{Credential, Endpoint, Scope};
use crate::fetch::Reply;
use crate::quota::{BlockFor, BlockNote, BlockReason, WindowPlan};

/// What the plan needs besides the answer, read from the config and the
/// limiter by the caller.
pub(super) struct Facts<'a> {
    /// The endpoint the request was spent on.
    pub(super) endpoint: &'a Endpoint,
    /// Its credential, as configured (a template's, for a tenant).
    pub(super) credential: &'a Credential,
    /// The credential's resources that a window or an endpoint names, the
    /// default first (`Quotas::resources`).
    pub(super) resources: &'a [(Option<String>, String)],
    /// The payer's windows (`Quotas::plan_for`); `None` when the verdict
    /// resyncs nothing or they could not be had.
    pub(super) windows: Option<&'a [WindowPlan]>,
    /// The most units of any window the endpoint spends from.
    pub(super) largest_window: Option<u64>,
    /// What the request cost by its token's `x-ratelimit-used`, when the
    /// verdict prices it that way ([`priced_by_used`]).
    pub(super) by_used: Option<u64>,
    /// The spend was recorded in the windows (not let through unrecorded
    /// on a `fail-open` endpoint).
    pub(super) recorded: bool,
    /// The spend holds a lease of a concurrent window: it is settled even
    /// at its own cost, which returns the lease.
    pub(super) leased: bool,
    /// The answer's resource is one this daemon does not record (issue 37,
    /// item 4): a name it cannot use, or one more resource no window
    /// mirrors than it remembers ([`Remembered::unmirrored`]); how the
    /// outcome line names it. It resyncs nothing and blocks no resource a
    /// spend here checks, unless the limit is token-wide.
    pub(super) unrecorded: Option<String>,
}

/// What one answer does to the quota.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AccountPlan {
    /// Settle the request to another cost.
    pub(super) settle: Option<Settle>,
    /// The resource the answer speaks for, as the credential's keys hold it
    /// (`None`: the default resource).
    pub(super) resource: Option<String>,
    /// The windows to resync, in plan order.
    pub(super) resyncs: Vec<ResyncTo>,
    /// The block to record.
    pub(super) block: Option<BlockPlan>,
    /// A successful answer: it ends a throttle streak on `resource`, if
    /// this daemon saw one begin before the request left.
    pub(super) end_streak: bool,
}

/// A settle: the request cost `to` units (the upstream reported
/// `reported`, more when it was clamped to the largest window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Settle {
    pub(super) to: u64,
    pub(super) reported: u64,
}

/// One `upstream = true` window to resync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ResyncTo {
    /// Its index in the payer's plan.
    pub(super) window: usize,
    /// Its resource (`None`: the default), whose units in flight the
    /// target leaves room for.
    pub(super) resource: Option<String>,
    /// What the upstream has left of it, before the units in flight.
    pub(super) left: u64,
    /// The window's units: a target at or above them records nothing
    /// (drift only lowers what a window admits).
    pub(super) units: u64,
    /// When the upstream's count resets: drift ends then.
    pub(super) resets_in: Option<Duration>,
    /// The window as the config says it (`5000/1h`), for the log.
    pub(super) described: String,
}

impl ResyncTo {
    /// The window's target with `in_flight` units unanswered on its
    /// resource, or `None` when it would record nothing.
    pub(super) fn target(&self, in_flight: u64) -> Option<u64> {
        let target = self.left.saturating_sub(in_flight);
        (target < self.units).then_some(target)
    }
}

/// A block to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BlockPlan {
    /// How long, at least, and how far a throttle streak doubles it.
    pub(super) for_: BlockFor,
    /// Why, in a stable word.
    pub(super) reason: BlockReason,
    /// What the upstream said, for the outcome line.
    pub(super) detail: Option<String>,
    /// The refusal's status (a page with nothing left after it has none).
    pub(super) status: Option<u16>,
    /// The resources blocked, the answer's first (its block is the one
    /// reported).
    pub(super) targets: Vec<Option<String>>,
    /// The answer's resource by name, when the credential has more than
    /// one (the outcome line says "credential" alone otherwise).
    pub(super) named: Option<String>,
    /// Every resource of a credential that has several.
    pub(super) token_wide: bool,
}

/// The `x-ratelimit-used` an answer is priced by: a GitHub GraphQL query
/// that did not ask for its own cost (not a 304, whose cost is known).
pub(super) fn priced_by_used(reply: &Reply, verdict: &Verdict) -> Option<Used> {
    match reply {
        Reply::NotModified { .. } => None,
        _ if verdict.cost.is_some() => None,
        _ => verdict.used,
    }
}

/// What `verdict`, read from `reply`, does to the quota.
pub(super) fn plan(verdict: &Verdict, reply: &Reply, facts: &Facts<'_>) -> AccountPlan {
    let endpoint = facts.endpoint;
    let cred = facts.credential;
    // A resource no window mirrors resyncs nothing (no window of it) and
    // blocks only itself; one this daemon does not record, nothing.
    let unrecorded = facts.unrecorded.as_deref();
    let resource = match verdict.resource.as_deref() {
        None => endpoint.resource.clone(),
        Some(name) => cred.resource_of(name),
    };
    let cost = match reply {
        // A 304 the upstream did not price costs `not_modified_cost`.
        Reply::NotModified { .. } => verdict.cost.or(Some(endpoint.not_modified_cost)),
        _ if verdict.used.is_some() && verdict.cost.is_none() => facts.by_used,
        _ => verdict.cost,
    };
    let settle = settle(facts, cost);
    let resyncs = match facts.windows {
        Some(windows) if !verdict.left.is_empty() && unrecorded.is_none() => {
            resyncs(endpoint, cred, windows, resource.as_deref(), verdict)
        }
        _ => vec![],
    };
    let succeeded =
        !verdict.refused && matches!(reply, Reply::Ok { .. } | Reply::NotModified { .. });
    let block = verdict.block.as_ref().map(|b| {
        let least = (b.first.unwrap_or(endpoint.min_block)).max(endpoint.min_block);
        let for_ = BlockFor {
            wait: b.wait.min(endpoint.max_block),
            least: least.min(endpoint.max_block),
            // A throttle's streak doubles the least; a page with nothing
            // left after it is no throttle.
            doubling_to: verdict
                .refused
                .then_some((endpoint.throttle_block_max.max(least)).min(endpoint.max_block)),
        };
        let mut targets = match unrecorded {
            None => vec![resource.clone()],
            Some(_) => vec![],
        };
        if b.token_wide {
            let others = facts.resources.iter().map(|(r, _)| r);
            let others = others.filter(|r| unrecorded.is_some() || **r != resource);
            targets.extend(others.cloned());
        }
        let several = facts.resources.len() > 1;
        let named = match unrecorded {
            Some(n) => Some(n.to_owned()),
            None => several.then(|| cred.resource_name(resource.as_deref()).to_owned()),
        };
        BlockPlan {
            for_,
            reason: b.reason,
            detail: b.detail.clone(),
            status: if verdict.refused {
                reply.status()
            } else {
                None
            },
            targets,
            named,
            token_wide: b.token_wide && several,
        }
    });
    AccountPlan {
        settle,
        end_streak: succeeded && block.is_none() && unrecorded.is_none(),
        resource,
        resyncs,
        block,
    }
}

/// The settle for a request the upstream says cost `reported` (`None`: it
/// says nothing). A spend that was not recorded settles nothing; one that
/// holds a lease settles even at its own cost (which returns the lease).
/// More than the largest window fills every window: settling more says
/// nothing new, and a huge number would fail the script (its numbers are
/// doubles).
fn settle(facts: &Facts<'_>, reported: Option<u64>) -> Option<Settle> {
    let cost = facts.endpoint.cost.get();
    let reported = match reported.filter(|_| facts.recorded) {
        Some(r) => r,
        None if facts.leased => cost,
        None => return None,
    };
    let most = (facts.largest_window.unwrap_or(cost).max(cost)).min(MAX_SETTLE);
    let to = reported.min(most);
    (to != cost || facts.leased).then_some(Settle { to, reported })
}

/// The `upstream = true` windows of the payer the answer speaks for (the
/// credential's and the endpoint's own), each with what its limit has
/// left: an IETF answer's limit of the window's resource's name, else,
/// for the windows of the answer's `resource`, the resource's count (a
/// window of the default resource names no limit: it mirrors the most
/// restrictive, whatever its resource is called).
fn resyncs(
    endpoint: &Endpoint,
    cred: &Credential,
    windows: &[WindowPlan],
    resource: Option<&str>,
    verdict: &Verdict,
) -> Vec<ResyncTo> {
    let own = Scope::Endpoint(endpoint.name.clone());
    let left = &verdict.left;
    let mut out = vec![];
    for (i, w) in windows.iter().enumerate() {
        if !w.window.upstream || (w.scope != Scope::Credential && w.scope != own) {
            continue;
        }
        let mine = w.window.resource.as_deref();
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
        let units = w.window.units.get();
        out.push(ResyncTo {
            window: i,
            resource: mine.map(str::to_owned),
            left: r.left.of(units),
            units,
            resets_in: r.resets_in,
            described: w.window.describe(),
        });
    }
    out
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

impl Worker {
    /// Applies what an answer says about the upstream's quota: makes its
    /// [`plan`] from the config and this daemon's memories, then carries it
    /// out. Returns the settle's change and the block, if one was asked
    /// for.
    pub(super) async fn account(
        &self,
        payer: &Payer<'_>,
        spent: &mut Spent,
        reply: &Reply,
        verdict: Verdict,
    ) -> Accounted {
        let endpoint = payer.endpoint;
        let cred = &self.config.credentials[&endpoint.credential];
        let quotas = self.limiter.quotas();
        let resources = quotas.resources(&cred.name);
        let windows = if verdict.left.is_empty() {
            None
        } else {
            match quotas.plan_for(&payer.credential) {
                Ok(plan) => Some(plan),
                Err(e) => {
                    warn!(credential = %payer.credential, error = %e, "cannot resync the windows");
                    None
                }
            }
        };
        let by_used = priced_by_used(reply, &verdict)
            .and_then(|used| self.lasting.remembered.used_since(&payer.credential, used));
        let windows_of = self.config.windows_of(endpoint);
        let facts = Facts {
            endpoint,
            credential: cred,
            resources: &resources,
            windows: windows.as_ref().map(|p| p.windows.as_slice()),
            largest_window: windows_of.iter().map(|(_, w)| w.units.get()).max(),
            by_used,
            recorded: spent.recorded,
            leased: spent.lease.is_some(),
            unrecorded: self.remember_resource(payer, cred, &verdict, &resources),
        };
        let plan = plan(&verdict, reply, &facts);
        self.carry_out(payer, spent, plan).await
    }

    /// Carries out `plan`, in this order: settle the request; land its
    /// units (only once settled: while its spend still holds the
    /// configured cost, another answer's resync must leave room for it, or
    /// that resync sets the window to the upstream's count, this request
    /// at its actual cost, and this settle then refunds the difference a
    /// second time: the window admits more than the upstream allows,
    /// Shopify THROTTLED); resync what is left after the settle, which the
    /// upstream's count already holds; then block, or end the streak.
    async fn carry_out(
        &self,
        payer: &Payer<'_>,
        spent: &mut Spent,
        plan: AccountPlan,
    ) -> Accounted {
        let endpoint = payer.endpoint;
        let change = match plan.settle {
            Some(s) => self.settle(endpoint, spent, s).await,
            None => 0,
        };
        spent.flying.land();
        for r in &plan.resyncs {
            self.resync(payer, r).await;
        }
        if plan.end_streak {
            self.end_streak(payer, plan.resource.as_deref(), spent.at)
                .await;
        }
        let Some(b) = plan.block else {
            return Accounted {
                change,
                blocked: None,
            };
        };
        let (blocked, streak) = if b.targets.is_empty() {
            // A resource this daemon does not record: its task waits, and
            // nothing is blocked.
            (b.for_.wait, 0)
        } else {
            self.block(payer, &b).await
        };
        Accounted {
            change,
            blocked: Some(Applied {
                blocked,
                reason: b.reason,
                detail: b.detail,
                resource: b.named,
                token_wide: b.token_wide,
                streak,
            }),
        }
    }

    /// Whether this daemon records the resource `verdict` speaks for, and
    /// logs a new one no window mirrors (once per credential and name):
    /// `None` it does (the endpoint's, one a window mirrors, or one of the
    /// [`UNMIRRORED_REMEMBERED`] no window mirrors that it remembers);
    /// else how the outcome names what it does not record: a name it
    /// cannot use (issue 37, item 4: it was taken for the endpoint's own),
    /// or one past that bound.
    fn remember_resource(
        &self,
        payer: &Payer<'_>,
        cred: &Credential,
        verdict: &Verdict,
        resources: &[(Option<String>, String)],
    ) -> Option<String> {
        if let Some(raw) = &verdict.unusable_resource {
            if self
                .lasting
                .remembered
                .unmirrored(&cred.name, UNUSABLE_LOGGED)
                == Unmirrored::New
            {
                warn!(
                    credential = %cred.name,
                    endpoint = %payer.endpoint.name,
                    resource = %raw,
                    "the upstream names a resource the daemon cannot use (a name is 1 to 64 of a-z, 0-9, _, - and .): its answers count against a resource no window mirrors, so they resync nothing and block no endpoint (logged once per credential)"
                );
            }
            return Some(format!("\"{raw}\" (a name the daemon cannot use)"));
        }
        let name = verdict.resource.as_deref()?;
        let resource = cred.resource_of(name);
        if resources.iter().any(|(r, _)| *r == resource) {
            return None;
        }
        match self.lasting.remembered.unmirrored(&cred.name, name) {
            Unmirrored::Known => None,
            Unmirrored::New => {
                warn!(
                    credential = %cred.name,
                    endpoint = %payer.endpoint.name,
                    resource = name,
                    endpoint_resource = cred.resource_name(payer.endpoint.resource.as_deref()),
                    "the upstream counts this endpoint's answers against a resource no window mirrors: they resync nothing and block only that resource; give the endpoint resource = \"{name}\" and the credential a window of it"
                );
                None
            }
            Unmirrored::Forgotten { first } => {
                if first {
                    warn!(
                        credential = %cred.name,
                        endpoint = %payer.endpoint.name,
                        resource = name,
                        remembered = UNMIRRORED_REMEMBERED,
                        "this daemon remembers no more resources that no window mirrors for this credential: answers that name others resync nothing, block no endpoint and are not logged one by one"
                    );
                }
                Some(format!("{name} (no window mirrors it)"))
            }
        }
    }

    /// Resyncs one window of the payer's credential (a template's: its
    /// tenant's) to what its limit has left, less the units this daemon
    /// has in flight on its resource, unanswered (the upstream may not have
    /// counted them yet).
    async fn resync(&self, payer: &Payer<'_>, r: &ResyncTo) {
        let credential = &payer.credential;
        let in_flight =
            (self.lasting.unanswered).units(&resource_key(credential, r.resource.as_deref()));
        let Some(target) = r.target(in_flight) else {
            return;
        };
        if let Err(e) = (self.limiter)
            .sync(credential, r.window, target, r.resets_in)
            .await
        {
            warn!(credential = %credential, window = %r.described, error = %e,
                  "could not resync a window to the upstream's count; it admits what it counted");
        }
    }

    /// A successful answer on `resource` to a request spent at `sent`:
    /// its throttle streak ends, if this daemon saw one begin before the
    /// request left (best effort: a streak left running only makes the
    /// next throttle's block longer).
    async fn end_streak(&self, payer: &Payer<'_>, resource: Option<&str>, sent: Instant) {
        let key = resource_key(&payer.credential, resource);
        if !self
            .lasting
            .remembered
            .streak_ends(&key, sent, Instant::now())
        {
            return;
        }
        if let Err(e) = self.limiter.end_streak(&payer.credential, resource).await {
            debug!(credential = %payer.credential, error = %e, "could not end a throttle streak");
        }
    }

    /// Settles the request to `s.to` units: the windows follow, and the
    /// change in units is returned for the task's count.
    async fn settle(&self, endpoint: &Endpoint, spent: &mut Spent, s: Settle) -> i64 {
        if s.to < s.reported {
            warn!(endpoint = %endpoint.name, reported = s.reported, settled = s.to,
                  "the upstream reported a cost above the largest window; settled to that window's units");
        }
        let (request_id, tenant) = (&spent.request_id, spent.tenant.as_deref());
        let lease = &mut spent.lease;
        let settled_ = lease::settle(
            &self.limiter,
            &endpoint.name,
            tenant,
            request_id,
            lease,
            s.to,
        );
        match settled_.await {
            // Both at most 2^53: exact as i64.
            Ok(_) => settled(endpoint, s.to as i64 - endpoint.cost.get() as i64),
            Err(e) => {
                error!(endpoint = %endpoint.name, request_id, actual = s.to, error = %e,
                       "could not settle a request to its reported cost; the windows keep the configured cost");
                0
            }
        }
    }

    /// Blocks the plan's resources of the payer's credential and returns
    /// the block in force on the first and its streak. Its reason is kept
    /// beside it in Redis (the stable word, `quota::BlockReason`), and when
    /// this block is the one in force, the status page's account of it
    /// (`quota::BlockNote`: what the upstream answered, on which endpoint).
    /// A block Redis does not take is never ignored: it is logged as an
    /// error and held by this daemon itself (`memory::LocalBlocks`), so no
    /// spend of this daemon goes through meanwhile. A template credential's
    /// tenant is blocked alone, its reasons recorded on the tenant's name.
    async fn block(&self, payer: &Payer<'_>, b: &BlockPlan) -> (Duration, u32) {
        let credential = &payer.credential;
        let targets: Vec<Option<&str>> = b.targets.iter().map(Option::as_deref).collect();
        match (self.limiter)
            .block_because(credential, &targets, b.for_, b.reason)
            .await
        {
            Ok(blocked) => {
                info!(credential = %credential, resources = ?targets, reason = %b.reason,
                      blocked_ms = blocked.blocked_for.as_millis() as u64,
                      streak = blocked.streak, "the upstream's accounting blocks the credential");
                if blocked.streak > 0 {
                    let now = Instant::now();
                    for r in &targets {
                        self.lasting
                            .remembered
                            .streak_seen(resource_key(credential, *r), now);
                    }
                }
                if blocked.ours {
                    self.note_block(payer, b, &targets, blocked.blocked_for)
                        .await;
                }
                (blocked.blocked_for, blocked.streak)
            }
            Err(e) => {
                let wait = b.for_.wait.max(b.for_.least);
                error!(credential = %credential, resources = ?targets, reason = %b.reason, block_ms = wait.as_millis() as u64, error = %e,
                       "could not record the upstream's block in Redis; this daemon holds the credential blocked itself");
                let now = Instant::now();
                for r in &targets {
                    self.lasting
                        .local_blocks
                        .hold(&resource_key(credential, *r), wait, now);
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
        b: &BlockPlan,
        resources: &[Option<&str>],
        blocked: Duration,
    ) {
        let detail = (b.detail.as_ref())
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        let said = match b.status {
            Some(s) => format!("upstream answered {s}{detail}"),
            None => format!("upstream reports nothing left ({})", b.reason),
        };
        let note = BlockNote {
            why: said,
            status: b.status,
            reason: b.detail.clone(),
            endpoint: payer.endpoint.name.clone(),
            kind: Some(b.reason.as_str().to_owned()),
        };
        for r in resources {
            let mut conn = self.lasting.conn.clone();
            let noted = note.record(&mut conn, self.keys(), &payer.credential, *r, blocked);
            if let Err(e) = noted.await {
                debug!(error = %e, "could not record why the credential is blocked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each adapter's answers, read by `accounting::read` as the worker
    //! reads them, and the plan they make: no Redis, no clock.

    use std::num::NonZeroU64;

    use chrono::Utc;
    use reqwest::header::HeaderMap;
    use serde_json::json;

    use super::*;
    use crate::accounting::read;
    use crate::accounting::tests::{endpoint, headers};
    use crate::config::{Accounting, Location, SecretSource, Window, WindowKind};
    use crate::decode::Altered;
    use crate::fetch::paging::{Next, Validators};

    const SEC: Duration = Duration::from_secs(1);

    /// A credential `c` whose default resource is `default`.
    fn credential(default: &str) -> Credential {
        Credential {
            name: "c".into(),
            secret: SecretSource::Env {
                var: "T".into(),
                at: Location::nowhere(),
            },
            windows: vec![],
            default_resource: default.into(),
            template: None,
        }
    }

    /// A sliding window of `units` per hour of `scope`.
    fn window(scope: Scope, units: u64, upstream: bool, resource: Option<&str>) -> WindowPlan {
        WindowPlan {
            scope,
            window: Window {
                units: NonZeroU64::new(units).expect("units"),
                per: Duration::from_secs(3600),
                kind: WindowKind::Sliding,
                upstream,
                resource: resource.map(str::to_owned),
                every_resource: false,
                mode: Default::default(),
                keyed_by_units: false,
            },
            keys: vec![],
            spec: String::new(),
        }
    }

    fn ok() -> Reply {
        Reply::Ok {
            body: json!([]),
            next: Next::End,
            validators: Validators::default(),
            status: 200,
            altered: Altered::default(),
        }
    }

    /// One answer's world: the endpoint `e` of credential `c`, its windows,
    /// and what the spend was.
    struct World {
        endpoint: Endpoint,
        credential: Credential,
        resources: Vec<(Option<String>, String)>,
        windows: Vec<WindowPlan>,
        by_used: Option<u64>,
        recorded: bool,
        leased: bool,
        unrecorded: Option<String>,
    }

    impl World {
        fn new(accounting: Option<Accounting>, default: &str) -> Self {
            World {
                endpoint: endpoint(accounting),
                credential: credential(default),
                resources: vec![(None, default.into())],
                windows: vec![window(Scope::Credential, 5000, true, None)],
                by_used: None,
                recorded: true,
                leased: false,
                unrecorded: None,
            }
        }

        fn plan(&self, status: u16, h: &HeaderMap, body: &[u8], reply: Reply) -> AccountPlan {
            let verdict = read(&self.endpoint, status, h, body, Utc::now());
            self.plan_of(&verdict, &reply)
        }

        fn plan_of(&self, verdict: &Verdict, reply: &Reply) -> AccountPlan {
            let facts = Facts {
                endpoint: &self.endpoint,
                credential: &self.credential,
                resources: &self.resources,
                windows: Some(&self.windows),
                largest_window: self.windows.iter().map(|w| w.window.units.get()).max(),
                by_used: self.by_used,
                recorded: self.recorded,
                leased: self.leased,
                unrecorded: self.unrecorded.clone(),
            };
            plan(verdict, reply, &facts)
        }
    }

    /// `(window, left, resets_in)` of each resync.
    fn resyncs(p: &AccountPlan) -> Vec<(usize, u64, Option<Duration>)> {
        (p.resyncs.iter())
            .map(|r| (r.window, r.left, r.resets_in))
            .collect()
    }

    #[test]
    fn generic_a_cost_header_settles_clamped_to_the_largest_window() {
        let mut w = World::new(None, "default");
        w.windows.push(window(Scope::Credential, 100, false, None));
        let p = w.plan(200, &headers(&[("x-quota-cost", "5")]), b"[]", ok());
        assert_eq!(p.settle, Some(Settle { to: 5, reported: 5 }));
        assert!(p.end_streak && p.block.is_none() && p.resyncs.is_empty());
        let huge = headers(&[("x-quota-cost", "99999999999999999999")]);
        let p = w.plan(200, &huge, b"[]", ok());
        assert_eq!(
            p.settle,
            Some(Settle {
                to: 5000,
                reported: u64::MAX
            }),
            "more than the largest window fills every window"
        );
        let p = w.plan(200, &headers(&[("x-quota-cost", "1")]), b"[]", ok());
        assert_eq!(p.settle, None, "at its own cost, nothing to settle");
        w.leased = true;
        let p = w.plan(200, &HeaderMap::new(), b"[]", ok());
        assert_eq!(
            p.settle,
            Some(Settle { to: 1, reported: 1 }),
            "a lease is returned by a settle, even at the request's own cost"
        );
        w.recorded = false;
        w.leased = false;
        let p = w.plan(200, &headers(&[("x-quota-cost", "5")]), b"[]", ok());
        assert_eq!(p.settle, None, "an unrecorded spend settles nothing");
    }

    #[test]
    fn generic_remaining_resyncs_only_the_mirrored_windows_it_speaks_for() {
        let mut w = World::new(None, "default");
        w.windows = vec![
            window(Scope::Credential, 1000, true, None),
            window(Scope::Credential, 500, false, None),
            window(Scope::Endpoint("e".into()), 300, true, None),
            window(Scope::Endpoint("other".into()), 200, true, None),
        ];
        let reset = (Utc::now().timestamp() + 60).to_string();
        let h = headers(&[
            ("x-ratelimit-remaining", "250"),
            ("x-ratelimit-reset", &reset),
        ]);
        let p = w.plan(200, &h, b"[]", ok());
        let got: Vec<_> = (p.resyncs.iter())
            .map(|r| (r.window, r.left, r.units))
            .collect();
        assert_eq!(
            got,
            [(0, 250, 1000), (2, 250, 300)],
            "the credential's and this endpoint's upstream windows"
        );
        assert!(p.resyncs.iter().all(|r| r.resets_in.is_some()));
        assert_eq!(p.resyncs[0].described, "1000/1h");
        // The target leaves room for the units in flight, and a target at
        // or above the window's units records nothing.
        assert_eq!(p.resyncs[0].target(50), Some(200));
        assert_eq!(p.resyncs[1].target(0), Some(250));
        let above = ResyncTo {
            units: 200,
            ..p.resyncs[1].clone()
        };
        assert_eq!(above.target(0), None, "250 left of 200: nothing to lower");
        assert!(p.end_streak);
    }

    #[test]
    fn generic_a_429_blocks_at_least_min_block_doubling_to_throttle_block_max() {
        let w = World::new(None, "default");
        let h = headers(&[("retry-after", "7")]);
        let p = w.plan(429, &h, b"", Reply::Throttled { status: 429 });
        let b = p.block.expect("blocked");
        assert_eq!(
            b.for_,
            BlockFor {
                wait: 7 * SEC,
                least: SEC,
                doubling_to: Some(900 * SEC)
            }
        );
        assert_eq!(
            (b.reason, b.status, b.targets, b.named, b.token_wide),
            (
                BlockReason::TooManyRequests,
                Some(429),
                vec![None],
                None,
                false
            )
        );
        assert!(!p.end_streak, "a refusal ends no streak");
        let mut w = World::new(None, "default");
        w.endpoint.max_block = 5 * SEC;
        let p = w.plan(429, &h, b"", Reply::Throttled { status: 429 });
        let b = p.block.expect("blocked");
        assert_eq!(
            (b.for_.wait, b.for_.doubling_to),
            (5 * SEC, Some(5 * SEC)),
            "max_block bounds the wait and the doubling"
        );
    }

    fn github(resource: &str, remaining: &str, reset_in: i64) -> HeaderMap {
        let reset = (Utc::now().timestamp() + reset_in).to_string();
        headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", remaining),
            ("x-ratelimit-used", "1"),
            ("x-ratelimit-reset", &reset),
            ("x-ratelimit-resource", resource),
        ])
    }

    /// A credential with a core window, a search window and an endpoint
    /// on core.
    fn github_world() -> World {
        let mut w = World::new(Some(Accounting::Github), "core");
        w.resources = vec![
            (None, "core".into()),
            (Some("search".into()), "search".into()),
        ];
        w.windows = vec![
            window(Scope::Credential, 5000, true, None),
            window(Scope::Credential, 30, true, Some("search")),
        ];
        w
    }

    #[test]
    fn github_each_resource_resyncs_its_own_windows() {
        let w = github_world();
        let p = w.plan(200, &github("core", "4999", 600), b"[]", ok());
        assert_eq!(p.resource, None, "core is the default resource");
        assert_eq!(
            (p.resyncs.iter().map(|r| (r.window, r.left))).collect::<Vec<_>>(),
            [(0, 4999)]
        );
        let p = w.plan(200, &github("search", "29", 60), b"[]", ok());
        assert_eq!(p.resource.as_deref(), Some("search"));
        assert_eq!(
            (p.resyncs.iter().map(|r| (r.window, r.left))).collect::<Vec<_>>(),
            [(1, 29)]
        );
        assert!(p.end_streak);
    }

    #[test]
    fn github_nothing_left_blocks_the_resource_until_the_reset_without_a_streak() {
        let w = github_world();
        let p = w.plan(200, &github("search", "0", 45), b"[]", ok());
        let b = p.block.expect("blocked");
        assert_eq!(b.reason, BlockReason::HeadersAtZero);
        assert_eq!(b.targets, [Some("search".to_owned())]);
        assert_eq!(
            (b.status, b.for_.doubling_to, b.named.as_deref()),
            (None, None, Some("search")),
            "a page with nothing left after it is no throttle"
        );
        assert!(!p.end_streak);
    }

    #[test]
    fn github_a_secondary_limit_blocks_every_resource_a_minute_at_least() {
        let w = github_world();
        let body = br#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits","status":"403"}"#;
        let p = w.plan(
            403,
            &github("core", "4000", 600),
            body,
            Reply::Throttled { status: 403 },
        );
        let b = p.block.clone().expect("blocked");
        assert_eq!(
            (b.reason, b.targets.clone(), b.token_wide),
            (
                BlockReason::SecondaryLimit,
                vec![None, Some("search".to_owned())],
                true
            )
        );
        assert_eq!(
            b.for_,
            BlockFor {
                wait: Duration::ZERO,
                least: 60 * SEC,
                doubling_to: Some(900 * SEC)
            }
        );
        assert_eq!(b.named.as_deref(), Some("core"));
        assert_eq!(resyncs(&p).len(), 1, "the primary count still resyncs");
    }

    #[test]
    fn github_a_resource_no_window_mirrors_is_told_and_blocks_only_itself() {
        let w = github_world();
        let p = w.plan(200, &github("code_search", "9", 60), b"[]", ok());
        assert_eq!(p.resource.as_deref(), Some("code_search"));
        assert_eq!(p.resyncs, [], "no window of it to resync");
        let p = w.plan(200, &github("code_search", "0", 60), b"[]", ok());
        assert_eq!(
            p.block.map(|b| b.targets),
            Some(vec![Some("code_search".to_owned())])
        );
    }

    /// Issue 37, item 4: a resource this daemon does not record (a name it
    /// cannot use) resyncs nothing, blocks nothing and ends no streak, but
    /// settles, and a refusal still makes the task wait; a token-wide limit
    /// blocks every resource of the credential.
    #[test]
    fn github_a_resource_not_recorded_resyncs_and_blocks_nothing() {
        let mut w = github_world();
        w.unrecorded = Some("\"a a\" (a name the daemon cannot use)".into());
        let p = w.plan(200, &github("core", "0", 60), b"[]", ok());
        assert_eq!(p.resyncs, [], "no window resynced");
        let b = p.block.expect("the task waits");
        assert_eq!(b.targets, Vec::<Option<String>>::new(), "nothing blocked");
        assert_eq!(b.named, w.unrecorded);
        assert!(!p.end_streak);
    }
    #[test]
    fn github_graphql_a_query_without_its_cost_is_priced_by_used() {
        let mut w = World::new(Some(Accounting::GithubGraphql), "graphql");
        let reset = (Utc::now().timestamp() + 900).to_string();
        let h = headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4890"),
            ("x-ratelimit-used", "110"),
            ("x-ratelimit-reset", &reset),
            ("x-ratelimit-resource", "graphql"),
        ]);
        let body = br#"{"data":{"viewer":{}}}"#;
        let verdict = read(&w.endpoint, 200, &h, body, Utc::now());
        assert_eq!(
            priced_by_used(&ok(), &verdict).map(|u| u.used),
            Some(110),
            "the worker asks its memory what changed"
        );
        assert_eq!(
            priced_by_used(&Reply::NotModified { status: 304 }, &verdict),
            None
        );
        w.by_used = Some(3);
        let p = w.plan_of(&verdict, &ok());
        assert_eq!(p.settle, Some(Settle { to: 3, reported: 3 }));
        assert_eq!(resyncs(&p).iter().map(|r| r.1).collect::<Vec<_>>(), [4890]);
        w.by_used = None;
        assert_eq!(w.plan_of(&verdict, &ok()).settle, None, "the first answer");
        let limited = br#"{"errors":[{"type":"RATE_LIMITED","message":"API rate limit exceeded for user ID 1."}]}"#;
        let p = w.plan(200, &h, limited, Reply::Throttled { status: 200 });
        let b = p.block.expect("blocked");
        assert_eq!((b.status, b.targets), (Some(200), vec![None]));
    }

    #[test]
    fn shopify_settles_to_the_actual_cost_and_a_throttle_to_nothing() {
        let mut w = World::new(Some(Accounting::ShopifyGraphql), "default");
        w.endpoint.cost = NonZeroU64::new(101).expect("cost");
        w.windows = vec![window(Scope::Credential, 1000, true, None)];
        let body = br#"{"data":{"products":{"nodes":[]}},"extensions":{"cost":{"requestedQueryCost":101,"actualQueryCost":46,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":954.5,"restoreRate":50.0}}}}"#;
        let p = w.plan(200, &HeaderMap::new(), body, ok());
        assert_eq!(
            p.settle,
            Some(Settle {
                to: 46,
                reported: 46
            })
        );
        assert_eq!(resyncs(&p), [(0, 954, None)]);
        let throttled = br#"{"errors":[{"message":"Throttled","extensions":{"code":"THROTTLED"}}],"extensions":{"cost":{"requestedQueryCost":752,"actualQueryCost":null,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":640,"restoreRate":50.0}}}}"#;
        let p = w.plan(
            200,
            &HeaderMap::new(),
            throttled,
            Reply::Throttled { status: 200 },
        );
        assert_eq!(p.settle, Some(Settle { to: 0, reported: 0 }));
        let b = p.block.expect("blocked");
        assert!(b.for_.doubling_to.is_some() && !p.end_streak);
    }

    #[test]
    fn meta_a_usage_percentage_resyncs_each_window_by_its_own_units() {
        let mut w = World::new(Some(Accounting::Meta { throttle_at: 100 }), "default");
        w.windows = vec![
            window(Scope::Credential, 200, true, None),
            window(Scope::Endpoint("e".into()), 4800, true, None),
        ];
        let h = headers(&[(
            "x-app-usage",
            r#"{"call_count":80,"total_time":25,"total_cputime":25}"#,
        )]);
        let p = w.plan(200, &h, b"{}", ok());
        assert_eq!(resyncs(&p), [(0, 40, None), (1, 960, None)]);
        assert!(p.block.is_none() && p.end_streak);
    }

    #[test]
    fn ietf_a_named_limit_resyncs_the_window_of_its_resource() {
        let mut w = World::new(Some(Accounting::Ietf), "default");
        w.resources.push((Some("daily".into()), "daily".into()));
        w.windows = vec![
            window(Scope::Credential, 100, true, None),
            window(Scope::Credential, 1000, true, Some("daily")),
        ];
        let h = headers(&[("ratelimit", r#""burst";r=50;t=1, "daily";r=900;t=3600"#)]);
        let p = w.plan(200, &h, b"{}", ok());
        let got: Vec<_> = (p.resyncs.iter()).map(|r| (r.window, r.left)).collect();
        assert_eq!(got, [(0, 50), (1, 900)], "{p:?}");
        assert_eq!(p.resyncs[1].resets_in, Some(3600 * SEC));
        let h = headers(&[("ratelimit", r#""burst";r=50;t=1, "daily";r=0;t=3000"#)]);
        let p = w.plan(200, &h, b"{}", ok());
        let b = p.block.expect("a limit at zero anywhere blocks");
        assert_eq!((b.status, b.for_.doubling_to), (None, None));
    }

    #[test]
    fn a_304_costs_not_modified_cost_and_ends_a_streak() {
        let mut w = World::new(None, "default");
        w.endpoint.cost = NonZeroU64::new(3).expect("cost");
        w.endpoint.not_modified_cost = 1;
        let not_modified = Reply::NotModified { status: 304 };
        let p = w.plan(304, &HeaderMap::new(), b"", not_modified);
        assert_eq!(p.settle, Some(Settle { to: 1, reported: 1 }));
        assert!(p.end_streak);
        let p = w.plan(
            503,
            &HeaderMap::new(),
            b"",
            Reply::ServerError { status: 503 },
        );
        assert!(!p.end_streak && p.block.is_none(), "a 5xx is no success");
    }
}
