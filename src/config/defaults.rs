//! Every default the config applies to a field left out, and the limits it
//! checks, in one place. The loader reads them from here; where
//! `docs/configuration.md` quotes one, a test below keeps the two equal.

use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::time::Duration;

use chrono_tz::Tz;

use super::choice::PageStyleName;
use super::{LimiterUnavailable, Method, OnQuotaExhausted, ResetIs, UnsafeEviction};

// [redis]

/// `[redis] key_prefix`: every key the product writes starts with it.
pub const KEY_PREFIX: &str = "qw";
/// `[redis] timeout`: how long a spend waits for Redis.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(1);
/// `[redis] unsafe_eviction`: a Redis that may evict keys is refused.
pub const UNSAFE_EVICTION: UnsafeEviction = UnsafeEviction::Refuse;
/// `[redis] quota_replicas`: an admitted spend waits for no replica.
pub const QUOTA_REPLICAS: u8 = 0;
/// `[redis] quota_replicas` at most: `WAIT 1` (SPEC Part 2).
pub const MAX_QUOTA_REPLICAS: u8 = 1;

// [worker]

/// `[worker] concurrency`.
pub const CONCURRENCY: NonZeroUsize = NonZeroUsize::new(8).expect("8 > 0");
/// `[worker] shutdown_timeout`.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// `[worker] recover_after`: a killed daemon's tasks are picked up within it.
pub const RECOVER_AFTER: Duration = Duration::from_secs(30);
/// `[worker] poll_interval`.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// `[worker] unknown_job_grace`: how long a task of a job this daemon does
/// not know is given back for another daemon, counted from the last time
/// any daemon had the job loaded (rolling deploys, reloads).
pub const UNKNOWN_JOB_GRACE: Duration = Duration::from_secs(600);
/// `[worker] unknown_job_grace` at least, unless 0 (fail at once): daemons
/// say what they have loaded every 5 s (`queue::known`), so a shorter grace
/// could fail a task that a running daemon knows.
pub const MIN_UNKNOWN_JOB_GRACE: Duration = Duration::from_secs(15);
/// `[worker] fan_out_warn`: `check` warns about a tick of more tasks (each
/// waits in Redis, about 400 bytes apiece, until a worker takes it).
pub const FAN_OUT_WARN: u64 = 100_000;

// [metrics]

/// `[metrics] listen`.
pub const METRICS_LISTEN: &str = "127.0.0.1:9464";
/// `[metrics] listen` values that turn the listener off.
pub const METRICS_OFF: &[&str] = &["", "off"];

// state_dir

/// `state_dir` when neither the config nor systemd's `$STATE_DIRECTORY`
/// gives one, relative to the config directory.
pub const STATE_DIR: &str = "state";

// windows

/// A window's `kind`.
pub const WINDOW_KIND: &str = "sliding";
/// A fixed window's `reset`, local time of day.
pub const WINDOW_RESET: &str = "00:00";
/// A fixed window's `timezone`.
pub const WINDOW_TIMEZONE: Tz = Tz::UTC;

// [endpoints.*]

/// An endpoint's `limiter_unavailable`: never risk the upstream's quota.
pub const LIMITER_UNAVAILABLE: LimiterUnavailable = LimiterUnavailable::FailClosed;
/// An endpoint's spends count against its credential's windows too.
pub const CHARGE_CREDENTIAL: bool = true;
/// An endpoint's request `timeout`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// An endpoint's `throttle_block`.
pub const THROTTLE_BLOCK: Duration = Duration::from_secs(60);
/// An endpoint's `quota_reasons`: YouTube's 403 reasons that mean "quota".
pub const QUOTA_REASONS: &[&str] = &[
    "quotaExceeded",
    "rateLimitExceeded",
    "dailyLimitExceeded",
    "userRateLimitExceeded",
];
/// `ratelimit_headers.reset_is`.
pub const RESET_IS: ResetIs = ResetIs::EpochSeconds;
/// The largest window `units` and endpoint `cost`: the spend script counts
/// in Lua numbers (doubles), exact integers up to 2^53 - 1. A larger value
/// would be rounded: spends fail with a script error, or `quota` reports 0
/// left while admitting.
pub const MAX_COUNT: u64 = (1 << 53) - 1;
/// What a value over [`MAX_COUNT`] is told.
pub const MAX_COUNT_RULE: &str = "must be at most 2^53 - 1 (9007199254740991): the spend script counts in exact integers up to there";
/// An endpoint's `max_body`: the largest response body read.
pub const MAX_BODY: u64 = 16 << 20;
/// An endpoint's `max_records`: the most records one page may hold.
pub const MAX_RECORDS: u64 = 100_000;
/// An endpoint's `max_block`: the longest the upstream may block the credential.
pub const MAX_BLOCK: Duration = Duration::from_secs(86_400);
/// An endpoint's `conditional`: no `If-None-Match` / `If-Modified-Since`.
pub const CONDITIONAL: bool = false;
/// `throttle_at` (`accounting = "meta"`): the usage percentage that blocks.
pub const THROTTLE_AT: u8 = 100;
/// An endpoint's `min_block`: the shortest block, whatever wait (`0`, a
/// time already past) the upstream asked for; doubled for each throttle
/// answer in a row.
pub const MIN_BLOCK: Duration = Duration::from_secs(1);
/// An endpoint's `throttle_block_max`: where the doubling of consecutive
/// throttles stops.
pub const THROTTLE_BLOCK_MAX: Duration = Duration::from_secs(15 * 60);
/// The resource of an endpoint or window that names none, for a
/// credential without GitHub endpoints (`accounting = "github"` makes it
/// `"core"`, `"github-graphql"` alone `"graphql"`).
pub const RESOURCE: &str = "default";
/// GitHub REST's default resource.
pub const GITHUB_RESOURCE: &str = "core";
/// GitHub GraphQL's resource.
pub const GITHUB_GRAPHQL_RESOURCE: &str = "graphql";

