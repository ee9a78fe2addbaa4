//! Reloading the config on SIGHUP (`systemctl reload`), without a restart.
//!
//! A reload reads the config file and the job files again, as `run` read
//! them at start, with the same checks (every error with file, line and
//! field; the secrets; the sink directories; the postgres sink tables). A
//! valid config replaces the old one for every tick and task that starts
//! after it: the scheduler reads its jobs from it (new jobs fire, removed
//! ones stop), each new task takes the worker in force when it starts
//! (windows, costs, requests, sinks), the status page and metrics list it.
//! Tasks in flight keep the worker they began with for their job (its
//! request, pagination and sink), and spend and send with the newest
//! worker's windows, costs and secrets from their next page
//! (`Worker::publish`, SPEC Part 4 "Reload and tasks in flight").
//! An invalid one is refused: logged at ERROR, counted
//! (`qw_config_reloads_total{result="refused"}`), the running config kept.
//!
//! Settings this process cannot change while it runs (`RESTART_ONLY`:
//! where Redis is and what its keys are called, the metrics address, the
//! state directory, the worker pool's size and timers, the log format) are
//! named in a WARN line, "needs a restart", and kept as they are.
//!
//! systemd hears about it through the notify protocol: `RELOADING=1` with
//! `MONOTONIC_USEC` at the start, `READY=1` at the end, whatever the
//! result. `quota-worker reload --pid PID` (the unit's `ExecReload=`)
//! sends the signal and waits for the daemon's [`Record`] of it, written to
//! `<state_dir>/reload/<pid>.json`: so `systemctl reload` returns once the
//! reload is done, and fails when it was refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::config::{Config, Job, fmt_duration};
use crate::ops::{self, Notifier};
use crate::worker::Worker;

/// What a reload replaces, sent to whoever reads it: the scheduler and the
/// announcement (the config), the supervisor (the worker each new task
/// takes), the HTTP endpoints (config and limiter).
pub(super) struct Senders {
    pub(super) config: watch::Sender<Arc<Config>>,
    pub(super) worker: watch::Sender<Arc<Worker>>,
    pub(super) ops: watch::Sender<ops::Live>,
}

/// What one reload came to, as the daemon writes it for `quota-worker
/// reload` (and an operator) to read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Reloads this process has done, this one included (1 = the first).
    pub seq: u64,
    /// `"applied"` or `"refused"`.
    pub result: String,
    /// Why it was refused: each error, with file, line and field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Settings that changed and were not applied: they need a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs_restart: Vec<String>,
    /// Jobs the reload added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    /// Jobs it removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Jobs it changed (any field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
    /// The fingerprint of the files in force after it.
    pub fingerprint: String,
}

impl Record {
    /// Whether the new config was applied.
    pub fn applied(&self) -> bool {
        self.result == "applied"
    }
}

/// Where the daemon with `pid` writes what its last reload came to.
pub fn record_path(state_dir: &Path, pid: u32) -> PathBuf {
    state_dir.join("reload").join(format!("{pid}.json"))
}

/// Reloads once per request (a SIGHUP: `requests` counts them) until
/// `stop`. Holds the senders to the end: the loops that read them take a
/// closed channel for a stop.
pub(super) async fn run(
    senders: Senders,
    notifier: Notifier,
    requests: Option<watch::Receiver<u64>>,
    mut stop: watch::Receiver<bool>,
) {
    let Some(mut requests) = requests else {
        let _ = stop.wait_for(|s| *s).await;
        return;
    };
    let state_dir = senders.config.borrow().state_dir.clone();
    let mut seq = 0;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = requests.changed() => if r.is_err() { break },
        }
        requests.borrow_and_update();
        seq += 1;
        notifier.reloading();
        let (record, asked) = reload(&senders, seq).await;
        write_record(&state_dir, &record);
        // `state_dir` changed in the files (it needs a restart): a
        // `reload` that read them looks there.
        if let Some(dir) = asked.filter(|d| *d != state_dir) {
            write_record(&dir, &record);
        }
        notifier.ready();
    }
    let _ = std::fs::remove_file(record_path(&state_dir, std::process::id()));
}

