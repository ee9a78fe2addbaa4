//! A simulated metered HTTP API (YouTube Data API-like) on 127.0.0.1, for
//! `quota-worker demo` and for integration tests that need a real upstream.
//!
//! It meters each API key (the `key` query parameter) the way the real thing
//! does: every path has a cost in units, a key may spend at most `units` in
//! any trailing `per` (plus an optional short "per minute" limit), and a
//! request that does not fit is answered 403 `quotaExceeded` (or
//! `rateLimitExceeded`). Only 2xx answers are charged. It records every charge
//! so a test can check what the upstream saw ([`SimStats`]), and it can be
//! told to misbehave ([`Fault`]).
//!
//! A crate of its own, not a module of quota-worker: fault injection and
//! test helpers are no part of the product's API. Only `quota-worker demo`
//! starts it; the daemon never imports it (to the daemon it is just an HTTP
//! server). Its clock is real time, like any external system's.
//!
//! # Responses
//!
//! Every configured path serves a deterministic, paginated list:
//!
//! - `GET /youtube/v3/videos?chart=mostPopular&regionCode=US&maxResults=5&key=K`
//!   answers `{"kind": "youtube#videoListResponse", "items": [...],
//!   "nextPageToken": "p2", "pageInfo": {...}}`; items have ids like
//!   `US-p2-i3` and a `snippet` with `title`, `description`, `channelTitle`.
//! - `/youtube/v3/search?q=cats` pages the same way over `q` (ids `cats-p1-i1`).
//! - any other configured path pages over `regionCode`, else `q`, else `all`.
//! - with an `id=a,b` parameter, the answer is one item per id, unpaged.
//!
//! A query has [`SimConfig::pages_per_query`] pages; `maxResults` only caps the
//! items of each page. Page tokens are `p2`, `p3`, ...; the last page has no
//! `nextPageToken`; a token that was never issued is answered 400.
//!
//! Other upstreams' pagination styles (GitHub's `Link` header and `ETag`s,
//! Meta's `paging.next`, page numbers, numeric cursors, a GraphQL
//! connection, Stripe's lists) are [`SimConfig::style`]'s, served by
//! `styles`; other upstreams' own
//! accounting (GitHub's `x-ratelimit-*` and rate limits, Shopify GraphQL's
//! cost extension and `THROTTLED`, Meta's usage headers, IETF `RateLimit`
//! fields) is [`SimConfig::accounting`]'s, served by `accounting`, where
//! another program on the same key can burn part of the quota
//! ([`Simulator::burn`]).
//!
//! The key comes in the `key` or `access_token` query parameter, or as
//! `Authorization: Bearer KEY`. Every request, whatever its answer, goes
//! into the request log ([`SimStats::requests`]), with what it carried: its
//! query, headers (not the key's) and body (a GraphQL query's variables:
//! [`Logged::variables`]).
//!
//! Requests in flight are counted per key while they are answered, and the
//! most at once kept ([`KeyStats::max_in_flight`], weighted by the paths'
//! costs in [`KeyStats::max_in_flight_units`]): with [`SimConfig::hold`]
//! every answer is held open that long, as a slow upstream does, so a
//! client's concurrency shows at the upstream.

#![warn(missing_docs, unreachable_pub)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod accounting;
mod styles;

pub use accounting::SimAccounting;
pub use styles::SimStyle;

use axum::Router;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, ETAG, IF_NONE_MATCH, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The YouTube Data API's `videos.list` path (cost 1).
pub const VIDEOS: &str = "/youtube/v3/videos";
/// The YouTube Data API's `search.list` path (cost 100).
pub const SEARCH: &str = "/youtube/v3/search";
/// The YouTube Data API's `channels.list` path (cost 1).
pub const CHANNELS: &str = "/youtube/v3/channels";

/// Header with the units the key has left in its main window
/// ([`SimConfig::ratelimit_headers`]).
pub const RATELIMIT_REMAINING: &str = "x-ratelimit-remaining";
/// Header with the Unix time (seconds, rounded up) at which the oldest charge
/// in the key's main window leaves it, i.e. when `remaining` next grows; now
/// when nothing is charged ([`SimConfig::ratelimit_headers`]).
pub const RATELIMIT_RESET: &str = "x-ratelimit-reset";
/// Header with the key's main window size in units.
pub const RATELIMIT_LIMIT: &str = "x-ratelimit-limit";
/// Header with the units used in the key's main window.
pub const RATELIMIT_USED: &str = "x-ratelimit-used";
/// Header with the units this request was actually charged: the path's cost
/// on a 2xx answer, 0 on anything else ([`SimConfig::cost_header`]).
pub const COST_HEADER: &str = "x-quota-cost";

/// How long [`Simulator::shutdown`] waits for in-flight requests (a delayed
/// one, say) before cutting them off.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What the simulator serves and how it meters it.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The keys it accepts; any other key is answered 400 `keyInvalid`.
    pub keys: Vec<KeyQuota>,
    /// Path → cost in units. Paths not listed are answered 404.
    pub costs: Vec<(String, u64)>,
    /// Pages every query has (at least 1).
    pub pages_per_query: u32,
    /// Items per page (at least 1); `maxResults` may ask for fewer.
    pub items_per_page: u32,
    /// GitHub-like mode: every answer to a valid key carries
    /// [`RATELIMIT_LIMIT`], [`RATELIMIT_REMAINING`], [`RATELIMIT_USED`] and
    /// [`RATELIMIT_RESET`] for the key's main window, and a real quota
    /// rejection also carries `Retry-After` (seconds until a request of that
    /// cost would fit).
    pub ratelimit_headers: bool,
    /// Every answer to a valid key carries [`COST_HEADER`].
    pub cost_header: bool,
    /// Path → a limit of its own per key ([`SimConfig::bucket`]).
    pub buckets: Vec<(String, Limit)>,
    /// How it pages ([`SimStyle::Token`], YouTube's, unless set).
    pub style: SimStyle,
    /// Paths that page in a style of their own ([`SimConfig::style_on`]):
    /// a GraphQL connection beside YouTube's lists, say.
    pub styles: Vec<(String, SimStyle)>,
    /// GitHub-like conditional requests (with [`SimStyle::Link`]): every
    /// page carries an `ETag`, and a request whose `If-None-Match` is the
    /// page's current one is answered `304` with no body, not charged.
    pub etag: bool,
    /// Where next links and next URLs point (`http://127.0.0.1:PORT`):
    /// another origin than the simulator's own, to test that they are never
    /// followed there. `None`: its own.
    pub next_origin: Option<String>,
    /// How it meters keys and says so ([`SimAccounting::Google`], YouTube's,
    /// unless set): GitHub's, Shopify GraphQL's, Meta's, IETF `RateLimit`.
    pub accounting: SimAccounting,
    /// Every answer to a valid key is held open this long before it is
    /// sent ([`SimConfig::hold`]); none unless set.
    pub hold: Option<Duration>,
    /// GitHub: resources other than `core` ([`SimConfig::resource`]), each
    /// metered apart per key, for the paths it lists.
    pub resources: Vec<SimResource>,
    /// IETF: limits listed beside the key's own (`"default"`), each
    /// metered apart per key, every request counting on all
    /// ([`SimConfig::limit`]).
    pub limits: Vec<(String, Limit)>,
}

