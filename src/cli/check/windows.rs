//! `check`'s per-window report: the windows of a credential and the jobs
//! that spend from each, the worst case against the limit, and each item's
//! share of ticks where a job does not fit.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};

use crate::config::{Config, Job, Reserve, Scope, Window, fmt_duration};
use crate::schedule::{self, TickItems};

use super::tenants::Tenants;

/// One window of a credential (its own, or one of its endpoints'), and the
/// jobs that spend from it.
pub(super) struct Row<'a> {
    pub(super) scope: Scope,
    pub(super) window: &'a Window,
    pub(super) jobs: Vec<&'a Job>,
    /// The token's concurrent cap on a credential of several resources:
    /// its label says it counts them all.
    pub(super) every: bool,
}

/// The credential's windows, then each of its endpoints' windows.
pub(super) fn window_rows<'a>(
    config: &'a Config,
    credential: &str,
    own: &'a [Window],
) -> Vec<Row<'a>> {
    let cred_jobs: Vec<&Job> = config
        .jobs
        .values()
        .filter(|j| config.endpoints[&j.endpoint].credential == credential)
        .collect();
    // An endpoint with charge_credential = false spends only from its own.
    let charged: Vec<&Job> = (cred_jobs.iter().copied())
        .filter(|j| config.endpoints[&j.endpoint].charge_credential)
        .collect();
    let several = (config.credentials.get(credential))
        .is_some_and(|c| c.resources(config.endpoints.values()).len() > 1);
    // A credential's window is spent by the endpoints of its resource.
    let mut rows: Vec<Row<'a>> = own
        .iter()
        .map(|window| Row {
            scope: Scope::Credential,
            window,
            jobs: (charged.iter().copied())
                .filter(|j| window.serves(config.endpoints[&j.endpoint].resource.as_deref()))
                .collect(),
            every: several && window.every_resource,
        })
        .collect();
    for ep in (config.endpoints.values()).filter(|e| e.credential == credential) {
        let jobs: Vec<&Job> = (cred_jobs.iter().copied())
            .filter(|j| j.endpoint == ep.name)
            .collect();
        rows.extend(ep.windows.iter().map(|window| Row {
            scope: Scope::Endpoint(ep.name.clone()),
            window,
            jobs: jobs.clone(),
            every: false,
        }));
    }
    rows
}

impl Row<'_> {
    /// Its scope, and its resource when it is not the credential's default
    /// (`credential (search)`; the token's concurrent cap on a credential of
    /// several: `credential (every resource)`).
    pub(super) fn label(&self) -> String {
        match &self.window.resource {
            None if self.every => format!("{} (every resource)", self.scope),
            None => self.scope.to_string(),
            Some(r) => format!("{} ({r})", self.scope),
        }
    }

    /// The most units its jobs can spend in one window span. A template
    /// credential's windows are per tenant: each job counts only the items
    /// of its busiest tenant.
    pub(super) fn worst(
        &self,
        config: &Config,
        tenants: Option<&Tenants>,
        now: DateTime<Utc>,
    ) -> u64 {
        (self.jobs.iter())
            .map(|j| {
                let run = schedule::worst_per_run(config, j);
                let run = match tenants {
                    Some(t) => t.busiest_share(j, run),
                    None => run,
                };
                schedule::worst_ticks(j, self.window.per, now).saturating_mul(run)
            })
            .fold(0, u64::saturating_add)
    }

    /// Its line (columns `widths` wide), and a warning when the jobs'
    /// worst case does not fit ([`Row::worst`]: per tenant for a template).
    pub(super) fn report(
        &self,
        config: &Config,
        credential: &str,
        tenants: Option<&Tenants>,
        now: DateTime<Utc>,
        (scope_w, win_w): (usize, usize),
    ) -> (String, Option<String>) {
        let (scope, w) = (self.label(), self.window);
        let worst = self.worst(config, tenants, now);
        let pct = worst as f64 * 100.0 / w.units.get() as f64;
        let fits = worst <= w.units.get();
        // A shadow window is judged as if enforced, and marked: it would
        // not fit, but it refuses nothing (SPEC Part 4, "Shadow windows").
        let verdict = match (fits, w.is_shadow()) {
            (true, false) => "fits",
            (false, false) => "DOES NOT FIT",
            (true, true) => "fits (shadow)",
            (false, true) => "would not fit (shadow: not enforced)",
        };
        let mut line = format!(
            "  {:<scope_w$}  {:<win_w$}  worst case {worst:>9} units per {:<6} {pct:>6.1}%  {verdict}\n",
            scope,
            w.describe(),
            fmt_duration(w.per),
        );
        // A job's reserve: what its spends leave free in this window.
        for j in self.jobs.iter().filter(|j| j.reserve != Reserve::NONE) {
            line.push_str(&format!(
                "  {:<scope_w$}  {:<win_w$}  job {} keeps {} free: spends up to {} of {} units\n",
                "",
                "",
                j.name,
                j.reserve,
                w.admits(j.reserve),
                w.units
            ));
        }
        if fits {
            return (line, None);
        }
        let mut msg = format!(
            "credential {credential} {scope} window {}: the jobs can spend up to {worst} units per {}, more than its {}",
            w.describe(),
            fmt_duration(w.per),
            w.units
        );
        if w.is_shadow() {
            msg.push_str(
                " (a shadow window: enforced, it would refuse what does not fit; as it is, it counts shadow refusals)",
            );
        }
        if tenants.is_some() {
            msg.push_str(" (for its busiest tenant)");
        } else if let Some((at, job)) = schedule::exhausted_at(config, &self.jobs, w, now) {
            msg.push_str(&format!(
                "; starting from an empty window, it runs out at {} (a tick of job {}), and later tasks end as quota_exhausted",
                at.format("%Y-%m-%d %H:%M UTC"),
                job.name
            ));
        }
        (line, Some(msg))
    }
}

