//! The tenants of a template credential as `check` sees them: the values
//! of its placeholder in the items of the jobs charged to it, and which
//! have a token file.

use std::collections::{BTreeSet, HashMap};

use crate::config::{Config, Credential, Job};
use crate::schedule::TickItems;

/// The tenants of a template credential that `check` can see: the values
/// of its placeholder in the items of the jobs charged to it (their
/// `fan_out` lists and `fan_out_from` rows, read now), and which of them
/// have a token file.
pub(super) struct Tenants {
    /// Distinct values seen, at most [`TENANTS_READ`] of them.
    pub(super) values: BTreeSet<String>,
    /// Whether there were more.
    pub(super) more: bool,
    /// Per job: the most items one tenant has in it, and its items.
    pub(super) busiest: HashMap<String, (u64, u64)>,
}

/// Distinct tenant values `check` reads at most, all jobs together.
const TENANTS_READ: usize = 100_000;
/// Tenants without a token file `check` names at most.
const MISSING_SHOWN: usize = 5;

impl Tenants {
    /// Reads the items of every job charged to template `cred`.
    pub(super) fn seen(config: &Config, cred: &Credential) -> Self {
        let placeholder = cred.template.as_deref().unwrap_or_default();
        let mut t = Tenants {
            values: BTreeSet::new(),
            more: false,
            busiest: HashMap::new(),
        };
        let jobs = (config.jobs.values())
            .filter(|j| config.endpoints[&j.endpoint].credential == cred.name);
        for job in jobs {
            let mut per_value: HashMap<String, u64> = HashMap::new();
            let Ok(mut items) = TickItems::read(job) else {
                continue; // fan_out_lines warns about it
            };
            let Ok(iter) = items.from(0) else { continue };
            for (_, item) in iter.flatten() {
                let Some((_, v)) = item.into_iter().find(|(k, _)| k == placeholder) else {
                    continue;
                };
                if t.values.len() < TENANTS_READ || t.values.contains(&v) {
                    t.values.insert(v.clone());
                } else {
                    t.more = true;
                }
                *per_value.entry(v).or_default() += 1;
            }
            let most = per_value.values().copied().max().unwrap_or(0);
            let all = per_value.values().sum();
            t.busiest.insert(job.name.clone(), (most, all));
        }
        t
    }

    /// `run` units of one run of `job`, scaled to its busiest tenant's items.
    pub(super) fn busiest_share(&self, job: &Job, run: u64) -> u64 {
        match self.busiest.get(&job.name) {
            Some(&(most, all)) if all > 0 => {
                (u128::from(run) * u128::from(most) / u128::from(all)) as u64
            }
            _ => run,
        }
    }

    /// Its line, and a warning naming tenants without a token file (or,
    /// minted by a command, tenants it would not run for).
    pub(super) fn report(&self, cred: &Credential) -> (String, Option<String>) {
        if cred.minted() {
            return self.report_minted(cred);
        }
        let placeholder = cred.template.as_deref().unwrap_or_default();
        let mut missing = Vec::new();
        let mut with_token = 0usize;
        for v in &self.values {
            match cred.tenant_secret(v) {
                Ok(_) => with_token += 1,
                Err(e) => missing.push(format!("{}: {e}", cred.tenant(v).unwrap_or_default())),
            }
        }
        let more = if self.more { "+" } else { "" };
        let line = format!(
            "  template on {{{placeholder}}}: {}{more} tenant(s) in the jobs' items now, {with_token} with a token file; each tenant has the windows below\n",
            self.values.len()
        );
        if missing.is_empty() {
            return (line, None);
        }
        let n = missing.len();
        missing.truncate(MISSING_SHOWN);
        let warning = format!(
            "credential {}: {n} tenant(s) have no token file, so their items' tasks end failed (\"no secret for ...\"): {}{}",
            cred.name,
            missing.join("; ").escape_debug(),
            if n > MISSING_SHOWN { "; ..." } else { "" }
        );
        (line, Some(warning))
    }
}

impl Tenants {
    /// [`Tenants::report`] for a template whose tokens `secret_command`
    /// mints, one run per tenant: there are no token files to look for
    /// (issue 37: `check` said "0 with a token file" and "the credential is
    /// not a template" while `run` minted for every tenant).
    pub(super) fn report_minted(&self, cred: &Credential) -> (String, Option<String>) {
        let placeholder = cred.template.as_deref().unwrap_or_default();
        let more = if self.more { "+" } else { "" };
        let line = format!(
            "  template on {{{placeholder}}}: {}{more} tenant(s) in the jobs' items now, each one's token minted by secret_command when a task needs it; each tenant has the windows below\n",
            self.values.len()
        );
        let refused: Vec<String> = (self.values.iter())
            .filter_map(|v| cred.command_refusal(v))
            .collect();
        if refused.is_empty() {
            return (line, None);
        }
        let n = refused.len();
        let warning = format!(
            "credential {}: {n} tenant(s) would reach secret_command as an option, so their items' tasks end failed: {}{}",
            cred.name,
            // Each names its value escaped ({:?}): nothing more to escape.
            refused[..n.min(MISSING_SHOWN)].join("; "),
            if n > MISSING_SHOWN { "; ..." } else { "" }
        );
        (line, Some(warning))
    }
}
