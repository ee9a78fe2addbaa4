//! The configuration: `config/quota-worker.toml` plus the job files its `jobs`
//! glob names, parsed, validated and immutable.
//!
//! Everything is checked here, before anything touches Redis: a cost no window
//! can hold, an unknown endpoint or credential, a bad cron expression, a
//! placeholder with no value. Every error names the file, line, column and
//! field ([`ConfigError`]); the binary exits 78 on them. Secrets are resolved
//! separately ([`Config::secrets`]) because only the commands that send
//! requests need them.
//!
//! This file holds the validated types. The files as written are `raw`'s
//! serde types; `load` turns them into these, one function per TOML table;
//! [`defaults`] holds every default and limit, `choice` the words a field may
//! take (`kind = "jsonl"`), `duration` how durations are read and printed.

mod choice;
pub mod defaults;
mod duration;
mod error;
mod load;
mod postgres;
mod raw;
mod redis_url;
mod template;
mod tenant;

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use chrono_tz::Tz;
use indexmap::IndexMap;

pub use duration::{fmt_duration, parse_duration};
pub use error::{ConfigError, ConfigErrors, FieldPath, Seg, Source};
pub use postgres::{PasswordFrom, PgTarget, PgTls, PgTlsMode};
pub(crate) use raw::fmt_size;
pub use redis_url::{MasterSettings, RedisUrl};
pub(crate) use template::expand;
pub use template::{Expansion, Template, TemplateError};
pub use tenant::{parse_tenant, tenant_name};

use choice::Choice;
pub(crate) use load::read_bounded;
use load::{Loader, read_secret};

/// Environment variable naming the config file when `-c` is not given.
pub const CONFIG_ENV: &str = "QUOTA_WORKER_CONFIG";
/// Overrides `[redis] url`.
pub const REDIS_URL_ENV: &str = "QUOTA_WORKER_REDIS_URL";
/// Overrides `[metrics] listen`.
pub const METRICS_LISTEN_ENV: &str = "QUOTA_WORKER_METRICS_LISTEN";
/// The default config path, relative to the working directory.
pub const DEFAULT_CONFIG: &str = "config/quota-worker.toml";

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The config file.
    pub path: PathBuf,
    /// Its directory: relative paths resolve against it.
    pub dir: PathBuf,
    /// Where the embedded Redis and other state live.
    pub state_dir: PathBuf,
    /// `[redis]`.
    pub redis: RedisConfig,
    /// `[worker]`.
    pub worker: WorkerConfig,
    /// `[metrics]`.
    pub metrics: MetricsConfig,
    /// `[log] format`.
    pub log_format: Option<LogFormat>,
    /// `[credentials.*]`, in config order.
    pub credentials: IndexMap<String, Credential>,
    /// `[endpoints.*]`, in config order.
    pub endpoints: IndexMap<String, Endpoint>,
    /// Every job of every job file, in file then config order.
    pub jobs: IndexMap<String, Job>,
    /// The files as read (the config file and every job file, their paths
    /// and contents), hashed: the same files give the same fingerprint, so
    /// `trigger` can tell a daemon that runs another config than the one on
    /// disk (12 hex digits of SHA-1; not a security boundary).
    pub fingerprint: String,
}

/// `[redis]`.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `None` (and no `sentinels`): the daemon starts an embedded
    /// `redis-server` itself. With `sentinels`: the master's user,
    /// password, database and TLS, and no host (the sentinels name it).
    pub url: Option<RedisUrl>,
    /// Every key the product writes starts with it.
    pub key_prefix: String,
    /// How long a spend waits for Redis before the endpoint's
    /// `limiter_unavailable` policy decides.
    pub timeout: Duration,
    /// What `run` does on a Redis whose `maxmemory-policy` may evict keys.
    pub unsafe_eviction: UnsafeEviction,
    /// Seed nodes of the Redis Cluster that holds the quota windows (spend,
    /// settle, block, peek, sync); empty: the windows live in `url`'s Redis
    /// with the queue. The queue never moves to the cluster (apalis-redis
    /// does not support one).
    pub quota_nodes: Vec<RedisUrl>,
    /// Replicas that must acknowledge an admitted spend (`WAIT`) before its
    /// request is sent: 0 (never waits) or 1.
    pub quota_replicas: u8,
    /// The sentinels to ask where the master is (`redis://HOST:PORT`,
    /// credentials in the URL where they need them); empty: `url` names it.
    pub sentinels: Vec<RedisUrl>,
    /// The name the sentinels monitor the master under (with `sentinels`).
    pub master_name: Option<String>,
    /// Replicas that must acknowledge a tick's claim and fan-out, a task's
    /// checkpoint and its end (`WAIT`) before they count: 0 or 1.
    pub queue_replicas: u8,
}

impl RedisConfig {
    /// Whether the daemon runs a Redis of its own: no `url`, no `sentinels`.
    pub fn embedded(&self) -> bool {
        self.url.is_none() && self.sentinels.is_empty()
    }
}

