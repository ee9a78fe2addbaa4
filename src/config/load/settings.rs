//! The daemon's own tables: `[redis]`, `[worker]`, `[metrics]`, `[log]` and
//! `state_dir`, with the environment overrides that apply to them.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use super::{Loader, NAME_RULE, expand_vars, valid_name};
use crate::config::defaults as d;
use crate::config::raw::{RawLog, RawMetrics, RawRedis, RawWorker};
use crate::config::{
    FieldPath, LogFormat, METRICS_LISTEN_ENV, MetricsConfig, REDIS_URL_ENV, RedisConfig, RedisUrl,
    Source, WorkerConfig, fmt_duration,
};

fn at(table: &str, field: &str) -> FieldPath {
    FieldPath::new([table, field])
}

impl Loader<'_> {
    /// `[redis]`; `QUOTA_WORKER_REDIS_URL` overrides `url`.
    pub(super) fn redis(&mut self, src: &Source, raw: &RawRedis) -> RedisConfig {
        let (url, from_env) = match (self.env)(REDIS_URL_ENV) {
            Some(u) if !u.is_empty() => (Some(RedisUrl(u)), true),
            _ => (raw.url.clone().map(RedisUrl), false),
        };
        let mut sentinels = self.sentinels(src, raw);
        let mut master_name = raw.master_name.clone();
        // The variable names the Redis to use when it names a host: the
        // sentinels of the file are not asked (a daemon of a production
        // config run against a Redis of its own).
        if from_env
            && let Some(u) = &url
            && u.master_settings().is_err()
            && u.check().is_ok()
        {
            sentinels.clear();
            master_name = None;
        }
        // With sentinels the URL names no host: it is checked as such.
        let checked = match &url {
            Some(u) if !sentinels.is_empty() => Some(u.master_settings().map(|_| ())),
            Some(u) => Some(u.check()),
            None => None,
        };
        if let Some(Err(msg)) = checked {
            let env = from_env.then_some(REDIS_URL_ENV);
            self.overridable_error(src, env, &at("redis", "url"), msg);
        }
        let key_prefix = raw
            .key_prefix
            .clone()
            .unwrap_or_else(|| d::KEY_PREFIX.into());
        if !valid_name(&key_prefix) {
            self.error(src, &at("redis", "key_prefix"), NAME_RULE);
        }
        let timeout = raw.timeout.map_or(d::REDIS_TIMEOUT, |t| t.0);
        if timeout.is_zero() {
            self.error(src, &at("redis", "timeout"), "must be more than 0");
        }
        let unsafe_eviction = self.pick_or(
            src,
            &at("redis", "unsafe_eviction"),
            raw.unsafe_eviction.as_deref(),
            d::UNSAFE_EVICTION,
        );
        let quota_nodes = self.quota_nodes(src, raw.quota_nodes.as_deref());
        let quota_replicas = self.replicas(src, "quota_replicas", raw.quota_replicas, QUOTA_WAITS);
        let embedded = url.is_none() && sentinels.is_empty();
        if quota_replicas > 0 && quota_nodes.is_empty() && embedded {
            let msg = "needs a Redis with a replica, and the embedded Redis has none: \
                       set quota_nodes (a Redis Cluster), url (a Redis with a replica) or sentinels, or write 0";
            self.error(src, &at("redis", "quota_replicas"), msg);
        }
        let queue_replicas = self.replicas(src, "queue_replicas", raw.queue_replicas, QUEUE_WAITS);
        if queue_replicas > 0 && embedded {
            let msg = "needs a Redis with a replica, and the embedded Redis has none: \
                       set url (a Redis with a replica) or sentinels, or write 0";
            self.error(src, &at("redis", "queue_replicas"), msg);
        }
        RedisConfig {
            url,
            key_prefix,
            timeout,
            unsafe_eviction,
            quota_nodes,
            quota_replicas,
            sentinels,
            master_name,
            queue_replicas,
        }
    }

    /// `[redis] sentinels` and `master_name`: TCP URLs of sentinels (each
    /// with its own credentials where it needs them), and the name they
    /// monitor the master under; one without the other is an error.
    fn sentinels(&mut self, src: &Source, raw: &RawRedis) -> Vec<RedisUrl> {
        let field = at("redis", "sentinels");
        let name_field = at("redis", "master_name");
        let Some(written) = raw.sentinels.as_deref() else {
            if raw.master_name.is_some() {
                let msg = "names a master for sentinels, but [redis] sentinels lists none: \
                           add sentinels = [\"redis://HOST:26379\", ...], or leave master_name out";
                self.error(src, &name_field, msg);
            }
            return Vec::new();
        };
        if written.is_empty() {
            let msg = "names no sentinel: list them (\"redis://HOST:26379\"), \
                       or leave sentinels out to reach the master by [redis] url";
            self.error(src, &field, msg);
        }
        match raw.master_name.as_deref() {
            None => {
                let msg = "is missing: with [redis] sentinels, name the master they monitor \
                           (the name in their `sentinel monitor NAME ...` line)";
                self.error(src, &name_field, msg);
            }
            Some(n) if n.is_empty() || n.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                let msg = "must be the name the sentinels monitor: not empty, no spaces";
                self.error(src, &name_field, msg);
            }
            Some(_) => {}
        }
        let mut sentinels = Vec::new();
        for (i, w) in written.iter().enumerate() {
            let url = RedisUrl(w.clone());
            match sentinel_node(&url) {
                Ok(()) => sentinels.push(url),
                Err(msg) => self.error(src, &field.join(i), msg),
            }
        }
        sentinels
    }

    /// `[redis] quota_nodes`: the seed nodes of the Redis Cluster that holds
    /// the windows, each a TCP URL on database 0, all with the same
    /// credentials and TLS mode (as redis-rs's cluster client needs them).
    fn quota_nodes(&mut self, src: &Source, raw: Option<&[String]>) -> Vec<RedisUrl> {
        let Some(raw) = raw else {
            return Vec::new();
        };
        let field = at("redis", "quota_nodes");
        if raw.is_empty() {
            let msg = "names no node: list the cluster's seed nodes (\"redis://HOST:PORT\"), \
                       or leave quota_nodes out to keep the windows in url's Redis";
            self.error(src, &field, msg);
            return Vec::new();
        }
        let mut nodes = Vec::new();
        for (i, written) in raw.iter().enumerate() {
            let url = RedisUrl(written.clone());
            match cluster_node(&url) {
                Ok(()) => nodes.push(url),
                Err(msg) => self.error(src, &field.join(i), msg),
            }
        }
        if nodes.len() == raw.len()
            && let Err(e) = redis::cluster::ClusterClient::new(nodes.iter().map(RedisUrl::expose))
        {
            // redis-rs's reasons name what differs, never a URL.
            self.error(
                src,
                &field,
                format!("the nodes cannot form one cluster client: {e}"),
            );
        }
        nodes
    }

    /// `[redis] quota_replicas` or `queue_replicas`: 0 or 1; `what` says
    /// what 1 means.
    fn replicas(&mut self, src: &Source, field: &str, raw: Option<i64>, what: &str) -> u8 {
        let Some(n) = raw else {
            return d::QUOTA_REPLICAS;
        };
        match u8::try_from(n) {
            Ok(n) if n <= d::MAX_QUOTA_REPLICAS => n,
            _ => {
                let msg = format!(
                    "must be 0 or {}, got {n} (1: {what})",
                    d::MAX_QUOTA_REPLICAS
                );
                self.error(src, &at("redis", field), msg);
                d::QUOTA_REPLICAS
            }
        }
    }

    /// `[worker]`.
    pub(super) fn worker(&mut self, src: &Source, raw: &RawWorker) -> WorkerConfig {
        let concurrency = raw
            .concurrency
            .map_or(Some(d::CONCURRENCY), NonZeroUsize::new);
        let concurrency = concurrency.unwrap_or_else(|| {
            self.error(src, &at("worker", "concurrency"), "must be at least 1");
            NonZeroUsize::MIN
        });
        let worker = WorkerConfig {
            concurrency,
            shutdown_timeout: raw.shutdown_timeout.map_or(d::SHUTDOWN_TIMEOUT, |t| t.0),
            recover_after: raw.recover_after.map_or(d::RECOVER_AFTER, |t| t.0),
            poll_interval: raw.poll_interval.map_or(d::POLL_INTERVAL, |t| t.0),
            fan_out_warn: raw.fan_out_warn.unwrap_or(d::FAN_OUT_WARN),
            unknown_job_grace: raw.unknown_job_grace.map_or(d::UNKNOWN_JOB_GRACE, |t| t.0),
        };
        if worker.recover_after < d::MIN_RECOVER_AFTER {
            let min = fmt_duration(d::MIN_RECOVER_AFTER);
            let msg = format!("must be at least {min} (workers heartbeat every third of it)");
            self.error(src, &at("worker", "recover_after"), msg);
        }
        let grace = worker.unknown_job_grace;
        if !grace.is_zero() && grace < d::MIN_UNKNOWN_JOB_GRACE {
            let min = fmt_duration(d::MIN_UNKNOWN_JOB_GRACE);
            let msg = format!(
                "must be \"0s\" (a task of a job this daemon does not know fails at once) or at least {min} (daemons say which jobs they have loaded every 5 s)"
            );
            self.error(src, &at("worker", "unknown_job_grace"), msg);
        }
        if worker.poll_interval.is_zero() {
            self.error(src, &at("worker", "poll_interval"), "must be more than 0");
        }
        worker
    }

    /// `[metrics]`; `QUOTA_WORKER_METRICS_LISTEN` overrides `listen`.
    pub(super) fn metrics(&mut self, src: &Source, raw: &RawMetrics) -> MetricsConfig {
        let (listen, from_env) = match (self.env)(METRICS_LISTEN_ENV) {
            Some(l) => (l, true),
            None => (
                raw.listen.as_deref().unwrap_or(d::METRICS_LISTEN).into(),
                false,
            ),
        };
        if d::METRICS_OFF.contains(&listen.as_str()) {
            return MetricsConfig { listen: None };
        }
        let listen = listen.parse::<SocketAddr>().map_err(|e| {
            format!(
                "invalid listen address {listen:?}: {e} (write e.g. \"{}\", or \"off\")",
                d::METRICS_LISTEN
            )
        });
        match listen {
            Ok(a) => MetricsConfig { listen: Some(a) },
            Err(msg) => {
                let env = from_env.then_some(METRICS_LISTEN_ENV);
                self.overridable_error(src, env, &at("metrics", "listen"), msg);
                MetricsConfig { listen: None }
            }
        }
    }

    /// An error in a value the environment variable `env` gave (named, as
    /// it is in no file), else in the file's field `at`.
    fn overridable_error(&mut self, src: &Source, env: Option<&str>, at: &FieldPath, msg: String) {
        match env {
            Some(var) => {
                let msg = format!("{var}: {msg}");
                self.errors.push(Source::file_error(src.path(), msg));
            }
            None => self.error(src, at, msg),
        }
    }

    /// `[log]`.
    pub(super) fn log(&mut self, src: &Source, raw: &RawLog) -> Option<LogFormat> {
        let format = raw.format.as_deref()?;
        self.pick(src, &at("log", "format"), format)
    }

    /// `state_dir`: the config's, else systemd's `$STATE_DIRECTORY`, else
    /// `state` next to the config file.
    pub(super) fn state_dir(&mut self, src: &Source, dir: &Path, raw: Option<&str>) -> PathBuf {
        let Some(written) = raw else {
            return match (self.env)("STATE_DIRECTORY") {
                // systemd passes one directory per StateDirectory= entry.
                Some(s) if !s.is_empty() => PathBuf::from(s.split(':').next().unwrap_or(&s)),
                _ => dir.join(d::STATE_DIR),
            };
        };
        match expand_vars(written, self.env) {
            Ok(s) => dir.join(s),
            Err(e) => {
                self.error(src, &FieldPath::new(["state_dir"]), e);
                dir.join(d::STATE_DIR)
            }
        }
    }
}

