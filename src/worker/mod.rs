//! One task, start to end: for each page, spend → fetch → sink → checkpoint,
//! and stop cleanly with the retry-after when the quota says no.
//!
//! Outcomes follow SPEC "Task outcomes" ([`crate::outcome`]). A task never
//! sleeps waiting for quota: a rejected spend ends it at once
//! (`quota_exhausted`), and with `on_quota_exhausted = "defer"` a copy is
//! queued to run at the retry-after. Retries (network errors, timeouts, 5xx)
//! are queued copies too, with exponential backoff and bounded attempts;
//! waiting for quota never uses an attempt.
//!
//! Redis holds the state that must survive this process: the item's
//! pagination checkpoint (`keys::cursor`, which never holds the secret), a
//! lock so two tasks never work on one item at once (`keys::item_lock`), a
//! done marker so a redelivered task does nothing (`keys::task_done`), and
//! what the item's last complete run leaves for its next one: its start,
//! the next `{since}` (`keys::since`), and page 1's `ETag` / `Last-Modified`
//! on a conditional endpoint (`keys::validators`).
//!
//! - this file: a task's frame — claim the item, run, record the outcome;
//! - `claim`: the claim and what the run takes from it — what it found,
//!   the first page's spend that rode in its call, the minted token, and
//!   the payer (endpoint → credential → tenant, looked up once per task);
//! - `run`: the run over the item's pages, one step at a time: gather what
//!   happened, decide, carry it out; its progress (where it is, what it
//!   did, the claim's first spend, what it leaves) is its own; its child
//!   `run::credential`: the run's secret and payer, and what changes them
//!   mid-run (a reload, a 401's re-mint);
//! - `step`: a step as data — what happened (`Answer`), what it leads to
//!   (`Action`) — and the pure `decide(answer, &cursor, &rules)`,
//!   unit-tested for every answer;
//! - `spend`: the task's side of the quota, as data — spend, settle,
//!   refund, block — never ending the task itself;
//! - `lease`: a request's lease in its concurrent windows, returned by its
//!   settle exactly once (or, dropped unreturned, by a spawned settle);
//! - `lock`: the item lock; `guards`: what undoes a running task's side
//!   effects however it ends, a panic included.

mod account;
mod claim;
mod guards;
mod lease;
mod lock;
mod memory;
mod run;
mod spend;
mod step;

use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use crate::conn::Conn;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::{Config, Job, Secrets};
use crate::fetch::Fetcher;
use crate::fetch::paging::{Cursor, Validators};
use crate::keys::KeySpace;
use crate::mint::Minter;
use crate::outcome::{Outcome, OutcomeEvent, OutcomeKind};
use crate::queue::known::{self, Unknown};
use crate::queue::scripts::finish::{Finish, ItemEnd, Leaves};
use crate::queue::{Origin, Queue, QueueError, TaskArgs};
use crate::quota::Limiter;
use crate::sink::Sinks;
use crate::stats::Stats;
use guards::{InFlight, Renewer};
pub(crate) use lock::Holder;
use lock::{Claim, ItemLock};
pub(crate) use memory::{LocalBlocks, Remembered, Unanswered};

/// How long pagination checkpoints are kept when nothing resumes them.
const CHECKPOINT_TTL: Duration = Duration::from_secs(7 * 86_400);
/// How long what an item's last complete run leaves for its next one is
/// kept (`{since}`, the validators), refreshed by every complete run. Losing
/// `{since}` silently narrows the next run to `since_initial`, so it must
/// outlive any gap between two complete runs of a live item, a yearly job's
/// included; an item dropped from the fan-out frees its keys after this.
pub(crate) const ITEM_STATE_TTL: Duration = Duration::from_secs(400 * 86_400);
/// The item lock's longest lifetime; renewed every third of it while the
/// task runs. A killed daemon's lock lapses within it, so it is also kept
/// under half of `recover_after` (see [`Worker::lock_ttl`]).
const LOCK_TTL: Duration = Duration::from_secs(10);
/// Wait before a task that found its item busy tries again.
const BUSY_RETRY: Duration = Duration::from_secs(2);