/// A GitHub resource of its own ([`SimConfig::resource`]): requests to
/// its paths count on it, not on `core`.
#[derive(Debug, Clone)]
pub struct SimResource {
    /// Its name, as `x-ratelimit-resource` says it (`search`, `graphql`).
    pub name: String,
    /// Its limit per key, a window from the first request after its reset.
    pub limit: Limit,
    /// The paths that count on it.
    pub paths: Vec<String>,
}

impl Default for SimConfig {
    /// YouTube's costs (videos 1, search 100, channels 1), 3 pages of 5 items,
    /// no keys, no extra headers.
    fn default() -> Self {
        SimConfig {
            keys: Vec::new(),
            costs: vec![
                (VIDEOS.to_string(), 1),
                (SEARCH.to_string(), 100),
                (CHANNELS.to_string(), 1),
            ],
            pages_per_query: 3,
            items_per_page: 5,
            ratelimit_headers: false,
            cost_header: false,
            buckets: Vec::new(),
            style: SimStyle::Token,
            styles: Vec::new(),
            etag: false,
            next_origin: None,
            accounting: SimAccounting::Google,
            hold: None,
            resources: Vec::new(),
            limits: Vec::new(),
        }
    }
}

impl SimConfig {
    /// Adds a key with `units` per trailing `per`.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>, units: u64, per: Duration) -> Self {
        self.keys.push(KeyQuota::new(key, units, per));
        self
    }

    /// Sets (or adds) a path's cost.
    #[must_use]
    pub fn cost(mut self, path: impl Into<String>, cost: u64) -> Self {
        let path = path.into();
        self.costs.retain(|(p, _)| *p != path);
        self.costs.push((path, cost));
        self
    }

    /// Requests to `path` page in `style`, whatever [`SimConfig::style`]
    /// says for the others.
    #[must_use]
    pub fn style_on(mut self, path: impl Into<String>, style: SimStyle) -> Self {
        let path = path.into();
        self.styles.retain(|(p, _)| *p != path);
        self.styles.push((path, style));
        self
    }

    /// Holds every answer to a valid key open for `hold` before sending it
    /// (a slow upstream): requests stay in flight that long, so the most
    /// in flight at once ([`KeyStats::max_in_flight`]) shows how many a
    /// client sends concurrently.
    #[must_use]
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = Some(hold);
        self
    }

    /// Requests to `path` count against a limit of their own per key,
    /// `units` per `per`, not against the key's main window (YouTube's
    /// `search.list`: 100 calls a day apart from the 10,000 units). The
    /// bucket is fixed when the key is ([`KeyQuota::fixed`]).
    #[must_use]
    pub fn bucket(mut self, path: impl Into<String>, units: u64, per: Duration) -> Self {
        let path = path.into();
        self.buckets.retain(|(p, _)| *p != path);
        self.buckets.push((path, Limit { units, per }));
        self
    }

    /// GitHub: requests to `paths` count on resource `name`, `units` per
    /// `per` per key (from the first request after a reset), not on
    /// `core`; their answers say `x-ratelimit-resource: NAME`. A
    /// resource named `graphql` answers as GitHub's GraphQL API: POSTs, a
    /// `data` object (with `rateLimit` when the query asks for it), and
    /// `RATE_LIMITED` over the limit.
    #[must_use]
    pub fn resource(mut self, name: &str, units: u64, per: Duration, paths: &[&str]) -> Self {
        self.resources.retain(|r| r.name != name);
        self.resources.push(SimResource {
            name: name.to_owned(),
            limit: Limit { units, per },
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        });
        self
    }

    /// IETF: a limit listed beside the key's own, `units` per `per` per
    /// key (from the first request after its reset); every request counts
    /// on it too, and a request over any listed limit is answered 429.
    #[must_use]
    pub fn limit(mut self, name: &str, units: u64, per: Duration) -> Self {
        self.limits.retain(|(n, _)| n != name);
        self.limits.push((name.to_owned(), Limit { units, per }));
        self
    }

    fn validate(&self) -> io::Result<()> {
        let bad = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        if self.pages_per_query == 0 {
            return bad("simulator: pages_per_query must be at least 1".into());
        }
        if self.items_per_page == 0 {
            return bad("simulator: items_per_page must be at least 1".into());
        }
        for (i, k) in self.keys.iter().enumerate() {
            if self.keys[..i].iter().any(|o| o.key == k.key) {
                return bad(format!("simulator: key {:?} given twice", k.key));
            }
            if k.per.is_zero() || k.rate.is_some_and(|r| r.per.is_zero()) {
                return bad(format!("simulator: key {:?} has a zero period", k.key));
            }
        }
        for (p, _) in &self.costs {
            if !p.starts_with('/') {
                return bad(format!("simulator: path {p:?} must start with '/'"));
            }
        }
        Ok(())
    }
}

/// One API key and its quota.
#[derive(Debug, Clone)]
pub struct KeyQuota {
    /// The key, as sent in the `key` query parameter.
    pub key: String,
    /// Units it may spend in any trailing `per` (its main window).
    pub units: u64,
    /// The main window's length (YouTube: 24 h; tests: shorter).
    pub per: Duration,
    /// An optional second, short limit (YouTube's per-minute limit); going
    /// over it is answered 403 `rateLimitExceeded`.
    pub rate: Option<Limit>,
    /// Whether its windows are fixed ([`KeyQuota::fixed`]) rather than
    /// trailing.
    pub fixed: bool,
}

impl KeyQuota {
    /// A key with `units` per trailing `per` and no short limit.
    pub fn new(key: impl Into<String>, units: u64, per: Duration) -> Self {
        KeyQuota {
            key: key.into(),
            units,
            per,
            rate: None,
            fixed: false,
        }
    }

    /// Its main window and buckets count per calendar period, each starting
    /// at a wall-clock multiple of its length since the Unix epoch (a day's
    /// start in UTC and, for periods that divide an hour, in every zone
    /// with whole-hour offsets), as YouTube's daily quota resets at
    /// midnight Pacific. The short limit stays trailing.
    #[must_use]
    pub fn fixed(mut self) -> Self {
        self.fixed = true;
        self
    }

    /// Adds a short limit of `units` per trailing `per`.
    #[must_use]
    pub fn with_rate(mut self, units: u64, per: Duration) -> Self {
        self.rate = Some(Limit { units, per });
        self
    }
}

/// At most `units` in any trailing `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Units.
    pub units: u64,
    /// Window length.
    pub per: Duration,
}

