//! Says which jobs this daemon has loaded, and that it is alive
//! (`queue::known`): at start, after every reload, every [`known::BEAT`];
//! and at a clean stop, that it is gone. Other daemons give back the tasks
//! of jobs they do not know while this one has them; `trigger` reads it to
//! say whether a daemon needs a reload.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::conn::Conn;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::Config;
use crate::keys::KeySpace;
use crate::queue::known::{self, Loaded};

/// How often the known-jobs hash is swept of jobs no daemon has had for
/// [`known::KEEP`]: a sweep reads the whole hash.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// This daemon's name in the live-daemons hash: unique per process start.
pub(super) fn daemon_id(host: &str) -> String {
    format!(
        "{host}:{}:{}",
        std::process::id(),
        &crate::quota::request_id()[..6]
    )
}

/// Announces until `stop`, then withdraws.
pub(super) async fn run(
    mut conn: Conn,
    keys: KeySpace,
    id: String,
    host: String,
    mut config: watch::Receiver<Arc<Config>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut loaded: Option<Loaded> = None;
    let mut pruned: Option<Instant> = None;
    let mut failing = false;
    loop {
        let current = config.borrow_and_update().clone();
        // `loaded_at` says when this config was loaded, not when it was
        // last announced.
        let fresh = match &loaded {
            Some(l) if l.fingerprint == current.fingerprint && l.jobs == current.jobs.len() => {
                l.clone()
            }
            _ => Loaded::of(&current, &host, chrono::Utc::now().timestamp_millis()),
        };
        let prune = pruned.is_none_or(|t| t.elapsed() >= PRUNE_EVERY);
        match known::announce(&mut conn, &keys, &id, &current, &fresh, prune).await {
            Ok(_) => {
                if failing {
                    info!("this daemon's jobs are announced again");
                }
                failing = false;
                if prune {
                    pruned = Some(Instant::now());
                }
            }
            Err(e) if !failing => {
                failing = true;
                warn!(error = %e, "cannot announce this daemon's jobs: other daemons fail tasks of jobs only this one has once unknown_job_grace passes");
            }
            Err(_) => {}
        }
        loaded = Some(fresh);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = config.changed() => if r.is_err() { break },
            _ = tokio::time::sleep(known::BEAT) => {}
        }
    }
    let gone = known::withdraw(&mut conn, &keys, &id);
    // Bounded: a Redis that is gone must not hold the shutdown.
    let _ = tokio::time::timeout(Duration::from_secs(2), gone).await;
}
