//! Pages a sink refused **for good** (issue 37): a PostgreSQL data,
//! integrity or schema error, SQLite's constraint, type or SQL errors, a
//! file name too long for the file system. Retrying such a page can never
//! help, so it is not spooled (the spool's retry loop would try it every
//! 10 s for ever, and hold the item's later pages behind it). It is kept
//! where an operator can look at it, with its error beside it:
//!
//! ```text
//! <state_dir>/spool/%rejected/<job>/<fetched_at ms>-<item tag>-<uuid>.json    the page, as the spool keeps one
//! <state_dir>/spool/%rejected/<job>/<fetched_at ms>-<item tag>-<uuid>.error   its Note (JSON): the error, when, ...
//! ```
//!
//! (`%rejected` is no job's directory: a job's directory name holds a `%`
//! only as the start of an `%XX` escape.)
//!
//! A kept page **holds** its item (or, for an error of the table itself, a
//! PostgreSQL schema or permission error, its whole job): no task of this
//! process fetches a page of it, so no tick spends units to be refused
//! again, until `quota-worker spool retry JOB` writes the kept pages again
//! (and lifts the hold, whatever comes of it), or a reload changes the job
//! (the note records a fingerprint of the job's config as it was refused).
//! Deleting a kept page's two files gives it up, and lifts its hold too.
//! The hold is read from these files (re-read when the directory changes,
//! and at least every [`REREAD`]), so it survives a restart, and the
//! `spool` command, another process, lifts it by writing them.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use chrono::{SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

use super::spool::{self, Page, Tag};
use super::{SinkError, Sinks, blocking, lock, sanitize};
use crate::config::{Item, Job};

/// The directory under the spool that keeps refused pages.
const DIR: &str = "%rejected";

/// How long a read of a job's kept pages serves before it is read again
/// even though the directory's time did not change (it changes at a coarse
/// clock's tick: a change in the same tick as the read is missed).
const REREAD: Duration = Duration::from_secs(5);

/// How far a refusal for good reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The page's own data: its item is held.
    Item,
    /// The sink itself (a PostgreSQL table's columns, types or
    /// permissions): every item of the job would be refused; the job is held.
    Job,
}

/// What is kept beside a refused page (`<page>.error`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Note {
    /// Why the sink refused it.
    pub(super) error: String,
    /// When (RFC 3339, UTC).
    pub(super) rejected_at: String,
    pub(super) scope: Scope,
    /// A fingerprint of the job's config when it was refused: a reload
    /// that changes the job lifts the hold.
    pub(super) job_config: String,
    /// Whether it holds its item (or job) now: `spool retry` lifts it.
    pub(super) held: bool,
}

/// A fingerprint of `job`'s config, as a reload compares jobs (how they
/// print: their compiled templates and schedules do not compare).
pub(super) fn fingerprint(job: &Job) -> String {
    sha1_smol::Sha1::from(format!("{job:?}"))
        .digest()
        .to_string()
}

/// What holds an item: the note of its kept page, and where that is.
#[derive(Debug, Clone)]
pub(super) struct Hold {
    pub(super) note: Note,
    pub(super) file: PathBuf,
}

/// A job's kept pages as last read.
struct Read {
    mtime: SystemTime,
    at: Instant,
    pages: Vec<(Tag, Hold)>,
}

/// The kept pages of every job, and what holds what.
#[derive(Default)]
pub(super) struct Rejected {
    dir: PathBuf,
    read: Mutex<HashMap<String, Read>>,
    /// Each job's [`fingerprint`], computed once: one `Rejected` serves
    /// one config (a reload makes another), and a job's printed form can
    /// be large (its `fan_out` lists).
    fingerprints: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rejected")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The directory of refused pages under the spool directory `spool`.
pub(super) fn root(spool: &Path) -> PathBuf {
    spool.join(DIR)
}

/// `page`'s note file.
fn note_path(page: &Path) -> PathBuf {
    page.with_extension("error")
}

impl Rejected {
    pub(super) fn new(spool: &Path) -> Self {
        Rejected {
            dir: root(spool),
            read: Mutex::default(),
            fingerprints: Mutex::default(),
        }
    }

    pub(super) fn dir_for(&self, job: &str) -> PathBuf {
        self.dir.join(sanitize(job))
    }

