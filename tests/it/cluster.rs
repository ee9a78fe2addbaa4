//! Promise: the spend script runs unchanged on Redis Cluster — every key of
//! one spend carries the credential's hash tag, so it lands in one slot.

use quota_worker::config::Config;
use quota_worker::quota::{Quotas, script};

use crate::support::cluster::Cluster;
use crate::support::{ConfigBuilder, Credential, Endpoint, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("alpha", "A")
                .window(Window::sliding(10, "1h"))
                .window(Window::sliding(1000, "24h")),
        )
        .credential(Credential::env("beta", "B").window(Window::sliding(5, "1h")))
        .endpoint(Endpoint::new("a", "alpha", 1).window(Window::sliding(8, "10m")))
        .endpoint(Endpoint::new("b", "beta", 1))
        .write()
}

#[tokio::test]
async fn spends_run_unchanged_on_a_three_node_cluster() {
    let cluster = Cluster::start(3);
    let cfg = config();
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
            call.key(&plan.keys).arg(plan.args(
                "spend",
                &id,
                "1",
                quota_worker::config::Reserve::NONE,
            ));
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
