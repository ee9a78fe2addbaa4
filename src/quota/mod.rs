//! Quota windows and the spend: weighted units taken atomically from a
//! credential's shared windows in Redis by the spend core (`lua/spend/`, a
//! function library on Redis 7, one script by EVALSHA on Redis 6).
//!
//! This module knows no HTTP and no queue. Every spend is an [`Operation`]
//! laid out in one place ([`Plan::layout`]), made ready by
//! `Limiter::prepare` (its cost checked, its KEYS and ARGV) and decided by
//! `Limiter::conclude` (the reply, counted in the metrics). The CLI's
//! `spend`, the workers and the benchmarks call [`Limiter::spend`] (or
//! [`Limiter::spend_with`] with [`SpendOptions`]: a cost, a job's priority
//! reserve, a tenant, a waiting line), which runs both; a task's first
//! page's spend rides in the item claim's call between the two instead
//! (`worker::lock`, where `Limiter::rides_along` says it may). A decision
//! is data ([`Decision`]); a
//! cost that can never fit is an error of its own
//! ([`QuotaError::CostTooLarge`]), as in governor's `InsufficientCapacity`.
//! [`Limiter::sync`] records drift when the upstream reports fewer units left
//! than a window would admit.
//!
//! The windows live in the queue's Redis or on a Redis Cluster
//! (`[redis] quota_nodes`): [`backend`] connects to either, and the Limiter
//! works the same on both. With `[redis] quota_replicas = 1` an admitted
//! spend is acknowledged by a replica (`WAIT`) before the Limiter says yes.
//!
//! Files: `limiter.rs` runs the operations; `plan.rs` and `quotas.rs` are
//! what each call sends, built once per config; `operation.rs` lays out its
//! KEYS and ARGV; `decision.rs`, `error.rs` and `usage.rs` are what comes
//! back; `library.rs` assembles the spend core, `backend.rs` reaches where
//! it runs; `block.rs`, `ring.rs` and `shadow.rs` are the blocks, the spend
//! history and shadow windows around it.

pub mod backend;
mod block;
mod decision;
mod error;
mod library;
mod limiter;
mod operation;
mod plan;
mod quotas;
pub(crate) mod ring;
mod shadow;
pub(crate) mod tz;
mod usage;

use std::time::Duration;

pub use backend::{ProbeError, QuotaConn, QuotaTarget};

pub(crate) use block::BlockNote;
pub use block::{BlockFor, BlockReason, Blocked, ResourceBlock, STREAK_MEMORY};

pub(crate) use decision::spend_reply;
pub use decision::{Decision, RejectedBy, Rejection, Spent};
pub use error::QuotaError;
pub(crate) use library::claim as claim_function;
pub use library::{Op, SCRIPT, library, script};
pub use limiter::Limiter;
pub(crate) use limiter::PreparedSpend;
pub use operation::{Layout, Operation, SpendOptions};
pub use plan::{EndpointPlan, Plan, WindowPlan};
pub use quotas::Quotas;
pub use usage::{CredentialUsage, EVERY_RESOURCE, Forgotten, Tenants, WindowUsage};

/// Every script that runs where the windows live (the ACL check of a
/// `[redis] quota_nodes` cluster asks about the commands they call).
pub(crate) const SCRIPTS: [&str; 3] = [SCRIPT, block::BLOCK_SOURCE, block::BLOCKS_SOURCE];

/// How long the `WAIT` after an admitted spend waits for replicas, for a
/// call that may take `timeout` in all: a third of it. A call can hold two
/// `WAIT`s: on NOSCRIPT the pipeline runs again with `EVAL`, and the first
/// one's `WAIT` (with nothing new to wait for) still waits when the master
/// has no replica. So with no replica answering, both return (0) before the
/// call times out, and the spend is refunded rather than left in doubt.
/// Never 0, which would make `WAIT` wait forever.
pub fn replica_wait(timeout: Duration) -> Duration {
    // Whole milliseconds: what `WAIT` takes, and what the error then says.
    Duration::from_millis((timeout.as_millis() / 3).max(1) as u64)
}

/// A fresh request id: unique across processes and hosts.
pub fn request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
