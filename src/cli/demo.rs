//! `quota-worker demo [--for 30s]`: the real daemon on `config/demo.toml`,
//! against an embedded Redis and the built-in simulated metered API.
//!
//! The demo follows YouTube's cost table with a "day" of seconds: one key
//! whose methods share a fixed window of units, and `search.list` with a
//! bucket of its own (`charge_credential = false`). The quotas are small, so
//! within seconds the shared window runs out: tasks end at once as
//! `quota_exhausted` with the retry-after, and later ticks resume where they
//! stopped. Beside it, a GraphQL API in GitHub's shape: its issues job
//! pages by the cursor in the POST body's variables, and `hasNextPage` ends
//! each run without a request for an empty page. The summary compares what
//! the upstream saw with what it allows, per window; its count of quota
//! errors must be 0. The status page is served on a free loopback port
//! (`[metrics] listen = "127.0.0.1:0"` in `config/demo.toml`) and its
//! address printed at start.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use super::{Exit, out, outln};
use crate::config::{Config, Secrets, Template, fmt_duration};
use crate::daemon::{self, RunOptions, Shared};
use crate::outcome::{OutcomeEvent, OutcomeKind};
use crate::quota::{Limiter, Quotas};
use crate::stats::Stats;
use simulator::{KeyQuota, SimConfig, SimStats, SimStyle, Simulator};

/// Request URLs in `config/demo.toml` start with this; the demo points them at
/// the simulator (the `.invalid` domain can never resolve to anything real).
pub(crate) const DEMO_UPSTREAM: &str = "http://upstream.invalid";

/// The demo's API keys (fake, for the simulator only) by credential.
const KEYS: [(&str, &str); 2] = [("yt-demo", "demo-key"), ("gh-demo", "demo-gh-key")];

/// The simulated GraphQL API's path: a connection in GitHub's shape.
const GRAPHQL: &str = "/graphql";

/// The simulated upstream's search path: a bucket of its own per key.
const SEARCH: &str = simulator::SEARCH;

/// The simulated upstream's own quotas: YouTube's model (a shared window,
/// search in a bucket of its own at 1 unit a call, both reset at fixed
/// times), a little above the demo config's windows, as real headroom is.
fn sim_config() -> SimConfig {
    SimConfig {
        keys: vec![
            KeyQuota::new("demo-key", 50, Duration::from_secs(15)).fixed(),
            KeyQuota::new("demo-gh-key", 30, Duration::from_secs(15)).fixed(),
        ],
        ..SimConfig::default()
    }
    .cost(SEARCH, 1)
    .bucket(SEARCH, 6, Duration::from_secs(30))
    .cost(GRAPHQL, 1)
    .style_on(GRAPHQL, SimStyle::Graphql(&["repository", "issues"]))
}

/// Runs the demo for `duration`, writing under `out_dir`.
pub async fn run(mut config: Config, duration: Duration, out_dir: &Path) -> Exit {
    let sim = match Simulator::start(sim_config()).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot start the simulated API on 127.0.0.1: {e}");
            return Exit::Unavailable;
        }
    };
    if let Err(code) = point_at(&mut config, &sim.base_url(), out_dir) {
        return code;
    }
    let secrets = match demo_secrets(&config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::Config;
        }
    };
    let config = Arc::new(config);
    print_intro(&config, &sim.base_url(), duration, out_dir);
    let shared = Shared::default();
    let ran = run_daemon(config.clone(), secrets, shared.clone(), duration).await;
    let stats = sim.stats();
    sim.shutdown().await;
    let ran = match ran {
        Ok(ran) => ran,
        Err(code) => return code,
    };
    print_summary(&shared.stats, &ran, out_dir);
    upstream_summary(&stats)
}

