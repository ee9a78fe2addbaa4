//! quota-worker: cron-scheduled ingestion from metered APIs, spending weighted
//! quota units from shared, exact sliding windows in Redis before every request.
//!
//! # Layout
//!
//! - [`config`]: the config files, parsed and validated (errors name file,
//!   line, field); everything else reads it.
//! - [`quota`]: quota windows and the spend (`lua/spend.lua`): spend, settle,
//!   block, peek. Knows no HTTP and no queue.
//! - [`keys`]: every Redis key name, in one place.
//! - [`schedule`]: cron fire times and worst-case spending per window.
//! - [`conn`], [`embedded`]: reaching Redis, or running one;
//!   [`eviction`]: whether that Redis may evict the windows' keys.
//! - [`simulator`]: a simulated metered API on loopback, for `demo` and the
//!   integration tests; the daemon never imports it.
//! - [`sink`]: where fetched records go: JSON lines files (whole-page
//!   appends, safe across processes) or SQLite with an FTS5 index that
//!   serves search locally.
//! - [`cli`]: one file per command; `main.rs` only parses and dispatches.
#![warn(missing_docs, unreachable_pub)]
#![deny(clippy::await_holding_lock)]

pub mod cli;
pub mod config;
pub mod conn;
pub mod daemon;
pub mod embedded;
pub mod eviction;
pub mod fetch;
pub mod keys;
pub mod logging;
pub mod ops;
pub mod queue;
pub mod quota;
pub mod schedule;
pub mod simulator;
pub mod sink;
pub mod stats;
pub mod worker;
