//! Promise: a fixed window resets exactly at its reset time in its time zone,
//! whatever DST does that day. Redis's clock is moved to just before local
//! midnight around a DST change (`RedisServer::start_at`); a full window's
//! retry-after is the time to the reset, a spend just before it is refused,
//! one just after it is admitted, and the next period is as long as the local
//! day really is (23 or 25 hours).

use std::time::Duration;

use chrono::{DateTime, Utc};
use quota_worker::config::Config;
use quota_worker::quota::{Decision, RejectedBy, request_id};

use crate::support::machine;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, TestConfig, Window};

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("RFC 3339 time")
        .with_timezone(&Utc)
}

fn config(per: &str, timezone: &str) -> TestConfig {
    ConfigBuilder::new()
        .credential(
            Credential::env("k", "K")
                .window(Window::fixed(3, per).reset("00:00").timezone(timezone)),
        )
        .endpoint(Endpoint::new("one", "k", 1))
        .write()
}

/// Expects a rejection whose retry-after points at `reset_us`, given that the
/// spend ran between Redis times `before` and `after`.
fn assert_retry_to(d: &Decision, reset_us: i64, before: i64, after: i64, what: &str) {
    let Decision::Rejected(r) = d else {
        panic!("{what}: expected a rejection, got {d:?}");
    };
    assert_eq!(r.by, RejectedBy::Window(1), "{what}");
    let ms = r.retry_after.as_millis() as i64;
    let lo = (reset_us - after) / 1000 - 2;
    let hi = (reset_us - before) / 1000 + 2;
    assert!(
        (lo..=hi).contains(&ms),
        "{what}: retry_after {ms} ms, expected the time to the reset, {lo}..={hi} ms"
    );
}

/// How long before the reset Redis's clock starts.
const LEAD_US: i64 = 3_000_000;
/// The window must be full this long before the reset (room for the probe).
const FULL_BY_US: i64 = 1_000_000;
/// When the probe just before the reset runs: early enough that a loaded
/// machine still finishes it before the reset, late enough to be "just
/// before" (its retry-after is checked to the millisecond either way).
const PROBE_BEFORE_US: i64 = 500_000;
/// Attempts at the scenario before giving up: one that ran late proved
/// nothing (see [`Late`]) and is run again on a fresh server.
const ATTEMPTS: usize = 3;

/// Why an attempt proved nothing: a step that had to finish before the
/// reset finished after it (a loaded machine), so which side of the reset
/// it ran on is unknown. Never returned for a wrong answer: those panic.
#[derive(Debug)]
struct Late(String);

/// Fills the window just before `reset`, checks it reopens exactly at
/// `reset`, and that the next period ends at `next_reset`; an attempt that
/// ran late is repeated, up to [`ATTEMPTS`] times.
async fn resets_at(per: &str, timezone: &str, reset: &str, next_reset: &str) {
    let (reset, next_reset) = (at(reset), at(next_reset));
    let mut late = Vec::new();
    for n in 1..=ATTEMPTS {
        match attempt(per, timezone, reset, next_reset).await {
            Ok(()) => return,
            Err(Late(why)) => {
                eprintln!("attempt {n} of {ATTEMPTS} ran late, run again: {why}");
                late.push(why);
            }
        }
    }
    panic!("every attempt ran late: {late:?}");
}

