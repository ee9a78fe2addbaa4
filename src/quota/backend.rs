//! Where the quota windows live: the standalone Redis the queue uses (a
//! `ConnectionManager`), or a Redis Cluster (`[redis] quota_nodes`, through
//! redis-rs's async cluster client). [`QuotaConn`] is either, behind the one
//! `ConnectionLike` the [`super::Limiter`] runs its script on, so spend,
//! settle, block, peek and sync, the CLI and the metrics do not know which.
//!
//! On a cluster, every key of one call carries the credential's hash tag, so
//! the client routes the script by its first key to the master that owns the
//! slot, follows MOVED/ASK, and refreshes its slot map after a failover. An
//! unreachable node surfaces as the call's error (the endpoint's
//! `limiter_unavailable` decides); the client reconnects by itself, so the
//! next call after a failover reaches the new master without a restart.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use crate::config::{Config, RedisUrl};
use crate::eviction::{self, Eviction};

/// A connection to wherever the windows live. Cloning is cheap and shares
/// the underlying connections.
#[derive(Clone)]
pub enum QuotaConn {
    /// One Redis (the queue's, or the embedded one): a multiplexed
    /// connection that reconnects in the background.
    Standalone(ConnectionManager),
    /// A Redis Cluster: one multiplexed connection per node, routed by slot.
    Cluster(ClusterConnection),
}

impl From<ConnectionManager> for QuotaConn {
    fn from(c: ConnectionManager) -> Self {
        QuotaConn::Standalone(c)
    }
}

impl From<ClusterConnection> for QuotaConn {
    fn from(c: ClusterConnection) -> Self {
        QuotaConn::Cluster(c)
    }
}

impl ConnectionLike for QuotaConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            QuotaConn::Standalone(c) => c.req_packed_command(cmd),
            QuotaConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // A cluster sends a pipeline whole to the node of its first keyed
        // command: the spend and its WAIT share one connection to one master.
        match self {
            QuotaConn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            QuotaConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            QuotaConn::Standalone(c) => c.get_db(),
            QuotaConn::Cluster(c) => c.get_db(),
        }
    }
}

impl QuotaConn {
    /// Every master's `maxmemory-policy` (a standalone Redis: its own). The
    /// worst wins: one node that may evict makes the windows unsafe.
    pub(crate) async fn eviction(&self, timeout: Duration) -> Eviction {
        let mut conn = match self {
            QuotaConn::Standalone(c) => return eviction::check(&mut c.clone(), timeout).await,
            QuotaConn::Cluster(c) => c.clone(),
        };
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        let reply = match tokio::time::timeout(timeout, conn.route_command(cmd, all)).await {
            Err(_) => return Eviction::Unknown(format!("CONFIG GET timed out after {timeout:?}")),
            Ok(Err(e)) => return Eviction::Unknown(format!("CONFIG GET failed: {e}")),
            Ok(Ok(v)) => v,
        };
        // Without a response policy the client answers node address -> reply.
        let per_node: Vec<(String, Value)> = match reply {
            Value::Map(m) => m
                .into_iter()
                .map(|(k, v)| (String::from_redis_value(k).unwrap_or_default(), v))
                .collect(),
            other => vec![(String::new(), other)],
        };
        worst(per_node.into_iter().map(|(node, v)| {
            let policy = HashMap::<String, String>::from_redis_value(v)
                .ok()
                .and_then(|m| m.get("maxmemory-policy").cloned());
            (node, policy)
        }))
    }
}

/// The verdict over every master's policy: any evicting node makes it
/// unsafe (named with its node), any unreadable one unknown.
fn worst(nodes: impl Iterator<Item = (String, Option<String>)>) -> Eviction {
    let mut unknown = None;
    for (node, policy) in nodes {
        match policy {
            Some(p) if p == eviction::SAFE_POLICY => {}
            Some(p) => return Eviction::Unsafe(format!("{p} (on cluster node {node})")),
            None => unknown = Some(format!("cluster node {node} did not say")),
        }
    }
    unknown.map_or(Eviction::Safe, Eviction::Unknown)
}

