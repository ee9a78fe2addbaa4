//! The configuration: `config/quota-worker.toml` plus the job files its `jobs`
//! glob names, parsed, validated and immutable.
//!
//! Everything is checked here, before anything touches Redis: a cost no window
//! can hold, an unknown endpoint or credential, a bad cron expression, a
//! placeholder with no value. Every error names the file, line, column and
//! field ([`ConfigError`]); the binary exits 78 on them. Secrets are resolved
//! separately ([`Config::secrets`]) because only the commands that send
//! requests need them.

mod error;
mod raw;
mod template;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use chrono_tz::Tz;
use indexmap::IndexMap;

pub use error::{ConfigError, ConfigErrors, FieldPath, Seg, Source};
pub use template::{Expansion, Template, TemplateError};

use raw::{RawConfig, RawEndpoint, RawJob, RawWindow};

/// Environment variable naming the config file when `-c` is not given.
pub const CONFIG_ENV: &str = "QUOTA_WORKER_CONFIG";
/// Overrides `[redis] url`.
pub const REDIS_URL_ENV: &str = "QUOTA_WORKER_REDIS_URL";
/// Overrides `[metrics] listen`.
pub const METRICS_LISTEN_ENV: &str = "QUOTA_WORKER_METRICS_LISTEN";
/// The default config path, relative to the working directory.
pub const DEFAULT_CONFIG: &str = "config/quota-worker.toml";

const DAY: Duration = Duration::from_secs(86_400);

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
}

/// `[redis]`.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// `None`: the daemon starts an embedded `redis-server` itself.
    pub url: Option<RedisUrl>,
    /// Every key the product writes starts with it.
    pub key_prefix: String,
    /// How long a spend waits for Redis before the endpoint's
    /// `limiter_unavailable` policy decides.
    pub timeout: Duration,
    /// What `run` does on a Redis whose `maxmemory-policy` may evict keys.
    pub unsafe_eviction: UnsafeEviction,
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

/// A Redis URL. It may hold a password, so it only displays redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL itself, password included: only for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        RedisUrl(url.into())
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // redis://user:password@host → redis://user:***@host
        match (self.0.find("://"), self.0.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let userinfo = &self.0[scheme + 3..at];
                let user = userinfo.split(':').next().unwrap_or("");
                write!(f, "{}{}:***{}", &self.0[..scheme + 3], user, &self.0[at..])
            }
            _ => f.write_str(&self.0),
        }
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
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
    /// How often an idle worker looks for new tasks.
    pub poll_interval: Duration,
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

impl FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!(
                "unknown log format {s:?}: use \"text\" or \"json\""
            )),
        }
    }
}

/// Where a field was written, to position errors found after loading.
#[derive(Debug, Clone)]
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
    /// ...per this period.
    pub per: Duration,
    /// Trailing (sliding) or calendar-aligned (fixed).
    pub kind: WindowKind,
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
}

impl Window {
    /// "9500/24h", "100/1h fixed at 00:00 America/Los_Angeles".
    pub fn describe(&self) -> String {
        let base = format!("{}/{}", self.units, fmt_duration(self.per));
        match &self.kind {
            WindowKind::Sliding => base,
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

    /// "sliding" or "fixed".
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            WindowKind::Sliding => "sliding",
            WindowKind::Fixed { .. } => "fixed",
        }
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
    /// The longest the upstream may block the credential for (Retry-After,
    /// ratelimit reset); longer values are clamped to it and logged.
    pub max_block: Duration,
}

impl Endpoint {
    /// `max_body` when not configured: 16 MiB.
    pub const DEFAULT_MAX_BODY: u64 = 16 * 1024 * 1024;
    /// `max_block` when not configured: a day.
    pub const DEFAULT_MAX_BLOCK: Duration = DAY;
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

/// A scheduled ingestion.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its name.
    pub name: String,
    /// The file it is defined in.
    pub file: PathBuf,
    /// Its cron schedule (seconds first).
    pub schedule: cron::Schedule,
    /// The time zone the schedule is read in.
    pub timezone: Tz,
    /// The endpoint each request spends from.
    pub endpoint: String,
    /// Fan-out keys and their values; a tick is one task per combination.
    pub fan_out: Vec<(String, Vec<String>)>,
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
}

impl Job {
    /// Number of tasks per tick: the product of the fan-out list lengths.
    pub fn items(&self) -> u64 {
        self.fan_out.iter().map(|(_, v)| v.len() as u64).product()
    }

