//! What the status page shows, as data: read from Redis at request time
//! (the windows through the spend script's peek, the rest through
//! [`super::read`] and the queue), the same for `GET /` and
//! `GET /api/status` (docs/status.md lists every field).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::conn::Conn;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::future::join_all;
use serde::Serialize;

use super::super::{OpsState, bounded, peek_all};
use super::read;
use crate::config::{Config, Job, SecretSource, WindowKind};
use crate::keys::KeySpace;
use crate::mint::Minter;
use crate::outcome::{DEFERRED, OutcomeKind, RETRYING};
use crate::queue::scripts::finish::{LastError, TickRecord};
use crate::quota::{BlockNote, ring};
use crate::quota::{CredentialUsage, Limiter, ResourceBlock, WindowUsage};
use crate::schedule::StarvedItems;

/// Slots in the last hour of the spend history.
const HOUR_SLOTS: usize = 12;

/// Everything the page shows.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    /// When it was read (the Redis clock when Redis answered).
    pub(crate) generated_at: String,
    /// Whether every read from Redis answered in time.
    pub(crate) redis_up: bool,
    /// The shared queue's depth, when it could be read.
    pub(crate) queue: Option<QueueStatus>,
    /// Every credential, in config order.
    pub(crate) credentials: Vec<CredentialStatus>,
    /// Every job, in config order.
    pub(crate) jobs: Vec<JobStatus>,
}

/// The shared queue (all jobs).
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct QueueStatus {
    /// In the backlog, due or not.
    pub(crate) backlog: u64,
    /// In apalis, waiting for a worker.
    pub(crate) queued: u64,
    /// Taken by a worker and not yet acknowledged.
    pub(crate) in_flight: u64,
}

/// One credential.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CredentialStatus {
    /// Its name in the config (never its secret).
    pub(crate) name: String,
    /// Whether its windows could be read.
    pub(crate) readable: bool,
    /// Its default resource's block, while it lasts (for a credential of
    /// one resource, its block).
    pub(crate) block: Option<Block>,
    /// Every resource's block in force, the default one first.
    pub(crate) blocks: Vec<Block>,
    /// Its resources' names, the default first (GitHub's `core`, `search`;
    /// one resource: `default`).
    pub(crate) resources: Vec<String>,
    /// Its windows, the credential's first, then its endpoints' own.
    pub(crate) windows: Vec<WindowStatus>,
    /// Its `secret_command`, as this daemon ran it (`None`: its secret is
    /// not minted).
    pub(crate) token: Option<TokenStatus>,
}

/// A credential's `secret_command` in this daemon. Each daemon mints and
/// keeps its own token, in memory only: another daemon's may differ. Never
/// the token itself.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TokenStatus {
    /// `unused` (no task has needed it since this daemon started), `fresh`,
    /// `expired` (older than `secret_ttl`: the next task runs the command),
    /// `refused` (an answer was 401: the next task runs it), `failed`
    /// (tasks that need it fail; it runs again at most once a minute), or
    /// `running`.
    pub(crate) state: &'static str,
    /// How long ago the token in use was minted.
    pub(crate) minted_ago_ms: Option<u64>,
    /// A fresh token: when it is replaced (`secret_ttl` minus its age).
    pub(crate) renews_in_ms: Option<u64>,
    /// The last failure, how long ago.
    pub(crate) failed_ago_ms: Option<u64>,
    /// The last failure: the command's exit, time limit or output problem
    /// (its standard error is in the daemon's log, scrubbed).
    pub(crate) error: Option<String>,
}

/// A block of one resource of a credential.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Block {
    /// The resource blocked (GitHub's `core`, `search`; `default`).
    pub(crate) resource: String,
    /// How long it still lasts.
    pub(crate) blocked_for_ms: u64,
    /// When it ends (RFC 3339, UTC).
    pub(crate) until: String,
    /// Why, in one stable word (`429`, `quota_reason`, `headers_at_zero`,
    /// `secondary_limit`, `throttled`, `usage`): the word stored with the
    /// block itself (so a block set by `quota-worker block`, another host or
    /// another language shows it too), else the recorded reason's.
    pub(crate) kind: Option<String>,
    /// Why, as the daemon that blocked it recorded it (`None`: not recorded).
    pub(crate) reason: Option<BlockNote>,
}