/// Where the next page of an item's run starts. Holds no secret: a cursor
/// or next URL that held one holds its placeholder instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    /// The tick whose run this is.
    pub(crate) tick: i64,
    /// Where the run is in its pages: page, cursor or next URL, first page
    /// (`page`, `token`, `first` in the JSON, as before).
    #[serde(flatten)]
    pub(crate) cursor: Cursor,
    /// The run's `{since}` (epoch s): a resumed or continued run keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) since: Option<i64>,
    /// When the run started (epoch s): the next run's `{since}` once this
    /// one is complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) started: Option<i64>,
    /// Page 1's validators, kept until the run is complete (only a complete
    /// run may make the next one conditional: a 304 ends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) validators: Option<Validators>,
    /// The tick that began this run; a newer tick's task that takes the run
    /// over keeps it. With the item and the page number it names a page
    /// (a postgres sink's page id), so a page written before its
    /// checkpoint, by a daemon killed in between, is the same page when
    /// whichever task resumes the run writes it again. Absent in
    /// checkpoints written before it was kept: `tick` stands in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) run: Option<i64>,
}

/// Everything a task needs; shared by all of one daemon's tasks.
pub(crate) struct Worker {
    pub(crate) config: Arc<Config>,
    pub(crate) secrets: Arc<Secrets>,
    pub(crate) limiter: Limiter,
    pub(crate) fetcher: Fetcher,
    pub(crate) sinks: Sinks,
    /// What this process holds whatever the config, shared with the
    /// workers of the configs before and after this one.
    pub(crate) lasting: Lasting,
}

/// What a daemon's worker holds whatever its config: made once when the
/// daemon starts, and handed on by each worker to the one a reload makes,
/// so a reload loses no counter, no block this daemon holds itself, no
/// units in flight and no minted token: a reload clones it whole
/// ([`Worker::reloaded`]), so a field added here cannot be left behind.
#[derive(Clone)]
pub(crate) struct Lasting {
    /// For retries and deferrals.
    pub(crate) queue: Queue,
    /// For checkpoints, locks and markers.
    pub(crate) conn: Conn,
    pub(crate) stats: Arc<Stats>,
    /// Where every outcome is also sent (the demo's live view), if anywhere.
    pub(crate) events: Option<tokio::sync::broadcast::Sender<OutcomeEvent>>,
    /// Credentials this daemon holds blocked itself, because recording the
    /// upstream's block in Redis failed.
    pub(crate) local_blocks: Arc<LocalBlocks>,
    /// Units spent per credential whose requests are not answered yet: a
    /// resync to the upstream's count leaves room for them.
    pub(crate) unanswered: Arc<Unanswered>,
    /// What this daemon remembers of the upstream between answers (throttle
    /// streaks it saw, GraphQL tokens' use, resources it logged).
    pub(crate) remembered: Arc<Remembered>,
    /// The tokens credential commands minted.
    pub(crate) minter: Arc<Minter>,
    /// The benchmark's "spend off" (`daemon::Hooks::skip_spend`): every
    /// spend counts as admitted and unrecorded, without a call to Redis.
    pub(crate) skip_spend: bool,
    /// The test hook `daemon::Hooks::panic_after_spend`.
    pub(crate) panic_after_spend: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// The worker of the newest config, shared by every worker of this
    /// daemon across reloads ([`Worker::publish`]): a task in flight spends
    /// and sends with its windows, costs and secrets from its next page on
    /// (SPEC Part 4, "Reload and tasks in flight"; `run::credential`).
    pub(crate) newest: Arc<RwLock<Weak<Worker>>>,
}

/// The item a running task holds: its lock, and the lock's renewal (stopped
/// before the task's end frees the item in the call that records it).
pub(super) struct Held<'a> {
    lock: &'a ItemLock,
    renewer: Renewer,
}

/// Why a task could not finish its bookkeeping: Redis went away. The task is
/// then left to apalis, which redelivers it; nothing is lost.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TaskError {
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The queue failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The item's state (its checkpoint, page 1's validators) did not
    /// encode as JSON: a bug, not the data (its fields are strings and
    /// numbers). Not a task payload, so not [`QueueError::Payload`].
    #[error("cannot encode the item's state: {0}")]
    State(#[source] serde_json::Error),
}

/// Runs of one task that did nothing: a duplicate delivery, or a busy item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// This task (or the step it stands for) already ended.
    AlreadyDone,
    /// Another task holds the item; a copy was queued to try again.
    Busy,
    /// This daemon does not know the job; the task was queued again for
    /// one that does.
    GivenBack,
    /// Another delivery of this same task took the item while this one ran
    /// (the queue handed the task out again, and the write of this one's
    /// lock was lost: a failover promoted a replica it had not reached).
    /// This one stepped aside at a page boundary, writing no more of the
    /// item's state; the other records the task's end.
    SteppedAside,
}

/// What running a task amounted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ran {
    /// It ran and ended with an outcome.
    Ended(Outcome),
    /// It did nothing.
    Skipped(Skip),
}

