//! Readiness: `/readyz`, from Redis's answers and how fresh the daemon
//! loops' beats are ([`crate::liveness`]; the systemd watchdog,
//! [`super::notify`], reads them too).

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;

use super::OpsState;
use crate::config::UnsafeEviction;
use crate::eviction::{self, Eviction};
use crate::liveness::{STALE_AFTER, fresh};
use crate::quota::{ProbeError, QuotaConn};
use tracing::warn;

/// How long each readiness read may wait for Redis: the probe, then the
/// eviction policy, so `/readyz` answers within a second (SPEC Part 4).
const PROBE_TIMEOUT: Duration = Duration::from_millis(450);

/// `/readyz`: 200 when Redis answers (and may not evict keys, unless
/// `unsafe_eviction = "warn"`), the quota windows' Redis Cluster answers
/// too (with `[redis] quota_nodes`), and the scheduler and worker run, else
/// 503 naming what is wrong.
pub(super) async fn readyz(State(s): State<OpsState>) -> impl IntoResponse {
    let (problems, warnings) = readiness(&s).await;
    if problems.is_empty() {
        (StatusCode::OK, format!("ready\n{warnings}"))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", problems.join(", ")),
        )
    }
}

/// What keeps the daemon from being ready (none: ready), and warning lines
/// for what is let through: `/readyz`'s answer, and `qw_ready` in
/// `/metrics` (so an alerting rule sees what a probe sees).
pub(super) async fn readiness(s: &OpsState) -> (Vec<String>, String) {
    let mut problems = Vec::new();
    let mut warnings = String::new();
    // Both Redis at once: a probe waits at most about 2 s however many fail.
    let (queue, quota) = tokio::join!(queue_problems(s), quota_problems(s));
    for (problem, warning) in [queue, quota] {
        problems.extend(problem);
        warnings.push_str(&warning.unwrap_or_default());
    }
    if !fresh(&s.health.scheduler, STALE_AFTER) {
        problems.push("scheduler not running".to_owned());
    }
    if s.health.worker.load(Ordering::Relaxed) == 0 {
        problems.push("worker not running".to_owned());
    }
    (problems, warnings)
}

/// What is wrong with the queue's Redis (which holds the windows too
/// without `quota_nodes`), and a warning line for a policy let through.
async fn queue_problems(s: &OpsState) -> (Option<String>, Option<String>) {
    let mut conn = s.queue.connection();
    // Not a PING: a demoted master answers that. A connection being made
    // again (no master since a failover) answers at once.
    match conn.probe(PROBE_TIMEOUT).await {
        Ok(()) => {}
        Err(e @ crate::conn::NotReady::Replica { .. }) => {
            return (Some(format!("redis: {e}")), None);
        }
        Err(e) => return (Some(format!("redis unreachable: {e}")), None),
    }
    // Read every time: a CONFIG SET after start changes the answer.
    let eviction = eviction::check(&mut conn, PROBE_TIMEOUT).await;
    policy_problem(s, eviction, "")
}

/// What is wrong with the quota windows' Redis Cluster, when they have one
/// (`[redis] quota_nodes`): no answer within [`PROBE_TIMEOUT`], a master
/// that says the cluster is down, or one that may evict keys. Named
/// "quota" and by host:port only: the nodes' URLs may hold a password.
async fn quota_problems(s: &OpsState) -> (Option<String>, Option<String>) {
    let limiter = s.live().limiter;
    let conn = limiter.connection();
    if let QuotaConn::Standalone(_) = conn {
        // The queue's Redis: its probe is the quota's.
        return (None, None);
    }
    if let Err(e) = conn.probe(PROBE_TIMEOUT).await {
        warn!(error = %e, "readiness: the quota windows' Redis Cluster does not answer");
        return (
            Some(format!(
                "quota windows' Redis Cluster: {}",
                probe_reason(&e)
            )),
            None,
        );
    }
    let eviction = conn.eviction(PROBE_TIMEOUT).await;
    policy_problem(s, eviction, "quota windows' Redis Cluster: ")
}

/// The probe's reason, short: the kind of failure and the node, never a
/// URL (the client's own error text is logged, not served).
fn probe_reason(e: &ProbeError) -> String {
    match e {
        ProbeError::Timeout(t) => format!("no answer within {t:?}"),
        ProbeError::Unreachable(_) => "unreachable".to_owned(),
        ProbeError::ClusterDown { .. } => e.to_string(),
    }
}

/// A Redis that may evict keys: a problem, or with `unsafe_eviction =
/// "warn"` a warning line; `at` says which Redis.
fn policy_problem(s: &OpsState, eviction: Eviction, at: &str) -> (Option<String>, Option<String>) {
    let Eviction::Unsafe(policy) = eviction else {
        return (None, None);
    };
    let reason = format!("{at}{}", Eviction::unsafe_reason(&policy));
    match s.unsafe_eviction {
        UnsafeEviction::Refuse => (Some(reason), None),
        UnsafeEviction::Warn => (
            None,
            Some(format!("warning (unsafe_eviction = \"warn\"): {reason}\n")),
        ),
    }
}