/// A misbehaviour to inject ([`Simulator::inject`]). Injected answers are
/// never charged, never recorded as fetched pages, and never count as quota
/// errors; they are counted in [`KeyStats::injected`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this HTTP status (500, 503, ...) and a Google-style error
    /// body (reason `backendError` for 5xx).
    Status(u16),
    /// Answer 429 with `Retry-After: retry_after_secs`.
    TooManyRequests {
        /// The `Retry-After` header's value, in seconds.
        retry_after_secs: u64,
    },
    /// Answer 403 with reason `rateLimitExceeded`, as if the key were over
    /// its short limit.
    RateLimitExceeded,
    /// Wait this long, then answer normally (to trigger client timeouts).
    /// The answer skips the quota check and is not charged.
    Delay(Duration),
    /// Answer 200 `application/json` with the body `not json`.
    Garbage,
    /// Answer 429 with this `Retry-After`, written exactly so (an HTTP
    /// date, `2.0`, `-5`, ...).
    RetryAfter(String),
    /// GitHub's secondary rate limit: 403 with its real message, and
    /// `retry-after` when given.
    GithubSecondary {
        /// The `retry-after` header's value, in seconds, if any.
        retry_after_secs: Option<u64>,
    },
    /// Answer `status` with a GitHub-style body, `{"message": message,
    /// "documentation_url": ...}`, no error reasons.
    Message {
        /// The HTTP status (403, 429, ...).
        status: u16,
        /// The body's top-level `message`.
        message: String,
    },
    /// Answer `304 Not Modified` with no body, whatever the request asked
    /// (a cache or proxy that answers a request that was not conditional).
    NotModified,
    /// Answer `status` with exactly this JSON body (a GraphQL answer with
    /// errors and no data, say).
    Body {
        /// The HTTP status.
        status: u16,
        /// The body, sent as `application/json`.
        body: String,
    },
}

/// One charged (2xx) request, as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Charge {
    /// When it was admitted (monotonic: use this for window arithmetic).
    pub at: Instant,
    /// The same moment on the wall clock.
    pub time: DateTime<Utc>,
    /// The API key.
    pub key: String,
    /// The request path.
    pub path: String,
    /// Units charged.
    pub cost: u64,
    /// What was paged: `regionCode` for videos, `q` for search, `id:a,b` for
    /// an id lookup.
    pub scope: String,
    /// The `pageToken` sent, `None` for a first page.
    pub page_token: Option<String>,
    /// The query parameters, in order, without `key`.
    pub query: Vec<(String, String)>,
}

/// Counters for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyStats {
    /// Units charged (2xx answers only).
    pub units: u64,
    /// 2xx answers that were charged.
    pub ok: u64,
    /// 403 `quotaExceeded` / `rateLimitExceeded` sent because the key really
    /// was over a limit (injected ones are not counted here).
    pub quota_errors: u64,
    /// 429s sent (all injected: the simulator itself rejects with 403).
    pub too_many_requests: u64,
    /// Answers decided by an injected [`Fault`].
    pub injected: u64,
    /// 400s sent for a bad parameter (an unknown page token, ...).
    pub bad_requests: u64,
    /// Units another program spent on the key ([`Simulator::burn`]).
    pub burned: u64,
    /// The most requests with this key in flight at once: received and not
    /// yet answered.
    pub max_in_flight: u64,
    /// The most units (each request weighted by its path's cost) in flight
    /// at once.
    pub max_in_flight_units: u64,
}

/// One request, whatever its answer, as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Logged {
    /// When it came in.
    pub received: DateTime<Utc>,
    /// When it was answered.
    pub time: DateTime<Utc>,
    /// The key it came with (query `key` or `access_token`, or a bearer
    /// token), if any.
    pub key: Option<String>,
    /// The request path.
    pub path: String,
    /// The query parameters, in order, without `key` and `access_token`.
    pub query: Vec<(String, String)>,
    /// What it paged over (`regionCode`, `q`, `repo`, else `all`).
    pub scope: String,
    /// The page it asked for (1 = first), when it names a valid one.
    pub page: Option<u32>,
    /// The `If-None-Match` it sent.
    pub if_none_match: Option<String>,
    /// The resource it counted on (GitHub's `core`, `search`, `graphql`;
    /// `None` in other styles).
    pub resource: Option<String>,
    /// The status it was answered with.
    pub status: u16,
    /// Whether it was the upstream's own over-limit answer (403
    /// `quotaExceeded`, GitHub's rate limit, `THROTTLED`, ...), not an
    /// injected fault.
    pub over_limit: bool,
    /// Its method (`GET`, `POST`).
    pub method: String,
    /// Its body, as text (lossy UTF-8): a GraphQL query's, with the
    /// variables it carried.
    pub body: String,
    /// Its headers, in order, names lowercase, without those that carry
    /// the key (`Authorization`, `X-Shopify-Access-Token`); values that are
    /// not text left out.
    pub headers: Vec<(String, String)>,
}

impl Logged {
    /// A GraphQL request's `variables` (`Null` when it carried none, or
    /// its body is not JSON).
    pub fn variables(&self) -> Value {
        serde_json::from_str::<Value>(&self.body)
            .map(|mut v| v["variables"].take())
            .unwrap_or(Value::Null)
    }

    /// The value of its header `name` (lowercase), if it sent one.
    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Headers the request log leaves out: they carry the key.
const SECRET_HEADERS: [HeaderName; 2] = [
    AUTHORIZATION,
    HeaderName::from_static("x-shopify-access-token"),
];

/// Marks a response as the upstream's own over-limit answer, for the
/// request log ([`Logged::over_limit`]).
#[derive(Debug, Clone, Copy)]
struct OverLimit;

/// A snapshot of what the simulator has seen ([`Simulator::stats`]).
#[derive(Debug, Clone, Default)]
pub struct SimStats {
    /// Counters per configured key.
    pub keys: BTreeMap<String, KeyStats>,
    /// Every charged request, in the order they were admitted.
    pub charges: Vec<Charge>,
    /// Requests with a missing or unknown key (answered 400 `keyInvalid`).
    pub invalid_keys: u64,
    /// Every request, in the order they were answered.
    pub requests: Vec<Logged>,
}

impl SimStats {
    /// The counters of `key` (zeros for an unknown key).
    pub fn key(&self, key: &str) -> KeyStats {
        self.keys.get(key).cloned().unwrap_or_default()
    }

    /// The most units `key` was charged in any trailing window of length
    /// `period`: the number to compare with a limiter's window. Two charges
    /// exactly `period` apart are in different windows.
    pub fn max_units_in_any_window(&self, key: &str, period: Duration) -> u64 {
        let charges: Vec<&Charge> = self.charges.iter().filter(|c| c.key == key).collect();
        let (mut start, mut sum, mut max) = (0, 0u64, 0u64);
        for end in 0..charges.len() {
            sum += charges[end].cost;
            while charges[end].at.saturating_duration_since(charges[start].at) >= period {
                sum -= charges[start].cost;
                start += 1;
            }
            max = max.max(sum);
        }
        max
    }

