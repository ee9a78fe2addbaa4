//! One task, start to end: for each page, spend → fetch → sink → checkpoint,
//! and stop cleanly with the retry-after when the quota says no.
//!
//! Outcomes follow SPEC "Task outcomes". A task never sleeps waiting for
//! quota: a rejected spend ends it at once (`quota_exhausted`), and with
//! `on_quota_exhausted = "defer"` a copy is queued to run at the retry-after.
//! Retries (network errors, timeouts, 5xx) are queued copies too, with
//! exponential backoff and bounded attempts; waiting for quota never uses an
//! attempt.
//!
//! Redis holds the state that must survive this process: the item's
//! pagination checkpoint (`keys::cursor`), a lock so two tasks never work on
//! one item at once (`keys::item_lock`), and a done marker so a redelivered
//! task does nothing (`keys::task_done`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::Utc;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use crate::config::{Config, Endpoint, Job, OnQuotaExhausted, Secrets};
use crate::conn::Lua;
use crate::fetch::{Fetcher, Placeholders, Reply, Request};
use crate::keys::KeySpace;
use crate::queue::{Origin, Queue, QueueError, TaskArgs};
use crate::quota::{Decision, Limiter, QuotaError, RejectedBy};
use crate::sink::Sinks;
use crate::stats::{OutcomeKind, Stats};

/// How long pagination checkpoints are kept when nothing resumes them.
const CHECKPOINT_TTL: Duration = Duration::from_secs(7 * 86_400);
/// How long "this task already ended" is remembered (covers redelivery).
const DONE_TTL: Duration = Duration::from_secs(86_400);
/// The item lock's longest lifetime; renewed every third of it while the
/// task runs. A killed daemon's lock lapses within it, so it is also kept
/// under half of `recover_after` (see [`Worker::lock_ttl`]).
const LOCK_TTL: Duration = Duration::from_secs(10);
/// The most units a request is ever settled to: Lua numbers are doubles,
/// exact up to 2^53.
const MAX_SETTLE: u64 = (1 << 53) - 1;
/// Wait before a task that found its item busy tries again.
const BUSY_RETRY: Duration = Duration::from_secs(2);

/// Where the next page of an item's run starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The tick whose run this is.
    pub tick: i64,
    /// The next page's number (1 = first).
    pub page: u32,
    /// The cursor to send for it (none for page 1).
    pub token: Option<String>,
}

/// Everything a task needs; shared by all of one daemon's tasks.
pub struct Worker {
    /// The configuration.
    pub config: Arc<Config>,
    /// Credential secrets.
    pub secrets: Arc<Secrets>,
    /// The limiter.
    pub limiter: Limiter,
    /// The queue (for retries and deferrals).
    pub queue: Queue,
    /// A connection for checkpoints, locks and markers.
    pub conn: ConnectionManager,
    /// HTTP.
    pub fetcher: Fetcher,
    /// Sinks.
    pub sinks: Sinks,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Where every outcome is also sent (the demo's live view), if anywhere.
    pub events: Option<tokio::sync::broadcast::Sender<OutcomeEvent>>,
    /// Credentials this daemon holds blocked itself, because recording the
    /// upstream's block in Redis failed.
    pub local_blocks: LocalBlocks,
    /// Exists only for `benches/quota/e2e.rs` (see
    /// `daemon::RunOptions::bench_skip_spend`): every spend counts as
    /// admitted and unrecorded, without a call to Redis.
    #[doc(hidden)]
    pub bench_skip_spend: bool,
}

/// Credentials blocked in this process only: when Redis does not take a
/// block (it is down, or the script failed), this daemon still spends
/// nothing on the credential until the block's end. Other daemons do not
/// see it; the upstream will throttle them too, and they block it themselves.
#[derive(Debug, Default)]
pub struct LocalBlocks(Mutex<HashMap<String, Instant>>);

impl LocalBlocks {
    /// Holds `credential` blocked for `wait` (never shortening a longer hold).
    pub fn hold(&self, credential: &str, wait: Duration) {
        let until = Instant::now() + wait;
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let at = held.entry(credential.to_owned()).or_insert(until);
        *at = (*at).max(until);
    }

