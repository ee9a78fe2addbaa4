//! The pages of one task's run, one step at a time. A step spends for one
//! page, fetches it and turns the upstream's answer into a [`Step`]: go on
//! with the next page, or end with an [`Outcome`].
//!
//! Each kind of answer ([`Reply`]) is one short arm of [`Worker::answer`]; a
//! new kind is one more arm there, ending the task through one of the
//! helpers below (`fail`, `retry`, `wait_for_quota`) or going on with the
//! next page.
//!
//! Where the next page is comes from the answer (`fetch` reads it, by the
//! job's pagination style, before the body is scrubbed) or, for
//! `style = "page"`, from counting. A run is complete when no page is left:
//! only then do `{since}` and the validators move on ([`Worker::complete`]);
//! a run that stops at `max_pages` with `continue = true` keeps its
//! checkpoint for the item's next run instead.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::AsyncCommands;
use serde_json::Value;

use super::lock::Found;
use super::spend::{Admission, Applied, FirstSpendSlot, Spent};
use super::{CHECKPOINT_TTL, Checkpoint, ITEM_STATE_TTL, TaskError, Worker};
use crate::config::{Endpoint, Job, OnQuotaExhausted, PageStyle, Secret, fmt_duration};
use crate::fetch::{Answered, BuildError, Fetcher, PageAt, Placeholders, Reply, Request};
use crate::outcome::{Outcome, OutcomeKind};
use crate::paging::{Next, Stored, Validators};
use crate::queue::{Origin, QueueError, TaskArgs};
use crate::quota::QuotaError;
use crate::sink::SinkError;
use crate::stats::Stats;

/// Where a run is: its checkpoint's key and tick, the next page, and what
/// it has done so far.
pub(super) struct Progress {
    cursor_key: String,
    tick: i64,
    pub(super) page: u32,
    /// The cursor or next URL for `page`, in stored form.
    token: Option<Stored>,
    /// The page this run started at (`Checkpoint::first`).
    first: u32,
    /// The run's `{since}` and its start, epoch s (`Checkpoint`).
    since: i64,
    started: i64,
    /// Page 1's validators, stored when the run is complete.
    held: Option<Validators>,
    /// A same-origin redirect the upstream answered this page with: the
    /// page's next request, spent like any other (`fetch::MAX_REDIRECTS`).
    redirect: Option<Box<Request>>,
    pages: u32,
    records: u64,
    pub(super) units: u64,
}

impl Progress {
    /// An outcome that reports what the run did.
    fn outcome(&self, kind: OutcomeKind, detail: impl Into<String>) -> Outcome {
        Outcome {
            pages: self.pages,
            records: self.records,
            units: self.units,
            ..Outcome::new(kind, self.page, detail)
        }
    }
}

/// What one page step leads to.
enum Step {
    /// Go on with the next page.
    Next(Progress),
    /// The task ends.
    End(Outcome),
}

/// What every page of one task's run shares.
pub(super) struct Run<'a> {
    pub(super) task: &'a TaskArgs,
    pub(super) job: &'a Job,
    pub(super) endpoint: &'a Endpoint,
    /// The credential spent, as `quota` names it: the endpoint's, or for a
    /// template credential this item's tenant (`ig[account=123]`).
    pub(super) credential: String,
    /// A template credential's tenant: the item's value of its placeholder.
    pub(super) tenant: Option<String>,
    secret: Secret,
    /// The fetcher, scrubbing this run's secret too (a tenant's is not
    /// among the secrets read at start).
    fetcher: Fetcher,
    max_pages: u32,
    /// `continue = true`.
    continues: bool,
    /// The validators of the item's last complete run, sent with page 1.
    validators: Option<Validators>,
    /// Where a complete run leaves its start and its page 1's validators.
    since_key: String,
    validators_key: String,
    /// The first page's spend, if it rode in the item claim's call.
    pub(super) first_spend: &'a FirstSpendSlot,
}

impl Run<'_> {
    /// The last page this run may fetch: `max_pages` from the page it
    /// started at.
    fn last_page(&self, p: &Progress) -> u32 {
        p.first.saturating_add(self.max_pages - 1)
    }
}

/// What a fetched page says comes after it.
enum Onward {
    /// Nothing: the run is complete.
    Last,
    /// Another page, with the cursor or next URL that asks for it (none
    /// for `style = "page"`, which counts).
    To(Option<Stored>),
}

