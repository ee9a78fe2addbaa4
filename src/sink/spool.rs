//! The spool: pages the sink could not take (disk full, read-only, database
//! locked past the busy timeout), kept under the state directory and
//! written later, so a page that cost quota is never fetched again because
//! of a local error.
//!
//! One file per page,
//! `<state_dir>/spool/<job>/<fetched_at ms>-<item tag>-<uuid>.json`, holding
//! the job, the item, the fetch time, which page of which run it is (a
//! postgres sink's page id) and the page's records; the item tag (16 hex
//! digits of the SHA-1 of the item's key) lets a replay pick one item's
//! pages without reading the others. It is written under a dot-name,
//! `fsync`ed and renamed into place, so a reader only ever sees whole
//! pages. Pages are replayed oldest first, **in order per item**: a page
//! that cannot be written holds back the later pages of its own item only,
//! never another item's (issue 22, item 2: one item whose path could not be
//! written stopped its job's sink for good). They are replayed:
//!
//! - before the next page of the same item is written (by any task of this
//!   process), so an item's pages reach the sink in fetch order;
//! - by a retry loop that runs while this process has spooled pages
//!   (every second at first, backing off to every 10 s while the sink still
//!   fails), every item it can;
//! - at start, when the spool holds pages left by an earlier run (pages
//!   spooled before item tags, `<ms>-<uuid>.json`, are read to learn their
//!   item, and hold back every item of their job until replayed).
//!
//! Several processes may share one state directory: a replayer holds an
//! exclusive `flock` on the page file while it writes it and deletes it
//! before letting go; a file deleted under a waiting replayer is skipped
//! (its link count is 0). Delivery stays at least once: a process killed
//! between the sink's write and the delete writes that page again later
//! (SQLite with `key` absorbs it; a postgres sink knows the page's id and
//! adds nothing).

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::jsonl::room_for;
use super::{PageRef, SinkError, Sinks, blocking, lock, sanitize};
use crate::config::Item;
use crate::config::Job;

/// The retry loop's first wait, and its longest.
const FIRST_WAIT: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(10);

/// Where pages wait, and which items this process knows have some there.
#[derive(Debug)]
pub(super) struct Spool {
    dir: PathBuf,
    /// The jobs, to write a spooled page with its job's sink.
    jobs: IndexMap<String, Job>,
    /// Per job with spooled pages, the tags of the items that have some,
    /// as far as this process knows ([`Tag::Unknown`] for a page spooled
    /// before item tags: it holds back every item of its job).
    pending: Mutex<HashMap<String, HashSet<Tag>>>,
    /// Whether a retry loop runs.
    looping: AtomicBool,
}

/// Which item a spooled page belongs to, as its file name says.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Tag {
    /// 16 hex digits of the SHA-1 of the item's key.
    Item(String),
    /// A page spooled before item tags: its item is in the file only.
    Unknown,
}

impl Tag {
    pub(super) fn of(item: &Item) -> Tag {
        let digest = sha1_smol::Sha1::from(crate::queue::item_key(item))
            .digest()
            .to_string();
        Tag::Item(digest[..16].to_owned())
    }

    /// The tag in a page file's name: `<ms>-<tag>-<uuid>.json`, or
    /// `<ms>-<uuid>.json` from before tags.
    pub(super) fn of_file(path: &Path) -> Tag {
        let name = path.file_stem().and_then(|n| n.to_str()).unwrap_or("");
        match name.split('-').collect::<Vec<_>>()[..] {
            [_, tag, _] => Tag::Item(tag.to_owned()),
            _ => Tag::Unknown,
        }
    }
}

/// One spooled page, as stored (a page refused for good is kept in the
/// same form: `rejected`).
#[derive(Serialize, Deserialize)]
pub(super) struct Page {
    pub(super) job: String,
    pub(super) item: Item,
    pub(super) fetched_at: String,
    /// The run's tick and the page number; absent in pages spooled before
    /// they were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) tick: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) page: Option<u32>,
    /// Read back as they were decoded (numbers' text, keys' order).
    #[serde(deserialize_with = "crate::decode::values")]
    pub(super) records: Vec<Value>,
}

impl Page {
    /// The page as a sink writes it: its item, which page of which run
    /// (`None` for a page spooled before that was kept), when fetched.
    pub(super) fn parts(&self) -> (Option<PageRef>, DateTime<Utc>) {
        let fetched_at = DateTime::parse_from_rfc3339(&self.fetched_at)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_else(|_| Utc::now());
        let at = match (self.tick, self.page) {
            (Some(tick), Some(page)) => Some(PageRef { tick, page }),
            _ => None,
        };
        (at, fetched_at)
    }
}

