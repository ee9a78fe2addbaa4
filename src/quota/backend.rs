//! Where the quota windows live: the standalone Redis the queue uses (a
//! `Conn`), or a Redis Cluster (`[redis] quota_nodes`, through
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
//!
//! Also here: how durable a write is (`[redis] quota_replicas`: the `WAIT`
//! pipelined after a settle, a drift sync or a block, [`Limiter::call_acked`])
//! and whether the windows' Redis answers at all ([`QuotaConn::probe`], for
//! `/readyz`).

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::conn::Conn;
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, Value};

use super::{Limiter, Operation, Plan, QuotaError};
use crate::config::{Config, RedisUrl};
use crate::conn::LuaCall;
use crate::conn::Master;
use crate::eviction::{self, Eviction};

/// A connection to wherever the windows live. Cloning is cheap and shares
/// the underlying connections.
#[derive(Clone)]
pub enum QuotaConn {
    /// One Redis (the queue's, or the embedded one): a multiplexed
    /// connection that follows its master.
    Standalone(Conn),
    /// A Redis Cluster: one multiplexed connection per node, routed by slot.
    Cluster(ClusterConnection),
}

impl From<Conn> for QuotaConn {
    fn from(c: Conn) -> Self {
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

/// The spend core's library is loaded on every master a call may reach: one
/// Redis, or each master of the cluster (a call routes to the one that owns
/// its credential's slot; after a failover, its new master).
impl crate::conn::FunctionHost for QuotaConn {
    async fn holds_library(&mut self, name: &str) -> RedisResult<bool> {
        let c = match self {
            QuotaConn::Standalone(c) => return crate::conn::holds_library(c, name).await,
            QuotaConn::Cluster(c) => c,
        };
        let mut list = redis::cmd("FUNCTION");
        list.arg("LIST").arg("LIBRARYNAME").arg(name);
        let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // Without a response policy the client answers node address -> reply.
        let per_node = match c.route_command(list, all).await? {
            Value::Map(m) => m.into_iter().map(|(_, v)| v).collect(),
            other => vec![other],
        };
        Ok(per_node
            .iter()
            .all(|libs| matches!(libs, Value::Array(l) if !l.is_empty())))
    }

    async fn load_library(&mut self, source: &str) -> RedisResult<()> {
        // redis-rs sends FUNCTION LOAD to every master of a cluster.
        crate::conn::load_library(self, source).await
    }
}

impl QuotaConn {
    /// What a call that got no answer within `timeout` failed with: the
    /// connection's refused login when that is why ([`Conn::refused_login`],
    /// `QuotaError::Unavailable`, which the CLI reports as a config error
    /// and the daemon logs as such), else [`QuotaError::Timeout`].
    pub(crate) fn timed_out(&self, timeout: Duration) -> QuotaError {
        match self {
            QuotaConn::Standalone(c) => c.refused_login().map(QuotaError::Unavailable),
            // A cluster connection says why itself, within its own timeouts.
            QuotaConn::Cluster(_) => None,
        }
        .unwrap_or(QuotaError::Timeout(timeout))
    }

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

impl QuotaConn {
    /// SCANs every node that holds windows for keys matching `pattern`: a
    /// standalone Redis, or each master of a cluster in turn (a cluster
    /// client sends a plain SCAN to one node, whose cursor means nothing to
    /// the others). Each batch goes to `take` until it returns false; each
    /// call waits at most `timeout`.
    pub(crate) async fn scan_matching(
        &self,
        pattern: &str,
        timeout: Duration,
        mut take: impl FnMut(Vec<String>) -> bool,
    ) -> Result<(), QuotaError> {
        async fn bounded<T>(
            conn: &QuotaConn,
            timeout: Duration,
            f: impl Future<Output = RedisResult<T>>,
        ) -> Result<T, QuotaError> {
            tokio::time::timeout(timeout, f)
                .await
                .map_err(|_| conn.timed_out(timeout))?
                .map_err(QuotaError::from_redis)
        }
        // Where to send each SCAN: the Redis, or one master by address.
        let nodes: Vec<Option<RoutingInfo>> = match self {
            QuotaConn::Standalone(_) => vec![None],
            QuotaConn::Cluster(c) => {
                let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let mut c = c.clone();
                let reply: Value =
                    bounded(self, timeout, c.route_command(redis::cmd("PING"), all)).await?;
                let Value::Map(per_node) = reply else {
                    return Err(QuotaError::Script(format!(
                        "PING to every master answered {reply:?}"
                    )));
                };
                let mut nodes = Vec::new();
                for (node, _) in per_node {
                    let node = String::from_redis_value(node).unwrap_or_default();
                    let Some((host, port)) = node.rsplit_once(':') else {
                        continue;
                    };
                    let Ok(port) = port.parse::<u16>() else {
                        continue;
                    };
                    let host = host.to_owned();
                    let at = SingleNodeRoutingInfo::ByAddress { host, port };
                    nodes.push(Some(RoutingInfo::SingleNode(at)));
                }
                nodes
            }
        };
        for node in nodes {
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let reply: Value = match (self, &node) {
                    (QuotaConn::Cluster(c), Some(at)) => {
                        bounded(self, timeout, c.clone().route_command(scan, at.clone())).await?
                    }
                    _ => {
                        bounded(self, timeout, scan.query_async::<Value>(&mut self.clone())).await?
                    }
                };
                let (next, batch): (u64, Vec<String>) = FromRedisValue::from_redis_value(reply)
                    .map_err(|e| QuotaError::Script(format!("SCAN answered {e}")))?;
                if !take(batch) {
                    return Ok(());
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }
}

/// Why the windows' Redis is not ready ([`QuotaConn::probe`]). Each says
/// what to look at; none holds a node's password (nodes are named by
/// `host:port`, as the cluster itself names them).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Check that the nodes run and are reachable from this host.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// Check that the nodes run and are reachable from this host.
    #[error("unreachable: {0}")]
    Unreachable(#[source] redis::RedisError),
    /// Check the cluster (`CLUSTER INFO` on the node): a slot has no master,
    /// so spends on some credentials fail until a failover or a restart.
    #[error("cluster node {node} says {state}")]
    ClusterDown {
        /// The node, `host:port`.
        node: String,
        /// Its `cluster_state:…` line, or its error answer.
        state: String,
    },
}

impl QuotaConn {
    /// Whether the windows' Redis answers a read now, within `timeout`: a
    /// standalone Redis a `PING`; a cluster `CLUSTER INFO` on every master
    /// the client knows, each saying `cluster_state:ok` (while a slot has no
    /// master, the cluster refuses spends on every credential, with
    /// `cluster-require-full-coverage yes`, or on that slot's).
    pub async fn probe(&self, timeout: Duration) -> Result<(), ProbeError> {
        let read = async {
            match self {
                QuotaConn::Standalone(c) => redis::cmd("PING")
                    .query_async::<Value>(&mut c.clone())
                    .await
                    .map(|_| None),
                QuotaConn::Cluster(c) => {
                    let mut cmd = redis::cmd("CLUSTER");
                    cmd.arg("INFO");
                    let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                    c.clone().route_command(cmd, all).await.map(cluster_down)
                }
            }
        };
        match tokio::time::timeout(timeout, read).await {
            Err(_) => Err(ProbeError::Timeout(timeout)),
            Ok(Err(e)) => Err(ProbeError::Unreachable(e)),
            Ok(Ok(Some(down))) => Err(down),
            Ok(Ok(None)) => Ok(()),
        }
    }
}

/// The first master whose `CLUSTER INFO` (in `reply`: node address ->
/// answer, as the client maps a command sent to every master) is not
/// `cluster_state:ok`.
fn cluster_down(reply: Value) -> Option<ProbeError> {
    let per_node = match reply {
        Value::Map(m) => m,
        other => vec![(Value::SimpleString(String::new()), other)],
    };
    per_node.into_iter().find_map(|(node, info)| {
        let node = String::from_redis_value(node).unwrap_or_default();
        let state = match info {
            Value::ServerError(e) => e.to_string(),
            info => {
                let text = String::from_redis_value(info).unwrap_or_default();
                let line = text.lines().find(|l| l.starts_with("cluster_state:"));
                match line.map(str::trim) {
                    Some("cluster_state:ok") => return None,
                    Some(other) => other.to_owned(),
                    None => "no cluster_state".to_owned(),
                }
            }
        };
        Some(ProbeError::ClusterDown { node, state })
    })
}

/// A write that must survive a failover once `[redis] quota_replicas` asks
/// for it, besides the spend (which refuses itself when not acknowledged):
/// each of these, forgotten in a failover, lets the windows admit more than
/// the upstream allows, but by the time it runs the request has left, so an
/// unacknowledged one is logged, not failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durable {
    /// A settle to a cost other than 0 (a refund, lost, admits less: it is
    /// not waited for).
    Settle,
    /// A drift sync (the upstream counted more than the window).
    Sync,
    /// A block (the upstream said stop).
    Block,
}

impl Durable {
    fn as_str(self) -> &'static str {
        match self {
            Durable::Settle => "settle",
            Durable::Sync => "sync",
            Durable::Block => "block",
        }
    }

    /// What losing it in a failover would mean, for the error log.
    fn if_lost(self) -> &'static str {
        match self {
            Durable::Settle => {
                "if the master fails over now, the raise is forgotten and the windows admit up to that many units more than the upstream allows"
            }
            Durable::Sync => {
                "if the master fails over now, the drift is forgotten and the window admits the units the upstream already counted"
            }
            Durable::Block => {
                "if the master fails over now, the block is forgotten and spends are admitted while the upstream refuses them"
            }
        }
    }
}

impl Limiter {
    /// Where the windows live, for the readiness probe and its policy check.
    pub(crate) fn connection(&self) -> &QuotaConn {
        &self.conn
    }

    /// The `WAIT` to pipeline after a write, when `[redis] quota_replicas`
    /// asks for one.
    fn replica_wait_cmd(&self) -> Option<Cmd> {
        (self.replicas > 0).then(|| {
            let mut wait = redis::cmd("WAIT");
            wait.arg(self.replicas)
                .arg(super::replica_wait(self.timeout).as_millis() as u64);
            wait
        })
    }

    /// Runs the spend script's `what` on `plan` like [`Limiter::call`],
    /// followed by the replicas' `WAIT` on the same connection when
    /// `[redis] quota_replicas` asks for one. Not acknowledged in time: an
    /// error logged (with what a failover would now cost) and counted in
    /// `qw_unacknowledged_writes_total`; the call still succeeds (the write
    /// is on the master, and the request it accounts for has left).
    pub(super) async fn call_acked(
        &self,
        what: Durable,
        plan: &Plan,
        operation: &Operation<'_>,
    ) -> Result<Vec<i64>, QuotaError> {
        let Some(wait) = self.replica_wait_cmd() else {
            return self.call(plan, operation).await;
        };
        let layout = plan.layout(operation);
        let (r, acked) = (self.call_then(operation.op(), &layout, Some(&wait))).await?;
        // A settle of an id no window holds, or a sync with no drift,
        // wrote nothing a failover could lose.
        let wrote = what == Durable::Block || r.first().is_some_and(|&n| n > 0);
        if wrote {
            self.check_acked(what, plan, acked);
        }
        Ok(r)
    }

    /// Invokes `call` (a script on `plan`'s keys, the first key routing it)
    /// within the limiter's timeout, followed by the replicas' `WAIT` like
    /// [`Limiter::call_acked`].
    pub(super) async fn invoke_acked<T: FromRedisValue>(
        &self,
        what: Durable,
        plan: &Plan,
        call: &LuaCall<'_>,
    ) -> Result<T, QuotaError> {
        let mut conn = self.conn.clone();
        let run = async {
            let Some(wait) = self.replica_wait_cmd() else {
                return call.invoke::<T>(&mut conn).await;
            };
            let (v, acked) = call.invoke_then(&mut conn, &wait).await?;
            self.check_acked(what, plan, Some(acked));
            Ok(T::from_redis_value(v)?)
        };
        tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| self.conn.timed_out(self.timeout))?
            .map_err(QuotaError::from_redis)
    }

    /// Logs and counts a write `WAIT` did not see acknowledged.
    fn check_acked(&self, what: Durable, plan: &Plan, acked: Option<RedisResult<Value>>) {
        // An error answer (WAIT on a replica, say) acknowledges nothing.
        let acked = match acked {
            Some(Ok(Value::Int(n))) => n.max(0) as u64,
            _ => 0,
        };
        if acked >= u64::from(self.replicas) {
            return;
        }
        metrics::counter!("qw_unacknowledged_writes_total", "credential" => plan.family.clone(), "op" => what.as_str())
            .increment(1);
        tracing::error!(
            credential = %plan.credential,
            op = what.as_str(),
            wanted = self.replicas,
            acked,
            waited_ms = super::replica_wait(self.timeout).as_millis() as u64,
            "a {} was not acknowledged by a replica in time ([redis] quota_replicas): it is recorded on the master, and the request it accounts for has already left, so nothing fails; {}",
            what.as_str(),
            what.if_lost()
        );
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
    /// One Redis (its master).
    Standalone(Master),
    /// A Redis Cluster, by its seed nodes.
    Cluster(Vec<RedisUrl>),
}

impl QuotaTarget {
    /// Where `config`'s windows live; `standalone` is the queue's Redis (the
    /// configured master or the embedded one's socket).
    pub fn of(config: &Config, standalone: Master) -> Self {
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
            QuotaTarget::Standalone(master) => Ok(crate::conn::connect(master, timeout, "windows")
                .await?
                .into()),
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
            QuotaTarget::Standalone(master) => {
                Ok(crate::conn::connect_lazy(master, timeout, "windows").into())
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
            QuotaTarget::Standalone(master) => write!(f, "{master}"),
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