    /// The most units `key` was charged in one fixed period of length
    /// `period` ([`KeyQuota::fixed`]), counting only requests to the paths
    /// `counts` accepts: the number to compare with a fixed window.
    pub fn max_units_in_any_period(
        &self,
        key: &str,
        period: Duration,
        counts: impl Fn(&str) -> bool,
    ) -> u64 {
        let mut per_period: HashMap<u64, u64> = HashMap::new();
        for c in self
            .charges
            .iter()
            .filter(|c| c.key == key && counts(&c.path))
        {
            *per_period.entry(period_of(c.time, period)).or_default() += c.cost;
        }
        per_period.into_values().max().unwrap_or(0)
    }

    /// Every page fetched (charged), as `(path, scope, page_token)`, in order.
    pub fn fetched_pages(&self) -> Vec<(String, String, Option<String>)> {
        self.charges
            .iter()
            .map(|c| (c.path.clone(), c.scope.clone(), c.page_token.clone()))
            .collect()
    }

    /// Requests for each `(scope, page)` among `requests[from..]`: how
    /// often a run asked the upstream for each page.
    pub fn requests_per_page(&self, from: usize) -> BTreeMap<(String, u32), usize> {
        let mut out = BTreeMap::new();
        for r in self.requests.iter().skip(from) {
            *out.entry((r.scope.clone(), r.page.unwrap_or(0)))
                .or_insert(0) += 1;
        }
        out
    }

    /// The pages fetched (charged) more than once, each listed once.
    pub fn duplicate_pages(&self) -> Vec<(String, String, Option<String>)> {
        let mut seen: HashMap<(String, String, Option<String>), u32> = HashMap::new();
        let mut dups = Vec::new();
        for page in self.fetched_pages() {
            let n = seen.entry(page.clone()).or_insert(0);
            *n += 1;
            if *n == 2 {
                dups.push(page);
            }
        }
        dups
    }
}

/// A running simulator. Dropping it stops the server (without waiting);
/// [`Simulator::shutdown`] stops it and waits.
#[derive(Debug)]
pub struct Simulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    /// Ends the server's graceful shutdown wait; `None` once sent.
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<io::Result<()>>>,
}

