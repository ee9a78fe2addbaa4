//! `quota-worker check`: validates the config, jobs and secrets (exit 78 when
//! invalid), then shows each job's next fire times and worst-case cost, and
//! per window the worst-case units the jobs can spend against its limit,
//! warning when they cannot fit and when the quota would run out.

use chrono::{DateTime, Utc};

use super::Exit;
use crate::config::{Config, Job, Scope, fmt_duration};
use crate::schedule;

/// Runs the command at `now`.
pub fn run(config: &Config, now: DateTime<Utc>) -> Exit {
    if let Err(errors) = config.secrets() {
        for e in &errors.0 {
            eprintln!("error: {e}");
        }
        eprintln!(
            "{}: secrets missing; nothing was run",
            config.path.display()
        );
        return Exit::Config;
    }
    print!("{}", report(config, now).0);
    Exit::Ok
}

/// The report, and how many warnings it has.
pub(crate) fn report(config: &Config, now: DateTime<Utc>) -> (String, usize) {
    let mut out = String::new();
    let mut warnings = Vec::new();
    out.push_str(&format!(
        "{}: valid ({} credential(s), {} endpoint(s), {} job(s))\n",
        config.path.display(),
        config.credentials.len(),
        config.endpoints.len(),
        config.jobs.len()
    ));

    for job in config.jobs.values() {
        let ep = &config.endpoints[&job.endpoint];
        out.push_str(&format!(
            "\njob {} ({}): endpoint {}, {} task(s) per tick, worst case {} units per run ({} item(s) x {} page(s) x {} unit(s))\n",
            job.name,
            job.file.display(),
            ep.name,
            job.items(),
            schedule::worst_per_run(config, job),
            job.items(),
            job.max_pages(),
            ep.cost
        ));
        let next: Vec<String> = schedule::next_fires(job, now, 3)
            .iter()
            .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .collect();
        out.push_str(&format!(
            "  next: {} ({} {})\n",
            if next.is_empty() {
                "never".into()
            } else {
                next.join(", ")
            },
            job.schedule.source(),
            job.timezone
        ));
    }

    for cred in config.credentials.values() {
        out.push_str(&format!("\ncredential {}\n", cred.name));
        let cred_jobs: Vec<&Job> = config
            .jobs
            .values()
            .filter(|j| config.endpoints[&j.endpoint].credential == cred.name)
            .collect();
        let mut rows: Vec<(Scope, &crate::config::Window, Vec<&Job>)> = cred
            .windows
            .iter()
            .map(|w| (Scope::Credential, w, cred_jobs.clone()))
            .collect();
        for ep in config
            .endpoints
            .values()
            .filter(|e| e.credential == cred.name)
        {
            let jobs: Vec<&Job> = cred_jobs
                .iter()
                .copied()
                .filter(|j| j.endpoint == ep.name)
                .collect();
            for w in &ep.windows {
                rows.push((Scope::Endpoint(ep.name.clone()), w, jobs.clone()));
            }
        }
        let scope_w = rows
            .iter()
            .map(|r| r.0.to_string().len())
            .max()
            .unwrap_or(0);
        let win_w = rows.iter().map(|r| r.1.describe().len()).max().unwrap_or(0);
        for (scope, w, jobs) in rows {
            let worst: u64 = jobs
                .iter()
                .map(|j| {
                    schedule::worst_ticks(j, w.per, now)
                        .saturating_mul(schedule::worst_per_run(config, j))
                })
                .fold(0, u64::saturating_add);
            let pct = worst as f64 * 100.0 / w.units.get() as f64;
            let verdict = if worst > w.units.get() {
                "DOES NOT FIT"
            } else {
                "fits"
            };
            out.push_str(&format!(
                "  {:<scope_w$}  {:<win_w$}  worst case {worst:>9} units per {:<6} {pct:>6.1}%  {verdict}\n",
                scope.to_string(),
                w.describe(),
                fmt_duration(w.per)
            ));
            if worst > w.units.get() {
                let mut msg = format!(
                    "credential {} {scope} window {}: the jobs can spend up to {worst} units per {}, more than its {}",
                    cred.name,
                    w.describe(),
                    fmt_duration(w.per),
                    w.units
                );
                if let Some((at, job)) = schedule::exhausted_at(config, &jobs, w, now) {
                    msg.push_str(&format!(
                        "; starting from an empty window, it runs out at {} (a tick of job {}), and later tasks end as quota_exhausted",
                        at.format("%Y-%m-%d %H:%M UTC"),
                        job.name
                    ));
                }
                warnings.push(msg);
            }
        }
    }
    for w in &warnings {
        out.push_str(&format!("\nwarning: {w}\n"));
    }
    (out, warnings.len())
}
