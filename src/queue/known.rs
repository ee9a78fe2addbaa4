//! Which jobs the daemons on one Redis and prefix have loaded, and which
//! daemons are alive: what lets a rolling deploy (or a reload on some
//! daemons before others) lose no task.
//!
//! Every daemon says, at start, after every reload and every [`BEAT`], which
//! jobs its config has (`lua/known.lua`): the known-jobs hash keeps, per
//! job, the last Redis time any daemon had it. A worker that takes a task of
//! a job its own config does not have asks [`verdict`]: while some daemon
//! had the job within `unknown_job_grace` (or, for a job no daemon has ever
//! had, since the task was first given back), the task is given back for
//! another daemon; after that it ends `failed`, saying so. The wait before
//! it comes back is 1 s while a live daemon has the job (that daemon
//! should get it soon, and must not sit idle while it waits), and doubles
//! from 1 s to 30 s while none has (nothing can run it until a reload or
//! the rest of a deploy: it must not loop through the queue every second). `trigger` reads the same hashes to say whether a
//! running daemon has the job it queues ([`Loaded`], [`live_daemons`]).

use std::time::Duration;

use crate::conn::Conn;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::scripts::known::Known;
use crate::config::{Config, fmt_duration};
use crate::keys::KeySpace;

/// How often a daemon says what it has loaded.
pub const BEAT: Duration = Duration::from_secs(5);
/// How long a daemon's entry lives without a beat: three beats, so one late
/// beat on a loaded machine does not make a live daemon look gone.
pub const LIFE: Duration = Duration::from_secs(15);
/// How long the known-jobs hash remembers a job no daemon has any more
/// (longer than any grace worth setting; the whole hash expires after this
/// without a daemon).
pub const KEEP: Duration = Duration::from_secs(30 * 86_400);
/// The wait before a given-back task comes back while a live daemon has
/// its job; while none has, the first wait, each later one twice the last,
/// up to [`GIVE_BACK_MAX`].
pub const GIVE_BACK_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two give-backs of one task no live daemon can
/// run: about one trip through the queue per 30 s (instead of one a second
/// for the whole grace), while a daemon reloaded with the job still gets
/// it within 30 s.
pub const GIVE_BACK_MAX: Duration = Duration::from_secs(30);

/// What a daemon loaded, as it tells the others (and `trigger`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loaded {
    /// The host it runs on.
    pub host: String,
    /// Its pid.
    pub pid: u32,
    /// Its config file.
    pub config: String,
    /// The config's fingerprint ([`Config::fingerprint`]): the same files
    /// give the same one.
    pub fingerprint: String,
    /// How many jobs it has.
    pub jobs: usize,
    /// When it loaded them (Unix ms, its own clock).
    pub loaded_at: i64,
}

impl Loaded {
    /// What `config` is, loaded at `now_ms` by this process on `host`.
    pub fn of(config: &Config, host: &str, now_ms: i64) -> Self {
        Loaded {
            host: host.to_owned(),
            pid: std::process::id(),
            config: config.path.display().to_string(),
            fingerprint: config.fingerprint.clone(),
            jobs: config.jobs.len(),
            loaded_at: now_ms,
        }
    }
}

/// Says that daemon `id` is alive with `config`'s jobs loaded (`prune`:
/// also forget jobs no daemon has had for [`KEEP`]). Returns Redis time, ms.
pub(crate) async fn announce(
    conn: &mut Conn,
    keys: &KeySpace,
    id: &str,
    config: &Config,
    loaded: &Loaded,
    prune: bool,
) -> redis::RedisResult<i64> {
    let json = serde_json::to_string(loaded).unwrap_or_default();
    let jobs: Vec<&str> = config.jobs.keys().map(String::as_str).collect();
    (Known::announce(keys, id, LIFE, KEEP, &json, jobs, prune))
        .invoke(conn)
        .await
}

/// Says that daemon `id` stops (a clean shutdown).
pub(crate) async fn withdraw(conn: &mut Conn, keys: &KeySpace, id: &str) -> redis::RedisResult<()> {
    Known::withdraw(keys, id).invoke(conn).await.map(|_| ())
}

/// Redis time (ms) and when a daemon last had `job` loaded (ms), if one has
/// within [`KEEP`].
pub(crate) async fn last_known(
    conn: &mut Conn,
    keys: &KeySpace,
    job: &str,
) -> redis::RedisResult<(i64, Option<i64>)> {
    let ((secs, micros), last): ((i64, i64), Option<i64>) = redis::pipe()
        .cmd("TIME")
        .hget(keys.known_jobs(), job)
        .query_async(conn)
        .await?;
    Ok((secs * 1000 + micros / 1000, last))
}

/// Redis time (ms), the daemons alive now with what each loaded, and when
/// any daemon last had `job` loaded.
pub async fn live_daemons(
    conn: &mut Conn,
    keys: &KeySpace,
    job: &str,
) -> redis::RedisResult<(i64, Vec<(String, Loaded)>, Option<i64>)> {
    let (now, last) = last_known(conn, keys, job).await?;
    let all: Vec<(String, String)> = conn.hgetall(keys.daemons()).await?;
    let live = (all.into_iter())
        .filter_map(|(id, v)| {
            let (until, json) = v.split_once(' ')?;
            let until: i64 = until.parse().ok()?;
            let loaded = serde_json::from_str(json).ok()?;
            (until >= now).then_some((id, loaded))
        })
        .collect();
    Ok((now, live, last))
}