impl Simulator {
    /// Starts serving `config` on a free port of 127.0.0.1.
    pub async fn start(config: SimConfig) -> io::Result<Simulator> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), config).await
    }

    /// Starts serving `config` on `addr`, which must be a loopback address
    /// (port 0 = any free port). Fails on an invalid config (zero pages, a
    /// key given twice, ...) with `InvalidInput`.
    pub async fn start_on(addr: SocketAddr, config: SimConfig) -> io::Result<Simulator> {
        if !addr.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("simulator: {addr} is not a loopback address"),
            ));
        }
        config.validate()?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config, format!("http://{addr}")));
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    // Sent or dropped: either way, stop.
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Simulator {
            addr,
            shared,
            stop: Some(stop),
            server: Some(server),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `base_url()` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url())
    }

    /// A snapshot of the counters and charges so far.
    pub fn stats(&self) -> SimStats {
        self.shared.lock().stats.clone()
    }

    /// The next `count` requests, on any path, get `fault` instead of their
    /// normal answer. Faults queue up: each request takes the oldest one that
    /// applies to its path.
    pub fn inject(&self, fault: Fault, count: u32) {
        self.queue(None, fault, count);
    }

    /// Like [`Simulator::inject`], but only requests to `path` take it.
    pub fn inject_on(&self, path: &str, fault: Fault, count: u32) {
        self.queue(Some(path.to_string()), fault, count);
    }

    /// Marks every item updated now: a `since` before now sees them again,
    /// and every page's `ETag` changes.
    pub fn touch(&self) {
        self.touch_at(Utc::now());
    }

    /// Marks every item updated at `at`.
    pub fn touch_at(&self, at: DateTime<Utc>) {
        self.shared.lock().updated_at = at;
    }

    /// Another program with the same key spends up to `units` now (what
    /// fits the key's limit): the upstream counts them, the request log and
    /// the charges do not. Returns the units spent.
    pub fn burn(&self, key: &str, units: u64) -> u64 {
        let Some(q) = self.shared.keys.get(key) else {
            return 0;
        };
        let burnt = if self.shared.accounting == SimAccounting::Google {
            let now = Instant::now();
            let mut st = self.shared.lock();
            let window = st.windows.entry(q.key.clone()).or_default();
            let burnt = units.min(q.units.saturating_sub(used(window, now, q.per)));
            window.push_back((now, burnt));
            burnt
        } else {
            accounting::burn(&self.shared, q, units)
        };
        self.shared.count(key, |s| s.burned += burnt);
        burnt
    }

    /// What the upstream would still allow `key` now, by its own count
    /// (the key's main limit): after a run, the units it left unused.
    pub fn left(&self, key: &str) -> u64 {
        let Some(q) = self.shared.keys.get(key) else {
            return 0;
        };
        if self.shared.accounting == SimAccounting::Google {
            let st = self.shared.lock();
            let empty = VecDeque::new();
            let window = st.windows.get(key).unwrap_or(&empty);
            return q.units.saturating_sub(used(window, Instant::now(), q.per));
        }
        accounting::left(&self.shared, q)
    }

    /// Requests (and units, weighted by their paths' costs) of `key` in
    /// flight now: received and not answered yet.
    pub fn in_flight(&self, key: &str) -> (u64, u64) {
        let st = self.shared.lock();
        st.in_flight.get(key).copied().unwrap_or_default()
    }

    /// What the upstream would still allow `key` now on GitHub resource
    /// `resource` (`core`: the key's own limit).
    pub fn left_on(&self, key: &str, resource: &str) -> u64 {
        let Some(q) = self.shared.keys.get(key) else {
            return 0;
        };
        accounting::left_of(&self.shared, q, resource)
    }

    /// Drops every fault not yet used.
    pub fn clear_faults(&self) {
        self.shared.lock().faults.clear();
    }

    fn queue(&self, path: Option<String>, fault: Fault, count: u32) {
        if count > 0 {
            self.shared
                .lock()
                .faults
                .push_back(Queued { path, fault, count });
        }
    }

    /// Stops accepting connections, lets in-flight requests finish (for at
    /// most a few seconds), and returns when the server is gone.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut server) = self.server.take()
            && tokio::time::timeout(SHUTDOWN_GRACE, &mut server)
                .await
                .is_err()
        {
            server.abort();
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What every request handler shares.
#[derive(Debug)]
struct Shared {
    costs: HashMap<String, u64>,
    keys: HashMap<String, KeyQuota>,
    hold: Option<Duration>,
    pages: u32,
    items: u32,
    ratelimit_headers: bool,
    cost_header: bool,
    buckets: HashMap<String, Limit>,
    style: SimStyle,
    styles: HashMap<String, SimStyle>,
    etag: bool,
    /// `http://127.0.0.1:PORT`: its own origin.
    base: String,
    next_origin: Option<String>,
    accounting: SimAccounting,
    resources: Vec<SimResource>,
    limits: Vec<(String, Limit)>,
    /// Quota usage, faults and stats. A std mutex: handlers on every runtime
    /// thread update it, and only in short sections that never `.await`.
    state: Mutex<SimState>,
}

#[derive(Debug)]
struct SimState {
    /// Per key: its charges still inside its longest window, oldest first.
    windows: HashMap<String, VecDeque<(Instant, u64)>>,
    /// Per key, in an accounting style other than Google's: its meter.
    meters: HashMap<String, accounting::Meter>,
    /// Per fixed window (a key, or a key's bucket): its period and the
    /// units used in it.
    periods: HashMap<String, (u64, u64)>,
    faults: VecDeque<Queued>,
    stats: SimStats,
    /// When every item was last updated ([`Simulator::touch`]).
    updated_at: DateTime<Utc>,
    /// Per key: requests and units in flight now.
    in_flight: HashMap<String, (u64, u64)>,
}

#[derive(Debug)]
struct Queued {
    path: Option<String>,
    fault: Fault,
    count: u32,
}

/// A limit the request did not fit, and when it would.
enum Over {
    Quota(Duration),
    Rate,
}

impl Shared {
    fn new(config: SimConfig, base: String) -> Self {
        let mut stats = SimStats::default();
        for k in &config.keys {
            stats.keys.insert(k.key.clone(), KeyStats::default());
        }
        Shared {
            costs: config.costs.into_iter().collect(),
            hold: config.hold,
            keys: config
                .keys
                .into_iter()
                .map(|k| (k.key.clone(), k))
                .collect(),
            pages: config.pages_per_query,
            items: config.items_per_page,
            ratelimit_headers: config.ratelimit_headers,
            cost_header: config.cost_header,
            buckets: config.buckets.into_iter().collect(),
            style: config.style,
            styles: config.styles.into_iter().collect(),
            etag: config.etag,
            base,
            next_origin: config.next_origin,
            accounting: config.accounting,
            resources: config.resources,
            limits: config.limits,
            state: Mutex::new(SimState {
                windows: HashMap::new(),
                meters: HashMap::new(),
                periods: HashMap::new(),
                faults: VecDeque::new(),
                stats,
                updated_at: Utc::now(),
                in_flight: HashMap::new(),
            }),
        }
    }

    /// How requests to `path` page.
    fn style_of(&self, path: &str) -> SimStyle {
        self.styles.get(path).copied().unwrap_or(self.style)
    }

    /// Where next links and next URLs point.
    fn next_base(&self) -> &str {
        self.next_origin.as_deref().unwrap_or(&self.base)
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic elsewhere must not take the simulator down with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one use of the oldest queued fault that applies to `path`.
    fn take_fault(&self, path: &str) -> Option<Fault> {
        let mut st = self.lock();
        let i = st
            .faults
            .iter()
            .position(|q| q.path.as_deref().is_none_or(|p| p == path))?;
        let q = &mut st.faults[i];
        q.count -= 1;
        let fault = q.fault.clone();
        if q.count == 0 {
            st.faults.remove(i);
        }
        Some(fault)
    }

    /// Checks `cost` against the key's limits and charges it if it fits.
    fn admit(
        &self,
        quota: &KeyQuota,
        cost: u64,
        page: &Page,
        query: &[(String, String)],
    ) -> Result<(), Over> {
        let mut st = self.lock();
        // Taken under the lock, so charges are recorded in time order.
        let now = Instant::now();
        let wall = Utc::now();
        // A bucket of its own, or the key's main window (and short limit).
        let (window_id, limit, rate) = match self.buckets.get(&page.path) {
            Some(b) => (format!("{}\u{1f}{}", quota.key, page.path), *b, None),
            None => {
                let main = Limit {
                    units: quota.units,
                    per: quota.per,
                };
                (quota.key.clone(), main, quota.rate)
            }
        };
        let st = &mut *st;
        let fixed_over = quota
            .fixed
            .then(|| fixed_over(&st.periods, &window_id, limit, wall, cost))
            .flatten();
        let longest = rate.map_or(limit.per, |r| r.per.max(limit.per));
        let window = st.windows.entry(window_id.clone()).or_default();
        while window
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= longest)
        {
            window.pop_front();
        }
        let over = if let Some(wait) = fixed_over {
            Some(Over::Quota(wait))
        } else if !quota.fixed && used(window, now, limit.per) + cost > limit.units {
            Some(Over::Quota(frees_in(
                window,
                now,
                limit.units,
                limit.per,
                cost,
            )))
        } else if rate.is_some_and(|r| used(window, now, r.per) + cost > r.units) {
            Some(Over::Rate)
        } else {
            window.push_back((now, cost));
            if quota.fixed {
                let (p, used) = st.periods.entry(window_id).or_insert((0, 0));
                let period = period_of(wall, limit.per);
                if *p != period {
                    *p = period;
                    *used = 0;
                }
                *used += cost;
            }
            None
        };
        if let Some(over) = over {
            st.stats
                .keys
                .entry(quota.key.clone())
                .or_default()
                .quota_errors += 1;
            return Err(over);
        }
        record_charge(st, quota, cost, page, query, now, wall);
        Ok(())
    }

    fn count(&self, key: &str, f: impl FnOnce(&mut KeyStats)) {
        f(self.lock().stats.keys.entry(key.to_string()).or_default());
    }

    /// The headers every answer to a valid key carries, per the config.
    fn key_headers(&self, quota: &KeyQuota, charged: u64, headers: &mut HeaderMap) {
        if self.cost_header {
            headers.insert(
                HeaderName::from_static(COST_HEADER),
                HeaderValue::from(charged),
            );
        }
        if !self.ratelimit_headers {
            return;
        }
        let now = Instant::now();
        let st = self.lock();
        let empty = VecDeque::new();
        let window = st.windows.get(&quota.key).unwrap_or(&empty);
        let used = used(window, now, quota.per);
        let reset_in = window
            .iter()
            .find(|(at, _)| now.saturating_duration_since(*at) < quota.per)
            .map_or(Duration::ZERO, |(at, _)| {
                (*at + quota.per).saturating_duration_since(now)
            });
        drop(st);
        let reset = epoch_secs_ceil(SystemTime::now() + reset_in);
        for (name, value) in [
            (RATELIMIT_LIMIT, quota.units),
            (RATELIMIT_REMAINING, quota.units.saturating_sub(used)),
            (RATELIMIT_USED, used),
            (RATELIMIT_RESET, reset),
        ] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
        }
    }
}