    /// How long `credential` stays held, if it is.
    pub fn left(&self, credential: &str) -> Option<Duration> {
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

/// One task's outcome, for a live view.
#[derive(Debug, Clone)]
pub struct OutcomeEvent {
    /// The job.
    pub job: String,
    /// The item, as `region=US`.
    pub item: String,
    /// The tick.
    pub tick: i64,
    /// How it ended.
    pub outcome: Outcome,
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Which outcome.
    pub kind: OutcomeKind,
    /// The page it ended on (the last fetched when done).
    pub page: u32,
    /// Pages fetched by this task.
    pub pages: u32,
    /// Records written by this task.
    pub records: u64,
    /// Units spent by this task.
    pub units: u64,
    /// The quota's (or the upstream's) retry-after, when it said no.
    pub retry_after: Option<Duration>,
    /// When a copy was queued, how long until it runs.
    pub requeued_in: Option<Duration>,
    /// An HTTP status, when one decided.
    pub status: Option<u16>,
    /// Why, in words.
    pub detail: String,
}

/// Why a task could not finish its bookkeeping: Redis went away. The task is
/// then left to apalis, which redelivers it; nothing is lost.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The queue failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// Runs of one task that did nothing: a duplicate delivery, or a busy item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// This task (or the step it stands for) already ended.
    AlreadyDone,
    /// Another task holds the item; a copy was queued to try again.
    Busy,
}

/// What running a task amounted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// It ran and ended with an outcome.
    Ended(Outcome),
    /// It did nothing.
    Skipped(Skip),
}

/// Where a run is: its checkpoint's key and tick, the next page, and what
/// it has done so far.
struct Progress {
    cursor_key: String,
    tick: i64,
    page: u32,
    token: Option<String>,
    pages: u32,
    records: u64,
    units: u64,
}

impl Worker {
    fn keys(&self) -> &KeySpace {
        self.queue.keys()
    }