/// Points the jobs at the simulator, and keeps all state in `out_dir`.
fn point_at(config: &mut Config, sim_url: &str, out_dir: &Path) -> Result<(), Exit> {
    for job in config.jobs.values_mut() {
        let src = (job.request.url.source()).replacen(DEMO_UPSTREAM, sim_url, 1);
        match Template::parse(&src) {
            Ok(t) => job.request.url = t,
            Err(e) => {
                eprintln!("error: demo job {}: {e}", job.name);
                return Err(Exit::Config);
            }
        }
    }
    config.dir = out_dir.to_owned();
    config.state_dir = out_dir.join("state");
    config.redis.url = None;
    Ok(())
}

/// The demo's fake API keys, as the credentials' `secret_env` would give them.
fn demo_secrets(config: &Config) -> Result<Secrets, crate::config::ConfigErrors> {
    let lookup = |var: &str| {
        config
            .credentials
            .values()
            .find(|c| matches!(&c.secret, crate::config::SecretSource::Env { var: v, .. } if v == var))
            .and_then(|c| KEYS.iter().find(|(name, _)| *name == c.name))
            .map(|(_, key)| (*key).to_owned())
    };
    config.secrets_with_env(&lookup)
}

fn print_intro(config: &Config, sim_url: &str, duration: Duration, out_dir: &Path) {
    outln!(
        "quota-worker demo: {} job(s) against a simulated YouTube-like API (and a GraphQL one) at {sim_url}",
        config.jobs.len(),
    );
    let sim = sim_config();
    for (cred, key) in KEYS {
        if let Some(c) = config.credentials.get(cred) {
            let windows: Vec<String> = c.windows.iter().map(|w| w.describe()).collect();
            let upstream = sim.keys.iter().find(|k| k.key == key);
            outln!(
                "  credential {cred}: quota-worker windows {}; the upstream allows {}{}",
                windows.join(" + "),
                upstream
                    .map(|k| format!("{}/{}", k.units, fmt_duration(k.per)))
                    .unwrap_or_default(),
                if cred == KEYS[0].0 {
                    " (shared by every method but search)"
                } else {
                    ""
                }
            );
        }
    }
    for e in config.endpoints.values().filter(|e| !e.charge_credential) {
        let windows: Vec<String> = e.windows.iter().map(|w| w.describe()).collect();
        let upstream = sim.buckets.iter().find(|(p, _)| p == SEARCH);
        outln!(
            "  endpoint {}: a bucket of its own (not counted in {}'s windows), quota-worker windows {}; the upstream allows {}",
            e.name,
            e.credential,
            windows.join(" + "),
            upstream
                .map(|(_, l)| format!("{}/{}", l.units, fmt_duration(l.per)))
                .unwrap_or_default()
        );
    }
    for job in config.jobs.values() {
        outln!(
            "  job {}: {} ({}), {} task(s) per tick, up to {} page(s) each, endpoint {} at {} unit(s)",
            job.name,
            job.schedule,
            job.timezone,
            job.items(),
            job.max_pages(),
            job.endpoint,
            config.endpoints[&job.endpoint].cost
        );
    }
    outln!(
        "running for {}; records go to {}\n",
        fmt_duration(duration),
        out_dir.display()
    );
}

/// What a demo run came to.
struct Ran {
    started: Instant,
    interrupted: bool,
    /// Each window's usage at the end, read before the daemon stopped its Redis.
    usage: String,
}