/// One request of a key in flight, counted until dropped (answered, or
/// its connection gone), its path's cost as its units.
struct Flight<'a> {
    shared: &'a Shared,
    key: String,
    units: u64,
}

impl<'a> Flight<'a> {
    fn start(shared: &'a Shared, key: &str, units: u64) -> Self {
        let mut st = shared.lock();
        let st = &mut *st;
        let now = st.in_flight.entry(key.to_owned()).or_default();
        now.0 += 1;
        now.1 += units;
        let ks = st.stats.keys.entry(key.to_owned()).or_default();
        ks.max_in_flight = ks.max_in_flight.max(now.0);
        ks.max_in_flight_units = ks.max_in_flight_units.max(now.1);
        Flight {
            shared,
            key: key.to_owned(),
            units,
        }
    }
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        if let Some(now) = st.in_flight.get_mut(&self.key) {
            now.0 = now.0.saturating_sub(1);
            now.1 = now.1.saturating_sub(self.units);
        }
    }
}

/// Counts a served, charged request of `cost` units.
fn record_charge(
    st: &mut SimState,
    quota: &KeyQuota,
    cost: u64,
    page: &Page,
    query: &[(String, String)],
    now: Instant,
    wall: DateTime<Utc>,
) {
    let ks = st.stats.keys.entry(quota.key.clone()).or_default();
    ks.units += cost;
    ks.ok += 1;
    st.stats.charges.push(Charge {
        at: now,
        time: wall,
        key: quota.key.clone(),
        path: page.path.clone(),
        cost,
        scope: page.scope.clone(),
        page_token: page.token.clone(),
        query: query.iter().filter(|(k, _)| k != "key").cloned().collect(),
    });
}

/// The fixed period `at` falls in: wall-clock multiples of `per` since the
/// Unix epoch.
fn period_of(at: DateTime<Utc>, per: Duration) -> u64 {
    let per_ms = per.as_millis().max(1);
    (at.timestamp_millis().max(0) as u128 / per_ms) as u64
}

/// When a fixed window (`periods[id]`) cannot take `cost` at `at`: how long
/// until its next period starts; `None` when it can.
fn fixed_over(
    periods: &HashMap<String, (u64, u64)>,
    id: &str,
    limit: Limit,
    at: DateTime<Utc>,
    cost: u64,
) -> Option<Duration> {
    let period = period_of(at, limit.per);
    let used = match periods.get(id) {
        Some((p, used)) if *p == period => *used,
        _ => 0,
    };
    if used + cost <= limit.units {
        return None;
    }
    let per_ms = limit.per.as_millis().max(1);
    let next_ms = (u128::from(period) + 1) * per_ms;
    let now_ms = at.timestamp_millis().max(0) as u128;
    Some(Duration::from_millis(next_ms.saturating_sub(now_ms) as u64))
}

/// Units in `window` charged less than `per` ago.
fn used(window: &VecDeque<(Instant, u64)>, now: Instant, per: Duration) -> u64 {
    window
        .iter()
        .rev()
        .take_while(|(at, _)| now.saturating_duration_since(*at) < per)
        .map(|(_, c)| c)
        .sum()
}

/// How long until a request of `cost` fits `units` per `per`, if nobody else
/// spends; `per` when it never can.
fn frees_in(
    window: &VecDeque<(Instant, u64)>,
    now: Instant,
    units: u64,
    per: Duration,
    cost: u64,
) -> Duration {
    if cost > units {
        return per;
    }
    let mut left = used(window, now, per);
    if left + cost <= units {
        return Duration::ZERO;
    }
    for (at, c) in window
        .iter()
        .filter(|(at, _)| now.saturating_duration_since(*at) < per)
    {
        left -= c;
        if left + cost <= units {
            return (*at + per).saturating_duration_since(now);
        }
    }
    Duration::ZERO
}

fn epoch_secs_ceil(t: SystemTime) -> u64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A Google-style error answer.
fn error(status: StatusCode, reason: &str, domain: &str, message: &str) -> Response {
    let body = json!({
        "error": {
            "code": status.as_u16(),
            "message": message,
            "errors": [{ "reason": reason, "domain": domain, "message": message }],
        }
    });
    (status, axum::Json(body)).into_response()
}

fn quota_exceeded() -> Response {
    error(
        StatusCode::FORBIDDEN,
        "quotaExceeded",
        "youtube.quota",
        "The request cannot be completed because you have exceeded your quota.",
    )
}

fn rate_limit_exceeded() -> Response {
    error(
        StatusCode::FORBIDDEN,
        "rateLimitExceeded",
        "youtube.quota",
        "The request cannot be completed because you have exceeded your rate limit.",
    )
}

fn bad_request(reason: &str, message: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        reason,
        "youtube.parameter",
        message,
    )
}

/// A parameter that makes a request a 400: its reason and message.
#[derive(Debug)]
struct BadParam(&'static str, &'static str);

impl IntoResponse for BadParam {
    fn into_response(self) -> Response {
        bad_request(self.0, self.1)
    }
}

/// What one request asks for, validated before anything is charged.
#[derive(Debug)]
struct Page {
    path: String,
    scope: String,
    token: Option<String>,
    body: Value,
    /// Headers the answer carries (`link`, `etag`).
    headers: Vec<(&'static str, String)>,
}

fn param<'q>(query: &'q [(String, String)], name: &str) -> Option<&'q str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Builds the answer to `path?query`, or the 400 for a bad parameter.
/// `body`: the request's (a GraphQL query's).
fn page(
    shared: &Shared,
    path: &str,
    query: &[(String, String)],
    body: &[u8],
) -> Result<Page, BadParam> {
    if shared.style_of(path) != SimStyle::Token {
        return styles::page(shared, path, query, body);
    }
    let kinds = kinds(path);
    let max_results = match param(query, "maxResults") {
        None => shared.items,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if n <= 50 => n.min(shared.items),
            _ => return Err(BadParam("invalidValue", "maxResults must be 0 to 50.")),
        },
    };
    if path == VIDEOS
        && let Some(chart) = param(query, "chart")
        && chart != "mostPopular"
    {
        return Err(BadParam("invalidValue", "Unsupported chart."));
    }
    if let Some(ids) = param(query, "id") {
        return Ok(lookup(path, kinds, ids));
    }
    let scope = match path {
        VIDEOS => param(query, "regionCode"),
        SEARCH => param(query, "q"),
        _ => param(query, "regionCode").or_else(|| param(query, "q")),
    }
    .unwrap_or(kinds.2)
    .to_string();
    let token = param(query, "pageToken").filter(|t| !t.is_empty());
    let page_no = token_page(shared, token)?;
    let items: Vec<Value> = (1..=max_results)
        .map(|i| {
            let id = format!("{scope}-p{page_no}-i{i}");
            let rank = (page_no - 1) * max_results + i;
            item(path, kinds.1, &id, &scope, rank)
        })
        .collect();
    let mut body = json!({
        "kind": kinds.0,
        "items": items,
        "pageInfo": {
            "totalResults": shared.pages * max_results,
            "resultsPerPage": max_results,
        },
    });
    if page_no < shared.pages {
        body["nextPageToken"] = json!(format!("p{}", page_no + 1));
    }
    if page_no > 1 {
        body["prevPageToken"] = json!(format!("p{}", page_no - 1));
    }
    Ok(Page {
        path: path.to_string(),
        scope,
        token: token.map(str::to_string),
        body,
        headers: Vec::new(),
    })
}

