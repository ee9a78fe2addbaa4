//! A task's run over its item's pages, one step at a time: each step
//! gathers what happened ([`Answer`]: build the request, spend, send,
//! account, write) and carries out what [`decide`] makes of it
//! ([`Action`]: save the checkpoint, complete the run, retry, defer, fail).
//!
//! Where the next page is comes from the answer (`fetch` reads it, by the
//! job's pagination style, before the body is scrubbed) or, for
//! `style = "page"`, from counting. A run is complete when no page is left:
//! only then do `{since}` and the validators move on ([`Worker::complete`]);
//! a run that stops at `max_pages` with `continue = true` keeps its
//! checkpoint for the item's next run instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, Utc};
use tracing::warn;

use super::claim::Claimed;
use super::lock::ItemLock;
use super::spend::{Admission, FirstSpend, Payer, Spent};
use super::step::{Action, Answer, End, Rules, decide};
use super::{CHECKPOINT_TTL, Checkpoint, Held, ITEM_STATE_TTL, Ran, Skip, TaskError, Worker};
use crate::config::{Job, Secret};
use crate::fetch::paging::{Cursor, Stored, Validators};
use crate::fetch::{Answered, BuildError, Fetcher, PageAt, Placeholders, Request};
use crate::outcome::{Outcome, OutcomeKind};
use crate::queue::scripts::finish::{LastRun, Leaves};
use crate::queue::{Origin, TaskArgs};
use crate::sink::PageRef;
use crate::stats::Stats;

mod credential;

/// What every page of one task's run shares.
pub(super) struct Run<'a> {
    /// Whose windows its requests spend from.
    payer: Payer<'a>,
    /// The item's lock: a checkpoint is saved only while it holds.
    lock: &'a ItemLock,
    /// What `decide` reads of the job.
    rules: Rules<'a>,
    secret: Secret,
    /// The fetcher, scrubbing this run's secret too (a tenant's or a
    /// minted one is not among the secrets read at start).
    fetcher: Fetcher,
    /// A 401 made the credential's command mint a new token for this run
    /// already: another 401 fails the task.
    reminted: bool,
    /// Where the run's checkpoint is, and where a complete run leaves its
    /// start and its page 1's validators.
    cursor_key: String,
    since_key: String,
    validators_key: String,
    /// The worker of a config reloaded since the run began, if any: the
    /// run spends from its windows at its costs and sends with its secret
    /// (`credential::follow_reload`); the job (request, pagination, sink)
    /// stays the run's own.
    live: Option<Arc<Worker>>,
}

impl Run<'_> {
    fn task(&self) -> &TaskArgs {
        self.payer.task
    }

    fn job(&self) -> &Job {
        self.payer.job
    }
}

/// Where a run is, and what it has done so far: the run's alone. Only
/// its cursor is lent to [`decide`], by shared reference; the rest is
/// what this module's carrying out of actions writes.
struct Progress {
    /// The first page's spend, made in the item claim's call, until the
    /// first spend step takes it; the task's one exit refunds one no
    /// step took (`run::Worker::run_held`).
    first_spend: Option<FirstSpend>,
    /// Where the run is in its pages (`Checkpoint::cursor`).
    cursor: Cursor,
    /// The run's `{since}` and its start, epoch s (`Checkpoint`).
    since: i64,
    started: i64,
    /// The tick that began the run (`Checkpoint::run`): with the page
    /// number, the page's id in a postgres sink.
    run_tick: i64,
    /// Page 1's validators (`Checkpoint::validators`), stored for the
    /// item's next run when this one is complete.
    validators: Option<Validators>,
    /// A same-origin redirect the upstream answered this page with: the
    /// page's next request, spent like any other (`fetch::MAX_REDIRECTS`).
    redirect: Option<Box<Request>>,
    pages: u32,
    records: u64,
    units: u64,
    /// The item's cursor key may hold a checkpoint (the claim found one, or
    /// this run saved one): a complete run deletes it, a run that never
    /// had one skips the command.
    checkpointed: bool,
    /// What the run's end leaves of the item, written with its outcome.
    leaves: Leaves,
    /// Set when the item lock's renewal found the lock gone (`lock.rs`):
    /// the run stops before its next page.
    lock_lost: Arc<AtomicBool>,
}

