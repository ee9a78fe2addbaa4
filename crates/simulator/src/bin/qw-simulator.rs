//! `qw-simulator`: the simulated metered API as a process of its own, for
//! benchmarks that drive programs other than quota-worker against the very
//! same upstream (benches/bullmq/run: BullMQ and quota-worker side by side).
//!
//! It serves [`simulator::Simulator`] (YouTube's costs and 403
//! `quotaExceeded`) on a free port of 127.0.0.1, with the keys given on the
//! command line, each metered by a sliding window of its own, and a second
//! listener, also on a free loopback port, that answers `GET /stats` with
//! what the upstream saw per key, as JSON. Both URLs are written to
//! `--addr-file` once they listen. It runs until it is killed (SIGTERM,
//! SIGINT): nothing it holds needs saving.
//!
//! ```text
//! qw-simulator --key a:40:15 --key b:1000000000:3600 --addr-file sim.json
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use clap::Parser;
use serde_json::{Value, json};
use simulator::{KeyQuota, SimConfig, SimStats, Simulator};

/// Serve the simulated metered API on 127.0.0.1 until killed.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// An API key and its sliding window, `NAME:UNITS:SECONDS` (repeat
    /// for more keys): at most UNITS in any trailing SECONDS, 403
    /// `quotaExceeded` above it.
    #[arg(long = "key", value_parser = parse_key, required = true)]
    keys: Vec<KeyQuota>,
    /// Pages every query has.
    #[arg(long, default_value_t = 1)]
    pages: u32,
    /// Items on each page.
    #[arg(long, default_value_t = 1)]
    items: u32,
    /// Where to write `{"url": ..., "stats": ...}` once both listen.
    #[arg(long)]
    addr_file: PathBuf,
}

fn parse_key(s: &str) -> Result<KeyQuota, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [name, units, secs] = parts[..] else {
        return Err(format!("{s:?}: expected NAME:UNITS:SECONDS"));
    };
    let units: u64 = units.parse().map_err(|e| format!("{s:?}: UNITS: {e}"))?;
    let secs: u64 = secs.parse().map_err(|e| format!("{s:?}: SECONDS: {e}"))?;
    if name.is_empty() || units == 0 || secs == 0 {
        return Err(format!("{s:?}: a name, and UNITS and SECONDS above 0"));
    }
    Ok(KeyQuota::new(name, units, Duration::from_secs(secs)))
}

/// The simulator and the windows its keys were given, for `/stats`.
struct Served {
    sim: Simulator,
    keys: Vec<KeyQuota>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let config = SimConfig {
        keys: args.keys.clone(),
        pages_per_query: args.pages,
        items_per_page: args.items,
        ..SimConfig::default()
    };
    let sim = Simulator::start(config).await?;
    let url = sim.base_url();
    let served = Arc::new(Served {
        sim,
        keys: args.keys,
    });
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await?;
    let stats_url = format!("http://{}/stats", listener.local_addr()?);
    // Written whole, then renamed: a reader polling for the file never
    // sees half of it.
    let tmp = args.addr_file.with_extension("tmp");
    std::fs::write(&tmp, json!({ "url": url, "stats": stats_url }).to_string())?;
    std::fs::rename(&tmp, &args.addr_file)?;
    let app = Router::new().route("/stats", get(stats)).with_state(served);
    axum::serve(listener, app).await
}

async fn stats(State(served): State<Arc<Served>>) -> axum::Json<Value> {
    let all = served.sim.stats();
    let keys: serde_json::Map<String, Value> = served
        .keys
        .iter()
        .map(|q| (q.key.clone(), key_stats(&all, q)))
        .collect();
    axum::Json(json!({ "keys": keys, "invalid_keys": all.invalid_keys }))
}

/// What the upstream saw of one key: its counters, when its first request
/// came and its last charge was made (Unix ms), the most units charged in
/// any trailing window of its own length, and the most requests (answered
/// anyhow) in any trailing second: a burst's size.
fn key_stats(all: &SimStats, q: &KeyQuota) -> Value {
    let k = all.key(&q.key);
    let charges: Vec<_> = all.charges.iter().filter(|c| c.key == q.key).collect();
    let requests: Vec<_> = all
        .requests
        .iter()
        .filter(|r| r.key.as_deref() == Some(q.key.as_str()))
        .collect();
    let mut received: Vec<i64> = requests
        .iter()
        .map(|r| r.received.timestamp_millis())
        .collect();
    received.sort_unstable();
    let mut burst = 0;
    let mut start = 0;
    for end in 0..received.len() {
        while received[end] - received[start] >= 1000 {
            start += 1;
        }
        burst = burst.max(end - start + 1);
    }
    json!({
        "window_units": q.units,
        "window_secs": q.per.as_secs_f64(),
        "requests": requests.len(),
        "ok": k.ok,
        "units": k.units,
        "quota_errors": k.quota_errors,
        "first_request_ms": received.first(),
        "first_charge_ms": charges.first().map(|c| c.time.timestamp_millis()),
        "last_charge_ms": charges.last().map(|c| c.time.timestamp_millis()),
        "max_units_in_window": all.max_units_in_any_window(&q.key, q.per),
        "max_requests_in_1s": burst,
    })
}
