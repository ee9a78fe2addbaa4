//! A private Redis Cluster on 127.0.0.1 for one test: `redis-server
//! --cluster-enabled yes` processes on free loopback ports (each with its
//! cluster bus port, +10000, free too), joined by `redis-cli --cluster
//! create`, ready once every node says `cluster_state:ok` and every master
//! has its replicas online. Nodes are killed (SIGKILL), hung (SIGSTOP) and
//! restarted by pid; a restarted node keeps its `nodes.conf` and rejoins as
//! a replica of whoever took its slots. Everything stops by pid on `Drop`
//! and the temp dirs go with it.
//!
//! `cluster-node-timeout` is 2 s, so a killed master fails over in a few
//! seconds; `cluster-replica-validity-factor 0` lets a replica that was hung
//! or cut off for a while still take over (the tests hang one on purpose).
//! Tests that start one take `support::machine::heavy()` first: six servers
//! and a failover load a 2-core machine.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use quota_worker::config::{Config, RedisUrl};
use quota_worker::quota::{Limiter, QuotaTarget, Quotas};

use super::redis_server::RedisServer;
use super::wait_until;

/// How long a node may miss pings before it is failing (ms).
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// A Redis Cluster of private servers, every slot assigned.
pub struct Cluster {
    /// The nodes, in the order they were started (masters first at creation;
    /// roles change with failovers: ask [`Cluster::master_of`]).
    pub nodes: Vec<RedisServer>,
    /// Replicas per master at creation.
    replicas: usize,
}

/// A port whose cluster bus port (+10000) is free too.
fn cluster_port(taken: &[u16]) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if port < 55_000
            && !taken.contains(&port)
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}

/// One line of `CLUSTER NODES`, the fields the tests need.
#[derive(Debug, Clone)]
struct NodeLine {
    port: u16,
    master: bool,
    failing: bool,
    /// Slot ranges, inclusive.
    slots: Vec<(u16, u16)>,
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let addr = f.get(1)?.split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags = f.get(2)?;
            let slots = f
                .iter()
                .skip(8)
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                port,
                master: flags.contains("master"),
                failing: flags.contains("fail"),
                slots,
            })
        })
        .collect()
}

impl Cluster {
    /// `masters` masters and no replicas.
    pub fn start(masters: usize) -> Self {
        Self::start_with(masters, 0)
    }

    /// `masters` masters with one replica each (3 → six servers).
    pub fn with_replicas(masters: usize) -> Self {
        Self::start_with(masters, 1)
    }

    fn start_with(masters: usize, replicas: usize) -> Self {
        let n = masters * (1 + replicas);
        let timeout = NODE_TIMEOUT_MS.to_string();
        let mut ports = Vec::new();
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                let port = cluster_port(&ports);
                ports.push(port);
                RedisServer::start_on_port(
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        &timeout,
                        "--cluster-replica-validity-factor",
                        "0",
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create (install redis-tools)");
        assert!(
            out.status.success(),
            "cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster { nodes, replicas };
        assert!(
            cluster.wait_ready(Duration::from_secs(30)),
            "the cluster did not become ready (cluster_state:ok, replicas online): {}",
            cluster.describe()
        );
        cluster
    }

    /// `redis://127.0.0.1:PORT/` of every node, as seed URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port()))
            .collect()
    }

    /// Whether node `i` runs (not killed).
    pub fn alive(&self, i: usize) -> bool {
        self.nodes[i].pid().is_some()
    }

    /// A node that runs and answers, for questions about the whole cluster.
    fn any(&self) -> &RedisServer {
        (0..self.nodes.len())
            .filter(|&i| self.alive(i))
            .map(|i| &self.nodes[i])
            .find(|s| s.try_cmd::<String>(&["PING"]).is_some())
            .expect("no cluster node answers")
    }

    /// `CLUSTER KEYSLOT key`.
    pub fn slot(&self, key: &str) -> u16 {
        let s: i64 = self.any().cmd(&["CLUSTER", "KEYSLOT", key]);
        s as u16
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|s| s.port() == port)
            .expect("a node of this cluster")
    }

    /// The node that masters `key`'s slot, as node `from` sees it (`None`:
    /// no live master has it, e.g. mid-failover).
    fn master_seen_by(&self, from: usize, key: &str) -> Option<usize> {
        let slot = self.slot(key);
        let text: String = self.nodes[from].try_cmd(&["CLUSTER", "NODES"])?;
        parse_nodes(&text)
            .into_iter()
            .find(|n| {
                n.master && !n.failing && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|n| self.index_of(n.port))
    }

    /// The node that masters `key`'s slot now, as every live node agrees.
    pub fn master_of(&self, key: &str) -> Option<usize> {
        let live: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.alive(i)).collect();
        let first = self.master_seen_by(live[0], key)?;
        live.iter()
            .all(|&i| self.master_seen_by(i, key) == Some(first))
            .then_some(first)
    }