/// `[redis] unsafe_eviction`: a Redis that may evict keys under memory
/// pressure loses window entries (and queue state) without a trace, so the
/// windows admit more than their limit. See docs/redis.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnsafeEviction {
    /// `run` refuses to start (exit 78), `/readyz` answers 503 (the default).
    #[default]
    Refuse,
    /// `run` starts and logs a warning; `/readyz` stays 200 and says why.
    Warn,
}

/// `[worker]`.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Tasks one daemon runs at once.
    pub concurrency: NonZeroUsize,
    /// On SIGTERM, how long running tasks get to finish.
    pub shutdown_timeout: Duration,
    /// A killed daemon's tasks are picked up by a live one within about this.
    pub recover_after: Duration,
    /// While due tasks wait for room in apalis (a large fan-out draining),
    /// how often the feeder looks again. An idle daemon does not poll: it
    /// waits on the wake stream (`queue::wake`).
    pub poll_interval: Duration,
    /// `check` warns about a job whose tick fans out to more tasks than this.
    pub fan_out_warn: u64,
    /// A task of a job this daemon's config does not have is given back
    /// (for a daemon that has it) until no daemon has had the job loaded
    /// for this long; then it ends `failed`. 0: it fails at once.
    pub unknown_job_grace: Duration,
}

/// `[metrics]`.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Where `/metrics`, `/healthz` and `/readyz` listen; `None` = off.
    pub listen: Option<SocketAddr>,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Compact, for humans and journald.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// For `--log-format`: the same words and error as `[log] format`.
impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::parse(s)
    }
}

/// Where a field was written, to position errors found after loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    file: PathBuf,
    line: usize,
    column: usize,
    field: String,
}

impl Location {
    fn of(err: ConfigError) -> Self {
        Location {
            file: err.file,
            line: err.line,
            column: err.column,
            field: err.field,
        }
    }

    /// A location in no file, for the tests that build a config by hand.
    #[cfg(test)]
    pub(crate) fn nowhere() -> Self {
        Location {
            file: PathBuf::new(),
            line: 0,
            column: 0,
            field: String::new(),
        }
    }

    /// An error at this location.
    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            line: self.line,
            column: self.column,
            field: self.field.clone(),
            message: message.into(),
        }
    }
}

/// One upstream API key or token.
#[derive(Debug, Clone)]
pub struct Credential {
    /// Its name (not the secret): used in Redis keys and logs.
    pub name: String,
    /// Where its secret comes from.
    pub secret: SecretSource,
    /// Its quota windows, in config order.
    pub windows: Vec<Window>,
    /// The name of its default resource: the one a window or endpoint that
    /// names none belongs to ([`Window::resource`] `None`), and the one an
    /// existing config's keys belong to. `"core"` when one of its endpoints
    /// has `accounting = "github"`, else `"graphql"` when one has
    /// `"github-graphql"`, else `"default"`.
    pub default_resource: String,
    /// `template = "account"`: one credential per value of `{account}`
    /// (the tenant), each with its own secret (`secret_file` holds the
    /// placeholder), windows of this shape, block and Redis keys.
    pub template: Option<String>,
}

impl Credential {
    /// The name of `resource` (`None`: the default resource).
    pub fn resource_name<'a>(&'a self, resource: Option<&'a str>) -> &'a str {
        resource.unwrap_or(&self.default_resource)
    }

    /// `name` as this credential's windows and endpoints hold it: `None`
    /// for the default resource.
    pub fn resource_of(&self, name: &str) -> Option<String> {
        (name != self.default_resource).then(|| name.to_owned())
    }