/// One window of a credential.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WindowStatus {
    /// `credential` or `endpoint:NAME`.
    pub(crate) scope: String,
    /// The resource it belongs to (GitHub's `core`, `search`; `default`).
    pub(crate) resource: String,
    /// `sliding`, `fixed`, `bucket` or `concurrent`.
    pub(crate) kind: &'static str,
    /// As `check` and `quota` write it: `9500/24h`.
    pub(crate) window: String,
    /// Its limit.
    pub(crate) units: u64,
    /// Its period.
    pub(crate) period_ms: u64,
    /// Units in it now.
    pub(crate) used: u64,
    /// Units left.
    pub(crate) remaining: u64,
    /// When units next leave it (sliding) or it resets (fixed); 0 when empty.
    pub(crate) frees_in_ms: u64,
    /// A concurrent window's leases held now (requests in flight; `used`
    /// is their units); absent for the other kinds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) leases: Option<u64>,
    /// Units recorded as drift (the upstream reported fewer left than the
    /// window admitted); `None` until the spend script reports it.
    pub(crate) drift: Option<u64>,
    /// Units spent in the last hour (the history's last 12 slots).
    pub(crate) spent_last_hour: u64,
    /// When it runs out at the last hour's rate.
    pub(crate) runs_out: RunsOut,
    /// Units spent per 5 minutes over the last 24 hours.
    pub(crate) history: SpendHistory,
    /// `"shadow"` for a shadow window (`mode = "shadow"`: it never
    /// refuses); absent for an enforced one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mode: Option<&'static str>,
    /// A shadow window's refusals over the last 24 hours: the spends it
    /// would have refused, admitted; absent for an enforced window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shadow_refusals: Option<u64>,
}

/// Units spent per slot, oldest first; the last slot is the current one
/// (partly elapsed).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SpendHistory {
    /// The slot length.
    pub(crate) slot_ms: u64,
    /// When the first slot started (RFC 3339, UTC).
    pub(crate) from: String,
    /// Units per slot.
    pub(crate) units: Vec<u64>,
}

/// When a window runs out at the last hour's rate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum RunsOut {
    /// Nothing was spent in the last hour.
    Idle,
    /// Nothing is left now.
    Out,
    /// A fixed window resets before the rate would use it up.
    ResetsFirst,
    /// A concurrent window: its units come back with every answer, so no
    /// rate uses it up.
    InFlight,
    /// At this rate a sliding window frees units as fast as they are spent.
    NotAtThisRate,
    /// It runs out then, at the latest (units that leave a sliding window
    /// meanwhile only postpone it).
    At {
        /// When (RFC 3339, UTC).
        at: String,
        /// How long from now.
        in_ms: u64,
    },
}

/// One job.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobStatus {
    /// Its name.
    pub(crate) name: String,
    /// Its endpoint.
    pub(crate) endpoint: String,
    /// The credential the endpoint charges.
    pub(crate) credential: String,
    /// Its cron expression (seconds first).
    pub(crate) schedule: String,
    /// The time zone the schedule is read in.
    pub(crate) timezone: String,
    /// Its next fire time (RFC 3339, UTC), if it has one.
    pub(crate) next_fire: Option<String>,
    /// Its newest ticks, newest first (at most 10).
    pub(crate) ticks: Vec<TickStatus>,
    /// Tasks of those ticks not yet ended (queued, waiting or running).
    pub(crate) open_tasks: u64,
    /// Its last failure (or retry after one).
    pub(crate) last_error: Option<ErrorStatus>,
    /// Its items starved now (docs/jobs.md, "Fairness"), the most starved
    /// first, at most 20; absent when none is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) starved: Option<Vec<Starved>>,
    /// Pages its sink refused for good, kept on this host under
    /// `<state_dir>/spool/%rejected/<job>/` (`quota-worker spool list`).
    pub(crate) rejected_pages: u64,
}

/// An item that got no quota for several ticks in a row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Starved {
    /// The item, as `region=US`.
    pub(crate) item: String,
    /// Ticks in a row it was starved.
    pub(crate) ticks: u64,
}

/// One tick of a job.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TickStatus {
    /// When it fired (RFC 3339, UTC).
    pub(crate) at: String,
    /// The tick, ms since the epoch.
    pub(crate) tick_ms: i64,
    /// Its tasks (one per fan-out item), when known.
    pub(crate) items: Option<u64>,
    /// How its tasks ended, by outcome (only outcomes that occurred).
    pub(crate) outcomes: BTreeMap<String, u64>,
    /// Tasks queued again after a failure (each retry counts).
    pub(crate) retried: u64,
    /// Tasks queued again for later without failing (each deferral counts).
    pub(crate) deferred: u64,
    /// Tasks not yet ended.
    pub(crate) open: u64,
}