/// One reload: read, check, apply (or refuse), and say so; with the state
/// directory the new files ask for, when they could be read.
async fn reload(senders: &Senders, seq: u64) -> (Record, Option<PathBuf>) {
    let old = senders.config.borrow().clone();
    let worker = senders.worker.borrow().clone();
    info!(config = %old.path.display(), "reloading the configuration (SIGHUP)");
    let (new, secrets) = match read(&old.path).await {
        Ok(read) => read,
        Err(errors) => return (refused(seq, errors, &old), None),
    };
    let asked = Some(new.state_dir.clone());
    let (new, needs_restart) = keep_restart_only(&old, new);
    for what in &needs_restart {
        warn!(setting = %what, "configuration reload: this setting needs a restart; it is not applied");
    }
    let needs_restart: Vec<String> = needs_restart.iter().map(ToString::to_string).collect();
    let new = Arc::new(new);
    let next = match worker.reloaded(new.clone(), secrets) {
        Ok(w) => Arc::new(w),
        Err(e) => {
            let errors = vec![format!("cannot build the HTTP client: {e}")];
            return (refused(seq, errors, &old), asked);
        }
    };
    let (added, removed, changed) = job_changes(&old, &new);
    // The worker first: a tick the scheduler fires under the new config
    // finds workers that know its job (one that does not would give the
    // task back, not lose it). Tasks in flight take its windows, costs and
    // secrets at their next page.
    next.publish();
    senders.worker.send_replace(next.clone());
    senders.ops.send_replace(ops::Live {
        config: new.clone(),
        limiter: next.limiter.clone(),
    });
    ops::zero_counters(&new);
    senders.config.send_replace(new.clone());
    metrics::counter!("qw_config_reloads_total", "result" => "applied").increment(1);
    info!(
        jobs = new.jobs.len(),
        added = %added.join(","),
        removed = %removed.join(","),
        changed = %changed.join(","),
        needs_restart = needs_restart.len(),
        "configuration reloaded: ticks and tasks that start from now on use it; tasks in flight spend and send with its windows, costs and secrets from their next page, and keep their job's request, pagination and sink"
    );
    let record = Record {
        seq,
        result: "applied".into(),
        needs_restart,
        added,
        removed,
        changed,
        fingerprint: new.fingerprint.clone(),
        ..Record::default()
    };
    (record, asked)
}

/// A refused reload: each error logged at ERROR, counted, and its record
/// (the config in force stays `old`).
fn refused(seq: u64, errors: Vec<String>, old: &Config) -> Record {
    for e in &errors {
        error!(error = %e, "configuration reload refused");
    }
    error!(
        errors = errors.len(),
        "configuration reload refused: the running configuration is kept"
    );
    metrics::counter!("qw_config_reloads_total", "result" => "refused").increment(1);
    Record {
        seq,
        result: "refused".into(),
        errors,
        fingerprint: old.fingerprint.clone(),
        ..Record::default()
    }
}

/// Reads and checks the files as `run` does at start: the config and jobs,
/// the secrets, the sink directories, the postgres sink tables (made where
/// missing). `Err`: every error, as logged (file, line, field).
async fn read(path: &Path) -> Result<(Config, crate::config::Secrets), Vec<String>> {
    let strings = |e: crate::config::ConfigErrors| -> Vec<String> {
        e.0.iter().map(ToString::to_string).collect()
    };
    let path = path.to_owned();
    // The files are read off the runtime's threads: a slow disk or a
    // `fan_out_from` source on a network mount must not stall the workers.
    let loaded = tokio::task::spawn_blocking(move || {
        let config = Config::load(&path)?;
        let secrets = config.secrets()?;
        crate::sink::check_dirs(&config)?;
        Ok::<_, crate::config::ConfigErrors>((config, secrets))
    })
    .await
    .map_err(|e| vec![format!("the reload's reader stopped: {e}")])?;
    let (config, secrets) = loaded.map_err(strings)?;
    let tables = crate::sink::check_tables(&config, true)
        .await
        .map_err(strings)?;
    crate::sink::log_tables(&tables);
    Ok((config, secrets))
}

/// A setting a running daemon cannot change: each holds a connection, a
/// listening socket, a running pool or an installed subscriber.
struct RestartOnly {
    /// As the config writes it.
    name: &'static str,
    /// Puts `old`'s value into `new`; whether they differed.
    keep: fn(old: &Config, new: &mut Config) -> bool,
    /// The value kept, as the log and the record show it; `None` where
    /// showing it says nothing or could show a secret (a URL's password).
    shown: Option<fn(&Config) -> String>,
}

