//! A task's claim on its item, and what the run takes from it: what the
//! claim found of the item's state, the first page's spend when it rode in
//! the claim's call, the token a command minted, and whose quota the run
//! spends ([`Payer`]).
//!
//! Whose quota is the endpoint → credential → tenant lookup ([`payer`]),
//! made once per task here and passed on to the mint, the first spend,
//! the run's secret and every spend after; once more under a reload's
//! config when the run follows it (`run::credential`).

use std::time::Instant;

use super::Worker;
use super::lock::{Claim, Found, ItemLock};
use super::spend::{FirstSpend, Payer};
use crate::config::{Config, Job, Secret};
use crate::queue::TaskArgs;

/// A claimed item, and what the run takes from the claim.
pub(super) struct Claimed<'a> {
    /// What the claim found of the item's state.
    pub(super) found: Found,
    /// The first page's spend, made in the claim's call, until the run's
    /// first spend step takes it (the run's one exit refunds one no
    /// step took).
    pub(super) first_spend: Option<FirstSpend>,
    /// Whose quota the run spends; `Err`: why it spends none (its endpoint
    /// is not in this config), the task's outcome once its item's state is
    /// read.
    pub(super) payer: Result<Payer<'a>, String>,
    /// The token a credential command minted for the task, or why there is
    /// none; `None` when its secret is not minted.
    pub(super) minted: Option<Result<Secret, String>>,
}

/// Whose quota `task` of `job` spends under `config`: its endpoint, the
/// endpoint's credential and, for a template credential, the item's
/// tenant (`ig[account=123]`). `Err`: the endpoint is not configured.
pub(super) fn payer<'a>(
    config: &'a Config,
    task: &'a TaskArgs,
    job: &'a Job,
) -> Result<Payer<'a>, String> {
    let not_configured = || format!("endpoint {} is not configured", job.endpoint);
    let endpoint = config
        .endpoints
        .get(&job.endpoint)
        .ok_or_else(not_configured)?;
    let cred = config
        .credentials
        .get(&endpoint.credential)
        .ok_or_else(not_configured)?;
    let tenant = (cred.template.as_ref()).map(|placeholder| task.value_of(placeholder).to_owned());
    let credential = (tenant.as_deref())
        .and_then(|value| cred.tenant(value))
        .unwrap_or_else(|| cred.name.clone());
    Ok(Payer {
        task,
        job,
        endpoint,
        cred,
        credential,
        tenant,
    })
}

impl Worker {
    /// Claims `task`'s item with `lock`, in one round trip with the first
    /// page's spend where it may ride along. A token a command mints comes
    /// first: when there is none, nothing is spent and the run fails the
    /// task. A claim whose reply cannot be read ([`Claim::Unexpected`])
    /// refunds the spend it may have made before it is returned.
    pub(super) async fn claim<'a>(
        &'a self,
        task: &'a TaskArgs,
        job: &'a Job,
        lock: &ItemLock,
    ) -> redis::RedisResult<Claim<Box<Claimed<'a>>>> {
        let payer = payer(&self.config, task, job);
        let minted = match &payer {
            Ok(payer) => self.mint(payer).await,
            Err(_) => None,
        };
        let ahead = match (&payer, &minted) {
            (Ok(payer), None | Some(Ok(_))) => self.spend_ahead(payer),
            _ => None,
        };
        let started = Instant::now();
        let spend = ahead.as_ref().map(|a| &a.spend);
        let mut conn = self.lasting.conn.clone();
        let claim = lock.claim(&mut conn, self.keys(), job, task, spend);
        let mut found = match claim.await? {
            Claim::Held(found) => found,
            Claim::AlreadyDone => return Ok(Claim::AlreadyDone),
            Claim::Busy => return Ok(Claim::Busy),
            Claim::Unexpected(why) => {
                // Whether the claim (and its spend) happened is unknown:
                // the spend is undone if it was made, and the task ends.
                if let Some(ahead) = ahead {
                    self.refund_unknown(ahead).await;
                }
                return Ok(Claim::Unexpected(why));
            }
        };
        let first_spend = match (ahead, found.spent.take()) {
            (Some(ahead), Some(reply)) => Some(self.first_spend(ahead, reply, started.elapsed())),
            _ => None,
        };
        Ok(Claim::Held(Box::new(Claimed {
            found: *found,
            first_spend,
            payer,
            minted,
        })))
    }

    /// The token for the payer's credential (its tenant) when a command
    /// mints it: kept, or minted now (`crate::mint`); `Err`: why the task
    /// has none. `None` when its secret is not minted.
    pub(super) async fn mint(&self, payer: &Payer<'_>) -> Option<Result<Secret, String>> {
        let (cred, value) = (payer.cred, payer.tenant.as_deref());
        let (key, argv, ttl) = cred.command(value)?;
        if let Some(why) = value.and_then(|v| cred.command_refusal(v)) {
            return Some(Err(format!("credential command failed: {why}")));
        }
        let known = self.fetcher.secrets();
        let token = self.lasting.minter.token(&key, &argv, ttl, known).await;
        Some(token.map_err(|e| e.to_string()))
    }
}