    /// Its resources, the default first, then each other one its windows
    /// and `endpoints` name, in config order.
    pub fn resources<'a>(
        &'a self,
        endpoints: impl IntoIterator<Item = &'a Endpoint>,
    ) -> Vec<Option<&'a str>> {
        let mut out: Vec<Option<&str>> = vec![None];
        let named = (self.windows.iter().map(|w| w.resource.as_deref())).chain(
            endpoints
                .into_iter()
                .filter(|e| e.credential == self.name)
                .flat_map(|e| {
                    std::iter::once(e.resource.as_deref())
                        .chain(e.windows.iter().map(|w| w.resource.as_deref()))
                }),
        );
        for r in named {
            if !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// One tenant of a template credential: its name as `quota` shows it
    /// and its keys carry it (`ig[account=123]`, [`tenant_name`]).
    /// `None` for a plain credential.
    pub fn tenant(&self, value: &str) -> Option<String> {
        let placeholder = self.template.as_deref()?;
        Some(tenant_name(&self.name, placeholder, value))
    }

    /// The command that mints this credential's secret, with a tenant's
    /// `value` in place of the template's placeholder, and its TTL; the
    /// key its token is kept under in this process (the credential or the
    /// tenant). `None` when the secret is not minted by a command.
    pub fn command(&self, value: Option<&str>) -> Option<(String, Vec<String>, Duration)> {
        let SecretSource::Command { argv, ttl, .. } = &self.secret else {
            return None;
        };
        match (&self.template, value) {
            (Some(placeholder), Some(value)) => {
                let wanted = format!("{{{placeholder}}}");
                let argv = argv.iter().map(|a| a.replace(&wanted, value)).collect();
                Some((self.tenant(value)?, argv, *ttl))
            }
            (Some(_), None) => None,
            (None, _) => Some((self.name.clone(), argv.clone(), *ttl)),
        }
    }

    /// Why a template's command must not run for tenant `value`: the value
    /// starts with `-` and would begin an argument of the command, which
    /// would read it as an option (`--help`, `--output=/etc/x`): values come
    /// from data (`fan_out_from`), not the operator. An argument after a
    /// `--` in the argv is safe (the operator ended the options there).
    /// `None`: it may run (or the secret is not minted, or not a template).
    pub fn command_refusal(&self, value: &str) -> Option<String> {
        let (SecretSource::Command { argv, .. }, Some(placeholder)) =
            (&self.secret, &self.template)
        else {
            return None;
        };
        if !value.starts_with('-') {
            return None;
        }
        let wanted = format!("{{{placeholder}}}");
        let at = argv
            .iter()
            .skip(1)
            .take_while(|a| a.as_str() != "--")
            .any(|a| a.starts_with(&wanted));
        let program = argv.first().map_or("", String::as_str);
        at.then(|| {
            format!(
                "the tenant value {value:?} starts with '-', so {program} would read it as an option; not run (put \"--\" before \"{wanted}\" in secret_command if the command takes it as a value there)"
            )
        })
    }

    /// Whether a command mints this credential's secret.
    pub fn minted(&self) -> bool {
        matches!(self.secret, SecretSource::Command { .. })
    }

    /// Reads one tenant's secret, from `secret_file` with the tenant's
    /// value in place of the placeholder; read at every call, so a changed
    /// token file is picked up by the next task.
    pub fn tenant_secret(&self, value: &str) -> Result<Secret, TenantSecretError> {
        let (Some(placeholder), SecretSource::File { path, .. }) = (&self.template, &self.secret)
        else {
            return Err(TenantSecretError::NotATemplate);
        };
        check_tenant_value(value)?;
        let path = path
            .to_string_lossy()
            .replace(&format!("{{{placeholder}}}"), value);
        let path = PathBuf::from(path);
        match load::read_bounded(&path, defaults::MAX_SECRET_FILE_BYTES, "a secret file") {
            Ok(v) => {
                let v = v.trim_end_matches(['\n', '\r']);
                if v.is_empty() {
                    Err(TenantSecretError::Empty(path))
                } else {
                    Ok(Secret(v.to_owned()))
                }
            }
            Err(why) => Err(TenantSecretError::Unreadable { path, why }),
        }
    }
}

/// Whether `value` can be a tenant of a template credential: it names one
/// token file under the template's directories, so a value that could
/// climb out of them (`..`, `a/b`) or names no file (empty, a control
/// character) is none.
pub fn check_tenant_value(value: &str) -> Result<(), TenantSecretError> {
    if value.is_empty()
        || value == "."
        || value == ".."
        || value.contains(['/', '\\', '\0'])
        || value.chars().any(char::is_control)
    {
        return Err(TenantSecretError::BadValue);
    }
    Ok(())
}

/// Why a tenant of a template credential has no secret. The task of that
/// item fails; the daemon and the other tenants go on. Fix the token file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantSecretError {
    /// A bug in the caller: a plain credential has no tenants.
    #[error("the credential is not a template")]
    NotATemplate,
    /// The value cannot name a file (empty, `.`, `..`, a `/`, a control
    /// character): fix the fan-out data.
    #[error(
        "the value cannot name a token file (empty, '.', '..', '/', '\\' or a control character)"
    )]
    BadValue,
    /// The token file is missing or unreadable: create it.
    #[error("cannot read {}: {why}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        why: String,
    },
    /// The token file is empty: write the token into it.
    #[error("{} is empty", .0.display())]
    Empty(PathBuf),
}

/// Where a secret is read from.
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// An environment variable.
    Env {
        /// The variable's name.
        var: String,
        /// Where the config names it.
        at: Location,
    },
    /// A file (e.g. a systemd credential); a trailing newline is dropped.
    File {
        /// The file, `$VARS` expanded, relative to the config directory.
        path: PathBuf,
        /// Where the config names it.
        at: Location,
    },
    /// A command that prints the secret (`secret_command`): a token that
    /// expires, minted by the daemon at first use and again after `ttl`
    /// or a 401 (`crate::mint`). Never read with the other secrets.
    Command {
        /// Program and arguments, `$VARS` expanded; a program with a `/`
        /// relative to the config directory, one without looked up in
        /// `PATH`. A template's holds its placeholder.
        argv: Vec<String>,
        /// `secret_ttl`.
        ttl: Duration,
        /// Where the config names it.
        at: Location,
    },
}

/// A secret value. It never displays, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself: only for building a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// The secrets of every credential, by credential name.
pub type Secrets = HashMap<String, Secret>;