    /// Pages fetched per task at most.
    pub fn max_pages(&self) -> u32 {
        self.pagination.as_ref().map_or(1, |p| p.max_pages.get())
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
}

/// `[job.pagination]`.
#[derive(Debug, Clone)]
pub struct Pagination {
    /// JSON pointer to the next-page cursor in a response.
    pub cursor: String,
    /// Query parameter that carries the cursor.
    pub param: String,
    /// Pages per run, a resumed run included.
    pub max_pages: NonZeroU32,
}

/// `[job.sink]`.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// jsonl or sqlite.
    pub kind: SinkKind,
    /// Path template, relative to the config directory.
    pub path: Template,
    /// JSON pointer to the array of records ("" = the whole body).
    pub records: String,
    /// sqlite: JSON pointers of the fields the full-text index covers.
    pub search: Vec<String>,
    /// sqlite: JSON pointer of a record's unique id (re-fetches replace it).
    pub key: Option<String>,
}

/// Sink kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// One JSON object per line.
    Jsonl,
    /// SQLite with an FTS5 index.
    Sqlite,
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
            attempts: NonZeroU32::new(5).expect("5 > 0"),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
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
    /// numbers them: the credential's first, then the endpoint's own.
    pub fn windows_of<'a>(&'a self, endpoint: &'a Endpoint) -> Vec<(Scope, &'a Window)> {
        let cred = &self.credentials[&endpoint.credential];
        cred.windows
            .iter()
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

fn read_secret(source: &SecretSource, env: EnvLookup<'_>) -> Result<Secret, ConfigError> {
    match source {
        SecretSource::Env { var, at } => match env(var) {
            Some(v) if !v.is_empty() => Ok(Secret(v)),
            Some(_) => Err(at.error(format!("environment variable {var} is empty"))),
            None => Err(at.error(format!("environment variable {var} is not set"))),
        },
        SecretSource::File { path, at } => match std::fs::read_to_string(path) {
            Ok(v) => {
                let v = v.trim_end_matches(['\n', '\r']);
                if v.is_empty() {
                    Err(at.error(format!("secret file {} is empty", path.display())))
                } else {
                    Ok(Secret(v.to_owned()))
                }
            }
            Err(e) => Err(at.error(format!("cannot read secret file {}: {e}", path.display()))),
        },
    }
}

/// A duration as an operator writes it: "24h", "1m", "1h 30m", "500ms".
pub fn fmt_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    if d < Duration::from_secs(60) && d.subsec_millis() != 0 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let mut s = d.as_secs();
    let mut out = String::new();
    // Days only from two on: "24h" reads as the config wrote it.
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if s >= len && (unit != "d" || s >= 2 * len) {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    out
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

const NAME_RULE: &str =
    "names may use letters, digits, '.', '_' and '-' (they become parts of Redis keys)";

/// Expands `$VAR`, `${VAR}` and `${VAR:-default}` (default when unset or
/// empty), for `$CREDENTIALS_DIRECTORY` and `$STATE_DIRECTORY` under systemd.
fn expand_vars(s: &str, env: EnvLookup<'_>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, default, tail) = if let Some(inner) = after.strip_prefix('{') {
            let end = inner
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
            let body = &inner[..end];
            match body.split_once(":-") {
                Some((name, default)) => (name, Some(default), &inner[end + 1..]),
                None => (body, None, &inner[end + 1..]),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], None, &after[end..])
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad variable name {name:?} in {s:?}"));
        }
        let v = match (env(name).filter(|v| !v.is_empty()), default) {
            (Some(v), _) => v,
            (None, Some(d)) => d.to_owned(),
            (None, None) => return Err(format!("environment variable {name} is not set")),
        };
        out.push_str(&v);
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn parse_reset(s: &str) -> Option<Duration> {
    let mut it = s.split(':');
    let h: u64 = it.next()?.parse().ok()?;
    let m: u64 = it.next()?.parse().ok()?;
    let sec: u64 = it.next().map_or(Some(0), |x| x.parse().ok())?;
    if it.next().is_some() || h > 23 || m > 59 || sec > 59 {
        return None;
    }
    Some(Duration::from_secs(h * 3600 + m * 60 + sec))
}

/// A JSON pointer as RFC 6901 spells it ("" or starting with '/').
fn valid_pointer(p: &str) -> bool {
    p.is_empty() || p.starts_with('/')
}

/// Collects every error of one load.
struct Loader<'a> {
    env: EnvLookup<'a>,
    errors: Vec<ConfigError>,
    /// Endpoints that are defined but invalid (already reported): a job
    /// naming one is not told the endpoint is unknown.
    invalid_endpoints: BTreeSet<String>,
}

impl<'a> Loader<'a> {
    fn new(env: EnvLookup<'a>) -> Self {
        Loader {
            env,
            errors: Vec::new(),
            invalid_endpoints: BTreeSet::new(),
        }
    }

    fn read(path: &Path) -> Result<Source, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Source::file_error(path, format!("cannot read: {e}")))?;
        Ok(Source::new(path, text))
    }

    fn load(mut self, path: &Path) -> Result<Config, ConfigErrors> {
        let src = Self::read(path)?;
        let raw: RawConfig = toml::from_str(src.text()).map_err(|e| src.from_toml(&e))?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_owned();
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        let p = |segs: &[&str]| FieldPath::new(segs.iter().copied());

        // [redis]
        let url = match (self.env)(REDIS_URL_ENV) {
            Some(u) if !u.is_empty() => Some(RedisUrl(u)),
            _ => raw.redis.url.clone().map(RedisUrl),
        };
        if let Some(u) = &url
            && let Err(e) = redis::Client::open(u.expose())
        {
            let field = p(&["redis", "url"]);
            let msg = format!("invalid Redis URL {u}: {:?}", e.kind());
            self.errors.push(src.error(&field, msg));
        }
        let key_prefix = raw.redis.key_prefix.clone().unwrap_or_else(|| "qw".into());
        if !valid_name(&key_prefix) {
            self.errors
                .push(src.error(&p(&["redis", "key_prefix"]), NAME_RULE));
        }
        let unsafe_eviction = match raw.redis.unsafe_eviction.as_deref().unwrap_or("refuse") {
            "refuse" => UnsafeEviction::Refuse,
            "warn" => UnsafeEviction::Warn,
            other => {
                self.errors.push(src.error(
                    &p(&["redis", "unsafe_eviction"]),
                    format!("unknown {other:?}: use \"refuse\" or \"warn\""),
                ));
                UnsafeEviction::Refuse
            }
        };
        let redis = RedisConfig {
            url,
            key_prefix,
            timeout: raw.redis.timeout.map_or(Duration::from_secs(1), |d| d.0),
            unsafe_eviction,
        };
        if redis.timeout.is_zero() {
            self.errors
                .push(src.error(&p(&["redis", "timeout"]), "must be more than 0"));
        }

        // [worker]
        let concurrency = raw.worker.concurrency.unwrap_or(8);
        let concurrency = NonZeroUsize::new(concurrency).unwrap_or_else(|| {
            self.errors
                .push(src.error(&p(&["worker", "concurrency"]), "must be at least 1"));
            NonZeroUsize::MIN
        });
        let worker = WorkerConfig {
            concurrency,
            shutdown_timeout: raw
                .worker
                .shutdown_timeout
                .map_or(Duration::from_secs(30), |d| d.0),
            recover_after: raw
                .worker
                .recover_after
                .map_or(Duration::from_secs(30), |d| d.0),
            poll_interval: raw
                .worker
                .poll_interval
                .map_or(Duration::from_millis(200), |d| d.0),
        };
        if worker.recover_after < Duration::from_secs(3) {
            let field = p(&["worker", "recover_after"]);
            self.errors.push(src.error(
                &field,
                "must be at least 3s (workers heartbeat every third of it)",
            ));
        }
        if worker.poll_interval.is_zero() {
            self.errors
                .push(src.error(&p(&["worker", "poll_interval"]), "must be more than 0"));
        }

        // [metrics]
        let listen = match (self.env)(METRICS_LISTEN_ENV) {
            Some(l) => Some((l, true)),
            None => Some((
                raw.metrics
                    .listen
                    .clone()
                    .unwrap_or_else(|| "127.0.0.1:9464".into()),
                false,
            )),
        };
        let listen = match listen {
            Some((l, _)) if l.is_empty() || l == "off" => None,
            Some((l, from_env)) => match l.parse::<SocketAddr>() {
                Ok(a) => Some(a),
                Err(e) => {
                    let msg = format!(
                        "invalid listen address {l:?}: {e} (write e.g. \"127.0.0.1:9464\", or \"off\")"
                    );
                    if from_env {
                        self.errors.push(Source::file_error(
                            path,
                            format!("{METRICS_LISTEN_ENV}: {msg}"),
                        ));
                    } else {
                        self.errors.push(src.error(&p(&["metrics", "listen"]), msg));
                    }
                    None
                }
            },
            None => None,
        };

        let log_format = raw.log.format.as_deref().and_then(|f| match f.parse() {
            Ok(f) => Some(f),
            Err(e) => {
                self.errors.push(src.error(&p(&["log", "format"]), e));
                None
            }
        });

        // state_dir: the config's, else systemd's $STATE_DIRECTORY, else ./state
        let state_dir = match &raw.state_dir {
            Some(s) => match expand_vars(s, self.env) {
                Ok(s) => dir.join(s),
                Err(e) => {
                    self.errors.push(src.error(&p(&["state_dir"]), e));
                    dir.join("state")
                }
            },
            None => match (self.env)("STATE_DIRECTORY") {
                Some(s) if !s.is_empty() => PathBuf::from(s.split(':').next().unwrap_or(&s)),
                _ => dir.join("state"),
            },
        };

        // credentials
        let mut credentials = IndexMap::new();
        for (name, rc) in &raw.credentials {
            let base = FieldPath::new(["credentials", name.as_str()]);
            if !valid_name(name) {
                self.errors
                    .push(src.error(&base, format!("bad credential name {name:?}: {NAME_RULE}")));
            }
            let secret = match (&rc.secret_env, &rc.secret_file) {
                (Some(var), None) => SecretSource::Env {
                    var: var.clone(),
                    at: Location::of(src.error(&base.join("secret_env"), "")),
                },
                (None, Some(file)) => {
                    let at = Location::of(src.error(&base.join("secret_file"), ""));
                    match expand_vars(file, self.env) {
                        Ok(f) => SecretSource::File {
                            path: dir.join(f),
                            at,
                        },
                        Err(e) => {
                            self.errors.push(at.error(e));
                            SecretSource::File {
                                path: dir.join(file),
                                at,
                            }
                        }
                    }
                }
                (Some(_), Some(_)) => {
                    self.errors.push(src.error(
                        &base.join("secret_file"),
                        "give secret_env or secret_file, not both",
                    ));
                    continue;
                }
                (None, None) => {
                    self.errors.push(src.error(
                        &base,
                        "missing secret: give secret_env = \"VAR\" or secret_file = \"PATH\"",
                    ));
                    continue;
                }
            };
            let windows = self.windows(&src, &base.join("windows"), &rc.windows);
            credentials.insert(
                name.clone(),
                Credential {
                    name: name.clone(),
                    secret,
                    windows,
                },
            );
        }

        // endpoints
        let mut endpoints = IndexMap::new();
        for (name, re) in &raw.endpoints {
            match self.endpoint(&src, name, re, &credentials) {
                Some(e) => {
                    endpoints.insert(name.clone(), e);
                }
                None => {
                    self.invalid_endpoints.insert(name.clone());
                }
            }
        }

        // jobs
        let mut jobs = IndexMap::new();
        if let Some(glob) = &raw.jobs {
            self.jobs(&src, &dir, glob, &endpoints, &mut jobs);
        }

        if !self.errors.is_empty() {
            return Err(ConfigErrors(self.errors));
        }
        Ok(Config {
            path: path.to_owned(),
            dir,
            state_dir,
            redis,
            worker,
            metrics: MetricsConfig { listen },
            log_format,
            credentials,
            endpoints,
            jobs,
        })
    }

    fn windows(&mut self, src: &Source, base: &FieldPath, raw: &[RawWindow]) -> Vec<Window> {
        let mut out: Vec<Window> = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, rw) in raw.iter().enumerate() {
            let at = base.join(i);
            let Some(units) = NonZeroU64::new(rw.units) else {
                self.errors
                    .push(src.error(&at.join("units"), "must be at least 1"));
                continue;
            };
            let per = rw.per.0;
            if per < Duration::from_millis(1) || per > Duration::from_secs(400 * 86_400) {
                self.errors
                    .push(src.error(&at.join("per"), "must be between 1ms and 400 days"));
                continue;
            }
            if per.subsec_nanos() % 1_000_000 != 0 {
                self.errors
                    .push(src.error(&at.join("per"), "must be whole milliseconds"));
                continue;
            }
            let kind = match rw.kind.as_deref().unwrap_or("sliding") {
                "sliding" => {
                    for (field, v) in [("reset", &rw.reset), ("timezone", &rw.timezone)] {
                        if v.is_some() {
                            self.errors.push(src.error(
                                &at.join(field),
                                "only fixed windows reset; add kind = \"fixed\" or remove it",
                            ));
                        }
                    }
                    WindowKind::Sliding
                }
                "fixed" => {
                    if !(DAY.as_millis().is_multiple_of(per.as_millis())
                        || per.as_millis().is_multiple_of(DAY.as_millis()))
                    {
                        self.errors.push(src.error(&at.join("per"), "a fixed window's period must divide a day (\"1h\", \"15m\") or be whole days"));
                    }
                    let reset_src = rw.reset.as_deref().unwrap_or("00:00");
                    let reset = parse_reset(reset_src).unwrap_or_else(|| {
                        self.errors.push(src.error(
                            &at.join("reset"),
                            format!(
                                "invalid reset time {reset_src:?}: write \"HH:MM\" or \"HH:MM:SS\""
                            ),
                        ));
                        Duration::ZERO
                    });
                    let tz_src = rw.timezone.as_deref().unwrap_or("UTC");
                    let timezone = tz_src.parse::<Tz>().unwrap_or_else(|_| {
                        self.errors.push(src.error(&at.join("timezone"), format!("unknown time zone {tz_src:?}: use an IANA name like \"America/Los_Angeles\"")));
                        Tz::UTC
                    });
                    WindowKind::Fixed { reset, timezone }
                }
                other => {
                    self.errors.push(src.error(
                        &at.join("kind"),
                        format!("unknown window kind {other:?}: use \"sliding\" or \"fixed\""),
                    ));
                    continue;
                }
            };
            let w = Window { units, per, kind };
            if !seen.insert((w.kind_name(), per)) {
                self.errors.push(src.error(
                    &at,
                    format!(
                        "two {} windows of {} in one list: merge them",
                        w.kind_name(),
                        fmt_duration(per)
                    ),
                ));
                continue;
            }
            out.push(w);
        }
        out
    }

    fn endpoint(
        &mut self,
        src: &Source,
        name: &str,
        re: &RawEndpoint,
        credentials: &IndexMap<String, Credential>,
    ) -> Option<Endpoint> {
        let base = FieldPath::new(["endpoints", name]);
        if !valid_name(name) {
            self.errors
                .push(src.error(&base, format!("bad endpoint name {name:?}: {NAME_RULE}")));
        }
        let windows = self.windows(src, &base.join("windows"), &re.windows);
        let Some(cred) = credentials.get(&re.credential) else {
            let known: Vec<_> = credentials.keys().map(String::as_str).collect();
            self.errors.push(src.error(
                &base.join("credential"),
                format!(
                    "unknown credential {:?} (known: {})",
                    re.credential,
                    known.join(", ")
                ),
            ));
            return None;
        };
        let Some(cost) = NonZeroU64::new(re.cost) else {
            self.errors
                .push(src.error(&base.join("cost"), "must be at least 1"));
            return None;
        };
        let smallest = cred.windows.iter().chain(&windows).min_by_key(|w| w.units);
        match smallest {
            None => {
                self.errors.push(src.error(
                    &base,
                    format!(
                        "no quota window applies: give credential {:?} or this endpoint `windows`",
                        cred.name
                    ),
                ));
            }
            Some(w) if cost > w.units => {
                self.errors.push(src.error(
                    &base.join("cost"),
                    format!("cost {cost} is more than the smallest window that applies ({}): no request could ever be admitted", w.describe()),
                ));
            }
            Some(_) => {}
        }
        let limiter_unavailable = match re.limiter_unavailable.as_deref().unwrap_or("fail-closed") {
            "fail-closed" => LimiterUnavailable::FailClosed,
            "fail-open" => LimiterUnavailable::FailOpen,
            other => {
                self.errors.push(src.error(
                    &base.join("limiter_unavailable"),
                    format!("unknown policy {other:?}: use \"fail-closed\" or \"fail-open\""),
                ));
                LimiterUnavailable::FailClosed
            }
        };
        let ratelimit_headers = re.ratelimit_headers.as_ref().map(|h| RatelimitHeaders {
            remaining: h.remaining.to_ascii_lowercase(),
            reset: h.reset.to_ascii_lowercase(),
            reset_is: match h.reset_is.as_deref().unwrap_or("epoch-seconds") {
                "epoch-seconds" => ResetIs::EpochSeconds,
                "delta-seconds" => ResetIs::DeltaSeconds,
                other => {
                    self.errors.push(src.error(
                        &base.join("ratelimit_headers").join("reset_is"),
                        format!("unknown {other:?}: use \"epoch-seconds\" or \"delta-seconds\""),
                    ));
                    ResetIs::EpochSeconds
                }
            },
        });
        let max_body = match re.max_body {
            None => Endpoint::DEFAULT_MAX_BODY,
            Some(raw::Size(n)) if n > 0 => n,
            Some(_) => {
                self.errors
                    .push(src.error(&base.join("max_body"), "must be more than 0 bytes"));
                Endpoint::DEFAULT_MAX_BODY
            }
        };
        let throttle_block = re.throttle_block.map_or(Duration::from_secs(60), |d| d.0);
        let max_block = re.max_block.map_or(Endpoint::DEFAULT_MAX_BLOCK, |d| d.0);
        if max_block < Duration::from_secs(1) || max_block > Duration::from_secs(400 * 86_400) {
            self.errors
                .push(src.error(&base.join("max_block"), "must be between 1s and 400 days"));
        } else if throttle_block > max_block {
            self.errors.push(src.error(
                &base.join("throttle_block"),
                format!(
                    "{} is longer than max_block ({}): raise max_block or lower throttle_block",
                    fmt_duration(throttle_block),
                    fmt_duration(max_block)
                ),
            ));
        }
        Some(Endpoint {
            name: name.to_owned(),
            credential: re.credential.clone(),
            cost,
            limiter_unavailable,
            windows,
            timeout: re.timeout.map_or(Duration::from_secs(30), |d| d.0),
            throttle_block,
            max_body,
            max_block,
            quota_reasons: re.quota_reasons.clone().unwrap_or_else(|| {
                [
                    "quotaExceeded",
                    "rateLimitExceeded",
                    "dailyLimitExceeded",
                    "userRateLimitExceeded",
                ]
                .map(String::from)
                .to_vec()
            }),
            ratelimit_headers,
            cost_header: re.cost_header.as_ref().map(|h| h.to_ascii_lowercase()),
        })
    }

    fn jobs(
        &mut self,
        src: &Source,
        dir: &Path,
        pattern: &str,
        endpoints: &IndexMap<String, Endpoint>,
        jobs: &mut IndexMap<String, Job>,
    ) {
        let field = FieldPath::new(["jobs"]);
        let full = dir.join(pattern);
        let paths = match glob::glob(&full.to_string_lossy()) {
            Ok(paths) => paths,
            Err(e) => {
                self.errors
                    .push(src.error(&field, format!("bad glob {pattern:?}: {e}")));
                return;
            }
        };
        let mut files: Vec<PathBuf> = paths
            .filter_map(Result::ok)
            .map(|p| normalize(&p))
            .collect();
        files.sort();
        for file in files {
            let jsrc = match Self::read(&file) {
                Ok(s) => s,
                Err(e) => {
                    self.errors.push(e);
                    continue;
                }
            };
            let raw: IndexMap<String, RawJob> = match toml::from_str(jsrc.text()) {
                Ok(r) => r,
                Err(e) => {
                    self.errors.push(jsrc.from_toml(&e));
                    continue;
                }
            };
            for (name, rj) in raw {
                if let Some(prev) = jobs.get(&name) {
                    let msg = format!("job {name:?} is also defined in {}", prev.file.display());
                    self.errors
                        .push(jsrc.error(&FieldPath::new([name.as_str()]), msg));
                    continue;
                }
                if let Some(job) = self.job(&jsrc, &name, rj, endpoints) {
                    jobs.insert(name, job);
                }
            }
        }
    }

    fn job(
        &mut self,
        src: &Source,
        name: &str,
        rj: RawJob,
        endpoints: &IndexMap<String, Endpoint>,
    ) -> Option<Job> {
        let base = FieldPath::new([name]);
        let errors_before = self.errors.len();
        if !valid_name(name) {
            self.errors
                .push(src.error(&base, format!("bad job name {name:?}: {NAME_RULE}")));
        }
        let schedule = match cron::Schedule::from_str(rj.schedule.trim()) {
            Ok(s) => Some(s),
            Err(e) => {
                self.errors.push(src.error(
                    &base.join("schedule"),
                    format!("bad cron expression {:?}: {e} (six or seven fields, seconds first: \"0 */30 * * * *\")", rj.schedule),
                ));
                None
            }
        };
        let tz_src = rj.timezone.as_deref().unwrap_or("UTC");
        let timezone = tz_src.parse::<Tz>().unwrap_or_else(|_| {
            self.errors.push(src.error(
                &base.join("timezone"),
                format!("unknown time zone {tz_src:?}: use an IANA name like \"Europe/Berlin\""),
            ));
            Tz::UTC
        });
        let endpoint_valid = endpoints.contains_key(&rj.endpoint);
        if !endpoint_valid && !self.invalid_endpoints.contains(&rj.endpoint) {
            let known: Vec<_> = endpoints.keys().map(String::as_str).collect();
            self.errors.push(src.error(
                &base.join("endpoint"),
                format!(
                    "unknown endpoint {:?} (known: {})",
                    rj.endpoint,
                    known.join(", ")
                ),
            ));
        }
        let mut fan_out = Vec::new();
        for (key, values) in rj.fan_out {
            let at = base.join("fan_out").join(key.as_str());
            if !valid_name(&key) || ["secret", "date", "job", "item"].contains(&key.as_str()) {
                self.errors.push(src.error(
                    &at,
                    format!(
                        "bad fan-out key {key:?}: {NAME_RULE}; secret, date, job and item are taken"
                    ),
                ));
            }
            if values.is_empty() {
                self.errors
                    .push(src.error(&at, "an empty list fans out to no tasks at all"));
            }
            // Control characters would reach URLs, headers and log lines.
            if let Some(v) = values
                .iter()
                .find(|v| v.is_empty() || v.chars().any(char::is_control))
            {
                self.errors.push(src.error(
                    &at,
                    format!(
                        "bad value {v:?}: values must be non-empty, without control characters (CR, LF, tab, ESC, ...)"
                    ),
                ));
            }
            fan_out.push((key, values));
        }
        let on_quota_exhausted = match rj.on_quota_exhausted.as_deref().unwrap_or("stop") {
            "stop" => OnQuotaExhausted::Stop,
            "defer" => OnQuotaExhausted::Defer,
            other => {
                self.errors.push(src.error(
                    &base.join("on_quota_exhausted"),
                    format!("unknown {other:?}: use \"stop\" or \"defer\""),
                ));
                OnQuotaExhausted::Stop
            }
        };

        // `$VARS` first (`${STATE_DIRECTORY:-../state}/data/...`), then the
        // `{placeholders}`.
        let sink_src = match expand_vars(&rj.sink.path, self.env) {
            Ok(p) => p,
            Err(e) => {
                self.errors
                    .push(src.error(&base.join("sink").join("path"), e));
                rj.sink.path.clone()
            }
        };
        // Placeholders: fan-out keys, and {job}, {date} everywhere; {secret}
        // only where it goes to the upstream, never into a file name.
        let fan_keys: Vec<&str> = fan_out.iter().map(|(k, _)| k.as_str()).collect();
        let mut template = |at: FieldPath, s: &str, secret_ok: bool| -> Option<Template> {
            match Template::parse(s) {
                Ok(t) => {
                    for ph in t.placeholders() {
                        let known = fan_keys.contains(&ph)
                            || ph == "job"
                            || ph == "date"
                            || (secret_ok && ph == "secret");
                        if !known {
                            let msg = if ph == "secret" {
                                "{secret} may not appear here: it would leak the key into file names".to_owned()
                            } else {
                                let mut have: Vec<String> =
                                    fan_keys.iter().map(|k| format!("{{{k}}}")).collect();
                                have.extend(["{job}", "{date}"].map(String::from));
                                if secret_ok {
                                    have.push("{secret}".into());
                                }
                                format!(
                                    "placeholder {{{ph}}} has no value (available: {})",
                                    have.join(", ")
                                )
                            };
                            self.errors.push(src.error(&at, msg));
                        }
                    }
                    Some(t)
                }
                Err(e) => {
                    self.errors
                        .push(src.error(&at, format!("bad template {s:?}: {e}")));
                    None
                }
            }
        };
        let req = &rj.request;
        let rbase = base.join("request");
        let url = template(rbase.join("url"), &req.url, true);
        let query: Vec<_> = req
            .query
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    k.clone(),
                    template(rbase.join("query").join(k.as_str()), v, true)?,
                ))
            })
            .collect();
        let headers: Vec<_> = req
            .headers
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    k.clone(),
                    template(rbase.join("headers").join(k.as_str()), v, true)?,
                ))
            })
            .collect();
        let body = req
            .body
            .as_ref()
            .and_then(|b| template(rbase.join("body"), b, true));
        let sink_path = template(base.join("sink").join("path"), &sink_src, false);
        if let Some(url) = &url {
            let sample = url.render(|_| Some("x"));
            match reqwest::Url::parse(&sample) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                Ok(u) => self.errors.push(src.error(
                    &rbase.join("url"),
                    format!("scheme {:?} is not http or https", u.scheme()),
                )),
                Err(e) => self.errors.push(src.error(
                    &rbase.join("url"),
                    format!("invalid URL {:?}: {e}", req.url),
                )),
            }
        }
        let method = match req
            .method
            .as_deref()
            .unwrap_or("GET")
            .to_ascii_uppercase()
            .as_str()
        {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            other => {
                self.errors.push(src.error(
                    &rbase.join("method"),
                    format!("unsupported method {other:?}"),
                ));
                Method::Get
            }
        };
        for (k, v) in &req.headers {
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                self.errors.push(src.error(
                    &rbase.join("headers").join(k.as_str()),
                    format!("invalid header name {k:?}"),
                ));
            }
            // The template's own text must make a valid value (a CR or LF
            // in it would never send); placeholder values are checked per
            // request.
            let sample = Template::parse(v).map(|t| t.render(|_| Some("x")));
            if let Ok(sample) = sample
                && reqwest::header::HeaderValue::from_str(&sample).is_err()
            {
                self.errors.push(src.error(
                    &rbase.join("headers").join(k.as_str()),
                    "invalid header value: control characters (CR, LF, NUL, ...) cannot be sent in a header",
                ));
            }
        }

        let pagination = rj.pagination.as_ref().and_then(|p| {
            let pb = base.join("pagination");
            if !valid_pointer(&p.cursor) || p.cursor.is_empty() {
                self.errors.push(src.error(
                    &pb.join("cursor"),
                    format!(
                        "{:?} is not a JSON pointer like \"/nextPageToken\"",
                        p.cursor
                    ),
                ));
            }
            if p.param.is_empty() {
                self.errors.push(src.error(
                    &pb.join("param"),
                    "must name the query parameter that carries the cursor",
                ));
            }
            let Some(max_pages) = NonZeroU32::new(p.max_pages) else {
                self.errors
                    .push(src.error(&pb.join("max_pages"), "must be at least 1"));
                return None;
            };
            Some(Pagination {
                cursor: p.cursor.clone(),
                param: p.param.clone(),
                max_pages,
            })
        });

        let sb = base.join("sink");
        let kind = match rj.sink.kind.as_str() {
            "jsonl" => SinkKind::Jsonl,
            "sqlite" => SinkKind::Sqlite,
            other => {
                self.errors.push(src.error(
                    &sb.join("kind"),
                    format!("unknown sink kind {other:?}: use \"jsonl\" or \"sqlite\""),
                ));
                SinkKind::Jsonl
            }
        };
        let records = rj.sink.records.clone().unwrap_or_default();
        if !valid_pointer(&records) {
            self.errors.push(src.error(
                &sb.join("records"),
                format!("{records:?} is not a JSON pointer like \"/items\""),
            ));
        }
        for (i, f) in rj.sink.search.iter().enumerate() {
            if !valid_pointer(f) || f.is_empty() {
                self.errors.push(src.error(
                    &sb.join("search").join(i),
                    format!("{f:?} is not a JSON pointer like \"/snippet/title\""),
                ));
            }
        }
        if kind == SinkKind::Jsonl {
            if !rj.sink.search.is_empty() {
                self.errors.push(src.error(
                    &sb.join("search"),
                    "only sqlite sinks have a full-text index",
                ));
            }
            if rj.sink.key.is_some() {
                self.errors
                    .push(src.error(&sb.join("key"), "only sqlite sinks replace records by key"));
            }
        }
        if let Some(k) = &rj.sink.key
            && (!valid_pointer(k) || k.is_empty())
        {
            self.errors.push(src.error(
                &sb.join("key"),
                format!("{k:?} is not a JSON pointer like \"/id\""),
            ));
        }

        let retry = match &rj.retry {
            None => Retry::default(),
            Some(r) => {
                let d = Retry::default();
                let attempts = NonZeroU32::new(r.attempts.unwrap_or(d.attempts.get()))
                    .unwrap_or_else(|| {
                        self.errors.push(
                            src.error(&base.join("retry").join("attempts"), "must be at least 1"),
                        );
                        d.attempts
                    });
                Retry {
                    attempts,
                    backoff: r.backoff.map_or(d.backoff, |x| x.0),
                    max_backoff: r.max_backoff.map_or(d.max_backoff, |x| x.0),
                }
            }
        };

        if self.errors.len() > errors_before || !endpoint_valid {
            return None;
        }
        Some(Job {
            name: name.to_owned(),
            file: src.path().to_owned(),
            schedule: schedule?,
            timezone,
            endpoint: rj.endpoint,
            fan_out,
            on_quota_exhausted,
            request: RequestTemplate {
                method,
                url: url?,
                query,
                headers,
                body,
            },
            pagination,
            sink: SinkConfig {
                kind,
                path: sink_path?,
                records,
                search: rj.sink.search,
                key: rj.sink.key,
            },
            retry,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_config() {
        assert_eq!(fmt_duration(Duration::from_secs(86_400)), "24h");
        assert_eq!(fmt_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(fmt_duration(Duration::from_secs(5_400)), "1h 30m");
        assert_eq!(fmt_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(fmt_duration(Duration::from_millis(59_787)), "59.8s");
        assert_eq!(fmt_duration(Duration::from_secs(60)), "1m");
    }

    #[test]
    fn redis_url_hides_password() {
        let u = RedisUrl::new("redis://user:hunter2@10.0.0.1:6379/0");
        assert_eq!(u.to_string(), "redis://user:***@10.0.0.1:6379/0");
        assert!(!format!("{u:?}").contains("hunter2"));
        assert_eq!(
            RedisUrl::new("redis://127.0.0.1/").to_string(),
            "redis://127.0.0.1/"
        );
    }

    #[test]
    fn secret_never_prints() {
        assert!(!format!("{:?}", Secret::new("AIzaXYZ")).contains("AIza"));
    }

    #[test]
    fn expands_systemd_variables() {
        let env =
            |k: &str| (k == "CREDENTIALS_DIRECTORY").then(|| "/run/credentials/qw".to_owned());
        assert_eq!(
            expand_vars("$CREDENTIALS_DIRECTORY/yt-key1", &env).unwrap(),
            "/run/credentials/qw/yt-key1"
        );
        assert_eq!(
            expand_vars("${CREDENTIALS_DIRECTORY}/k", &env).unwrap(),
            "/run/credentials/qw/k"
        );
        assert!(
            expand_vars("$NOPE/k", &env)
                .unwrap_err()
                .contains("NOPE is not set")
        );
        assert_eq!(
            expand_vars("${NOPE:-../secrets}/k", &env).unwrap(),
            "../secrets/k"
        );
        assert_eq!(
            expand_vars("${CREDENTIALS_DIRECTORY:-x}/k", &env).unwrap(),
            "/run/credentials/qw/k"
        );
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

    #[test]
    fn reset_times_parse() {
        assert_eq!(parse_reset("00:00"), Some(Duration::ZERO));
        assert_eq!(
            parse_reset("09:30:15"),
            Some(Duration::from_secs(9 * 3600 + 1800 + 15))
        );
        assert_eq!(parse_reset("24:00"), None);
        assert_eq!(parse_reset("9"), None);
    }
}