/// Every restart-only setting, in the order a reload names them: every
/// field of `[redis]` and `[metrics]`, and some of `[worker]` (a field
/// added to one of them stops the unit test `every_setting_is_placed`
/// compiling until it is placed, here or as live).
const RESTART_ONLY: [RestartOnly; 16] = [
    RestartOnly::new("[redis] url", |o, n| put(&o.redis.url, &mut n.redis.url)),
    RestartOnly::new("[redis] key_prefix", |o, n| {
        put(&o.redis.key_prefix, &mut n.redis.key_prefix)
    }),
    RestartOnly::new("[redis] timeout", |o, n| {
        put(&o.redis.timeout, &mut n.redis.timeout)
    }),
    RestartOnly::new("[redis] unsafe_eviction", |o, n| {
        put(&o.redis.unsafe_eviction, &mut n.redis.unsafe_eviction)
    }),
    RestartOnly::new("[redis] quota_nodes", |o, n| {
        put(&o.redis.quota_nodes, &mut n.redis.quota_nodes)
    }),
    RestartOnly::new("[redis] quota_replicas", |o, n| {
        put(&o.redis.quota_replicas, &mut n.redis.quota_replicas)
    }),
    RestartOnly::new("[redis] sentinels", |o, n| {
        put(&o.redis.sentinels, &mut n.redis.sentinels)
    }),
    RestartOnly::new("[redis] master_name", |o, n| {
        put(&o.redis.master_name, &mut n.redis.master_name)
    }),
    RestartOnly::new("[redis] queue_replicas", |o, n| {
        put(&o.redis.queue_replicas, &mut n.redis.queue_replicas)
    })
    .shown(|c| c.redis.queue_replicas.to_string()),
    RestartOnly::new("[metrics] listen", |o, n| {
        put(&o.metrics.listen, &mut n.metrics.listen)
    }),
    RestartOnly::new("state_dir", |o, n| put(&o.state_dir, &mut n.state_dir)),
    RestartOnly::new("[worker] concurrency", |o, n| {
        put(&o.worker.concurrency, &mut n.worker.concurrency)
    })
    .shown(|c| c.worker.concurrency.to_string()),
    RestartOnly::new("[worker] poll_interval", |o, n| {
        put(&o.worker.poll_interval, &mut n.worker.poll_interval)
    }),
    RestartOnly::new("[worker] recover_after", |o, n| {
        put(&o.worker.recover_after, &mut n.worker.recover_after)
    }),
    RestartOnly::new("[worker] shutdown_timeout", |o, n| {
        put(&o.worker.shutdown_timeout, &mut n.worker.shutdown_timeout)
    })
    .shown(|c| fmt_duration(c.worker.shutdown_timeout)),
    RestartOnly::new("[log] format", |o, n| put(&o.log_format, &mut n.log_format)),
];

impl RestartOnly {
    /// `name`, kept by `keep`, its value not shown.
    const fn new(name: &'static str, keep: fn(&Config, &mut Config) -> bool) -> Self {
        RestartOnly {
            name,
            keep,
            shown: None,
        }
    }

    /// Shows the value kept with `show`.
    const fn shown(self, show: fn(&Config) -> String) -> Self {
        RestartOnly {
            shown: Some(show),
            ..self
        }
    }
}

/// Sets `new` to `old`; whether it was different.
fn put<T: PartialEq + Clone>(old: &T, new: &mut T) -> bool {
    let differs = old != new;
    *new = old.clone();
    differs
}

/// A restart-only setting that changed in the files and was not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NotApplied {
    name: &'static str,
    /// The value in force, where it is shown.
    still: Option<String>,
}

