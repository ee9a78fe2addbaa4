//! `quota-worker check`: validates the config, jobs and secrets (exit 78 when
//! invalid), then shows each job's next fire times and worst-case cost, and
//! per window the worst-case units the jobs can spend against its limit,
//! warning when they cannot fit and when the quota would run out. When the
//! configured Redis answers, its eviction policy is checked as `run` checks
//! it (exit 78 when `run` would refuse to start), and so is every master of
//! the quota windows' Redis Cluster.

use std::time::Duration;

use chrono::{DateTime, Utc};

mod tenants;
mod windows;

use tenants::Tenants;
use windows::{shares, window_rows};

use super::{Exit, out, outln};
use crate::acl;
use crate::config::{Config, Job, Reserve, UnsafeEviction};
use crate::eviction::{self, Eviction};
use crate::quota::QuotaTarget;
use crate::schedule::source::{Refused, SourceError};
use crate::schedule::{self, TickItems};

/// Runs the command at `now`; `with_secrets`: each credential command
/// runs once too.
pub async fn run(config: &Config, now: DateTime<Utc>, with_secrets: bool) -> Exit {
    let secrets = match config.secrets() {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("error: {e}");
            }
            eprintln!(
                "{}: secrets missing; nothing was run",
                config.path.display()
            );
            return Exit::Config;
        }
    };
    if !commands(config, &secrets, with_secrets).await {
        return Exit::Config;
    }
    if let Err(code) = super::check_sinks(config) {
        return code;
    }
    let tables = match super::check_tables(config, false).await {
        Ok(t) => t,
        Err(code) => return code,
    };
    let (config, sources) = read_sources(config).await;
    let daemons = live_daemons(&config).await;
    out!("{}", report(&config, now, &sources, daemons));
    out!("{}", tables_report(&tables));
    redis_eviction(&config).await
}

/// Each credential command: its program is there and executable (checked
/// with the secrets); with `--with-secrets` it runs once, as the daemon
/// would run it, and this says whether it printed a token (never the
/// token). A template's runs per tenant, so it is not run here. `false`
/// when one failed.
async fn commands(config: &Config, secrets: &crate::config::Secrets, run: bool) -> bool {
    let known: Vec<_> = secrets.values().cloned().collect();
    let mut ok = true;
    for cred in config.credentials.values().filter(|c| c.minted()) {
        if !run {
            outln!(
                "credential {}: secret_command's program is there and executable (not run; `check --with-secrets` runs it)",
                cred.name
            );
            continue;
        }
        // A template's runs per tenant: here once, for its first tenant
        // in the jobs' items (every tenant's runs when a task needs it).
        let tenant = match &cred.template {
            None => None,
            Some(_) => match Tenants::seen(config, cred).values.into_iter().next() {
                Some(v) => Some(v),
                None => {
                    outln!(
                        "credential {}: secret_command not run (a template's runs per tenant, and no job's items name one now)",
                        cred.name
                    );
                    continue;
                }
            },
        };
        let Some((name, argv, _)) = cred.command(tenant.as_deref()) else {
            continue;
        };
        if let Some(why) = tenant.as_deref().and_then(|v| cred.command_refusal(v)) {
            eprintln!("error: credential {name}: credential command failed: {why}");
            ok = false;
            continue;
        }
        let whose = match &tenant {
            Some(_) => format!("{name} (one tenant; each tenant's runs when a task needs it)"),
            None => name.clone(),
        };
        match crate::mint::run(&argv, &name, &known).await {
            Ok(token) => outln!(
                "credential {whose}: secret_command printed a token ({} bytes)",
                token.expose().len()
            ),
            Err(e) => {
                eprintln!("error: credential {name}: credential command failed: {e}");
                ok = false;
            }
        }
    }
    ok
}

/// One line per postgres sink table: ready, to be created, or not
/// answering now.
fn tables_report(tables: &[(String, crate::sink::TableState)]) -> String {
    use crate::sink::TableState;
    let mut out = String::new();
    for (what, state) in tables {
        let line = match state {
            TableState::Ready { .. } => format!("\npostgres: {what}: ready\n"),
            TableState::Missing => {
                format!("\npostgres: {what}: not there yet; `run` creates it\n")
            }
            TableState::Unreachable(why) => format!(
                "\nwarning: postgres: {what}: {why}; its table is checked when `run` starts or the first page is written (pages are spooled meanwhile)\n"
            ),
        };
        out.push_str(&line);
    }
    out
}

