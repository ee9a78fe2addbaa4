//! A private PostgreSQL server on 127.0.0.1 for one test (or one group of
//! tests): `initdb` into a temporary directory, `postgres` started as a
//! child of the test on a free loopback port (retried on another port when
//! the first was taken) and stopped by its pid on `Drop`; its log printed
//! when it fails to start. It can be stopped (a fast shutdown, as `pg_ctl
//! stop -m fast` sends) and restarted on the same port with the same data.
//!
//! The binaries: `$PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`
//! (Debian's `postgresql` package, which `scripts/deps` installs), else
//! `initdb` on `PATH`. PostgreSQL refuses to run as root: when the tests run
//! as root (CI), `initdb` and `postgres` run as `nobody` (uid and gid set
//! on the child, supplementary groups dropped, by `std::process`), and the
//! temporary directory is handed to that user. Nothing else on the machine
//! is touched: no cluster of the package, no `/var/run/postgresql`, no port
//! 5432 (the socket goes in the temporary directory).
//!
//! The superuser `postgres` logs in without a password over the Unix socket
//! (the admin helpers use it); TCP logins need a password (SCRAM), so a
//! test's sink proves its `password_file` is read. [`Postgres::role`] makes
//! a login role with a password and a database it owns.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis_server::free_port;

/// The superuser `initdb` makes.
pub const SUPERUSER: &str = "postgres";

/// A private PostgreSQL server on 127.0.0.1.
pub struct Postgres {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// `nobody`'s uid and gid when the tests run as root.
    user: Option<(u32, u32)>,
    /// Extra `-c name=value` settings.
    settings: Vec<(String, String)>,
}

/// Where the server binaries are (see the module's doc).
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).unwrap_or_default()
}

/// The uid and gid to run the server as: `nobody`'s when we are root.
fn unprivileged() -> Option<(u32, u32)> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("nobody").expect("no NUL");
    // SAFETY: a valid NUL-terminated name; the result is read at once,
    // before any other getpw* call on this thread.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "the tests run as root and there is no user `nobody` to run PostgreSQL as"
    );
    // SAFETY: not null, checked above.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Some((uid, gid))
}

fn chown(path: &Path, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
    }
}

impl Postgres {
    /// Starts a server with `fsync` off (test data need not survive a
    /// power loss, and a loaded machine's disk is slow).
    pub fn start() -> Self {
        Self::start_with(&[("fsync", "off"), ("synchronous_commit", "off")])
    }

