//! Sinks: where the records of a fetched page go — JSON lines files, or SQLite
//! with a full-text index that serves user search locally, so a search never
//! spends quota.
//!
//! A page's records are found with the job's `sink.records` JSON pointer
//! ("" = the whole body: an array is its elements, an object one record). A
//! pointer that finds no array is the response's fault ([`SinkError::is_bad_response`]);
//! everything else that goes wrong here is the sink's (disk, database busy)
//! and worth retrying later.
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
//! resolve against the config file's directory.
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
//! One database file per rendered path, one connection per file per process,
//! reused (a [`Mutex`] locked only inside `spawn_blocking`, never across an
//! `.await`); WAL mode, `synchronous = FULL` and a busy timeout so several
//! processes can write one database. Each job has a table named after it:
//!
//! ```sql
//! CREATE TABLE "<job>" (id INTEGER PRIMARY KEY, record_key TEXT UNIQUE,
//!   job TEXT, item TEXT /* JSON */, fetched_at TEXT /* RFC 3339 */,
//!   record TEXT /* JSON */, search_text TEXT);
//! ```
//!
//! and an FTS5 index `"<job>:fts"` over `search_text` (the string values at
//! the job's `sink.search` pointers, joined), kept in sync by triggers. With
//! `sink.key` a re-fetched record replaces the stored one (an upsert that
//! never lets an older fetch overwrite a newer one); a record without a key
//! value is stored without one. [`search`] queries the index.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::config::{Job, SinkKind, Template};

/// One fan-out item: the fan-out key/value pairs of a task, e.g.
/// `[("region", "US")]`.
pub type Item = Vec<(String, String)>;

/// How long a SQLite write waits for another process's transaction.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Open SQLite files kept per process before idle ones are closed (a
/// `{date}` in a sqlite path opens a new file every day).
const MAX_OPEN_DBS: usize = 32;

/// Records which search fields each job's index was built from, so a config
/// change re-indexes. The ':' keeps it apart from every job's table (job
/// names cannot contain ':').
const META_TABLE: &str = "quota-worker:meta";

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
    /// A file could not be written: retry later.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// A SQLite database failed (busy past the timeout, disk full, ...):
    /// retry later.
    #[error("sqlite {}: {source}", path.display())]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// [`search`] found no index for the job in that database.
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
    /// The blocking task that did the I/O panicked or was cancelled.
    #[error("sink I/O task ended abnormally: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl SinkError {
    /// Whether the fetched response is to blame (the task fails as "bad
    /// response"; retrying would fetch the same thing), rather than the sink
    /// (the task is retried later).
    #[must_use]
    pub fn is_bad_response(&self) -> bool {
        matches!(self, SinkError::BadRecords { .. } | SinkError::Encode(_))
    }
}

/// Writes fetched pages to the jobs' sinks. Cheap to clone: clones share the
/// open SQLite connections.
#[derive(Clone)]
pub struct Sinks {
    /// Relative sink paths resolve against it (the config file's directory).
    base_dir: PathBuf,
    /// Open SQLite connections, one per database file.
    dbs: Arc<Pool>,
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
    /// ([`Config::dir`](crate::config::Config::dir)).
    pub fn new(base_dir: PathBuf) -> Self {
        Sinks {
            base_dir,
            dbs: Arc::new(Pool::default()),
        }
    }

    /// The file `job`'s records of `item` fetched on `date` (UTC) go to.
    pub fn path(&self, job: &Job, item: &Item, date: NaiveDate) -> PathBuf {
        self.base_dir.join(render_path(job, item, date))
    }

    /// Writes the records of one fetched page; returns how many were
    /// written (for SQLite with a key, a record older than the stored copy
    /// is skipped and not counted). Zero records is not an error.
    pub async fn write(
        &self,
        job: &Job,
        item: &Item,
        body: &Value,
        fetched_at: DateTime<Utc>,
    ) -> Result<usize, SinkError> {
        let records = records(body, &job.sink.records)?;
        let path = self.path(job, item, fetched_at.date_naive());
        // Fixed width (always 3 fraction digits, 'Z'): text order is time
        // order, which the upsert relies on.
        let fetched_at = fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true);
        // Encoding happens here, borrowing the body, so the blocking task
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
                        fetched_at: &fetched_at,
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
                let item = serde_json::to_string(&ItemJson(item)).map_err(SinkError::Encode)?;
                let mut missing_keys = 0usize;
                let mut rows = Vec::with_capacity(records.len());
                for record in records {
                    let key = job.sink.key.as_deref().and_then(|p| key_of(record, p));
                    if job.sink.key.is_some() && key.is_none() {
                        missing_keys += 1;
                    }
                    rows.push(Row {
                        key,
                        record: serde_json::to_string(record).map_err(SinkError::Encode)?,
                        search_text: search_text(record, &job.sink.search),
                    });
                }
                if missing_keys > 0 {
                    tracing::warn!(
                        job = %job.name,
                        missing_keys,
                        key = job.sink.key.as_deref().unwrap_or_default(),
                        "records without a key value are stored without one: re-fetches of them add rows"
                    );
                }
                let pool = self.dbs.clone();
                blocking(move || {
                    let db = pool.get(&path)?;
                    let mut db = lock(&db);
                    db.write(&spec, &item, &fetched_at, &rows)
                        .map_err(|source| SinkError::Sqlite { path, source })
                })
                .await
            }
        }
    }
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
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
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