/// What reading one job's `fan_out_from` source found now.
type SourceRead = Result<Option<Refused>, SourceError>;

/// Reads every job's `fan_out_from` source as a tick would, and returns the
/// config with each one's rows counted (a source that cannot be read is
/// counted at `max_items`, the most a tick could fan out).
async fn read_sources(config: &Config) -> (Config, Vec<(String, SourceRead)>) {
    let mut counted = config.clone();
    let mut found = Vec::new();
    for job in config.jobs.values().filter(|j| j.fan_out_from.is_some()) {
        let read = TickItems::read_async(job).await.map(|items| {
            let rows = items.rows();
            if let Some(f) = (counted.jobs.get_mut(&job.name)).and_then(|j| j.fan_out_from.as_mut())
            {
                f.rows = rows;
            }
            items.into_refused()
        });
        found.push((job.name.clone(), read));
    }
    (counted, found)
}

/// Whether the configured Redis keeps every key, when it answers now, and
/// every master of the quota windows' cluster (`[redis] quota_nodes`) too.
async fn redis_eviction(config: &Config) -> Exit {
    let queue = queue_eviction(config).await;
    let cluster = quota_cluster(config).await;
    if queue == Exit::Config || cluster == Exit::Config {
        Exit::Config
    } else {
        Exit::Ok
    }
}

/// The queue's Redis (the windows' too without `quota_nodes`).
async fn queue_eviction(config: &Config) -> Exit {
    let Some(url) = crate::conn::Master::of(&config.redis) else {
        outln!("\nredis: embedded, started with maxmemory-policy noeviction");
        return Exit::Ok;
    };
    let url = &url;
    let wait = Duration::from_secs(2);
    let mut conn = match crate::conn::connect(url, wait, "cli").await {
        Ok(mut c) => match redis::cmd("PING").query_async::<()>(&mut c).await {
            Err(e) if acl::is_auth_failure(&e) => Err(e),
            _ => Ok(c),
        },
        Err(e) => Err(e),
    };
    let conn = match conn.as_mut() {
        Ok(c) => c,
        Err(e) if acl::is_auth_failure(e) => {
            eprintln!("error: {}", crate::acl::refused_credentials(&url, e));
            return Exit::Config;
        }
        Err(_) => {
            outln!(
                "\nredis: {url} does not answer now; its maxmemory-policy and its user's permissions are checked when `run` starts"
            );
            return Exit::Ok;
        }
    };
    let eviction = verdict(config, &url.to_string(), eviction::check(conn, wait).await);
    let replicas = config.redis.quota_replicas > 0;
    let read = acl::access(conn, &config.redis.key_prefix, replicas).await;
    let access = access_verdict(&url, read, &acl::Access::Granted.to_string());
    note_functions(conn, &config.redis.key_prefix, &url).await;
    if eviction == Exit::Config || access == Exit::Config {
        Exit::Config
    } else {
        Exit::Ok
    }
}

/// Says so when the user at `at` may not load or call the spend core's
/// function library (Redis 7): spends then run by EVALSHA, which works.
async fn note_functions(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    prefix: &str,
    at: &impl std::fmt::Display,
) {
    if let Ok(acl::Access::Missing(missing)) = acl::functions(conn, prefix).await {
        println!("note: redis: {at}: {}", acl::slower(&missing));
    }
}

