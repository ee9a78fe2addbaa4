//! Connections to PostgreSQL, for the postgres sink, `fan_out_from`'s
//! postgres source and `search`: the password read from its file when a
//! pool is made, TLS through rustls, pools of deadpool-postgres, and errors
//! that say what to do and never hold the password.
//!
//! The password is read when a [`Pools`] entry is made (at the first page,
//! or at start's check) and kept in that pool's driver config only; a login
//! refused (`28P01`, `28000`) drops the pool, so the next attempt reads the
//! file again (a rotated password takes without a restart). Every error
//! built here passes through [`describe`], which names the server by its
//! URL (which holds no password: see [`crate::config::PgTarget`]) and
//! replaces the password, should a server ever echo it, with `***`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::error::SqlState;

use crate::config::{PasswordFrom, PgTarget, PgTlsMode};

/// How long a task waits for a pooled connection before its page is
/// spooled.
const POOL_WAIT: Duration = Duration::from_secs(30);
/// How long checking a pooled connection may take.
const RECYCLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest password file read.
const MAX_PASSWORD_FILE: u64 = 64 * 1024;

/// What went wrong with a PostgreSQL server, and so what to do.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The password file cannot be read: fix the file.
    #[error("postgres {target}: cannot read the password: {why}")]
    Password {
        /// The server's URL.
        target: String,
        /// Which file, and what the OS said.
        why: String,
    },
    /// `sslrootcert` cannot be read or holds no certificate: fix the file.
    #[error("postgres {target}: sslrootcert: {why}")]
    Tls {
        /// The server's URL.
        target: String,
        /// What is wrong.
        why: String,
    },
    /// The server cannot be reached now (down, restarting, network): try
    /// again later.
    #[error("postgres {target}: {why}")]
    Unreachable {
        /// The server's URL.
        target: String,
        /// What the driver said.
        why: String,
    },
    /// The server refuses the login (password, `pg_hba.conf`, no such
    /// database or role): fix the config or the server.
    #[error("postgres {target}: {why}")]
    Refused {
        /// The server's URL.
        target: String,
        /// What the server said.
        why: String,
    },
    /// A statement failed (permission, constraint, syntax, ...).
    #[error("postgres {target}: {why}")]
    Query {
        /// The server's URL.
        target: String,
        /// What the server said.
        why: String,
        /// Its SQLSTATE, when the server sent one.
        code: Option<SqlState>,
    },
    /// The table is not one this sink can write: other columns or types.
    #[error("postgres {target}: table {table} {why}")]
    Schema {
        /// The server's URL.
        target: String,
        /// The table, as configured.
        table: String,
        /// What differs.
        why: String,
    },
    /// No answer in time.
    #[error("postgres {target}: no answer within {}s ({what})", after.as_secs())]
    Timeout {
        /// The server's URL.
        target: String,
        /// What was waited for.
        what: &'static str,
        /// How long.
        after: Duration,
    },
}

impl PgError {
    /// Whether the server may simply be down: the caller waits and tries
    /// again (a sink spools, `check` warns), rather than calling it a
    /// config error.
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        matches!(self, PgError::Unreachable { .. } | PgError::Timeout { .. })
    }

    /// What happened, without naming the server (for a line that names it
    /// already).
    pub fn detail(&self) -> String {
        match self {
            PgError::Password { why, .. }
            | PgError::Tls { why, .. }
            | PgError::Unreachable { why, .. }
            | PgError::Refused { why, .. }
            | PgError::Query { why, .. } => why.clone(),
            PgError::Schema { table, why, .. } => format!("table {table} {why}"),
            PgError::Timeout { what, after, .. } => {
                format!("no answer within {}s ({what})", after.as_secs())
            }
        }
    }

    /// The SQLSTATE of a failed statement.
    pub fn code(&self) -> Option<&SqlState> {
        match self {
            PgError::Query { code, .. } => code.as_ref(),
            _ => None,
        }
    }

    /// A failed statement's error, from the driver's.
    pub(crate) fn query(target: &PgTarget, e: &tokio_postgres::Error) -> Self {
        if e.as_db_error().is_none() && (e.is_closed() || has_io_cause(e)) {
            // The connection died under the statement: the server went away.
            return PgError::Unreachable {
                target: target.url.clone(),
                why: describe(e, None),
            };
        }
        PgError::Query {
            target: target.url.clone(),
            why: describe(e, None),
            code: e.code().cloned(),
        }
    }

    /// The timeout error for `what` after `after`.
    pub(crate) fn timeout(target: &PgTarget, what: &'static str, after: Duration) -> Self {
        PgError::Timeout {
            target: target.url.clone(),
            what,
            after,
        }
    }
}