/// A record's unique id at `pointer`: a string as is, anything else as its
/// JSON text; `None` when absent or null.
fn key_of(record: &Value, pointer: &str) -> Option<String> {
    match record.pointer(pointer)? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The text the full-text index sees: every string at each of `fields`
/// (strings inside arrays and objects there too, e.g. a tags list), one per
/// line.
fn search_text(record: &Value, fields: &[String]) -> String {
    fn collect<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::String(s) => out.push(s),
            Value::Array(a) => a.iter().for_each(|v| collect(v, out)),
            Value::Object(o) => o.values().for_each(|v| collect(v, out)),
            _ => {}
        }
    }
    let mut parts = Vec::new();
    for field in fields {
        if let Some(v) = record.pointer(field) {
            collect(v, &mut parts);
        }
    }
    parts.join("\n")
}

/// An SQL identifier, quoted.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// What a job's table looks like.
struct TableSpec {
    job: String,
    search: Vec<String>,
}

impl TableSpec {
    fn fts(&self) -> String {
        format!("{}:fts", self.job)
    }
}

/// One record, encoded for SQLite.
struct Row {
    key: Option<String>,
    record: String,
    search_text: String,
}

/// The open databases of one process.
#[derive(Default)]
struct Pool {
    /// Locked only to look a connection up or add one, never while opening a
    /// database or running SQL, so a slow database holds up no other.
    dbs: Mutex<HashMap<PathBuf, Arc<Mutex<Db>>>>,
}

impl Pool {
    fn get(&self, path: &Path) -> Result<Arc<Mutex<Db>>, SinkError> {
        if let Some(db) = lock(&self.dbs).get(path) {
            return Ok(db.clone());
        }
        let opened = Db::open(path).map_err(|source| SinkError::Sqlite {
            path: path.to_owned(),
            source,
        })?;
        let mut dbs = lock(&self.dbs);
        if dbs.len() >= MAX_OPEN_DBS {
            // Close the idle ones (only the map holds them).
            dbs.retain(|_, db| Arc::strong_count(db) > 1);
        }
        // Another thread may have opened it meanwhile: keep one.
        Ok(dbs
            .entry(path.to_owned())
            .or_insert_with(|| Arc::new(Mutex::new(opened)))
            .clone())
    }
}

/// One open database.
struct Db {
    conn: Connection,
    /// Jobs whose tables this connection has checked, with the search fields
    /// they were checked for.
    ready: HashSet<(String, Vec<String>)>,
}

impl Db {
    fn open(path: &Path) -> rusqlite::Result<Db> {
        if let Some(dir) = path.parent() {
            // An error here shows up as SQLite's "unable to open".
            let _ = std::fs::create_dir_all(dir);
        }
        let conn = Connection::open(path)?;
        configure(&conn)?;
        // WAL: readers (search) never block writers, and writers from several
        // processes queue on the busy timeout instead of failing.
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "sqlite sink is not in WAL mode");
        }
        // A page costs quota: make each committed page survive a power loss.
        conn.pragma_update(None, "synchronous", "FULL")?;
        Ok(Db {
            conn,
            ready: HashSet::new(),
        })
    }

    /// Stores one page in one transaction.
    fn write(
        &mut self,
        spec: &TableSpec,
        item: &str,
        fetched_at: &str,
        rows: &[Row],
    ) -> rusqlite::Result<usize> {
        let ready_key = (spec.job.clone(), spec.search.clone());
        let needs_schema = !self.ready.contains(&ready_key);
        // IMMEDIATE: take the write lock up front, so two processes never
        // deadlock upgrading read transactions (which no busy timeout fixes).
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        if needs_schema {
            ensure_schema(&tx, spec)?;
        }
        let table = ident(&spec.job);
        // ON CONFLICT DO UPDATE, not INSERT OR REPLACE: REPLACE deletes
        // without firing the delete trigger, which would leave the old text
        // in the index. The WHERE keeps a late, older fetch from overwriting
        // a newer copy.
        let sql = format!(
            "INSERT INTO {table} (record_key, job, item, fetched_at, record, search_text)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(record_key) DO UPDATE SET
               job = excluded.job, item = excluded.item, fetched_at = excluded.fetched_at,
               record = excluded.record, search_text = excluded.search_text
             WHERE excluded.fetched_at >= {table}.fetched_at"
        );
        let mut written = 0;
        {
            let mut stmt = tx.prepare_cached(&sql)?;
            for row in rows {
                written += stmt.execute(params![
                    row.key,
                    spec.job,
                    item,
                    fetched_at,
                    row.record,
                    row.search_text
                ])?;
            }
        }
        tx.commit()?;
        if needs_schema {
            self.ready.insert(ready_key);
        }
        Ok(written)
    }
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)
}

