//! The spool: pages the sink could not take (disk full, read-only, database
//! locked past the busy timeout), kept under the state directory and
//! written later, so a page that cost quota is never fetched again because
//! of a local error.
//!
//! One file per page, `<state_dir>/spool/<job>/<fetched_at ms>-<uuid>.json`,
//! holding the job, the item, the fetch time, which page of which run it is
//! (a postgres sink's page id) and the page's records. It is
//! written under a dot-name, `fsync`ed and renamed into place, so a reader
//! only ever sees whole pages. Pages are replayed oldest first:
//!
//! - before the next page of the same job is written (by any task of this
//!   process), so a job's pages reach the sink in fetch order;
//! - by a retry loop that runs while this process has spooled pages
//!   (every second at first, backing off to every 10 s while the sink still
//!   fails);
//! - at start, when the spool holds pages left by an earlier run.
//!
//! Several processes may share one state directory: a replayer holds an
//! exclusive `flock` on the page file while it writes it and deletes it
//! before letting go; a file deleted under a waiting replayer is skipped
//! (its link count is 0). Delivery stays at least once: a process killed
//! between the sink's write and the delete writes that page again later
//! (SQLite with `key` absorbs it; a postgres sink knows the page's id and
//! adds nothing).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{PageRef, SinkError, Sinks, blocking, lock, sanitize};
use crate::config::Item;
use crate::config::Job;

/// The retry loop's first wait, and its longest.
const FIRST_WAIT: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(10);

/// Where pages wait, and which jobs this process knows have some there.
#[derive(Debug)]
pub(super) struct Spool {
    dir: PathBuf,
    /// The jobs, to write a spooled page with its job's sink.
    jobs: IndexMap<String, Job>,
    /// Jobs with spooled pages, as far as this process knows.
    pending: Mutex<HashSet<String>>,
    /// Whether a retry loop runs.
    looping: AtomicBool,
}

/// One spooled page, as stored.
#[derive(Serialize, Deserialize)]
struct Page {
    job: String,
    item: Item,
    fetched_at: String,
    /// The run's tick and the page number; absent in pages spooled before
    /// they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tick: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    page: Option<u32>,
    records: Vec<Value>,
}

impl Spool {
    pub(super) fn new(dir: PathBuf, jobs: IndexMap<String, Job>) -> Self {
        // Pages an earlier run left behind.
        let pending = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| page_files(&e.path()).is_ok_and(|f| !f.is_empty()))
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                jobs.keys().find(|j| sanitize(j) == name).cloned()
            })
            .collect();
        Spool {
            dir,
            jobs,
            pending: Mutex::new(pending),
            looping: AtomicBool::new(false),
        }
    }

    /// The directory `job`'s pages wait in.
    pub(super) fn dir_for(&self, job: &str) -> PathBuf {
        self.dir.join(sanitize(job))
    }

    pub(super) fn has_pending(&self, job: &str) -> bool {
        lock(&self.pending).contains(job)
    }

    fn any_pending(&self) -> bool {
        !lock(&self.pending).is_empty()
    }
}

/// The page files in `dir`, oldest first (dot-files are pages being written).
fn page_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.') && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Writes `page` to a new file in `dir`, whole or not at all.
fn save(dir: &Path, page: &Page, at_ms: i64) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let name = format!("{at_ms:013}-{}.json", uuid::Uuid::new_v4().simple());
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(&name);
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        serde_json::to_writer(&mut f, page).map_err(io::Error::other)?;
        f.flush()?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        // The rename itself must survive a power loss too.
        File::open(dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// A spooled page claimed for replay: its file stays locked until dropped.
struct Claimed {
    path: PathBuf,
    _file: File,
    page: Page,
}

/// Locks and reads `path`; `None` when another replayer holds it or has
/// already written it.
fn claim(path: &Path) -> io::Result<Option<Result<Claimed, serde_json::Error>>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    // Deleted by the replayer whose lock we waited for: already written.
    if file.metadata()?.nlink() == 0 {
        return Ok(None);
    }
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(Some(serde_json::from_str(&text).map(|page| Claimed {
        path: path.to_owned(),
        _file: file,
        page,
    })))
}

/// Moves a spooled file that cannot be read as a page out of the way, to
/// `<spool>/%unreadable/` (no job's directory: job names hold no `%`), for
/// an operator to look at.
fn set_aside(spool: &Path, path: &Path) -> io::Result<PathBuf> {
    let dir = spool.join("%unreadable");
    std::fs::create_dir_all(&dir)?;
    let to = dir.join(path.file_name().unwrap_or_default());
    std::fs::rename(path, &to)?;
    Ok(to)
}

impl Sinks {
    /// Keeps `records` in the spool, or says why it could not (the sink's
    /// error `cause` and the spool's own).
    pub(super) async fn spool_page(
        &self,
        job: &Job,
        item: &Item,
        at: Option<PageRef>,
        records: &[Value],
        fetched_at: DateTime<Utc>,
        cause: SinkError,
    ) -> Result<usize, SinkError> {
        let Some(spool) = self.spool.clone() else {
            self.stuck(&job.name);
            return Err(cause);
        };
        let page = Page {
            job: job.name.clone(),
            item: item.clone(),
            fetched_at: fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            tick: at.map(|a| a.tick),
            page: at.map(|a| a.page),
            records: records.to_vec(),
        };
        let dir = spool.dir_for(&job.name);
        let at_ms = fetched_at.timestamp_millis();
        let saved = blocking(move || {
            save(&dir, &page, at_ms).map_err(|source| SinkError::Io { path: dir, source })
        })
        .await;
        match saved {
            Ok(file) => {
                lock(&spool.pending).insert(job.name.clone());
                metrics::counter!("qw_sink_spooled_pages_total", "qw_job" => job.name.clone())
                    .increment(1);
                tracing::warn!(job = %job.name, item = %crate::queue::item_key(item),
                    records = records.len(), error = %cause, spooled = %file.display(),
                    "the sink could not take the page: spooled, and written when it can");
                self.keep_flushing();
                Ok(records.len())
            }
            Err(spool_error) => {
                self.stuck(&job.name);
                Err(SinkError::NotStored {
                    cause: Box::new(cause),
                    spool: Box::new(spool_error),
                })
            }
        }
    }