impl Worker {
    fn keys(&self) -> &KeySpace {
        self.lasting.queue.keys()
    }

    /// A worker for `config`: its `secrets` (and the HTTP client that
    /// sends them), its `limiter` (the config's windows and costs) and its
    /// `sinks`, with what this process holds whatever the config
    /// (`lasting`). The one place a worker is made: the daemon's first,
    /// and each reload's ([`Worker::reloaded`]).
    pub(crate) fn new(
        config: Arc<Config>,
        secrets: Arc<Secrets>,
        limiter: Limiter,
        sinks: Sinks,
        lasting: Lasting,
    ) -> Result<Self, reqwest::Error> {
        Ok(Worker {
            fetcher: Fetcher::new(&secrets)?,
            config,
            secrets,
            limiter,
            sinks,
            lasting,
        })
    }

    /// This worker for a reloaded `config` with its `secrets`: what the
    /// config decides (windows and costs, requests, sinks) is new; what
    /// this process holds across configs ([`Lasting`]: the queue and its
    /// connection, counters, credentials it holds blocked, units in
    /// flight) is shared. Tasks that began before keep the worker they
    /// began with for their job, and take this one's windows, costs and
    /// secrets at their next page once it is [published](Worker::publish).
    pub(crate) fn reloaded(
        &self,
        config: Arc<Config>,
        secrets: Secrets,
    ) -> Result<Self, reqwest::Error> {
        let limiter = (self.limiter).with_quotas(Arc::new(crate::quota::Quotas::new(&config)));
        let sinks = self.sinks.reloaded(&config);
        Worker::new(
            config,
            Arc::new(secrets),
            limiter,
            sinks,
            self.lasting.clone(),
        )
    }

    /// Makes this worker the newest: tasks in flight on older ones spend
    /// and send with its config from their next page on.
    pub(crate) fn publish(self: &Arc<Self>) {
        let mut newest = self
            .lasting
            .newest
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *newest = Arc::downgrade(self);
    }

    /// The newest worker, when it is not this one (a reload since).
    fn newer(&self) -> Option<Arc<Worker>> {
        let newest = self
            .lasting
            .newest
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        newest
            .upgrade()
            .filter(|w| !std::ptr::eq(Arc::as_ptr(w), self))
    }

    /// Runs one task: claims its item, runs its pages while holding it,
    /// records the outcome, frees the item.
    pub(crate) async fn run(&self, task: &TaskArgs) -> Result<Ran, TaskError> {
        let Some(job) = self.config.jobs.get(&task.job) else {
            return self.job_unknown(task).await;
        };
        let lock = ItemLock::new(self.keys(), job, task, self.lock_ttl());
        let claimed = match self.claim(task, job, &lock).await? {
            Claim::Held(claimed) => claimed,
            Claim::AlreadyDone => return Ok(Ran::Skipped(Skip::AlreadyDone)),
            Claim::Busy => {
                // Come back shortly, as the same step.
                self.lasting
                    .queue
                    .enqueue(&[(task.again(Origin::Busy), BUSY_RETRY)])
                    .await?;
                Stats::add(&self.lasting.stats.requeued, 1);
                return Ok(Ran::Skipped(Skip::Busy));
            }
            // Its spend, if it made one, was given back (`claim`).
            Claim::Unexpected(why) => {
                let outcome = Outcome::new(OutcomeKind::Failed, 0, why);
                let held = lock.end(Leaves::default());
                self.finish(task, Some(job), &outcome, Some(held)).await?;
                return Ok(Ran::Ended(outcome));
            }
        };
        let result = {
            // Undone when they are dropped, however the run ends (guards.rs);
            // the renewal stops before the call that frees the item.
            let renewer = lock.keep_renewed(self.lasting.conn.clone());
            let _in_flight = InFlight::enter(&self.lasting.stats.in_flight);
            // Its progress owns the first spend from here (`run_held`).
            let held = Held {
                lock: &lock,
                renewer,
            };
            self.run_held(task, job, *claimed, held).await
        };
        match result {
            Ok(ran) => Ok(ran),
            Err(e) => {
                // The end's call (which frees the item) may not have run.
                if let Err(unlock) = lock.release(&mut self.lasting.conn.clone()).await {
                    warn!(task = %task.id, error = %unlock, "could not free the item lock; it lapses within its TTL");
                }
                Err(e)
            }
        }
    }

