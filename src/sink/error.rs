//! Why a page could not be written ([`SinkError`]), and what each error
//! means for the page, per sink kind: the response's fault (the task fails),
//! refused for good (kept, holding its item or job: `rejected`), or the
//! sink's for now (spooled, written later: `spool`). The classification is
//! documented for users in docs/jobs.md ("Sinks that cannot be written");
//! keep the two in step.

use std::io;
use std::path::PathBuf;

use super::rejected::Scope;
use crate::pg::PgError;

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
    /// [`find`](super::find) found no index for the job in that database.
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
    /// The sink refused the page for good ([`SinkError::for_good`]): not
    /// spooled, kept under `<state_dir>/spool/%rejected/` with its error;
    /// it holds its item (or job) until `spool retry` or a reload.
    #[error(
        "the sink refused this page for good: {cause}; {}",
        match kept {
            Ok(path) => format!(
                "the page is kept in {} with its error, and nothing more of this {} is fetched until `quota-worker spool retry {job}` writes it or a reload changes the job",
                path.display(),
                match scope { Scope::Item => "item", Scope::Job => "job" },
            ),
            Err(why) => format!("not spooled ({why})"),
        }
    )]
    Rejected {
        /// The job.
        job: String,
        /// What the sink said.
        cause: Box<SinkError>,
        /// Where the page is kept, or why it could not be.
        kept: Result<PathBuf, String>,
        /// What it holds.
        scope: Scope,
    },
    /// A page the sink refused for good holds this item (or its job):
    /// nothing is fetched for it.
    #[error(
        "held: the sink refused a page of this {} for good ({error}); it is kept in {} and nothing of this {} is fetched (no units spent) until `quota-worker spool retry {job}` writes it or a reload changes the job",
        match scope { Scope::Item => "item", Scope::Job => "job" },
        file.display(),
        match scope { Scope::Item => "item", Scope::Job => "job" },
    )]
    Held {
        /// The job.
        job: String,
        /// What the kept page holds.
        scope: Scope,
        /// Why it was refused.
        error: String,
        /// The kept page.
        file: PathBuf,
    },
}

impl SinkError {
    /// Whether the fetched response is to blame (the task fails as "bad
    /// response"; retrying would fetch the same thing), rather than the sink.
    #[must_use]
    pub fn is_bad_response(&self) -> bool {
        matches!(self, SinkError::BadRecords { .. } | SinkError::Encode(_))
    }

    /// Whether the page's task must end `failed`: the response is to blame,
    /// or the sink refused the page for good ([`SinkError::Rejected`]), or
    /// such a page holds the item ([`SinkError::Held`]). Any other error is
    /// the sink's for now: the page is spooled, or the run waits.
    #[must_use]
    pub fn fails_the_task(&self) -> bool {
        self.is_bad_response()
            || self.for_good().is_some()
            || matches!(self, SinkError::Rejected { .. } | SinkError::Held { .. })
    }