impl Spool {
    pub(super) fn new(dir: PathBuf, jobs: IndexMap<String, Job>) -> Self {
        // Pages an earlier run left behind.
        let pending = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let job = jobs.keys().find(|j| sanitize(j) == name)?;
                let tags = tags_in(&e.path());
                (!tags.is_empty()).then(|| (job.clone(), tags))
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

    /// Whether `item` of `job` may have spooled pages: its next page must
    /// wait for them.
    pub(super) fn has_pending(&self, job: &str, item: &Item) -> bool {
        lock(&self.pending)
            .get(job)
            .is_some_and(|tags| tags.contains(&Tag::Unknown) || tags.contains(&Tag::of(item)))
    }

    fn any_pending(&self) -> bool {
        lock(&self.pending).values().any(|t| !t.is_empty())
    }
}

/// The tags of the pages in `dir`.
fn tags_in(dir: &Path) -> HashSet<Tag> {
    page_files(dir)
        .unwrap_or_default()
        .iter()
        .map(|p| Tag::of_file(p))
        .collect()
}

/// What replaying one page did.
enum Replayed {
    /// Written to the sink and deleted (or set aside, unreadable).
    Done,
    /// Another replayer holds it, or its job is not configured any more.
    Left,
    /// An earlier page of its item is still spooled: not tried, so the
    /// item's pages stay in order.
    Behind,
}

/// The page files in `dir`, oldest first (dot-files are pages being written).
pub(super) fn page_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
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
pub(super) fn save(dir: &Path, page: &Page, at_ms: i64) -> io::Result<PathBuf> {
    save_as(dir, &page_name(&page.item, at_ms), page)
}

/// A new page file's name: `<at_ms>-<item tag>-<uuid>.json`.
pub(super) fn page_name(item: &Item, at_ms: i64) -> String {
    let Tag::Item(tag) = Tag::of(item) else {
        unreachable!("an item always has a tag");
    };
    format!("{at_ms:013}-{tag}-{}.json", uuid::Uuid::new_v4().simple())
}

/// Writes `page` to `dir/name`, whole or not at all.
pub(super) fn save_as(dir: &Path, name: &str, page: &Page) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    let path = dir.join(name);
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
pub(super) struct Claimed {
    pub(super) path: PathBuf,
    _file: File,
    pub(super) page: Page,
}

/// Locks and reads `path`; `None` when another replayer holds it or has
/// already written it; `Some(Err)` when it is no page (set aside).
pub(super) fn claim(path: &Path) -> io::Result<Option<Result<Claimed, io::Error>>> {
    // Never through a symbolic link: one planted in the spool could point
    // at any file the daemon may read, and a page-shaped one would be
    // written to a sink. The link itself is set aside, unfollowed.
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Ok(Some(Err(io::Error::other(
                "it is a symbolic link, which the spool never follows",
            ))));
        }
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
    Ok(Some(
        serde_json::from_str(&text)
            .map(|page| Claimed {
                path: path.to_owned(),
                _file: file,
                page,
            })
            .map_err(io::Error::from),
    ))
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

/// What flushing a job's spool did.
#[derive(Default)]
struct Flushed {
    /// Pages left in it.
    left: usize,
    /// The items with a page that could not be written, and the first
    /// error.
    failed: Option<(HashSet<Tag>, SinkError)>,
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
        let page = Page {
            job: job.name.clone(),
            item: item.clone(),
            fetched_at: fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            tick: at.map(|a| a.tick),
            page: at.map(|a| a.page),
            records: records.to_vec(),
        };
        let Some(spool) = self.spool.clone() else {
            self.stuck(&job.name, room_for(&job.name, item, &page, records.len()));
            return Err(cause);
        };
        let needed = room_for(&job.name, item, &page, records.len());
        let dir = spool.dir_for(&job.name);
        let at_ms = fetched_at.timestamp_millis();
        let saved = blocking(move || {
            save(&dir, &page, at_ms).map_err(|source| SinkError::Io { path: dir, source })
        })
        .await;
        match saved {
            Ok(file) => {
                lock(&spool.pending)
                    .entry(job.name.clone())
                    .or_default()
                    .insert(Tag::of(item));
                metrics::counter!("qw_sink_spooled_pages_total", "qw_job" => job.name.clone())
                    .increment(1);
                tracing::warn!(job = %job.name, item = %crate::queue::item_key(item),
                    records = records.len(), error = %cause, spooled = %file.display(),
                    "the sink could not take the page: spooled, and written when it can");
                self.keep_flushing();
                Ok(records.len())
            }
            Err(spool_error) => {
                self.stuck(&job.name, needed);
                Err(SinkError::NotStored {
                    cause: Box::new(cause),
                    spool: Box::new(spool_error),
                })
            }
        }
    }