/// Creates the job's table, index and triggers if they are missing, and
/// re-indexes when the job's search fields changed since the index was built.
fn ensure_schema(tx: &rusqlite::Transaction<'_>, spec: &TableSpec) -> rusqlite::Result<()> {
    let meta = ident(META_TABLE);
    let t = ident(&spec.job);
    let fts_name = spec.fts();
    let fts = ident(&fts_name);
    let trigger = |suffix: &str| ident(&format!("{}:{suffix}", spec.job));
    let (ai, ad, au) = (trigger("ai"), trigger("ad"), trigger("au"));
    tx.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {meta} (job TEXT PRIMARY KEY, search TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS {t} (
           id INTEGER PRIMARY KEY,
           record_key TEXT UNIQUE,
           job TEXT NOT NULL,
           item TEXT NOT NULL,
           fetched_at TEXT NOT NULL,
           record TEXT NOT NULL,
           search_text TEXT NOT NULL DEFAULT ''
         );
         CREATE VIRTUAL TABLE IF NOT EXISTS {fts} USING fts5(
           search_text, content={content}, content_rowid='id',
           tokenize='unicode61 remove_diacritics 2'
         );
         CREATE TRIGGER IF NOT EXISTS {ai} AFTER INSERT ON {t} BEGIN
           INSERT INTO {fts}(rowid, search_text) VALUES (new.id, new.search_text);
         END;
         CREATE TRIGGER IF NOT EXISTS {ad} AFTER DELETE ON {t} BEGIN
           INSERT INTO {fts}({fts}, rowid, search_text) VALUES ('delete', old.id, old.search_text);
         END;
         CREATE TRIGGER IF NOT EXISTS {au} AFTER UPDATE ON {t} BEGIN
           INSERT INTO {fts}({fts}, rowid, search_text) VALUES ('delete', old.id, old.search_text);
           INSERT INTO {fts}(rowid, search_text) VALUES (new.id, new.search_text);
         END;",
        content = literal(&spec.job),
    ))?;
    let wanted = serde_json::to_string(&spec.search).unwrap_or_default();
    let built: Option<String> = tx
        .query_row(
            &format!("SELECT search FROM {meta} WHERE job = ?1"),
            [&spec.job],
            |r| r.get(0),
        )
        .optional()?;
    if built.as_deref() == Some(wanted.as_str()) {
        return Ok(());
    }
    if built.is_some() {
        // The search fields changed: recompute every row's text (the update
        // trigger re-indexes it).
        let mut select = tx.prepare(&format!("SELECT id, record FROM {t}"))?;
        let mut update = tx.prepare(&format!("UPDATE {t} SET search_text = ?2 WHERE id = ?1"))?;
        let rows = select.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
        for row in rows {
            let (id, record) = row?;
            if let Ok(record) = serde_json::from_str::<Value>(&record) {
                update.execute(params![id, search_text(&record, &spec.search)])?;
            }
        }
    }
    tx.execute(
        &format!(
            "INSERT INTO {meta} (job, search) VALUES (?1, ?2)
             ON CONFLICT(job) DO UPDATE SET search = excluded.search"
        ),
        params![spec.job, wanted],
    )?;
    Ok(())
}

