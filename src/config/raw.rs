//! The config files exactly as written: serde types with unknown fields
//! rejected. [`super::load`] turns them into the validated [`super::Config`].

use indexmap::IndexMap;
use serde::{Deserialize, Deserializer};

use super::duration::Dur;

/// A size in bytes written like "16MiB", "512KiB", "20MB" (binary and
/// decimal units, as `bytesize` reads them) or as a plain integer of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Size(pub(super) u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bytes(u64),
            Text(String),
        }
        let bad = |what: &dyn std::fmt::Display| {
            serde::de::Error::custom(format!(
                "invalid size {what}; write e.g. \"16MiB\", \"512KiB\" or \"20MB\""
            ))
        };
        match Written::deserialize(d)? {
            Written::Bytes(n) => Ok(Size(n)),
            Written::Text(s) => s
                .trim()
                .parse::<bytesize::ByteSize>()
                .map(|b| Size(b.as_u64()))
                .map_err(|_| bad(&format_args!("{s:?}"))),
        }
    }
}

/// A size as an operator writes it: "16 MiB", "512 KiB", "1000 B".
pub(crate) fn fmt_size(bytes: u64) -> String {
    for (unit, len) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= len && bytes.is_multiple_of(len) {
            return format!("{} {unit}", bytes / len);
        }
    }
    if bytes >= 1 << 10 {
        return bytesize::ByteSize(bytes).display().iec().to_string();
    }
    format!("{bytes} B")
}

/// `config/quota-worker.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) jobs: Option<String>,
    pub(super) state_dir: Option<String>,
    #[serde(default)]
    pub(super) redis: RawRedis,
    #[serde(default)]
    pub(super) worker: RawWorker,
    #[serde(default)]
    pub(super) metrics: RawMetrics,
    #[serde(default)]
    pub(super) log: RawLog,
    #[serde(default)]
    pub(super) credentials: IndexMap<String, RawCredential>,
    #[serde(default)]
    pub(super) endpoints: IndexMap<String, RawEndpoint>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRedis {
    pub(super) url: Option<String>,
    pub(super) key_prefix: Option<String>,
    pub(super) timeout: Option<Dur>,
    pub(super) unsafe_eviction: Option<String>,
    pub(super) quota_nodes: Option<Vec<String>>,
    pub(super) quota_replicas: Option<i64>,
    pub(super) sentinels: Option<Vec<String>>,
    pub(super) master_name: Option<String>,
    pub(super) queue_replicas: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorker {
    pub(super) concurrency: Option<usize>,
    pub(super) shutdown_timeout: Option<Dur>,
    pub(super) recover_after: Option<Dur>,
    pub(super) poll_interval: Option<Dur>,
    pub(super) fan_out_warn: Option<u64>,
    pub(super) unknown_job_grace: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCredential {
    pub(super) template: Option<String>,
    pub(super) secret_env: Option<String>,
    pub(super) secret_file: Option<String>,
    pub(super) secret_command: Option<Vec<String>>,
    pub(super) secret_ttl: Option<Dur>,
    #[serde(default)]
    pub(super) windows: Vec<RawWindow>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    pub(super) units: u64,
    pub(super) per: Option<Dur>,
    pub(super) lease: Option<Dur>,
    pub(super) kind: Option<String>,
    pub(super) reset: Option<String>,
    pub(super) timezone: Option<String>,
    pub(super) upstream: Option<bool>,
    pub(super) resource: Option<String>,
    pub(super) mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEndpoint {
    pub(super) credential: String,
    pub(super) cost: u64,
    pub(super) limiter_unavailable: Option<String>,
    #[serde(default)]
    pub(super) windows: Vec<RawWindow>,
    pub(super) charge_credential: Option<bool>,
    pub(super) timeout: Option<Dur>,
    pub(super) throttle_block: Option<Dur>,
    pub(super) quota_reasons: Option<Vec<String>>,
    pub(super) ratelimit_headers: Option<RawRatelimitHeaders>,
    pub(super) cost_header: Option<String>,
    pub(super) max_body: Option<Size>,
    pub(super) max_records: Option<u64>,
    pub(super) max_block: Option<Dur>,
    pub(super) conditional: Option<bool>,
    pub(super) not_modified_cost: Option<u64>,
    pub(super) accounting: Option<String>,
    pub(super) throttle_at: Option<u64>,
    pub(super) resource: Option<String>,
    pub(super) min_block: Option<Dur>,
    pub(super) throttle_block_max: Option<Dur>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRatelimitHeaders {
    pub(super) remaining: String,
    pub(super) reset: String,
    pub(super) reset_is: Option<String>,
}

/// One job in a `jobs/*.toml` file (the file is a table of them).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJob {
    pub(super) schedule: String,
    pub(super) timezone: Option<String>,
    pub(super) endpoint: String,
    #[serde(default)]
    pub(super) fan_out: IndexMap<String, Vec<String>>,
    pub(super) fan_out_from: Option<RawFanOutFrom>,
    pub(super) on_quota_exhausted: Option<String>,
    pub(super) request: RawRequest,
    pub(super) pagination: Option<RawPagination>,
    pub(super) sink: RawSink,
    pub(super) retry: Option<RawRetry>,
    pub(super) reserve: Option<String>,
    pub(super) since_initial: Option<Dur>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFanOutFrom {
    pub(super) csv: Option<String>,
    pub(super) sqlite: Option<String>,
    pub(super) postgres: Option<String>,
    pub(super) password_file: Option<String>,
    pub(super) query: Option<String>,
    pub(super) columns: Option<Vec<String>>,
    pub(super) max_items: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequest {
    pub(super) method: Option<String>,
    pub(super) url: String,
    #[serde(default)]
    pub(super) query: IndexMap<String, String>,
    #[serde(default)]
    pub(super) headers: IndexMap<String, String>,
    pub(super) body: Option<String>,
    pub(super) graphql: Option<RawGraphql>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGraphql {
    pub(super) query: String,
    #[serde(default)]
    pub(super) variables: IndexMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPagination {
    pub(super) style: Option<String>,
    pub(super) cursor: Option<String>,
    pub(super) cursor_record: Option<String>,
    pub(super) param: Option<String>,
    pub(super) next: Option<String>,
    pub(super) start: Option<u64>,
    pub(super) step: Option<u64>,
    pub(super) more: Option<String>,
    pub(super) last: Option<String>,
    pub(super) max_pages: u32,
    #[serde(rename = "continue")]
    pub(super) continues: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSink {
    pub(super) kind: String,
    pub(super) path: Option<String>,
    pub(super) url: Option<String>,
    pub(super) password_file: Option<String>,
    pub(super) table: Option<String>,
    pub(super) records: Option<String>,
    #[serde(default)]
    pub(super) search: Vec<String>,
    pub(super) key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    pub(super) attempts: Option<u32>,
    pub(super) backoff: Option<Dur>,
    pub(super) max_backoff: Option<Dur>,
}
