//! What can go wrong talking to the limiter, each variant saying what to do.

use std::time::Duration;

use redis::RetryMethod;

/// What went wrong talking to the limiter. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    /// Fix the caller: no such endpoint in the config.
    #[error("unknown endpoint {0:?}")]
    UnknownEndpoint(String),
    /// Fix the caller: no such credential in the config.
    #[error("unknown credential {0:?}")]
    UnknownCredential(String),
    /// Fix the caller: a template credential is spent, peeked and blocked
    /// one tenant at a time (`ig[account=123]`).
    #[error("credential {0:?} is a template: name one tenant, as {0}[{1}=VALUE]")]
    TemplateNeedsTenant(String, String),
    /// Fix the caller: the credential has no such window.
    #[error("credential {credential:?} has no window {window}")]
    UnknownWindow {
        /// The credential.
        credential: String,
        /// The window asked for, described.
        window: String,
    },
    /// Fix the request: it could never be admitted.
    #[error("cost {cost} can never fit: the tightest window that applies is {window}")]
    CostTooLarge {
        /// The cost asked for.
        cost: u64,
        /// The smallest window, described.
        window: String,
    },
    /// Try again later: Redis did not answer in time.
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Try again later: Redis is unreachable, loading, or failing over.
    #[error("Redis is unavailable: {0}")]
    Unavailable(#[source] redis::RedisError),
    /// Try again later: an admitted spend was not acknowledged by a replica
    /// (`[redis] quota_replicas`) in time, so a failover could forget it. On a
    /// fail-closed endpoint the spend has been refunded (when Redis took the
    /// refund) and nothing may be sent.
    #[error(
        "the spend was not acknowledged by {wanted} replica(s) within {waited:?} ({acked} did); a failover could forget it"
    )]
    NotReplicated {
        /// Replicas asked for.
        wanted: u8,
        /// Replicas that acknowledged.
        acked: u64,
        /// How long `WAIT` waited.
        waited: Duration,
    },
    /// A bug: the script refused its arguments or answered nonsense.
    #[error("the spend script failed: {0}")]
    Script(String),
}

impl QuotaError {
    /// Whether the limiter itself could not answer (as opposed to a bad call).
    pub(crate) fn is_unavailable(&self) -> bool {
        matches!(
            self,
            QuotaError::Timeout(_) | QuotaError::Unavailable(_) | QuotaError::NotReplicated { .. }
        )
    }

    pub(super) fn from_redis(e: redis::RedisError) -> Self {
        // Classified by what redis-rs says to do next, never by message text.
        match e.retry_method() {
            RetryMethod::NoRetry if e.code().is_some() => QuotaError::Script(e.to_string()),
            _ => QuotaError::Unavailable(e),
        }
    }
}
