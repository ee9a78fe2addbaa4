//! Promise: the spend script runs unchanged on Redis Cluster — every key of
//! one spend carries the credential's hash tag, so it lands in one slot.

use crate::support;

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::quota::{Quotas, script};
use support::{RedisServer, TestConfig, wait_until};

const CONFIG: &str = r#"
[credentials.alpha]
secret_env = "A"
windows = [{ units = 10, per = "1h" }, { units = 1000, per = "24h" }]

[credentials.beta]
secret_env = "B"
windows = [{ units = 5, per = "1h" }]

[endpoints.a]
credential = "alpha"
cost = 1
windows = [{ units = 8, per = "10m" }]

[endpoints.b]
credential = "beta"
cost = 1
"#;

/// A port whose cluster bus port (+10000) is usable too.
fn cluster_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

struct Cluster {
    nodes: Vec<RedisServer>,
}

impl Cluster {
    fn start(n: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| {
                let port = cluster_port().to_string();
                RedisServer::start_on_port(
                    port.parse().expect("port"),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                    ],
                )
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create (redis-tools)");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let ok = wait_until(Duration::from_secs(20), || {
            nodes.iter().all(|s| {
                let info: String = s.cmd(&["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
            })
        });
        assert!(ok, "cluster did not reach cluster_state:ok");
        Cluster { nodes }
    }

    fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port()))
            .collect()
    }
}

#[tokio::test]
async fn spends_run_unchanged_on_a_three_node_cluster() {
    let cluster = Cluster::start(3);
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let quotas = Quotas::new(&config);

    // Every key of a spend hashes to the slot of its credential's tag.
    for (endpoint, tag) in [("a", "{alpha}"), ("b", "{beta}")] {
        let plan = &quotas.endpoint(endpoint).expect("endpoint").plan;
        let want: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", tag]);
        for k in &plan.keys {
            let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", k]);
            assert_eq!(slot, want, "{k} is not in {tag}'s slot");
        }
    }

    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let conn = client
        .get_async_connection()
        .await
        .expect("cluster connection");
    let spend = |endpoint: &'static str, id: String| {
        let plan = quotas.endpoint(endpoint).expect("endpoint").plan.clone();
        let mut conn = conn.clone();
        async move {
            let mut call = script().call();
            call.key(&plan.keys).arg(plan.args("spend", &id, "1"));
            let r: Vec<i64> = call.invoke(&mut conn).await.expect("spend on the cluster");
            r[0] == 1
        }
    };
    // alpha: the endpoint's 8-per-10m window is the tightest.
    let mut allowed = 0;
    for i in 0..12 {
        if spend("a", format!("a-{i}")).await {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 8);
    // beta: its own 5-per-hour window, on whichever node owns {beta}.
    let mut allowed = 0;
    for i in 0..7 {
        if spend("b", format!("b-{i}")).await {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 5);

    // The script was loaded where it ran: a node that never saw it gets it on
    // NOSCRIPT, so flushing every node's scripts costs no failed spend.
    for node in &cluster.nodes {
        let _: String = node.cmd(&["SCRIPT", "FLUSH"]);
    }
    assert!(
        !spend("b", "b-after-flush".into()).await,
        "beta's window is still full"
    );
}