    /// Writes `item`'s spooled pages of `job`, oldest first, before its
    /// next page: `Err` with the sink's error when one still cannot be
    /// written (the next page then joins them).
    pub(super) async fn flush_item(&self, job: &str, item: &Item) -> Result<(), SinkError> {
        let tag = Tag::of(item);
        match self.flush_job(job, Some(&tag)).await? {
            Flushed {
                failed: Some((failed, e)),
                ..
            } if failed.contains(&tag) => Err(e),
            _ => Ok(()),
        }
    }

    /// Writes every spooled page of every job this process knows to have
    /// some, oldest first per item: a page that cannot be written holds
    /// back its own item's later pages, and the other items go on. Returns
    /// how many pages are left (held by another replayer, or behind one
    /// that cannot be written).
    pub(super) async fn flush_spool(&self) -> Result<usize, SinkError> {
        let Some(spool) = self.spool.clone() else {
            return Ok(0);
        };
        let jobs: Vec<String> = lock(&spool.pending).keys().cloned().collect();
        let mut left = 0;
        for name in jobs {
            let flushed = self.flush_job(&name, None).await?;
            if let Some((items, e)) = flushed.failed {
                tracing::debug!(job = %name, items = items.len(), error = %e,
                    "spooled pages still cannot be written");
            }
            left += flushed.left;
        }
        Ok(left)
    }

    /// Writes `job`'s spooled pages (only the item tagged `only`, and pages
    /// from before tags, when given), oldest first per item.
    async fn flush_job(&self, name: &str, only: Option<&Tag>) -> Result<Flushed, SinkError> {
        let Some(spool) = self.spool.clone() else {
            return Ok(Flushed::default());
        };
        let dir = spool.dir_for(name);
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
        // Items with a page that could not be written: their later pages
        // wait, in order.
        let mut failed: HashSet<Tag> = HashSet::new();
        let mut first_error = None;
        let mut left = 0;
        for path in files {
            let tag = Tag::of_file(&path);
            let wanted = match (only, &tag) {
                (None, _) | (_, Tag::Unknown) => true,
                (Some(want), tag) => want == tag,
            };
            if !wanted {
                continue;
            }
            if failed.contains(&tag) {
                left += 1;
                continue;
            }
            match self.replay(&spool, &path, &failed).await {
                Ok(Replayed::Done) => {}
                Ok(Replayed::Left | Replayed::Behind) => left += 1,
                Err((item, e)) => {
                    left += 1;
                    failed.insert(item);
                    first_error.get_or_insert(e);
                }
            }
        }
        // Forgotten only when gone, looked at under the lock a spooler
        // takes after its page is in place: none is missed.
        let (spool, dir, job) = (spool.clone(), spool.dir_for(name), name.to_owned());
        blocking(move || {
            let mut pending = lock(&spool.pending);
            let tags = tags_in(&dir);
            if tags.is_empty() {
                pending.remove(&job);
            } else {
                pending.insert(job, tags);
            }
            Ok(())
        })
        .await?;
        Ok(Flushed {
            left,
            failed: first_error.map(|e| (failed, e)),
        })
    }

