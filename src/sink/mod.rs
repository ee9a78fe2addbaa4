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
//! # Paths
//!
//! `sink.path` is a [`Template`] with `{job}`, `{date}` (the fetch's UTC day,
//! `YYYY-MM-DD`) and the fan-out keys. Values come from outside the operator's
//! template, so each is [encoded](sanitize) into one plain path component,
//! injectively (two different values never share a file): `%`, `/`, `\`
//! and control characters are percent-encoded (`a/b` → `a%2Fb`), and a
//! whole `.` or `..` becomes `%2E` or `%2E%2E`, an empty value `%`, so no
//! value can climb out of the directory the template names. Relative paths
//! resolve against the config file's directory. `check` and `run` create and
//! test each sink's directory up to its first placeholder ([`check_dirs`]).
//!
//! # JSON lines: what concurrent appends guarantee
//!
//! One line per record: `{"job", "item", "fetched_at", "record"}`. A page is
//! serialized into one buffer and appended with one `write_all` on a file
//! opened with `O_APPEND`. On a local file system (ext4, xfs, btrfs, tmpfs)
//! that is enough for whole, never interleaved pages between any number of
//! writers, threads or processes: with `O_APPEND` the kernel moves the offset
//! to the end of the file and writes in one step under the inode's lock, so
//! a `write(2)` to a regular file lands contiguously after every earlier one.
//! The one gap is a *short* write (disk full, file size limit, a fatal signal
//! mid-copy): `write_all` would then issue a second `write(2)` that another
//! writer could precede. To close it every writer also holds an exclusive
//! `flock` for its append, truncates its own partial page away when the
//! append fails, and starts on a fresh line if the file ends in a torn line
//! (left by a writer killed mid-write or by power loss), so that damage stays
//! one unparsable line and never swallows a good record. Readers should skip
//! a line that does not parse. The data is `fdatasync`ed before `write`
//! returns, because a page costs quota and the worker checkpoints its cursor
//! right after.
//!
//! Limits: on NFS `O_APPEND` is emulated by each client (it computes the
//! offset from its cached size), so writers on *different hosts* can
//! overwrite each other unless `flock` reaches the server's lock manager;
//! give each host its own file there. Delivery is at least once: a task
//! retried after a failure that followed a successful write (or cancelled
//! while its write ran) writes the page again; SQLite with `key` absorbs that.
//!
//! # SQLite
//!
//! See `sqlite`: a table per job, upserts by (item, key), an FTS5 index, and
//! [`find`] / [`search`] to query it.
//!
//! # PostgreSQL
//!
//! See `postgres`: a table per job, each page written once whatever
//! happens between the write and the checkpoint (its rows carry the page's
//! id, [`PageRef`]), upserts by (item, key), a `tsvector` column for
//! search, and [`find_postgres`]. A server that is down or refusing is a
//! sink failure like a full disk: the page is spooled.

mod postgres;
mod spool;
mod sqlite;

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::config::{Config, ConfigError, ConfigErrors, Item, Job, SinkKind, Template};
use crate::pg::PgError;
pub(crate) use postgres::log_tables;
pub use postgres::{TableState, check_tables, find as find_postgres};
pub use sqlite::{Hit, find};
use sqlite::{Pool, Row, TableSpec};

/// Which page of which run a write is: with the job and the item, the
/// page's id in a postgres sink, the same for every fetch of that page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRef {
    /// The run's tick (ms since the epoch).
    pub tick: i64,
    /// The page number in the run (1 = first).
    pub page: u32,
}