/// A quota window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// At most this many units...
    pub units: NonZeroU64,
    /// ...per this period (zero for a concurrent window: it has none).
    pub per: Duration,
    /// Trailing (sliding), calendar-aligned (fixed) or a leaky bucket.
    pub kind: WindowKind,
    /// `upstream = true`: it mirrors the upstream's own limit, so every
    /// answer that reports what the upstream has left resyncs it (drift).
    pub upstream: bool,
    /// The upstream resource it belongs to and mirrors (GitHub's `search`,
    /// an IETF limit's name); `None`: its credential's default resource
    /// ([`Credential::default_resource`]). A credential's window is spent
    /// by the endpoints of its resource; an endpoint's own window (whose
    /// resource is the endpoint's unless it names one) only says which
    /// limit it mirrors.
    pub resource: Option<String>,
    /// A credential's concurrent window that names no resource: it caps
    /// the requests in flight on the token whatever resource each counts
    /// against (GitHub's 100 concurrent requests are the token's, not
    /// `core`'s), so every endpoint of the credential spends it. Its keys
    /// are the default resource's.
    pub every_resource: bool,
    /// `mode = "shadow"`: evaluated and recorded with the others, never
    /// refusing; a spend it alone would refuse is admitted and counted as
    /// its shadow refusal (SPEC Part 4, "Shadow windows").
    pub mode: WindowMode,
    /// Its keys carry its units: an earlier window of its list has its
    /// resource, kind and period (a shadow window trying another number of
    /// units for the same limit). Set by the list, not the mode, so that a
    /// change of `mode` keeps the window's keys and state.
    pub keyed_by_units: bool,
}

/// Whether a window refuses what it would not admit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WindowMode {
    /// `"enforce"` (the default): it refuses.
    #[default]
    Enforce,
    /// `"shadow"`: it only records and counts what it would have refused.
    Shadow,
}

/// How a window's period is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowKind {
    /// Any trailing `per` (exact).
    Sliding,
    /// Calendar periods starting at `reset` (local time of day) in `timezone`.
    Fixed {
        /// Offset of the reset from local midnight.
        reset: Duration,
        /// The time zone the reset is in.
        timezone: Tz,
    },
    /// A leaky bucket (GCRA): at most `units` at once, refilled continuously
    /// at `units / per`.
    Bucket,
    /// At most `units` (weighted by cost) in flight at once: a spend takes a
    /// lease that its settle returns, or that lapses after `lease` (none
    /// written: the spending endpoint's `timeout` + [`LEASE_SLACK`]).
    Concurrent {
        /// How long a lease lasts when nothing returns it.
        lease: Option<Duration>,
    },
}

/// What a concurrent window's lease lasts beyond the endpoint's `timeout`
/// when the window names no `lease`: a request's answer is read (and its
/// lease returned) within the timeout, so a lease still held after it
/// belongs to a process that died.
pub const LEASE_SLACK: Duration = Duration::from_secs(5);

impl Window {
    /// Whether it is a shadow window (`mode = "shadow"`).
    pub fn is_shadow(&self) -> bool {
        self.mode == WindowMode::Shadow
    }

    /// "9500/24h", "100/1h fixed at 00:00 America/Los_Angeles", "8 in flight".
    pub fn describe(&self) -> String {
        let base = format!("{}/{}", self.units, fmt_duration(self.per));
        match &self.kind {
            WindowKind::Sliding => base,
            WindowKind::Bucket => format!("{base} bucket"),
            WindowKind::Concurrent { lease: None } => format!("{} in flight", self.units),
            WindowKind::Concurrent { lease: Some(l) } => {
                format!("{} in flight (lease {})", self.units, fmt_duration(*l))
            }
            WindowKind::Fixed { reset, timezone } => {
                let s = reset.as_secs();
                format!(
                    "{base} fixed, resets {:02}:{:02} {timezone}",
                    s / 3600,
                    s / 60 % 60
                )
            }
        }
    }

    /// "sliding", "fixed", "bucket" or "concurrent".
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            WindowKind::Sliding => "sliding",
            WindowKind::Fixed { .. } => "fixed",
            WindowKind::Bucket => "bucket",
            WindowKind::Concurrent { .. } => "concurrent",
        }
    }

    /// Whether a credential's window is spent by the endpoints of
    /// `resource` (`None`: the default one).
    pub fn serves(&self, resource: Option<&str>) -> bool {
        self.every_resource || self.resource.as_deref() == resource
    }

    /// Whether it counts requests in flight rather than units per period.
    pub fn is_concurrent(&self) -> bool {
        matches!(self.kind, WindowKind::Concurrent { .. })
    }

    /// A concurrent window's lease for a spend by `endpoint`: its own
    /// `lease`, else the endpoint's `timeout` + [`LEASE_SLACK`]. `None`
    /// for the other kinds.
    pub fn lease_for(&self, endpoint: &Endpoint) -> Option<Duration> {
        match self.kind {
            WindowKind::Concurrent { lease } => {
                Some(lease.unwrap_or(endpoint.timeout + LEASE_SLACK))
            }
            _ => None,
        }
    }

    /// The units a spend with `reserve` may take: all of them less the
    /// reserve's share, rounded so that at least that share stays free.
    pub fn admits(&self, reserve: Reserve) -> u64 {
        let u = self.units.get();
        let p = u64::from(reserve.percent());
        u - (u / 100 * p + (u % 100 * p).div_ceil(100))
    }
}

