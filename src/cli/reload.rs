//! `quota-worker reload --pid PID`: reloads a running daemon's config and
//! waits until it has, for systemd's `ExecReload=` (and for a script).
//!
//! The config on disk is loaded first, as by every command (`main.rs`): an
//! invalid one is refused here, with every error, before any signal is
//! sent (exit 78). Then SIGHUP goes to PID, and this waits for the daemon's
//! record of that reload (`daemon::reload::Record`, under its state
//! directory): exit 0 when it applied the config (settings that need a
//! restart named on stderr), 78 when it refused it (its errors on stderr),
//! 69 when PID is no process this user may signal, 75 when no answer came
//! in time (the daemon's log says what happened).

use std::time::{Duration, Instant};

use super::{Exit, outln};
use crate::config::{Config, fmt_duration};
use crate::daemon::reload::{Record, record_path};

/// How often the record is looked at.
const POLL: Duration = Duration::from_millis(100);

fn read_record(path: &std::path::Path) -> Option<Record> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Runs the command: reload daemon `pid`, waiting at most `timeout`.
pub async fn run(config: &Config, pid: u32, timeout: Duration) -> Exit {
    let path = record_path(&config.state_dir, pid);
    let before = read_record(&path).map_or(0, |r| r.seq);
    let Ok(target) = i32::try_from(pid) else {
        eprintln!("error: {pid} is not a process id");
        return Exit::Usage;
    };
    // SAFETY: kill(2) with a plain pid and signal; no memory is involved.
    if unsafe { libc::kill(target, libc::SIGHUP) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!("error: cannot signal process {pid}: {e}");
        return Exit::Unavailable;
    }
    let deadline = Instant::now() + timeout;
    let record = loop {
        if let Some(r) = read_record(&path).filter(|r| r.seq > before) {
            break r;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "error: process {pid} did not say within {} whether it reloaded (it writes {} when it has): see its log",
                fmt_duration(timeout),
                path.display()
            );
            return Exit::TempFail;
        }
        tokio::time::sleep(POLL).await;
    };
    report(pid, &record)
}

/// Prints what the reload came to, and its exit code.
fn report(pid: u32, r: &Record) -> Exit {
    if !r.applied() {
        for e in &r.errors {
            eprintln!("error: {e}");
        }
        eprintln!(
            "process {pid} refused the configuration ({} error(s)); it runs on with the one it had",
            r.errors.len()
        );
        return Exit::Config;
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    outln!(
        "process {pid} reloaded its configuration (fingerprint {}): jobs added: {}; removed: {}; changed: {}",
        r.fingerprint,
        list(&r.added),
        list(&r.removed),
        list(&r.changed)
    );
    for what in &r.needs_restart {
        eprintln!("warning: {what} changed: it needs a restart, and was not applied");
    }
    Exit::Ok
}