/// Runs the daemon, with the live view and a progress line, until
/// `duration` passes or SIGINT/SIGTERM.
async fn run_daemon(
    config: Arc<Config>,
    secrets: Secrets,
    shared: Shared,
    duration: Duration,
) -> Result<Ran, Exit> {
    let (tx, rx) = broadcast::channel(4096);
    let shared = Shared {
        events: Some(tx),
        ..shared
    };
    let (ready_tx, mut ready_rx) = tokio::sync::watch::channel(false);
    let (addr_tx, addr_rx) = tokio::sync::watch::channel(None);
    let opts = RunOptions {
        shared: shared.clone(),
        ready: Some(ready_tx),
        metrics_addr: Some(addr_tx),
        ..RunOptions::default()
    };
    let started = Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async move {
        let _ = stop_rx.await;
    };
    let daemon = tokio::spawn(daemon::run(config.clone(), Arc::new(secrets), opts, stop));
    let _ = ready_rx.wait_for(|r| *r).await;
    // Bound before the daemon says it is ready.
    if let Some(addr) = *addr_rx.borrow() {
        outln!(
            "status page: http://{addr}/ (the windows filling and blocks lifting; item state at http://{addr}/api/state/JOB)\n"
        );
    }
    let Some(limiter) = limiter_for(&config).await else {
        let _ = stop_tx.send(());
        let _ = daemon.await;
        return Err(Exit::Unavailable);
    };
    let view = tokio::spawn(live_view(rx, started));
    let interrupted = tokio::select! {
        _ = tokio::time::sleep_until((started + duration).into()) => false,
        _ = super::run::shutdown_signal() => true,
        _ = progress(&shared.stats, &limiter, started) => false,
    };
    // The summary reads Redis, so take it before the daemon stops its Redis.
    let usage = usage(&config, &limiter).await;
    let _ = stop_tx.send(());
    let result = daemon.await;
    view.abort();
    if let Ok(Err(e)) = &result {
        return Err(super::run::daemon_error(e));
    }
    Ok(Ran {
        started,
        interrupted,
        usage,
    })
}

fn print_summary(s: &Stats, ran: &Ran, out_dir: &Path) {
    outln!(
        "\n=== demo summary ({}{}) ===",
        fmt_duration(ran.started.elapsed()),
        if ran.interrupted { ", interrupted" } else { "" }
    );
    let outcomes: Vec<String> = OutcomeKind::ALL
        .iter()
        .map(|k| format!("{} {}", s.count(*k), k.as_str()))
        .collect();
    outln!("tasks by outcome: {}", outcomes.join(", "));
    outln!(
        "pages fetched: {}; records ingested: {} (files under {})",
        Stats::get(&s.pages),
        Stats::get(&s.records),
        out_dir.join("data").display()
    );
    outln!("units spent vs. each window (now, live from Redis):");
    out!("{}", ran.usage);
}

/// What the upstream saw, per key; exit 70 if it answered a quota error
/// (the limiter let too much through).
fn upstream_summary(stats: &SimStats) -> Exit {
    outln!("what the upstream saw, per key:");
    let sim = sim_config();
    let mut quota_errors = 0;
    for k in &sim.keys {
        let ks = stats.key(&k.key);
        quota_errors += ks.quota_errors;
        let in_bucket = |path: &str| sim.buckets.iter().any(|(p, _)| p == path);
        outln!(
            "  {}: {} units charged, {} quota error(s); shared window: at most {} in one {} period (it allows {})",
            k.key,
            ks.units,
            ks.quota_errors,
            stats.max_units_in_any_period(&k.key, k.per, |p| !in_bucket(p)),
            fmt_duration(k.per),
            k.units,
        );
        // The buckets are YouTube's (search.list's), the first key's.
        for (path, l) in sim.buckets.iter().filter(|_| k.key == KEYS[0].1) {
            outln!(
                "  {}: {path} bucket: at most {} in one {} period (it allows {})",
                k.key,
                stats.max_units_in_any_period(&k.key, l.per, |p| p == path),
                fmt_duration(l.per),
                l.units
            );
        }
    }
    outln!("upstream quota errors: {quota_errors}");
    if quota_errors > 0 {
        eprintln!("error: the upstream answered quota errors: the limiter let too much through");
        return Exit::Software;
    }
    Exit::Ok
}

async fn limiter_for(config: &Config) -> Option<Limiter> {
    let master = super::redis_master(config);
    match crate::conn::connect(&master, config.redis.timeout, "windows").await {
        Ok(c) => Some(Limiter::new(
            c,
            Arc::new(Quotas::new(config)),
            config.redis.timeout,
        )),
        Err(e) => {
            eprintln!("error: cannot reach the embedded Redis: {e}");
            None
        }
    }
}