/// A job's last error.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ErrorStatus {
    /// When (RFC 3339, UTC).
    pub(crate) at: String,
    /// `failed`, or `retrying` for one that was queued again.
    pub(crate) outcome: String,
    /// The fan-out item, as `region=US`.
    pub(crate) item: String,
    /// The tick it belonged to (RFC 3339, UTC).
    pub(crate) tick: String,
    /// The HTTP status, when one decided.
    pub(crate) status: Option<u16>,
    /// Why, as logged.
    pub(crate) detail: String,
}

fn rfc3339_ms(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The drift of a window: units the upstream reported as already used
/// that the window had not counted (the spend core's sync; see docs/spend.md).
fn drift(w: &WindowUsage) -> Option<u64> {
    Some(w.drift)
}

/// How many of a job's starved items the page lists (the most starved).
const STARVED_SHOWN: usize = 20;

/// A job's starved items as the page shows them (docs/jobs.md, "Fairness"):
/// none when no item is starved now.
fn starved_list(s: crate::schedule::StarvedItems) -> Option<Vec<Starved>> {
    (!s.items.is_empty()).then(|| {
        s.items
            .into_iter()
            .map(|(item, ticks)| Starved { item, ticks })
            .collect()
    })
}

/// A job's last ticks and its last error, as read.
type JobRead = Option<(Vec<TickRecord>, Option<LastError>)>;

/// Each job's last ticks and error, and its starved items, as read (each
/// `None` when it could not be read within the budget).
async fn read_jobs(
    conn: &Conn,
    keys: &KeySpace,
    jobs: &[&Job],
) -> Vec<(JobRead, Option<StarvedItems>)> {
    join_all(jobs.iter().map(|j| {
        let mut conn = conn.clone();
        async move {
            let record = bounded(
                "status page: a job's ticks",
                read::read_job(&mut conn, keys, &j.name),
            )
            .await;
            let starved = bounded(
                "status page: a job's starved items",
                read::starved_items(&mut conn, keys, &j.name, STARVED_SHOWN),
            )
            .await;
            (record, starved)
        }
    }))
    .await
}

/// Reads everything the page shows, each read within the budget; what
/// could not be read is shown as such (`redis_up` false). One config and
/// limiter serve the whole page, even across a reload.
pub(crate) async fn gather(s: &OpsState) -> Status {
    let keys = s.queue.keys();
    let conn = s.queue.connection();
    let live = s.live();
    let jobs: Vec<&Job> = live.config.jobs.values().collect();
    let (usages, depth, records) = tokio::join!(
        peek_all(&live.limiter),
        bounded("status page: the queue depth", s.queue.depth()),
        read_jobs(&conn, keys, &jobs),
    );
    // The credentials as read: a template stands for its tenants found in
    // Redis (`ig[account=123]`), whose history and block reasons are
    // recorded on the tenant's name, so they are read after the windows.
    let names: Vec<String> = usages.iter().map(|(n, _)| n.clone()).collect();
    let rings = rings_of(&live.limiter, &names);
    let blocked = blocked_resources(&usages);
    let (spent, reasons) = tokio::join!(
        bounded("status page: the spend history", async {
            read::read_rings(live.limiter.conn(), &rings).await
        }),
        bounded("status page: the block reasons", async {
            read::read_block_notes(&mut conn.clone(), keys, &blocked).await
        }),
    );
    let mut redis_up = spent.is_some() && reasons.is_some() && depth.is_some();
    let (now_ms, spent) = spent.unwrap_or_else(|| (Utc::now().timestamp_millis(), Vec::new()));
    let reasons = reasons.unwrap_or_default();
    let note_of = |name: &str, b: &ResourceBlock| note(&blocked, &reasons, name, b);
    let ring_of = |name: &str, w: &WindowUsage| -> Vec<u64> {
        let key = keys.spent_in(name, &w.scope, w.window.resource.as_deref());
        rings
            .iter()
            .position(|r| *r == key)
            .and_then(|i| spent.get(i).cloned())
            .unwrap_or_else(|| vec![0; ring::SLOTS])
    };
    let mut credentials = Vec::with_capacity(usages.len());
    for (name, usage) in usages {
        let mut c = credential(name, usage, &note_of, &ring_of, now_ms);
        c.token = token(&live.config, &s.minter, &c.name);
        redis_up &= c.readable;
        credentials.push(c);
    }
    let rejected = rejected_pages(&live.config, &jobs).await;
    let jobs = jobs
        .iter()
        .zip(records)
        .zip(rejected)
        .map(|((job, read), rejected)| (job, read, rejected))
        .map(|(job, (record, starved), rejected)| {
            if record.is_none() || starved.is_none() {
                redis_up = false;
            }
            let (ticks, error) = record.unwrap_or_default();
            let mut status = job_status(&live.config, job, ticks, error);
            status.starved = starved.and_then(starved_list);
            status.rejected_pages = rejected;
            status
        })
        .collect();
    Status {
        generated_at: rfc3339_ms(now_ms),
        redis_up,
        queue: depth.map(|d| QueueStatus {
            backlog: d.backlog,
            queued: d.queued,
            in_flight: d.in_flight,
        }),
        credentials,
        jobs,
    }
}

/// How many pages each job's sink refused for good, kept in the state
/// directory (a directory listing each, off the runtime).
async fn rejected_pages(config: &Config, jobs: &[&Job]) -> Vec<u64> {
    let spool = crate::sink::spool_dir(config);
    let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
    let n = names.len();
    tokio::task::spawn_blocking(move || {
        (names.iter())
            .map(|j| crate::sink::rejected_count(&spool, j) as u64)
            .collect()
    })
    .await
    .unwrap_or_else(|_| vec![0; n])
}

/// The note on block `b` of credential `name`, as read for `blocked`
/// ([`blocked_resources`]) into `reasons`.
fn note(
    blocked: &[(String, Option<String>)],
    reasons: &[Option<BlockNote>],
    name: &str,
    b: &ResourceBlock,
) -> Option<BlockNote> {
    let resource = (!b.default).then_some(b.resource.as_str());
    let at = (blocked.iter()).position(|(n, r)| n == name && r.as_deref() == resource)?;
    reasons.get(at).cloned().flatten()
}

/// The blocks in force of `usages`, each as its credential and resource
/// (`None`: the default one), whose notes the page reads.
fn blocked_resources(
    usages: &[(String, Option<CredentialUsage>)],
) -> Vec<(String, Option<String>)> {
    (usages.iter())
        .filter_map(|(n, u)| Some((n, u.as_ref()?)))
        .flat_map(|(n, u)| {
            (u.blocks.iter())
                .filter(|b| !b.blocked_for.is_zero())
                .map(|b| (n.clone(), (!b.default).then(|| b.resource.clone())))
        })
        .collect()
}

/// The spend history's rings of `credentials`, each once (the rings of a
/// credential's scopes; endpoints of one scope share them).
fn rings_of(limiter: &Limiter, credentials: &[String]) -> Vec<String> {
    let mut rings: Vec<String> = Vec::new();
    for name in credentials {
        if let Ok(plan) = limiter.quotas().plan_for(name) {
            for r in &plan.rings {
                if !rings.contains(r) {
                    rings.push(r.clone());
                }
            }
        }
    }
    rings
}

/// One credential as read (`usage`: `None` when its windows could not be
/// read), with the note on each resource's block (`note_of`) and each
/// window's spend history (`ring_of`).
fn credential(
    name: String,
    usage: Option<CredentialUsage>,
    note_of: &dyn Fn(&str, &ResourceBlock) -> Option<BlockNote>,
    ring_of: &dyn Fn(&str, &WindowUsage) -> Vec<u64>,
    now_ms: i64,
) -> CredentialStatus {
    let Some(u) = usage else {
        return CredentialStatus {
            name,
            readable: false,
            block: None,
            blocks: Vec::new(),
            resources: Vec::new(),
            windows: Vec::new(),
            token: None,
        };
    };
    let blocks: Vec<Block> = (u.blocks.iter())
        .filter(|b| !b.blocked_for.is_zero())
        .map(|b| {
            let note = note_of(&name, b);
            Block {
                resource: b.resource.clone(),
                blocked_for_ms: b.blocked_for.as_millis() as u64,
                until: rfc3339_ms(now_ms + b.blocked_for.as_millis() as i64),
                kind: (b.reason.map(|k| k.as_str().to_owned()))
                    .or_else(|| note.as_ref().and_then(|r| r.kind.clone())),
                reason: note,
            }
        })
        .collect();
    let default = u
        .blocks
        .iter()
        .find(|b| b.default)
        .map(|b| b.resource.as_str());
    let block = (blocks.iter())
        .find(|b| Some(b.resource.as_str()) == default)
        .cloned();
    let windows = (u.windows.iter())
        .map(|w| window(w, ring_of(&name, w), now_ms))
        .collect();
    CredentialStatus {
        name,
        readable: true,
        block,
        blocks,
        resources: u.blocks.iter().map(|b| b.resource.clone()).collect(),
        windows,
        token: None,
    }
}

/// Credential (tenant) `name`'s command as this daemon ran it; `None` when
/// its secret is not minted by a command.
fn token(config: &Config, minter: &Minter, name: &str) -> Option<TokenStatus> {
    let base = name.split('[').next().unwrap_or(name);
    let SecretSource::Command { ttl, .. } = &config.credentials.get(base)?.secret else {
        return None;
    };
    let ms = |d: Duration| d.as_millis() as u64;
    let Some(m) = minter.state(name) else {
        return Some(TokenStatus {
            state: "unused",
            minted_ago_ms: None,
            renews_in_ms: None,
            failed_ago_ms: None,
            error: None,
        });
    };
    let state = match (&m.minted_ago, &m.failed) {
        _ if m.running => "running",
        (None, Some(_)) => "failed",
        (Some(_), _) if m.refused => "refused",
        (Some(age), _) if age >= ttl => "expired",
        (Some(_), _) => "fresh",
        (None, None) => "unused",
    };
    Some(TokenStatus {
        state,
        minted_ago_ms: m.minted_ago.map(ms),
        renews_in_ms: (state == "fresh")
            .then(|| m.minted_ago.map(|age| ms(ttl.saturating_sub(age))))
            .flatten(),
        failed_ago_ms: m.failed.as_ref().map(|(ago, _)| ms(*ago)),
        error: m.failed.map(|(_, e)| e),
    })
}

fn window(w: &WindowUsage, ring: Vec<u64>, now_ms: i64) -> WindowStatus {
    let slot_ms = ring::SLOT.as_millis() as i64;
    let last_hour: u64 = ring.iter().rev().take(HOUR_SLOTS).sum();
    // The last hour: eleven whole slots and the current one so far.
    let span = Duration::from_millis(
        ((HOUR_SLOTS as i64 - 1) * slot_ms + now_ms.rem_euclid(slot_ms)) as u64,
    );
    let fixed = matches!(w.window.kind, WindowKind::Fixed { .. });
    let runs_out = if w.window.is_concurrent() {
        RunsOut::InFlight
    } else {
        runs_out(fixed, w, last_hour, span, now_ms)
    };
    let first_slot = now_ms.div_euclid(slot_ms) - (ring::SLOTS as i64 - 1);
    WindowStatus {
        scope: w.scope.to_string(),
        resource: w.resource.clone(),
        kind: w.window.kind_name(),
        window: w.window.describe(),
        units: w.window.units.get(),
        period_ms: w.window.per.as_millis() as u64,
        used: w.used,
        remaining: w.remaining,
        frees_in_ms: w.frees_in.as_millis() as u64,
        leases: w.window.is_concurrent().then_some(w.leases),
        drift: drift(w),
        spent_last_hour: last_hour,
        runs_out,
        history: SpendHistory {
            slot_ms: slot_ms as u64,
            from: rfc3339_ms(first_slot * slot_ms),
            units: ring,
        },
        mode: w.window.is_shadow().then_some("shadow"),
        shadow_refusals: w.window.is_shadow().then_some(w.shadow_refusals),
    }
}

/// When a window that counts a period runs out at the last hour's rate.
fn runs_out(fixed: bool, w: &WindowUsage, last_hour: u64, span: Duration, now_ms: i64) -> RunsOut {
    match project(
        fixed,
        w.window.per,
        w.remaining,
        w.frees_in,
        last_hour,
        span,
    ) {
        Projection::At(d) => RunsOut::At {
            at: rfc3339_ms(now_ms + d.as_millis() as i64),
            in_ms: d.as_millis() as u64,
        },
        Projection::Idle => RunsOut::Idle,
        Projection::Out => RunsOut::Out,
        Projection::ResetsFirst => RunsOut::ResetsFirst,
        Projection::NotAtThisRate => RunsOut::NotAtThisRate,
    }
}

/// [`RunsOut`] without the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Projection {
    Idle,
    Out,
    ResetsFirst,
    NotAtThisRate,
    At(Duration),
}

