//! Fan-out from data (`[job.fan_out_from]`): the rows of a CSV file, or of
//! one read-only SQLite query, are a tick's items; each column a placeholder.
//!
//! A tick reads its source once, start to end, into a spool (an anonymous
//! temporary file), checking every value and counting the rows; the queue
//! then streams the items from the spool in chunks. So a tick sees the
//! source as one snapshot (a SQLite read lock is held only while the query
//! runs, never while Redis is written), knows the count before it queues
//! anything (`max_items`), and holds one chunk of items in memory however
//! many rows there are.
//!
//! The SQLite file is opened `SQLITE_OPEN_READ_ONLY` with `query_only` on,
//! and the query must prepare as one statement that returns columns and
//! that SQLite calls read-only (`sqlite3_stmt_readonly`): a write is refused
//! at load (a config error) and again at every tick, and could not write
//! through that connection anyway. A PostgreSQL query runs in a read-only
//! transaction (`pg`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

use super::csv_rows::{CsvError, CsvRows, Field};
use crate::config::{DataSource, FanOutFrom};
use crate::pg::PgError;

mod pg;

/// How long a query waits for a SQLite writer's lock before the tick gives
/// up (WAL readers rarely wait at all).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest value a row may hold, in bytes: values go into URLs, Redis
/// keys and log lines.
pub const MAX_VALUE_BYTES: usize = 1024;

/// Refused rows an error names, at most (the rest are counted).
const REFUSED_SHOWN: usize = 5;

/// Separates values, and rows, in the spool: control characters are refused
/// in values, so neither can occur inside one.
const VALUE_SEP: char = '\u{1f}';

/// Why a tick could not read its source: it fans out nothing, and the next
/// tick reads it again. Each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The file is missing, unreadable or not a regular file.
    #[error("cannot read {}: {reason}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error, or what the path is instead of a file.
        reason: String,
    },
    /// The CSV is malformed (a ragged record, a field not UTF-8, a header
    /// name too long), at a line it names.
    #[error("{}: not valid CSV: line {line}: {why}", path.display())]
    Csv {
        /// The file.
        path: PathBuf,
        /// The line the record starts on.
        line: u64,
        /// What is wrong with it.
        why: String,
    },
    /// SQLite failed: no such table, a syntax error, locked past the busy
    /// timeout, not a database.
    #[error("{}: {source}", path.display())]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The query holds more than one statement.
    #[error(
        "the query must be one statement; it holds more (remove everything after the first `;`)"
    )]
    MultipleStatements,
    /// The query is not a read-only statement that returns rows.
    #[error(
        "the query must only read: one SELECT (or WITH … SELECT) that returns columns; writes, ATTACH, PRAGMA changes and transactions are refused"
    )]
    NotReadOnly,
    /// PostgreSQL failed: unreachable, the login refused, a syntax error,
    /// no such table.
    #[error("{0}")]
    Pg(#[from] PgError),
    /// A PostgreSQL result column of a type not read as text.
    #[error(
        "column {column} is of type {type_name}: cast it to text in the query ({column}::text AS {column})"
    )]
    ColumnType {
        /// The column.
        column: String,
        /// Its type, as PostgreSQL names it.
        type_name: String,
    },
    /// More rows than `max_items`.
    #[error(
        "{} has more than {max} rows (max_items): this tick fans out nothing; narrow the source or raise max_items",
        path.display()
    )]
    TooManyRows {
        /// The file.
        path: PathBuf,
        /// `max_items`.
        max: u64,
    },
    /// The columns are no longer those the job was loaded with.
    #[error(
        "{}: the columns are now {now:?}, but the job was loaded with {loaded:?}; restart the daemon to use the new columns",
        path.display()
    )]
    ColumnsChanged {
        /// The file.
        path: PathBuf,
        /// The columns the source has now.
        now: Vec<String>,
        /// The columns the job's placeholders were checked against.
        loaded: Vec<String>,
    },
    /// The temporary file the rows wait in could not be written or read.
    #[error("cannot spool the rows to a temporary file: {0}")]
    Spool(#[source] io::Error),
}

