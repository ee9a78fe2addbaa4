//! Requests to the upstream: rendering a job's request template for one page,
//! sending it, and classifying the answer into what the worker must do.
//!
//! Everything the upstream can make us do is bounded here (docs/security.md):
//!
//! - **Redirects** are never followed by the HTTP client. A 301, 302, 303,
//!   307 or 308 to the origin (scheme, host, port) of the job's request URL
//!   comes back as [`Reply::Redirect`] with the next request, which the
//!   worker spends for like any other request, at most [`MAX_REDIRECTS`](request::MAX_REDIRECTS)
//!   hops; one to another origin is never requested ([`Reply::RedirectRefused`]).
//!   No `Referer` is ever sent.
//! - **Bodies** are read chunk by chunk up to the endpoint's `max_body`
//!   (a `Content-Length` over it is refused before reading anything).
//! - **Waits** the upstream asks for (Retry-After, a ratelimit reset) are
//!   clamped to the endpoint's `max_block` (`crate::accounting` reads them:
//!   every answer comes back with its [`Verdict`]).
//! - **Text** it sends back (error bodies, undecodable bodies, the strings of
//!   a JSON body) has every known secret scrubbed (`crate::scrub`) before it is
//!   logged, stored or put in an error.
//! - **URL placeholders** are percent-encoded as RFC 6570 simple expansion
//!   does, so no value changes the URL's path, query or fragment (`{+name}`
//!   opts out); an item whose values hold control characters is refused.
//!
//! The rendered URL carries the secret (`key={secret}`), so nothing here ever
//! logs or returns it: errors are stripped of their URL before they leave,
//! and a [`Request`] prints only its method and origin.
//!
//! - this file: the [`Fetcher`], which builds a page's request and sends it;
//! - `request`: the request for one page — template, placeholders, origin,
//!   a redirect's next hop;
//! - `paging`: where the next page is in each pagination style, how a run
//!   keeps its place without the secret (the checkpoint's cursor), and when
//!   a run's pages are over;
//! - `answer`: what an answer means ([`Reply`]), read within bounds and
//!   scrubbed, with its quota verdict.

mod answer;
pub(crate) mod paging;
mod request;

use std::sync::Arc;
use std::time::Duration;

use crate::accounting::Verdict;
use crate::config::{Endpoint, Secret, Secrets};
use crate::scrub::Scrubber;
use answer::{answer, scrub_reply, transport_error};

pub(crate) use answer::{Answered, Reply, fmt_size};
pub(crate) use request::{BuildError, MAX_REDIRECTS, PageAt, Placeholders, Request};

/// Sends requests for jobs. Cheap to clone (one connection pool).
#[derive(Debug, Clone)]
pub(crate) struct Fetcher {
    client: reqwest::Client,
    scrubber: Arc<Scrubber>,
    /// The secrets `scrubber` scrubs, for [`Fetcher::with_secret`].
    secrets: Arc<Vec<Secret>>,
}

impl Fetcher {
    /// A fetcher with rustls, a connect timeout and a user agent, that
    /// follows no redirect and sends no `Referer`, and scrubs `secrets` from
    /// whatever the upstream sends back.
    pub(crate) fn new(secrets: &Secrets) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("quota-worker/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .build()?;
        let secrets: Vec<Secret> = secrets.values().cloned().collect();
        Ok(Fetcher {
            client,
            scrubber: Arc::new(Scrubber::new(&secrets)),
            secrets: Arc::new(secrets),
        })
    }

    /// The secrets it scrubs (beside a `with_secret` one).
    pub(crate) fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    /// The same fetcher (one connection pool), scrubbing `secret` too: a
    /// template credential's tenant's, read for one task, or a token a
    /// credential command minted.
    pub(crate) fn with_secret(&self, secret: &Secret) -> Self {
        Fetcher {
            client: self.client.clone(),
            scrubber: Arc::new(Scrubber::new(self.secrets.iter().chain([secret]))),
            secrets: self.secrets.clone(),
        }
    }

    /// Sends `req`, classifies the answer and reads what it says about the
    /// upstream's quota.
    pub(crate) async fn send(&self, endpoint: &Endpoint, req: &Request) -> Answered {
        let mut rb = self
            .client
            .request(req.method.clone(), req.url.clone())
            .headers(req.headers.clone())
            .timeout(endpoint.timeout);
        if let Some(b) = &req.body {
            rb = rb.body(b.clone());
        }
        let mut answered = match rb.send().await {
            Err(e) => Answered::new(transport_error(e), Verdict::default()),
            Ok(resp) => answer(endpoint, req, resp, &self.scrubber).await,
        };
        scrub_reply(&self.scrubber, &mut answered.reply);
        metrics::counter!("qw_upstream_responses_total", "endpoint" => endpoint.name.clone(), "status" => answered.reply.status_label())
            .increment(1);
        answered
    }
}