/// Where the windows live, for messages: the standalone Redis's URL or the
/// cluster's seed nodes, passwords redacted.
#[derive(Debug, Clone)]
pub enum QuotaTarget {
    /// One Redis.
    Standalone(RedisUrl),
    /// A Redis Cluster, by its seed nodes.
    Cluster(Vec<RedisUrl>),
}

impl QuotaTarget {
    /// Where `config`'s windows live; `standalone` is the queue's Redis (the
    /// configured URL or the embedded one's socket).
    pub fn of(config: &Config, standalone: RedisUrl) -> Self {
        if config.redis.quota_nodes.is_empty() {
            QuotaTarget::Standalone(standalone)
        } else {
            QuotaTarget::Cluster(config.redis.quota_nodes.clone())
        }
    }

    /// Connects, waiting for the connection: each command times out after
    /// `timeout`; a failed connection is retried `retries` times.
    pub async fn connect(&self, timeout: Duration, retries: usize) -> RedisResult<QuotaConn> {
        match self {
            QuotaTarget::Standalone(url) => {
                Ok(crate::conn::connect(url, timeout, retries).await?.into())
            }
            QuotaTarget::Cluster(nodes) => {
                let client = cluster_client(nodes, timeout, retries)?;
                Ok(client.get_async_connection().await?.into())
            }
        }
    }

    /// Like [`QuotaTarget::connect`], but connects on first use: an
    /// unreachable Redis surfaces as the first command's error, where the
    /// caller's policy handles it.
    pub fn connect_lazy(&self, timeout: Duration, retries: usize) -> RedisResult<QuotaConn> {
        match self {
            QuotaTarget::Standalone(url) => {
                Ok(crate::conn::connect_lazy(url, timeout, retries)?.into())
            }
            QuotaTarget::Cluster(nodes) => {
                let client = cluster_client(nodes, timeout, retries)?;
                // The pending connection takes its timeouts from this config,
                // not from the builder's.
                let config = ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout);
                Ok(client
                    .get_pending_async_connection_with_config(config)
                    .into())
            }
        }
    }
}

impl fmt::Display for QuotaTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaTarget::Standalone(url) => write!(f, "{url}"),
            QuotaTarget::Cluster(nodes) => {
                let nodes: Vec<String> = nodes.iter().map(ToString::to_string).collect();
                write!(f, "Redis Cluster [{}]", nodes.join(", "))
            }
        }
    }
}

/// The cluster client for `nodes`. Each attempt waits at most `timeout` for
/// a connection or an answer, and a whole call (retries, redirects and
/// reconnects included) at most `timeout` too; within it the client retries
/// with short, growing waits, so a call made during a failover either
/// reaches the new master or fails in time for the endpoint's policy.
fn cluster_client(
    nodes: &[RedisUrl],
    timeout: Duration,
    retries: usize,
) -> RedisResult<ClusterClient> {
    ClusterClientBuilder::new(nodes.iter().map(RedisUrl::expose))
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .retries(u32::try_from(retries.max(1) * 4).unwrap_or(u32::MAX))
        .min_retry_wait(10)
        .max_retry_wait(250)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str, p: Option<&str>) -> (String, Option<String>) {
        (n.to_owned(), p.map(str::to_owned))
    }

    #[test]
    fn one_evicting_master_makes_the_cluster_unsafe() {
        let safe = [node("a", Some("noeviction")), node("b", Some("noeviction"))];
        assert_eq!(worst(safe.into_iter()), Eviction::Safe);
        let mixed = [
            node("a", Some("noeviction")),
            node("b", None),
            node("c", Some("allkeys-lru")),
        ];
        assert_eq!(
            worst(mixed.into_iter()),
            Eviction::Unsafe("allkeys-lru (on cluster node c)".into())
        );
        let unknown = [node("a", Some("noeviction")), node("b", None)];
        assert!(matches!(worst(unknown.into_iter()), Eviction::Unknown(_)));
    }

    #[test]
    fn the_cluster_target_shows_its_nodes_redacted() {
        let t = QuotaTarget::Cluster(vec![
            RedisUrl::new("redis://:hunter2@10.0.0.1:7000"),
            RedisUrl::new("redis://10.0.0.2:7000"),
        ]);
        let shown = t.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("10.0.0.1:7000") && shown.contains("10.0.0.2:7000"));
    }
}