// jobs

/// A job's `timezone`, the one its schedule is read in.
pub const JOB_TIMEZONE: Tz = Tz::UTC;
/// A job's `on_quota_exhausted`.
pub const ON_QUOTA_EXHAUSTED: OnQuotaExhausted = OnQuotaExhausted::Stop;
/// `[job.request] method`.
pub const METHOD: Method = Method::Get;
/// `[job.sink] records`: the whole body is one record.
pub const SINK_RECORDS: &str = "";
/// `fan_out_from.max_items`: more rows and a tick fans out nothing.
pub const FAN_OUT_MAX_ITEMS: NonZeroU64 = NonZeroU64::new(100_000).expect("> 0");
/// `[job.pagination] style`.
pub(crate) const PAGE_STYLE: PageStyleName = PageStyleName::Cursor;
/// `[job.pagination] start` of `style = "page"`: the first page's number.
pub const PAGE_START: u64 = 1;
/// `[job.pagination] step` of `style = "page"`.
pub const PAGE_STEP: u64 = 1;
/// `[job.pagination] continue`: every run starts at page 1.
pub const PAGE_CONTINUE: bool = false;
/// A job's `since_initial`: `{since}` before the item's first run that
/// ended `done` is this long before the run.
pub const SINCE_INITIAL: Duration = Duration::from_secs(86_400);
/// `retry.attempts`, the first one included.
pub const RETRY_ATTEMPTS: NonZeroU32 = NonZeroU32::new(5).expect("5 > 0");
/// `retry.backoff`, doubled each time.
pub const RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// `retry.max_backoff`.
pub const RETRY_MAX_BACKOFF: Duration = Duration::from_secs(300);

// Limits