/// Every master of the cluster of `[redis] quota_nodes`, when it answers
/// now, and whether its user may run what the windows need.
async fn quota_cluster(config: &Config) -> Exit {
    if config.redis.quota_nodes.is_empty() {
        return Exit::Ok;
    }
    let target = QuotaTarget::Cluster(config.redis.quota_nodes.clone());
    let at = format!("the quota windows' {target}");
    let wait = Duration::from_secs(2);
    let Ok(Ok(conn)) = tokio::time::timeout(wait, target.connect(wait, 0)).await else {
        outln!(
            "\nredis: {at} does not answer now; its masters' maxmemory-policy is checked when `run` starts"
        );
        return Exit::Ok;
    };
    let eviction = verdict(config, &at, conn.eviction(wait).await);
    let replicas = config.redis.quota_replicas > 0;
    let read = acl::access_windows(&mut conn.clone(), &config.redis.key_prefix, replicas).await;
    let access = access_verdict(&at, read, "the user may run every command the windows need");
    note_functions(&mut conn.clone(), &config.redis.key_prefix, &at).await;
    if eviction == Exit::Config || access == Exit::Config {
        Exit::Config
    } else {
        Exit::Ok
    }
}

/// Prints what the user's permissions at `at` (`read`, as `acl` found
/// them) mean for `run`, `granted` when it may run everything, and the
/// exit code: a permission missing is a config error; permissions that
/// could not be read are a warning.
fn access_verdict<E: std::fmt::Display>(
    at: &impl std::fmt::Display,
    read: Result<acl::Access, E>,
    granted: &str,
) -> Exit {
    match read {
        Ok(acl::Access::Granted) => {
            outln!("redis: {at}: {granted}");
            Exit::Ok
        }
        Ok(missing @ acl::Access::Missing(_)) => {
            eprintln!("error: Redis at {at}: {missing}");
            Exit::Config
        }
        Ok(unknown @ acl::Access::Unknown(_)) => {
            outln!("warning: redis: {at}: {unknown}");
            Exit::Ok
        }
        Err(e) => {
            outln!("warning: redis: {at}: the user's permissions could not be read: {e}");
            Exit::Ok
        }
    }
}

/// Prints what `eviction` at `at` means for `run`, and the exit code.
fn verdict(config: &Config, at: &str, eviction: Eviction) -> Exit {
    match eviction {
        Eviction::Safe => {
            outln!("\nredis: {at}: maxmemory-policy noeviction");
            Exit::Ok
        }
        Eviction::Unsafe(policy) => {
            let reason = Eviction::unsafe_reason(&policy);
            match config.redis.unsafe_eviction {
                UnsafeEviction::Refuse => {
                    eprintln!("error: Redis at {at}: {reason}; `run` refuses to start");
                    Exit::Config
                }
                UnsafeEviction::Warn => {
                    outln!(
                        "\nwarning: Redis at {at}: {reason} (unsafe_eviction = \"warn\": `run` starts anyway)"
                    );
                    Exit::Ok
                }
            }
        }
        Eviction::Unknown(why) => {
            outln!(
                "\nwarning: Redis at {at}: its maxmemory-policy cannot be verified ({why}); make sure it is noeviction"
            );
            Exit::Ok
        }
    }
}

/// The daemons alive on the configured Redis now (their apalis workers'
/// heartbeats within `recover_after`), when it answers; `None` when it
/// does not (or the Redis is the embedded one of a daemon not running).
async fn live_daemons(config: &Config) -> Option<u64> {
    let master = crate::conn::Master::of(&config.redis)?;
    let wait = Duration::from_secs(2);
    let conn = crate::conn::connect(&master, wait, "cli").await.ok()?;
    let keys = crate::keys::KeySpace::new(config.redis.key_prefix.clone());
    let queue = crate::queue::Queue::new(conn, keys, config.worker.recover_after);
    let live = queue.live_workers(config.worker.recover_after);
    tokio::time::timeout(wait, live).await.ok()?.ok()
}