    /// Starts a server with extra settings (`("fsync", "on")`, ...).
    pub fn start_with(settings: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = unprivileged();
        chown(dir.path(), user);
        let mut pg = Postgres {
            child: None,
            port: 0,
            dir,
            bin: bin_dir(),
            user,
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        pg.initdb();
        for _ in 0..5 {
            pg.port = free_port();
            if pg.spawn() {
                return pg;
            }
        }
        panic!("postgres did not start on 5 ports; log:\n{}", pg.log());
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut cmd = Command::new(if path.is_file() {
            path
        } else {
            PathBuf::from(program)
        });
        if let Some((uid, gid)) = self.user {
            // std drops the supplementary groups when root sets a uid.
            cmd.uid(uid).gid(gid);
        }
        // libpq and the server read these; the test's own must not leak in.
        for var in [
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGPASSFILE",
            "PGDATA",
        ] {
            cmd.env_remove(var);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn initdb(&self) {
        let out = self
            .command("initdb")
            .arg("-D")
            .arg(self.data())
            .args(["-U", SUPERUSER, "-E", "UTF8", "--locale=C", "-N"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run initdb from {} ({e}): install PostgreSQL (scripts/deps, apt-get install postgresql) or set PG_BIN",
                    self.bin.display()
                )
            });
        assert!(
            out.status.success(),
            "initdb failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn spawn(&mut self) -> bool {
        let log = std::fs::File::create(self.dir.path().join("postgres.log")).expect("log file");
        chown(&self.dir.path().join("postgres.log"), self.user);
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", "listen_addresses=127.0.0.1"])
            // Small, so that several servers share a 2-core test machine.
            .args(["-c", "shared_buffers=16MB", "-c", "max_connections=60"])
            // No /dev/shm (a container's may be tiny).
            .args(["-c", "dynamic_shared_memory_type=mmap"]);
        for (k, v) in &self.settings {
            cmd.args(["-c", &format!("{k}={v}")]);
        }
        cmd.stdout(Stdio::null())
            .stderr(log.try_clone().expect("log file"));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run postgres from {} ({e})", self.bin.display()));
        self.child = Some(child);
        let mut exited = false;
        let up = super::wait_every(Duration::from_secs(30), Duration::from_millis(50), || {
            exited = (self.child.as_mut()).is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            exited || self.try_query(SUPERUSER, "SELECT 1").is_ok()
        });
        if exited {
            self.child = None;
            return false;
        }
        if !up {
            self.stop();
        }
        up
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://USER@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, user: &str, database: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/{database}", self.port)
    }

    /// The server log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// Stops the server as `pg_ctl stop -m fast` does (SIGINT to its pid:
    /// sessions end, the server writes a checkpoint and exits) and waits.
    pub fn stop(&mut self) {
        self.signal_and_wait(libc::SIGINT, Duration::from_secs(30));
    }

    /// Starts it again, on the same port with the same data.
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.spawn(),
            "postgres did not start again on port {}; log:\n{}",
            self.port,
            self.log()
        );
    }

    fn signal_and_wait(&mut self, sig: i32, patience: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id() as libc::pid_t;
        // SAFETY: our own child, not yet reaped.
        unsafe { libc::kill(pid, sig) };
        if super::wait_until(patience, || matches!(child.try_wait(), Ok(Some(_)))) {
            return;
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Runs `sql` (one or more statements, simple protocol) as the
    /// superuser in `database`: the rows of every statement, values as
    /// text.
    pub fn query(&self, database: &str, sql: &str) -> Vec<Vec<Option<String>>> {
        self.try_query(database, sql)
            .unwrap_or_else(|e| panic!("{sql}: {e}\nlog:\n{}", self.log()))
    }

    /// A count (`SELECT count(*) ...`); 0 when the query fails (a table not
    /// there yet, the server stopped).
    pub fn count(&self, database: &str, sql: &str) -> i64 {
        self.try_query(database, sql)
            .ok()
            .and_then(|rows| rows.into_iter().next())
            .and_then(|r| r.into_iter().next().flatten())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// [`Postgres::query`], or the error.
    pub fn try_query(&self, database: &str, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
        let mut config = tokio_postgres::Config::new();
        config
            .host_path(self.dir.path())
            .port(self.port)
            .user(SUPERUSER)
            .dbname(database)
            .connect_timeout(Duration::from_secs(5));
        let sql = sql.to_owned();
        // Its own runtime on its own thread: the caller may be a sync test
        // or inside a Tokio test's runtime.
        std::thread::scope(|s| {
            s.spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async move {
                    let (client, conn) = config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map_err(|e| e.to_string())?;
                    let driver = tokio::spawn(conn);
                    let messages = client.simple_query(&sql).await.map_err(|e| {
                        e.as_db_error()
                            .map_or_else(|| e.to_string(), |d| d.message().to_owned())
                    });
                    drop(client);
                    let _ = driver.await;
                    let mut rows = Vec::new();
                    for m in messages? {
                        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                            rows.push((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect());
                        }
                    }
                    Ok(rows)
                })
            })
            .join()
            .unwrap_or_else(|_| Err("query thread panicked".into()))
        })
    }

    /// A login role `name` with `password` and a database `name` it owns.
    pub fn role(&self, name: &str, password: &str) {
        let password = password.replace('\'', "''");
        self.query(
            SUPERUSER,
            &format!("CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'"),
        );
        // Not in one call: CREATE DATABASE refuses the implicit transaction.
        self.query(
            SUPERUSER,
            &format!("CREATE DATABASE \"{name}\" OWNER \"{name}\""),
        );
    }
}

/// A CA and a server certificate it signed, for a server with `ssl = on`.
pub struct TlsFiles {
    /// The CA's certificate (PEM): what a client's `sslrootcert` names.
    pub ca: PathBuf,
    /// The server's certificate and key (PEM), readable by the server's
    /// user only.
    pub cert: PathBuf,
    pub key: PathBuf,
    _dir: tempfile::TempDir,
}

impl TlsFiles {
    /// A fresh CA and a server certificate for `names` (a subjectAltName
    /// list: `DNS:db.example,IP:127.0.0.1`), made with the `openssl` CLI.
    pub fn new(names: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = unprivileged();
        chown(dir.path(), user);
        let at = |f: &str| dir.path().join(f);
        let ext = at("ext.cnf");
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={names}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .expect("ext");
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let steps: Vec<Vec<String>> = vec![
            ["req", "-x509"]
                .iter()
                .chain(&ec)
                .map(|s| s.to_string())
                .chain(
                    [
                        "-keyout",
                        "ca.key",
                        "-out",
                        "ca.pem",
                        "-days",
                        "2",
                        "-subj",
                        "/CN=quota-worker test CA",
                    ]
                    .map(String::from),
                )
                .collect(),
            ["req"]
                .iter()
                .chain(&ec)
                .map(|s| s.to_string())
                .chain(
                    [
                        "-keyout",
                        "server.key",
                        "-out",
                        "server.csr",
                        "-subj",
                        "/CN=quota-worker test server",
                    ]
                    .map(String::from),
                )
                .collect(),
            [
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(&args)
                .current_dir(dir.path())
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run openssl ({e}): install it (apt-get install openssl)")
                });
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for f in ["server.pem", "server.key"] {
            chown(&at(f), user);
        }
        std::fs::set_permissions(
            at("server.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod key");
        TlsFiles {
            ca: at("ca.pem"),
            cert: at("server.pem"),
            key: at("server.key"),
            _dir: dir,
        }
    }

    /// The server settings that use them.
    pub fn settings(&self) -> Vec<(String, String)> {
        vec![
            ("ssl".into(), "on".into()),
            ("ssl_cert_file".into(), self.cert.display().to_string()),
            ("ssl_key_file".into(), self.key.display().to_string()),
        ]
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // An immediate shutdown (SIGQUIT): its sessions are told to quit at
        // once, so no backend outlives the test.
        self.signal_and_wait(libc::SIGQUIT, Duration::from_secs(10));
    }
}