/// When a window with `remaining` units runs out if `spent` units every
/// `span` go on being spent. Units leaving a sliding window meanwhile are
/// not counted (so it runs out then at the latest); if it would take a
/// whole period, everything in it now has left by then and the rate alone
/// never fills it. A fixed window that resets first never runs out.
fn project(
    fixed: bool,
    per: Duration,
    remaining: u64,
    frees_in: Duration,
    spent: u64,
    span: Duration,
) -> Projection {
    if remaining == 0 {
        return Projection::Out;
    }
    if spent == 0 || span.is_zero() {
        return Projection::Idle;
    }
    let eta = span.mul_f64(remaining as f64 / spent as f64);
    match fixed {
        true if eta >= frees_in => Projection::ResetsFirst,
        false if eta >= per => Projection::NotAtThisRate,
        _ => Projection::At(eta),
    }
}

fn job_status(
    config: &Config,
    job: &Job,
    ticks: Vec<TickRecord>,
    error: Option<LastError>,
) -> JobStatus {
    let ticks: Vec<TickStatus> = ticks.into_iter().map(tick_status).collect();
    let credential = config
        .endpoints
        .get(&job.endpoint)
        .map(|e| e.credential.clone())
        .unwrap_or_default();
    JobStatus {
        name: job.name.clone(),
        endpoint: job.endpoint.clone(),
        credential,
        schedule: job.schedule.to_string(),
        timezone: job.timezone.to_string(),
        next_fire: crate::schedule::next_fires(job, Utc::now(), 1)
            .first()
            .map(|t| t.to_rfc3339_opts(SecondsFormat::Secs, true)),
        open_tasks: ticks.iter().map(|t| t.open).sum(),
        ticks,
        last_error: error.map(|e| ErrorStatus {
            at: rfc3339_ms(e.at_ms),
            outcome: e.outcome,
            item: e.item,
            tick: rfc3339_ms(e.tick),
            status: e.status,
            detail: e.detail,
        }),
        starved: None,
        rejected_pages: 0,
    }
}

