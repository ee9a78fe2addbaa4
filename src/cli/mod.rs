//! The commands, one file each. `main.rs` parses arguments and dispatches
//! here; each command prints its own output and returns its exit code.

pub mod check;
pub mod demo;
pub mod generate;
pub mod keys;
pub mod quota;
pub mod reload;
pub mod run;
pub mod search;
pub mod settle;
pub mod spend;
pub mod spool;
pub mod state;
pub mod tenant;
pub mod trigger;
pub mod unblock;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use crate::config::{self, Config};
use crate::conn::Master;
use crate::quota::{Limiter, QuotaTarget, Quotas};

/// Prints `args` on standard output, as `print!` does, except that a
/// reader that went away (`quota-worker check | head`) is not an error:
/// `print!` panics on the closed pipe (issue 37). The rest of the output is
/// dropped, and the command ends with its own exit code, as `keys` and
/// `completions` do.
pub(crate) fn write_out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    static GONE: AtomicBool = AtomicBool::new(false);
    if GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(args) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => GONE.store(true, Ordering::Relaxed),
        Err(e) => {
            GONE.store(true, Ordering::Relaxed);
            eprintln!("error: cannot write to stdout: {e}");
        }
    }
}

/// `print!` through [`write_out`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::cli::write_out(format_args!($($arg)*)) };
}

/// `println!` through [`write_out`].
macro_rules! outln {
    () => { $crate::cli::write_out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::write_out(format_args!("{}\n", format_args!($($arg)*))) };
}

pub(crate) use {out, outln};

/// Exit codes, from sysexits.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Success.
    Ok = 0,
    /// Something the command did failed for good (`trigger --wait`: a task
    /// ended `failed`); not a sysexits code, as none says "it ran, and failed".
    Failed = 1,
    /// EX_USAGE: bad command line (or a cost that can never fit).
    Usage = 64,
    /// EX_DATAERR: input data is wrong (`trigger`: a `fan_out_from` source
    /// that cannot be read, or has more rows than `max_items`).
    DataErr = 65,
    /// EX_UNAVAILABLE: Redis (or another service) unreachable.
    Unavailable = 69,
    /// EX_SOFTWARE: an internal error.
    Software = 70,
    /// EX_IOERR: a local file could not be read (`search`'s databases).
    IoErr = 74,
    /// EX_TEMPFAIL: try again later (a spend was rejected).
    TempFail = 75,
    /// EX_CONFIG: the configuration is invalid.
    Config = 78,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// The config path: `-c`, else `$QUOTA_WORKER_CONFIG` (clap reads it), else
/// `config/quota-worker.toml`.
pub fn config_path(arg: Option<PathBuf>) -> PathBuf {
    arg.unwrap_or_else(|| PathBuf::from(config::DEFAULT_CONFIG))
}

/// Loads the config, printing every error and returning exit 78 on failure.
pub fn load(path: &Path) -> Result<Config, Exit> {
    Config::load(path).map_err(|errors| {
        for e in &errors.0 {
            eprintln!("error: {e}");
        }
        let n = errors.0.len();
        eprintln!(
            "{}: {n} error{} in the configuration; nothing was run",
            path.display(),
            if n == 1 { "" } else { "s" }
        );
        Exit::Config
    })
}

/// `check` and `run`: every sink directory is created and tested before
/// anything runs; one that cannot be written, or a path that cannot exist
/// for a static `fan_out` value, is a config error (exit 78) naming the
/// job's `sink.path` and why.
pub(crate) fn check_sinks(config: &Config) -> Result<(), Exit> {
    crate::sink::check_dirs(config).map_err(|errors| {
        for e in &errors.0 {
            eprintln!("error: {e}");
        }
        eprintln!(
            "{}: sinks that cannot be written; nothing was run",
            config.path.display()
        );
        Exit::Config
    })
}

/// `check` (`create = false`: looks only) and `run` at start (`create`:
/// creates and migrates): every postgres sink's table. A table of other
/// columns, a password that cannot be read, a login refused are config
/// errors (exit 78) naming the job's `sink.url` and what differs; a server
/// that does not answer now is not (its pages are spooled until it does).
pub(crate) async fn check_tables(
    config: &Config,
    create: bool,
) -> Result<Vec<(String, crate::sink::TableState)>, Exit> {
    crate::sink::check_tables(config, create)
        .await
        .map_err(|errors| {
            for e in &errors.0 {
                eprintln!("error: {e}");
            }
            eprintln!(
                "{}: postgres sink tables cannot be written; nothing was run",
                config.path.display()
            );
            Exit::Config
        })
}

/// Where the Redis master is: the configured URL's host or what the
/// sentinels name, or the embedded Redis's socket in the state directory.
pub(crate) fn redis_master(config: &Config) -> Master {
    Master::of(&config.redis).unwrap_or_else(|| {
        Master::Url(config::RedisUrl::new(format!(
            "unix://{}",
            crate::embedded::socket_path(&config.state_dir).display()
        )))
    })
}