/// A progress line every 5 s: outcomes so far and each credential's window.
async fn progress(stats: &Stats, limiter: &Limiter, started: Instant) {
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut windows = Vec::new();
        for name in limiter
            .quotas()
            .credential_names()
            .map(str::to_owned)
            .collect::<Vec<_>>()
        {
            if let Ok(u) = limiter.peek(&name).await {
                for w in &u.windows {
                    let scope = match &w.scope {
                        crate::config::Scope::Credential => String::new(),
                        crate::config::Scope::Endpoint(e) => format!(" ({e})"),
                    };
                    windows.push(format!("{name}{scope} {}/{}", w.used, w.window.units));
                }
            }
        }
        outln!(
            "[{:>3}s] done {} · quota_exhausted {} · retrying {} · failed {} · records {} · windows: {}",
            started.elapsed().as_secs(),
            stats.count(OutcomeKind::Done),
            stats.count(OutcomeKind::QuotaExhausted),
            stats.count(OutcomeKind::Retrying),
            stats.count(OutcomeKind::Failed),
            Stats::get(&stats.records),
            windows.join(", ")
        );
    }
}

/// One line per task outcome, folded per tick and job so it stays readable.
async fn live_view(mut rx: broadcast::Receiver<OutcomeEvent>, started: Instant) {
    let mut seen_exhausted: BTreeMap<(String, i64), u32> = BTreeMap::new();
    loop {
        let ev = match rx.recv().await {
            Ok(ev) => ev,
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let o = &ev.outcome;
        let t = started.elapsed().as_secs_f32();
        match o.kind {
            OutcomeKind::QuotaExhausted => {
                // The first of a tick is shown; the rest are counted.
                let n = seen_exhausted.entry((ev.job.clone(), ev.tick)).or_default();
                *n += 1;
                if *n == 1 {
                    let then = match o.requeued_in {
                        Some(d) => format!("deferred: runs again in {}", fmt_duration(d)),
                        None => "the next tick resumes at this page".into(),
                    };
                    outln!(
                        "[{t:>5.1}s] {} {} page {}: quota_exhausted after {} page(s), stopped cleanly, retry after {}; {then} (the tick's other tasks stop the same way)",
                        ev.job,
                        ev.item,
                        o.page,
                        o.pages,
                        o.retry_after.map(fmt_duration).unwrap_or_default()
                    );
                }
            }
            OutcomeKind::Done if o.pages > 0 => {
                let first = o.page + 1 - o.pages;
                let resumed = if first > 1 {
                    format!(" (resumed at page {first})")
                } else {
                    String::new()
                };
                outln!(
                    "[{t:>5.1}s] {} {}: done, {} page(s){resumed}, {} record(s), {} unit(s)",
                    ev.job,
                    ev.item,
                    o.pages,
                    o.records,
                    o.units
                );
            }
            _ => outln!(
                "[{t:>5.1}s] {} {}: {} ({})",
                ev.job,
                ev.item,
                o.kind.as_str(),
                o.detail
            ),
        }
    }
}

async fn usage(config: &Config, limiter: &Limiter) -> String {
    let mut out = String::new();
    for name in config.credentials.keys() {
        match limiter.peek(name).await {
            Ok(u) => {
                for w in &u.windows {
                    out.push_str(&format!(
                        "  {name} {} {}: {} used, {} left{}\n",
                        w.scope,
                        w.window.describe(),
                        w.used,
                        w.remaining,
                        if w.used > 0 {
                            format!(", frees in {}", fmt_duration(w.frees_in))
                        } else {
                            String::new()
                        }
                    ));
                }
            }
            Err(e) => out.push_str(&format!("  {name}: {e}\n")),
        }
    }
    out
}