async fn attempt(
    per: &str,
    timezone: &str,
    reset: DateTime<Utc>,
    next_reset: DateTime<Utc>,
) -> Result<(), Late> {
    let reset_us = reset.timestamp_micros();
    let start = DateTime::from_timestamp_micros(reset_us - LEAD_US).expect("a time");
    let server = RedisServer::start_at(start);
    let cfg = config(per, timezone);
    let config = Config::load(&cfg.path()).expect("config");
    let limiter = support::limiter(&server, &config).await;
    let spend = || async {
        limiter
            .spend("one", None, &request_id())
            .await
            .expect("spend")
    };

    for left in [2, 1, 0] {
        assert_eq!(spend().await, Decision::Allowed { remaining: left });
    }
    let (t0, d, t1) = (server.time_us(), spend().await, server.time_us());
    if t1 >= reset_us - FULL_BY_US {
        return Err(Late(format!(
            "the window was full only {} ms before the reset",
            (reset_us - t1) / 1000
        )));
    }
    assert_retry_to(&d, reset_us, t0, t1, "full window before the reset");

    server.sleep_until_us(reset_us - PROBE_BEFORE_US);
    let (t0, d, t1) = (server.time_us(), spend().await, server.time_us());
    if t1 >= reset_us {
        return Err(Late(format!(
            "the probe before the reset ended {} ms after it",
            (t1 - reset_us) / 1000
        )));
    }
    assert_retry_to(&d, reset_us, t0, t1, "just before the reset");

    server.sleep_until_us(reset_us + 20_000);
    assert_eq!(
        spend().await,
        Decision::Allowed { remaining: 2 },
        "the window reopens at {reset}"
    );
    for left in [1, 0] {
        assert_eq!(spend().await, Decision::Allowed { remaining: left });
    }
    let (t0, d, t1) = (server.time_us(), spend().await, server.time_us());
    assert_retry_to(
        &d,
        next_reset.timestamp_micros(),
        t0,
        t1,
        "the new period runs to the next local reset",
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn los_angeles_midnight_before_spring_forward_starts_a_23_hour_day() {
    let _machine = machine::timing();
    // 2026-03-08: PST (UTC-8) until 02:00, then PDT (UTC-7). Midnight is
    // 08:00 UTC that day and 07:00 UTC the next.
    resets_at(
        "24h",
        "America/Los_Angeles",
        "2026-03-08T08:00:00Z",
        "2026-03-09T07:00:00Z",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn los_angeles_midnight_before_fall_back_starts_a_25_hour_day() {
    let _machine = machine::timing();
    // 2026-11-01: PDT until 02:00, then PST. Midnight is 07:00 UTC that day
    // and 08:00 UTC the next.
    resets_at(
        "24h",
        "America/Los_Angeles",
        "2026-11-01T07:00:00Z",
        "2026-11-02T08:00:00Z",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn los_angeles_after_spring_forward_next_midnight_is_in_pdt() {
    let _machine = machine::timing();
    // 2026-03-08 23:59:58 PDT: the first midnight on summer time, 07:00 UTC
    // (an offset taken at the period's start, PST, would say 08:00).
    resets_at(
        "24h",
        "America/Los_Angeles",
        "2026-03-09T07:00:00Z",
        "2026-03-10T07:00:00Z",
    )
    .await;
}

/// Regression: a reset that falls in the hour DST skips (02:00 on the night
/// Los Angeles springs forward) used to make the period "end" an hour in the
/// past, so a full window answered retry_after = 1 ms for the whole hour and
/// callers retried in a busy loop. The period ends when the clock jumps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_reset_in_the_skipped_hour_is_the_jump_not_one_millisecond() {
    let _machine = machine::timing();
    // Hourly windows; 01:59:58 PST, then 03:00 PDT (10:00 UTC); the next hour
    // starts at 04:00 PDT (11:00 UTC).
    resets_at(
        "1h",
        "America/Los_Angeles",
        "2026-03-08T10:00:00Z",
        "2026-03-08T11:00:00Z",
    )
    .await;
}

/// Regression, as above, for a daily window in a zone whose DST starts at
/// midnight: Santiago goes from 2026-09-05 23:59:59 -04 to 2026-09-06
/// 01:00 -03 (04:00 UTC), so local midnight never happens and the day starts
/// at the jump; that day has 23 hours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_santiago_midnight_skipped_by_dst_resets_at_the_jump() {
    let _machine = machine::timing();
    resets_at(
        "24h",
        "America/Santiago",
        "2026-09-06T04:00:00Z",
        "2026-09-07T03:00:00Z",
    )
    .await;
}

#[test]
fn fake_clock_moves_redis_time() {
    let _machine = machine::timing();
    // The harness this file relies on: Redis's TIME and key expiry follow the
    // shifted clock, and it runs in real time.
    let start = at("2026-03-08T07:59:58Z");
    let server = RedisServer::start_at(start);
    let t0 = server.time_us();
    assert!(t0 - start.timestamp_micros() < 5_000_000);
    // About time: the shifted clock runs in real time.
    std::thread::sleep(Duration::from_millis(200));
    let t1 = server.time_us();
    assert!((150_000..1_000_000).contains(&(t1 - t0)), "{t0} -> {t1}");
}