/// What comes after a fetched page, by the job's style: `style = "page"`
/// ends at the first page with no records (`on_page`: records the page
/// held, not how many the sink stored, which is 0 for a page a keyed SQLite
/// sink already holds newer copies of), the others where the answer names
/// no next page. `Err` is a bad response.
fn onward(job: &Job, next: Next, on_page: usize) -> Result<Onward, String> {
    match (job.pagination.as_ref().map(|p| &p.style), next) {
        (Some(PageStyle::Page { .. }), _) if on_page == 0 => Ok(Onward::Last),
        (Some(PageStyle::Page { .. }), _) => Ok(Onward::To(None)),
        (None, _) | (Some(_), Next::End) => Ok(Onward::Last),
        (Some(_), Next::At(token)) => Ok(Onward::To(Some(token))),
        (Some(_), Next::Bad(why)) => Err(why),
    }
}

/// Where this run starts, or why it does not run at all (it is superseded).
///
/// A fresh task resumes any interrupted run of its item (and takes it over);
/// a continuation (retry, deferral) resumes only its own tick's run. A copy
/// of an older tick's task (redelivered after an incident, or long queued)
/// whose item a run of this tick or a newer one already completed does not
/// run: fetching it again would spend quota on older data.
fn start_at(
    task: &TaskArgs,
    saved: Option<Checkpoint>,
    ran: Option<i64>,
) -> Result<Checkpoint, &'static str> {
    let own_run = saved.as_ref().is_some_and(|cp| cp.tick == task.tick);
    if ran.is_some_and(|r| r >= task.tick) && !own_run {
        return Err("a run of this or a newer tick already completed this item");
    }
    match (task.continuation, saved) {
        (false, Some(cp)) => Ok(cp),
        (false, None) => Ok(Checkpoint {
            tick: task.tick,
            page: 1,
            token: None,
            first: 1,
            since: None,
            started: None,
            validators: None,
        }),
        (true, Some(cp)) if cp.tick == task.tick => Ok(cp),
        (true, _) => Err("a newer tick's task took over this item's run"),
    }
}

impl Worker {
    /// Runs the task's pages while it holds its item, and records the outcome.
    pub(super) async fn run_held(
        &self,
        task: &TaskArgs,
        job: &Job,
        found: Found,
        first_spend: &FirstSpendSlot,
    ) -> Result<Outcome, TaskError> {
        let item = task.item_key();
        if let Some(why) = found.unreadable {
            // The item's state stays as it is, for an operator to look at
            // (or for the daemon version that wrote it); nothing is sent.
            let why = format!(
                "{why}; nothing fetched, the item's state in Redis is left as it is (delete it to start the item's run over)"
            );
            let outcome = Outcome::new(OutcomeKind::Failed, 0, why);
            self.refund_untaken(first_spend).await;
            self.finish(task, Some(job), &outcome).await?;
            return Ok(outcome);
        }
        let ran = found.ran;
        let start = match start_at(task, found.saved, ran) {
            Ok(start) => start,
            Err(why) => {
                let outcome = Outcome::new(OutcomeKind::Superseded, 0, why);
                self.refund_untaken(first_spend).await;
                self.finish(task, Some(job), &outcome).await?;
                return Ok(outcome);
            }
        };
        let endpoint = &self.config.endpoints[&job.endpoint];
        let cred = &self.config.credentials[&endpoint.credential];
        let (credential, tenant, secret, fetcher) = match &cred.template {
            None => (
                cred.name.clone(),
                None,
                self.secrets
                    .get(&cred.name)
                    .cloned()
                    .unwrap_or_else(|| Secret::new("")),
                self.fetcher.clone(),
            ),
            Some(placeholder) => {
                // Config validation makes every item of the job fill it.
                let value = task.value_of(placeholder);
                let name = cred.tenant(value).unwrap_or_default();
                // Read once per task: the claim's spend read it already.
                let secret =
                    (first_spend.tenant_secret()).map_or_else(|| cred.tenant_secret(value), Ok);
                match secret {
                    Ok(secret) => {
                        let fetcher = self.fetcher.with_secret(&secret);
                        (name, Some(value.to_owned()), secret, fetcher)
                    }
                    Err(e) => {
                        // This item only: its checkpoint stays, so the run
                        // resumes once its token file is there.
                        let why = format!("no secret for {name}: {e}");
                        let outcome = Outcome::new(OutcomeKind::Failed, start.page, why);
                        self.refund_untaken(first_spend).await;
                        self.finish(task, Some(job), &outcome).await?;
                        return Ok(outcome);
                    }
                }
            }
        };
        let run = Run {
            task,
            job,
            endpoint,
            credential,
            tenant,
            secret,
            fetcher,
            max_pages: job.max_pages(),
            continues: job.pagination.as_ref().is_some_and(|p| p.continues),
            validators: found.validators.filter(|_| endpoint.conditional),
            since_key: self.keys().since(&job.name, &item),
            validators_key: self.keys().validators(&job.name, &item),
            first_spend,
        };
        // A resumed or continued run keeps the `{since}` it started with.
        let initial = i64::try_from(job.since_initial.as_secs()).unwrap_or(i64::MAX);
        let since = (start.since.or(found.since)).unwrap_or(found.now.saturating_sub(initial));
        let mut p = Progress {
            cursor_key: self.keys().cursor(&job.name, &item),
            tick: task.tick,
            page: start.page,
            token: start.token,
            first: start.first,
            since,
            started: start.started.unwrap_or(found.now),
            held: start.validators,
            redirect: None,
            pages: 0,
            records: 0,
            units: 0,
        };
        let outcome = loop {
            match self.step(&run, p).await? {
                Step::Next(next) => p = next,
                Step::End(outcome) => break outcome,
            }
        };
        if outcome.kind == OutcomeKind::Done && ran.is_none_or(|r| r < task.tick) {
            let ran_key = self.keys().item_ran(&job.name, &item);
            self.conn
                .clone()
                .set_ex::<_, _, ()>(&ran_key, task.tick, CHECKPOINT_TTL.as_secs())
                .await?;
        }
        // A first spend no page took is given back before the outcome is
        // told: whoever reads the windows after it sees what was sent.
        self.refund_untaken(first_spend).await;
        self.finish(task, Some(job), &outcome).await?;
        Ok(outcome)
    }

