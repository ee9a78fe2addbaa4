//! Promise: a Redis clock stepped backwards (an NTP step, a failover to a
//! replica whose clock is behind) admits no more than the limit.
//!
//! A fixed window needs the script's monotonic clock: stepped back across
//! its reset, `now` would fall in the previous period, whose count the
//! script no longer has, and the window would start again from 0. A sliding
//! window needs nothing: its entries look younger, so they expire later.

use chrono::{DateTime, Utc};
use quota_worker::config::Config;
use quota_worker::quota::{Decision, RejectedBy, request_id};

use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn config() -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("daily", "D")
                .window(Window::fixed(3, "1d").reset("00:00").timezone("UTC")),
        )
        .credential(Credential::env("hourly", "H").window(Window::sliding(3, "1h")))
        .endpoint(Endpoint::new("d", "daily", 1))
        .endpoint(Endpoint::new("h", "hourly", 1))
        .write()
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).expect("time").to_utc()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_back_across_a_reset_admits_nothing_more() {
    // Two seconds into a new UTC day.
    let mut server = RedisServer::start_at(at("2026-03-10T00:00:02Z"));
    let cfg = config();
    let config = Config::load(&cfg.path()).expect("config");

    let limiter = support::limiter(&server, &config).await;
    for endpoint in ["d", "h"] {
        for i in 0..3 {
            let d = limiter
                .spend(endpoint, None, &request_id())
                .await
                .expect("spend");
            assert!(d.is_allowed(), "{endpoint} spend {i}: {d:?}");
        }
        let d = limiter
            .spend(endpoint, None, &request_id())
            .await
            .expect("spend");
        assert!(!d.is_allowed(), "{endpoint}: the 4th is over the limit");
    }

    // The clock steps back 10 s, to the previous day, data kept.
    let _: String = server.cmd(&["SAVE"]);
    server.restart_at(at("2026-03-09T23:59:52Z"));
    assert!(
        server.time_us() < at("2026-03-10T00:00:00Z").timestamp_micros(),
        "the clock did not step back"
    );
    let limiter = support::limiter(&server, &config).await;

    for endpoint in ["d", "h"] {
        let d = limiter
            .spend(endpoint, None, &request_id())
            .await
            .expect("spend");
        let Decision::Rejected(r) = d else {
            panic!("{endpoint}: admitted past its limit after the clock stepped back: {d:?}");
        };
        assert_eq!(r.by, RejectedBy::Window(1), "{endpoint}");
        assert_eq!(r.remaining, 0, "{endpoint}");
    }
    // And peek agrees: the windows still hold the 3 units each.
    for credential in ["daily", "hourly"] {
        let u = limiter.peek(credential).await.expect("peek");
        assert_eq!(u.windows[0].used, 3, "{credential}: {u:?}");
    }
}