/// A job's priority reserve (`reserve = "20%"`): its spends are admitted only
/// while every window they touch keeps at least this share of its units free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Reserve(u8);

impl Reserve {
    /// No reserve: the whole window may be spent.
    pub const NONE: Reserve = Reserve(0);

    /// A reserve of `percent` (0–99).
    pub fn new(percent: u8) -> Option<Self> {
        (percent <= 99).then_some(Reserve(percent))
    }

    /// The share kept free, in percent.
    pub fn percent(self) -> u8 {
        self.0
    }
}

impl FromStr for Reserve {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid reserve {s:?}: write a whole percent from \"0%\" to \"99%\"");
        let n = s.trim().strip_suffix('%').ok_or_else(bad)?;
        n.trim()
            .parse::<u8>()
            .ok()
            .and_then(Reserve::new)
            .ok_or_else(bad)
    }
}

impl fmt::Display for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0)
    }
}

/// What a spend does when Redis cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimiterUnavailable {
    /// Reject (the default): never risk the upstream's quota.
    FailClosed,
    /// Allow, and log a warning: for cheap calls that must not stop.
    FailOpen,
}

/// An upstream operation with a cost.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Its name.
    pub name: String,
    /// The credential it is charged to.
    pub credential: String,
    /// Units per request.
    pub cost: NonZeroU64,
    /// Redis unreachable: reject or allow.
    pub limiter_unavailable: LimiterUnavailable,
    /// Windows of its own, checked in the same spend as the credential's.
    pub windows: Vec<Window>,
    /// Whether its spends also count against the credential's windows
    /// (`charge_credential`, default true). When false only its own
    /// `windows` count (a bucket of its own, as YouTube's `search.list`
    /// has); the credential's block still applies.
    pub charge_credential: bool,
    /// Request timeout.
    pub timeout: Duration,
    /// How long to block the credential when the upstream throttles without
    /// saying for how long.
    pub throttle_block: Duration,
    /// 403 error reasons that mean "quota" (YouTube's `quotaExceeded`, ...).
    pub quota_reasons: Vec<String>,
    /// Response headers carrying the upstream's own remaining quota and reset.
    pub ratelimit_headers: Option<RatelimitHeaders>,
    /// A response header carrying the request's actual cost in units.
    pub cost_header: Option<String>,
    /// The largest response body read, in bytes; a larger one ends the task
    /// `failed` (its units kept: the upstream answered).
    pub max_body: u64,
    /// The most records one page may hold (where the job's `sink.records`
    /// points); a page with more ends the task `failed`, nothing written.
    /// With `max_body`, it bounds what one page can make the sink write.
    pub max_records: u64,
    /// The longest the upstream may block the credential for (Retry-After,
    /// ratelimit reset); longer values are clamped to it and logged.
    pub max_block: Duration,
    /// Conditional requests: page 1 of each item's run sends the
    /// `If-None-Match` / `If-Modified-Since` of the item's last complete run,
    /// and a `304` ends the run `done` with nothing written.
    pub conditional: bool,
    /// What a `304` is settled to, in units (`cost` unless given; GitHub: 0).
    pub not_modified_cost: u64,
    /// How the upstream reports its own accounting (`accounting = "github"`,
    /// ...); `None`: only `ratelimit_headers`, `cost_header`, 429s and
    /// `quota_reasons`.
    pub accounting: Option<Accounting>,
    /// The upstream resource its requests count against (GitHub's `core`,
    /// `search`, `graphql`); `None`: its credential's default resource. It
    /// spends from the credential's windows of this resource, and its
    /// answers resync and block this resource unless they name another.
    pub resource: Option<String>,
    /// The shortest block an answer that says "wait" makes (`Retry-After:
    /// 0`, a reset already past), doubled for each throttle answer in a row
    /// on the same resource.
    pub min_block: Duration,
    /// The longest a doubled `min_block` grows.
    pub throttle_block_max: Duration,
}

/// `accounting` on an endpoint: which upstream's own quota reports it
/// reads (`crate::accounting` has one module each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accounting {
    /// `RateLimit-Policy` / `RateLimit` structured fields
    /// (draft-ietf-httpapi-ratelimit-headers).
    Ietf,
    /// GitHub REST: `x-ratelimit-*`, primary and secondary rate limits.
    Github,
    /// GitHub GraphQL: points, `data.rateLimit`, `RATE_LIMITED`.
    GithubGraphql,
    /// Shopify GraphQL Admin API: the `extensions.cost` of every answer.
    ShopifyGraphql,
    /// Meta Graph API (Facebook, Instagram): `X-App-Usage` and
    /// `X-Business-Use-Case-Usage` percentages.
    Meta {
        /// The percentage (1–100) at which the credential is blocked.
        throttle_at: u8,
    },
}

impl Accounting {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Accounting::Ietf => "ietf",
            Accounting::Github => "github",
            Accounting::GithubGraphql => "github-graphql",
            Accounting::ShopifyGraphql => "shopify-graphql",
            Accounting::Meta { .. } => "meta",
        }
    }
}