    /// What holds `item` of `job` now, if anything: a kept page of the item
    /// (or one that holds the whole job), refused under the job's present
    /// config, whose hold no `spool retry` lifted. Blocking I/O: a `stat`
    /// when the job has no kept page.
    pub(super) fn hold(&self, job: &Job, item: &Item) -> Option<Hold> {
        let dir = self.dir_for(&job.name);
        let mtime = std::fs::metadata(&dir).and_then(|m| m.modified()).ok()?;
        let mut read = lock(&self.read);
        let fresh = read
            .get(&job.name)
            .is_some_and(|r| r.mtime == mtime && r.at.elapsed() < REREAD);
        if !fresh {
            let pages = read_holds(&dir);
            let at = Instant::now();
            read.insert(job.name.clone(), Read { mtime, at, pages });
        }
        let config = lock(&self.fingerprints)
            .entry(job.name.clone())
            .or_insert_with(|| fingerprint(job))
            .clone();
        let tag = Tag::of(item);
        read.get(&job.name)?
            .pages
            .iter()
            .find(|(t, h)| {
                h.note.held
                    && h.note.job_config == config
                    && (h.note.scope == Scope::Job || *t == tag)
            })
            .map(|(_, h)| h.clone())
    }

    /// Forgets what was read of `job`'s pages: this process just kept one.
    fn changed(&self, job: &str) {
        lock(&self.read).remove(job);
    }

    /// Keeps `page` with `note`: the note first, then the page (written
    /// whole, renamed into place), so a kept page always has its note.
    fn keep(&self, page: &Page, note: &Note, at_ms: i64) -> io::Result<PathBuf> {
        let dir = self.dir_for(&page.job);
        std::fs::create_dir_all(&dir)?;
        let name = spool::page_name(&page.item, at_ms);
        write_note(&note_path(&dir.join(&name)), note)?;
        spool::save_as(&dir, &name, page)
    }

