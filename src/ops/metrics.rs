//! Prometheus metrics: the process's recorder, what each metric means, and
//! the gauges read from Redis at scrape time (window usage, queue depth), so
//! every daemon reports the same shared numbers. Counters are recorded where
//! things happen (spends in [`crate::quota`], outcomes in [`crate::worker`],
//! upstream answers in [`crate::fetch`]).

use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::{OpsState, bounded, peek_all};
use crate::config::Config;
use crate::outcome::OutcomeKind;
use crate::stats::Stats;

/// Spend latency buckets, seconds: a local Redis answers in well under 1 ms.
const SPEND_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
];

/// How long gauges read from Redis are served again before the next read:
/// scrapes within it, however many at once, cost Redis nothing (each read
/// runs one script per credential; 820 scrapes/s took ~80% of a Redis).
pub(crate) const GAUGES_FRESH_FOR: Duration = Duration::from_secs(1);

/// When this daemon's gauges were last read from Redis. Held while one
/// scrape reads them, so scrapes arriving meanwhile wait for that read and
/// serve its result instead of each starting their own (a single flight).
#[derive(Debug, Default)]
pub(crate) struct GaugeReads(tokio::sync::Mutex<Option<tokio::time::Instant>>);

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use. `None` if
/// another recorder was installed first (then metrics are not exported).
pub(crate) fn recorder() -> Option<&'static PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("qw_spend_duration_seconds".into()),
                    &SPEND_BUCKETS,
                )
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            describe();
            Some(handle)
        })
        .as_ref()
}

/// `# HELP` lines: what each metric means (docs/metrics.md). Over 80
/// lines on purpose: one `describe_*!` per metric, a flat list.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "qw_spends_total",
        "Spends by credential, endpoint and result (allowed, rejected, unchecked = fail-open without Redis, error)"
    );
    describe_counter!(
        "qw_config_reloads_total",
        "Config reloads (SIGHUP, systemctl reload) by result: applied, or refused (the running config kept)"
    );
    describe_counter!(
        "qw_credential_commands_total",
        "Runs of a credential's secret_command by credential and result: minted (a new token), or failed (the tasks that needed it failed)"
    );
    describe_counter!(
        "qw_redis_reconnects_total",
        "Connections to the Redis master this daemon dropped and made again, by reason: lost (closed or failed), timeout, readonly (a write reached a replica), masterdown, loading, demoted (the server says it is a replica)"
    );
    describe_counter!(
        "qw_tasks_given_back_total",
        "Tasks of a job this daemon does not have, given back for a daemon that has it (rolling deploys, reloads)"
    );
    describe_counter!(
        "qw_drift_units_total",
        "Units recorded as drift: the upstream reported fewer left than a mirrored window would admit"
    );
    describe_counter!(
        "qw_units_spent_total",
        "Units admitted by this daemon's spends, at the endpoint's configured cost"
    );
    describe_counter!(
        "qw_units_settled_total",
        "Units by which this daemon's settles changed its spends: change=\"refund\" taken back (a 304 settled to not_modified_cost, a reported cost below the spend, a request that never left), change=\"raise\" added; charged = spent - refund + raise"
    );
    describe_histogram!(
        "qw_spend_duration_seconds",
        "Time of one spend (one Redis round trip), seconds"
    );
    describe_gauge!(
        "qw_window_used_units",
        "Units used in the window now, read from Redis at scrape time (the same on every daemon)"
    );
    describe_gauge!(
        "qw_window_remaining_units",
        "Units left in the window now, read from Redis at scrape time"
    );
    describe_gauge!("qw_window_limit_units", "The window's configured units");
    describe_gauge!(
        "qw_window_frees_in_seconds",
        "Seconds until the oldest spend leaves the window (sliding), it resets (fixed), its next unit drains (bucket) or its earliest lease expires (concurrent)"
    );
    describe_gauge!(
        "qw_window_leases",
        "Leases a concurrent window holds now: requests in flight across every daemon (its qw_window_used_units: their units), read from Redis at scrape time"
    );
    describe_gauge!(
        "qw_credential_tenants",
        "Tenants of a template credential with keys in Redis, up to the 50 whose windows are exported"
    );
    describe_gauge!(
        "qw_credential_blocked_seconds",
        "Seconds a resource of the credential stays blocked after the upstream said wait (0 = not blocked)"
    );
    describe_counter!(
        "qw_tasks_total",
        "Task outcomes of this daemon by job: done, quota_exhausted, upstream_throttled, retrying, failed, superseded"
    );
    describe_counter!("qw_pages_total", "Pages fetched (2xx) by job");
    describe_counter!("qw_records_total", "Records written to sinks by job");
    describe_counter!(
        "qw_records_altered_total",
        "Records stored otherwise than the upstream sent them, by job and reason: invalid_utf8 (bytes invalid in the body's charset, stored as U+FFFD), lone_surrogate (a lone \\uD800-\\uDFFF escape, U+FFFD), duplicate_key (an object key sent twice: the last value kept), nul (U+0000 in a PostgreSQL sink, U+FFFD), numeric_range (a number outside PostgreSQL's numeric, a string there)"
    );
    describe_counter!(
        "qw_fan_out_errors_total",
        "Ticks by job whose fan_out_from source could not be read (nothing fanned out) or had rows refused"
    );
    describe_counter!(
        "qw_upstream_responses_total",
        "Upstream answers by endpoint and HTTP status (or unreached, timeout, unsent)"
    );
    describe_gauge!(
        "qw_queue_tasks",
        "Tasks in the shared queue by state (backlog, queued, in_flight), read from Redis at scrape time"
    );
    describe_gauge!("qw_tasks_in_flight", "Tasks this daemon is running now");
    describe_gauge!(
        "qw_window_drift_units",
        "Units recorded as drift still counted in the window (the upstream reported fewer left than it would admit), read from Redis at scrape time"
    );
    describe_gauge!(
        "qw_ready",
        "1 if /readyz answers 200 now (Redis answers and may not evict keys, the scheduler and the worker run); 0 if not"
    );
    describe_gauge!(
        "qw_redis_up",
        "1 if this scrape read the windows and the queue from Redis; 0 if not (those gauges then hold their last values)"
    );
}