/// What `quota_replicas = 1` means, for its error.
const QUOTA_WAITS: &str =
    "an admitted spend waits for one replica's acknowledgement before its request is sent";

/// What `queue_replicas = 1` means, for its error.
const QUEUE_WAITS: &str =
    "a tick's claim, a task's checkpoint and its end wait for one replica's acknowledgement";

/// Whether `url` can be a sentinel's: a URL redis-rs connects with, over
/// TCP (sentinels name masters by IP and port), with no database (a
/// sentinel has none).
fn sentinel_node(url: &RedisUrl) -> Result<(), String> {
    use redis::IntoConnectionInfo;
    url.check()?;
    let info = url
        .expose()
        .into_connection_info()
        .map_err(|e| format!("invalid Redis URL \"{url}\": {e}"))?;
    if matches!(info.addr(), redis::ConnectionAddr::Unix(_)) {
        return Err(format!(
            "\"{url}\" is a Unix socket; a sentinel is reached over TCP: write redis://HOST:26379"
        ));
    }
    if info.redis_settings().db() != 0 {
        return Err(format!(
            "\"{url}\" names database {}; a sentinel has none (leave the /N out; the master's database goes in [redis] url)",
            info.redis_settings().db()
        ));
    }
    Ok(())
}

/// Whether `url` can be a seed node of a Redis Cluster: a URL redis-rs
/// connects with, over TCP (a cluster names its nodes by IP and port, never
/// by socket path), on database 0 (the only one a cluster has).
fn cluster_node(url: &RedisUrl) -> Result<(), String> {
    use redis::IntoConnectionInfo;
    url.check()?;
    let info = url
        .expose()
        .into_connection_info()
        .map_err(|e| format!("invalid Redis URL \"{url}\": {e}"))?;
    if matches!(info.addr(), redis::ConnectionAddr::Unix(_)) {
        return Err(format!(
            "\"{url}\" is a Unix socket; a cluster node is reached over TCP: write redis://HOST:PORT"
        ));
    }
    if info.redis_settings().db() != 0 {
        return Err(format!(
            "\"{url}\" names database {}; a Redis Cluster has only database 0 (leave the /N out)",
            info.redis_settings().db()
        ));
    }
    Ok(())
}
