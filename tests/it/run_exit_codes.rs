//! Promise (docs/commands.md, "`run`: exit codes per cause"): `quota-worker
//! run` that cannot run says why and exits with a code that names the cause:
//! 78 (EX_CONFIG) when the config asks for what this host cannot give, such
//! as a metrics address another process holds; 69 (EX_UNAVAILABLE) when
//! Redis stays unreachable. Config errors (78) are pinned by `config_errors`,
//! a missing `redis-server` and a state directory in use (69) by `embedded`.

use std::time::{Duration, Instant};

use crate::support;
use crate::support::daemon;
use crate::support::machine;
use crate::support::process::Proc;

/// Regression (issue 14): with its metrics port taken, the daemon first
/// waited up to 30 s for Redis, and when Redis was down too it reported
/// "Redis ... is unreachable" and exited 69, as if starting Redis would fix
/// it. The address is now taken before Redis is waited for.
#[test]
fn a_metrics_address_in_use_exits_78_at_once_even_with_redis_down() {
    let _machine = machine::timing();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let listen = taken.local_addr().expect("addr").to_string();
    // Nothing listens on the Redis port.
    let dead = format!("redis://127.0.0.1:{}/0", support::free_port());
    let cfg = daemon::config(daemon::job("http://127.0.0.1:9")).write();
    let t = Instant::now();
    let mut d = Proc::sim_cli(
        "daemon",
        &cfg,
        Some(&dead),
        &["run"],
        &[("QUOTA_WORKER_METRICS_LISTEN", listen.as_str())],
    );
    let status = d.wait_exit(Duration::from_secs(40));
    let took = t.elapsed();
    let err = d.log();
    assert_eq!(status.and_then(|s| s.code()), Some(78), "stderr:\n{err}");
    assert!(
        err.contains(&format!("metrics cannot listen on {listen}"))
            && err.contains("in use")
            && err.contains("[metrics] listen"),
        "names the address, the cause and the setting:\n{err}"
    );
    assert!(!err.contains("unreachable"), "not a Redis problem:\n{err}");
    assert!(
        took < Duration::from_secs(10),
        "said at once, not after waiting for Redis: {took:?}"
    );
    drop(taken);
}

/// Redis that never answers: 30 s of retries (docs/service.md: systemd's
/// `Restart=on-failure` then tries again), then 69 naming Redis.
#[test]
fn redis_unreachable_exits_69_after_its_patience() {
    let dead = format!("redis://127.0.0.1:{}/0", support::free_port());
    let cfg = daemon::config(daemon::job("http://127.0.0.1:9")).write();
    let mut d = Proc::sim_cli("daemon", &cfg, Some(&dead), &["run"], &[]);
    let status = d.wait_exit(Duration::from_secs(60));
    let err = d.log();
    assert_eq!(status.and_then(|s| s.code()), Some(69), "stderr:\n{err}");
    assert!(
        err.contains("is unreachable"),
        "says Redis is unreachable:\n{err}"
    );
}
