//! Sinks: where the records of a fetched page go — JSON lines files, or SQLite
//! with a full-text index that serves user search locally, so a search never
//! spends quota — and what happens when they cannot take a page.
//!
//! A page's records are found with the job's `sink.records` JSON pointer
//! ("" = the whole body: an array is its elements, an object one record). A
//! pointer that finds no array is the response's fault ([`SinkError::is_bad_response`]);
//! everything else that goes wrong here is local (disk full, read-only,
//! database locked) and never costs quota again: the page is spooled under
//! the state directory and written later (`spool`), and when even that
//! fails the job's sink is marked stuck, so no task of this process spends
//! for it until [`Sinks::ready`] finds room there again for a page as large
//! as the one lost (a test write of its size, not a token one).
//!
//! [`Sinks`] is the one interface the daemon writes through: [`Sinks::write`]
//! a page, [`Sinks::ready`] before spending for one, the spool and the kept
//! pages behind them. Each sink kind is a file of its own, and
//! `Sinks::write_records` is the one place they part ways:
//!
//! - `jsonl`: JSON lines files, whole-page appends safe across processes
//!   (its docs say what concurrent appends guarantee);
//! - `sqlite`: a table per job, upserts by (item, key), an FTS5 index, and
//!   [`find`] / [`search`] to query it;
//! - `postgres`: a table per job, each page written once whatever happens
//!   between the write and the checkpoint (its rows carry the page's id,
//!   [`PageRef`]), upserts by (item, key), a `tsvector` column for search,
//!   and [`find_postgres`]. A server that is down or refusing is a sink
//!   failure like a full disk: the page is spooled.
//!
//! Beside them: `path` (sink paths rendered, encoded and probed), `record`
//! (a page's records as every kind sees them), `error` ([`SinkError`] and
//! what each error means for the page), `spool` (pages waiting for their
//! sink), `rejected` (pages a sink refused for good, kept) and `storable`
//! (what PostgreSQL cannot hold).

mod error;
mod jsonl;
mod path;
mod postgres;
mod record;
mod rejected;
mod spool;
mod sqlite;
mod storable;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde_json::Value;

use crate::config::{Config, Item, Job, SinkKind};
pub use error::SinkError;
use path::has_dir;
pub use path::{
    NAME_MAX, check_dirs, databases, fixed_dir, name_too_long, probe_dir, probe_room, render_path,
    sanitize,
};
pub(crate) use postgres::log_tables;
pub use postgres::{TableState, check_tables, find as find_postgres};
pub(crate) use record::json_kind;
use record::records;
pub use record::{Hit, PageRef};
pub use rejected::{
    KeptPage, Retried, RetryOutcome, Scope, count as rejected_count, list as rejected_pages,
};
use sqlite::Pool;
pub use sqlite::find;

/// What [`Sinks::write`] did with one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Records the page held (where the job's `sink.records` points): zero
    /// is an empty page, which ends a `style = "page"` run.
    pub on_page: usize,
    /// Records written, or spooled to be written. Fewer than `on_page` when
    /// a SQLite sink with a `key` already holds a newer copy of some: a
    /// page can hold records and store none.
    pub stored: usize,
}

/// Writes fetched pages to the jobs' sinks. Cheap to clone: clones share the
/// open SQLite connections, the spool and what is known to be stuck.
#[derive(Clone)]
pub struct Sinks {
    /// Relative sink paths resolve against it (the config file's directory).
    base_dir: PathBuf,
    /// Open SQLite connections, one per database file.
    dbs: Arc<Pool>,
    /// PostgreSQL pools, one per server, and the tables made sure of.
    pg: Arc<postgres::PgSinks>,
    /// Where pages the sink cannot take wait; none: such a page is an error.
    spool: Option<Arc<spool::Spool>>,
    /// Where pages the sink refused for good are kept, and what they hold;
    /// none: such a page is an error, and kept nowhere.
    rejected: Option<Arc<rejected::Rejected>>,
    /// Jobs whose last page could be neither written nor spooled here, and
    /// the room the largest such page needed, bytes.
    stuck: Arc<Mutex<HashMap<String, u64>>>,
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sinks")
            .field("base_dir", &self.base_dir)
            .finish_non_exhaustive()
    }
}