    /// Runs one task.
    pub async fn run(&self, task: &TaskArgs) -> Result<Ran, TaskError> {
        let keys = self.keys().clone();
        let mut conn = self.conn.clone();
        let Some(job) = self.config.jobs.get(&task.job) else {
            if conn.exists::<_, bool>(keys.task_done(&task.root)).await? {
                return Ok(Ran::Skipped(Skip::AlreadyDone));
            }
            let outcome = Outcome {
                kind: OutcomeKind::Failed,
                page: 0,
                pages: 0,
                records: 0,
                units: 0,
                retry_after: None,
                requeued_in: None,
                status: None,
                detail: format!("job {:?} is not in the configuration any more", task.job),
            };
            self.finish(task, None, &outcome).await?;
            return Ok(Ran::Ended(outcome));
        };
        let endpoint = &self.config.endpoints[&job.endpoint];
        let item_key = task.item_key();
        let lock_key = keys.item_lock(&job.name, &item_key);
        let lock_val = format!("{}#{}", task.id, crate::quota::request_id());
        let lock_ttl = self.lock_ttl();
        // One round trip: done marker, lock, checkpoint, completed tick.
        let claim: Vec<String> = ITEM_LOCK
            .call()
            .key(&lock_key)
            .key(keys.task_done(&task.root))
            .key(keys.cursor(&job.name, &item_key))
            .key(keys.item_ran(&job.name, &item_key))
            .arg("claim")
            .arg(&lock_val)
            .arg(lock_ttl.as_millis() as u64)
            .invoke(&mut conn)
            .await?;
        let (saved, ran) = match claim.as_slice() {
            [state] if state == "0" => return Ok(Ran::Skipped(Skip::AlreadyDone)),
            [_, saved, ran] => (
                serde_json::from_str::<Checkpoint>(saved).ok(),
                ran.parse::<i64>().ok(),
            ),
            _ => {
                // Another task works on this item (or a dead one's lock has
                // yet to expire): come back shortly, as the same step.
                self.queue
                    .enqueue(&[(task.again(Origin::Busy), BUSY_RETRY)])
                    .await?;
                Stats::add(&self.stats.requeued, 1);
                return Ok(Ran::Skipped(Skip::Busy));
            }
        };

        // Renewed in the background, so a long request keeps the item and a
        // killed daemon's lock lapses within its TTL.
        let renewer = {
            let mut conn = self.conn.clone();
            let (key, val) = (lock_key.clone(), lock_val.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(lock_ttl / 3).await;
                    let renewed = ITEM_LOCK
                        .call()
                        .key(&key)
                        .arg("renew")
                        .arg(&val)
                        .arg(lock_ttl.as_millis() as u64)
                        .invoke::<i64>(&mut conn)
                        .await;
                    if let Ok(0) = renewed {
                        warn!(lock = %key, "lost the item lock (expired under a stalled Redis?)");
                    }
                }
            })
        };
        Stats::add(&self.stats.in_flight, 1);
        let result = self.run_locked(task, job, endpoint, saved, ran).await;
        Stats::sub(&self.stats.in_flight, 1);
        renewer.abort();
        let unlock = ITEM_LOCK
            .call()
            .key(&lock_key)
            .arg("release")
            .arg(&lock_val)
            .invoke::<i64>(&mut conn)
            .await;
        let outcome = result?;
        unlock?;
        Ok(Ran::Ended(outcome))
    }

    async fn run_locked(
        &self,
        task: &TaskArgs,
        job: &Job,
        endpoint: &Endpoint,
        saved: Option<Checkpoint>,
        ran: Option<i64>,
    ) -> Result<Outcome, TaskError> {
        let keys = self.keys().clone();
        let mut conn = self.conn.clone();
        let item_key = task.item_key();
        let cursor_key = keys.cursor(&job.name, &item_key);
        let ran_key = keys.item_ran(&job.name, &item_key);

        // A copy of an older tick's task (redelivered after an incident, or
        // long queued) whose item a run of this tick or a newer one already
        // completed: fetching it again would spend quota on older data.
        let own_run = saved.as_ref().is_some_and(|cp| cp.tick == task.tick);
        if ran.is_some_and(|r| r >= task.tick) && !own_run {
            let outcome = self.outcome(
                OutcomeKind::Superseded,
                0,
                "a run of this or a newer tick already completed this item",
            );
            self.finish(task, Some(job), &outcome).await?;
            return Ok(outcome);
        }

        // Where this run starts: a fresh task resumes any interrupted run of
        // its item (and takes it over); a continuation resumes only its own.
        let start = match (task.continuation, saved) {
            (false, Some(cp)) => Some(cp),
            (false, None) => Some(Checkpoint {
                tick: task.tick,
                page: 1,
                token: None,
            }),
            (true, Some(cp)) if cp.tick == task.tick => Some(cp),
            (true, _) => None,
        };
        let Some(start) = start else {
            let outcome = self.outcome(
                OutcomeKind::Superseded,
                0,
                "a newer tick's task took over this item's run",
            );
            self.finish(task, Some(job), &outcome).await?;
            return Ok(outcome);
        };

        let secret = self
            .secrets
            .get(&endpoint.credential)
            .cloned()
            .unwrap_or_else(|| crate::config::Secret::new(""));
        let mut p = Progress {
            cursor_key: cursor_key.clone(),
            tick: task.tick,
            page: start.page,
            token: start.token,
            pages: 0,
            records: 0,
            units: 0,
        };
        let max_pages = job.max_pages();
        // A same-origin redirect the upstream answered with: the next
        // request of this page, spent like any other (fetch::MAX_REDIRECTS).
        let mut redirect: Option<Request> = None;

        let outcome = loop {
            if p.page > max_pages {
                // A checkpoint past max_pages (lowered since): the run is complete.
                conn.del::<_, ()>(&cursor_key).await?;
                break self.progress_outcome(OutcomeKind::Done, &p, "max_pages reached");
            }
            // Built before the spend: a request that cannot be built (a
            // control character in an item, an unsendable header) is never
            // sent, so nothing is spent for it.
            let now = Utc::now();
            let request = match redirect.take() {
                Some(next) => next,
                None => {
                    let ph = Placeholders::new(job, &task.item, &secret, now);
                    match self.fetcher.request(job, &ph, p.token.as_deref()) {
                        Ok(r) => r,
                        Err(e) => {
                            break self
                                .fail(&p, None, &format!("request not sent: {e}"))
                                .await?;
                        }
                    }
                }
            };
            if let Some(left) = self.local_blocks.left(&endpoint.credential) {
                break self
                    .wait_for_quota(
                        task,
                        job,
                        &p,
                        OutcomeKind::QuotaExhausted,
                        left,
                        "credential blocked by this daemon (Redis did not take the upstream's block)",
                    )
                    .await?;
            }
            let request_id = format!(
                "{}:p{}:{}",
                task.id,
                p.page,
                &crate::quota::request_id()[..12]
            );
            let decision = if self.bench_skip_spend {
                Ok(Decision::Unchecked)
            } else {
                self.limiter.spend(&endpoint.name, None, &request_id).await
            };
            let decision = match decision {
                Ok(d) => d,
                Err(e) => {
                    break self.limiter_down(task, &p, &e).await?;
                }
            };
            let recorded = match decision {
                Decision::Rejected(r) => {
                    Stats::add(&self.stats.rejected_spends, 1);
                    let why = match r.by {
                        RejectedBy::Blocked => "credential blocked after the upstream throttled it",
                        RejectedBy::Window(_) => "spend rejected by a quota window",
                    };
                    break self
                        .wait_for_quota(
                            task,
                            job,
                            &p,
                            OutcomeKind::QuotaExhausted,
                            r.retry_after,
                            why,
                        )
                        .await?;
                }
                Decision::Allowed { .. } => true,
                Decision::Unchecked => false,
            };
            p.units += endpoint.cost.get();
            Stats::add(&self.stats.units, endpoint.cost.get());

            let reply = self.fetcher.send(endpoint, &request).await;
            match reply {
                Reply::Ok {
                    body,
                    actual_cost,
                    upstream,
                    ..
                } => {
                    self.settle_reported(endpoint, &request_id, recorded, actual_cost, &mut p)
                        .await;
                    if let Some(u) = upstream.filter(|u| u.remaining == 0) {
                        // The upstream's own count says it is spent: nobody
                        // spends on this credential until it resets.
                        self.block(endpoint, u.reset_in).await;
                        info!(credential = %endpoint.credential, blocked_ms = u.reset_in.as_millis() as u64,
                              "upstream reports its quota spent; credential blocked until its reset");
                    }
                    match self.sinks.write(job, &task.item, &body, now).await {
                        Ok(n) => {
                            p.records += n as u64;
                            Stats::add(&self.stats.records, n as u64);
                        }
                        Err(e) if e.is_bad_response() => {
                            break self
                                .fail(&p, Some(200), &format!("bad response: {e}"))
                                .await?;
                        }
                        Err(e) => {
                            break self
                                .retry(task, job, &p, None, &format!("sink: {e}"))
                                .await?;
                        }
                    }
                    p.pages += 1;
                    Stats::add(&self.stats.pages, 1);
                    let next = job.pagination.as_ref().and_then(|pg| {
                        body.pointer(&pg.cursor)
                            .and_then(|v| v.as_str())
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                    });
                    match next {
                        Some(token) if p.token.as_deref() == Some(token.as_str()) => {
                            // The same page again, for ever: each one spent.
                            break self
                                .fail(
                                    &p,
                                    Some(200),
                                    "cursor repeated: the upstream sent the page token it was given",
                                )
                                .await?;
                        }
                        Some(token) if p.page < max_pages => {
                            p.page += 1;
                            p.token = Some(token);
                            self.save(&p).await?;
                        }
                        _ => {
                            conn.del::<_, ()>(&cursor_key).await?;
                            break self.progress_outcome(
                                OutcomeKind::Done,
                                &p,
                                "all pages fetched",
                            );
                        }
                    }
                }
                Reply::Throttled {
                    status,
                    retry_after,
                    reason,
                    actual_cost,
                } => {
                    self.settle_reported(endpoint, &request_id, recorded, actual_cost, &mut p)
                        .await;
                    let blocked = self
                        .block(endpoint, retry_after.unwrap_or(endpoint.throttle_block))
                        .await;
                    let why = format!(
                        "upstream answered {status}{}; credential blocked for {}",
                        reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                        crate::config::fmt_duration(blocked)
                    );
                    let mut o = self
                        .wait_for_quota(
                            task,
                            job,
                            &p,
                            OutcomeKind::UpstreamThrottled,
                            blocked,
                            &why,
                        )
                        .await?;
                    o.status = Some(status);
                    break o;
                }
                Reply::Unreached { detail } => {
                    // Never reached the upstream: give the units back.
                    self.refund(endpoint, &request_id, recorded, &mut p).await;
                    break self
                        .retry(
                            task,
                            job,
                            &p,
                            None,
                            &format!("upstream unreachable (units refunded): {detail}"),
                        )
                        .await?;
                }
                Reply::TimedOut { detail } => {
                    break self
                        .retry(
                            task,
                            job,
                            &p,
                            None,
                            &format!("no complete answer: {detail}"),
                        )
                        .await?;
                }
                Reply::ServerError {
                    status,
                    actual_cost,
                } => {
                    // Kept (it may have been charged) unless the upstream
                    // says what it charged.
                    self.settle_reported(endpoint, &request_id, recorded, actual_cost, &mut p)
                        .await;
                    break self
                        .retry(
                            task,
                            job,
                            &p,
                            Some(status),
                            &format!("upstream answered {status}"),
                        )
                        .await?;
                }
                Reply::ClientError {
                    status,
                    detail,
                    actual_cost,
                } => {
                    self.settle_reported(endpoint, &request_id, recorded, actual_cost, &mut p)
                        .await;
                    let why = format!("upstream answered {status}: {detail}");
                    break self.fail(&p, Some(status), &why).await?;
                }
                Reply::BadBody { status, detail } => {
                    let why = format!("bad response: {detail}");
                    break self.fail(&p, Some(status), &why).await?;
                }
                Reply::Redirect {
                    next, actual_cost, ..
                } => {
                    // An answer: this hop's units stay spent; the next hop
                    // is spent at the top of the loop.
                    self.settle_reported(endpoint, &request_id, recorded, actual_cost, &mut p)
                        .await;
                    redirect = Some(*next);
                }
                Reply::RedirectRefused {
                    status,
                    why,
                    actual_cost,
                } => {
                    self.settle_reported(endpoint, &request_id, recorded, actual_cost, &mut p)
                        .await;
                    break self.fail(&p, Some(status), &why).await?;
                }
                Reply::TooLarge {
                    status,
                    limit,
                    actual_cost,
                } => {
                    self.settle_reported(endpoint, &request_id, recorded, actual_cost, &mut p)
                        .await;
                    let why = format!(
                        "response body over max_body {}; reading stopped there",
                        crate::fetch::fmt_size(limit)
                    );
                    break self.fail(&p, Some(status), &why).await?;
                }
                Reply::Unsent { detail } => {
                    self.refund(endpoint, &request_id, recorded, &mut p).await;
                    let why = format!("request not sent (units refunded): {detail}");
                    break self.fail(&p, None, &why).await?;
                }
            }
        };
        if outcome.kind == OutcomeKind::Done && ran.is_none_or(|r| r < task.tick) {
            let ttl = CHECKPOINT_TTL.as_secs();
            conn.set_ex::<_, _, ()>(&ran_key, task.tick, ttl).await?;
        }
        self.finish(task, Some(job), &outcome).await?;
        Ok(outcome)
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
        let mut o = self.progress_outcome(OutcomeKind::Failed, p, why);
        o.status = status;
        Ok(o)
    }

    /// The upstream said what a request really cost (a cost header, on any
    /// answer): the windows and the task's count follow. Nothing to settle
    /// for a spend that was not recorded (fail-open).
    async fn settle_reported(
        &self,
        endpoint: &Endpoint,
        request_id: &str,
        recorded: bool,
        actual: Option<u64>,
        p: &mut Progress,
    ) {
        let cost = endpoint.cost.get();
        let Some(reported) = actual.filter(|a| recorded && *a != cost) else {
            return;
        };
        // More than the largest window fills every window: settling more
        // says nothing new, and a huge number would fail the script (its
        // numbers are doubles).
        let most = self
            .config
            .windows_of(endpoint)
            .iter()
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
        if actual == cost {
            return;
        }
        match self
            .limiter
            .settle(&endpoint.name, request_id, actual)
            .await
        {
            Ok(_) => p.units = p.units - cost + actual,
            Err(e) => error!(endpoint = %endpoint.name, request_id, actual, error = %e,
                             "could not settle a request to its reported cost; the windows keep the configured cost"),
        }
    }

    /// Gives back the units of a request that never left.
    async fn refund(
        &self,
        endpoint: &Endpoint,
        request_id: &str,
        recorded: bool,
        p: &mut Progress,
    ) {
        if !recorded {
            return;
        }
        match self.limiter.settle(&endpoint.name, request_id, 0).await {
            Ok(_) => p.units -= endpoint.cost.get(),
            Err(e) => error!(endpoint = %endpoint.name, request_id, error = %e,
                             "could not refund a request that never left; its units stay spent"),
        }
    }

    /// Blocks the endpoint's credential for `wait` (at most `max_block`)
    /// and returns the block in force. A block Redis does not take is never
    /// ignored: it is logged as an error and held by this daemon itself
    /// ([`LocalBlocks`]), so no spend of this daemon goes through meanwhile.
    async fn block(&self, endpoint: &Endpoint, wait: Duration) -> Duration {
        let wait = wait.min(endpoint.max_block).max(Duration::from_millis(1));
        match self.limiter.block(&endpoint.credential, wait).await {
            Ok(blocked) => blocked,
            Err(e) => {
                error!(credential = %endpoint.credential, block_ms = wait.as_millis() as u64, error = %e,
                       "could not record the upstream's block in Redis; this daemon holds the credential blocked itself");
                self.local_blocks.hold(&endpoint.credential, wait);
                wait
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

    /// Checkpoints the run: the next run of the item resumes at `p.page`.
    async fn save(&self, p: &Progress) -> Result<(), TaskError> {
        let cp = Checkpoint {
            tick: p.tick,
            page: p.page,
            token: p.token.clone(),
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
    async fn wait_for_quota(
        &self,
        task: &TaskArgs,
        job: &Job,
        p: &Progress,
        kind: OutcomeKind,
        wait: Duration,
        why: &str,
    ) -> Result<Outcome, TaskError> {
        self.save(p).await?;
        let mut o = self.progress_outcome(kind, p, why);
        o.retry_after = Some(wait);
        if job.on_quota_exhausted == OnQuotaExhausted::Defer {
            o.requeued_in = Some(wait);
            self.queue
                .enqueue(&[(task.again(Origin::Defer), wait)])
                .await?;
        }
        Ok(o)
    }

    fn outcome(&self, kind: OutcomeKind, page: u32, detail: &str) -> Outcome {
        Outcome {
            kind,
            page,
            pages: 0,
            records: 0,
            units: 0,
            retry_after: None,
            requeued_in: None,
            status: None,
            detail: detail.to_owned(),
        }
    }

    fn progress_outcome(&self, kind: OutcomeKind, p: &Progress, detail: &str) -> Outcome {
        Outcome {
            pages: p.pages,
            records: p.records,
            units: p.units,
            ..self.outcome(kind, p.page, detail)
        }
    }

    /// A real failure: queue a retry with backoff, or fail when the attempts
    /// are used up. Either way the checkpoint stays, so the next run resumes.
    async fn retry(
        &self,
        task: &TaskArgs,
        job: &Job,
        p: &Progress,
        status: Option<u16>,
        why: &str,
    ) -> Result<Outcome, TaskError> {
        self.save(p).await?;
        let failures = task.failures + 1;
        if failures >= job.retry.attempts.get() {
            let mut o = self.progress_outcome(
                OutcomeKind::Failed,
                p,
                &format!(
                    "{why}; attempts used up ({failures} of {})",
                    job.retry.attempts
                ),
            );
            o.status = status;
            return Ok(o);
        }
        let wait = job.retry.backoff_for(failures);
        self.queue
            .enqueue(&[(task.again(Origin::Retry), wait)])
            .await?;
        let mut o = self.progress_outcome(
            OutcomeKind::Retrying,
            p,
            &format!(
                "{why}; attempt {} of {} in {}",
                failures + 1,
                job.retry.attempts,
                crate::config::fmt_duration(wait)
            ),
        );
        o.status = status;
        o.requeued_in = Some(wait);
        Ok(o)
    }

    /// Redis could not answer the spend and the endpoint is fail-closed: come
    /// back later, without counting it as a failure.
    async fn limiter_down(
        &self,
        task: &TaskArgs,
        p: &Progress,
        e: &QuotaError,
    ) -> Result<Outcome, TaskError> {
        self.save(p).await?;
        let wait = Duration::from_secs(5);
        self.queue
            .enqueue(&[(task.again(Origin::Defer), wait)])
            .await?;
        let mut o = self.progress_outcome(
            OutcomeKind::Retrying,
            p,
            &format!("limiter unavailable ({e}); endpoint is fail-closed, nothing sent"),
        );
        o.requeued_in = Some(wait);
        Ok(o)
    }

    /// Records the outcome: the done marker, the tick's counts, the log line.
    async fn finish(
        &self,
        task: &TaskArgs,
        job: Option<&Job>,
        o: &Outcome,
    ) -> Result<(), TaskError> {
        let keys = self.keys();
        let terminal = o.requeued_in.is_none();
        let field = if terminal {
            o.kind.as_str()
        } else if o.kind == OutcomeKind::Retrying {
            "~retrying"
        } else {
            "~deferred"
        };
        let outcomes = keys.tick_outcomes(&task.job, task.tick);
        let mut conn = self.conn.clone();
        redis::pipe()
            .set_ex(
                keys.task_done(&task.root),
                o.kind.as_str(),
                DONE_TTL.as_secs(),
            )
            .ignore()
            .hincr(&outcomes, field, 1)
            .ignore()
            .expire(&outcomes, DONE_TTL.as_secs() as i64)
            .ignore()
            .query_async::<()>(&mut conn)
            .await?;
        self.stats.outcome(o.kind);
        metrics::counter!("qw_tasks_total", "qw_job" => task.job.clone(), "outcome" => o.kind.as_str())
            .increment(1);
        if o.pages > 0 {
            metrics::counter!("qw_pages_total", "qw_job" => task.job.clone())
                .increment(u64::from(o.pages));
            metrics::counter!("qw_records_total", "qw_job" => task.job.clone())
                .increment(o.records);
        }
        if o.requeued_in.is_some() {
            Stats::add(&self.stats.requeued, 1);
        }
        log_outcome(task, job, o);
        if let Some(tx) = &self.events {
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
fn log_outcome(task: &TaskArgs, job: Option<&Job>, o: &Outcome) {
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

static ITEM_LOCK: std::sync::LazyLock<Lua> =
    std::sync::LazyLock::new(|| Lua::new(include_str!("../lua/item_lock.lua")));