/// Whether a daemon has `job` loaded now: it said so within [`LIFE`].
pub fn has_it_now(now: i64, last: Option<i64>) -> bool {
    last.is_some_and(|t| now.saturating_sub(t) <= LIFE.as_millis() as i64)
}

/// What a worker does with a task of a job its config does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub(crate) enum Unknown {
    /// Give it back: queued again after `wait`, for a daemon that has the
    /// job (no attempt counted). `since`: when the job was first found
    /// unknown for this task (kept in the task).
    GiveBack { wait: Duration, since: i64 },
    /// No daemon has had the job for the grace: the task ends `failed`.
    Fail(String),
}

/// What to do with a task of `job` that this daemon does not know, at Redis
/// time `now` (ms): `last` is when a daemon last had the job loaded, `since`
/// when this task was first given back (none: not yet), `given_back` how
/// often it was. The grace counts from the later of the two: a job no
/// daemon has ever had (queued by a `trigger` that read a newer config than
/// any daemon runs) gets the whole grace for a daemon to be reloaded.
pub(crate) fn verdict(
    job: &str,
    now: i64,
    last: Option<i64>,
    since: Option<i64>,
    given_back: u32,
    grace: Duration,
) -> Unknown {
    let since = since.unwrap_or(now);
    let from = last.map_or(since, |t| t.max(since));
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    if now.saturating_sub(from) < grace_ms {
        let wait = if has_it_now(now, last) {
            GIVE_BACK_FIRST
        } else {
            GIVE_BACK_FIRST
                .saturating_mul(2u32.saturating_pow(given_back.min(16)))
                .min(GIVE_BACK_MAX)
        };
        return Unknown::GiveBack { wait, since };
    }
    let grace = fmt_duration(grace);
    let when = match last {
        Some(t) => format!(
            "a daemon last had it {} ago",
            fmt_duration(Duration::from_millis(now.saturating_sub(t).max(0) as u64))
        ),
        None => "no daemon on this Redis and prefix has had it".into(),
    };
    Unknown::Fail(format!(
        "job {job:?} is in no running daemon's configuration: none has had it for unknown_job_grace ({grace}; {when}); add it back and reload, or it was removed on purpose"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(600);
    const NOW: i64 = 1_000_000_000;

    fn wait(u: &Unknown) -> Option<u64> {
        match u {
            Unknown::GiveBack { wait, .. } => Some(wait.as_secs()),
            Unknown::Fail(_) => None,
        }
    }

    /// The rolling deploy: another daemon has the job now, and gets the
    /// task back after 1 s, however often it was given back.
    #[test]
    fn a_job_another_daemon_has_now_is_given_back_for_a_second() {
        for n in [0, 1, 5, 100] {
            let u = verdict("j", NOW, Some(NOW - 3_000), Some(NOW - 9_000), n, GRACE);
            assert_eq!(wait(&u), Some(1), "{n}");
        }
        let u = verdict("j", NOW, Some(NOW - 3_000), None, 0, GRACE);
        assert_eq!(
            u,
            Unknown::GiveBack {
                wait: Duration::from_secs(1),
                since: NOW
            }
        );
    }

    /// No live daemon has it (one had it 20 s ago: a deploy in progress):
    /// each wait twice the last, from 1 s to 30 s.
    #[test]
    fn a_job_no_live_daemon_has_is_given_back_with_a_doubling_wait() {
        let waits: Vec<_> = (0..8)
            .map(|n| {
                let u = verdict("j", NOW, Some(NOW - 20_000), Some(NOW - 9_000), n, GRACE);
                wait(&u)
            })
            .collect();
        let s = |x| Some(x);
        assert_eq!(waits, [s(1), s(2), s(4), s(8), s(16), s(30), s(30), s(30)]);
    }

    #[test]
    fn a_job_no_daemon_had_within_the_grace_fails_naming_it() {
        // Had until 11 minutes ago, given back for 11 minutes already.
        let last = NOW - 660_000;
        let u = verdict("onlya", NOW, Some(last), Some(last), 9, GRACE);
        let Unknown::Fail(why) = u else {
            panic!("{u:?}")
        };
        assert!(why.contains("job \"onlya\""), "{why}");
        assert!(why.contains("unknown_job_grace (10m"), "{why}");
        assert!(why.contains("last had it 11m ago"), "{why}");
    }

    /// A job no daemon has ever had: the grace counts from the task's first
    /// give-back, so a reload within it still runs the task.
    #[test]
    fn a_job_no_daemon_ever_had_waits_the_grace_from_the_first_give_back() {
        assert!(wait(&verdict("new", NOW, None, None, 0, GRACE)).is_some());
        let since = NOW - 599_000;
        assert!(wait(&verdict("new", NOW, None, Some(since), 5, GRACE)).is_some());
        let Unknown::Fail(why) = verdict("new", NOW, None, Some(NOW - 600_000), 6, GRACE) else {
            panic!("not failed")
        };
        assert!(
            why.contains("no daemon on this Redis and prefix has had it"),
            "{why}"
        );
        // A job a daemon had long ago: re-added on disk, queued before the
        // reload; its task still gets the grace from its first give-back.
        assert!(wait(&verdict("old", NOW, Some(NOW - 86_400_000), None, 0, GRACE)).is_some());
    }

    #[test]
    fn a_grace_of_zero_fails_at_once() {
        let u = verdict("j", NOW, Some(NOW), None, 0, Duration::ZERO);
        assert!(matches!(u, Unknown::Fail(_)), "{u:?}");
    }
}