/// Why a page could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The response has no records where the job's `sink.records` points: a
    /// bad response. Retrying the same request would not help.
    #[error("records pointer {pointer:?} {problem}")]
    BadRecords {
        /// The job's `sink.records`.
        pointer: String,
        /// What was found instead ("is missing", "is a string, not an array").
        problem: String,
    },
    /// A record could not be encoded as JSON: the response's fault.
    #[error("cannot encode a record as JSON: {0}")]
    Encode(#[source] serde_json::Error),
    /// A file could not be written: free space, fix permissions or mounts.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// A SQLite database failed (busy past the timeout, disk full, ...).
    #[error("sqlite {}: {source}", path.display())]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The sink could not take the page and the spool could not keep it
    /// either: an operator must make one of them writable. The task keeps
    /// its cursor at the page.
    #[error("{cause}; and it cannot be spooled: {spool}")]
    NotStored {
        /// Why the sink did not take it.
        cause: Box<SinkError>,
        /// Why the spool did not.
        spool: Box<SinkError>,
    },
    /// [`find`] found no index for the job in that database.
    #[error(
        "no search index for job {job:?} in {}: the job has stored nothing there yet, or its sink is not sqlite",
        path.display()
    )]
    NoIndex {
        /// The database file.
        path: PathBuf,
        /// The job.
        job: String,
    },
    /// A PostgreSQL server is down, refuses, or its table is not one this
    /// sink can write.
    #[error("{0}")]
    Postgres(#[source] Box<PgError>),
    /// The item's sink path cannot exist (a file name over 255 bytes, the
    /// longest Linux file systems take): no page of it can ever be written,
    /// so none is spooled, and the item's task fails. Other items go on.
    #[error(
        "cannot write {}: {source}; this item's sink path cannot exist (a file name is at most 255 bytes): shorten its fan-out values or the sink path",
        path.display()
    )]
    NeverWritable {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The item's JSON lines file or SQLite database is a symbolic link:
    /// never followed (it could point anywhere the daemon may write), so
    /// the page is not written there, nor spooled for it; the item's task
    /// fails.
    #[error(
        "refused to write {}: it is a symbolic link, which a sink never follows (someone else can write the sink directory? see docs/security.md); remove the link",
        path.display()
    )]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// The blocking task that did the I/O panicked or was cancelled.
    #[error("sink I/O task ended abnormally: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl SinkError {
    /// Whether the fetched response is to blame (the task fails as "bad
    /// response"; retrying would fetch the same thing), rather than the sink.
    #[must_use]
    pub fn is_bad_response(&self) -> bool {
        matches!(self, SinkError::BadRecords { .. } | SinkError::Encode(_))
    }

    /// Whether the page's task must end `failed`: the response is to blame,
    /// or the item's page can never be written ([`SinkError::NeverWritable`]).
    /// Any other error is the sink's, for an operator to fix: the page is
    /// spooled, or the run waits.
    #[must_use]
    pub fn fails_the_task(&self) -> bool {
        self.is_bad_response()
            || matches!(
                self,
                SinkError::NeverWritable { .. } | SinkError::Symlink { .. }
            )
    }

    /// What the task's outcome says.
    #[must_use]
    pub fn task_reason(&self) -> String {
        if self.is_bad_response() {
            format!("bad response: {self}")
        } else {
            self.to_string()
        }
    }

    /// A write error that no retry can fix, as such: a path whose file name
    /// is too long (`ENAMETOOLONG`).
    fn classified(self) -> Self {
        match self {
            SinkError::Io { path, source } if source.kind() == io::ErrorKind::InvalidFilename => {
                SinkError::NeverWritable { path, source }
            }
            SinkError::Io { path, source } if source.raw_os_error() == Some(libc::ELOOP) => {
                SinkError::Symlink { path }
            }
            SinkError::Sqlite { path, source } if sqlite::is_symlink_refusal(&source) => {
                SinkError::Symlink { path }
            }
            other => other,
        }
    }
}

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
        sinks.keep_flushing();
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
        let Some(needed) = lock(&self.stuck).get(&job.name).copied() else {
            return Ok(());
        };
        let path = self.path(job, item, now.date_naive());
        // A postgres sink has no directory: only its spool can take pages.
        let sink_dir = (job.sink.kind != SinkKind::Postgres)
            .then(|| path.parent().map(Path::to_owned).unwrap_or_default());
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

    /// Writes records to the job's sink, nothing else. `at` is `None` for
    /// a page spooled by a version that did not keep it.
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
        // Encoding happens here, borrowing the records, so the blocking task
        // gets bytes to write rather than a copy of the page.
        match job.sink.kind {
            SinkKind::Jsonl => {
                if records.is_empty() {
                    return Ok(0);
                }
                let mut buf = Vec::with_capacity(256 * records.len());
                for record in records {
                    let line = Line {
                        job: &job.name,
                        item: ItemJson(item),
                        fetched_at: &fetched_text,
                        record,
                    };
                    serde_json::to_writer(&mut buf, &line).map_err(SinkError::Encode)?;
                    buf.push(b'\n');
                }
                blocking(move || {
                    append(&path, &buf).map_err(|source| SinkError::Io { path, source })
                })
                .await?;
                Ok(records.len())
            }
            SinkKind::Sqlite => {
                let spec = TableSpec {
                    job: job.name.clone(),
                    search: job.sink.search.clone(),
                };
                let item = sqlite::item_column(item);
                let (keyed, missing_keys) = keyed_rows(job, records)?;
                warn_missing_keys(job, missing_keys);
                let rows: Vec<Row> = (keyed.into_iter().zip(records))
                    .map(|((key, record_text), record)| Row {
                        key,
                        record: record_text,
                        search_text: sqlite::search_text(record, &job.sink.search),
                    })
                    .collect();
                let pool = self.dbs.clone();
                blocking(move || {
                    let db = pool.get(&path)?;
                    let mut db = lock(&db);
                    db.write(&spec, &item, &fetched_text, &rows)
                        .map_err(|source| SinkError::Sqlite { path, source })
                })
                .await
            }
            SinkKind::Postgres => (self.write_postgres(job, item, at, records, fetched_at)).await,
        }
    }

    /// [`Sinks::write_records`] for a postgres sink.
    async fn write_postgres(
        &self,
        job: &Job,
        item: &Item,
        at: Option<PageRef>,
        records: &[Value],
        fetched_at: DateTime<Utc>,
    ) -> Result<usize, SinkError> {
        let Some(spec) = postgres::TableSpec::of(job) else {
            return Ok(0);
        };
        let item = sqlite::item_column(item);
        let page_id = match at {
            Some(at) => postgres::page_id(&job.name, at.tick, at.page, &item),
            // The fetch time stands in for the page: the same at every
            // replay of that spooled page.
            None => format!(
                "{}:at:{}:{item}",
                job.name,
                fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true)
            ),
        };
        let (rows, missing_keys) = keyed_rows(job, records)?;
        warn_missing_keys(job, missing_keys);
        let page = postgres::page_rows(item, page_id, fetched_at, spec.keyed, rows);
        self.pg
            .write(&spec, &page)
            .await
            .map_err(|e| SinkError::Postgres(Box::new(e)))
    }
}