/// Where the windows live: the cluster of `[redis] quota_nodes`, else the
/// Redis of [`redis_master`].
pub(crate) fn quota_target(config: &Config) -> QuotaTarget {
    QuotaTarget::of(config, redis_master(config))
}

/// A limiter for `quotas` where the windows live. It connects on first use,
/// so an unreachable Redis meets the endpoint's `limiter_unavailable` policy.
pub(crate) fn limiter(config: &Config, quotas: Arc<Quotas>) -> Result<Limiter, Exit> {
    let target = quota_target(config);
    match target.connect_lazy(config.redis.timeout, 1) {
        Ok(conn) => Ok(Limiter::new(conn, quotas, config.redis.timeout)
            .with_replicas(config.redis.quota_replicas)),
        Err(e) => {
            eprintln!("error: bad Redis URL {target}: {e}");
            Err(Exit::Config)
        }
    }
}

/// Prints the error of a limiter call that reached Redis and picks its exit
/// code, like [`quota_error`], after one more question when Redis seemed
/// broken or unavailable: a Redis that needs a password cuts an
/// unauthenticated client's first long request (the spend script) with a
/// protocol error before it could answer NOAUTH, which would read as a
/// script failure (exit 70). A PING on a new connection asks what the call
/// could not. Only on this failure path: a working call pays nothing for
/// it. (Refused credentials that kept the connection from reaching the
/// master come back as such from the limiter itself, not as a timeout:
/// `QuotaConn::timed_out`.)
pub(crate) async fn limiter_failure(config: &Config, e: &crate::quota::QuotaError) -> Exit {
    use crate::quota::QuotaError as Q;
    let ask = match e {
        Q::Unavailable(re) => !crate::acl::is_auth_failure(re),
        Q::Script(_) => true,
        _ => false,
    };
    let refused = match quota_target(config) {
        QuotaTarget::Standalone(master) if ask => {
            match crate::conn::connect(&master, config.redis.timeout, "cli").await {
                Ok(mut c) => redis::cmd("PING").query_async::<()>(&mut c).await.err(),
                Err(e) => Some(e),
            }
        }
        _ => None,
    };
    if let Some(refused) = refused
        && crate::acl::is_auth_failure(&refused)
    {
        eprintln!(
            "error: {}",
            crate::acl::refused_credentials(&quota_target(config), &refused)
        );
        return Exit::Config;
    }
    quota_error(config, e)
}

/// Prints a limiter error and picks its exit code.
pub(crate) fn quota_error(config: &Config, e: &crate::quota::QuotaError) -> Exit {
    use crate::quota::QuotaError as Q;
    // Refused credentials are not an outage: waiting will not fix them.
    if let Q::Unavailable(re) = e
        && crate::acl::is_auth_failure(re)
    {
        eprintln!(
            "error: {}",
            crate::acl::refused_credentials(&quota_target(config), re)
        );
        return Exit::Config;
    }
    if e.is_unavailable() {
        eprintln!("error: Redis at {}: {e}", quota_target(config));
        if config.redis.embedded() && config.redis.quota_nodes.is_empty() {
            eprintln!(
                "hint: [redis] url is not set, so this uses the embedded Redis of a running `quota-worker run`; start the daemon or set {}",
                config::REDIS_URL_ENV
            );
        }
    } else if let Q::UnknownEndpoint(_) = e {
        let known: Vec<&str> = config.endpoints.keys().map(String::as_str).collect();
        let known = if known.is_empty() {
            "(none configured)".to_owned()
        } else {
            known.join(", ")
        };
        eprintln!("error: {e}; known endpoints: {known}");
    } else {
        eprintln!("error: {e}");
    }
    match e {
        Q::UnknownEndpoint(_)
        | Q::UnknownCredential(_)
        | Q::TemplateNeedsTenant(..)
        | Q::UnknownWindow { .. }
        | Q::CostTooLarge { .. } => Exit::Usage,
        Q::Timeout(_) | Q::Unavailable(_) | Q::NotReplicated { .. } => Exit::Unavailable,
        Q::Script(_) => Exit::Software,
    }
}

/// Who runs this: the login name of the real user id (and, under sudo,
/// who called sudo), for the log lines of commands that change state an
/// operator should be able to trace (`unblock`, `state reset`).
pub(crate) fn operator() -> String {
    let name = user_name(unsafe { libc::getuid() });
    match std::env::var("SUDO_USER") {
        Ok(by) if !by.is_empty() => format!("{name} (sudo by {by})"),
        _ => name,
    }
}

/// The login name of `uid` from the password database, else the number.
fn user_name(uid: libc::uid_t) -> String {
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 4096];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to memory owned here, `buf` outlives the
    // read of `pw_name`, which getpwuid_r points into it.
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return format!("uid {uid}");
    }
    // SAFETY: getpwuid_r succeeded, so pw_name is a NUL-terminated string in `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    name.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_is_named_by_the_password_database() {
        assert_eq!(user_name(0), "root");
        assert_eq!(user_name(4_000_000_000), "uid 4000000000");
    }
}