    /// A task of a job this daemon's config does not have: a rolling deploy
    /// or a reload that reached some daemons before others. While some
    /// daemon has had the job within `unknown_job_grace`, the task is given
    /// back for it (queued again, no attempt counted, each wait twice the
    /// last: `queue::known`); after that it fails, once, saying so.
    async fn job_unknown(&self, task: &TaskArgs) -> Result<Ran, TaskError> {
        let mut conn = self.lasting.conn.clone();
        let done = self.keys().task_done(&task.root);
        if conn.exists::<_, bool>(done).await? {
            return Ok(Ran::Skipped(Skip::AlreadyDone));
        }
        let (now, last) = known::last_known(&mut conn, self.keys(), &task.job).await?;
        let grace = self.config.worker.unknown_job_grace;
        let since = task.unknown_since;
        match known::verdict(&task.job, now, last, since, task.given_back, grace) {
            Unknown::GiveBack { wait, since } => {
                let back = task.given_back(since);
                self.lasting.queue.enqueue(&[(back, wait)]).await?;
                Stats::add(&self.lasting.stats.requeued, 1);
                metrics::counter!("qw_tasks_given_back_total", "qw_job" => task.job.clone())
                    .increment(1);
                info!(
                    job = %task.job,
                    item = %task.item_key(),
                    task = %task.id,
                    given_back = task.given_back + 1,
                    requeued_in_ms = wait.as_millis() as u64,
                    "job not in this daemon's configuration: task given back for a daemon that has it"
                );
                Ok(Ran::Skipped(Skip::GivenBack))
            }
            Unknown::Fail(why) => {
                let outcome = Outcome::new(OutcomeKind::Failed, 0, why);
                self.finish(task, None, &outcome, None).await?;
                Ok(Ran::Ended(outcome))
            }
        }
    }

    /// The item lock's lifetime: at most [`LOCK_TTL`], and under half of
    /// `recover_after`, so a killed daemon's items are free by the time its
    /// tasks are handed to another daemon.
    fn lock_ttl(&self) -> Duration {
        LOCK_TTL
            .min(self.config.worker.recover_after / 2)
            .max(Duration::from_millis(300))
    }

    /// Records the outcome: the done marker, the tick's counts (and the
    /// earliest retry-after), the job's tick record, fair rotation
    /// (`lua/finish.lua`), the counters, the log line.
    async fn finish(
        &self,
        task: &TaskArgs,
        job: Option<&Job>,
        o: &Outcome,
        held: Option<ItemEnd>,
    ) -> Result<(), TaskError> {
        let mut finish = Finish::new(self.keys(), task, o);
        if let Some(held) = held {
            finish = finish.holding(held);
        }
        // With `[redis] queue_replicas`, the end counts once a replica has it.
        let starved_ticks = finish.invoke(&mut self.lasting.conn.acked()).await?;
        self.lasting.stats.outcome(o.kind);
        metrics::counter!("qw_tasks_total", "qw_job" => task.job.clone(), "outcome" => o.kind.as_str())
            .increment(1);
        if o.pages > 0 {
            metrics::counter!("qw_pages_total", "qw_job" => task.job.clone())
                .increment(u64::from(o.pages));
            metrics::counter!("qw_records_total", "qw_job" => task.job.clone())
                .increment(o.records);
        }
        if !o.is_terminal() {
            Stats::add(&self.lasting.stats.requeued, 1);
        }
        log_outcome(task, job, o, starved_ticks);
        if let Some(tx) = &self.lasting.events {
            // Nobody listening is fine.
            let _ = tx.send(OutcomeEvent {
                job: task.job.clone(),
                item: task.item_key(),
                tick: task.tick,
                outcome: o.clone(),
            });
        }
        Ok(())
    }
}

/// Every outcome is one structured line: job, item, page, units, retry-after.
fn log_outcome(task: &TaskArgs, job: Option<&Job>, o: &Outcome, starved_ticks: Option<u64>) {
    let item = task.item_key();
    let retry_after_ms = o.retry_after.map(|d| d.as_millis() as u64);
    let requeued_in_ms = o.requeued_in.map(|d| d.as_millis() as u64);
    let endpoint = job.map(|j| j.endpoint.as_str()).unwrap_or("-");
    macro_rules! line {
        ($level:ident) => {
            $level!(
                outcome = o.kind.as_str(),
                job = %task.job,
                item = %item,
                tick = task.tick,
                task = %task.id,
                endpoint,
                page = o.page,
                pages = o.pages,
                records = o.records,
                units = o.units,
                retry_after_ms,
                requeued_in_ms,
                status = o.status,
                not_modified = o.not_modified.then_some(true),
                starved_ticks,
                "{}",
                o.detail
            )
        };
    }
    match o.kind {
        OutcomeKind::Failed => line!(warn),
        _ => line!(info),
    }
}
