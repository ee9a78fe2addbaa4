//! `quota-worker spool list [JOB] [--json]` and `quota-worker spool retry
//! JOB`: the pages a sink refused for good (issue 37), kept under
//! `<state_dir>/spool/%rejected/<job>/` with their error beside them, each
//! holding its item (or job) so that no tick spends units to fetch it again.
//! `list` shows them; `retry` writes them again once, with the job's sink
//! as now configured (after the cause is fixed: a column's type put back, a
//! trigger dropped), and lifts their hold whatever comes of it. Neither
//! needs Redis or the daemon: they read and write the state directory and
//! the sink, on the host whose state directory it is.

use serde_json::json;

use super::{Exit, out, outln};
use crate::config::Config;
use crate::sink::{self, KeptPage, RetryOutcome, Scope, Sinks};

/// `spool list [JOB]`.
pub fn list(config: &Config, job: Option<&str>, as_json: bool) -> Exit {
    let spool = sink::spool_dir(config);
    let pages = match sink::rejected_pages(&spool, job) {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "error: cannot read {}: {e}",
                spool.join("%rejected").display()
            );
            return Exit::IoErr;
        }
    };
    if let Some(j) = job
        && pages.is_empty()
        && !config.jobs.contains_key(j)
    {
        return unknown_job(config, j);
    }
    if as_json {
        outln!("{}", json!({ "pages": pages }));
        return Exit::Ok;
    }
    if pages.is_empty() {
        outln!(
            "no page refused for good{} (nothing under {})",
            job.map(|j| format!(" for job {j}")).unwrap_or_default(),
            spool.join("%rejected").display()
        );
        return Exit::Ok;
    }
    for p in &pages {
        out!("{}", as_text(p));
    }
    let jobs: std::collections::BTreeSet<&str> = pages.iter().map(|p| p.job.as_str()).collect();
    outln!(
        "{} page(s) refused for good; after fixing the cause, write them again with `quota-worker spool retry {}`",
        pages.len(),
        match jobs.len() {
            1 => jobs.first().copied().unwrap_or("JOB"),
            _ => "JOB",
        }
    );
    Exit::Ok
}

/// One kept page, as `list` prints it.
fn as_text(p: &KeptPage) -> String {
    let which = match (p.page, p.tick) {
        (Some(page), Some(tick)) => format!(
            "page {page} of the run of {}",
            chrono::DateTime::from_timestamp_millis(tick)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| tick.to_string())
        ),
        _ => "a page".to_owned(),
    };
    let hold = match (p.held, p.scope) {
        (false, _) => "holds nothing now (a `spool retry` lifted its hold)",
        (true, Scope::Item) => "holds its item",
        (true, Scope::Job) => "holds its whole job",
    };
    format!(
        "{job}  {item}  {which}, fetched {fetched}, {records} record(s)\n  refused {at}: {error}\n  {hold}; kept in {file}\n",
        job = p.job,
        item = p.item,
        fetched = p.fetched_at,
        records = p.records,
        at = p.rejected_at,
        error = p.error,
        file = p.file.display(),
    )
}

/// `spool retry JOB`: exit 0 when every kept page was written (or there
/// was none), 1 when the sink still refuses one, 75 when it could not take
/// one now (down, full: try again), 64 for an unknown job.
pub async fn retry(config: &Config, job: &str) -> Exit {
    let Some(job) = config.jobs.get(job) else {
        return unknown_job(config, job);
    };
    let sinks = Sinks::for_command(config);
    let done = match sinks.retry_rejected(job).await {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::IoErr;
        }
    };
    if done.is_empty() {
        outln!(
            "no page of job {} is kept as refused: nothing to write",
            job.name
        );
        return Exit::Ok;
    }
    let (mut written, mut refused, mut not_now) = (0, 0, 0);
    for r in &done {
        let file = r.file.display();
        match &r.outcome {
            RetryOutcome::Written(rows) => {
                written += 1;
                outln!("written  {}  {rows} row(s); removed {file}", r.item);
            }
            RetryOutcome::Refused(why) => {
                refused += 1;
                outln!(
                    "refused  {}  still: {why}\n  kept in {file}; its hold is lifted: the item's next run fetches that page again",
                    r.item
                );
            }
            RetryOutcome::NotNow(why) => {
                not_now += 1;
                outln!(
                    "not now  {}  the sink cannot take it now: {why}\n  kept in {file}; try again",
                    r.item
                );
            }
            RetryOutcome::Busy => {
                not_now += 1;
                outln!("busy     {file}: another process holds it (a `spool retry` running?)");
            }
        }
    }
    outln!(
        "{written} of {} page(s) written; {refused} still refused; {not_now} not written now",
        done.len()
    );
    if refused > 0 {
        Exit::Failed
    } else if not_now > 0 {
        Exit::TempFail
    } else {
        Exit::Ok
    }
}

fn unknown_job(config: &Config, job: &str) -> Exit {
    let known: Vec<&str> = config.jobs.keys().map(String::as_str).collect();
    eprintln!(
        "error: unknown job {job:?}; known jobs: {}",
        if known.is_empty() {
            "(none configured)".to_owned()
        } else {
            known.join(", ")
        }
    );
    Exit::Usage
}
