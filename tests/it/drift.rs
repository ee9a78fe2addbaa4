//! Promise: drift. When the upstream reports fewer units left than a window
//! would admit, `Limiter::sync` records the difference as units spent now,
//! in the window's own state (sliding, fixed and bucket alike), so the window
//! admits no more than the upstream allows; it never raises what a window
//! admits; the drift expires with the window; `quota --json` shows it per
//! window and `qw_drift_units_total{credential}` counts it.

use std::time::{Duration, Instant};

use quota_worker::config::{Config, Scope};
use quota_worker::quota::{Decision, QuotaError, request_id};

use crate::support::{self, RedisServer, TestConfig, machine};

const CONFIG: &str = r#"
[credentials.k]
secret_env = "K"
windows = [{ units = 100, per = "1h" }, { units = 500, per = "24h", kind = "fixed" }]

[endpoints.e]
credential = "k"
cost = 1
windows = [{ kind = "bucket", units = 50, per = "10s" }]

[credentials.short]
secret_env = "S"
windows = [{ units = 10, per = "2s" }]

[endpoints.s]
credential = "short"
cost = 1
"#;

/// (used, remaining, drift) of every window of `credential`.
async fn state(limiter: &quota_worker::quota::Limiter, credential: &str) -> Vec<(u64, u64, u64)> {
    let u = limiter.peek(credential).await.expect("peek");
    u.windows
        .iter()
        .map(|w| (w.used, w.remaining, w.drift))
        .collect()
}

#[tokio::test]
async fn drift_lowers_what_a_window_admits_and_never_raises_it() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);

    support::admit_n(&limiter, "e", 10).await;
    // The credential's sliding hour: we count 10 used, 90 left; the upstream
    // says 50 left: 40 units of drift.
    let hour = limiter
        .quotas()
        .window_index("k", &Scope::Credential, &config.credentials["k"].windows[0])
        .expect("the hour");
    assert_eq!(hour, 0);
    assert_eq!(limiter.sync("k", hour, 50, None).await.expect("sync"), 40);
    assert_eq!(state(&limiter, "k").await[0], (50, 50, 40));

    // An upstream that reports more left than we admit changes nothing.
    assert_eq!(limiter.sync("k", hour, 80, None).await.expect("sync"), 0);
    assert_eq!(limiter.sync("k", hour, 50, None).await.expect("sync"), 0);
    assert_eq!(state(&limiter, "k").await[0], (50, 50, 40));

    // The window admits what the upstream allows (the endpoint's bucket,
    // a burst of 50, takes these 40 too).
    support::admit_n(&limiter, "e", 40).await;
    // The bucket's last change: it refills from here.
    let refilling = Instant::now();
    assert_eq!(state(&limiter, "k").await[0], (90, 10, 40));

    // Fixed day and bucket: drift in their own state too.
    assert_eq!(
        limiter.sync("k", 1, 400, None).await.expect("sync"),
        500 - 50 - 400
    );
    assert_eq!(state(&limiter, "k").await[1], (100, 400, 50));
    // The bucket (50, refilling 5 per second) refills for a second, then the
    // upstream says it has none left: the refilled units are drift.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let drift = limiter.sync("k", 2, 0, None).await.expect("sync");
    // 5 a second since its last change, at least the second slept (a loaded
    // machine takes longer between the calls: 7 was seen).
    let most = (5.0 * refilling.elapsed().as_secs_f64()).ceil() as u64 + 1;
    assert!(
        (4..=most).contains(&drift),
        "about 5 units refilled: {drift} (at most {most})"
    );
    let after = state(&limiter, "k").await[2];
    assert_eq!((after.0, after.1), (50, 0), "{after:?}");
    assert!(
        after.2 + 1 >= drift,
        "the drift still in the bucket: {after:?}"
    );
    assert!(matches!(
        limiter
            .spend("e", None, &request_id())
            .await
            .expect("spend"),
        Decision::Rejected(_)
    ));

    // A window the credential does not have is refused.
    assert!(matches!(
        limiter.sync("k", 3, 0, None).await,
        Err(QuotaError::UnknownWindow { .. })
    ));

    let text = metrics.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("qw_drift_units_total{credential=\"k\"}"))
        .unwrap_or_else(|| panic!("no drift counter in:\n{text}"));
    let counted: u64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("value");
    assert_eq!(counted, 40 + 50 + drift, "{line}");
}

