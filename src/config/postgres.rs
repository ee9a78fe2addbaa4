//! A PostgreSQL server as the config names it (a sink's or a
//! `fan_out_from`'s `postgres://` URL, `password_file`): parsed and checked
//! at load; connected to by [`crate::pg`].
//!
//! The URL never holds the password — one written in it (`user:pw@`,
//! `?password=`) is a config error, reported without repeating the URL — so
//! the URL can be shown as written in every log line and error. The
//! password comes from `password_file` (read when a connection is made) or,
//! as libpq does it, from `PGPASSFILE` / `~/.pgpass`.
//!
//! TLS follows the URL's `sslmode`: none or `disable` is plain TCP (or a
//! Unix socket); `prefer` uses TLS when the server offers it; `require`,
//! `verify-ca` and `verify-full` insist on it. Unlike libpq, every TLS mode
//! checks the server's certificate (rustls has no "encrypt but trust
//! anyone"): against `sslrootcert` when given, else the Mozilla roots; the
//! host name too, except with `verify-ca`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use super::Location;

/// How long connecting may take when the URL does not say
/// (`connect_timeout`): an address that drops packets must not hold a page.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The forms a URL error suggests.
const ACCEPTED: &str = "write postgres://USER@HOST[:PORT]/DATABASE[?sslmode=verify-full&sslrootcert=ca.pem]; \
the password goes in password_file (or PGPASSFILE), never in the URL";

/// A PostgreSQL server and how to log in to it.
#[derive(Debug, Clone)]
pub struct PgTarget {
    /// The URL as written: shown in logs and errors (it holds no password).
    pub url: String,
    /// What the driver connects with: host, port, user, database, options,
    /// timeouts; no password (read when connecting) and the TLS mode of
    /// `tls`.
    pub conn: tokio_postgres::Config,
    /// TLS, from `sslmode` and `sslrootcert`.
    pub tls: PgTls,
    /// Where the password comes from.
    pub password: PasswordFrom,
    /// Where `url` is written: errors found when connecting at start point
    /// there.
    pub at: Location,
}

impl fmt::Display for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

impl PartialEq for PgTarget {
    /// Same URL and password source: the same connections serve both.
    fn eq(&self, other: &Self) -> bool {
        self.url == other.url && self.password == other.password
    }
}

impl Eq for PgTarget {}

/// `sslmode`, as far as this product reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgTlsMode {
    /// No TLS (none written, or `disable`).
    Disable,
    /// TLS when the server offers it, checked; plain text when it does not.
    Prefer,
    /// TLS, certificate and host name checked (`require`, `verify-full`).
    VerifyFull,
    /// TLS, certificate checked but not the host name (`verify-ca`).
    VerifyCa,
}

/// TLS for one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    /// The mode.
    pub mode: PgTlsMode,
    /// `sslrootcert`: the CA certificates (PEM) to trust instead of the
    /// Mozilla roots; relative to the config file's directory.
    pub root_cert: Option<PathBuf>,
}

/// Where a PostgreSQL password comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordFrom {
    /// `password_file`: the whole file, a trailing newline dropped.
    File {
        /// `$VARS` expanded, relative to the config file's directory.
        path: PathBuf,
        /// Where the config names it.
        at: Location,
    },
    /// libpq's password file (`PGPASSFILE`, else `~/.pgpass`): the first
    /// line matching host, port, database and user.
    PassFile(PathBuf),
    /// None: the server's `trust`, `peer` or certificate authentication.
    None,
}

/// Parses a `postgres://` URL (relative `sslrootcert` against `dir`). The
/// error never repeats a URL that might hold a password.
pub(super) fn parse_url(
    written: &str,
    dir: &Path,
) -> Result<(tokio_postgres::Config, PgTls), String> {
    let mut url = url::Url::parse(written).map_err(|e| format!("not a URL ({e}); {ACCEPTED}"))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(format!("unknown scheme {:?}; {ACCEPTED}", url.scheme()));
    }
    let inline = "the URL holds a password: put it in password_file (or PGPASSFILE), \
                  which is read when connecting and never shown";
    if url.password().is_some() {
        return Err(inline.to_owned());
    }
    let mut mode = None;
    let mut root_cert = None;
    let mut kept = Vec::new();
    for (k, v) in url.query_pairs() {
        match k.as_ref() {
            "password" => return Err(inline.to_owned()),
            "sslmode" => mode = Some(v.into_owned()),
            "sslrootcert" => root_cert = Some(dir.join(v.as_ref())),
            _ => kept.push((k.into_owned(), v.into_owned())),
        }
    }
    // Only now is the URL known to hold no password: errors may show it.
    let tls_mode = match mode.as_deref() {
        None | Some("disable") => PgTlsMode::Disable,
        Some("prefer") => PgTlsMode::Prefer,
        Some("require" | "verify-full") => PgTlsMode::VerifyFull,
        Some("verify-ca") => PgTlsMode::VerifyCa,
        Some(other) => {
            return Err(format!(
                "invalid postgres URL {written:?}: sslmode {other:?} is not one of \"disable\", \"prefer\", \"require\", \"verify-ca\", \"verify-full\""
            ));
        }
    };
    if root_cert.is_some() && tls_mode == PgTlsMode::Disable {
        return Err(format!(
            "invalid postgres URL {written:?}: sslrootcert needs sslmode=require, verify-ca or verify-full"
        ));
    }
    if kept.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(kept);
    }
    let mut conn = tokio_postgres::Config::from_str(url.as_str())
        .map_err(|e| format!("invalid postgres URL {written:?}: {e}{}", cause(&e)))?;
    if conn.get_hosts().is_empty() {
        return Err(format!(
            "invalid postgres URL {written:?}: it names no host; {ACCEPTED}"
        ));
    }
    if conn.get_user().is_none_or(str::is_empty) {
        return Err(format!(
            "invalid postgres URL {written:?}: it names no user; {ACCEPTED}"
        ));
    }
    conn.ssl_mode(match tls_mode {
        PgTlsMode::Disable => tokio_postgres::config::SslMode::Disable,
        PgTlsMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        PgTlsMode::VerifyFull | PgTlsMode::VerifyCa => tokio_postgres::config::SslMode::Require,
    });
    if conn.get_connect_timeout().is_none() {
        conn.connect_timeout(CONNECT_TIMEOUT);
    }
    if conn.get_application_name().is_none() {
        conn.application_name("quota-worker");
    }
    Ok((
        conn,
        PgTls {
            mode: tls_mode,
            root_cert,
        },
    ))
}

