//! Upstream accounting in the config: an endpoint's `accounting` (and the
//! Meta adapter's `throttle_at`), and windows marked `upstream = true`,
//! which only make sense where some answer reports what the upstream has
//! left.

use super::Loader;
use crate::config::choice::Choice;
use crate::config::defaults as d;
use crate::config::raw::{RawConfig, RawEndpoint, RawWindow};
use crate::config::{Accounting, FieldPath, Source};

/// `accounting`, before `throttle_at` makes it an [`Accounting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccountingName {
    Ietf,
    Github,
    GithubGraphql,
    ShopifyGraphql,
    Meta,
}

impl Choice for AccountingName {
    const WHAT: &'static str = "accounting";
    const CHOICES: &'static [(&'static str, Self)] = &[
        ("ietf", AccountingName::Ietf),
        ("github", AccountingName::Github),
        ("github-graphql", AccountingName::GithubGraphql),
        ("shopify-graphql", AccountingName::ShopifyGraphql),
        ("meta", AccountingName::Meta),
    ];
}

impl Loader<'_> {
    /// An endpoint's `accounting` and `throttle_at`. An adapter reads the
    /// upstream's headers itself, so `ratelimit_headers` beside it is a
    /// mistake; `throttle_at` belongs to `"meta"` only.
    pub(super) fn accounting(
        &mut self,
        src: &Source,
        base: &FieldPath,
        re: &RawEndpoint,
    ) -> Option<Accounting> {
        let name = re
            .accounting
            .as_deref()
            .and_then(|w| self.pick::<AccountingName>(src, &base.join("accounting"), w));
        let at = base.join("throttle_at");
        let throttle_at = match re.throttle_at {
            None => d::THROTTLE_AT,
            Some(p) if (1..=100).contains(&p) => p as u8,
            Some(p) => {
                self.error(src, &at, format!("{p} is not a percentage from 1 to 100"));
                d::THROTTLE_AT
            }
        };
        if re.throttle_at.is_some() && name != Some(AccountingName::Meta) {
            let msg = "throttle_at is read from Meta's usage headers: set accounting = \"meta\" or remove it";
            self.error(src, &at, msg);
        }
        if name.is_some() && re.ratelimit_headers.is_some() {
            let msg = "accounting reads the upstream's own headers: remove ratelimit_headers";
            self.error(src, &base.join("ratelimit_headers"), msg);
        }
        Some(match name? {
            AccountingName::Ietf => Accounting::Ietf,
            AccountingName::Github => Accounting::Github,
            AccountingName::GithubGraphql => Accounting::GithubGraphql,
            AccountingName::ShopifyGraphql => Accounting::ShopifyGraphql,
            AccountingName::Meta => Accounting::Meta { throttle_at },
        })
    }

    /// A window with `upstream = true` is resynced by the answers of the
    /// endpoints that spend from it; if none of them reports what the
    /// upstream has left (no `accounting`, no `ratelimit_headers`), the
    /// mark would do nothing: an error at the mark, before anything runs.
    pub(super) fn check_upstream_windows(&mut self, src: &Source, raw: &RawConfig) {
        let reports = |e: &RawEndpoint| e.accounting.is_some() || e.ratelimit_headers.is_some();
        for (name, c) in &raw.credentials {
            let any = (raw.endpoints.values()).any(|e| e.credential == *name && reports(e));
            let base = FieldPath::new(["credentials", name.as_str()]);
            self.check_marks(src, &base, &c.windows, any);
        }
        for (name, e) in &raw.endpoints {
            let base = FieldPath::new(["endpoints", name.as_str()]);
            self.check_marks(src, &base, &e.windows, reports(e));
        }
    }

    fn check_marks(&mut self, src: &Source, base: &FieldPath, windows: &[RawWindow], ok: bool) {
        for (i, w) in windows.iter().enumerate() {
            if w.upstream == Some(true) && !ok {
                let at = base.join("windows").join(i).join("upstream");
                let msg = "no endpoint that spends from this window reports what the upstream has left: give it accounting or ratelimit_headers, or remove upstream = true";
                self.error(src, &at, msg);
            }
        }
    }
}