#[tokio::test]
async fn drift_expires_with_the_window() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
    assert!(
        limiter
            .spend("s", None, &request_id())
            .await
            .expect("spend")
            .is_allowed()
    );
    assert_eq!(limiter.sync("short", 0, 2, None).await.expect("sync"), 7);
    assert_eq!(state(&limiter, "short").await, [(8, 2, 7)]);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(state(&limiter, "short").await, [(0, 10, 0)]);
}

#[test]
fn quota_json_shows_drift_per_window() {
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let limiter = support::limiter(&server, &Config::load(&cfg.path()).expect("config")).await;
        assert_eq!(limiter.sync("k", 0, 70, None).await.expect("sync"), 30);
    });
    let out = cfg.run_on(&server, &["quota", "k", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::stderr(&out));
    let j = support::json(&out);
    let windows = j["credentials"][0]["windows"].as_array().expect("windows");
    let drift: Vec<u64> = windows
        .iter()
        .map(|w| w["drift"].as_u64().expect("drift"))
        .collect();
    assert_eq!(drift, [30, 0, 0], "{j}");
    assert_eq!(windows[0]["used"], 30);
    assert_eq!(windows[0]["remaining"], 70);
}

/// SPEC Part 3, "Drift ends at the upstream's reset": drift recorded from
/// an answer that said when its count resets stops counting then, in every
/// kind of window (a refused spend's retry-after is that time), and from a
/// second after it the window admits what its own spends allow; drift from
/// an answer without a reset lives as spends do, until an operator's
/// `undrift` (`unblock --drift`) forgets it.
#[tokio::test]
async fn drift_with_a_reset_ends_then_and_undrift_forgets_every_kind() {
    let _machine = machine::timing();
    let server = RedisServer::start();
    let cfg = TestConfig::new(CONFIG, &[]);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    support::admit_n(&limiter, "e", 10).await;
    let reset = Some(Duration::from_millis(1500));
    // The hour, the day and the bucket: the upstream says none is left,
    // resetting in 1.5 s.
    assert_eq!(limiter.sync("k", 0, 0, reset).await.expect("sync"), 90);
    assert_eq!(limiter.sync("k", 1, 0, reset).await.expect("sync"), 490);
    let bucket = limiter.sync("k", 2, 0, reset).await.expect("sync");
    assert!((39..=41).contains(&bucket), "{bucket}");
    let s = state(&limiter, "k").await;
    assert_eq!((s[0], s[1]), ((100, 0, 90), (500, 0, 490)), "{s:?}");
    let d = limiter
        .spend("e", None, &request_id())
        .await
        .expect("spend");
    let Decision::Rejected(r) = d else {
        panic!("admitted: {d:?}")
    };
    assert!(
        r.retry_after > Duration::from_millis(1000) && r.retry_after <= Duration::from_millis(1500),
        "the drift ends at the reset: {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let s = state(&limiter, "k").await;
    assert_eq!((s[0], s[1]), ((10, 90, 0), (10, 490, 0)), "{s:?}");
    assert_eq!(s[2].2, 0, "the bucket's drift is gone too: {s:?}");
    assert!(
        limiter
            .spend("e", None, &request_id())
            .await
            .expect("spend")
            .is_allowed()
    );

    // Without a reset: spent now, for good; undrift forgets it.
    assert_eq!(limiter.sync("k", 0, 50, None).await.expect("sync"), 39);
    assert_eq!(limiter.sync("k", 1, 400, None).await.expect("sync"), 89);
    let s = state(&limiter, "k").await;
    assert_eq!((s[0], s[1]), ((50, 50, 39), (100, 400, 89)), "{s:?}");
    let forgot = limiter.undrift("k", &[None]).await.expect("undrift");
    let units: Vec<u64> = forgot.iter().map(|f| f.units).collect();
    assert_eq!(units[..2], [39, 89], "{forgot:?}");
    let s = state(&limiter, "k").await;
    assert_eq!((s[0], s[1]), ((11, 89, 0), (11, 489, 0)), "{s:?}");
    // Later drift counts again (the forgotten one stays forgotten).
    assert_eq!(limiter.sync("k", 0, 80, None).await.expect("sync"), 9);
    assert_eq!(state(&limiter, "k").await[0], (20, 80, 9));
}

// The same tests with the spend core by EVALSHA (a Redis without functions).
crate::evalsha_too!(
    drift_lowers_what_a_window_admits_and_never_raises_it,
    drift_expires_with_the_window,
    drift_with_a_reset_ends_then_and_undrift_forgets_every_kind,
);