    /// Whether the sink refuses the page **for good** (retrying it can
    /// never help), and then what that holds; `None` for an error that can
    /// heal (spooled, retried). Per sink kind (docs/jobs.md, "Sinks that
    /// cannot be written"):
    ///
    /// - PostgreSQL, by SQLSTATE class: 21 cardinality, 22 data exception
    ///   (U+0000 in text, a number out of range), 23 integrity constraint,
    ///   27 triggered data change, 2F/39 routine, 44 check option, 54
    ///   program limit (an index row or a `tsvector` too large), P0 a
    ///   PL/pgSQL `RAISE` (an operator's trigger): the page's own data,
    ///   which holds its item; 42 syntax or access rule (a column dropped or
    ///   of another type, a permission revoked), 0A feature not supported,
    ///   and a table whose columns differ: the table, which holds the job.
    ///   Everything else heals: 08 connection, 53 resources (too many
    ///   connections, disk full), 57 operator intervention (shutdown), 40
    ///   transaction rollback (serialization failure, deadlock), 55 object
    ///   state (a lock not available), 58 system (I/O), 28 a login refused
    ///   (the password file is read again), XX internal, no answer.
    /// - SQLite, by primary result code: CONSTRAINT, MISMATCH, TOOBIG,
    ///   ERROR (SQL: a table changed by hand), CORRUPT, NOTADB, AUTH hold
    ///   the item; BUSY, LOCKED, FULL, IOERR, CANTOPEN, READONLY, PERM,
    ///   NOMEM, PROTOCOL, SCHEMA heal.
    /// - Files (JSON lines, and where SQLite files go): a file name too long
    ///   (`ENAMETOOLONG`) and a symbolic link where the file goes (`ELOOP`)
    ///   hold the item; every other OS error (`ENOSPC`, `EDQUOT`, `EROFS`,
    ///   `EACCES`, `EIO`, a directory in the way) heals: an operator's fix
    ///   (a mode, a mount, a directory moved away) or a freed byte writes
    ///   the spooled pages with no command (Part 2; issue 22's "an item
    ///   whose file cannot be written for now").
    #[must_use]
    pub fn for_good(&self) -> Option<Scope> {
        match self {
            SinkError::NeverWritable { .. } | SinkError::Symlink { .. } => Some(Scope::Item),
            SinkError::Sqlite { source, .. } => sqlite_for_good(source),
            SinkError::Postgres(e) => match &**e {
                PgError::Schema { .. } => Some(Scope::Job),
                PgError::Query {
                    code: Some(code), ..
                } => sqlstate_for_good(code.code()),
                _ => None,
            },
            _ => None,
        }
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
    pub(crate) fn classified(self) -> Self {
        match self {
            SinkError::Io { path, source } if source.kind() == io::ErrorKind::InvalidFilename => {
                SinkError::NeverWritable { path, source }
            }
            SinkError::Io { path, source } if source.raw_os_error() == Some(libc::ELOOP) => {
                SinkError::Symlink { path }
            }
            SinkError::Sqlite { path, source } if is_symlink_refusal(&source) => {
                SinkError::Symlink { path }
            }
            other => other,
        }
    }
}

/// [`SinkError::for_good`] for a PostgreSQL SQLSTATE.
fn sqlstate_for_good(code: &str) -> Option<Scope> {
    match code.get(..2)? {
        "21" | "22" | "23" | "27" | "2F" | "39" | "44" | "54" | "P0" => Some(Scope::Item),
        "42" | "0A" => Some(Scope::Job),
        _ => None,
    }
}

/// [`SinkError::for_good`] for a SQLite error.
fn sqlite_for_good(e: &rusqlite::Error) -> Option<Scope> {
    use rusqlite::ffi;
    let rusqlite::Error::SqliteFailure(f, _) = e else {
        return None;
    };
    match f.extended_code & 0xff {
        ffi::SQLITE_CONSTRAINT
        | ffi::SQLITE_MISMATCH
        | ffi::SQLITE_TOOBIG
        | ffi::SQLITE_ERROR
        | ffi::SQLITE_CORRUPT
        | ffi::SQLITE_NOTADB
        | ffi::SQLITE_AUTH => Some(Scope::Item),
        _ => None,
    }
}

/// Whether SQLite refused to open a database because its path is a
/// symbolic link (`SQLITE_OPEN_NOFOLLOW`).
fn is_symlink_refusal(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.extended_code == rusqlite::ffi::SQLITE_CANTOPEN_SYMLINK)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37: which errors are refused for good, per sink kind, and
    /// what they hold; the rest heal (spooled).
    #[test]
    fn errors_refused_for_good_by_sink_kind() {
        for (code, want) in [
            ("22P05", Some(Scope::Item)),
            ("22003", Some(Scope::Item)),
            ("23505", Some(Scope::Item)),
            ("23514", Some(Scope::Item)),
            ("54000", Some(Scope::Item)),
            ("P0001", Some(Scope::Item)),
            ("42804", Some(Scope::Job)),
            ("42501", Some(Scope::Job)),
            ("42P01", Some(Scope::Job)),
            ("0A000", Some(Scope::Job)),
            ("08006", None),
            ("53300", None),
            ("53100", None),
            ("57P01", None),
            ("40001", None),
            ("40P01", None),
            ("55P03", None),
            ("58030", None),
            ("28P01", None),
            ("XX000", None),
        ] {
            assert_eq!(sqlstate_for_good(code), want, "{code}");
        }
        let sqlite = |code: i32| SinkError::Sqlite {
            path: "x.db".into(),
            source: rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None),
        };
        use rusqlite::ffi;
        for code in [
            ffi::SQLITE_CONSTRAINT,
            ffi::SQLITE_CONSTRAINT_TRIGGER,
            ffi::SQLITE_MISMATCH,
            ffi::SQLITE_TOOBIG,
            ffi::SQLITE_ERROR,
            ffi::SQLITE_CORRUPT,
            ffi::SQLITE_NOTADB,
        ] {
            assert_eq!(sqlite(code).for_good(), Some(Scope::Item), "{code}");
        }
        for code in [
            ffi::SQLITE_BUSY,
            ffi::SQLITE_LOCKED,
            ffi::SQLITE_FULL,
            ffi::SQLITE_IOERR,
            ffi::SQLITE_IOERR_WRITE,
            ffi::SQLITE_CANTOPEN,
            ffi::SQLITE_READONLY,
            ffi::SQLITE_PERM,
        ] {
            assert_eq!(sqlite(code).for_good(), None, "{code}");
        }
        let io = |e: io::Error| {
            SinkError::Io {
                path: "x.jsonl".into(),
                source: e,
            }
            .classified()
        };
        assert_eq!(
            io(io::Error::from(io::ErrorKind::InvalidFilename)).for_good(),
            Some(Scope::Item)
        );
        assert_eq!(
            io(io::Error::from_raw_os_error(libc::ELOOP)).for_good(),
            Some(Scope::Item)
        );
        for errno in [
            libc::ENOSPC,
            libc::EDQUOT,
            libc::EROFS,
            libc::EACCES,
            libc::EPERM,
            libc::EIO,
            libc::EISDIR,
            libc::ENOTDIR,
        ] {
            assert_eq!(
                io(io::Error::from_raw_os_error(errno)).for_good(),
                None,
                "{errno}"
            );
        }
    }
}