impl Row<'_> {
    /// A concurrent window's line: its cap against the tasks the daemons
    /// it can see run at once (this config's `concurrency`, times the
    /// daemons alive in Redis now), each with one request of its
    /// endpoint's cost in flight; and a warning when a lease is shorter
    /// than an endpoint's `timeout` (a request still in flight when its
    /// lease lapses lets another in, over the cap). A cost that can never
    /// fit is a config error already.
    pub(super) fn in_flight(
        &self,
        config: &Config,
        credential: &str,
        daemons: Option<u64>,
        (scope_w, win_w): (usize, usize),
    ) -> (String, Option<String>) {
        let (scope, w) = (&self.scope, self.window);
        let endpoints: BTreeSet<&str> = self.jobs.iter().map(|j| j.endpoint.as_str()).collect();
        let costs = endpoints.iter().map(|e| config.endpoints[*e].cost.get());
        let (least, most) = (costs.clone().min().unwrap_or(1), costs.max().unwrap_or(1));
        let per_daemon = config.worker.concurrency.get() as u64;
        let (tasks, seen) = match daemons {
            Some(n) if n > 0 => (
                per_daemon * n,
                format!("{n} daemon(s) alive in Redis now x concurrency {per_daemon}"),
            ),
            Some(_) => (
                per_daemon,
                format!("no daemon alive in Redis now; each runs concurrency {per_daemon}"),
            ),
            None => (
                per_daemon,
                format!("concurrency {per_daemon} per daemon (Redis not asked)"),
            ),
        };
        let units = w.units.get();
        let binds = if tasks.saturating_mul(most) <= units {
            "the cap never binds: the daemons alone keep under it".to_owned()
        } else {
            format!(
                "the cap binds ({} request(s) at most)",
                units / least.max(1)
            )
        };
        let cost = if least == most {
            format!("{most} unit(s) each")
        } else {
            format!("{least}-{most} units each")
        };
        let line = format!(
            "  {:<scope_w$}  {:<win_w$}  {tasks} task(s) at once ({seen}), {cost}: {binds}\n",
            self.label(),
            w.describe(),
        );
        let short: Vec<String> = (endpoints.iter().map(|e| &config.endpoints[*e]))
            .filter_map(|ep| {
                let lease = w.lease_for(ep)?;
                (lease < ep.timeout)
                    .then(|| format!("{} (timeout {})", ep.name, fmt_duration(ep.timeout)))
            })
            .collect();
        let warning = (!short.is_empty()).then(|| {
            format!(
                "credential {credential} {scope} window {}: its lease is shorter than the timeout of {}: a request still in flight when its lease lapses lets another in, over the cap (leave lease unset: timeout + 5 s)",
                w.describe(),
                short.join(", ")
            )
        });
        (line, warning)
    }
}

/// Most items listed one by one in a job's share.
const SHARE_ITEMS: u64 = 10;

/// Each item's share of ticks, per job that does not fit a window: when a
/// window serves a fraction `f` of a job's worst case, about `f` × items
/// fit per tick, and the rotation serves every item in turn
/// (docs/jobs.md "Fairness").
pub(super) fn shares(config: &Config, served: &std::collections::BTreeMap<&str, f64>) -> String {
    let mut out = String::from(
        "\nfairness: these jobs do not fit their windows at worst; each tick serves its items in rotation, the ones starved last time first\n",
    );
    for (name, f) in served {
        let Some(job) = config.jobs.get(*name) else {
            continue;
        };
        let items = job.items();
        let fits = (items as f64 * f).floor() as u64;
        let share = schedule::share(fits, items);
        if fits == 0 {
            out.push_str(&format!(
                "  job {name}: not one of its {items} item(s) fits a tick at worst: items are served only when other ticks leave units\n"
            ));
            continue;
        }
        out.push_str(&format!(
            "  job {name}: {fits} of {items} item(s) fit per tick at worst: each item's share is {:.0}% of ticks (served at least once every {} ticks)\n",
            share * 100.0,
            items.div_ceil(fits)
        ));
        if items <= SHARE_ITEMS && job.fan_out_from.is_none() {
            let Ok(mut all) = TickItems::read(job) else {
                continue;
            };
            let Ok(iter) = all.from(0) else { continue };
            for (_, item) in iter.map_while(Result::ok) {
                out.push_str(&format!(
                    "    item {}: {:.0}% of ticks\n",
                    crate::queue::item_key(&item),
                    share * 100.0
                ));
            }
        }
    }
    out
}
