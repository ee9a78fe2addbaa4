//! `[endpoints.*]`: the credential each is charged to, its cost (which must
//! fit the smallest window that applies), its own windows and how it reads
//! the upstream's answers.

use std::num::NonZeroU64;

use indexmap::IndexMap;

use super::Loader;
use super::windows::Resources;
use crate::config::defaults as d;
use crate::config::raw::{RawEndpoint, RawRatelimitHeaders, Size};
use crate::config::{
    Accounting, Credential, Endpoint, FieldPath, RatelimitHeaders, Source, Window, fmt_duration,
};

impl Loader<'_> {
    /// Every `[endpoints.NAME]`, in config order. An invalid one is left
    /// out and remembered, so the jobs naming it are not told it is unknown.
    pub(super) fn endpoints(
        &mut self,
        src: &Source,
        raw: &IndexMap<String, RawEndpoint>,
        credentials: &IndexMap<String, Credential>,
    ) -> IndexMap<String, Endpoint> {
        let mut out = IndexMap::new();
        for (name, re) in raw {
            match self.endpoint(src, name, re, credentials) {
                Some(e) => {
                    out.insert(name.clone(), e);
                }
                None => {
                    self.invalid_endpoints.insert(name.clone());
                }
            }
        }
        out
    }

    fn endpoint(
        &mut self,
        src: &Source,
        name: &str,
        re: &RawEndpoint,
        credentials: &IndexMap<String, Credential>,
    ) -> Option<Endpoint> {
        let base = FieldPath::new(["endpoints", name]);
        self.check_name(src, &base, "endpoint", name);
        let accounting = self.accounting(src, &base, re);
        let (cred, resource, windows) = self.charged_to(src, &base, re, accounting, credentials)?;
        let cost = self.cost(src, &base, re)?;
        let charge_credential = re.charge_credential.unwrap_or(d::CHARGE_CREDENTIAL);
        if !charge_credential && windows.is_empty() && re.windows.is_empty() {
            let msg = "an endpoint with charge_credential = false counts only against its own windows: give it `windows` (e.g. [{ units = 95, per = \"24h\", kind = \"fixed\" }])";
            self.error(src, &base.join("charge_credential"), msg);
            return None;
        }
        // The credential's windows of its resource.
        let charged: Vec<Window> = (cred.windows.iter())
            .filter(|w| charge_credential && w.serves(resource.as_deref()))
            .cloned()
            .collect();
        self.check_cost_fits(
            src,
            &base,
            cost,
            cred,
            resource.as_deref(),
            &charged,
            &windows,
        );
        let limiter_unavailable = self.pick_or(
            src,
            &base.join("limiter_unavailable"),
            re.limiter_unavailable.as_deref(),
            d::LIMITER_UNAVAILABLE,
        );
        let ratelimit_headers = re
            .ratelimit_headers
            .as_ref()
            .map(|h| self.ratelimit_headers(src, &base.join("ratelimit_headers"), h));
        let quota_reasons = re
            .quota_reasons
            .clone()
            .unwrap_or_else(|| d::QUOTA_REASONS.iter().map(|&r| r.into()).collect());
        let throttle_block = re.throttle_block.map_or(d::THROTTLE_BLOCK, |t| t.0);
        let max_block = self.max_block(src, &base, re, throttle_block);
        let (min_block, throttle_block_max) = self.throttle_doubling(src, &base, re, max_block);
        let max_body = self.max_body(src, &base, re);
        let max_records = self.max_records(src, &base, re);
        let timeout = self.timeout(src, &base, re);
        let conditional = re.conditional.unwrap_or(d::CONDITIONAL);
        let not_modified_cost = self.not_modified_cost(src, &base, re, cost, conditional);
        Some(Endpoint {
            name: name.to_owned(),
            credential: re.credential.clone(),
            cost,
            limiter_unavailable,
            windows,
            charge_credential,
            timeout,
            throttle_block,
            quota_reasons,
            ratelimit_headers,
            cost_header: re.cost_header.as_ref().map(|h| h.to_ascii_lowercase()),
            max_body,
            max_records,
            max_block,
            conditional,
            not_modified_cost,
            accounting,
            resource,
            min_block,
            throttle_block_max,
        })
    }

    /// The credential an endpoint is charged to, its resource and its own
    /// windows (checked against no credential when it names none known,
    /// which is reported: then `None`).
    fn charged_to<'c>(
        &mut self,
        src: &Source,
        base: &FieldPath,
        re: &RawEndpoint,
        accounting: Option<Accounting>,
        credentials: &'c IndexMap<String, Credential>,
    ) -> Option<(&'c Credential, Option<String>, Vec<Window>)> {
        let Some(cred) = credentials.get(&re.credential) else {
            let resources = Resources {
                default: d::RESOURCE,
                unnamed: None,
            };
            self.windows(src, &base.join("windows"), &re.windows, &resources);
            let known: Vec<_> = credentials.keys().map(String::as_str).collect();
            let msg = format!(
                "unknown credential {:?} (known: {})",
                re.credential,
                known.join(", ")
            );
            self.error(src, &base.join("credential"), msg);
            return None;
        };
        let resource = self.endpoint_resource(src, base, re, accounting, cred);
        let resources = Resources {
            default: &cred.default_resource,
            unnamed: Some(cred.resource_name(resource.as_deref())),
        };
        let windows = self.windows(src, &base.join("windows"), &re.windows, &resources);
        Some((cred, resource, windows))
    }

    /// `resource`: as written, else GitHub REST's `"core"` or GitHub
    /// GraphQL's `"graphql"` by its `accounting`, else its credential's
    /// default; `None` when that is the default.
    fn endpoint_resource(
        &mut self,
        src: &Source,
        base: &FieldPath,
        re: &RawEndpoint,
        accounting: Option<Accounting>,
        cred: &Credential,
    ) -> Option<String> {
        let name = match (&re.resource, accounting) {
            (Some(r), _) => self.resource(src, &base.join("resource"), r)?,
            (None, Some(Accounting::Github)) => d::GITHUB_RESOURCE.to_owned(),
            (None, Some(Accounting::GithubGraphql)) => d::GITHUB_GRAPHQL_RESOURCE.to_owned(),
            (None, _) => return None,
        };
        cred.resource_of(&name)
    }

    /// `min_block` and `throttle_block_max`: the doubling of consecutive
    /// throttles starts at the one and stops at the other, and neither may
    /// pass `max_block` (a default `throttle_block_max` above a lower
    /// `max_block` is lowered to it).
    fn throttle_doubling(
        &mut self,
        src: &Source,
        base: &FieldPath,
        re: &RawEndpoint,
        max_block: std::time::Duration,
    ) -> (std::time::Duration, std::time::Duration) {
        let min_block = re.min_block.map_or(d::MIN_BLOCK, |t| t.0);
        let most = match re.throttle_block_max {
            Some(t) => t.0,
            None => d::THROTTLE_BLOCK_MAX.min(max_block),
        };
        if min_block.is_zero() || min_block > most {
            let msg = format!(
                "must be more than 0 and at most throttle_block_max ({})",
                fmt_duration(most)
            );
            self.error(src, &base.join("min_block"), msg);
        }
        if most > max_block {
            let msg = format!(
                "{} is longer than max_block ({}): raise max_block or lower throttle_block_max",
                fmt_duration(most),
                fmt_duration(max_block)
            );
            self.error(src, &base.join("throttle_block_max"), msg);
        }
        (min_block, most)
    }

    /// `cost`: at least 1 and at most 2^53 - 1 (Lua's exact integers).
    fn cost(&mut self, src: &Source, base: &FieldPath, re: &RawEndpoint) -> Option<NonZeroU64> {
        let Some(cost) = NonZeroU64::new(re.cost) else {
            self.error(src, &base.join("cost"), "must be at least 1");
            return None;
        };
        if cost.get() > d::MAX_COUNT {
            self.error(src, &base.join("cost"), d::MAX_COUNT_RULE);
            return None;
        }
        Some(cost)
    }

    /// `max_records`: at least 1, the default unless given.
    fn max_records(&mut self, src: &Source, base: &FieldPath, re: &RawEndpoint) -> u64 {
        match re.max_records {
            None => d::MAX_RECORDS,
            Some(n) if n > 0 => n,
            Some(_) => {
                self.error(src, &base.join("max_records"), "must be at least 1");
                d::MAX_RECORDS
            }
        }
    }

    /// `timeout`: more than 0, the default unless given.
    fn timeout(&mut self, src: &Source, base: &FieldPath, re: &RawEndpoint) -> std::time::Duration {
        let timeout = re.timeout.map_or(d::REQUEST_TIMEOUT, |t| t.0);
        if timeout.is_zero() {
            let msg = "must be more than 0: every request would fail at once, its units kept";
            self.error(src, &base.join("timeout"), msg);
        }
        timeout
    }

    /// `max_body`: more than 0 bytes, the default unless given.
    fn max_body(&mut self, src: &Source, base: &FieldPath, re: &RawEndpoint) -> u64 {
        match re.max_body {
            None => d::MAX_BODY,
            Some(Size(n)) if n > 0 => n,
            Some(_) => {
                self.error(src, &base.join("max_body"), "must be more than 0 bytes");
                d::MAX_BODY
            }
        }
    }

    /// `not_modified_cost`: what a `304` is settled to, `cost` unless
    /// given, never more (the worst case `check` computes uses `cost`), and
    /// only on a `conditional` endpoint (nothing else gets a 304).
    fn not_modified_cost(
        &mut self,
        src: &Source,
        base: &FieldPath,
        re: &RawEndpoint,
        cost: NonZeroU64,
        conditional: bool,
    ) -> u64 {
        let Some(n) = re.not_modified_cost else {
            return cost.get();
        };
        let at = base.join("not_modified_cost");
        if !conditional {
            let msg = "only a conditional endpoint gets 304s: set conditional = true";
            self.error(src, &at, msg);
        }
        if n > cost.get() {
            let msg = format!("{n} is more than the endpoint's cost ({cost})");
            self.error(src, &at, msg);
            return cost.get();
        }
        n
    }

    /// `max_block`, which `throttle_block` may not exceed (it would be
    /// clamped on every use).
    fn max_block(
        &mut self,
        src: &Source,
        base: &FieldPath,
        re: &RawEndpoint,
        throttle_block: std::time::Duration,
    ) -> std::time::Duration {
        let max_block = re.max_block.map_or(d::MAX_BLOCK, |t| t.0);
        if !(d::MIN_MAX_BLOCK..=d::MAX_MAX_BLOCK).contains(&max_block) {
            let msg = format!(
                "must be between {} and {}",
                fmt_duration(d::MIN_MAX_BLOCK),
                fmt_duration(d::MAX_MAX_BLOCK)
            );
            self.error(src, &base.join("max_block"), msg);
            return d::MAX_BLOCK;
        }
        if throttle_block > max_block {
            let msg = format!(
                "{} is longer than max_block ({}): raise max_block or lower throttle_block",
                fmt_duration(throttle_block),
                fmt_duration(max_block)
            );
            self.error(src, &base.join("throttle_block"), msg);
        }
        max_block
    }

    /// A cost no window that applies can hold would never be admitted: a
    /// config error, not a task that waits forever. `charged` are the
    /// credential's windows the endpoint counts against (none with
    /// `charge_credential = false`).
    #[allow(clippy::too_many_arguments)]
    fn check_cost_fits(
        &mut self,
        src: &Source,
        base: &FieldPath,
        cost: NonZeroU64,
        cred: &Credential,
        resource: Option<&str>,
        charged: &[Window],
        own: &[Window],
    ) {
        // The token's concurrent cap alone meters no resource of its own.
        let of_resource = charged.iter().chain(own).any(|w| !w.every_resource);
        // A shadow window refuses nothing, a cost it can never fit included.
        let enforced = charged.iter().chain(own).filter(|w| !w.is_shadow());
        let any = charged.iter().chain(own).next().is_some();
        match enforced.min_by_key(|w| w.units) {
            _ if resource.is_some() && !of_resource => {
                let r = cred.resource_name(resource);
                let msg = format!(
                    "no quota window applies: the endpoint spends from resource {r:?}, which credential {:?} has no window of; give it one (windows = [{{ units = 30, per = \"1m\", resource = \"{r}\" }}]) or give this endpoint `windows`",
                    cred.name
                );
                self.error(src, base, msg);
            }
            None if any => {}
            None => {
                let msg = format!(
                    "no quota window applies: give credential {:?} or this endpoint `windows`",
                    cred.name
                );
                self.error(src, base, msg);
            }
            Some(w) if cost > w.units => {
                let msg = format!(
                    "cost {cost} is more than the smallest window that applies ({}): no request could ever be admitted",
                    w.describe()
                );
                self.error(src, &base.join("cost"), msg);
            }
            Some(_) => {}
        }
    }

    /// `ratelimit_headers = { remaining, reset, reset_is }`; header names
    /// are matched lower-case.
    fn ratelimit_headers(
        &mut self,
        src: &Source,
        at: &FieldPath,
        h: &RawRatelimitHeaders,
    ) -> RatelimitHeaders {
        RatelimitHeaders {
            remaining: h.remaining.to_ascii_lowercase(),
            reset: h.reset.to_ascii_lowercase(),
            reset_is: self.pick_or(
                src,
                &at.join("reset_is"),
                h.reset_is.as_deref(),
                d::RESET_IS,
            ),
        }
    }
}
