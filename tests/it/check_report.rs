//! Promise: `check` validates and then shows what the jobs can spend: each
//! job's next fire times and worst-case units per run (items × pages × cost),
//! and per window the worst case against its limit, warning when the jobs
//! cannot fit and saying when, from an empty window, the quota runs out; a
//! concurrent window's cap against the tasks the daemons it can see run at
//! once, warning about a lease shorter than a request's timeout.
//! Exit 0 when the configuration is valid, warnings or not.

use chrono::{DateTime, Duration, DurationRound, Utc};

use crate::support::{
    self, ConfigBuilder, Credential, Endpoint, Job, Request, Sink, TestConfig, Window,
};

const SECRET: (&str, &str) = ("QW_TEST_CHECK_SECRET", "not-a-real-key");

/// Two credentials on one secret, an endpoint each, and `job`.
fn config(job: Job) -> TestConfig {
    ConfigBuilder::new()
        .credential(Credential::env("yt", SECRET.0).window(Window::sliding(9500, "24h")))
        .endpoint(Endpoint::new("youtube.search.list", "yt", 100))
        .credential(Credential::env("gh", SECRET.0).window(Window::sliding(5000, "1h")))
        .endpoint(Endpoint::new("github.events", "gh", 1))
        .job(job)
        .write()
}

/// A search a minute per region, 100 units each: 800 units a run.
fn search_job() -> Job {
    search_on("search", "youtube.search.list")
}

/// [`search_job`] named `name`, on `endpoint`.
fn search_on(name: &str, endpoint: &str) -> Job {
    Job::new(name, endpoint)
        .schedule("0 * * * * *")
        .fan_out("region", ["US", "GB", "DE", "FR", "IN", "BR", "AU", "CA"])
        .request(
            Request::get("https://www.googleapis.com/youtube/v3/search")
                .query(&[("regionCode", "{region}"), ("key", "{secret}")]),
        )
        .sink(Sink::jsonl("data/{job}/{region}.jsonl"))
}

/// Events of eight repos twice an hour, up to 4 pages: 32 units a run.
fn events_job() -> Job {
    Job::new("events", "github.events")
        .schedule("0 */30 * * * *")
        .fan_out("repo", ["a", "b", "c", "d", "e", "f", "g", "h"])
        .request(
            Request::get("https://api.github.com/repos/x/{repo}/events")
                .headers(&[("Authorization", "Bearer {secret}")]),
        )
        .paginate("/next", "page", 4)
        .sink(Sink::jsonl("data/{job}/{repo}.jsonl"))
}

/// The `n`-th minute boundary strictly after `t`, as `check` prints it.
fn minute_after(t: DateTime<Utc>, n: i32) -> String {
    let floor = t.duration_trunc(Duration::minutes(1)).expect("trunc");
    (floor + Duration::minutes(i64::from(n)))
        .format("%Y-%m-%d %H:%M")
        .to_string()
}

/// `check`'s output; it exits 0, warnings or not.
fn check(cfg: &TestConfig) -> String {
    let out = cfg.run(&["check"], &[SECRET]);
    let text = support::stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        support::stderr(&out)
    );
    text
}

#[test]
fn a_job_that_cannot_fit_is_warned_about_with_when_it_runs_out() {
    let cfg = config(search_job());
    let before = Utc::now();
    let text = check(&cfg);
    let after = Utc::now();

    assert!(
        text.contains("worst case 800 units per run (8 item(s) x 1 page(s) x 100 unit(s))"),
        "{text}"
    );
    // A tick a minute: 1440 a day, 800 units each.
    let row = text
        .lines()
        .find(|l| l.contains("9500/24h"))
        .unwrap_or_else(|| panic!("no row for the 9500/24h window:\n{text}"));
    assert!(
        row.contains("1152000") && row.contains("DOES NOT FIT"),
        "{row}"
    );

    // 9500 / 800 = 11.9: the 12th tick runs out of quota.
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning:") && l.contains("9500/24h"))
        .unwrap_or_else(|| panic!("no warning:\n{text}"));
    assert!(warning.contains("credential yt"), "{warning}");
    let when: Vec<String> = [before, after]
        .iter()
        .map(|t| format!("runs out at {} UTC", minute_after(*t, 12)))
        .collect();
    assert!(
        when.iter().any(|w| warning.contains(w.as_str())),
        "expected {:?} in: {warning}",
        when[0]
    );

    // The next three fire times.
    let next: Vec<String> = (1..=3).map(|n| minute_after(before, n)).collect();
    let next_after: Vec<String> = (1..=3).map(|n| minute_after(after, n)).collect();
    assert!(
        [next, next_after]
            .iter()
            .any(|times| { times.iter().all(|t| text.contains(&format!("{t}:00 UTC"))) }),
        "{text}"
    );
}