impl Sinks {
    /// Sinks whose relative paths resolve against `base_dir`
    /// ([`Config::dir`]), without a spool.
    pub fn new(base_dir: PathBuf) -> Self {
        Sinks {
            base_dir,
            dbs: Arc::new(Pool::default()),
            pg: Arc::new(postgres::PgSinks::new(DEFAULT_PG_POOL)),
            spool: None,
            rejected: None,
            stuck: Arc::default(),
        }
    }

    /// Sinks as the daemon runs them: `config`'s paths, pages the sink
    /// cannot take spooled under `<state_dir>/spool`. Pages an earlier run
    /// spooled are written from now on (call it inside a Tokio runtime).
    pub fn for_config(config: &Config) -> Self {
        let mut sinks = Sinks::new(config.dir.clone());
        // As many connections per server as tasks can write at once.
        sinks.pg = Arc::new(postgres::PgSinks::new(config.worker.concurrency.get()));
        let spool = spool::Spool::new(spool_dir(config), config.jobs.clone());
        sinks.spool = Some(Arc::new(spool));
        sinks.rejected = Some(Arc::new(rejected::Rejected::new(&spool_dir(config))));
        sinks.keep_flushing();
        sinks
    }

    /// Sinks for a command that writes pages itself (`spool retry`): the
    /// config's paths and PostgreSQL servers, its kept pages; no spool and
    /// no retry loop (the daemon's spool is the daemon's).
    pub fn for_command(config: &Config) -> Self {
        let mut sinks = Sinks::new(config.dir.clone());
        sinks.rejected = Some(Arc::new(rejected::Rejected::new(&spool_dir(config))));
        sinks
    }

    /// These sinks for a reloaded `config`: its jobs' spooled pages written
    /// with their new sinks (a spool of its own over the same directory:
    /// the old one, still held by tasks that began before the reload,
    /// finishes its pages, and both take a page's file lock before writing
    /// it), new PostgreSQL pools (a sink's server or password may have
    /// changed); the SQLite connections (one per database file) and the
    /// jobs known to be stuck are shared with these.
    pub fn reloaded(&self, config: &Config) -> Self {
        let mut sinks = Sinks::for_config(config);
        sinks.dbs = self.dbs.clone();
        sinks.stuck = self.stuck.clone();
        sinks
    }

    /// The file `job`'s records of `item` fetched on `date` (UTC) go to.
    pub fn path(&self, job: &Job, item: &Item, date: NaiveDate) -> PathBuf {
        self.base_dir.join(render_path(job, item, date))
    }

    /// Writes the records of one fetched page, after the job's spooled
    /// pages, or spools them to be written. Zero records is not an error.
    /// An error is the response's fault ([`SinkError::is_bad_response`]) or
    /// [`SinkError::NotStored`] (or, without a spool, the sink's own).
    pub async fn write(
        &self,
        job: &Job,
        item: &Item,
        at: PageRef,
        body: &Value,
        fetched_at: DateTime<Utc>,
    ) -> Result<Written, SinkError> {
        let records = records(body, &job.sink.records)?;
        let on_page = records.len();
        // Pages reach the sink in fetch order per item: an item's earlier
        // spooled pages first. Other items' pages wait for nothing here.
        if self
            .spool
            .as_ref()
            .is_some_and(|s| s.has_pending(&job.name, item))
            && let Err(e) = self.flush_item(&job.name, item).await
        {
            // The item's earlier pages still cannot be written: this one
            // joins them.
            let stored = (self.spool_page(job, item, Some(at), records, fetched_at, e)).await?;
            return Ok(Written { on_page, stored });
        }
        let written = self.write_records(job, item, Some(at), records, fetched_at);
        let stored = match written.await.map_err(SinkError::classified) {
            // Never spooled: it can never be written. Kept, and it holds
            // the item (or the job), so no tick spends for it again.
            Err(e) if let Some(scope) = e.for_good() => {
                let rejected = self.reject(job, item, Some(at), records, fetched_at, e, scope);
                return Err(rejected.await);
            }
            Err(e) if !e.fails_the_task() => {
                self.spool_page(job, item, Some(at), records, fetched_at, e)
                    .await
            }
            done => done,
        }?;
        Ok(Written { on_page, stored })
    }