impl Progress {
    /// A run that has done nothing yet, holding the claim's first spend.
    fn new(first_spend: Option<FirstSpend>, lock_lost: Arc<AtomicBool>) -> Self {
        Progress {
            first_spend,
            cursor: Cursor::start(),
            since: 0,
            started: 0,
            run_tick: 0,
            validators: None,
            redirect: None,
            pages: 0,
            records: 0,
            units: 0,
            checkpointed: false,
            leaves: Leaves::default(),
            lock_lost,
        }
    }

    /// An outcome that reports what the run did.
    fn outcome(&self, kind: OutcomeKind, detail: impl Into<String>) -> Outcome {
        Outcome {
            pages: self.pages,
            records: self.records,
            units: self.units,
            ..Outcome::new(kind, self.cursor.page, detail)
        }
    }

    /// Counts `change` units more (a spend, a settle) or fewer (a refund).
    fn add_units(&mut self, change: i64) {
        self.units = self.units.saturating_add_signed(change);
    }
}

/// What one step came to.
enum Stepped {
    /// Go on with the next step.
    Next,
    /// The task ends.
    End(Outcome),
    /// A 401, and the credential's command minted a new token: send the
    /// page again with it.
    Reminted(Secret),
}

/// What carrying out an [`Action`] came to.
enum Acted {
    /// The sink answered the page: decide on that.
    Answered(Answer),
    /// Go on with the next step.
    Continue,
    /// The task ends.
    End(Outcome),
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
            cursor: Cursor::start(),
            since: None,
            started: None,
            validators: None,
            run: None,
        }),
        (true, Some(cp)) if cp.tick == task.tick => Ok(cp),
        (true, _) => Err("a newer tick's task took over this item's run"),
    }
}

impl Worker {
    /// Runs the task's pages while it holds its item, and records the
    /// outcome. The one exit of a held task: a first spend (made in the
    /// claim's call) no page took is given back here, before the outcome
    /// is told (whoever reads the windows after it sees what was sent), and
    /// when the run ended on an error too.
    ///
    /// The outcome's call also frees the item and writes what the run
    /// leaves of it (`Progress::leaves`): one round trip, nothing a SIGKILL
    /// can land between. On `Err` (Redis failed) the item is not freed
    /// here: the caller tries that alone.
    pub(super) async fn run_held(
        &self,
        task: &TaskArgs,
        job: &Job,
        claimed: Claimed<'_>,
        held: Held<'_>,
    ) -> Result<Ran, TaskError> {
        let mut claimed = claimed;
        let mut p = Progress::new(claimed.first_spend.take(), held.renewer.lost_flag());
        let began = (claimed.found.now, std::time::Instant::now());
        let ended = self.run_pages(task, job, claimed, held.lock, &mut p).await;
        if let Some(unused) = p.first_spend.take() {
            self.refund_unsent(unused).await;
        }
        let outcome = ended?;
        if outcome.kind == OutcomeKind::Superseded && p.lock_lost.load(Ordering::Acquire) {
            let mut conn = self.lasting.conn.clone();
            let holder = held.lock.holder(&mut conn).await?;
            if holder.is_some_and(|h| h.task == task.id) {
                drop(held.renewer);
                warn!(
                    job = %job.name,
                    item = %task.item_key(),
                    task = %task.id,
                    pages = p.pages,
                    units = p.units,
                    "another delivery of this task holds the item (the queue handed it out again, and this one's lock was lost in a failover): this one steps aside, and the other records the task's end"
                );
                return Ok(Ran::Skipped(Skip::SteppedAside));
            }
        }
        let ran = began.1.elapsed().as_secs() as i64;
        let ended_at = began.0.saturating_add(ran);
        if let Some(last) = LastRun::of(task, &outcome, ended_at) {
            let json = serde_json::to_string(&last).map_err(TaskError::State)?;
            let key = self.keys().item_last(&job.name, &task.item_key());
            p.leaves.set.push((key, json, ITEM_STATE_TTL));
        }
        // A renewal after the release would find the lock gone and warn.
        drop(held.renewer);
        let end = held.lock.end(std::mem::take(&mut p.leaves));
        self.finish(task, Some(job), &outcome, Some(end)).await?;
        Ok(Ran::Ended(outcome))
    }