#[test]
fn jobs_that_fit_get_no_warning() {
    let cfg = config(events_job());
    let text = check(&cfg);
    assert!(
        text.contains("worst case 32 units per run (8 item(s) x 4 page(s) x 1 unit(s))"),
        "{text}"
    );
    // Two ticks an hour at most: 64 of 5000.
    let row = text
        .lines()
        .find(|l| l.contains("5000/1h"))
        .unwrap_or_else(|| panic!("no row for the 5000/1h window:\n{text}"));
    assert!(row.contains(" 64 ") && row.contains("fits"), "{row}");
    assert!(!text.contains("warning"), "{text}");
    assert!(!text.contains("not-a-real-key"), "the secret leaked");
}

/// Issue 9, medium 7: `check` looked 7 days ahead only, so a job firing less
/// often than weekly counted nothing: a yearly job of 10,000 units against a
/// 9,500/24h window showed "0 units per 24h, fits".
#[test]
fn a_job_firing_less_often_than_weekly_is_counted_and_one_that_never_fires_again_is_not() {
    // Once a year, at noon UTC 15 days from now (always beyond a week):
    // 1 item x 100 pages x 100 units.
    let at = Utc::now() + Duration::days(15);
    let yearly = Job::new("yearly", "youtube.search.list")
        .schedule(&format!(
            "0 0 12 {} {} *",
            at.format("%-d"),
            at.format("%-m")
        ))
        .fan_out("region", ["US"])
        .request(
            Request::get("https://www.googleapis.com/youtube/v3/search")
                .query(&[("regionCode", "{region}"), ("key", "{secret}")]),
        )
        .paginate("/nextPageToken", "pageToken", 100)
        .sink(Sink::jsonl("data/{job}/{region}.jsonl"));
    // Its schedule's only year is past.
    let never = Job::new("never", "youtube.search.list")
        .schedule("0 0 0 1 1 * 2020")
        .fan_out("region", ["US"])
        .request(Request::get("https://www.googleapis.com/youtube/v3/search"))
        .sink(Sink::jsonl("data/{job}/{region}.jsonl"));
    let cfg = ConfigBuilder::new()
        .credential(Credential::env("yt", SECRET.0).window(Window::sliding(9500, "24h")))
        .endpoint(Endpoint::new("youtube.search.list", "yt", 100))
        .job(yearly)
        .job(never)
        .write();
    let text = check(&cfg);
    assert!(
        text.contains("worst case 10000 units per run (1 item(s) x 100 page(s) x 100 unit(s))"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.contains("9500/24h"))
        .unwrap_or_else(|| panic!("no row for the 9500/24h window:\n{text}"));
    assert!(
        row.contains(" 10000 units per 24h") && row.contains("DOES NOT FIT"),
        "{row}"
    );
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning:") && l.contains("9500/24h"))
        .unwrap_or_else(|| panic!("no warning:\n{text}"));
    let when = format!(
        "runs out at {} 12:00 UTC (a tick of job yearly)",
        at.format("%Y-%m-%d")
    );
    assert!(warning.contains(&when), "expected {when:?} in: {warning}");
    // The job that never fires again: no next time, nothing counted.
    let never_lines: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("job never"))
        .take(2)
        .collect();
    assert!(
        never_lines.len() == 2 && never_lines[1].contains("next: never"),
        "{text}"
    );
}

/// A bucket drains while the jobs spend, so it runs out later than a sliding
/// window of the same units and period: 800 units a minute into 2000 per 5m
/// (400 a minute back) runs out at the 5th tick (2000 after the 4th, 2400
/// after the 5th), where the sliding window runs out at the 3rd.
#[test]
fn a_bucket_runs_out_when_its_drain_no_longer_keeps_up() {
    let cfg = ConfigBuilder::new()
        .credential(Credential::env("yt", SECRET.0).window(Window::bucket(2000, "5m")))
        .endpoint(Endpoint::new("youtube.search.list", "yt", 100))
        .credential(Credential::env("gh", SECRET.0).window(Window::sliding(2000, "5m")))
        .endpoint(Endpoint::new("github.search", "gh", 100))
        .job(search_job())
        .job(search_on("search_gh", "github.search"))
        .write();
    let before = Utc::now();
    let text = check(&cfg);
    let after = Utc::now();
    let warning = |credential: &str| {
        text.lines()
            .find(|l| l.starts_with("warning:") && l.contains(&format!("credential {credential} ")))
            .unwrap_or_else(|| panic!("no warning for {credential}:\n{text}"))
    };
    for (credential, tick) in [("yt", 5), ("gh", 3)] {
        let w = warning(credential);
        assert!(
            [before, after]
                .iter()
                .any(|t| w.contains(&format!("runs out at {} UTC", minute_after(*t, tick)))),
            "{credential}: expected the {tick}th tick from now in: {w}"
        );
    }
}

