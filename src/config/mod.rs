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
//! The validated types are a file per table: this file holds the whole
//! [`Config`] and its settings tables (`[redis]`, `[worker]`, `[metrics]`),
//! `credential`, `window`, `endpoint` and `job` the rest. The files as
//! written are `raw`'s serde types; `load` turns them into these, one
//! function per TOML table;
//! [`defaults`] holds every default and limit, `choice` the words a field may
//! take (`kind = "jsonl"`), `duration` how durations are read and printed.

mod choice;
mod credential;
pub mod defaults;
mod duration;
mod endpoint;
mod error;
mod job;
mod load;
mod postgres;
mod raw;
mod redis_url;
mod template;
mod tenant;
mod window;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use indexmap::IndexMap;

pub use credential::{
    Credential, Secret, SecretSource, Secrets, TenantSecretError, check_tenant_value,
};
pub use duration::{fmt_duration, parse_duration};
pub use endpoint::{
    Accounting, Endpoint, LimiterUnavailable, OnQuotaExhausted, RatelimitHeaders, ResetIs,
};
pub use error::{ConfigError, ConfigErrors, FieldPath, Seg, Source};
pub use job::{
    CursorAt, DataSource, FanOutFrom, Graphql, Item, Job, Method, PageFlag, PageStyle, Pagination,
    PgSink, RequestTemplate, Retry, Schedule, SinkConfig, SinkKind, Variable,
};
pub use postgres::{PasswordFrom, PgTarget, PgTls, PgTlsMode};
pub(crate) use raw::fmt_size;
pub use redis_url::{MasterSettings, RedisUrl};
pub(crate) use template::expand;
pub use template::{Expansion, Template, TemplateError};
pub use tenant::{parse_tenant, tenant_name};
pub use window::{LEASE_SLACK, Reserve, Scope, Window, WindowKind, WindowMode, resource_name_ok};

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