    /// The run: where it starts, whose quota it spends (`payer`), its pages.
    async fn run_pages(
        &self,
        task: &TaskArgs,
        job: &Job,
        claimed: Claimed<'_>,
        lock: &ItemLock,
        p: &mut Progress,
    ) -> Result<Outcome, TaskError> {
        let Claimed {
            found,
            payer,
            minted,
            ..
        } = claimed;
        if let Some(why) = found.unreadable {
            // The item's state stays as it is, for an operator to look at
            // (or for the daemon version that wrote it); nothing is sent.
            let why = format!(
                "{why}; nothing fetched, the item's state in Redis is left as it is (`quota-worker state reset` clears a checkpoint, {{since}} or validators, or delete the key, to start the item's run over)"
            );
            return Ok(Outcome::new(OutcomeKind::Failed, 0, why));
        }
        p.checkpointed = found.saved.is_some();
        let start = match start_at(task, found.saved, found.ran) {
            Ok(start) => start,
            Err(why) => return Ok(Outcome::new(OutcomeKind::Superseded, 0, why)),
        };
        let opened = payer.and_then(|payer| self.open(payer, lock, found.validators, p, minted));
        let mut run = match opened {
            Ok(run) => run,
            // This item only: its checkpoint stays, so the run resumes
            // once its token file is there (its command prints one).
            Err(why) => return Ok(Outcome::new(OutcomeKind::Failed, start.cursor.page, why)),
        };
        // A resumed or continued run keeps the `{since}` it started with.
        let initial = i64::try_from(job.since_initial.as_secs()).unwrap_or(i64::MAX);
        p.cursor = start.cursor;
        p.since = (start.since.or(found.since)).unwrap_or(found.now.saturating_sub(initial));
        p.started = start.started.unwrap_or(found.now);
        p.run_tick = start.run.unwrap_or(start.tick);
        p.validators = start.validators;
        let outcome = loop {
            if p.lock_lost.load(Ordering::Acquire) {
                // Redis stalled past the lock's TTL: the item may be another
                // task's now, which goes on from the checkpoint. Nothing more
                // is sent or written here, and the item is left as it is.
                break superseded(p);
            }
            if let Err(why) = self.follow_reload(&mut run).await {
                // The newest config gives this run no secret: it stops
                // here, resumable at this page.
                let end = End::Fail {
                    status: None,
                    why,
                    refund: false,
                    keep_checkpoint: true,
                };
                break self.end(&run, p, None, end).await?;
            }
            match self.step(&run, p).await? {
                Stepped::Next => {}
                Stepped::End(outcome) => break outcome,
                // The same page again, with the new token.
                Stepped::Reminted(secret) => {
                    run.fetcher = self.fetcher.with_secret(&secret);
                    run.secret = secret;
                    run.reminted = true;
                }
            }
        };
        if outcome.kind == OutcomeKind::Done && found.ran.is_none_or(|r| r < task.tick) {
            let ran_key = self.keys().item_ran(&job.name, &task.item_key());
            let ran = (ran_key, task.tick.to_string(), CHECKPOINT_TTL);
            p.leaves.set.push(ran);
        }
        Ok(outcome)
    }