/// The largest config or job file the loader reads: far above any real one,
/// small enough that a wrong path (a device, a log) fails at once.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;
/// The largest secret file the loader reads (tokens, JSON keys); also the
/// most a `secret_command` may print.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 << 10;
/// `secret_ttl`: how long a token a `secret_command` printed is used before
/// the command runs again.
pub const SECRET_TTL: Duration = Duration::from_secs(3600);
/// `recover_after` at least: workers heartbeat every third of it.
pub const MIN_RECOVER_AFTER: Duration = Duration::from_secs(3);
/// A concurrent window's `lease`, at least.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// A window's `per`, at least...
pub const MIN_WINDOW: Duration = Duration::from_millis(1);
/// ...and at most.
pub const MAX_WINDOW: Duration = Duration::from_secs(400 * 86_400);
/// `max_block` at least...
pub const MIN_MAX_BLOCK: Duration = Duration::from_secs(1);
/// ...and at most (a block is milliseconds in the spend script, exact in a
/// Lua double far beyond this).
pub const MAX_MAX_BLOCK: Duration = MAX_WINDOW;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_duration;

    /// What the docs write after every `key = `, up to the end of the value
    /// (a quoted string, a number, or a `{ ... }` / `[ ... ]` on one line).
    fn written<'a>(docs: &'a str, key: &str) -> Vec<&'a str> {
        let needle = format!("{key} = ");
        docs.match_indices(&needle)
            .filter(|(i, _)| {
                // `backoff = ` is not `max_backoff = `.
                let before = docs[..*i].chars().next_back();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
            .map(|(i, _)| {
                let rest = &docs[i + needle.len()..];
                let end = match rest.chars().next() {
                    Some('"') => rest[1..].find('"').map_or(rest.len(), |e| e + 2),
                    Some('[') => rest.find(']').map_or(rest.len(), |e| e + 1),
                    Some('{') => rest.find('}').map_or(rest.len(), |e| e + 1),
                    _ => rest.find([' ', ',', '\n']).unwrap_or(rest.len()),
                };
                &rest[..end]
            })
            .collect()
    }

    fn says(docs: &str, file: &str, key: &str, want: &str) {
        let seen = written(docs, key);
        assert!(
            seen.contains(&want),
            "docs/{file}.md should say {key} = {want}; it says {seen:?}"
        );
    }

    fn says_duration(docs: &str, file: &str, key: &str, want: Duration) {
        let seen = written(docs, key);
        let same = |v: &&str| parse_duration(v.trim_matches('"')) == Ok(want);
        assert!(
            seen.iter().any(same),
            "docs/{file}.md should say {key} = {want:?}; it says {seen:?}"
        );
    }

    /// The reference quotes these defaults; they must not drift apart.
    #[test]
    fn the_docs_quote_the_defaults() {
        let c = include_str!("../../docs/configuration.md");
        let f = "configuration";
        says(c, f, "key_prefix", &format!("{KEY_PREFIX:?}"));
        says_duration(c, f, "timeout", REDIS_TIMEOUT);
        says(c, f, "concurrency", &CONCURRENCY.to_string());
        says_duration(c, f, "shutdown_timeout", SHUTDOWN_TIMEOUT);
        says_duration(c, f, "recover_after", RECOVER_AFTER);
        says_duration(c, f, "poll_interval", POLL_INTERVAL);
        says(c, f, "fan_out_warn", &FAN_OUT_WARN.to_string());
        says_duration(c, f, "unknown_job_grace", UNKNOWN_JOB_GRACE);
        says(c, f, "listen", &format!("{METRICS_LISTEN:?}"));
        says(c, f, "state_dir", &format!("{STATE_DIR:?}"));
        says(c, f, "reset", &format!("{WINDOW_RESET:?}"));
        says_duration(c, f, "timeout", REQUEST_TIMEOUT);
        says_duration(c, f, "throttle_block", THROTTLE_BLOCK);
        says_duration(c, f, "max_block", MAX_BLOCK);
        says(c, f, "max_body", "\"16MiB\"");
        assert_eq!(MAX_BODY, 16 * 1024 * 1024, "docs say 16MiB");
        says(c, f, "max_records", &MAX_RECORDS.to_string());
        says(c, f, "unsafe_eviction", "\"refuse\"");
        says(c, f, "conditional", &CONDITIONAL.to_string());
        says(c, f, "throttle_at", &THROTTLE_AT.to_string());
        says_duration(c, f, "min_block", MIN_BLOCK);
        says_duration(c, f, "throttle_block_max", THROTTLE_BLOCK_MAX);
        assert_eq!(UNSAFE_EVICTION, UnsafeEviction::Refuse, "docs say refuse");
        let reasons: Vec<String> = QUOTA_REASONS.iter().map(|r| format!("{r:?}")).collect();
        says(c, f, "quota_reasons", &format!("[{}]", reasons.join(", ")));

        let j = include_str!("../../docs/jobs.md");
        let f = "jobs";
        says(j, f, "timezone", &format!("{:?}", JOB_TIMEZONE.name()));
        says(j, f, "method", &format!("{:?}", METHOD.as_str()));
        says(j, f, "max_items", &FAN_OUT_MAX_ITEMS.to_string());
        says_duration(j, f, "since_initial", SINCE_INITIAL);
        says(j, f, "continue", &PAGE_CONTINUE.to_string());
        let (start, step) = (PAGE_START, PAGE_STEP);
        assert!(j.contains(&format!(
            "`start` (default {start}), `step` (default {step})"
        )));
        assert_eq!(
            PAGE_STYLE,
            PageStyleName::Cursor,
            "docs say cursor is the default"
        );
        let retry = written(j, "retry");
        let retry = retry.first().expect("docs/jobs.md shows retry");
        for (key, want) in [
            ("backoff", RETRY_BACKOFF),
            ("max_backoff", RETRY_MAX_BACKOFF),
        ] {
            says_duration(retry, f, key, want);
        }
        says(retry, f, "attempts", &RETRY_ATTEMPTS.to_string());
    }
}