fn has_io_cause(e: &tokio_postgres::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.is::<std::io::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A driver error as one line: the server's severity, message, SQLSTATE,
/// detail and hint, or the driver's message and its causes. `password`,
/// should it appear (no server is known to echo one), becomes `***`.
pub(crate) fn describe(e: &tokio_postgres::Error, password: Option<&str>) -> String {
    let mut s = match e.as_db_error() {
        Some(db) => {
            let mut s = format!(
                "{}: {} (SQLSTATE {})",
                db.severity(),
                db.message(),
                db.code().code()
            );
            if let Some(d) = db.detail() {
                s.push_str("; ");
                s.push_str(d);
            }
            if let Some(h) = db.hint() {
                s.push_str("; hint: ");
                s.push_str(h);
            }
            s
        }
        None => {
            let mut s = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                s.push_str(": ");
                s.push_str(&c.to_string());
                cause = c.source();
            }
            s
        }
    };
    if let Some(p) = password.filter(|p| !p.is_empty()) {
        s = s.replace(p, "***");
    }
    s
}

/// One pool per server (URL and password source), shared by every job that
/// writes there.
#[derive(Default)]
pub struct Pools {
    /// Locked only to look a pool up or add one, never across an `.await`.
    pools: Mutex<HashMap<String, Pool>>,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools").finish_non_exhaustive()
    }
}

/// The pool map's key for `target`.
fn pool_key(target: &PgTarget) -> String {
    format!("{}\0{:?}", target.url, target.password)
}

impl Pools {
    /// A connection to `target` from its pool (made, with the password
    /// read, on first use; at most `size` connections).
    pub async fn get(
        &self,
        target: &PgTarget,
        size: usize,
    ) -> Result<deadpool_postgres::Object, PgError> {
        let key = pool_key(target);
        let found = self
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        let pool = match found {
            Some(p) => p,
            None => {
                let made = pool(target, size).await?;
                let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
                pools.entry(key.clone()).or_insert(made).clone()
            }
        };
        match pool.get().await {
            Ok(conn) => Ok(conn),
            Err(e) => {
                let e = pool_error(target, e);
                if matches!(e, PgError::Refused { .. }) {
                    // Read the password again next time: it may have changed.
                    self.pools
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&key);
                }
                Err(e)
            }
        }
    }
}

/// One connection to `target`, for a command or a source read: a pool of
/// one, dropped with the connection.
pub async fn connect(target: &PgTarget) -> Result<deadpool_postgres::Object, PgError> {
    let pool = pool(target, 1).await?;
    pool.get().await.map_err(|e| pool_error(target, e))
}

/// A pool for `target`, its password read now.
async fn pool(target: &PgTarget, size: usize) -> Result<Pool, PgError> {
    let mut conn = target.conn.clone();
    if let Some(p) = password(target).await? {
        conn.password(p);
    }
    let manager = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match target.tls.mode {
        PgTlsMode::Disable => Manager::from_config(conn.clone(), tokio_postgres::NoTls, manager),
        _ => Manager::from_config(conn.clone(), tls(target)?, manager),
    };
    // Connecting may take the URL's connect_timeout per host, and the
    // login a little more.
    let connect = conn.get_connect_timeout().copied().unwrap_or_default() + Duration::from_secs(5);
    Pool::builder(manager)
        .max_size(size.max(1))
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(connect))
        .recycle_timeout(Some(RECYCLE_TIMEOUT))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| PgError::Unreachable {
            target: target.url.clone(),
            why: e.to_string(),
        })
}

/// What a pool's `get` failure means.
fn pool_error(target: &PgTarget, e: PoolError) -> PgError {
    let url = target.url.clone();
    match e {
        PoolError::Backend(e) => {
            let password = target
                .conn
                .get_password()
                .and_then(|p| std::str::from_utf8(p).ok());
            let why = describe(&e, password);
            if login_refused(&e) {
                PgError::Refused { target: url, why }
            } else {
                PgError::Unreachable { target: url, why }
            }
        }
        PoolError::Timeout(_) => PgError::Timeout {
            target: url,
            what: "a connection",
            after: POOL_WAIT,
        },
        other => PgError::Unreachable {
            target: url,
            why: other.to_string(),
        },
    }
}

/// Whether a failed connection attempt is the server (or its certificate)
/// saying no, which waiting will not change: a refused login, an unknown
/// database or role, a certificate that does not check, a password the
/// server asks for and the config does not give. A network error, a
/// timeout, a server starting up or out of connection slots: not refused.
fn login_refused(e: &tokio_postgres::Error) -> bool {
    if let Some(code) = e.code() {
        return [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
            SqlState::UNDEFINED_OBJECT,
        ]
        .contains(code);
    }
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            // rustls reports a certificate it rejects as InvalidData.
            return io.kind() == std::io::ErrorKind::InvalidData;
        }
        cause = c.source();
    }
    // Not the network: the driver's own "authentication error" (a password
    // the server wants and the config lacks), or a TLS refusal.
    !e.is_closed()
}