/// Full-text search over the records `job_name` stored in the SQLite sink
/// `db_path`: the best `limit` matches, best first (FTS5 `bm25` rank), as
/// the raw records. Serves user search locally, so it never spends quota.
///
/// `query` is plain words, all of which must match (case and accents
/// ignored); a word ending in `*` matches as a prefix. FTS5 operators are
/// not interpreted, so any user input is a valid query. Blocking: call it
/// from `spawn_blocking` in async code. It opens its own read-only
/// connection, which WAL lets run alongside writers.
pub fn search(
    db_path: &Path,
    job_name: &str,
    query: &str,
    limit: usize,
) -> Result<Vec<Value>, SinkError> {
    let no_index = || SinkError::NoIndex {
        path: db_path.to_owned(),
        job: job_name.to_owned(),
    };
    let sqlite = |source| SinkError::Sqlite {
        path: db_path.to_owned(),
        source,
    };
    if !db_path.is_file() {
        return Err(no_index());
    }
    // Read-write without CREATE plus query_only: a WAL database opened
    // strictly read-only cannot always set up its shared memory.
    let conn = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite)?;
    configure(&conn).map_err(sqlite)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(sqlite)?;
    let spec = TableSpec {
        job: job_name.to_owned(),
        search: Vec::new(),
    };
    let exists = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [spec.fts()],
            |_| Ok(()),
        )
        .optional()
        .map_err(sqlite)?;
    if exists.is_none() {
        return Err(no_index());
    }
    let Some(query) = fts_query(query) else {
        return Ok(Vec::new());
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let (t, fts) = (ident(job_name), ident(&spec.fts()));
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {t}.record FROM {fts} JOIN {t} ON {t}.id = {fts}.rowid
             WHERE {fts} MATCH ?1 ORDER BY {fts}.rank LIMIT ?2"
        ))
        .map_err(sqlite)?;
    let rows = stmt
        .query_map(params![query, limit], |r| r.get::<_, String>(0))
        .map_err(sqlite)?;
    let mut out = Vec::new();
    for row in rows {
        let text = row.map_err(sqlite)?;
        match serde_json::from_str(&text) {
            Ok(v) => out.push(v),
            // Only we write these rows; one edited by hand is skipped.
            Err(e) => {
                tracing::warn!(path = %db_path.display(), error = %e, "stored record is not JSON")
            }
        }
    }
    Ok(out)
}

/// Plain words → an FTS5 query: each word a quoted string (so `-`, `:`,
/// `"` and operators are just text), `word*` a prefix; all must match.
/// `None` when there are no words.
fn fts_query(query: &str) -> Option<String> {
    let terms: Vec<String> = query
        .split_whitespace()
        .filter_map(|word| {
            let (word, prefix) = match word.strip_suffix('*') {
                Some(w) => (w.trim_end_matches('*'), true),
                None => (word, false),
            };
            (!word.is_empty()).then(|| {
                let quoted = format!("\"{}\"", word.replace('"', "\"\""));
                if prefix { quoted + "*" } else { quoted }
            })
        })
        .collect();
    (!terms.is_empty()).then(|| terms.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    #[test]
    fn search_text_takes_strings_under_each_field() {
        let r = json!({"snippet": {"title": "Cats", "tags": ["funny", "pets"], "views": 3},
                       "description": "not indexed"});
        assert_eq!(
            search_text(
                &r,
                &[
                    "/snippet/title".into(),
                    "/snippet/tags".into(),
                    "/none".into()
                ]
            ),
            "Cats\nfunny\npets"
        );
    }

    #[test]
    fn keys_are_strings_or_json_text() {
        assert_eq!(key_of(&json!({"id": "a"}), "/id").as_deref(), Some("a"));
        assert_eq!(key_of(&json!({"id": 7}), "/id").as_deref(), Some("7"));
        assert_eq!(
            key_of(&json!({"id": {"videoId": "v"}}), "/id").as_deref(),
            Some(r#"{"videoId":"v"}"#)
        );
        assert_eq!(key_of(&json!({"id": null}), "/id"), None);
        assert_eq!(key_of(&json!({}), "/id"), None);
    }

    #[test]
    fn user_input_is_always_a_valid_fts_query() {
        assert_eq!(fts_query("cat video").as_deref(), Some(r#""cat" "video""#));
        assert_eq!(fts_query("vid*").as_deref(), Some(r#""vid"*"#));
        assert_eq!(
            fts_query(r#"a"b NOT x-y"#).as_deref(),
            Some(r#""a""b" "NOT" "x-y""#)
        );
        assert_eq!(fts_query("  * ** "), None);
        assert_eq!(fts_query(""), None);
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(ident("a.b-c"), r#""a.b-c""#);
        assert_eq!(ident(r#"x"y"#), r#""x""y""#);
        assert_eq!(literal("it's"), "'it''s'");
    }
}