/// Connections per PostgreSQL server of [`Sinks::new`] (the daemon's are
/// its `concurrency`).
const DEFAULT_PG_POOL: usize = 4;

/// A record's key and its JSON text.
type KeyedRow = (Option<String>, String);

/// Each record with its key (`None` without `sink.key`, or when the record
/// has no value there) and its JSON text; and how many had no key value.
fn keyed_rows(job: &Job, records: &[Value]) -> Result<(Vec<KeyedRow>, usize), SinkError> {
    let mut missing = 0usize;
    let mut rows = Vec::with_capacity(records.len());
    for record in records {
        let key = (job.sink.key.as_deref()).and_then(|p| sqlite::key_of(record, p));
        if job.sink.key.is_some() && key.is_none() {
            missing += 1;
        }
        rows.push((
            key,
            serde_json::to_string(record).map_err(SinkError::Encode)?,
        ));
    }
    Ok((rows, missing))
}

fn warn_missing_keys(job: &Job, missing_keys: usize) {
    if missing_keys > 0 {
        tracing::warn!(
            job = %job.name,
            missing_keys,
            key = job.sink.key.as_deref().unwrap_or_default(),
            "records without a key value are stored without one: re-fetches of them add rows"
        );
    }
}

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

/// `job`'s sink path for `item` on `date`, as the template renders it
/// (relative paths are relative to the config directory; see
/// [`Sinks::path`]). Every substituted value is [sanitized](sanitize).
pub fn render_path(job: &Job, item: &Item, date: NaiveDate) -> PathBuf {
    render(&job.sink.path, &job.name, item, date)
}