impl std::fmt::Display for NotApplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.still {
            Some(v) => write!(f, "{} (still {v})", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// `new` with every restart-only setting as `old` has it, and the
/// settings that differed (with the value kept, where it is shown).
fn keep_restart_only(old: &Config, mut new: Config) -> (Config, Vec<NotApplied>) {
    let kept = (RESTART_ONLY.iter())
        .filter(|s| (s.keep)(old, &mut new))
        .map(|s| NotApplied {
            name: s.name,
            still: s.shown.map(|show| show(old)),
        })
        .collect();
    (new, kept)
}

/// Jobs added, removed and changed (any field, its file's text included)
/// from `old` to `new`, by name.
fn job_changes(old: &Config, new: &Config) -> (Vec<String>, Vec<String>, Vec<String>) {
    let added = (new.jobs.keys())
        .filter(|n| !old.jobs.contains_key(*n))
        .cloned()
        .collect();
    let removed = (old.jobs.keys())
        .filter(|n| !new.jobs.contains_key(*n))
        .cloned()
        .collect();
    let changed = (new.jobs.values())
        .filter(|j| old.jobs.get(&j.name).is_some_and(|o| !same_job(o, j)))
        .map(|j| j.name.clone())
        .collect();
    (added, removed, changed)
}

/// Whether two versions of a job read alike: compared by how they print
/// (their types hold compiled templates and schedules, which do not compare).
fn same_job(a: &Job, b: &Job) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// Writes `record` where `quota-worker reload` looks for it, atomically (a
/// temporary file renamed into place). A failure is logged: the reload
/// itself happened.
fn write_record(state_dir: &Path, record: &Record) {
    let path = record_path(state_dir, std::process::id());
    let write = || -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(state_dir);
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{}.tmp", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(record).unwrap_or_default())?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        warn!(path = %path.display(), error = %e, "cannot write what the reload came to: `quota-worker reload` will not see it (the journal has it)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` loaded as the config file `c.toml` of `dir` (both versions of
    /// a config live in one directory, as on a host).
    fn config(dir: &Path, text: &str) -> Config {
        let path = dir.join("c.toml");
        std::fs::write(&path, text).expect("write");
        let env = |_: &str| None;
        Config::load_with_env(&path, &env).expect("valid")
    }

    const BASE: &str = "[redis]\nurl = \"redis://127.0.0.1:1/0\"\n[worker]\nconcurrency = 4\n";

    #[test]
    fn restart_only_settings_are_named_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = config(dir.path(), BASE);
        let new = config(
            dir.path(),
            "[redis]\nurl = \"redis://127.0.0.1:2/0\"\nkey_prefix = \"other\"\n[worker]\nconcurrency = 9\nunknown_job_grace = \"1h\"\n[metrics]\nlisten = \"127.0.0.1:9999\"\n",
        );
        let (kept, named) = keep_restart_only(&old, new);
        assert_eq!(
            named.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "[redis] url",
                "[redis] key_prefix",
                "[metrics] listen",
                "[worker] concurrency (still 4)"
            ]
        );
        assert_eq!(kept.redis.url, old.redis.url);
        assert_eq!(kept.redis.key_prefix, "qw");
        assert_eq!(kept.worker.concurrency.get(), 4);
        assert_eq!(kept.metrics.listen, old.metrics.listen);
        // A live setting is applied.
        assert_eq!(kept.worker.unknown_job_grace.as_secs(), 3600);
        // Nothing else changed: nothing named.
        assert!(
            keep_restart_only(&old, config(dir.path(), BASE))
                .1
                .is_empty()
        );
    }

    /// Every restart-only setting changed at once: each is named once, in
    /// the list's order, and each keeps its old value (an entry that
    /// compared one field and kept another would show here).
    #[test]
    fn every_restart_only_setting_is_named_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = config(dir.path(), BASE);
        let new = config(
            dir.path(),
            "state_dir = \"elsewhere\"\n\
             [redis]\nurl = \"redis://:pw@/1\"\nkey_prefix = \"other\"\ntimeout = \"3s\"\n\
             unsafe_eviction = \"warn\"\nquota_nodes = [\"redis://127.0.0.1:7000\"]\nquota_replicas = 1\n\
             sentinels = [\"redis://127.0.0.1:26379\"]\nmaster_name = \"mymaster\"\nqueue_replicas = 1\n\
             [metrics]\nlisten = \"127.0.0.1:9999\"\n\
             [worker]\nconcurrency = 9\npoll_interval = \"7s\"\nrecover_after = \"5m\"\nshutdown_timeout = \"2m\"\n\
             [log]\nformat = \"json\"\n",
        );
        let (kept, named) = keep_restart_only(&old, new);
        let names: Vec<&str> = named.iter().map(|n| n.name).collect();
        let all: Vec<&str> = RESTART_ONLY.iter().map(|s| s.name).collect();
        assert_eq!(names, all);
        assert!(
            named
                .iter()
                .any(|n| n.to_string() == "[worker] shutdown_timeout (still 30s)")
        );
        assert_eq!(format!("{:?}", kept.redis), format!("{:?}", old.redis));
        assert_eq!(kept.metrics.listen, old.metrics.listen);
        assert_eq!(kept.state_dir, old.state_dir);
        assert_eq!(format!("{:?}", kept.worker), format!("{:?}", old.worker));
        assert_eq!(kept.log_format, old.log_format);
    }

    /// Every field of the sections a reload cannot apply is in
    /// [`RESTART_ONLY`], and `[worker]`'s fields are each placed: a new
    /// field does not compile here until it is (no `..` below).
    #[test]
    fn every_setting_is_placed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = config(dir.path(), BASE);
        let crate::config::RedisConfig {
            url: _,
            key_prefix: _,
            timeout: _,
            unsafe_eviction: _,
            quota_nodes: _,
            quota_replicas: _,
            sentinels: _,
            master_name: _,
            queue_replicas: _,
        } = c.redis;
        let crate::config::MetricsConfig { listen: _ } = c.metrics;
        let crate::config::WorkerConfig {
            concurrency: _,
            shutdown_timeout: _,
            recover_after: _,
            poll_interval: _,
            // Live: read by `check` and by each task.
            fan_out_warn: _,
            unknown_job_grace: _,
        } = c.worker;
        let sections = |prefix: &str| {
            RESTART_ONLY
                .iter()
                .filter(|s| s.name.starts_with(prefix))
                .count()
        };
        assert_eq!(sections("[redis] "), 9);
        assert_eq!(sections("[metrics] "), 1);
        assert_eq!(sections("[worker] "), 4);
    }
}