    /// The live nodes that are masters (each node's own `ROLE`).
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.alive(i))
            .filter(|&i| {
                let role: Option<Vec<redis::Value>> = self.nodes[i].try_cmd(&["ROLE"]);
                matches!(role.as_deref(), Some([redis::Value::BulkString(r), ..]) if r == b"master")
            })
            .collect()
    }

    /// Whether every live node says `cluster_state:ok` and every master
    /// has its replicas (as many as at creation, when enough nodes live)
    /// online.
    pub fn ready(&self) -> bool {
        let live: Vec<usize> = (0..self.nodes.len()).filter(|&i| self.alive(i)).collect();
        let ok = live.iter().all(|&i| {
            self.nodes[i]
                .try_cmd::<String>(&["CLUSTER", "INFO"])
                .is_some_and(|s| s.contains("cluster_state:ok"))
        });
        let masters = self.masters();
        let want = if live.len() >= masters.len() * (1 + self.replicas) {
            self.replicas
        } else {
            0
        };
        ok && masters.iter().all(|&m| self.online_replicas(m) >= want)
    }

    /// Replicas of node `i` whose link is up and synced (`state=online`).
    pub fn online_replicas(&self, i: usize) -> usize {
        self.nodes[i]
            .try_cmd::<String>(&["INFO", "replication"])
            .map(|s| {
                s.lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// Waits up to `timeout` for [`Cluster::ready`].
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        wait_until(timeout, || self.ready())
    }

    /// Waits up to `timeout` until a live node other than `old` masters
    /// `key`'s slot, as every live node agrees; returns it and how long
    /// that took.
    pub fn wait_new_master(
        &self,
        key: &str,
        old: usize,
        timeout: Duration,
    ) -> Option<(usize, Duration)> {
        let t0 = Instant::now();
        let mut found = None;
        wait_until(timeout, || {
            found = self.master_of(key).filter(|&m| m != old);
            found.is_some()
        });
        found.map(|m| (m, t0.elapsed()))
    }

    /// The replica of master `m` (the first, by `INFO replication`).
    pub fn replica_of(&self, m: usize) -> usize {
        let info: String = self.nodes[m].cmd(&["INFO", "replication"]);
        let port = info
            .lines()
            .find_map(|l| {
                let rest = l.strip_prefix("slave0:")?;
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix("port="))?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("node {m} has no replica: {info}"));
        self.index_of(port)
    }

    /// SIGKILLs node `i` (by pid).
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// Starts node `i` again on its port with its `nodes.conf`: it rejoins
    /// and, when its slots moved on, becomes a replica of their new master.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
    }

    /// `CLUSTER NODES` of a live node, for failure messages.
    pub fn describe(&self) -> String {
        (0..self.nodes.len())
            .find(|&i| self.alive(i))
            .and_then(|i| self.nodes[i].try_cmd::<String>(&["CLUSTER", "NODES"]))
            .unwrap_or_else(|| "(no node answers)".into())
    }
}

/// A limiter for `config` (its `[redis] quota_nodes`, timeout and
/// `quota_replicas`), connected as the daemon connects it.
pub async fn limiter(config: &Config) -> Limiter {
    assert!(
        !config.redis.quota_nodes.is_empty(),
        "the config names no quota_nodes"
    );
    // The standalone URL is not used when quota_nodes are set.
    let target = QuotaTarget::of(
        config,
        quota_worker::conn::Master::Url(RedisUrl::new("redis://127.0.0.1:1/0")),
    );
    let conn = target
        .connect(config.redis.timeout, 2)
        .await
        .expect("connect to the cluster");
    Limiter::new(
        conn,
        std::sync::Arc::new(Quotas::new(config)),
        config.redis.timeout,
    )
    .with_replicas(config.redis.quota_replicas)
}

#[cfg(test)]
mod tests {
    use super::parse_nodes;

    #[test]
    fn cluster_nodes_lines_parse() {
        let text = "\
a1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:30002@40002 master,fail - 0 0 2 connected 5461-10922 16000
c3 127.0.0.1:30003@40003 slave a1 0 0 1 connected
";
        let n = parse_nodes(text);
        assert_eq!(n.len(), 3);
        assert!(n[0].master && !n[0].failing && n[0].slots == vec![(0, 5460)]);
        assert!(n[1].failing && n[1].slots == vec![(5461, 10922), (16000, 16000)]);
        assert!(!n[2].master && n[2].port == 30003);
    }
}