fn render(template: &Template, job: &str, item: &Item, date: NaiveDate) -> PathBuf {
    let date = date.format("%Y-%m-%d").to_string();
    let job = sanitize(job);
    let item: Vec<(&str, String)> = item
        .iter()
        .map(|(k, v)| (k.as_str(), sanitize(v)))
        .collect();
    let rendered = template.render(|name| match name {
        "job" => Some(job.as_str()),
        "date" => Some(date.as_str()),
        key => Some(
            item.iter()
                .find(|(k, _)| *k == key)
                .map_or("_", |(_, v)| v.as_str()),
        ),
    });
    PathBuf::from(rendered)
}

/// Makes `value` safe as (part of) one path component, so that it can
/// neither add a directory level nor climb out of one, and injectively, so
/// that two values never name one file: `%`, `/`, `\` and control
/// characters become `%XX` (upper-case hex); a whole `.` or `..` becomes
/// `%2E` or `%2E%2E`, the empty string `%` (every other `%` in the result
/// starts an `%XX`, so each result decodes to one value).
pub fn sanitize(value: &str) -> String {
    match value {
        "" => "%".to_owned(),
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        _ => {
            let mut out = String::with_capacity(value.len());
            for c in value.chars() {
                if matches!(c, '%' | '/' | '\\') || c.is_ascii_control() {
                    out.push_str(&format!("%{:02X}", c as u32));
                } else {
                    out.push(c);
                }
            }
            out
        }
    }
}

/// The records of a page: the array `pointer` finds in `body`.
fn records<'a>(body: &'a Value, pointer: &str) -> Result<&'a [Value], SinkError> {
    let bad = |problem: String| SinkError::BadRecords {
        pointer: pointer.to_owned(),
        problem,
    };
    if pointer.is_empty() {
        return match body {
            Value::Array(a) => Ok(a),
            Value::Object(_) => Ok(std::slice::from_ref(body)),
            other => Err(bad(format!(
                "(the whole body) is {}, not an array or object",
                json_kind(other)
            ))),
        };
    }
    match body.pointer(pointer) {
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(bad(format!("is {}, not an array", json_kind(other)))),
        None => Err(bad("is missing from the response".to_owned())),
    }
}

pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One line of a JSON lines sink; fields in this order.
#[derive(Serialize)]
struct Line<'a> {
    job: &'a str,
    item: ItemJson<'a>,
    fetched_at: &'a str,
    record: &'a Value,
}

/// The room one page needs in the spool or in a JSON lines sink, bytes:
/// `page` (as the spool writes it) plus, for each record, what a sink line
/// adds around it.
fn room_for(job: &str, item: &Item, page: &impl Serialize, records: usize) -> u64 {
    let line = Line {
        job,
        item: ItemJson(item),
        fetched_at: "2000-01-01T00:00:00.000Z",
        record: &Value::Null,
    };
    let per_line = encoded_len(&line).saturating_sub(4) + 1;
    encoded_len(page).saturating_add(per_line.saturating_mul(records as u64))
}

/// How many bytes `value` encodes to as JSON, counted, not kept.
fn encoded_len(value: &impl Serialize) -> u64 {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

/// An item as a JSON object, keys in fan-out order.
struct ItemJson<'a>(&'a Item);

impl Serialize for ItemJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
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

/// Appends one page (whole lines) to `path`; see the module docs for why
/// this never interleaves with other writers.
fn append(path: &Path, page: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The final component is never followed: a symbolic link planted in a
    // shared sink directory cannot redirect pages into another file
    // (ELOOP; docs/security.md).
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.lock()?;
    let appended = append_locked(&mut file, page);
    let unlocked = file.unlock();
    appended?;
    unlocked?;
    file.sync_data()
}