    /// One page (or one hop of a page's redirect): build the request,
    /// spend, send, and what the answer leads to.
    async fn step(&self, run: &Run<'_>, mut p: Progress) -> Result<Step, TaskError> {
        if p.page > run.last_page(&p) {
            // A checkpoint past max_pages (lowered since): the run is complete.
            return Ok(Step::End(
                self.complete(run, &p, "max_pages reached").await?,
            ));
        }
        // Built before the spend: a request that cannot be built (a control
        // character in an item, an unsendable header, a next page on another
        // origin) is never sent, so nothing is spent for it.
        let now = Utc::now();
        let request = match p.redirect.take() {
            Some(next) => *next,
            None => match self.build(run, &p, now) {
                Ok(r) => r,
                Err(e) => {
                    let why = format!("request not sent: {e}");
                    return Ok(Step::End(self.fail(&p, None, &why).await?));
                }
            },
        };
        // A sink that could take no page here, not even into the spool,
        // gets no page fetched for it until it can (sink.rs).
        if let Err(e) = self.sinks.ready(run.job, &run.task.item, now).await {
            return Ok(Step::End(self.sink_stuck(&p, &e).await?));
        }
        let spent = match self.spend(run, &p).await? {
            Admission::Spent(spent) => spent,
            Admission::Refused(outcome) => return Ok(Step::End(outcome)),
        };
        let cost = run.endpoint.cost.get();
        p.units += cost;
        Stats::add(&self.stats.units, cost);

        let Answered { reply, verdict } = run.fetcher.send(run.endpoint, &request).await;
        let blocked = (self.account(run, &spent, &reply, verdict, &mut p)).await;
        self.answer(run, p, &spent, reply, blocked, now).await
    }

    /// The request for the run's next page: its cursor or next URL, or its
    /// number; page 1 conditional on the last complete run's validators.
    fn build(
        &self,
        run: &Run<'_>,
        p: &Progress,
        now: DateTime<Utc>,
    ) -> Result<Request, BuildError> {
        let since = DateTime::from_timestamp(p.since, 0).unwrap_or(now);
        let ph = Placeholders::new(run.job, &run.task.item, &run.secret, now, since);
        let at = match &p.token {
            Some(token) => PageAt::After(token),
            None => PageAt::Number(p.page),
        };
        let request = run.fetcher.request(run.job, &ph, at)?;
        Ok(match &run.validators {
            Some(v) if p.page == 1 => request.conditional(v),
            _ => request,
        })
    }

