//! Promise (SPEC Part 2, "`trigger --wait` exit codes"): `trigger JOB
//! --wait` exits 0 when every task of the tick ended `done` or `superseded`
//! (`trigger::trigger_wait_prints_a_one_line_summary_and_exits_0`), 75 when
//! any ended `quota_exhausted` or `upstream_throttled`, its summary naming
//! the earliest retry-after, and 1 when any ended `failed`.

use std::time::Duration;

use quota_worker::conn::Lua;
use simulator::Fault;

use crate::support::keys::keys;
use crate::support::machine;
use crate::support::rig::Rig;
use crate::support::upstream::Upstream;
use crate::support::world::{self, JOB};
use crate::support::{self, RedisServer};

/// Runs `trigger JOB --wait` against a daemon on its own Redis and
/// `upstream`, after `before` (given the config and the Redis); returns the
/// exit code and the summary line.
fn trigger_wait(
    upstream: &Upstream,
    before: impl FnOnce(&support::TestConfig, &RedisServer),
) -> (Option<i32>, String) {
    let redis = RedisServer::start();
    let cfg = world::config(world::job(&upstream.base_url()).pages(1)).write();
    before(&cfg, &redis);
    let t = Rig::start(redis, cfg, &[]).trigger(JOB);
    let lines: Vec<&str> = t.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{t:#?}");
    (t.code, lines[1].to_owned())
}

/// The duration in a summary's " (retry after 59m 58s)".
fn retry_after(summary: &str) -> Duration {
    let (_, rest) = summary
        .split_once("(retry after ")
        .unwrap_or_else(|| panic!("no retry-after in {summary:?}"));
    let text = rest.strip_suffix(')').expect("closing paren");
    humantime::parse_duration(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// Regression: the summary read `#retry_after_ms`, which nothing wrote, so
/// its "retry after" never printed; and the exit code was 0 whatever the
/// tasks' outcomes.
#[test]
fn a_tick_refused_by_the_quota_exits_75_naming_when_to_retry() {
    let upstream = Upstream::start(1, 2);
    // The credential's only window (1,000,000 units per hour) spent at once.
    let (code, summary) = trigger_wait(&upstream, |cfg, redis| {
        let o = cfg.run_on(redis, &["spend", world::ENDPOINT, "--cost", "1000000"]);
        assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
    });
    assert_eq!(code, Some(75), "{summary}");
    assert!(
        summary.contains(": 8 task(s) ended: 8 quota_exhausted (retry after "),
        "{summary}"
    );
    // The window frees an hour after the spend, a few seconds ago.
    let wait = retry_after(&summary);
    assert!(
        wait > Duration::from_secs(55 * 60) && wait <= Duration::from_secs(3600),
        "{summary}"
    );
    assert_eq!(upstream.fetched(), 0, "nothing was sent");
}

#[test]
fn a_tick_the_upstream_throttled_exits_75_naming_when_to_retry() {
    let upstream = Upstream::start(1, 2);
    upstream.inject(
        Fault::TooManyRequests {
            retry_after_secs: 120,
        },
        1,
    );
    let (code, summary) = trigger_wait(&upstream, |_, _| {});
    assert_eq!(code, Some(75), "{summary}");
    assert!(summary.contains("1 upstream_throttled"), "{summary}");
    // The credential is blocked for the upstream's Retry-After, 120 s.
    let wait = retry_after(&summary);
    assert!(
        wait > Duration::from_secs(90) && wait <= Duration::from_secs(120),
        "{summary}"
    );
}

#[test]
fn a_tick_with_a_failed_task_exits_1() {
    let upstream = Upstream::start(1, 2);
    upstream.inject(Fault::Status(400), 1);
    let (code, summary) = trigger_wait(&upstream, |_, _| {});
    assert_eq!(code, Some(1), "{summary}");
    assert!(
        summary.ends_with(": 8 task(s) ended: 7 done, 1 failed"),
        "{summary}"
    );
}

/// The summary names the *earliest* retry-after of the tick's tasks: each
/// task's end (`lua/finish.lua`) keeps the smaller of its own retry moment
/// and the one already stored, on Redis's clock; an outcome that did not end
/// on a quota leaves it alone.
#[test]
fn the_tick_keeps_its_earliest_retry_moment() {
    let _machine = machine::timing();
    let redis = RedisServer::start();
    let finish = Lua::new(include_str!("../../lua/finish.lua"));
    let outcomes = keys().tick_outcomes("j", 1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let retry_at = rt.block_on(async {
        let url = quota_worker::config::RedisUrl::new(redis.url());
        let mut conn = quota_worker::conn::connect(
            &quota_worker::conn::Master::Url(url.clone()),
            Duration::from_secs(5),
            "test",
        )
        .await
        .expect("connect");
        for (task, outcome, retry_ms) in [
            ("t1", "quota_exhausted", "5000"),
            ("t2", "upstream_throttled", "1000"),
            ("t3", "quota_exhausted", "9000"),
            ("t4", "done", ""),
        ] {
            let () = finish
                .call()
                .key(keys().task_done(task))
                .key(&outcomes)
                .arg(outcome)
                .arg(outcome)
                .arg(60)
                .arg(retry_ms)
                .invoke(&mut conn)
                .await
                .expect("finish.lua");
        }
        redis::AsyncCommands::hget::<_, _, u64>(&mut conn, &outcomes, "#retry_at_ms")
            .await
            .expect("#retry_at_ms")
    });
    let now_ms = (redis.time_us() / 1000) as u64;
    assert!(
        retry_at > now_ms && retry_at <= now_ms + 1000,
        "kept {retry_at}, Redis time now {now_ms}: the earliest is 1 s after the second call"
    );
    let counts: Vec<(String, String)> = redis.cmd(&["HGETALL", &outcomes]);
    assert!(
        counts.contains(&("quota_exhausted".into(), "2".into())),
        "{counts:?}"
    );
    assert!(redis.cmd::<i64>(&["TTL", &outcomes]) > 0, "expires");
}
