//! A request's lease in its endpoint's concurrent windows (SPEC
//! "Concurrency windows"): taken by the spend, returned exactly once, by
//! the request's settle.
//!
//! The lease belongs to the value that lives as long as its request: the
//! task's first spend (`spend::FirstSpend`, owned by the run's progress)
//! until a page step takes it, then that page's `spend::Spent`. It is
//! returned in one place, [`settle`], which every settle of a spent request
//! goes through: the one after its answer was read (to the reported cost,
//! or to its own cost, which changes no other window), a refund (0: nothing
//! was sent). A settle returns the lease in Redis whatever its cost.
//!
//! However else the request's value goes away — a panic unwinding through
//! it, the task's future dropped at shutdown, an error that skips the
//! settle, a settle Redis did not take — the lease's `Drop` hands the return
//! to the runtime: `Drop` cannot await, so it spawns the settle (to the
//! spend's own cost: the request may have been sent, its units stay). When no
//! runtime is left to run it (the process is exiting), or Redis does not take
//! it either, the lease lapses by itself at its expiry (the window's `lease`,
//! by default the endpoint's `timeout` + 5 s): until then the window admits
//! fewer requests, never more. No background task of our own is kept for
//! this: the spawned settle is the same call the step would have made.

use tracing::{debug, warn};

use crate::quota::{Limiter, QuotaError};

/// A spend's lease in its concurrent windows, held until [`settle`]
/// returns it (or, failing that, until it is dropped: see above).
#[must_use = "a lease not settled is returned only when dropped, by a spawned settle"]
pub(super) struct Lease {
    limiter: Limiter,
    endpoint: String,
    tenant: Option<String>,
    request_id: String,
    /// The units the spend took: what the fallback settles to.
    cost: u64,
    /// Until a settle returned it.
    held: bool,
}

impl Lease {
    /// The lease a spend of `cost` on `endpoint` (a template's: on
    /// `tenant`) took, if the endpoint has a concurrent window; `None`
    /// when it has none (nothing to return).
    pub(super) fn taken(
        limiter: &Limiter,
        endpoint: &str,
        tenant: Option<&str>,
        request_id: &str,
        cost: u64,
    ) -> Option<Lease> {
        let ep = limiter.quotas().endpoint(endpoint).ok()?;
        ep.takes_lease().then(|| Lease {
            limiter: limiter.clone(),
            endpoint: endpoint.to_owned(),
            tenant: tenant.map(str::to_owned),
            request_id: request_id.to_owned(),
            cost,
            held: true,
        })
    }

    /// Redis took a settle of the lease's request: nothing is left to
    /// return.
    fn returned(mut self) {
        self.held = false;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let (endpoint, request_id, cost) =
            (self.endpoint.clone(), self.request_id.clone(), self.cost);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            warn!(endpoint = %endpoint, request_id, "a lease was not returned and no runtime is left to return it; it lapses at its expiry");
            return;
        };
        let (limiter, tenant) = (self.limiter.clone(), self.tenant.take());
        runtime.spawn(async move {
            match limiter
                .settle_for(&endpoint, tenant.as_deref(), &request_id, cost)
                .await
            {
                Ok(_) => {
                    debug!(endpoint = %endpoint, request_id, "returned a lease its step did not")
                }
                Err(e) => warn!(endpoint = %endpoint, request_id, error = %e,
                                "could not return a lease; it lapses at its expiry"),
            }
        });
    }
}

/// Settles request `request_id`'s spend on `endpoint` (a template's: on
/// `tenant`) to `actual` units, and returns `lease` (the request's, if it
/// holds one) when Redis took the settle: the one place a spent request is
/// settled. When Redis did not, the lease stays held, and is returned when
/// its owner drops it.
pub(super) async fn settle(
    limiter: &Limiter,
    endpoint: &str,
    tenant: Option<&str>,
    request_id: &str,
    lease: &mut Option<Lease>,
    actual: u64,
) -> Result<usize, QuotaError> {
    let settled = limiter
        .settle_for(endpoint, tenant, request_id, actual)
        .await?;
    if let Some(lease) = lease.take() {
        lease.returned();
    }
    Ok(settled)
}
