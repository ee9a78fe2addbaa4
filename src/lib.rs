//! quota-worker: cron-scheduled ingestion from metered APIs, spending weighted
//! quota units from shared, exact sliding windows in Redis before every request.
//!
//! # How data flows
//!
//! ```text
//! config ─> daemon ─> schedule: cron tick ─> fan-out ─> queue (tasks, in Redis)
//!              │                                           │
//!              │        worker: one task ─> quota: spend ─> fetch: request ─> sink: records
//!              │              └─> outcome (done, quota_exhausted, ...) ─> stats, metrics, log
//!              └─> ops: metrics, /readyz, systemd notify
//! ```
//!
//! Config in; tick → tasks → spends → requests → records out. Nothing flows
//! back up: `quota` knows no HTTP and no queue, `fetch` knows no Redis, `ops`
//! knows no daemon.
//!
//! # Where things are, in the order a task meets them
//!
//! (docs/layout.md draws the same map.)
//!
//! 1. [`schedule`]: when a job fires (cron) and **where a tick is fanned
//!    out** into tasks (`schedule::TickItems`: `fan_out` lists ×
//!    `fan_out_from` rows, `schedule::source`; `schedule::queue_tick`:
//!    queued in bounded chunks, once per tick across daemons, by the
//!    daemon's `schedule::Scheduler` loop and `trigger`); fair rotation;
//!    worst-case spending per window.
//! 2. [`queue`]: the tasks in Redis — apalis-redis, our backlog in front of
//!    it, our janitor behind it, the workarounds for apalis's pitfalls;
//!    `queue::scripts`: one file per Lua script, its KEYS and ARGV typed.
//! 3. `worker`: one task — claim its item, run its pages, record how it
//!    ended. `worker::claim`: the claim, and whose quota the run spends
//!    (looked up once per task); `worker::run`: the run, step by step, and
//!    its private progress; `worker::step`: **where an answer becomes an
//!    action** (the pure `decide`, unit-tested for every kind of answer);
//!    `worker::spend`: the spend before a request;
//!    `worker::account`: **what an answer does to the quota**, as data (the
//!    pure `plan`, unit-tested per accounting adapter).
//! 4. `fetch`: the upstream request and what its answer means —
//!    `fetch::request` (the template for one page, its origin, redirects),
//!    `fetch::paging` (**where pagination lives**: the next page in each
//!    style, the checkpoint's cursor, when the pages end), `fetch::answer`
//!    (`Reply`: a page, throttled, a 5xx, ..., read within bounds and
//!    scrubbed).
//! 5. [`sink`]: where records go, a file per kind behind one interface
//!    (`sink::Sinks`: write a page, ready before spending for one):
//!    `sink::jsonl` JSON lines files (whole-page appends, safe across
//!    processes), `sink::sqlite` SQLite with an FTS5 index that serves
//!    search, `sink::postgres` a PostgreSQL table (each page exactly once,
//!    a `tsvector` for search; split into writing, `schema` and `search`);
//!    beside them `sink::path` (paths rendered, directories probed),
//!    `sink::record` (what every kind makes of a page), `sink::error`
//!    (what each error means for the page), the spool and the pages kept;
//!    [`pg`]: connecting to PostgreSQL (password file, TLS, pools).
//! 6. [`outcome`]: **where an outcome is defined** — `done`,
//!    `quota_exhausted`, … and what each carries (retry-after, pages,
//!    units).
//!
//! Beside the path:
//!
//! - [`config`]: the config files, parsed and validated (errors name file,
//!   line, field); everything else reads it.
//! - [`daemon`]: `quota-worker run` — starts Redis (or connects to it) and
//!   the loops, and stops them on shutdown.
//! - [`quota`]: **where a spend is decided** — the windows and the spend
//!   core (`lua/spend/`: a Redis function library, one script on Redis 6):
//!   spend, settle, block, peek, sync, undrift. The CLI's `spend`, the
//!   workers and the benchmarks make and read every spend through the same
//!   two functions (`Limiter::prepare`, `Limiter::conclude`), whether the
//!   Limiter's own call runs it or, for a task's first page, the item
//!   claim's call carries it.
//!   `accounting`: what an answer says about the upstream's own quota (one
//!   `Verdict`: settle, resync, block, for the resource it speaks for, per
//!   upstream: GitHub REST and GraphQL, Shopify, Meta, IETF).
//! - [`keys`]: **where a Redis key is named** — every key name, in one place.
//! - `decode`: a 2xx body as sent — its text (charset, BOM, U+FFFD for
//!   what cannot be read), decoded within a memory budget with numbers'
//!   text and keys' order kept, and the records that differ from what was
//!   sent (`qw_records_altered_total`).
//! - `item_state`: where a job's items stand (`quota-worker state`, the
//!   status page's `/api/state/JOB`), read through the worker's own keys and
//!   types, and `state reset` (`lua/state_reset.lua`).
//! - `scrub`: the secret scrubber every piece of upstream text passes
//!   through.
//! - `mint`: tokens that expire, printed by a credential's
//!   `secret_command` and kept in memory only.
//! - [`ops`]: Prometheus metrics, `/healthz`, `/readyz`, the status page
//!   (`/`, `/api/status`), and the systemd notify protocol (watchdog pings
//!   only while the daemon's loops beat). What the status page shows that
//!   Redis would not otherwise keep is written beside its writer (24-hour
//!   spend rings: `quota::ring`; each job's last ticks and error:
//!   `queue::scripts::finish`; why a credential is blocked:
//!   `quota::BlockNote`) and read through one read-only module
//!   (`ops::status::read`).
//! - [`stats`]: this process's counters (the demo's progress, the metrics);
//!   [`liveness`]: the daemon loops' beats (the watchdog, `/readyz`).
//! - [`conn`], `embedded`: reaching the Redis master (and following it through
//!   a failover: Sentinel, a managed Redis), or running one; `eviction`:
//!   whether that Redis may evict the windows' keys.
//! - [`logging`]: the log subscriber (text or JSON lines).
//! - `simulator` (its own crate, `crates/simulator`): a simulated metered
//!   API on loopback, for `demo`, the integration tests and the benchmarks;
//!   the daemon never imports it.
//! - [`cli`]: one file per command; `main.rs` only parses and dispatches.
//!
//! A module with modules of its own is a folder whose `mod.rs` is its
//! root (`quota/mod.rs`, `sink/mod.rs`), never `sink.rs` beside `sink/`:
//! most of the tree was already so, and a folder then holds all of its
//! module.
#![warn(missing_docs, unreachable_pub)]
#![deny(clippy::await_holding_lock)]

pub(crate) mod accounting;
pub(crate) mod acl;
pub mod cli;
pub mod config;
pub mod conn;
pub mod daemon;
pub(crate) mod decode;
pub(crate) mod embedded;
pub(crate) mod eviction;
pub(crate) mod fetch;
pub(crate) mod host;
pub(crate) mod item_state;
pub mod keys;
pub mod liveness;
pub mod logging;
pub(crate) mod mint;
pub mod ops;
pub mod outcome;
pub mod pg;
pub mod queue;
pub mod quota;
pub mod schedule;
pub(crate) mod scrub;
pub mod sink;
pub mod stats;
pub(crate) mod worker;