    /// What the run shares: whose quota it spends (`payer`: a template
    /// credential's tenant, with the tenant's own secret), the job's rules,
    /// its keys. `Err`: the tenant's secret cannot be read.
    fn open<'a>(
        &'a self,
        payer: Payer<'a>,
        lock: &'a ItemLock,
        validators: Option<Validators>,
        p: &Progress,
        minted: Option<Result<Secret, String>>,
    ) -> Result<Run<'a>, String> {
        // Read once per task: the claim's spend read a tenant's already.
        let read = (p.first_spend.as_ref()).and_then(|f| f.tenant_secret().cloned());
        let (secret, fetcher) = self.credential_for(&payer, minted, read)?;
        let (task, job, endpoint) = (payer.task, payer.job, payer.endpoint);
        let item = task.item_key();
        Ok(Run {
            rules: Rules {
                job,
                throttle_block: endpoint.throttle_block,
                validators: validators.filter(|_| endpoint.conditional),
                failures: task.failures,
            },
            payer,
            lock,
            secret,
            fetcher,
            reminted: false,
            cursor_key: self.keys().cursor(&job.name, &item),
            since_key: self.keys().since(&job.name, &item),
            validators_key: self.keys().validators(&job.name, &item),
            live: None,
        })
    }

    /// One page (or one hop of a page's redirect): what happened, what it
    /// leads to, and that carried out. A fetched page is written before the
    /// rest is decided: the sink's answer is part of what happened.
    async fn step(&self, run: &Run<'_>, p: &mut Progress) -> Result<Stepped, TaskError> {
        let now = Utc::now();
        let (mut answer, mut spent) = self.attempt(run, p, now).await;
        let (spender, payer) = self.spender(run);
        if let Some(secret) = spender.remint(run, &payer, &answer).await {
            return Ok(Stepped::Reminted(secret));
        }
        loop {
            let action = decide(answer, &p.cursor, &run.rules);
            match self.act(run, p, spent.as_mut(), action, now).await? {
                Acted::Answered(next) => answer = next,
                Acted::Continue => return Ok(Stepped::Next),
                Acted::End(outcome) => return Ok(Stepped::End(outcome)),
            }
        }
    }

    /// Everything that happens before a decision: build the request (a
    /// request that cannot be built is never sent, so nothing is spent for
    /// it), check the sink can take a page, spend, send, and apply what the
    /// answer says about the upstream's quota. With the answer, the spend
    /// it was sent on (none when nothing was spent).
    async fn attempt(
        &self,
        run: &Run<'_>,
        p: &mut Progress,
        now: DateTime<Utc>,
    ) -> (Answer, Option<Spent>) {
        if p.cursor.page > run.rules.last_page(&p.cursor) {
            return (Answer::PastLastPage, None);
        }
        let request = match p.redirect.take() {
            Some(next) => *next,
            None => match self.build(run, p, now) {
                Ok(r) => r,
                Err(e) => return (Answer::Unbuildable(e.to_string()), None),
            },
        };
        // A sink that could take no page here, not even into the spool,
        // gets no page fetched for it until it can (sink.rs).
        if let Err(e) = self.sinks.ready(run.job(), &run.task().item, now).await {
            return (Answer::SinkNotReady(e), None);
        }
        // The windows and costs of the newest config (a reload since the
        // run began), the run's own job.
        let (spender, payer) = self.spender(run);
        // This daemon's own hold first: a first spend stays unused then.
        let admission = match spender.held_here(&payer) {
            Some(refusal) => Admission::Refused(refusal),
            None => {
                let first = p.first_spend.take();
                spender.spend(&payer, p.cursor.page, first).await
            }
        };
        let mut spent = match admission {
            Admission::Admitted(spent) => *spent,
            Admission::Refused(refusal) => return (Answer::Refused(refusal), None),
            Admission::Unavailable(e) => return (Answer::LimiterDown(e), None),
        };
        let cost = payer.endpoint.cost.get();
        p.units += cost;
        Stats::add(&self.lasting.stats.units, cost);
        self.test_panic();

        let endpoint = payer.endpoint;
        let Answered { reply, verdict } = run.fetcher.send(endpoint, &request).await;
        let accounted = spender.account(&payer, &mut spent, &reply, verdict).await;
        p.add_units(accounted.change);
        let blocked = accounted.blocked;
        (Answer::Replied { reply, blocked }, Some(spent))
    }

    /// The test hook `daemon::Hooks::panic_after_spend`: panics while its
    /// count is above 0, counting it down.
    fn test_panic(&self) {
        use std::sync::atomic::Ordering;
        let Some(left) = &self.lasting.panic_after_spend else {
            return;
        };
        if left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("test hook: a task panics right after its spend");
        }
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
        let ph = Placeholders::new(run.job(), &run.task().item, &run.secret, now, since);
        let at = match &p.cursor.token {
            Some(token) => PageAt::After(token),
            None => PageAt::Number(p.cursor.page),
        };
        let request = run.fetcher.request(run.job(), &ph, at)?;
        Ok(match &run.rules.validators {
            Some(v) if p.cursor.page == 1 => request.conditional(v),
            _ => request,
        })
    }

    /// Carries out `action`: the sink, the checkpoint, the outcome.
    async fn act(
        &self,
        run: &Run<'_>,
        p: &mut Progress,
        spent: Option<&mut Spent>,
        action: Action,
        now: DateTime<Utc>,
    ) -> Result<Acted, TaskError> {
        match action {
            Action::Write {
                body,
                next,
                validators,
                altered,
            } => {
                if p.cursor.page == 1 && run.payer.endpoint.conditional {
                    p.validators = Some(validators).filter(|v| !v.is_empty());
                }
                let at = PageRef {
                    tick: p.run_tick,
                    page: p.cursor.page,
                };
                let written = (self.sinks)
                    .write(run.job(), &run.task().item, at, &body, now)
                    .await;
                if let Ok(w) = &written {
                    altered.count(&run.job().name);
                    p.records += w.stored as u64;
                    Stats::add(&self.lasting.stats.records, w.stored as u64);
                    p.pages += 1;
                    Stats::add(&self.lasting.stats.pages, 1);
                }
                Ok(Acted::Answered(Answer::Written { written, next }))
            }
            Action::Next { token } => {
                p.cursor.advance(token);
                // Refused: the loop's next turn ends the task superseded.
                self.save(run, p).await?;
                Ok(Acted::Continue)
            }
            // An answer: this hop's units stay spent; the next hop is
            // spent by the next step, for the same page.
            Action::Follow(next) => {
                p.redirect = Some(next);
                Ok(Acted::Continue)
            }
            Action::End(end) => Ok(Acted::End(self.end(run, p, spent, end).await?)),
        }
    }

    /// Ends the task as `end` says: the checkpoint (saved, dropped, or the
    /// run complete), a copy queued for later, and the outcome.
    async fn end(
        &self,
        run: &Run<'_>,
        p: &mut Progress,
        spent: Option<&mut Spent>,
        end: End,
    ) -> Result<Outcome, TaskError> {
        // A request that never left gives its units back first: the
        // outcome reports what was spent.
        if let (true, Some(spent)) = (end.refunds(), spent) {
            let (spender, payer) = self.spender(run);
            let change = spender.refund(payer.endpoint, spent).await;
            p.add_units(change);
        }
        // Whether its checkpoint was saved, where it saves one.
        let mut kept = true;
        // The outcome, the HTTP status that decided it, and the copy to
        // queue (why, and when it runs).
        let (mut o, status, again) = match end {
            End::Complete {
                why,
                status,
                not_modified,
            } => (self.complete(run, p, why, not_modified)?, status, None),
            End::HandOn { token, why } => {
                let o = p.outcome(OutcomeKind::Done, why);
                kept = self.hand_on(run, p, token).await?;
                (o, None, None)
            }
            End::Fail {
                status,
                why,
                keep_checkpoint,
                ..
            } => {
                kept = self.keep_or_forget(run, p, keep_checkpoint).await?;
                (p.outcome(OutcomeKind::Failed, why), status, None)
            }
            End::Wait {
                kind,
                wait,
                status,
                why,
                momentary,
            } => {
                kept &= self.save(run, p).await?;
                let mut o = p.outcome(kind, why);
                o.retry_after = Some(wait);
                let again = momentary || run.job().defers();
                (o, status, again.then_some((Origin::Defer, wait)))
            }
            End::Retry {
                status,
                why,
                again_in,
                ..
            } => {
                kept &= self.save(run, p).await?;
                let o = p.outcome(OutcomeKind::Retrying, why);
                (o, status, Some((Origin::Retry, again_in)))
            }
            End::Later { wait, why } => {
                kept &= self.save(run, p).await?;
                let o = p.outcome(OutcomeKind::Retrying, why);
                (o, None, Some((Origin::Defer, wait)))
            }
        };
        if !kept {
            // Another task holds the item; nothing is queued again for this.
            return Ok(superseded(p));
        }
        o.status = status;
        if let Some((origin, wait)) = again {
            (self.lasting.queue)
                .enqueue(&[(run.task().again(origin), wait)])
                .await?;
            o.requeued_in = Some(wait);
        }
        Ok(o)
    }

    /// A failed run's checkpoint: kept (the run resumes there), or
    /// deleted (its next run starts over); `false`: another task holds the
    /// item, nothing written.
    async fn keep_or_forget(
        &self,
        run: &Run<'_>,
        p: &mut Progress,
        keep: bool,
    ) -> Result<bool, TaskError> {
        if keep {
            return self.save(run, p).await;
        }
        let mut conn = self.lasting.conn.clone();
        Ok((run.lock).forget(&mut conn, &run.cursor_key).await?)
    }

    /// `done` for this run at `max_pages`: the item's next run goes on at
    /// the next page (`token`), from the checkpoint saved here (`false`:
    /// refused, see [`Worker::save`]).
    async fn hand_on(
        &self,
        run: &Run<'_>,
        p: &mut Progress,
        token: Option<Stored>,
    ) -> Result<bool, TaskError> {
        p.cursor.hand_on(token);
        self.save(run, p).await
    }

    /// The run is complete: its checkpoint goes, and what the item's next
    /// run needs stays: when this run started (its `{since}`) and, on a
    /// conditional endpoint, page 1's validators (or none, if it had none;
    /// `not_modified`: the ones its page 1 was sent with, as a 304 says).
    /// Written with the outcome (`Progress::leaves`, `run_held`), so a
    /// daemon killed before that leaves the run resumable at its last
    /// checkpoint, as a kill between two pages does.
    fn complete(
        &self,
        run: &Run<'_>,
        p: &mut Progress,
        why: &str,
        not_modified: bool,
    ) -> Result<Outcome, TaskError> {
        if not_modified {
            p.validators = run.rules.validators.clone();
        }
        if p.checkpointed {
            p.leaves.del.push(run.cursor_key.clone());
        }
        let since = (run.since_key.clone(), p.started.to_string(), ITEM_STATE_TTL);
        p.leaves.set.push(since);
        if run.payer.endpoint.conditional {
            match &p.validators {
                Some(v) => {
                    let json = serde_json::to_string(v).map_err(TaskError::State)?;
                    let validators = (run.validators_key.clone(), json, ITEM_STATE_TTL);
                    p.leaves.set.push(validators);
                }
                None => p.leaves.del.push(run.validators_key.clone()),
            }
        }
        let o = p.outcome(OutcomeKind::Done, why);
        Ok(Outcome { not_modified, ..o })
    }

    /// Checkpoints the run: the next run of the item resumes at its cursor.
    /// Only while the item is this task's ([`ItemLock::save`]): one whose
    /// lock lapsed under a stalled Redis writes nothing, and stops as
    /// `superseded` (the loop's next turn, or [`Worker::end`]): `false`.
    async fn save(&self, run: &Run<'_>, p: &mut Progress) -> Result<bool, TaskError> {
        let cp = Checkpoint {
            tick: run.task().tick,
            cursor: p.cursor.clone(),
            since: Some(p.since),
            started: Some(p.started),
            validators: p.validators.clone(),
            run: Some(p.run_tick),
        };
        let json = serde_json::to_string(&cp).map_err(TaskError::State)?;
        let mut conn = self.lasting.conn.acked();
        if (run.lock)
            .save(&mut conn, &run.cursor_key, &json, CHECKPOINT_TTL)
            .await?
        {
            p.checkpointed = true;
            Ok(true)
        } else {
            warn!(checkpoint = %run.cursor_key, "another task holds the item now (this task's lock lapsed while Redis stalled, and the item was claimed again): the checkpoint is not saved, and this task stops here");
            p.lock_lost.store(true, Ordering::Release);
            Ok(false)
        }
    }
}