/// A YouTube path's list kind, item kind and default scope.
fn kinds(path: &str) -> (&'static str, &'static str, &'static str) {
    match path {
        VIDEOS => ("youtube#videoListResponse", "youtube#video", "US"),
        SEARCH => ("youtube#searchListResponse", "youtube#searchResult", ""),
        CHANNELS => ("youtube#channelListResponse", "youtube#channel", "all"),
        _ => ("sim#listResponse", "sim#item", "all"),
    }
}

/// The page number a YouTube page token stands for (`p2` is 2; none is 1).
fn token_page(shared: &Shared, token: Option<&str>) -> Result<u32, BadParam> {
    let Some(t) = token else { return Ok(1) };
    match t.strip_prefix('p').and_then(|n| n.parse::<u32>().ok()) {
        Some(n) if (2..=shared.pages).contains(&n) && t == format!("p{n}") => Ok(n),
        _ => Err(BadParam(
            "invalidPageToken",
            "The request specifies an invalid page token.",
        )),
    }
}

/// `id=a,b`: one item per id, unpaged.
fn lookup(path: &str, kinds: (&str, &str, &str), ids: &str) -> Page {
    let items: Vec<Value> = ids
        .split(',')
        .filter(|id| !id.is_empty())
        .enumerate()
        .map(|(i, id)| item(path, kinds.1, id, "lookup", i as u32 + 1))
        .collect();
    let n = items.len();
    Page {
        path: path.to_string(),
        scope: format!("id:{ids}"),
        token: None,
        body: json!({
            "kind": kinds.0,
            "items": items,
            "pageInfo": { "totalResults": n, "resultsPerPage": n },
        }),
        headers: Vec::new(),
    }
}

/// What the request log says a request asked for: its scope and page.
fn asked(
    shared: &Shared,
    path: &str,
    query: &[(String, String)],
    body: &[u8],
) -> (String, Option<u32>) {
    let style = shared.style_of(path);
    if style != SimStyle::Token {
        return (
            styles::scope(style, query, body),
            styles::page_no(style, query, body).ok(),
        );
    }
    let scope = param(query, "regionCode")
        .or_else(|| param(query, "q"))
        .or_else(|| param(query, "id"))
        .unwrap_or(kinds(path).2);
    let token = param(query, "pageToken").filter(|t| !t.is_empty());
    (scope.to_owned(), token_page(shared, token).ok())
}

/// The key a request comes with: query `key` or `access_token`,
/// `X-Shopify-Access-Token`, or `Authorization: Bearer KEY` (or `token
/// KEY`, as GitHub also takes).
fn api_key(query: &[(String, String)], headers: &HeaderMap) -> Option<String> {
    if let Some(k) = param(query, "key").or_else(|| param(query, "access_token")) {
        return Some(k.to_owned());
    }
    // Shopify's own header.
    if let Some(k) = headers
        .get("x-shopify-access-token")
        .and_then(|v| v.to_str().ok())
    {
        return Some(k.trim().to_owned());
    }
    let auth = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = auth.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token"))
        .then(|| key.trim().to_owned())
}

/// One deterministic item.
fn item(path: &str, kind: &str, id: &str, scope: &str, rank: u32) -> Value {
    let snippet = json!({
        "publishedAt": format!("2024-01-01T00:{:02}:00Z", rank % 60),
        "channelId": format!("UCsim{}", rank % 7),
        "title": format!("Simulated {scope} item {rank} ({id})"),
        "description": format!("Deterministic item {id} served by the quota-worker simulator at {path}."),
        "channelTitle": format!("Sim Channel {}", rank % 7),
    });
    if path == SEARCH {
        json!({
            "kind": kind,
            "etag": format!("etag-{id}"),
            "id": { "kind": "youtube#video", "videoId": id },
            "snippet": snippet,
        })
    } else {
        json!({ "kind": kind, "etag": format!("etag-{id}"), "id": id, "snippet": snippet })
    }
}