    /// What an upstream answer leads to: one arm per kind of answer
    /// (`blocked`: the block its accounting asked for, already applied).
    async fn answer(
        &self,
        run: &Run<'_>,
        mut p: Progress,
        spent: &Spent,
        reply: Reply,
        blocked: Option<Applied>,
        now: DateTime<Utc>,
    ) -> Result<Step, TaskError> {
        let end = match reply {
            Reply::Ok {
                body,
                next,
                validators,
                ..
            } => {
                if p.page == 1 && run.endpoint.conditional {
                    p.held = Some(validators).filter(|v| !v.is_empty());
                }
                return self.page_fetched(run, p, &body, next, now).await;
            }
            // Nothing changed since the item's last complete run: this run
            // is complete too, with nothing written; its validators stay.
            Reply::NotModified { status, .. } => {
                p.held = run.validators.clone();
                let why = "not modified: the upstream answered 304 to the conditional request";
                let mut o = self.complete(run, &p, why).await?;
                o.status = Some(status);
                o.not_modified = true;
                o
            }
            Reply::Throttled { status } => self.throttled(run, &p, status, blocked).await?,
            Reply::Unreached { detail } => {
                self.refund(run.endpoint, spent, &mut p).await;
                let why = format!("upstream unreachable (units refunded): {detail}");
                self.retry(run, &p, None, &why).await?
            }
            Reply::TimedOut { detail } => {
                let why = format!("no complete answer: {detail}");
                self.retry(run, &p, None, &why).await?
            }
            // Its units are kept (it may have been charged) unless the
            // upstream said what it charged (settled in `account`).
            Reply::ServerError { status, .. } => {
                let why = format!("upstream answered {status}");
                self.retry(run, &p, Some(status), &why).await?
            }
            Reply::ClientError { status, detail, .. } => {
                let why = format!("upstream answered {status}: {detail}");
                self.fail(&p, Some(status), &why).await?
            }
            Reply::BadBody { status, detail } => {
                let why = format!("bad response: {detail}");
                self.fail(&p, Some(status), &why).await?
            }
            // An answer: this hop's units stay spent; the next hop is spent
            // by the next step, for the same page.
            Reply::Redirect { next, .. } => {
                p.redirect = Some(next);
                return Ok(Step::Next(p));
            }
            Reply::RedirectRefused { status, why, .. } => self.fail(&p, Some(status), &why).await?,
            Reply::TooLarge { status, limit, .. } => {
                let why = format!(
                    "response body over max_body {}; reading stopped there",
                    crate::fetch::fmt_size(limit)
                );
                self.fail(&p, Some(status), &why).await?
            }
            Reply::Unsent { detail } => {
                self.refund(run.endpoint, spent, &mut p).await;
                let why = format!("request not sent (units refunded): {detail}");
                self.fail(&p, None, &why).await?
            }
        };
        Ok(Step::End(end))
    }

    /// A page came back: write the records, then the next page or the end.
    async fn page_fetched(
        &self,
        run: &Run<'_>,
        mut p: Progress,
        body: &Value,
        next: Next,
        now: DateTime<Utc>,
    ) -> Result<Step, TaskError> {
        let written = match self.sinks.write(run.job, &run.task.item, body, now).await {
            Ok(w) => w,
            Err(e) if e.is_bad_response() => {
                let why = format!("bad response: {e}");
                return Ok(Step::End(self.fail(&p, Some(200), &why).await?));
            }
            // Neither written nor spooled: fetching it again now would only
            // spend again, so the run waits for an operator.
            Err(e) => return Ok(Step::End(self.sink_stuck(&p, &e).await?)),
        };
        p.records += written.stored as u64;
        Stats::add(&self.stats.records, written.stored as u64);
        p.pages += 1;
        Stats::add(&self.stats.pages, 1);
        let end = match onward(run.job, next, written.on_page) {
            Err(why) => {
                self.fail(&p, Some(200), &format!("bad response: {why}"))
                    .await?
            }
            Ok(Onward::Last) => self.complete(run, &p, "all pages fetched").await?,
            Ok(Onward::To(token)) if token.is_some() && token == p.token => {
                // The same page again, for ever: each one spent.
                let why = "cursor repeated: the upstream pointed at the page it just answered";
                self.fail(&p, Some(200), why).await?
            }
            Ok(Onward::To(token)) if p.page < run.last_page(&p) => {
                p.page += 1;
                p.token = token;
                self.save(&p).await?;
                return Ok(Step::Next(p));
            }
            Ok(Onward::To(token)) if run.continues => {
                // This run is done; the item's next one goes on from here.
                let mut o = p.outcome(OutcomeKind::Done, "");
                p.page += 1;
                p.first = p.page;
                p.token = token;
                self.save(&p).await?;
                o.detail = format!(
                    "max_pages reached; the item's next run goes on at page {}",
                    p.page
                );
                o
            }
            Ok(Onward::To(_)) => self.complete(run, &p, "max_pages reached").await?,
        };
        Ok(Step::End(end))
    }