impl SourceError {
    fn unreadable(path: &Path, e: impl std::fmt::Display) -> Self {
        SourceError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        }
    }

    fn csv(path: &Path, e: CsvError) -> Self {
        match e {
            CsvError::Io(e) => SourceError::unreadable(path, e),
            CsvError::Record { line, why } => SourceError::Csv {
                path: path.to_owned(),
                line,
                why,
            },
        }
    }

    fn sqlite(path: &Path, e: rusqlite::Error) -> Self {
        match e {
            rusqlite::Error::MultipleStatement => SourceError::MultipleStatements,
            source => SourceError::Sqlite {
                path: path.to_owned(),
                source,
            },
        }
    }

    /// Whether the source itself is missing (a file another job has not
    /// created yet, a server that does not answer now), as opposed to a
    /// source that is there and wrong.
    pub fn is_missing(&self) -> bool {
        match self {
            SourceError::Unreadable { path, .. } => !path.exists(),
            SourceError::Pg(e) => e.is_unreachable(),
            SourceError::Sqlite {
                source: rusqlite::Error::SqliteFailure(e, _),
                ..
            } => e.code == rusqlite::ErrorCode::CannotOpen,
            _ => false,
        }
    }
}

/// The columns of `source`: the CSV header, or the query's result columns
/// (the query is prepared and checked, not run).
pub(crate) fn columns(source: &DataSource) -> Result<Vec<String>, SourceError> {
    match source {
        DataSource::Csv { path } => CsvRows::open(path)
            .and_then(|mut rows| rows.header())
            .map_err(|e| SourceError::csv(path, e)),
        DataSource::Sqlite { path, query } => {
            let conn = open_sqlite(path)?;
            let stmt = prepare(&conn, path, query)?;
            Ok(stmt.column_names().map(str::to_owned).collect())
        }
        DataSource::Postgres { target, query } => pg::columns(target, query),
    }
}

/// One tick's rows, waiting in a spool.
#[derive(Debug)]
pub struct Rows {
    /// The rows that passed, one line each; `None` when there are none.
    spool: Option<File>,
    /// How many passed.
    pub count: u64,
    /// Rows refused for a bad value, skipped.
    pub refused: Refused,
}

/// Rows a tick skipped because a value cannot be sent (empty, NULL, control
/// characters, too long): counted, the first few described.
#[derive(Debug, Default)]
pub struct Refused {
    /// How many.
    pub count: u64,
    /// The first [`REFUSED_SHOWN`], as "line 7: column region: empty".
    pub examples: Vec<String>,
}

impl Refused {
    fn add(&mut self, describe: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < REFUSED_SHOWN {
            self.examples.push(describe());
        }
    }
}

impl Rows {
    /// The rows from the `skip`-th on, each a value per column in the job's
    /// column order. One reader at a time (it moves the spool's offset).
    pub fn read_from(
        &mut self,
        skip: u64,
    ) -> Result<impl Iterator<Item = Result<Vec<String>, SourceError>> + Send + '_, SourceError>
    {
        let file = match &mut self.spool {
            Some(f) => {
                f.rewind().map_err(SourceError::Spool)?;
                Some(BufReader::new(&*f))
            }
            None => None,
        };
        let lines = file.into_iter().flat_map(BufRead::lines);
        Ok(lines.skip(skip as usize).map(|line| {
            line.map(|l| l.split(VALUE_SEP).map(str::to_owned).collect())
                .map_err(SourceError::Spool)
        }))
    }
}

/// Reads `from`'s source now: every row checked, counted and spooled, in
/// `columns` order. Blocking (file and SQLite I/O).
pub(crate) fn read(from: &FanOutFrom) -> Result<Rows, SourceError> {
    let mut spool = Spool::new(from)?;
    match &from.source {
        DataSource::Csv { path } => read_csv(path, &from.columns, &mut spool)?,
        DataSource::Sqlite { path, query } => read_sqlite(path, query, &from.columns, &mut spool)?,
        DataSource::Postgres { target, query } => {
            pg::read(target, query, &from.columns, &mut spool)?;
        }
    }
    spool.finish()
}

/// Where a tick's rows wait, and the checks each goes through on the way.
struct Spool<'a> {
    from: &'a FanOutFrom,
    out: Option<BufWriter<File>>,
    count: u64,
    refused: Refused,
}

impl<'a> Spool<'a> {
    fn new(from: &'a FanOutFrom) -> Result<Self, SourceError> {
        Ok(Spool {
            from,
            out: None,
            count: 0,
            refused: Refused::default(),
        })
    }