/// The append proper, under the exclusive `flock` every writer takes.
///
/// The torn-line check needs that lock: without it, it can read the end of
/// another writer's page while that page is being copied in, and add a blank
/// line. (Checked: with the lock removed and this check kept, the
/// concurrency tests fail; with both removed, `O_APPEND` alone passes them.)
fn append_locked(file: &mut File, page: &[u8]) -> io::Result<()> {
    let start = file.metadata()?.len();
    let torn = start > 0 && {
        let mut last = [0u8];
        file.read_exact_at(&mut last, start - 1)?;
        last[0] != b'\n'
    };
    let written = if torn {
        // Isolate the torn line someone left, rather than extend it.
        let mut buf = Vec::with_capacity(page.len() + 1);
        buf.push(b'\n');
        buf.extend_from_slice(page);
        file.write_all(&buf)
    } else {
        file.write_all(page)
    };
    if let Err(e) = written {
        // Nobody appended since `start` (we hold the lock): take our partial
        // page back so a retry does not leave half of it behind.
        let _ = file.set_len(start);
        return Err(e);
    }
    Ok(())
}

/// The part of `job`'s sink directory that every item and day shares: the
/// path up to the directory holding its first placeholder other than
/// `{job}` (the whole path's directory when it has none), relative to the
/// config directory. `data/{job}/{region}/{date}.jsonl` → `data/trending`.
pub fn fixed_dir(job: &Job) -> PathBuf {
    fixed_part(&job.sink.path, &job.name)
}

fn fixed_part(template: &Template, job: &str) -> PathBuf {
    let rendered = with_holes(template, job);
    let fixed = match rendered.split_once('\0') {
        Some((before, _)) => match before.rfind('/') {
            Some(i) => &before[..i],
            None => "",
        },
        None => rendered.rsplit_once('/').map_or("", |(dir, _)| dir),
    };
    PathBuf::from(fixed)
}

/// Every SQLite file `job`'s sink has written so far (its path template
/// with each placeholder but `{job}` matching any value), sorted.
pub fn databases(config: &Config, job: &Job) -> Vec<PathBuf> {
    let full = config.dir.join(with_holes(&job.sink.path, &job.name));
    let pattern: Vec<String> = full
        .to_string_lossy()
        .split('\0')
        .map(glob::Pattern::escape)
        .collect();
    let mut out: Vec<PathBuf> = glob::glob(&pattern.join("*"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

/// `template` rendered with the job's (encoded) name and a NUL where each
/// other value goes: a NUL can be in no path.
fn with_holes(template: &Template, job: &str) -> String {
    let name = sanitize(job);
    template.render(|p| match p {
        "job" => Some(name.as_str()),
        _ => Some("\0"),
    })
}

/// Creates `dir` if missing and writes, syncs and removes a small file in
/// it: what a page write needs, short of the page.
pub fn probe_dir(dir: &Path) -> io::Result<()> {
    probe_room(dir, PROBE_BYTES)
}

/// The test write of [`probe_dir`], bytes.
const PROBE_BYTES: u64 = 4096;

/// Creates `dir` if missing and writes, syncs and removes a file of
/// `bytes` (at least [`PROBE_BYTES`]) in it: proof of room for a page of
/// that size, as the file system stands.
pub fn probe_room(dir: &Path, bytes: u64) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(
        ".quota-worker-probe-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut f| {
            let block = [b'\n'; 64 * 1024];
            let mut left = bytes.max(PROBE_BYTES);
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                f.write_all(&block[..n])?;
                left -= n as u64;
            }
            f.sync_all()
        });
    let removed = std::fs::remove_file(&probe);
    written?;
    // Left behind is harmless (a dot-file no reader takes for a page).
    removed.or_else(|e| match e.kind() {
        io::ErrorKind::NotFound => Ok(()),
        _ => Err(e),
    })
}