/// The report, warnings last. `daemons`: how many run on this config's
/// Redis now, when it could be asked.
fn report(
    config: &Config,
    now: DateTime<Utc>,
    sources: &[(String, SourceRead)],
    daemons: Option<u64>,
) -> String {
    let mut out = format!(
        "{}: valid ({} credential(s), {} endpoint(s), {} job(s))\n",
        config.path.display(),
        config.credentials.len(),
        config.endpoints.len(),
        config.jobs.len()
    );
    let mut warnings = Vec::new();
    for job in config.jobs.values() {
        let read = sources.iter().find(|(n, _)| *n == job.name).map(|(_, r)| r);
        out.push_str(&job_lines(config, job, now, read));
        let (line, warning) = fan_out_lines(config, job, read);
        out.push_str(&line);
        warnings.extend(warning);
    }
    // Per job, the smallest fraction of its worst case a window it spends
    // from can serve (below 1: the window does not fit).
    let mut served: std::collections::BTreeMap<&str, f64> = Default::default();
    for cred in config.credentials.values() {
        out.push_str(&format!("\ncredential {}\n", cred.name));
        let tenants = cred.template.as_ref().map(|_| Tenants::seen(config, cred));
        if let Some(t) = &tenants {
            let (line, warning) = t.report(cred);
            out.push_str(&line);
            warnings.extend(warning);
        }
        let rows = window_rows(config, &cred.name, &cred.windows);
        let scope_w = (rows.iter().map(|r| r.label().len())).max();
        let win_w = (rows.iter().map(|r| r.window.describe().len())).max();
        let (scope_w, win_w) = (scope_w.unwrap_or(0), win_w.unwrap_or(0));
        for row in rows {
            // A concurrent window counts units in flight, not units spent:
            // its line is of its own, and no job's share comes from it.
            if row.window.is_concurrent() {
                let (line, warning) = row.in_flight(config, &cred.name, daemons, (scope_w, win_w));
                out.push_str(&line);
                warnings.extend(warning);
                continue;
            }
            // A template's rows count its busiest tenant, so a job's
            // fraction served is that tenant's (a lower bound for the rest).
            let worst = row.worst(config, tenants.as_ref(), now);
            if worst > row.window.units.get() {
                let f = row.window.units.get() as f64 / worst as f64;
                for job in &row.jobs {
                    let least = served.entry(job.name.as_str()).or_insert(1.0);
                    *least = least.min(f);
                }
            }
            let (line, warning) =
                row.report(config, &cred.name, tenants.as_ref(), now, (scope_w, win_w));
            out.push_str(&line);
            warnings.extend(warning);
        }
    }
    if !served.is_empty() {
        out.push_str(&shares(config, &served));
    }
    warnings.extend(unmirrored(config));
    if let Some(addr) = config.metrics.listen
        && let Some(why) = crate::ops::exposed(addr)
    {
        warnings.push(format!("[metrics] listen = \"{addr}\": {why}"));
    }
    for w in &warnings {
        out.push_str(&format!("\nwarning: {w}\n"));
    }
    out
}

/// Endpoints whose answers say what the upstream has left (an
/// `accounting` adapter or `ratelimit_headers`) where no window they resync
/// mirrors it (`upstream = true`): the count would change nothing. Warned,
/// not refused: such an endpoint's blocks still work.
fn unmirrored(config: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for e in config.endpoints.values() {
        let reads = match (&e.accounting, &e.ratelimit_headers) {
            (Some(a), _) => format!("accounting = \"{}\"", a.as_str()),
            (None, Some(_)) => "ratelimit_headers".to_owned(),
            (None, None) => continue,
        };
        let cred = &config.credentials[&e.credential];
        let mirrors = (cred.windows.iter())
            .filter(|w| w.serves(e.resource.as_deref()))
            .chain(&e.windows)
            .any(|w| w.upstream);
        if !mirrors {
            let resource = cred.resource_name(e.resource.as_deref());
            out.push(format!(
                "endpoint {}: its answers say what the upstream has left ({reads}), but no window of credential {} of resource {resource:?}, nor one of its own, has upstream = true: nothing is resynced and other programs on the key go unseen; mark the window that mirrors the upstream's limit upstream = true",
                e.name, cred.name
            ));
        }
    }
    out
}