    /// Adds a row whose values are in job column order, or refuses it.
    /// `at` names the row in errors ("line 7", "row 3").
    fn push(
        &mut self,
        at: impl Fn() -> String,
        values: impl Iterator<Item = Result<String, String>>,
    ) -> Result<(), SourceError> {
        let mut row = String::new();
        for (i, v) in values.enumerate() {
            let column = &self.from.columns[i];
            let v = match v.and_then(check_value) {
                Ok(v) => v,
                Err(why) => {
                    self.refused
                        .add(|| format!("{}: column {column}: {why}", at()));
                    return Ok(());
                }
            };
            if i > 0 {
                row.push(VALUE_SEP);
            }
            row.push_str(&v);
        }
        self.count += 1;
        let max = self.from.max_items.get();
        if self.count > max {
            return Err(SourceError::TooManyRows {
                path: self.from.source.path().to_owned(),
                max,
            });
        }
        let out = match &mut self.out {
            Some(out) => out,
            None => self.out.insert(BufWriter::new(
                tempfile::tempfile().map_err(SourceError::Spool)?,
            )),
        };
        writeln!(out, "{row}").map_err(SourceError::Spool)
    }

    fn finish(self) -> Result<Rows, SourceError> {
        let spool = match self.out {
            Some(out) => Some(
                out.into_inner()
                    .map_err(|e| SourceError::Spool(e.into_error()))?,
            ),
            None => None,
        };
        Ok(Rows {
            spool,
            count: self.count,
            refused: self.refused,
        })
    }
}

/// A value as it may go into a URL, a header, a key and a log line: the
/// checks static `fan_out` values get at load.
fn check_value(v: String) -> Result<String, String> {
    if v.is_empty() {
        Err("empty".into())
    } else if v.chars().any(char::is_control) {
        Err(format!(
            "{:?} holds control characters (CR, LF, tab, ESC, ...)",
            v.chars().take(40).collect::<String>()
        ))
    } else if v.len() > MAX_VALUE_BYTES {
        Err(format!("longer than {MAX_VALUE_BYTES} bytes"))
    } else {
        Ok(v)
    }
}

/// Where each of the job's columns is in the source's `now` columns;
/// the same names in another order are fine.
fn column_order(path: &Path, now: &[String], loaded: &[String]) -> Result<Vec<usize>, SourceError> {
    let changed = || SourceError::ColumnsChanged {
        path: path.to_owned(),
        now: now.to_vec(),
        loaded: loaded.to_vec(),
    };
    if now.len() != loaded.len() {
        return Err(changed());
    }
    loaded
        .iter()
        .map(|c| now.iter().position(|n| n == c).ok_or_else(changed))
        .collect()
}

/// The CSV's records, streamed (`CsvRows`: a field is kept up to 4 KiB; a
/// longer one is read past and its row refused), in job column order.
fn read_csv(path: &Path, columns: &[String], spool: &mut Spool<'_>) -> Result<(), SourceError> {
    let csv_err = |e| SourceError::csv(path, e);
    let mut rows = CsvRows::open(path).map_err(csv_err)?;
    let header = rows.header().map_err(csv_err)?;
    if header.is_empty() || header.iter().all(String::is_empty) {
        let e = io::Error::new(io::ErrorKind::InvalidData, "no header row");
        return Err(SourceError::unreadable(path, e));
    }
    let order = column_order(path, &header, columns)?;
    while let Some(record) = rows.next_record().map_err(csv_err)? {
        let values = order.iter().map(|&i| match &record.fields[i] {
            Field::Text(v) => Ok(v.clone()),
            Field::TooLong => Err(format!("longer than {MAX_VALUE_BYTES} bytes")),
        });
        spool.push(|| format!("line {}", record.line), values)?;
    }
    Ok(())
}