    /// The upstream refused this request: its accounting blocked the
    /// credential for every spender (`blocked`), so end as a quota's "no"
    /// does.
    async fn throttled(
        &self,
        run: &Run<'_>,
        p: &Progress,
        status: u16,
        blocked: Option<Applied>,
    ) -> Result<Outcome, TaskError> {
        // A refusal always comes with a block (`accounting::Verdict`); if
        // one ever does not, the task still waits `throttle_block`.
        let (wait, why) = match blocked {
            Some(b) => {
                let said = b.detail.map(|d| format!(" ({d})")).unwrap_or_default();
                let why = format!(
                    "upstream answered {status}{said}; credential blocked for {} ({})",
                    fmt_duration(b.blocked),
                    b.reason
                );
                (b.blocked, why)
            }
            None => {
                let wait = run.endpoint.throttle_block;
                (
                    wait,
                    format!("upstream answered {status}; waiting {}", fmt_duration(wait)),
                )
            }
        };
        let kind = OutcomeKind::UpstreamThrottled;
        let mut o = self.wait_for_quota(run, p, kind, wait, &why).await?;
        o.status = Some(status);
        Ok(o)
    }

    /// The run is complete: its checkpoint goes, and what the item's next
    /// run needs stays: when this run started (its `{since}`) and, on a
    /// conditional endpoint, page 1's validators (or none, if it had none).
    async fn complete(&self, run: &Run<'_>, p: &Progress, why: &str) -> Result<Outcome, TaskError> {
        let ttl = ITEM_STATE_TTL.as_secs();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .del(&p.cursor_key)
            .ignore()
            .set_ex(&run.since_key, p.started, ttl)
            .ignore();
        if run.endpoint.conditional {
            match &p.held {
                Some(v) => {
                    let json = serde_json::to_string(v).map_err(QueueError::from)?;
                    pipe.set_ex(&run.validators_key, json, ttl).ignore()
                }
                None => pipe.del(&run.validators_key).ignore(),
            };
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await?;
        Ok(p.outcome(OutcomeKind::Done, why))
    }

    /// A failure the response itself caused (a 4xx such as a stale page
    /// token, a body that does not decode): retrying would repeat it, so the
    /// checkpoint goes and the next run starts over.
    async fn fail(
        &self,
        p: &Progress,
        status: Option<u16>,
        why: &str,
    ) -> Result<Outcome, TaskError> {
        self.conn.clone().del::<_, ()>(&p.cursor_key).await?;
        let mut o = p.outcome(OutcomeKind::Failed, why);
        o.status = status;
        Ok(o)
    }

    /// The sink can take no page (not even into the spool): end `failed`
    /// with the checkpoint kept at this page, so it is fetched again only
    /// once the sink or the spool can be written, never retried before.
    async fn sink_stuck(&self, p: &Progress, e: &SinkError) -> Result<Outcome, TaskError> {
        self.save(p).await?;
        let why = format!(
            "sink: {e}; nothing more is fetched for this job here until its sink or spool can be written, then the item resumes at page {}",
            p.page
        );
        Ok(p.outcome(OutcomeKind::Failed, why))
    }

    /// Checkpoints the run: the next run of the item resumes at `p.page`.
    async fn save(&self, p: &Progress) -> Result<(), TaskError> {
        let cp = Checkpoint {
            tick: p.tick,
            page: p.page,
            token: p.token.clone(),
            first: p.first,
            since: Some(p.since),
            started: Some(p.started),
            validators: p.held.clone(),
        };
        let json = serde_json::to_string(&cp).map_err(QueueError::from)?;
        self.conn
            .clone()
            .set_ex::<_, _, ()>(&p.cursor_key, json, CHECKPOINT_TTL.as_secs())
            .await?;
        Ok(())
    }

    /// The quota (ours, or the upstream's) says wait `wait`: keep the
    /// checkpoint and end now; with `on_quota_exhausted = "defer"`, queue a
    /// copy for when it frees. Never sleeps, never counts as a failure.
    pub(super) async fn wait_for_quota(
        &self,
        run: &Run<'_>,
        p: &Progress,
        kind: OutcomeKind,
        wait: Duration,
        why: &str,
    ) -> Result<Outcome, TaskError> {
        self.save(p).await?;
        let mut o = p.outcome(kind, why);
        o.retry_after = Some(wait);
        if run.job.on_quota_exhausted == OnQuotaExhausted::Defer {
            o.requeued_in = Some(wait);
            self.queue
                .enqueue(&[(run.task.again(Origin::Defer), wait)])
                .await?;
        }
        Ok(o)
    }

    /// A real failure: queue a retry with backoff, or fail when the attempts
    /// are used up. Either way the checkpoint stays, so the next run resumes.
    async fn retry(
        &self,
        run: &Run<'_>,
        p: &Progress,
        status: Option<u16>,
        why: &str,
    ) -> Result<Outcome, TaskError> {
        self.save(p).await?;
        let failures = run.task.failures + 1;
        let attempts = run.job.retry.attempts;
        if failures >= attempts.get() {
            let why = format!("{why}; attempts used up ({failures} of {attempts})");
            let mut o = p.outcome(OutcomeKind::Failed, why);
            o.status = status;
            return Ok(o);
        }
        let wait = run.job.retry.backoff_for(failures);
        self.queue
            .enqueue(&[(run.task.again(Origin::Retry), wait)])
            .await?;
        let why = format!(
            "{why}; attempt {} of {attempts} in {}",
            failures + 1,
            fmt_duration(wait)
        );
        let mut o = p.outcome(OutcomeKind::Retrying, why);
        o.status = status;
        o.requeued_in = Some(wait);
        Ok(o)
    }

    /// Redis could not answer the spend and the endpoint is fail-closed: come
    /// back later, without counting it as a failure.
    pub(super) async fn limiter_down(
        &self,
        run: &Run<'_>,
        p: &Progress,
        e: &QuotaError,
    ) -> Result<Outcome, TaskError> {
        self.save(p).await?;
        let wait = Duration::from_secs(5);
        self.queue
            .enqueue(&[(run.task.again(Origin::Defer), wait)])
            .await?;
        let why = format!("limiter unavailable ({e}); endpoint is fail-closed, nothing sent");
        let mut o = p.outcome(OutcomeKind::Retrying, why);
        o.requeued_in = Some(wait);
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tick: i64, continuation: bool) -> TaskArgs {
        let t = TaskArgs::first("j", tick, 0, vec![], crate::queue::Origin::Tick);
        if continuation {
            t.again(Origin::Retry)
        } else {
            t
        }
    }

    fn cp(tick: i64, page: u32) -> Checkpoint {
        Checkpoint {
            tick,
            page,
            token: Some(Stored::new(format!("t{page}"))),
            first: 1,
            since: None,
            started: None,
            validators: None,
        }
    }

    #[test]
    fn a_fresh_task_starts_at_page_1_or_takes_over_an_interrupted_run() {
        assert_eq!(
            start_at(&task(10, false), None, None).map(|c| c.page),
            Ok(1)
        );
        // An older tick's interrupted run is resumed where it stopped.
        assert_eq!(
            start_at(&task(10, false), Some(cp(5, 3)), Some(4)),
            Ok(cp(5, 3))
        );
    }

    #[test]
    fn a_continuation_resumes_only_its_own_run() {
        assert_eq!(
            start_at(&task(10, true), Some(cp(10, 2)), None),
            Ok(cp(10, 2))
        );
        assert!(start_at(&task(10, true), Some(cp(11, 2)), None).is_err());
        assert!(start_at(&task(10, true), None, None).is_err());
    }

    #[test]
    fn an_older_ticks_copy_of_a_completed_item_is_superseded() {
        assert!(start_at(&task(10, false), None, Some(10)).is_err());
        assert!(start_at(&task(10, false), None, Some(12)).is_err());
        assert!(start_at(&task(10, false), None, Some(9)).is_ok());
        // Its own run's checkpoint still wins (a redelivery mid-run).
        assert_eq!(
            start_at(&task(10, false), Some(cp(10, 2)), Some(10)),
            Ok(cp(10, 2))
        );
    }
}