    /// Writes one spooled page and deletes it, unless an earlier page of
    /// its item is in `failed`. `Err` names the page's item with the error.
    async fn replay(
        &self,
        spool: &std::sync::Arc<Spool>,
        path: &Path,
        failed: &HashSet<Tag>,
    ) -> Result<Replayed, (Tag, SinkError)> {
        let tag = Tag::of_file(path);
        let p = path.to_owned();
        let claimed =
            blocking(move || claim(&p).map_err(|source| SinkError::Io { path: p, source }))
                .await
                .map_err(|e| (tag.clone(), e))?;
        let claimed = match claimed {
            None => return Ok(Replayed::Left),
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                let (root, p) = (spool.dir.clone(), path.to_owned());
                let moved = blocking(move || Ok(set_aside(&root, &p)))
                    .await
                    .map_err(|e| (tag.clone(), e))?;
                tracing::error!(file = %path.display(), error = %e, moved_to = ?moved.as_ref().ok(),
                    "a spooled page cannot be read; set aside");
                return Ok(Replayed::Done);
            }
        };
        // A page from before tags says its item only inside.
        let tag = Tag::of(&claimed.page.item);
        if failed.contains(&tag) {
            return Ok(Replayed::Behind);
        }
        let Some(job) = spool.jobs.get(&claimed.page.job) else {
            // Its job left the configuration: kept for an operator.
            tracing::warn!(job = %claimed.page.job, file = %path.display(),
                "a spooled page's job is not configured any more; the page stays in the spool");
            return Ok(Replayed::Left);
        };
        let item = crate::queue::item_key(&claimed.page.item);
        let (at, fetched_at) = claimed.page.parts();
        let written = self
            .write_records(
                job,
                &claimed.page.item,
                at,
                &claimed.page.records,
                fetched_at,
            )
            .await
            .map_err(SinkError::classified);
        let written = match written {
            Ok(n) => n,
            // Never to be written: out of the spool, kept with its error,
            // so the item's later pages go on (issue 37).
            Err(e) if let Some(scope) = e.for_good() => {
                let page_item = claimed.page.item.clone();
                self.reject_spooled(job, &page_item, &claimed.path, e, scope)
                    .await
                    .map_err(|e| (tag.clone(), e))?;
                drop(claimed);
                return Ok(Replayed::Done);
            }
            Err(e) => return Err((tag, e)),
        };
        let file = claimed.path.clone();
        blocking(move || {
            std::fs::remove_file(&file).map_err(|source| SinkError::Io { path: file, source })
        })
        .await
        .map_err(|e| (tag, e))?;
        // Unlocked only now that it is gone.
        drop(claimed);
        metrics::counter!("qw_sink_replayed_pages_total", "qw_job" => job.name.clone())
            .increment(1);
        tracing::info!(job = %job.name, item = %item, records = written,
            "a spooled page was written to the sink");
        Ok(Replayed::Done)
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
                match sinks.flush_spool().await {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A page file says its item's tag; one spooled before tags says none
    /// (it holds back its whole job until replayed).
    #[test]
    fn page_files_name_their_item() {
        let item = vec![("v".to_owned(), "short".to_owned())];
        let Tag::Item(tag) = Tag::of(&item) else {
            panic!("an item has a tag")
        };
        assert_eq!(tag.len(), 16);
        let uuid = "0123456789abcdef0123456789abcdef";
        let new = PathBuf::from(format!("spool/leak/1795674672198-{tag}-{uuid}.json"));
        assert_eq!(Tag::of_file(&new), Tag::of(&item));
        let old = PathBuf::from(format!("spool/leak/1795674672198-{uuid}.json"));
        assert_eq!(Tag::of_file(&old), Tag::Unknown);
        let other = vec![("v".to_owned(), "long".to_owned())];
        assert_ne!(Tag::of(&other), Tag::of(&item));
    }

    /// Issue 22, Low 4: a symbolic link planted in the spool, to a file
    /// holding a page (or any file the daemon may read), was followed and
    /// its text replayed into the sink. It is refused unread, as no page
    /// (and so set aside, the link itself moved, its target untouched).
    #[test]
    fn issue_22_low_4_a_link_in_the_spool_is_never_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let page = Page {
            job: "leak".into(),
            item: vec![("v".to_owned(), "one".to_owned())],
            fetched_at: "2026-11-26T09:00:00Z".into(),
            tick: Some(1),
            page: Some(1),
            records: vec![serde_json::json!({"id": "planted"})],
        };
        let spool = dir.path().join("spool/leak");
        let saved = save(&spool, &page, 1).expect("saved");
        assert!(
            matches!(claim(&saved), Ok(Some(Ok(_)))),
            "a page file is read"
        );
        let target = dir.path().join("elsewhere.json");
        std::fs::rename(&saved, &target).expect("moved away");
        std::os::unix::fs::symlink(&target, &saved).expect("link");
        match claim(&saved) {
            Ok(Some(Err(e))) => assert!(e.to_string().contains("symbolic link"), "{e}"),
            Ok(Some(Ok(c))) => panic!("followed the link: {:?}", c.page.records),
            Ok(None) => panic!("not claimed"),
            Err(e) => panic!("an I/O error instead of setting it aside: {e}"),
        }
        let moved = set_aside(dir.path().join("spool").as_path(), &saved).expect("set aside");
        assert!(
            std::fs::symlink_metadata(&moved)
                .expect("moved")
                .is_symlink()
        );
        assert!(target.is_file(), "the target is untouched");
    }
}