fn tick_status(t: TickRecord) -> TickStatus {
    let count = |field: &str| t.counts.get(field).copied().unwrap_or(0).max(0) as u64;
    let outcomes: BTreeMap<String, u64> = OutcomeKind::ALL
        .iter()
        .map(|k| (k.as_str().to_owned(), count(k.as_str())))
        .filter(|(_, n)| *n > 0)
        .collect();
    let ended: u64 = outcomes.values().sum();
    let items = t.counts.get("#items").map(|n| (*n).max(0) as u64);
    TickStatus {
        at: rfc3339_ms(t.tick),
        tick_ms: t.tick,
        items,
        open: items.map_or(0, |n| n.saturating_sub(ended)),
        outcomes,
        retried: count(RETRYING),
        deferred: count(DEFERRED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn a_window_runs_out_at_the_last_hours_rate() {
        // 100 left, 50 an hour: two hours, in a 24-hour sliding window.
        assert_eq!(project(false, 24 * H, 100, H, 50, H), Projection::At(2 * H));
        // The same in a 1-hour sliding window: units leave as fast.
        assert_eq!(project(false, H, 100, H, 50, H), Projection::NotAtThisRate);
        // A fixed window that resets in an hour resets first.
        assert_eq!(
            project(true, 24 * H, 100, H, 50, H),
            Projection::ResetsFirst
        );
        assert_eq!(
            project(true, 24 * H, 100, 3 * H, 50, H),
            Projection::At(2 * H)
        );
        assert_eq!(project(false, H, 0, H, 50, H), Projection::Out);
        assert_eq!(project(false, H, 10, H, 0, H), Projection::Idle);
    }

    #[test]
    fn a_tick_counts_its_open_tasks() {
        let counts: BTreeMap<String, i64> = [
            ("#items", 8),
            ("done", 3),
            ("quota_exhausted", 2),
            (RETRYING, 4),
            ("#retry_at_ms", 1_732_345_200_000),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let t = tick_status(TickRecord {
            tick: 1_732_345_200_000,
            counts,
        });
        assert_eq!(t.items, Some(8));
        assert_eq!(t.open, 3);
        assert_eq!(t.retried, 4);
        assert_eq!(t.outcomes.len(), 2);
        assert_eq!(t.at, "2024-11-23T07:00:00Z");
    }
}