/// The outcome of a task whose item lock lapsed (Redis stalled past its
/// TTL): what it did until it saw so.
fn superseded(p: &Progress) -> Outcome {
    let why = "another task holds the item now (this task's lock lapsed while Redis stalled past its TTL, and the item was claimed again): this task stops here, and that task goes on from its checkpoint";
    p.outcome(OutcomeKind::Superseded, why.to_owned())
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
        let cursor = Cursor {
            page,
            token: Some(Stored::new(format!("t{page}"))),
            first: 1,
        };
        Checkpoint {
            tick,
            cursor,
            since: None,
            started: None,
            validators: None,
            run: None,
        }
    }

    /// The cursor moved into `fetch::paging` and is flattened into the
    /// checkpoint: a checkpoint written before reads the same, and one
    /// written now has the same fields.
    #[test]
    fn a_checkpoint_keeps_its_json_shape() {
        let before = r#"{"tick":5,"page":3,"token":"t3","since":1700000000,"started":1700000100}"#;
        let cp: Checkpoint = serde_json::from_str(before).expect("reads");
        assert_eq!(
            cp.cursor,
            Cursor {
                page: 3,
                token: Some(Stored::new("t3".into())),
                first: 1
            }
        );
        let json = serde_json::to_value(&cp).expect("writes");
        assert_eq!(
            json,
            serde_json::json!({"tick": 5, "page": 3, "token": "t3", "first": 1,
                               "since": 1_700_000_000, "started": 1_700_000_100})
        );
    }

    #[test]
    fn a_fresh_task_starts_at_page_1_or_takes_over_an_interrupted_run() {
        assert_eq!(
            start_at(&task(10, false), None, None).map(|c| c.cursor.page),
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