/// Headers like GitHub's `x-ratelimit-remaining` / `x-ratelimit-reset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatelimitHeaders {
    /// Header with the units the upstream has left.
    pub remaining: String,
    /// Header with when it resets.
    pub reset: String,
    /// Whether `reset` is a Unix time or seconds from now.
    pub reset_is: ResetIs,
}

/// The meaning of a reset header's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetIs {
    /// Seconds since the Unix epoch (GitHub).
    EpochSeconds,
    /// Seconds from now.
    DeltaSeconds,
}

/// What a task does when a spend is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnQuotaExhausted {
    /// End now; the next tick resumes at the kept cursor.
    Stop,
    /// End now and re-queue the task to run at the retry-after.
    Defer,
}

/// When a job fires by itself.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// A cron expression, seconds first (boxed: it is large, and a job
    /// is read far more often than built).
    Cron(Box<cron::Schedule>),
    /// `schedule = "manual"`: never by itself; `quota-worker trigger` runs it.
    Manual,
}

impl Schedule {
    /// What `schedule` says for a job that only `trigger` runs.
    pub const MANUAL: &'static str = "manual";

    /// The cron schedule; `None` for a manual job.
    pub fn cron(&self) -> Option<&cron::Schedule> {
        match self {
            Schedule::Cron(c) => Some(c),
            Schedule::Manual => None,
        }
    }

    /// Whether only `trigger` runs the job.
    pub fn is_manual(&self) -> bool {
        matches!(self, Schedule::Manual)
    }
}

/// As written: the cron expression, or "manual".
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Cron(c) => f.write_str(c.source()),
            Schedule::Manual => f.write_str(Self::MANUAL),
        }
    }
}

/// A scheduled ingestion.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its name.
    pub name: String,
    /// The file it is defined in.
    pub file: PathBuf,
    /// When it fires by itself: a cron schedule, or never (`"manual"`).
    pub schedule: Schedule,
    /// The time zone the schedule is read in.
    pub timezone: Tz,
    /// The endpoint each request spends from.
    pub endpoint: String,
    /// Fan-out keys and their values; a tick is one task per combination.
    pub fan_out: Vec<(String, Vec<String>)>,
    /// `[job.fan_out_from]`: items read from data at every tick, combined
    /// with `fan_out` as a cartesian product.
    pub fan_out_from: Option<FanOutFrom>,
    /// Stop or defer on a rejected spend.
    pub on_quota_exhausted: OnQuotaExhausted,
    /// The request template.
    pub request: RequestTemplate,
    /// Pagination, if the endpoint pages.
    pub pagination: Option<Pagination>,
    /// Where records go.
    pub sink: SinkConfig,
    /// Retries of real failures.
    pub retry: Retry,
    /// The share of every window its spends leave free (`reserve = "20%"`).
    pub reserve: Reserve,
    /// `{since}` before the item's first run that ended `done`: now minus this.
    pub since_initial: Duration,
}

impl Job {
    /// Whether a task the quota stopped is sent again to run at its
    /// retry-after (`on_quota_exhausted = "defer"`).
    pub fn defers(&self) -> bool {
        self.on_quota_exhausted == OnQuotaExhausted::Defer
    }

    /// Number of tasks per tick: the product of the fan-out list lengths,
    /// times the rows of `fan_out_from` (as last counted, else `max_items`:
    /// the most a tick can fan out).
    pub fn items(&self) -> u64 {
        let rows = self
            .fan_out_from
            .as_ref()
            .map_or(1, |f| f.rows.unwrap_or(f.max_items.get()));
        self.combinations().saturating_mul(rows)
    }

    /// Combinations of the static `fan_out` lists (1 without any).
    pub fn combinations(&self) -> u64 {
        self.fan_out
            .iter()
            .map(|(_, v)| v.len() as u64)
            .fold(1, u64::saturating_mul)
    }

    /// Pages fetched per task at most.
    pub fn max_pages(&self) -> u32 {
        self.pagination.as_ref().map_or(1, |p| p.max_pages.get())
    }
}

/// One fan-out item: placeholder name → value (`[("region", "US")]`), a
/// `fan_out_from` row's columns first. A task carries one
/// (`queue::TaskArgs::item`); it fills the job's request and sink
/// templates.
pub type Item = Vec<(String, String)>;

/// `[job.fan_out_from]`: where a job's items come from at every tick.
#[derive(Debug, Clone)]
pub struct FanOutFrom {
    /// The file, and for SQLite the query.
    pub source: DataSource,
    /// The placeholders each row fills, in column order: the CSV header or
    /// the query's result columns, as read at load (or as declared with
    /// `columns` when the source did not exist yet).
    pub columns: Vec<String>,
    /// More rows than this and a tick fans out nothing.
    pub max_items: NonZeroU64,
    /// The rows counted when the source was last read (`check` fills it in
    /// for its report); `None`: not counted.
    pub rows: Option<u64>,
}