/// The longest file name Linux file systems take (`NAME_MAX`: ext4, XFS,
/// Btrfs, tmpfs).
pub const NAME_MAX: usize = 255;

/// Why `job`'s sink path cannot exist for some of its static `fan_out`
/// values: a file name longer than [`NAME_MAX`] with each placeholder's
/// longest value (every combination of the lists is an item, so the
/// longest ones meet). Names that take a `fan_out_from` column are not
/// known before a tick: such an item fails alone when it comes
/// ([`SinkError::NeverWritable`]).
pub fn name_too_long(job: &Job) -> Option<String> {
    let longest: Vec<(&str, String)> = job
        .fan_out
        .iter()
        .map(|(k, values)| {
            let v = values.iter().map(|v| sanitize(v)).max_by_key(String::len);
            (k.as_str(), v.unwrap_or_default())
        })
        .collect();
    let name = sanitize(&job.name);
    let rendered = job.sink.path.render(|p| match p {
        "job" => Some(name.as_str()),
        "date" => Some("2000-01-01"),
        key => Some(
            longest
                .iter()
                .find(|(k, _)| *k == key)
                .map_or("\0", |(_, v)| v.as_str()),
        ),
    });
    let too_long = rendered
        .split('/')
        .find(|c| !c.contains('\0') && c.len() > NAME_MAX)?;
    let short = |s: &str| match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    };
    let values: Vec<String> = longest
        .iter()
        .filter(|(k, _)| job.sink.path.placeholders().any(|p| p == *k))
        .map(|(k, v)| format!("{k} = {:?} ({} bytes)", short(v), v.len()))
        .collect();
    Some(format!(
        "a file name of this path would be {} bytes ({:?}) with the longest fan_out values ({}); a file name is at most {NAME_MAX} bytes: shorten the values or the path",
        too_long.len(),
        short(too_long),
        values.join(", ")
    ))
}