/// The password for `target`, from its file; `None` when it has none (or
/// libpq's password file has no line for it).
async fn password(target: &PgTarget) -> Result<Option<String>, PgError> {
    let from = target.password.clone();
    let (host, port, db, user) = login(target);
    let url = target.url.clone();
    let read = tokio::task::spawn_blocking(move || match from {
        PasswordFrom::None => Ok(None),
        PasswordFrom::File { path, .. } => {
            let text = read_small(&path)?;
            let p = text.trim_end_matches(['\n', '\r']);
            if p.is_empty() {
                Err(format!("password_file {} is empty", path.display()))
            } else {
                Ok(Some(p.to_owned()))
            }
        }
        PasswordFrom::PassFile(path) => {
            let text = read_small(&path)?;
            Ok(pgpass_lookup(&text, &host, &port, &db, &user))
        }
    })
    .await;
    match read {
        Ok(Ok(p)) => Ok(p),
        Ok(Err(why)) => Err(PgError::Password { target: url, why }),
        Err(e) => Err(PgError::Password {
            target: url,
            why: e.to_string(),
        }),
    }
}

/// Reads a password file (a regular file, at most 64 KiB).
fn read_small(path: &Path) -> Result<String, String> {
    crate::config::read_bounded(path, MAX_PASSWORD_FILE, "a password file")
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The host, port, database and user a pgpass line must match.
fn login(target: &PgTarget) -> (String, String, String, String) {
    let c = &target.conn;
    let host = match c.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        // libpq matches the default socket directory as "localhost".
        _ => "localhost".to_owned(),
    };
    let port = c.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = c.get_user().unwrap_or_default().to_owned();
    let db = c.get_dbname().map_or_else(|| user.clone(), str::to_owned);
    (host, port, db, user)
}

/// The password of the first line of a libpq password file
/// (`host:port:database:user:password`, `*` matching anything, `\:` and
/// `\\` escaped) that matches.
fn pgpass_lookup(text: &str, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    let wanted = [host, port, db, user];
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let fields = split_pgpass(line);
            if fields.len() < 5 {
                return None;
            }
            let matches = wanted.iter().zip(&fields).all(|(w, f)| f == "*" || f == w);
            matches.then(|| fields[4].clone())
        })
}

/// One pgpass line's fields, `\` escapes undone.
fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    fields.last_mut().expect("one field").push(n);
                }
            }
            // The password is the rest of the line, colons included.
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

/// The TLS connector for `target`: `sslrootcert`'s CAs, else Mozilla's;
/// the host name checked unless `verify-ca`.
fn tls(target: &PgTarget) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgError> {
    let bad = |why: String| PgError::Tls {
        target: target.url.clone(),
        why,
    };
    let mut roots = RootCertStore::empty();
    match &target.tls.root_cert {
        Some(path) => {
            let pem = read_small(path).map_err(bad)?;
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| bad(format!("{}: {e}", path.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("{}: {e}", path.display())))?;
            }
            if roots.is_empty() {
                return Err(bad(format!("{} holds no PEM certificate", path.display())));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let roots = Arc::new(roots);
    let config = if target.tls.mode == PgTlsMode::VerifyCa {
        let verifier = rustls::client::WebPkiServerVerifier::builder(roots)
            .build()
            .map_err(|e| bad(e.to_string()))?;
        rustls::ClientConfig::builder()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyName(verifier)))
            .with_no_client_auth()
    } else {
        rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth()
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// `sslmode=verify-ca`: the certificate must chain to a trusted CA and be
/// valid now, for any host name (libpq's meaning).
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// An identifier, quoted for SQL.
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A string literal for SQL (standard_conforming_strings, on since 9.1).
pub(crate) fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_lines_match_like_libpq() {
        let file = "# comment\n\
                    db.example:5432:*:other:nope\n\
                    127.0.0.1:5433:ingest:ingest:first\\:colon\n\
                    *:*:*:ingest:fallback:with:colons\n";
        assert_eq!(
            pgpass_lookup(file, "127.0.0.1", "5433", "ingest", "ingest").as_deref(),
            Some("first:colon")
        );
        assert_eq!(
            pgpass_lookup(file, "10.0.0.1", "5432", "x", "ingest").as_deref(),
            Some("fallback:with:colons")
        );
        assert_eq!(pgpass_lookup(file, "h", "1", "d", "nobody"), None);
        assert_eq!(split_pgpass(r"a\\b:c"), ["a\\b", "c"]);
    }

    #[test]
    fn quoting() {
        assert_eq!(ident(r#"a"b"#), r#""a""b""#);
        assert_eq!(literal("it's"), "'it''s'");
    }
}