    /// Writes the spooled pages of `job` (every job's when `None`), oldest
    /// first; stops at the first the sink still cannot take and returns its
    /// error. Returns how many pages of configured jobs are left (held by
    /// another replayer).
    pub(super) async fn flush_spool(&self, job: Option<&str>) -> Result<usize, SinkError> {
        let Some(spool) = self.spool.clone() else {
            return Ok(0);
        };
        let jobs: Vec<String> = match job {
            Some(j) => vec![j.to_owned()],
            None => lock(&spool.pending).iter().cloned().collect(),
        };
        let mut left = 0;
        for name in jobs {
            let mut held = 0;
            let dir = spool.dir_for(&name);
            let files = blocking(move || {
                page_files(&dir).or_else(|e| match e.kind() {
                    io::ErrorKind::NotFound => Ok(Vec::new()),
                    _ => Err(SinkError::Io {
                        path: dir,
                        source: e,
                    }),
                })
            })
            .await?;
            for path in files {
                if !self.replay(&spool, &path).await? {
                    held += 1;
                }
            }
            if held == 0 {
                // Forgotten only if still empty, looked at under the lock a
                // spooler takes after its page is in place: none is missed.
                let (spool, dir) = (spool.clone(), spool.dir_for(&name));
                blocking(move || {
                    let mut pending = lock(&spool.pending);
                    if page_files(&dir).map_or(true, |f| f.is_empty()) {
                        pending.remove(&name);
                    }
                    Ok(())
                })
                .await?;
            }
            left += held;
        }
        Ok(left)
    }

    /// Writes one spooled page and deletes it. `Ok(false)`: another
    /// replayer holds it.
    async fn replay(&self, spool: &std::sync::Arc<Spool>, path: &Path) -> Result<bool, SinkError> {
        let p = path.to_owned();
        let claimed =
            blocking(move || claim(&p).map_err(|source| SinkError::Io { path: p, source })).await?;
        let claimed = match claimed {
            None => return Ok(false),
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                let (root, p) = (spool.dir.clone(), path.to_owned());
                let moved = blocking(move || Ok(set_aside(&root, &p))).await?;
                tracing::error!(file = %path.display(), error = %e, moved_to = ?moved.as_ref().ok(),
                    "a spooled page cannot be read; set aside");
                return Ok(true);
            }
        };
        let Some(job) = spool.jobs.get(&claimed.page.job) else {
            // Its job left the configuration: kept for an operator.
            tracing::warn!(job = %claimed.page.job, file = %path.display(),
                "a spooled page's job is not configured any more; the page stays in the spool");
            return Ok(true);
        };
        let fetched_at = DateTime::parse_from_rfc3339(&claimed.page.fetched_at)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_else(|_| Utc::now());
        let item = crate::queue::item_key(&claimed.page.item);
        let at = match (claimed.page.tick, claimed.page.page) {
            (Some(tick), Some(page)) => Some(PageRef { tick, page }),
            _ => None,
        };
        let written = self
            .write_records(
                job,
                &claimed.page.item,
                at,
                &claimed.page.records,
                fetched_at,
            )
            .await?;
        let file = claimed.path.clone();
        blocking(move || {
            std::fs::remove_file(&file).map_err(|source| SinkError::Io { path: file, source })
        })
        .await?;
        // Unlocked only now that it is gone.
        drop(claimed);
        metrics::counter!("qw_sink_replayed_pages_total", "qw_job" => job.name.clone())
            .increment(1);
        tracing::info!(job = %job.name, item = %item, records = written,
            "a spooled page was written to the sink");
        Ok(true)
    }

    /// Starts the retry loop unless one runs: it writes spooled pages until
    /// none are left, waiting longer while the sink still fails.
    pub(super) fn keep_flushing(&self) {
        let Some(spool) = self.spool.clone() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if spool.looping.swap(true, Ordering::AcqRel) {
            return;
        }
        let sinks = self.clone();
        rt.spawn(async move {
            let mut wait = FIRST_WAIT;
            loop {
                tokio::time::sleep(wait).await;
                match sinks.flush_spool(None).await {
                    Ok(0) => wait = FIRST_WAIT,
                    Ok(_) => wait = (wait * 2).min(LONGEST_WAIT),
                    Err(e) => {
                        tracing::debug!(error = %e, "spooled pages still cannot be written");
                        wait = (wait * 2).min(LONGEST_WAIT);
                    }
                }
                if !spool.any_pending() {
                    spool.looping.store(false, Ordering::Release);
                    // A page spooled between the check and the store starts
                    // no loop of its own: take it on.
                    if !spool.any_pending() || spool.looping.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
            }
        });
    }
}