/// Every job's `qw_tasks_total` series at 0, one per outcome, before the
/// first task ends: a counter that appears with its first event at 1 shows
/// no `increase()`, so an alert on the first failed task after a start
/// would never fire (contrib/prometheus/alerts.yml).
pub(crate) fn zero_counters(config: &Config) {
    for result in ["applied", "refused"] {
        metrics::counter!("qw_config_reloads_total", "result" => result).increment(0);
    }
    for reason in crate::conn::Reason::ALL {
        metrics::counter!("qw_redis_reconnects_total", "reason" => reason.as_str()).increment(0);
    }
    // A failing command's first failure after a start is one to alert on.
    for cred in config.credentials.values().filter(|c| c.minted()) {
        for result in ["minted", "failed"] {
            metrics::counter!("qw_credential_commands_total", "credential" => cred.name.clone(), "result" => result)
                .increment(0);
        }
    }
    for job in config.jobs.keys() {
        for kind in OutcomeKind::ALL {
            metrics::counter!("qw_tasks_total", "qw_job" => job.clone(), "outcome" => kind.as_str())
                .increment(0);
        }
    }
}

pub(super) async fn metrics(State(s): State<OpsState>) -> impl IntoResponse {
    let Some(handle) = recorder() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder unavailable\n".to_owned(),
        );
    };
    {
        let mut last = s.gauge_reads.0.lock().await;
        if last.is_none_or(|t| t.elapsed() >= GAUGES_FRESH_FOR) {
            refresh_gauges(&s).await;
            *last = Some(tokio::time::Instant::now());
        }
    }
    // This daemon's own count: no Redis read, always current.
    metrics::gauge!("qw_tasks_in_flight").set(Stats::get(&s.stats.in_flight) as f64);
    (StatusCode::OK, handle.render())
}

/// Shared numbers, read from Redis now (at most once per
/// [`GAUGES_FRESH_FOR`]: see `metrics`). When Redis cannot answer in time the
/// gauges keep their last values and `qw_redis_up` says 0.
async fn refresh_gauges(s: &OpsState) {
    let depth = bounded("metrics: the queue depth", s.queue.depth());
    let limiter = s.live().limiter;
    let (usages, depth, (problems, _)) =
        tokio::join!(peek_all(&limiter), depth, super::health::readiness(s));
    metrics::gauge!("qw_ready").set(if problems.is_empty() { 1.0 } else { 0.0 });
    let mut up = depth.is_some();
    for (name, usage) in usages {
        let Some(u) = usage else {
            up = false;
            continue;
        };
        // A template's tenant: `credential` is the template, `tenant` its
        // placeholder and value as its keys spell them (`account=123`).
        let (credential, tenant) = match crate::config::parse_tenant(&name) {
            Some((c, _, _)) => (
                c.to_owned(),
                name.get(c.len() + 1..name.len() - 1).map(str::to_owned),
            ),
            None => (name.clone(), None),
        };
        let mut labels = vec![("credential", credential)];
        labels.extend(tenant.map(|t| ("tenant", t)));
        // Each resource's block (GitHub's `core`, `search`, ...; one
        // resource: `default` or `core`).
        for b in &u.blocks {
            let mut labels = labels.clone();
            labels.push(("resource", b.resource.clone()));
            metrics::gauge!("qw_credential_blocked_seconds", &labels)
                .set(b.blocked_for.as_secs_f64());
        }
        for w in &u.windows {
            let mut labels = labels.clone();
            labels.extend([
                ("scope", w.scope.to_string()),
                ("resource", w.resource.clone()),
                ("window", w.window.describe()),
            ]);
            metrics::gauge!("qw_window_used_units", &labels).set(w.used as f64);
            metrics::gauge!("qw_window_remaining_units", &labels).set(w.remaining as f64);
            metrics::gauge!("qw_window_limit_units", &labels).set(w.window.units.get() as f64);
            metrics::gauge!("qw_window_frees_in_seconds", &labels).set(w.frees_in.as_secs_f64());
            metrics::gauge!("qw_window_drift_units", &labels).set(w.drift as f64);
            if w.window.is_concurrent() {
                metrics::gauge!("qw_window_leases", &labels).set(w.leases as f64);
            }
        }
    }
    if let Some(d) = depth {
        metrics::gauge!("qw_queue_tasks", "state" => "backlog").set(d.backlog as f64);
        metrics::gauge!("qw_queue_tasks", "state" => "queued").set(d.queued as f64);
        metrics::gauge!("qw_queue_tasks", "state" => "in_flight").set(d.in_flight as f64);
    }
    metrics::gauge!("qw_redis_up").set(if up { 1.0 } else { 0.0 });
}