/// A `fan_out_from` source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// `csv = "channels.csv"`: the header row names the columns.
    Csv {
        /// Resolved against the config file's directory.
        path: PathBuf,
    },
    /// `sqlite = "…db"` with one read-only `query`.
    Sqlite {
        /// Resolved against the config file's directory.
        path: PathBuf,
        /// One read-only statement.
        query: String,
    },
    /// `postgres = "postgres://…"` with one read-only `query`, run in a
    /// read-only transaction.
    Postgres {
        /// The server (boxed: it is much larger than a path).
        target: Box<PgTarget>,
        /// One read-only statement.
        query: String,
    },
}

impl DataSource {
    /// What errors name it by: the file, or the server's URL.
    pub fn path(&self) -> &Path {
        match self {
            DataSource::Csv { path } | DataSource::Sqlite { path, .. } => path,
            DataSource::Postgres { target, .. } => Path::new(&target.url),
        }
    }
}

/// An HTTP method the request template may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
}

impl Method {
    /// As written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// `[job.request]`.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// Method.
    pub method: Method,
    /// URL template.
    pub url: Template,
    /// Query parameters (values are templates).
    pub query: Vec<(String, Template)>,
    /// Headers (values are templates).
    pub headers: Vec<(String, Template)>,
    /// Body template.
    pub body: Option<Template>,
    /// Whether `body` is JSON (a JSON `Content-Type`, or a body that
    /// starts with `{` or `[`): each placeholder's value goes in
    /// JSON-string-escaped, so no value changes the JSON's structure.
    pub body_is_json: bool,
    /// `graphql = { query, variables }` (instead of `body`): the body is
    /// built by a JSON encoder, `{"query": ..., "variables": {...}}`.
    pub graphql: Option<Graphql>,
}

/// `[job.request] graphql`: a GraphQL query and its variables.
#[derive(Debug, Clone)]
pub struct Graphql {
    /// The query, sent as written: it holds no placeholders (values go in
    /// as variables, so none can change the query's structure).
    pub query: String,
    /// The variables, in config order.
    pub variables: Vec<(String, Variable)>,
}

/// One GraphQL variable's value.
#[derive(Debug, Clone)]
pub enum Variable {
    /// Exactly `"{cursor}"`: `null` on a run's first page, the cursor (a
    /// JSON string) after it.
    Cursor,
    /// A template, rendered with the usual placeholders and sent as a JSON
    /// string.
    Text(Template),
}

/// `[job.pagination]`.
#[derive(Debug, Clone)]
pub struct Pagination {
    /// Where the next page is.
    pub style: PageStyle,
    /// Pages per run, a resumed run included.
    pub max_pages: NonZeroU32,
    /// `continue`: a run that stops at `max_pages` with pages left leaves a
    /// checkpoint, and the item's next run goes on from there instead of
    /// starting again at page 1.
    pub continues: bool,
    /// `more` or `last`: a flag in the answer that says whether another
    /// page follows (any style); the run ends on it without requesting one
    /// more page.
    pub flag: Option<PageFlag>,
}

impl Pagination {
    /// Whether its pages carry a cursor (`style = "cursor"`): the one
    /// pagination that gives `{cursor}` a value.
    pub fn has_cursor(&self) -> bool {
        matches!(self.style, PageStyle::Cursor { .. })
    }
}

/// `[job.pagination] more` / `last`: where the answer says whether another
/// page follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageFlag {
    /// `more = "/pointer"`: `true` there means another page follows;
    /// `false`, `null` or nothing ends the run (GraphQL's
    /// `pageInfo.hasNextPage`, Stripe's and Notion's `has_more`).
    More(String),
    /// `last = "/pointer"`: `true` there ends the run (Jira's `isLast`).
    Last(String),
}

/// Where a `style = "cursor"` answer's cursor is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CursorAt {
    /// `cursor = "/pointer"`: at this JSON pointer in the answer.
    Answer(String),
    /// `cursor_record = "/pointer"`: at this JSON pointer inside the
    /// page's last record (Stripe's `starting_after`); an empty records
    /// array ends the run.
    LastRecord(String),
}

/// `[job.pagination] style` and the fields that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageStyle {
    /// `"cursor"`: the string or number at `cursor` (a JSON pointer), or
    /// at `cursor_record` in the page's last record, is sent as the query
    /// parameter `param` and is the value of `{cursor}`.
    Cursor {
        /// Where the next page's cursor is in a response.
        cursor: CursorAt,
        /// Query parameter that carries it (none: the request places it
        /// with `{cursor}`).
        param: Option<String>,
    },
    /// `"next_url"`: the URL at `next` (a JSON pointer) replaces the request's
    /// URL and query.
    NextUrl {
        /// JSON pointer to the next page's URL in a response.
        next: String,
    },
    /// `"link"`: the `Link` header's `rel="next"` target replaces the
    /// request's URL and query (RFC 8288).
    Link,
    /// `"page"`: `param` = `start`, `start + step`, ...; the first page whose
    /// records array is empty is the last.
    Page {
        /// Query parameter that carries the number.
        param: String,
        /// The first page's number (or offset).
        start: u64,
        /// What each page adds to it.
        step: u64,
    },
}