/// Every request: answered ([`respond`]), then logged.
async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    body: axum::body::Bytes,
) -> Response {
    let received = Utc::now();
    let query = query.ok().map(|Query(q)| q);
    let key = query.as_deref().and_then(|q| api_key(q, &headers));
    let request = Asked {
        method: &method,
        uri: &uri,
        headers: &headers,
        query: query.as_deref(),
        key: key.as_deref(),
        body: &body,
    };
    let response = respond(&shared, &request).await;
    let q = query.unwrap_or_default();
    let (scope, page) = asked(&shared, uri.path(), &q, &body);
    let logged = Logged {
        received,
        time: Utc::now(),
        key,
        path: uri.path().to_owned(),
        query: q
            .into_iter()
            .filter(|(k, _)| k != "key" && k != "access_token")
            .collect(),
        scope,
        page,
        if_none_match: headers
            .get(IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        resource: accounting::resource_of(&shared, uri.path()).map(str::to_owned),
        status: response.status().as_u16(),
        over_limit: response.extensions().get::<OverLimit>().is_some(),
        method: method.as_str().to_owned(),
        body: String::from_utf8_lossy(&body).into_owned(),
        headers: (headers.iter())
            .filter(|(name, _)| !SECRET_HEADERS.contains(name))
            .filter_map(|(name, v)| Some((name.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
    };
    shared.lock().stats.requests.push(logged);
    response
}

/// One request as [`respond`] reads it.
struct Asked<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    query: Option<&'a [(String, String)]>,
    key: Option<&'a str>,
    /// Its body (a GraphQL query's).
    body: &'a [u8],
}

/// The answer: path → key → injected fault → parameters → `If-None-Match`
/// → quota → answer.
async fn respond(shared: &Shared, asked: &Asked<'_>) -> Response {
    let (method, uri, headers, query, key) = (
        asked.method,
        asked.uri,
        asked.headers,
        asked.query,
        asked.key,
    );
    let path = uri.path();
    let Some(&cost) = shared.costs.get(path) else {
        return error(StatusCode::NOT_FOUND, "notFound", "global", "Not Found");
    };
    // Shopify's and GitHub's GraphQL queries come as POSTs; a GraphQL
    // connection takes nothing else.
    let connection = matches!(shared.style_of(path), SimStyle::Graphql(_));
    let post = matches!(shared.accounting, SimAccounting::Shopify { .. })
        || accounting::resource_of(shared, path) == Some("graphql")
        || connection;
    if (method != Method::GET || connection) && !(post && method == Method::POST) {
        let only = if connection { "POST" } else { "GET" };
        return error(
            StatusCode::METHOD_NOT_ALLOWED,
            "methodNotAllowed",
            "global",
            &format!("Only {only} is supported."),
        );
    }
    let Some(query) = query else {
        return bad_request("badRequest", "The query string cannot be parsed.");
    };
    let Some(quota) = key.and_then(|k| shared.keys.get(k)) else {
        shared.lock().stats.invalid_keys += 1;
        return bad_request(
            "keyInvalid",
            "API key not valid. Please pass a valid API key.",
        );
    };
    let _flight = Flight::start(shared, &quota.key, cost);
    if let Some(hold) = shared.hold {
        tokio::time::sleep(hold).await;
    }
    let mut charged = 0;
    let mut response = match shared.take_fault(path) {
        Some(fault) => {
            shared.count(&quota.key, |s| {
                s.injected += 1;
                if matches!(fault, Fault::TooManyRequests { .. } | Fault::RetryAfter(_)) {
                    s.too_many_requests += 1;
                }
            });
            tracing::debug!(path, ?fault, "simulator: injected fault");
            injected(shared, fault, path, query, asked.body).await
        }
        None => match page(shared, path, query, asked.body) {
            Err(r) => {
                shared.count(&quota.key, |s| s.bad_requests += 1);
                r.into_response()
            }
            Ok(p) if not_modified(&p, headers) => {
                // A conditional request for an unchanged page: never charged.
                (StatusCode::NOT_MODIFIED, [(ETAG, etag_of(&p))]).into_response()
            }
            Ok(p) if shared.accounting != SimAccounting::Google => {
                let (r, c) = accounting::serve(shared, quota, cost, p, query, asked.body);
                charged = c;
                r
            }
            Ok(p) => match shared.admit(quota, cost, &p, query) {
                Ok(()) => {
                    charged = cost;
                    let mut r = axum::Json(p.body).into_response();
                    for (name, value) in p.headers {
                        if let Ok(v) = HeaderValue::from_str(&value) {
                            r.headers_mut().insert(name, v);
                        }
                    }
                    r
                }
                Err(Over::Rate) => {
                    let mut r = rate_limit_exceeded();
                    r.extensions_mut().insert(OverLimit);
                    r
                }
                Err(Over::Quota(wait)) => {
                    let mut r = quota_exceeded();
                    r.extensions_mut().insert(OverLimit);
                    if shared.ratelimit_headers {
                        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
                    }
                    r
                }
            },
        },
    };
    shared.key_headers(quota, charged, response.headers_mut());
    accounting::headers(shared, quota, path, response.headers_mut());
    response
}

fn etag_of(p: &Page) -> String {
    p.headers
        .iter()
        .find(|(name, _)| *name == "etag")
        .map(|(_, v)| v.clone())
        .unwrap_or_default()
}

/// Whether `headers` carry `If-None-Match` with the page's `ETag`.
fn not_modified(p: &Page, headers: &HeaderMap) -> bool {
    let etag = etag_of(p);
    !etag.is_empty()
        && headers
            .get_all(IF_NONE_MATCH)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim() == etag || t.trim() == "*")
}

/// The answer an injected fault gives.
async fn injected(
    shared: &Shared,
    fault: Fault,
    path: &str,
    query: &[(String, String)],
    body: &[u8],
) -> Response {
    match fault {
        Fault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let reason = if status.is_server_error() {
                "backendError"
            } else {
                "injected"
            };
            error(
                status,
                reason,
                "global",
                status.canonical_reason().unwrap_or("Injected fault"),
            )
        }
        Fault::TooManyRequests { retry_after_secs } => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rateLimitExceeded",
                "usageLimits",
                "Too many requests.",
            );
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
            r
        }
        Fault::RateLimitExceeded => rate_limit_exceeded(),
        Fault::Delay(d) => {
            tokio::time::sleep(d).await;
            match page(shared, path, query, body) {
                Ok(p) => axum::Json(p.body).into_response(),
                Err(r) => r.into_response(),
            }
        }
        Fault::Message { status, message } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
            let body = json!({
                "message": message,
                "documentation_url": "https://docs.example/rate-limits",
            });
            (status, axum::Json(body)).into_response()
        }
        Fault::RetryAfter(raw) => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rateLimitExceeded",
                "usageLimits",
                "Too many requests.",
            );
            if let Ok(v) = HeaderValue::from_str(&raw) {
                r.headers_mut().insert(RETRY_AFTER, v);
            }
            r
        }
        Fault::GithubSecondary { retry_after_secs } => {
            accounting::github_secondary(retry_after_secs)
        }
        Fault::NotModified => StatusCode::NOT_MODIFIED.into_response(),
        Fault::Body { status, body } => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response(),
        Fault::Garbage => (
            StatusCode::OK,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            "not json",
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(key: &str, at: Instant, cost: u64) -> Charge {
        Charge {
            at,
            time: Utc::now(),
            key: key.into(),
            path: VIDEOS.into(),
            cost,
            scope: "US".into(),
            page_token: None,
            query: Vec::new(),
        }
    }

    #[test]
    fn max_units_in_any_window_slides() {
        let t0 = Instant::now();
        let s = |ms| t0 + Duration::from_millis(ms);
        let stats = SimStats {
            charges: vec![
                charge("a", s(0), 3),
                charge("b", s(10), 100),
                charge("a", s(500), 4),
                charge("a", s(1000), 5), // exactly 1 s after the first: not with it
                charge("a", s(1600), 1),
            ],
            ..SimStats::default()
        };
        let sec = Duration::from_secs(1);
        assert_eq!(stats.max_units_in_any_window("a", sec), 9);
        assert_eq!(
            stats.max_units_in_any_window("a", Duration::from_millis(1001)),
            12
        );
        assert_eq!(
            stats.max_units_in_any_window("a", Duration::from_millis(1)),
            5
        );
        assert_eq!(stats.max_units_in_any_window("b", sec), 100);
        assert_eq!(stats.max_units_in_any_window("nobody", sec), 0);
    }

    #[test]
    fn frees_in_is_exact_for_weighted_costs() {
        let now = Instant::now();
        let per = Duration::from_secs(10);
        let w: VecDeque<_> = [
            (now - Duration::from_secs(8), 3),
            (now - Duration::from_secs(5), 4),
        ]
        .into();
        // 7 used of 10: a cost of 3 fits now, 4 after the first frees (2 s),
        // 8 after both (5 s), 11 never (the whole period).
        assert_eq!(frees_in(&w, now, 10, per, 3), Duration::ZERO);
        assert_eq!(frees_in(&w, now, 10, per, 4), Duration::from_secs(2));
        assert_eq!(frees_in(&w, now, 10, per, 8), Duration::from_secs(5));
        assert_eq!(frees_in(&w, now, 10, per, 11), per);
    }
}
