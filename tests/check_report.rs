//! Promise: `check` validates and then shows what the jobs can spend: each
//! job's next fire times and worst-case units per run (items × pages × cost),
//! and per window the worst case against its limit, warning when the jobs
//! cannot fit and saying when, from an empty window, the quota runs out.
//! Exit 0 when the configuration is valid, warnings or not.

mod support;

use chrono::{DateTime, Duration, DurationRound, Utc};
use support::TestConfig;

const SECRET: (&str, &str) = ("QW_TEST_CHECK_SECRET", "not-a-real-key");

const CONFIG: &str = r#"
jobs = "jobs/*.toml"

[credentials.yt]
secret_env = "QW_TEST_CHECK_SECRET"
windows = [{ units = 9500, per = "24h" }]

[endpoints."youtube.search.list"]
credential = "yt"
cost = 100

[credentials.gh]
secret_env = "QW_TEST_CHECK_SECRET"
windows = [{ units = 5000, per = "1h" }]

[endpoints."github.events"]
credential = "gh"
cost = 1
"#;

const SEARCH_JOB: &str = r#"
[search]
schedule = "0 * * * * *"
endpoint = "youtube.search.list"
fan_out = { region = ["US", "GB", "DE", "FR", "IN", "BR", "AU", "CA"] }

[search.request]
url = "https://www.googleapis.com/youtube/v3/search"
query = { regionCode = "{region}", key = "{secret}" }

[search.sink]
kind = "jsonl"
path = "data/{job}/{region}.jsonl"
"#;

const EVENTS_JOB: &str = r#"
[events]
schedule = "0 */30 * * * *"
endpoint = "github.events"
fan_out = { repo = ["a", "b", "c", "d", "e", "f", "g", "h"] }

[events.request]
url = "https://api.github.com/repos/x/{repo}/events"
headers = { Authorization = "Bearer {secret}" }

[events.pagination]
cursor = "/next"
param = "page"
max_pages = 4

[events.sink]
kind = "jsonl"
path = "data/{job}/{repo}.jsonl"
"#;

/// The `n`-th minute boundary strictly after `t`, as `check` prints it.
fn minute_after(t: DateTime<Utc>, n: i32) -> String {
    let floor = t.duration_trunc(Duration::minutes(1)).expect("trunc");
    (floor + Duration::minutes(i64::from(n)))
        .format("%Y-%m-%d %H:%M")
        .to_string()
}

#[test]
fn a_job_that_cannot_fit_is_warned_about_with_when_it_runs_out() {
    let cfg = TestConfig::new(CONFIG, &[("search.toml", SEARCH_JOB)]);
    let before = Utc::now();
    let out = cfg.run(&["check"], &[SECRET]);
    let after = Utc::now();
    let text = support::stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        support::stderr(&out)
    );

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
    let cfg = TestConfig::new(CONFIG, &[("events.toml", EVENTS_JOB)]);
    let out = cfg.run(&["check"], &[SECRET]);
    let text = support::stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        support::stderr(&out)
    );
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
    // Once a year, at noon UTC 15 days from now (always beyond a week).
    let at = Utc::now() + Duration::days(15);
    let yearly = format!(
        r#"
[yearly]
schedule = "0 0 12 {} {} *"
endpoint = "youtube.search.list"
fan_out = {{ region = ["US"] }}

[yearly.request]
url = "https://www.googleapis.com/youtube/v3/search"
query = {{ regionCode = "{{region}}", key = "{{secret}}" }}

[yearly.pagination]
cursor = "/nextPageToken"
param = "pageToken"
max_pages = 100

[yearly.sink]
kind = "jsonl"
path = "data/{{job}}/{{region}}.jsonl"
"#,
        at.format("%-d"),
        at.format("%-m")
    );
    // Its schedule's only year is past.
    let never = SEARCH_JOB
        .replace("[search", "[never")
        .replace("0 * * * * *", "0 0 0 1 1 * 2020");
    let cfg = TestConfig::new(CONFIG, &[("yearly.toml", &yearly), ("never.toml", &never)]);
    let out = cfg.run(&["check"], &[SECRET]);
    let text = support::stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        support::stderr(&out)
    );
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
