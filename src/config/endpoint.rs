//! An upstream operation (`[endpoints.NAME]`): its cost, timeout, which
//! upstream's own quota reports it reads, and what a task does when the
//! quota says no or Redis cannot answer.

use std::num::NonZeroU64;
use std::time::Duration;

use super::Window;

/// What a spend does when Redis cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimiterUnavailable {
    /// Reject (the default): never risk the upstream's quota.
    FailClosed,
    /// Allow, and log a warning: for cheap calls that must not stop.
    FailOpen,
}

/// An upstream operation with a cost.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Its name.
    pub name: String,
    /// The credential it is charged to.
    pub credential: String,
    /// Units per request.
    pub cost: NonZeroU64,
    /// Redis unreachable: reject or allow.
    pub limiter_unavailable: LimiterUnavailable,
    /// Windows of its own, checked in the same spend as the credential's.
    pub windows: Vec<Window>,
    /// Whether its spends also count against the credential's windows
    /// (`charge_credential`, default true). When false only its own
    /// `windows` count (a bucket of its own, as YouTube's `search.list`
    /// has); the credential's block still applies.
    pub charge_credential: bool,
    /// Request timeout.
    pub timeout: Duration,
    /// How long to block the credential when the upstream throttles without
    /// saying for how long.
    pub throttle_block: Duration,
    /// 403 error reasons that mean "quota" (YouTube's `quotaExceeded`, ...).
    pub quota_reasons: Vec<String>,
    /// Response headers carrying the upstream's own remaining quota and reset.
    pub ratelimit_headers: Option<RatelimitHeaders>,
    /// A response header carrying the request's actual cost in units.
    pub cost_header: Option<String>,
    /// The largest response body read, in bytes; a larger one ends the task
    /// `failed` (its units kept: the upstream answered).
    pub max_body: u64,
    /// The most records one page may hold (where the job's `sink.records`
    /// points); a page with more ends the task `failed`, nothing written.
    /// With `max_body`, it bounds what one page can make the sink write.
    pub max_records: u64,
    /// The longest the upstream may block the credential for (Retry-After,
    /// ratelimit reset); longer values are clamped to it and logged.
    pub max_block: Duration,
    /// Conditional requests: page 1 of each item's run sends the
    /// `If-None-Match` / `If-Modified-Since` of the item's last complete run,
    /// and a `304` ends the run `done` with nothing written.
    pub conditional: bool,
    /// What a `304` is settled to, in units (`cost` unless given; GitHub: 0).
    pub not_modified_cost: u64,
    /// How the upstream reports its own accounting (`accounting = "github"`,
    /// ...); `None`: only `ratelimit_headers`, `cost_header`, 429s and
    /// `quota_reasons`.
    pub accounting: Option<Accounting>,
    /// The upstream resource its requests count against (GitHub's `core`,
    /// `search`, `graphql`); `None`: its credential's default resource. It
    /// spends from the credential's windows of this resource, and its
    /// answers resync and block this resource unless they name another.
    pub resource: Option<String>,
    /// The shortest block an answer that says "wait" makes (`Retry-After:
    /// 0`, a reset already past), doubled for each throttle answer in a row
    /// on the same resource.
    pub min_block: Duration,
    /// The longest a doubled `min_block` grows.
    pub throttle_block_max: Duration,
}

/// `accounting` on an endpoint: which upstream's own quota reports it
/// reads (`crate::accounting` has one module each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accounting {
    /// `RateLimit-Policy` / `RateLimit` structured fields
    /// (draft-ietf-httpapi-ratelimit-headers).
    Ietf,
    /// GitHub REST: `x-ratelimit-*`, primary and secondary rate limits.
    Github,
    /// GitHub GraphQL: points, `data.rateLimit`, `RATE_LIMITED`.
    GithubGraphql,
    /// Shopify GraphQL Admin API: the `extensions.cost` of every answer.
    ShopifyGraphql,
    /// Meta Graph API (Facebook, Instagram): `X-App-Usage` and
    /// `X-Business-Use-Case-Usage` percentages.
    Meta {
        /// The percentage (1–100) at which the credential is blocked.
        throttle_at: u8,
    },
}

impl Accounting {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Accounting::Ietf => "ietf",
            Accounting::Github => "github",
            Accounting::GithubGraphql => "github-graphql",
            Accounting::ShopifyGraphql => "shopify-graphql",
            Accounting::Meta { .. } => "meta",
        }
    }
}

/// Headers like GitHub's `x-ratelimit-remaining` / `x-ratelimit-reset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RatelimitHeaders {
    /// Header with the units the upstream has left.
    pub remaining: String,
    /// Header with when it resets.
    pub reset: String,
    /// Whether `reset` is a Unix time or seconds from now.
    pub reset_is: ResetIs,
}

/// The meaning of a reset header's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetIs {
    /// Seconds since the Unix epoch (GitHub).
    EpochSeconds,
    /// Seconds from now.
    DeltaSeconds,
}

/// What a task does when a spend is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnQuotaExhausted {
    /// End now; the next tick resumes at the kept cursor.
    Stop,
    /// End now and re-queue the task to run at the retry-after.
    Defer,
}