    /// Moves the spooled page at `from` here, with `note`.
    fn take(&self, job: &str, from: &Path, note: &Note) -> io::Result<PathBuf> {
        let dir = self.dir_for(job);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(from.file_name().unwrap_or_default());
        write_note(&note_path(&path), note)?;
        std::fs::rename(from, &path)?;
        File::open(&dir)?.sync_all()?;
        Ok(path)
    }
}

/// Writes `note` to `path`, whole (a temporary file renamed into place).
fn write_note(path: &Path, note: &Note) -> io::Result<()> {
    let tmp = path.with_extension("error.tmp");
    let text = serde_json::to_vec_pretty(note).map_err(io::Error::other)?;
    let written = std::fs::write(&tmp, text)
        .and_then(|()| File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn read_note(page: &Path) -> Option<Note> {
    let text = std::fs::read(note_path(page)).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The kept pages in `dir` and their notes (a page without a readable
/// note holds its item, under any config: it was refused, and nobody says
/// otherwise).
fn read_holds(dir: &Path) -> Vec<(Tag, Hold)> {
    spool::page_files(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|file| {
            let note = read_note(&file).unwrap_or_else(|| Note {
                error: "(its .error file is missing)".into(),
                rejected_at: String::new(),
                scope: Scope::Item,
                job_config: String::new(),
                held: true,
            });
            (Tag::of_file(&file), Hold { note, file })
        })
        .collect()
}

/// One kept page, as `quota-worker spool list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct KeptPage {
    /// The job.
    pub job: String,
    /// The item, as `region=US`.
    pub item: String,
    /// The run's tick (ms since the epoch), when known.
    pub tick: Option<i64>,
    /// The page number in its run, when known.
    pub page: Option<u32>,
    /// When it was fetched (RFC 3339).
    pub fetched_at: String,
    /// Records on it.
    pub records: usize,
    /// When the sink refused it (RFC 3339).
    pub rejected_at: String,
    /// Why.
    pub error: String,
    /// `item` or `job`: what it holds.
    pub scope: Scope,
    /// Whether it holds its item (or job) now.
    pub held: bool,
    /// The page's file (its note: the same name, `.error`).
    pub file: PathBuf,
}

/// The pages kept under the spool directory `spool` (of `job` only, when
/// given), by job, oldest first.
pub fn list(spool: &Path, job: Option<&str>) -> io::Result<Vec<KeptPage>> {
    let root = root(spool);
    let mut dirs: Vec<PathBuf> = match job {
        Some(j) => vec![root.join(sanitize(j))],
        None => match std::fs::read_dir(&root) {
            Ok(d) => d
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        },
    };
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let files = match spool::page_files(&dir) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for file in files {
            let Ok(text) = std::fs::read(&file) else {
                continue;
            };
            let Ok(page) = serde_json::from_slice::<Page>(&text) else {
                continue;
            };
            let note = read_note(&file);
            out.push(KeptPage {
                job: page.job,
                item: crate::queue::item_key(&page.item),
                tick: page.tick,
                page: page.page,
                fetched_at: page.fetched_at,
                records: page.records.len(),
                rejected_at: note
                    .as_ref()
                    .map(|n| n.rejected_at.clone())
                    .unwrap_or_default(),
                error: note.as_ref().map_or_else(
                    || "(its .error file is missing)".into(),
                    |n| n.error.clone(),
                ),
                scope: note.as_ref().map_or(Scope::Item, |n| n.scope),
                held: note.as_ref().is_none_or(|n| n.held),
                file,
            });
        }
    }
    Ok(out)
}

/// How many pages of `job` are kept under the spool directory `spool`.
pub fn count(spool: &Path, job: &str) -> usize {
    spool::page_files(&root(spool).join(sanitize(job))).map_or(0, |f| f.len())
}

/// What `spool retry` did with one kept page.
#[derive(Debug)]
pub struct Retried {
    /// The page's file, as it was (its note: the same name, `.error`).
    pub file: PathBuf,
    /// Its item, as `region=US` (empty when another process held it).
    pub item: String,
    /// What came of it.
    pub outcome: RetryOutcome,
}

/// What came of writing one kept page again.
#[derive(Debug)]
pub enum RetryOutcome {
    /// Written to the sink (this many rows added or replaced), and its
    /// files removed.
    Written(usize),
    /// The sink still refuses it for good, saying this: kept, its note
    /// updated, its hold lifted (the item's next run fetches that page
    /// again).
    Refused(String),
    /// The sink could not take it now (down, full), saying this: kept as
    /// it was, its hold lifted.
    NotNow(String),
    /// Another process holds the page's file (a `spool retry` running).
    Busy,
}

impl Sinks {
    /// Keeps a page `cause` says the sink refuses for good, and says so:
    /// [`SinkError::Rejected`], naming where the page is (or why it could
    /// not be kept: then nothing holds its item); without a place to keep
    /// it, `cause` itself.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn reject(
        &self,
        job: &Job,
        item: &Item,
        at: Option<super::PageRef>,
        records: &[serde_json::Value],
        fetched_at: chrono::DateTime<Utc>,
        cause: SinkError,
        scope: Scope,
    ) -> SinkError {
        // Without a state directory (a command's or a test's sinks), the
        // sink's own error: it fails the task all the same.
        let kept = match self.rejected.clone() {
            None => return cause,
            Some(rejected) => {
                let page = Page {
                    job: job.name.clone(),
                    item: item.clone(),
                    fetched_at: fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true),
                    tick: at.map(|a| a.tick),
                    page: at.map(|a| a.page),
                    records: records.to_vec(),
                };
                let note = new_note(job, &cause, scope);
                let at_ms = fetched_at.timestamp_millis();
                let (r, name) = (rejected.clone(), job.name.clone());
                let kept = blocking(move || {
                    r.keep(&page, &note, at_ms).map_err(|source| SinkError::Io {
                        path: r.dir_for(&page.job),
                        source,
                    })
                })
                .await;
                rejected.changed(&name);
                kept.map_err(|e| e.to_string())
            }
        };
        refused(job, item, &cause, scope, kept.as_ref().ok());
        SinkError::Rejected {
            job: job.name.clone(),
            cause: Box::new(cause),
            kept: kept.map_err(|e| format!("and it could not be kept: {e}")),
            scope,
        }
    }

    /// Moves the spooled page at `path`, which the sink refused for good
    /// on replay, out of the spool into the kept pages, so that it holds
    /// its item and no longer holds back the item's later pages.
    pub(super) async fn reject_spooled(
        &self,
        job: &Job,
        item: &Item,
        path: &Path,
        cause: SinkError,
        scope: Scope,
    ) -> Result<(), SinkError> {
        let Some(rejected) = self.rejected.clone() else {
            return Err(cause);
        };
        let note = new_note(job, &cause, scope);
        let (r, name, from) = (rejected.clone(), job.name.clone(), path.to_owned());
        let kept = blocking(move || {
            r.take(&name, &from, &note).map_err(|source| SinkError::Io {
                path: from.clone(),
                source,
            })
        })
        .await;
        rejected.changed(&job.name);
        let kept = kept?;
        refused(job, item, &cause, scope, Some(&kept));
        Ok(())
    }

    /// What holds `item` of `job` now, as the error a task that may not
    /// fetch for it ends with.
    pub(super) async fn held(&self, job: &Job, item: &Item) -> Result<(), SinkError> {
        let Some(rejected) = self.rejected.clone() else {
            return Ok(());
        };
        // One `stat` on the runtime when the job has no kept page, the
        // common case; reading the notes goes to the blocking pool.
        if !rejected.dir_for(&job.name).exists() {
            return Ok(());
        }
        let (j, i) = (job.clone(), item.clone());
        match blocking(move || Ok(rejected.hold(&j, &i))).await? {
            None => Ok(()),
            Some(hold) => Err(SinkError::Held {
                job: job.name.clone(),
                scope: hold.note.scope,
                error: hold.note.error,
                file: hold.file,
            }),
        }
    }

    /// `quota-worker spool retry JOB`: writes each page kept for `job`
    /// once, oldest first, with the job's sink as now configured; a page
    /// written is removed, one still refused stays with its new error;
    /// either way its hold is lifted.
    pub async fn retry_rejected(&self, job: &Job) -> Result<Vec<Retried>, SinkError> {
        let Some(rejected) = self.rejected.clone() else {
            return Ok(Vec::new());
        };
        let dir = rejected.dir_for(&job.name);
        let files = blocking(move || {
            spool::page_files(&dir).or_else(|e| match e.kind() {
                io::ErrorKind::NotFound => Ok(Vec::new()),
                _ => Err(SinkError::Io {
                    path: dir,
                    source: e,
                }),
            })
        })
        .await?;
        let mut done = Vec::with_capacity(files.len());
        for file in files {
            done.push(self.retry_one(job, &file).await?);
        }
        rejected.changed(&job.name);
        Ok(done)
    }

    async fn retry_one(&self, job: &Job, file: &Path) -> Result<Retried, SinkError> {
        let p = file.to_owned();
        let claimed =
            blocking(move || spool::claim(&p).map_err(|source| SinkError::Io { path: p, source }))
                .await?;
        let retried = |item: String, outcome| Retried {
            file: file.to_owned(),
            item,
            outcome,
        };
        let claimed = match claimed {
            None => return Ok(retried(String::new(), RetryOutcome::Busy)),
            Some(Err(source)) => {
                let path = file.to_owned();
                return Err(SinkError::Io { path, source });
            }
            Some(Ok(c)) => c,
        };
        let item = crate::queue::item_key(&claimed.page.item);
        let (at, fetched_at) = claimed.page.parts();
        let page = &claimed.page;
        let written = (self.write_records(job, &page.item, at, &page.records, fetched_at))
            .await
            .map_err(SinkError::classified);
        let outcome = match written {
            Ok(records) => {
                forget(file).await?;
                tracing::info!(job = %job.name, item = %item, records,
                    "a page the sink had refused was written by `spool retry`");
                RetryOutcome::Written(records)
            }
            Err(e) => {
                lift(job, file, &e).await?;
                match e.for_good() {
                    Some(_) => RetryOutcome::Refused(e.to_string()),
                    None => RetryOutcome::NotNow(e.to_string()),
                }
            }
        };
        // Unlocked only now that it is gone, or its note says what became
        // of it.
        drop(claimed);
        Ok(retried(item, outcome))
    }
}

/// Removes a kept page written again, and its note.
async fn forget(file: &Path) -> Result<(), SinkError> {
    let path = file.to_owned();
    blocking(move || {
        std::fs::remove_file(&path)
            .and_then(|()| match std::fs::remove_file(note_path(&path)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            })
            .map_err(|source| SinkError::Io { path, source })
    })
    .await
}

/// Lifts a kept page's hold after `spool retry` could not write it: its
/// note says so, with the new error when the sink still refuses it for
/// good (and the job's config it was refused under).
async fn lift(job: &Job, file: &Path, e: &SinkError) -> Result<(), SinkError> {
    let note = match e.for_good() {
        Some(scope) => new_note(job, e, scope),
        None => read_note(file).unwrap_or_else(|| new_note(job, e, Scope::Item)),
    };
    let note = Note {
        held: false,
        ..note
    };
    let n = note_path(file);
    blocking(move || write_note(&n, &note).map_err(|source| SinkError::Io { path: n, source }))
        .await
}

fn new_note(job: &Job, cause: &SinkError, scope: Scope) -> Note {
    Note {
        error: cause.to_string(),
        rejected_at: Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true),
        scope,
        job_config: fingerprint(job),
        held: true,
    }
}

/// Logs and counts a page kept as refused.
fn refused(job: &Job, item: &Item, cause: &SinkError, scope: Scope, kept: Option<&PathBuf>) {
    metrics::counter!("qw_sink_rejected_pages_total", "qw_job" => job.name.clone()).increment(1);
    let holds = match scope {
        Scope::Item => "its item",
        Scope::Job => "its whole job",
    };
    tracing::error!(job = %job.name, item = %crate::queue::item_key(item), error = %cause,
        kept = ?kept, holds,
        "the sink refused the page for good: kept, not spooled; nothing more is fetched for what it holds until `quota-worker spool retry` writes it or a reload changes the job");
}