/// A concurrent window: its cap against this config's `concurrency` times
/// the daemons alive in Redis now; a lease shorter than a timeout warned.
#[test]
fn a_concurrent_window_is_shown_against_the_daemons_concurrency() {
    use crate::support::rig::Rig;
    use crate::support::{RedisServer, Worker};

    let redis = RedisServer::start();
    let cfg = ConfigBuilder::new()
        .redis_url(&redis.url())
        .worker(Worker::default().concurrency(8))
        .credential(
            Credential::env("gh", SECRET.0)
                .window(Window::sliding(5000, "1h"))
                .window(Window::concurrent(100)),
        )
        .endpoint(Endpoint::new("github.events", "gh", 1))
        .credential(Credential::env("yt", SECRET.0).window(Window::sliding(9500, "24h")))
        .endpoint(
            Endpoint::new("youtube.search.list", "yt", 2)
                .timeout("30s")
                .window(Window::concurrent(4).lease("10s")),
        )
        .job(events_job())
        .job(search_job())
        .write();
    let text = check(&cfg);
    assert!(
        text.contains("100 in flight  8 task(s) at once (no daemon alive in Redis now; each runs concurrency 8), 1 unit(s) each: the cap never binds"),
        "{text}"
    );
    assert!(
        text.contains("8 task(s) at once (no daemon alive in Redis now; each runs concurrency 8), 2 unit(s) each: the cap binds (2 request(s) at most)"),
        "{text}"
    );
    assert!(
        text.contains("warning: credential yt endpoint:youtube.search.list window 4 in flight (lease 10s): its lease is shorter than the timeout of youtube.search.list (timeout 30s)"),
        "{text}"
    );
    // Two daemons on the config's Redis: 16 tasks at once.
    let (mut rig, mut others) = Rig::start_n(redis, cfg, 2, &[SECRET]);
    let cfg = &rig.cfg;
    let ok = support::wait_until(std::time::Duration::from_secs(30), || {
        check(cfg).contains("16 task(s) at once (2 daemon(s) alive in Redis now x concurrency 8)")
    });
    assert!(ok, "{}", check(cfg));
    for d in std::iter::once(&mut rig.daemon).chain(&mut others) {
        d.term();
        d.wait_exit(std::time::Duration::from_secs(20));
    }
}

/// Issue 24, items 8 and 9: an endpoint whose answers say what the upstream
/// has left, with no `upstream = true` window to resync, is warned about;
/// a credential's windows of another resource count only their resource's
/// jobs; a run's worst case says what redirects can add (each hop is spent).
#[test]
fn check_warns_of_a_count_that_resyncs_nothing_and_counts_per_resource() {
    let cfg = ConfigBuilder::new()
        .credential(
            Credential::env("gh", SECRET.0)
                .window(Window::sliding(4500, "1h"))
                .window(Window::sliding(30, "1m").upstream().resource("search"))
                .window(Window::concurrent(100)),
        )
        .endpoint(
            Endpoint::new("github.events", "gh", 1)
                .ratelimit_headers("x-ratelimit-remaining", "x-ratelimit-reset"),
        )
        .endpoint(
            Endpoint::new("github.search", "gh", 1)
                .set("accounting", "github")
                .set("resource", "search"),
        )
        .job(events_job())
        .job(search_on("issues", "github.search"))
        .write();
    let text = check(&cfg);
    let warning = text
        .lines()
        .find(|l| l.starts_with("warning: endpoint github.events"))
        .unwrap_or_else(|| panic!("no warning:\n{text}"));
    assert!(
        warning.contains("(ratelimit_headers)") && warning.contains("upstream = true"),
        "{warning}"
    );
    assert!(
        !text.contains("warning: endpoint github.search"),
        "search's window mirrors it:\n{text}"
    );
    // The core hour counts the events job only (8 x 4 x 2 ticks an hour);
    // the search minute the search job only (8 a minute).
    let row = |w: &str| {
        text.lines()
            .find(|l| l.contains(w))
            .unwrap_or_else(|| panic!("no row for {w}:\n{text}"))
            .to_owned()
    };
    assert!(
        row("4500/1h").contains("worst case        64 units"),
        "{text}"
    );
    let search = row("30/1m");
    assert!(
        search.contains("credential (search)") && search.contains("worst case         8 units"),
        "{search}"
    );
    assert!(
        text.contains("32 units per run (8 item(s) x 4 page(s) x 1 unit(s)); 128 if every page is redirected 3 times (each hop is spent)"),
        "{text}"
    );
    // The token's cap on requests in flight holds both jobs' tasks.
    assert!(
        row("100 in flight").contains("credential (every resource)"),
        "{text}"
    );
}

/// Issue 37 (low): `check … | head` panicked ("failed printing to stdout:
/// Broken pipe") once `head` had stopped reading. The rest of its output is
/// dropped and it ends with its own exit code (0: the config is valid), as
/// `keys` does (`keys_installed`). The pipe's read end is closed before the
/// command starts, so its first write meets it.
#[test]
fn check_into_a_pipe_nobody_reads_ends_quietly() {
    use std::os::fd::FromRawFd;
    let cfg = config(search_job());
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both are fresh descriptors this test owns from here on.
    let (read, write) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    drop(read);
    let mut cmd = support::process::command(&cfg.path(), &["check"], &[SECRET]);
    cmd.env("QUOTA_WORKER_REDIS_URL", "redis://127.0.0.1:9/")
        .stdout(write);
    let out = cmd.output().expect("run check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}
