//! The SQLite sink: one table per job with an FTS5 index over the job's
//! `sink.search` fields, records upserted by (item, key), and the local
//! search that reads it (`quota-worker search`), so a search never spends
//! quota. The layout is documented for users in docs/jobs.md ("The SQLite
//! layout"); keep the two in step.
//!
//! One connection per database file per process, reused (a [`Mutex`]
//! locked only inside `spawn_blocking`, never across an `.await`): the
//! process's writers of one file queue on that mutex, and other processes'
//! on SQLite's busy timeout. WAL mode and `synchronous = FULL`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;

use super::record::{Hit, item_column, keyed_rows, search_text, sorted_json, warn_missing_keys};
use super::{SinkError, blocking, lock};
use crate::config::{Item, Job};

/// How long a SQLite write waits for another connection's transaction
/// before the page is spooled instead (see `spool`).
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Open SQLite files kept per process before idle ones are closed (a
/// `{date}` in a sqlite path opens a new file every day).
const MAX_OPEN_DBS: usize = 32;

/// Records which search fields each job's index was built from, so a config
/// change re-indexes. The ':' keeps it apart from every job's table (job
/// names cannot contain ':').
const META_TABLE: &str = "quota-worker:meta";

/// What a job's table looks like.
pub(super) struct TableSpec {
    pub(super) job: String,
    pub(super) search: Vec<String>,
}

impl TableSpec {
    fn fts(&self) -> String {
        fts_name(&self.job)
    }
}

fn fts_name(job: &str) -> String {
    format!("{job}:fts")
}

/// One record, encoded for SQLite.
pub(super) struct Row {
    pub(super) key: Option<String>,
    pub(super) record: String,
    pub(super) search_text: String,
}

/// Upserts `records` of `job`'s `item`, fetched at `fetched_at` (its
/// fixed-width text: text order is time order, which the upsert relies on),
/// into the database at `path` through `pool`'s connection to it; how many
/// were stored (fewer when the database holds a newer copy of some).
pub(super) async fn write(
    pool: Arc<Pool>,
    path: PathBuf,
    job: &Job,
    item: &Item,
    fetched_at: String,
    records: &[Value],
) -> Result<usize, SinkError> {
    let spec = TableSpec {
        job: job.name.clone(),
        search: job.sink.search.clone(),
    };
    let item = item_column(item);
    let (keyed, missing_keys) = keyed_rows(job, records.iter())?;
    warn_missing_keys(job, missing_keys);
    let rows: Vec<Row> = (keyed.into_iter().zip(records))
        .map(|((key, record_text), record)| Row {
            key,
            record: record_text,
            search_text: search_text(record, &job.sink.search),
        })
        .collect();
    blocking(move || {
        let db = pool.get(&path)?;
        let mut db = lock(&db);
        db.write(&spec, &item, &fetched_at, &rows)
            .map_err(|source| SinkError::Sqlite { path, source })
    })
    .await
}

/// An SQL identifier, quoted.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// An SQL string literal.
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Whether SQLite said another connection holds the lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Runs `f` again while SQLite answers "busy" without having waited (it
/// skips the busy handler where waiting could deadlock: switching the
/// journal mode, say), for up to [`BUSY_TIMEOUT`].
fn patiently<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(5);
    loop {
        match f() {
            Err(e) if is_busy(&e) && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// The open databases of one process.
#[derive(Default)]
pub(super) struct Pool {
    /// Locked only to look a connection up or add one, never while opening a
    /// database or running SQL, so a slow database holds up no other.
    dbs: Mutex<HashMap<PathBuf, Arc<Mutex<Db>>>>,
}

impl Pool {
    pub(super) fn get(&self, path: &Path) -> Result<Arc<Mutex<Db>>, SinkError> {
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
pub(super) struct Db {
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
        // Never through a symbolic link planted where the database goes
        // (SQLITE_CANTOPEN_SYMLINK; docs/security.md), as the jsonl sink.
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::default() | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )?;
        configure(&conn)?;
        // WAL: readers (search) never block writers, and writers from several
        // processes queue on the busy timeout instead of failing. Switching
        // a new file to WAL takes an exclusive lock without waiting on the
        // busy handler: two processes opening one new file at once got
        // "database is locked" here, so it is retried.
        let mode: String =
            patiently(|| conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)))?;
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

    /// Stores one page in one transaction; a "busy" that SQLite returns
    /// without waiting is retried (see [`patiently`]).
    pub(super) fn write(
        &mut self,
        spec: &TableSpec,
        item: &str,
        fetched_at: &str,
        rows: &[Row],
    ) -> rusqlite::Result<usize> {
        patiently(|| self.write_once(spec, item, fetched_at, rows))
    }

    fn write_once(
        &mut self,
        spec: &TableSpec,
        item: &str,
        fetched_at: &str,
        rows: &[Row],
    ) -> rusqlite::Result<usize> {
        let ready_key = (spec.job.clone(), spec.search.clone());
        let needs_schema = !self.ready.contains(&ready_key);
        // IMMEDIATE: take the write lock up front (waiting on the busy
        // timeout), so two processes never deadlock upgrading read
        // transactions (which no busy timeout fixes).
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
             ON CONFLICT(item, record_key) DO UPDATE SET
               job = excluded.job, fetched_at = excluded.fetched_at,
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

/// The job's table as created now; `{t}` is its quoted name. Column order is
/// the first layout's, so rows copy across unchanged.
fn table_sql(t: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (
           id INTEGER PRIMARY KEY,
           record_key TEXT,
           job TEXT NOT NULL,
           item TEXT NOT NULL,
           fetched_at TEXT NOT NULL,
           record TEXT NOT NULL,
           search_text TEXT NOT NULL DEFAULT '',
           UNIQUE (item, record_key)
         )"
    )
}

/// Creates the job's table, index and triggers if they are missing, moves a
/// table of the first layout to this one, and re-indexes when the job's
/// search fields changed since the index was built.
fn ensure_schema(tx: &rusqlite::Transaction<'_>, spec: &TableSpec) -> rusqlite::Result<()> {
    let meta = ident(META_TABLE);
    let t = ident(&spec.job);
    let fts_name = spec.fts();
    let fts = ident(&fts_name);
    let trigger = |suffix: &str| ident(&format!("{}:{suffix}", spec.job));
    let (ai, ad, au) = (trigger("ai"), trigger("ad"), trigger("au"));
    let migrated = migrate_key_per_job(tx, spec)?;
    tx.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {meta} (job TEXT PRIMARY KEY, search TEXT NOT NULL);
         {table};
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
        table = table_sql(&t),
        content = literal(&spec.job),
    ))?;
    if migrated {
        // Same ids and texts, but rebuilt rather than trusted.
        tx.execute(&format!("INSERT INTO {fts}({fts}) VALUES ('rebuild')"), [])?;
    }
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

/// The first layout made `record_key` unique across the whole table, so a
/// key unique only within an item (a GitHub issue `number` per repository)
/// let one item's record overwrite another's. A table of that layout is
/// rebuilt as `UNIQUE (item, record_key)`, same rows and ids, items
/// rewritten with sorted keys; no row can clash, since keys were unique
/// across the table. Returns whether it did.
fn migrate_key_per_job(tx: &rusqlite::Transaction<'_>, spec: &TableSpec) -> rusqlite::Result<bool> {
    let old_layout: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_index_list(?1) AS il WHERE il.\"unique\"
           AND (SELECT group_concat(name) FROM pragma_index_info(il.name)) = 'record_key')",
        [&spec.job],
        |r| r.get(0),
    )?;
    if !old_layout {
        return Ok(false);
    }
    let t = ident(&spec.job);
    let staging = ident(&format!("{}:migrating", spec.job));
    tx.execute_batch(&table_sql(&staging))?;
    {
        let mut select = tx.prepare(&format!(
            "SELECT id, record_key, job, item, fetched_at, record, search_text FROM {t}"
        ))?;
        let mut insert = tx.prepare(&format!(
            "INSERT INTO {staging} (id, record_key, job, item, fetched_at, record, search_text)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
        ))?;
        let mut rows = select.query([])?;
        while let Some(r) = rows.next()? {
            let item: String = r.get(3)?;
            let item = serde_json::from_str::<Value>(&item)
                .map(|v| sorted_json(&v))
                .unwrap_or(item);
            insert.execute(params![
                r.get::<_, i64>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, String>(2)?,
                item,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
            ])?;
        }
    }
    // Dropping the table drops its triggers; they are made again for the new one.
    tx.execute_batch(&format!(
        "DROP TABLE {t}; ALTER TABLE {staging} RENAME TO {t};"
    ))?;
    tracing::info!(job = %spec.job, "sqlite sink: records are now keyed per item (UNIQUE (item, record_key)); table migrated");
    Ok(true)
}

/// Full-text search over the records `job_name` stored in the SQLite sink
/// `db_path`: the best `limit` matches, best first (FTS5 `bm25` rank).
/// Serves user search locally, so it never spends quota.
///
/// `query` is plain words, all of which must match (case and accents
/// ignored); a word ending in `*` matches as a prefix. FTS5 operators are
/// not interpreted, so any user input is a valid query. Blocking: call it
/// from `spawn_blocking` in async code. It opens its own connection, which
/// WAL lets run alongside writers, and writes nothing.
pub fn find(
    db_path: &Path,
    job_name: &str,
    query: &str,
    limit: usize,
) -> Result<Vec<Hit>, SinkError> {
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
    let conn = open_to_read(db_path).map_err(sqlite)?;
    let fts_table = fts_name(job_name);
    let exists = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            [&fts_table],
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
    let (t, fts) = (ident(job_name), ident(&fts_table));
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {t}.item, {t}.record_key, {t}.fetched_at, {t}.record,
                    snippet({fts}, 0, '[', ']', '…', 12), {fts}.rank
             FROM {fts} JOIN {t} ON {t}.id = {fts}.rowid
             WHERE {fts} MATCH ?1 ORDER BY {fts}.rank LIMIT ?2"
        ))
        .map_err(sqlite)?;
    let rows = stmt
        .query_map(params![query, limit], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, f64>(5)?,
            ))
        })
        .map_err(sqlite)?;
    let mut out = Vec::new();
    for row in rows {
        let (item, key, fetched_at, record, snippet, rank) = row.map_err(sqlite)?;
        match (serde_json::from_str(&item), serde_json::from_str(&record)) {
            (Ok(item), Ok(record)) => out.push(Hit {
                item,
                key,
                fetched_at,
                snippet,
                record,
                rank,
            }),
            // Only we write these rows; one edited by hand is skipped.
            _ => tracing::warn!(path = %db_path.display(), "stored record or item is not JSON"),
        }
    }
    Ok(out)
}

/// `db_path` opened to read: read-write without CREATE plus `query_only`,
/// as a WAL database opened strictly read-only cannot always set up its
/// shared memory. (A file the user may not write is opened read-only by
/// SQLite itself.)
fn open_to_read(db_path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    configure(&conn)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
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