/// `[job.sink]`.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// jsonl, sqlite or postgres.
    pub kind: SinkKind,
    /// Path template, relative to the config directory (empty for a
    /// postgres sink, which has none).
    pub path: Template,
    /// Where `path` (`url` for postgres) is written, for errors found at
    /// start (an unwritable sink directory, a table of other columns).
    pub at: Location,
    /// postgres: the server and the table.
    pub postgres: Option<PgSink>,
    /// JSON pointer to the array of records ("" = the whole body).
    pub records: String,
    /// sqlite, postgres: JSON pointers of the fields the full-text index
    /// covers.
    pub search: Vec<String>,
    /// sqlite, postgres: JSON pointer of a record's unique id (re-fetches
    /// replace it).
    pub key: Option<String>,
}

/// Sink kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// One JSON object per line.
    Jsonl,
    /// SQLite with an FTS5 index.
    Sqlite,
    /// A PostgreSQL table, with a `tsvector` column for `search`.
    Postgres,
}

/// A postgres sink's server and table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgSink {
    /// The server.
    pub target: PgTarget,
    /// The table: `[name]` or `[schema, name]`, each quoted as written
    /// (the job's name when `table` is not written).
    pub table: Vec<String>,
}

impl PgSink {
    /// The table as SQL: each part a quoted identifier.
    pub fn table_sql(&self) -> String {
        let quoted: Vec<String> = self
            .table
            .iter()
            .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
            .collect();
        quoted.join(".")
    }

    /// The table as written (`ingest.trending`).
    pub fn table_name(&self) -> String {
        self.table.join(".")
    }
}

/// Bounded retries with exponential backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all (the first included).
    pub attempts: NonZeroU32,
    /// Wait before the first retry; doubles each time.
    pub backoff: Duration,
    /// Cap on the wait.
    pub max_backoff: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: defaults::RETRY_ATTEMPTS,
            backoff: defaults::RETRY_BACKOFF,
            max_backoff: defaults::RETRY_MAX_BACKOFF,
        }
    }
}

impl Retry {
    /// The wait before retry number `failures` (1 = first retry).
    pub fn backoff_for(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// How the environment is read: the process's, or a test's.
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Reads the process environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Config {
    /// Loads and validates `path` and its job files, reading the process
    /// environment for overrides.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Self::load_with_env(path, &process_env)
    }

    /// Like [`Config::load`] with an explicit environment.
    pub fn load_with_env(path: &Path, env: EnvLookup<'_>) -> Result<Config, ConfigErrors> {
        Loader::new(env).load(path)
    }

    /// Reads every credential's secret. Errors name the `secret_env` /
    /// `secret_file` field; the secret itself never appears in them.
    pub fn secrets(&self) -> Result<Secrets, ConfigErrors> {
        self.secrets_with_env(&process_env)
    }

    /// Like [`Config::secrets`] with an explicit environment.
    pub fn secrets_with_env(&self, env: EnvLookup<'_>) -> Result<Secrets, ConfigErrors> {
        let mut out = Secrets::new();
        let mut errors = Vec::new();
        for cred in self.credentials.values() {
            // A command's secret is minted when a task first needs it; here
            // its program is only checked (it exists and may run).
            if let SecretSource::Command { argv, at, .. } = &cred.secret {
                if let Err(why) = load::check_program(&argv[0], env) {
                    errors.push(at.error(format!("secret_command: {why}")));
                }
                continue;
            }
            // A template's secrets are read per task, one tenant at a time.
            if cred.template.is_some() {
                continue;
            }
            match read_secret(&cred.secret, env) {
                Ok(s) => {
                    out.insert(cred.name.clone(), s);
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Every window a spend on `endpoint` checks, numbered as the spend script
    /// numbers them: the credential's first (none when the endpoint has
    /// `charge_credential = false`), then the endpoint's own.
    /// Of the credential's windows, only those of the endpoint's resource.
    pub fn windows_of<'a>(&'a self, endpoint: &'a Endpoint) -> Vec<(Scope, &'a Window)> {
        let cred = &self.credentials[&endpoint.credential];
        let charged: &[Window] = if endpoint.charge_credential {
            &cred.windows
        } else {
            &[]
        };
        charged
            .iter()
            .filter(|w| w.serves(endpoint.resource.as_deref()))
            .map(|w| (Scope::Credential, w))
            .chain(
                endpoint
                    .windows
                    .iter()
                    .map(|w| (Scope::Endpoint(endpoint.name.clone()), w)),
            )
            .collect()
    }
}

/// Whether `name` can name a resource: 1 to 64 of `a-z`, `0-9`, `_`, `-`,
/// `.` (GitHub's `core`, `code_search`; it is part of Redis keys and a
/// metric label).
pub fn resource_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && (name.bytes())
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b))
}

/// Whose window it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The credential's: every endpoint charged to it counts.
    Credential,
    /// One endpoint's own.
    Endpoint(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Credential => f.write_str("credential"),
            Scope::Endpoint(e) => write!(f, "endpoint:{e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_never_prints() {
        assert!(!format!("{:?}", Secret::new("AIzaXYZ")).contains("AIza"));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let r = Retry {
            attempts: NonZeroU32::new(5).unwrap(),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
        };
        let waits: Vec<_> = (1..=5).map(|n| r.backoff_for(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
    }
}