/// Opens a SQLite file for reading only: never created, never written.
fn open_sqlite(path: &Path) -> Result<Connection, SourceError> {
    let meta = std::fs::metadata(path).map_err(|e| SourceError::unreadable(path, e))?;
    if !meta.is_file() {
        return Err(SourceError::unreadable(path, "not a regular file"));
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn =
        Connection::open_with_flags(path, flags).map_err(|e| SourceError::sqlite(path, e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .and_then(|()| conn.pragma_update(None, "query_only", true))
        .map_err(|e| SourceError::sqlite(path, e))?;
    Ok(conn)
}

/// The query, prepared and checked: one statement, read-only, with columns.
fn prepare<'c>(
    conn: &'c Connection,
    path: &Path,
    query: &str,
) -> Result<rusqlite::Statement<'c>, SourceError> {
    let stmt = conn
        .prepare(query)
        .map_err(|e| SourceError::sqlite(path, e))?;
    // `readonly` alone lets ATTACH, BEGIN and the like through (they do not
    // write the file); a statement that returns no columns feeds no
    // placeholders anyway.
    if !stmt.readonly() || stmt.column_count() == 0 {
        return Err(SourceError::NotReadOnly);
    }
    Ok(stmt)
}

fn read_sqlite(
    path: &Path,
    query: &str,
    columns: &[String],
    spool: &mut Spool<'_>,
) -> Result<(), SourceError> {
    let conn = open_sqlite(path)?;
    let mut stmt = prepare(&conn, path, query)?;
    let now: Vec<String> = stmt.column_names().map(str::to_owned).collect();
    let order = column_order(path, &now, columns)?;
    let mut rows = stmt.query([]).map_err(|e| SourceError::sqlite(path, e))?;
    let mut n = 0u64;
    while let Some(row) = rows.next().map_err(|e| SourceError::sqlite(path, e))? {
        n += 1;
        let values = order.iter().map(|&i| match row.get_ref(i) {
            Ok(v) => sql_text(v),
            Err(e) => Err(e.to_string()),
        });
        spool.push(|| format!("row {n}"), values)?;
    }
    Ok(())
}

/// A SQL value as placeholder text: text as is, numbers in decimal; NULL
/// and blobs are refused.
fn sql_text(v: ValueRef<'_>) -> Result<String, String> {
    match v {
        ValueRef::Null => Err("NULL".into()),
        ValueRef::Integer(i) => Ok(i.to_string()),
        ValueRef::Real(f) => Ok(f.to_string()),
        ValueRef::Text(t) => String::from_utf8(t.to_vec()).map_err(|_| "not UTF-8 text".into()),
        ValueRef::Blob(_) => Err("a blob, not text".into()),
    }
}

/// Whether `query` reads at first sight: its first keyword is SELECT, WITH,
/// VALUES or TABLE. For a database that does not exist yet, where SQLite cannot
/// prepare the query; every tick checks it fully.
pub(crate) fn looks_read_only(query: &str) -> bool {
    let mut rest = query.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, r)| r).trim_start();
        } else {
            break;
        }
    }
    let word: String = rest
        .chars()
        .take_while(char::is_ascii_alphabetic)
        .collect::<String>()
        .to_ascii_uppercase();
    matches!(word.as_str(), "SELECT" | "WITH" | "VALUES" | "TABLE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU64;

    fn from(source: DataSource, columns: &[&str], max: u64) -> FanOutFrom {
        FanOutFrom {
            source,
            columns: columns.iter().map(|c| c.to_string()).collect(),
            max_items: NonZeroU64::new(max).unwrap(),
            rows: None,
        }
    }

    fn all(rows: &mut Rows, skip: u64) -> Vec<Vec<String>> {
        rows.read_from(skip).unwrap().map(Result::unwrap).collect()
    }

    #[test]
    fn csv_rows_in_the_jobs_column_order_with_bad_rows_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.csv");
        std::fs::write(
            &path,
            "region , channel\nUS,UC1\n\"D,E\",\"UC 2\"\n,UC3\nFR,\"a\rb\"\nJP,UC5\n",
        )
        .unwrap();
        let source = DataSource::Csv { path };
        assert_eq!(columns(&source).unwrap(), ["region", "channel"]);
        let f = from(source, &["channel", "region"], 10);
        let mut rows = read(&f).unwrap();
        assert_eq!(rows.count, 3);
        assert_eq!(
            all(&mut rows, 0),
            [["UC1", "US"], ["UC 2", "D,E"], ["UC5", "JP"]]
        );
        assert_eq!(all(&mut rows, 2), [["UC5", "JP"]]);
        assert_eq!(rows.refused.count, 2);
        assert_eq!(rows.refused.examples[0], "line 4: column region: empty");
        assert!(
            rows.refused.examples[1].starts_with("line 5: column channel: \"a\\rb\" holds control")
        );
    }

    #[test]
    fn more_rows_than_max_items_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.csv");
        std::fs::write(&path, "a\n1\n2\n3\n").unwrap();
        let f = from(DataSource::Csv { path: path.clone() }, &["a"], 3);
        assert_eq!(read(&f).unwrap().count, 3);
        let f = from(DataSource::Csv { path }, &["a"], 2);
        assert!(matches!(
            read(&f),
            Err(SourceError::TooManyRows { max: 2, .. })
        ));
    }

    #[test]
    fn changed_columns_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.csv");
        std::fs::write(&path, "a,c\n1,2\n").unwrap();
        let f = from(DataSource::Csv { path }, &["a", "b"], 3);
        assert!(matches!(read(&f), Err(SourceError::ColumnsChanged { .. })));
    }

    #[test]
    fn sqlite_queries_must_be_one_read_only_statement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE ch (id TEXT, n INTEGER, x REAL, active INTEGER);
             INSERT INTO ch VALUES ('UC1', 7, 1.5, 1), ('UC2', NULL, 2.0, 1), ('UC3', 9, 3.25, 0);",
        )
        .unwrap();
        let q = |query: &str| DataSource::Sqlite {
            path: path.clone(),
            query: query.into(),
        };
        let good = q("SELECT id AS channel, n, x FROM ch WHERE active");
        assert_eq!(columns(&good).unwrap(), ["channel", "n", "x"]);
        let mut rows = read(&from(good, &["channel", "n", "x"], 10)).unwrap();
        assert_eq!(all(&mut rows, 0), [["UC1", "7", "1.5"]]);
        assert_eq!(rows.refused.examples, ["row 2: column n: NULL"]);
        for bad in [
            "DELETE FROM ch",
            "INSERT INTO ch VALUES ('x', 1, 1, 1)",
            "UPDATE ch SET n = 1",
            "ATTACH 'other.db' AS o",
            "PRAGMA user_version = 3",
            "BEGIN",
            "CREATE TABLE t (a)",
        ] {
            let e = columns(&q(bad)).unwrap_err();
            assert!(
                matches!(e, SourceError::NotReadOnly | SourceError::Sqlite { .. }),
                "{bad}: {e}"
            );
        }
        assert!(matches!(
            columns(&q("SELECT id FROM ch; DELETE FROM ch")),
            Err(SourceError::MultipleStatements)
        ));
        // Nothing was written.
        let n: i64 = conn
            .query_row("SELECT count(*) FROM ch", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 3);
        // A database that is not there is not created.
        let missing = DataSource::Sqlite {
            path: dir.path().join("nope.db"),
            query: "SELECT 1 AS a".into(),
        };
        let e = columns(&missing).unwrap_err();
        assert!(e.is_missing(), "{e}");
        assert!(!dir.path().join("nope.db").exists());
    }

    /// A sink's database is in WAL mode: it reads while its writer has it
    /// open, and after the writer closed it (and SQLite removed the -wal
    /// and -shm files), read-only all the same.
    #[test]
    fn a_wal_database_reads_with_and_without_its_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sink.db");
        let writer = Connection::open(&path).unwrap();
        writer
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE \"channels\" (record TEXT);
                 INSERT INTO \"channels\" VALUES ('{\"c\": \"UC1\"}'), ('{\"c\": \"UC2\"}');",
            )
            .unwrap();
        let source = DataSource::Sqlite {
            path: path.clone(),
            query: "SELECT json_extract(record, '$.c') AS channel FROM \"channels\"".into(),
        };
        let f = from(source.clone(), &["channel"], 10);
        assert_eq!(read(&f).unwrap().count, 2);
        drop(writer);
        assert!(!dir.path().join("sink.db-wal").exists());
        assert_eq!(columns(&source).unwrap(), ["channel"]);
        let mut rows = read(&f).unwrap();
        assert_eq!(all(&mut rows, 0), [["UC1"], ["UC2"]]);
    }

    #[test]
    fn the_first_keyword_tells_a_read() {
        assert!(looks_read_only("  -- why\n /* c */ select a from t"));
        assert!(looks_read_only("WITH x AS (SELECT 1) SELECT * FROM x"));
        assert!(!looks_read_only("DELETE FROM t"));
        assert!(!looks_read_only("/* SELECT */ UPDATE t SET a = 1"));
        assert!(!looks_read_only(""));
    }
}