    /// Whether a task may spend for a page of `job`'s `item` now: yes,
    /// unless a page of the job could be neither written nor spooled here;
    /// then only once a test write *of that page's size* in its spool or
    /// its sink directory succeeds (an operator freed space or fixed a
    /// mount). A token test write would pass on an almost full disk and
    /// spend for a page that is lost again (issue 22, item 5). The error
    /// says why not.
    pub async fn ready(&self, job: &Job, item: &Item, now: DateTime<Utc>) -> Result<(), SinkError> {
        // A page the sink refused for good holds its item (or job): a page
        // fetched now would be refused again, or queue behind it.
        self.held(job, item).await?;
        let Some(needed) = lock(&self.stuck).get(&job.name).copied() else {
            return Ok(());
        };
        let path = self.path(job, item, now.date_naive());
        // A postgres sink has no directory: only its spool can take pages.
        let sink_dir = has_dir(job).then(|| path.parent().map(Path::to_owned).unwrap_or_default());
        let spool_dir = self.spool.as_ref().map(|s| s.dir_for(&job.name));
        blocking(move || {
            let spool_ok = spool_dir.as_deref().map(|d| probe_room(d, needed));
            if spool_ok.as_ref().is_some_and(Result::is_ok) {
                return Ok(());
            }
            let Some(sink_dir) = sink_dir else {
                let dir = spool_dir.unwrap_or_default();
                let source = match spool_ok {
                    Some(Err(e)) => e,
                    _ => io::Error::other("no spool"),
                };
                return Err(SinkError::Io { path: dir, source });
            };
            probe_room(&sink_dir, needed).map_err(|source| SinkError::Io {
                path: sink_dir,
                source,
            })
        })
        .await?;
        lock(&self.stuck).remove(&job.name);
        Ok(())
    }

    /// Marks `job`'s sink stuck for a page that needed `bytes` of room.
    fn stuck(&self, job: &str, bytes: u64) {
        let mut stuck = lock(&self.stuck);
        let needed = stuck.entry(job.to_owned()).or_default();
        *needed = (*needed).max(bytes);
    }

    /// Writes records to the job's sink, nothing else: the one place the
    /// sink kinds part ways. `at` is `None` for a page spooled by a version
    /// that did not keep it.
    async fn write_records(
        &self,
        job: &Job,
        item: &Item,
        at: Option<PageRef>,
        records: &[Value],
        fetched_at: DateTime<Utc>,
    ) -> Result<usize, SinkError> {
        let path = self.path(job, item, fetched_at.date_naive());
        // Fixed width (always 3 fraction digits, 'Z'): text order is time
        // order, which the upsert relies on.
        let fetched_text = fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true);
        match job.sink.kind {
            SinkKind::Jsonl => jsonl::write(path, job, item, &fetched_text, records).await,
            SinkKind::Sqlite => {
                let pool = self.dbs.clone();
                sqlite::write(pool, path, job, item, fetched_text, records).await
            }
            SinkKind::Postgres => {
                postgres::write(&self.pg, job, item, at, records, fetched_at).await
            }
        }
    }
}

/// Connections per PostgreSQL server of [`Sinks::new`] (the daemon's are
/// its `concurrency`).
const DEFAULT_PG_POOL: usize = 4;

/// Where pages the sink could not take wait: `<state_dir>/spool`.
pub fn spool_dir(config: &Config) -> PathBuf {
    config.state_dir.join("spool")
}

/// Full-text search over the records `job_name` stored in the SQLite sink
/// `db_path`, as [`find`] does, returning only the records.
pub fn search(
    db_path: &Path,
    job_name: &str,
    query: &str,
    limit: usize,
) -> Result<Vec<Value>, SinkError> {
    Ok(find(db_path, job_name, query, limit)?
        .into_iter()
        .map(|h| h.record)
        .collect())
}

/// Runs file or database I/O on the blocking pool, off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SinkError> + Send + 'static,
) -> Result<T, SinkError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(SinkError::Task)?
}

/// A lock whose holder panicked is still usable: a rusqlite transaction
/// rolls back when dropped, so the connection is consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