/// `check` and `run` at start: creates and tests each job's sink directory
/// up to its first placeholder ([`fixed_dir`]); each one that cannot be
/// written, and each path that cannot exist for a static `fan_out` value
/// ([`name_too_long`]), is an error at the job's `sink.path` naming why.
pub fn check_dirs(config: &Config) -> Result<(), ConfigErrors> {
    let mut seen = HashSet::new();
    let mut errors: Vec<ConfigError> = Vec::new();
    for job in config
        .jobs
        .values()
        .filter(|j| j.sink.kind != SinkKind::Postgres)
    {
        if let Some(why) = name_too_long(job) {
            errors.push(job.sink.at.error(why));
        }
        let dir = config.dir.join(fixed_dir(job));
        if !seen.insert(dir.clone()) {
            continue;
        }
        if let Err(e) = probe_dir(&dir) {
            let msg = format!(
                "the sink directory {} cannot be written: {e}",
                dir.display()
            );
            errors.push(job.sink.at.error(msg));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn item(pairs: &[(&str, &str)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn date() -> NaiveDate {
        NaiveDate::from_ymd_opt(2024, 5, 1).expect("valid date")
    }

    fn path(template: &str, job: &str, it: &[(&str, &str)]) -> String {
        let t = Template::parse(template).expect("template");
        render(&t, job, &item(it), date())
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn renders_job_date_and_fan_out_keys() {
        assert_eq!(
            path(
                "data/{job}/{region}/{date}.jsonl",
                "trending",
                &[("region", "US")]
            ),
            "data/trending/US/2024-05-01.jsonl"
        );
        assert_eq!(
            path(
                "{job}-{lang}-{region}.db",
                "a.b-c",
                &[("region", "GB"), ("lang", "en")]
            ),
            "a.b-c-en-GB.db"
        );
    }

    #[test]
    fn values_never_leave_their_path_component() {
        let t = "data/{region}/x.jsonl";
        assert_eq!(path(t, "j", &[("region", "..")]), "data/%2E%2E/x.jsonl");
        assert_eq!(path(t, "j", &[("region", ".")]), "data/%2E/x.jsonl");
        assert_eq!(path(t, "j", &[("region", "")]), "data/%/x.jsonl");
        assert_eq!(
            path(t, "j", &[("region", "../../etc/passwd")]),
            "data/..%2F..%2Fetc%2Fpasswd/x.jsonl"
        );
        assert_eq!(path(t, "j", &[("region", "/abs")]), "data/%2Fabs/x.jsonl");
        assert_eq!(
            path(t, "j", &[("region", "a\\b\0c\r\u{1b}")]),
            "data/a%5Cb%00c%0D%1B/x.jsonl"
        );
        // Dots inside a name are fine: only whole "." and ".." climb.
        assert_eq!(path(t, "j", &[("region", "...")]), "data/.../x.jsonl");
        assert_eq!(path(t, "j", &[("region", "v1.2")]), "data/v1.2/x.jsonl");
        // The job name is encoded too.
        assert_eq!(path("{job}.db", "..", &[]), "%2E%2E.db");
        // Every rendered path stays a plain relative path under data/.
        for v in ["..", ".", "../..", "a/../..", "/", "\\..\\", "\0"] {
            let p = PathBuf::from(path(t, "j", &[("region", v)]));
            let parts: Vec<_> = p.components().collect();
            assert_eq!(parts.len(), 3, "{v:?} -> {}", p.display());
            assert!(
                parts
                    .iter()
                    .all(|c| matches!(c, std::path::Component::Normal(_))),
                "{v:?} -> {}",
                p.display()
            );
        }
    }

    /// Regression (issue 9): `a/b` and `a_b` both wrote `a_b.jsonl`, so two
    /// items' records mixed in one file. The encoding is injective.
    #[test]
    fn sink_paths_are_injective() {
        let values = [
            "a/b", "a_b", "a%2Fb", "a%b", "a\\b", "", "%", ".", "..", "%2E", "_", "__", "a\rb",
            "a%0Db", "a\0b", "a%00b",
        ];
        let mut seen = HashMap::new();
        for v in values {
            let encoded = sanitize(v);
            if let Some(other) = seen.insert(encoded.clone(), v) {
                panic!("{v:?} and {other:?} both encode to {encoded:?}");
            }
        }
    }

    #[test]
    fn the_fixed_part_of_a_sink_path_ends_before_the_first_value() {
        let fixed = |t: &str| {
            let t = Template::parse(t).expect("template");
            fixed_part(&t, "trending").to_string_lossy().into_owned()
        };
        assert_eq!(fixed("data/{job}/{region}/{date}.jsonl"), "data/trending");
        assert_eq!(fixed("data/x-{region}/a.jsonl"), "data");
        assert_eq!(fixed("{job}.sqlite"), "");
        assert_eq!(fixed("/var/lib/q/{job}.sqlite"), "/var/lib/q");
        assert_eq!(fixed("out/all.jsonl"), "out");
        assert_eq!(fixed("{region}/x.jsonl"), "");
    }

    #[test]
    fn finds_records() {
        let body = json!({"items": [{"id": 1}, {"id": 2}], "next": "x", "n": 3});
        assert_eq!(records(&body, "/items").expect("array").len(), 2);
        assert_eq!(records(&body, "").expect("object").len(), 1);
        assert_eq!(records(&json!([1, 2, 3]), "").expect("array").len(), 3);
        assert_eq!(
            records(&json!({"items": []}), "/items")
                .expect("empty")
                .len(),
            0
        );
        for (body, pointer, problem) in [
            (&body, "/missing", "is missing from the response"),
            (&body, "/next", "is a string, not an array"),
            (&body, "/n", "is a number, not an array"),
            (
                &json!("x"),
                "",
                "(the whole body) is a string, not an array or object",
            ),
        ] {
            let err = records(body, pointer).expect_err(pointer);
            assert!(err.is_bad_response());
            assert!(
                matches!(&err, SinkError::BadRecords { problem: p, .. } if p == problem),
                "{err}"
            );
        }
    }
}