/// A job's worst-case cost per run and its next fire times. `read`: its
/// `fan_out_from` source as read now, if it has one: one that cannot be
/// read, or holds more than `max_items` rows, fans out no task now (issue
/// 37: "100000 task(s) per tick" was printed for it), though the worst
/// case still counts `max_items` (it may be fixed before the next tick).
fn job_lines(config: &Config, job: &Job, now: DateTime<Utc>, read: Option<&SourceRead>) -> String {
    let ep = &config.endpoints[&job.endpoint];
    let next: Vec<String> = schedule::next_fires(job, now, 3)
        .iter()
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .collect();
    let reserve = if job.reserve == Reserve::NONE {
        String::new()
    } else {
        format!(
            "  reserve: {} of every window stays free for others\n",
            job.reserve
        )
    };
    // Each same-origin redirect a page follows is one more request, spent
    // like any other (at most MAX_REDIRECTS a page): the bound, beside the
    // worst case of pages answered at once.
    let run = schedule::worst_per_run(config, job);
    let hops = crate::fetch::MAX_REDIRECTS;
    let redirected = run.saturating_mul(u64::from(hops) + 1);
    let tasks = match read {
        Some(Err(SourceError::TooManyRows { max, .. })) => format!(
            "no task per tick now (its fan_out_from source has more than max_items = {max} rows)"
        ),
        Some(Err(_)) => "no task per tick now (its fan_out_from source cannot be read)".to_owned(),
        _ => format!("{} task(s) per tick", job.items()),
    };
    let items = match read {
        Some(Err(_)) => format!("at most {} item(s) once it fans out", job.items()),
        _ => format!("{} item(s)", job.items()),
    };
    format!(
        "\njob {} ({}): endpoint {}, {tasks}, worst case {} units per run ({items} x {} page(s) x {} unit(s)); {redirected} if every page is redirected {hops} times (each hop is spent)\n{reserve}  next: {}\n",
        job.name,
        job.file.display(),
        ep.name,
        run,
        job.max_pages(),
        ep.cost,
        next_line(job, &next),
    )
}

/// What `check` prints for a job's next fire times: "manual" for a job
/// only `trigger` runs, "never" for a schedule with no future fire time.
fn next_line(job: &Job, next: &[String]) -> String {
    if job.schedule.is_manual() {
        return "manual (only `quota-worker trigger` runs it; not counted in the windows' worst case below)".into();
    }
    let next = if next.is_empty() {
        "never".into()
    } else {
        next.join(", ")
    };
    format!("{next} ({} {})", job.schedule, job.timezone)
}

/// A job's `fan_out_from` (what its source holds now) and the warnings:
/// a source that cannot be read, rows refused, a tick larger than
/// `[worker] fan_out_warn`.
fn fan_out_lines(config: &Config, job: &Job, read: Option<&SourceRead>) -> (String, Vec<String>) {
    let (mut out, mut warnings) = (String::new(), Vec::new());
    let name = &job.name;
    if let (Some(from), Some(read)) = (&job.fan_out_from, read) {
        let source = from.source.path().display();
        let combos = job.combinations();
        let times = if combos > 1 {
            format!(" x {combos} fan_out combination(s)")
        } else {
            String::new()
        };
        match read {
            Ok(refused) => {
                let rows = from.rows.unwrap_or(0);
                out.push_str(&format!(
                    "  fan_out_from {source}: {rows} row(s) now{times} (a tick fans out nothing above max_items = {})\n",
                    from.max_items
                ));
                if let Some(r) = refused {
                    warnings.push(format!(
                        "job {name}: {} row(s) of {source} are refused (skipped at every tick): {}",
                        r.count,
                        r.examples.join("; ").escape_debug()
                    ));
                }
            }
            Err(e) => {
                let now = match e {
                    SourceError::TooManyRows { .. } => "has more rows than max_items now",
                    _ => "cannot be read now",
                };
                out.push_str(&format!(
                    "  fan_out_from {source}: {now}: a tick fans out nothing; counted at max_items = {}{times} for the worst case\n",
                    from.max_items
                ));
                warnings.push(format!(
                    "job {name}: {e}; until it can be read, each tick fans out nothing (logged, counted in qw_fan_out_errors_total)"
                ));
            }
        }
    }
    let items = job.items();
    let warn = config.worker.fan_out_warn;
    if items > warn {
        let mib = items.saturating_mul(TASK_BYTES) >> 20;
        warnings.push(format!(
            "job {name}: a tick fans out {items} task(s), more than [worker] fan_out_warn = {warn}: each waits in Redis (about {mib} MiB for the tick) until a worker takes it; the tick is queued in chunks and drains at the workers' pace"
        ));
    }
    (out, warnings)
}

/// About what one waiting task takes in Redis (payload and indexes), for
/// the size of a large fan-out (1,000,000 took 404 MiB on Redis 7.0).
const TASK_BYTES: u64 = 420;