/// ": what the driver said" for a parse error's cause.
fn cause(e: &tokio_postgres::Error) -> String {
    std::error::Error::source(e)
        .map(|c| format!(": {c}"))
        .unwrap_or_default()
}

/// A table name as written in `table`: `name` or `schema.name`, each part
/// a plain SQL identifier (letters, digits, `_`, `$`; not starting with a
/// digit) of at most 63 bytes. Returns the parts.
pub(super) fn parse_table(written: &str) -> Result<Vec<String>, String> {
    let parts: Vec<&str> = written.split('.').collect();
    let ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 63
            && p.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$'))
    };
    if parts.len() > 2 || !parts.iter().all(|p| ok(p)) {
        return Err(format!(
            "bad table name {written:?}: write name or schema.name, each a plain SQL identifier (letters, digits, '_'; at most 63 bytes)"
        ));
    }
    Ok(parts.into_iter().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(u: &str) -> Result<(tokio_postgres::Config, PgTls), String> {
        parse_url(u, Path::new("/etc/qw"))
    }

    #[test]
    fn reads_host_port_user_database_and_tls() {
        let (c, tls) = parse("postgres://ingest@127.0.0.1:5433/db").unwrap();
        assert_eq!(c.get_user(), Some("ingest"));
        assert_eq!(c.get_dbname(), Some("db"));
        assert_eq!(c.get_ports(), [5433]);
        assert_eq!(c.get_password(), None);
        assert_eq!(c.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(tls.mode, PgTlsMode::Disable);
        let (c, tls) = parse(
            "postgresql://u@db.example/x?sslmode=verify-full&sslrootcert=ca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(tls.mode, PgTlsMode::VerifyFull);
        assert_eq!(tls.root_cert.as_deref(), Some(Path::new("/etc/qw/ca.pem")));
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(c.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
        assert_eq!(
            parse("postgres://u@h/x?sslmode=require").unwrap().1.mode,
            PgTlsMode::VerifyFull
        );
        assert_eq!(
            parse("postgres://u@h/x?sslmode=verify-ca").unwrap().1.mode,
            PgTlsMode::VerifyCa
        );
        assert_eq!(
            parse("postgres://u@h/x?sslmode=prefer").unwrap().1.mode,
            PgTlsMode::Prefer
        );
    }

    #[test]
    fn a_password_in_the_url_is_refused_and_never_repeated() {
        for u in [
            "postgres://ingest:hunter2-secret@127.0.0.1/db",
            "postgres://ingest@127.0.0.1/db?password=hunter2-secret",
            "postgres://ingest@127.0.0.1/db?sslmode=bogus&password=hunter2-secret",
        ] {
            let e = parse(u).unwrap_err();
            assert!(e.contains("password_file"), "{e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        // Not even a URL that fails to parse is repeated.
        let e = parse("postgres://ingest:hunter2@[::1/db").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn bad_urls_say_what_to_write() {
        for (u, want) in [
            ("mysql://u@h/db", "unknown scheme"),
            ("postgres:///db", "no host"),
            ("postgres://h/db", "no user"),
            ("postgres://u@h/db?sslmode=allow", "sslmode \"allow\""),
            ("postgres://u@h/db?sslrootcert=ca.pem", "sslrootcert needs"),
            ("postgres://u@h/db?bogus=1", "bogus"),
        ] {
            let e = parse(u).unwrap_err();
            assert!(e.contains(want), "{u}: {e}");
        }
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        assert_eq!(parse_table("trending").unwrap(), ["trending"]);
        assert_eq!(
            parse_table("ingest.gh_issues").unwrap(),
            ["ingest", "gh_issues"]
        );
        for bad in [
            "",
            "a.b.c",
            "1x",
            "a-b",
            "a b",
            "a;drop",
            "x\"y",
            &"a".repeat(64),
        ] {
            assert!(parse_table(bad).is_err(), "{bad}");
        }
    }
}
