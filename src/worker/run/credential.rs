//! The run's secret and whose quota it spends, and what changes them
//! mid-run: a reload since the run began (its next pages spend and are sent
//! under the newest config: [`Worker::follow_reload`], [`Worker::spender`])
//! and a 401 on a minted token ([`Worker::remint`]). A child of `run`, so
//! the run's own state stays private to the two.

use std::sync::Arc;

use tracing::{info, warn};

use super::Run;
use crate::config::Secret;
use crate::fetch::{Fetcher, Reply};
use crate::worker::Worker;
use crate::worker::claim::payer;
use crate::worker::spend::Payer;
use crate::worker::step::Answer;

impl Worker {
    /// The secret the payer's requests are sent with under this worker's
    /// config, and the fetcher that scrubs it. `minted`: the token a
    /// command minted for it; `read`: a tenant's secret already read.
    /// `Err`: no secret can be had.
    pub(super) fn credential_for(
        &self,
        payer: &Payer<'_>,
        minted: Option<Result<Secret, String>>,
        read: Option<Secret>,
    ) -> Result<(Secret, Fetcher), String> {
        let cred = payer.cred;
        Ok(match (minted, payer.tenant.as_deref()) {
            (Some(Err(why)), _) => return Err(why),
            (Some(Ok(secret)), _) => {
                let fetcher = self.fetcher.with_secret(&secret);
                (secret, fetcher)
            }
            (None, None) => {
                let secret = self.secrets.get(&cred.name).cloned();
                let secret = secret.unwrap_or_else(|| Secret::new(""));
                (secret, self.fetcher.clone())
            }
            (None, Some(value)) => {
                // Config validation makes every item of the job fill it.
                let secret = read.map_or_else(|| cred.tenant_secret(value), Ok);
                let name = &payer.credential;
                let secret = secret.map_err(|e| format!("no secret for {name}: {e}"))?;
                let fetcher = self.fetcher.with_secret(&secret);
                (secret, fetcher)
            }
        })
    }

    /// A reload since the run began (or since its last page): from its
    /// next page on, the run spends from the newest config's windows at its
    /// costs and sends with its secret (SPEC Part 4: an emergency cut of a
    /// window cannot wait for the pages of every task in flight, nor a
    /// rotated secret); its job's request, pagination and sink stay as the
    /// run began. `Err`: the newest config gives it no secret.
    pub(super) async fn follow_reload(&self, run: &mut Run<'_>) -> Result<(), String> {
        let Some(newest) = self.newer() else {
            return Ok(());
        };
        if run.live.as_ref().is_some_and(|l| Arc::ptr_eq(l, &newest)) {
            return Ok(());
        }
        let (task, job) = (run.task(), run.job());
        // Its endpoint left the config: the run ends as it began.
        let Ok(payer) = payer(&newest.config, task, job) else {
            return Ok(());
        };
        let minted = newest.mint(&payer).await;
        let (secret, fetcher) = newest.credential_for(&payer, minted, None)?;
        info!(task = %task.id, job = %job.name,
              "a reload since this task began: its next pages spend and are sent under the new config's windows, costs and secret");
        run.secret = secret;
        run.fetcher = fetcher;
        run.live = Some(newest);
        Ok(())
    }

    /// The worker whose windows and costs the run's next spend takes (the
    /// newest config's since a reload: [`Worker::follow_reload`]), and the
    /// run's payer under it.
    pub(super) fn spender<'r>(&'r self, run: &'r Run<'r>) -> (&'r Worker, Payer<'r>) {
        let Some(live) = run.live.as_deref() else {
            return (self, run.payer.clone());
        };
        match payer(&live.config, run.task(), run.job()) {
            Ok(payer) => (live, payer),
            // Its endpoint left the config: the run spends as it began.
            Err(_) => (self, run.payer.clone()),
        }
    }

    /// After a 401 on a credential whose command mints its token, once per
    /// run: the command runs again (at most once a minute per credential,
    /// `crate::mint`), and a new token sends the page again rather than
    /// failing the task. Why retry: the 401 most likely means the token
    /// expired before its `secret_ttl` (revoked, rotated, a TTL set too
    /// long), and failing the task would leave its item to the next tick
    /// though a good token is at hand. The 401's units stay spent (it was
    /// sent and answered); the retry is a new request with its own spend.
    pub(super) async fn remint(
        &self,
        run: &Run<'_>,
        payer: &Payer<'_>,
        answer: &Answer,
    ) -> Option<Secret> {
        let Answer::Replied {
            reply: Reply::ClientError { status: 401, .. },
            ..
        } = answer
        else {
            return None;
        };
        if run.reminted {
            return None;
        }
        // The payer under this worker's config (the newest, since a
        // reload: `spender`).
        let (key, argv, ttl) = payer.cred.command(payer.tenant.as_deref())?;
        self.lasting.minter.refused(&key, &run.secret).await;
        match self
            .lasting
            .minter
            .token(&key, &argv, ttl, self.fetcher.secrets())
            .await
        {
            Ok(new) if new != run.secret => {
                info!(task = %run.task().id, credential = %key,
                      "upstream answered 401: the credential command minted a new token; the page is sent again with it");
                Some(new)
            }
            // Re-minted after a 401 less than a minute ago: this 401 stands.
            Ok(_) => None,
            Err(e) => {
                warn!(task = %run.task().id, credential = %key, error = %e,
                      "upstream answered 401 and no new token could be minted");
                None
            }
        }
    }
}
