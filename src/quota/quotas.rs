//! Every plan of a config, by endpoint and by credential, and the lookups
//! on them: a template's tenants, resources, windows, a cost checked.

use std::borrow::Cow;
use std::collections::HashMap;

use indexmap::IndexMap;

use crate::config::{Config, Reserve, Scope, Window};
use crate::keys::KeySpace;

use super::{EndpointPlan, Plan, QuotaError};

/// Every plan of a config: per endpoint (spend, settle) and per credential
/// (peek, block; all its windows, endpoints' included).
#[derive(Debug, Clone)]
pub struct Quotas {
    keys: KeySpace,
    endpoints: HashMap<String, EndpointPlan>,
    credentials: IndexMap<String, Plan>,
    /// Template credentials by name: their placeholder.
    templates: HashMap<String, String>,
    /// Each credential's resources (`None`: its default one) and their
    /// names, the default first.
    resources: HashMap<String, Vec<(Option<String>, String)>>,
}

impl Quotas {
    /// Builds the plans of `config`.
    pub fn new(config: &Config) -> Self {
        let ks = KeySpace::new(config.redis.key_prefix.clone());
        let endpoints = config
            .endpoints
            .values()
            .map(|e| {
                let windows = config
                    .windows_of(e)
                    .into_iter()
                    .map(|(s, w)| (s, w.clone()))
                    .collect();
                let lease = e.timeout + crate::config::LEASE_SLACK;
                let plan = EndpointPlan {
                    endpoint: e.name.clone(),
                    cost: e.cost,
                    policy: e.limiter_unavailable,
                    plan: Plan::new(&ks, &e.credential, e.resource.clone(), windows, lease),
                };
                (e.name.clone(), plan)
            })
            .collect();
        let credentials = config
            .credentials
            .values()
            .map(|c| {
                let mut windows: Vec<(Scope, Window)> = c
                    .windows
                    .iter()
                    .map(|w| (Scope::Credential, w.clone()))
                    .collect();
                // Peek, block and sync read no lease: any valid one does.
                let mut lease = crate::config::LEASE_SLACK;
                for e in config.endpoints.values().filter(|e| e.credential == c.name) {
                    lease = lease.max(e.timeout + crate::config::LEASE_SLACK);
                    windows.extend(
                        e.windows
                            .iter()
                            .map(|w| (Scope::Endpoint(e.name.clone()), w.clone())),
                    );
                }
                (
                    c.name.clone(),
                    Plan::new(&ks, &c.name, None, windows, lease),
                )
            })
            .collect();
        let templates = config
            .credentials
            .values()
            .filter_map(|c| Some((c.name.clone(), c.template.clone()?)))
            .collect();
        let resources = (config.credentials.values())
            .map(|c| {
                let named = (c.resources(config.endpoints.values()).into_iter())
                    .map(|r| (r.map(str::to_owned), c.resource_name(r).to_owned()))
                    .collect();
                (c.name.clone(), named)
            })
            .collect();
        Quotas {
            keys: ks,
            endpoints,
            credentials,
            templates,
            resources,
        }
    }

    /// The resources of configured credential `family` (a template's, for
    /// its tenants): `None` for the default one, and each one's name; the
    /// default first.
    pub fn resources(&self, family: &str) -> Vec<(Option<String>, String)> {
        self.resources.get(family).cloned().unwrap_or_default()
    }

    /// The name of `resource` of credential `family` (`None`: its default).
    pub fn resource_name<'a>(&'a self, family: &str, resource: Option<&'a str>) -> &'a str {
        match resource {
            Some(r) => r,
            None => (self.resources.get(family))
                .and_then(|rs| rs.first())
                .map_or(crate::config::defaults::RESOURCE, |(_, name)| name.as_str()),
        }
    }

    /// Resource `name` of credential `family` as its keys hold it: `None`
    /// for the default one.
    pub fn resource_of(&self, family: &str, name: &str) -> Option<String> {
        (self.resource_name(family, None) != name).then(|| name.to_owned())
    }

    /// The key space.
    pub fn keys(&self) -> &KeySpace {
        &self.keys
    }

    /// An endpoint's plan.
    pub fn endpoint(&self, name: &str) -> Result<&EndpointPlan, QuotaError> {
        self.endpoints
            .get(name)
            .ok_or_else(|| QuotaError::UnknownEndpoint(name.to_owned()))
    }

    /// A credential's plan (all its windows).
    pub(crate) fn credential(&self, name: &str) -> Result<&Plan, QuotaError> {
        self.credentials
            .get(name)
            .ok_or_else(|| QuotaError::UnknownCredential(name.to_owned()))
    }

    /// A credential's plan by the name `quota` shows: a configured
    /// credential's, or one tenant's of a template (`ig[account=123]`,
    /// the value as written or percent-encoded). A template's own name is
    /// refused: it has no windows of its own.
    pub(crate) fn plan_for(&self, name: &str) -> Result<Cow<'_, Plan>, QuotaError> {
        if let Some((cred, placeholder, value)) = crate::config::parse_tenant(name)
            && self.templates.get(cred).is_some_and(|p| p == placeholder)
        {
            let tenant = crate::config::tenant_name(cred, placeholder, &value);
            return Ok(Cow::Owned(
                self.credentials[cred].for_credential(&self.keys, &tenant),
            ));
        }
        if let Some(placeholder) = self.templates.get(name) {
            return Err(QuotaError::TemplateNeedsTenant(
                name.to_owned(),
                placeholder.clone(),
            ));
        }
        self.credential(name).map(Cow::Borrowed)
    }

    /// The template placeholder of credential `name`, if it is a template.
    pub(crate) fn template_of(&self, name: &str) -> Option<&str> {
        self.templates.get(name).map(String::as_str)
    }

    /// An endpoint's plan for one tenant `value` of its template
    /// credential; for `None` (or a plain credential) the endpoint's own.
    pub(crate) fn endpoint_for(
        &self,
        endpoint: &str,
        value: Option<&str>,
    ) -> Result<Cow<'_, EndpointPlan>, QuotaError> {
        let ep = self.endpoint(endpoint)?;
        let family = &ep.plan.family;
        match (value, self.templates.get(family)) {
            (None, None) => Ok(Cow::Borrowed(ep)),
            (Some(value), Some(placeholder)) => {
                let tenant = crate::config::tenant_name(family, placeholder, value);
                Ok(Cow::Owned(EndpointPlan {
                    plan: ep.plan.for_credential(&self.keys, &tenant),
                    ..ep.clone()
                }))
            }
            (None, Some(placeholder)) => Err(QuotaError::TemplateNeedsTenant(
                family.clone(),
                placeholder.clone(),
            )),
            (Some(_), None) => Err(QuotaError::UnknownCredential(format!("{family}[...]"))),
        }
    }

    /// Credential names, in config order.
    pub(crate) fn credential_names(&self) -> impl Iterator<Item = &str> {
        self.credentials.keys().map(String::as_str)
    }

    /// The window number (0-based, as [`super::Limiter::peek`] lists them) of a
    /// credential's window: `scope`'s window of `kind_name` and period `per`.
    pub fn window_index(
        &self,
        credential: &str,
        scope: &Scope,
        window: &Window,
    ) -> Result<usize, QuotaError> {
        let plan = self.plan_for(credential)?;
        plan.windows
            .iter()
            .position(|w| {
                &w.scope == scope
                    && w.window.kind_name() == window.kind_name()
                    && w.window.per == window.per
                    && w.window.resource == window.resource
                    && w.window.units == window.units
            })
            .ok_or_else(|| QuotaError::UnknownWindow {
                credential: credential.to_owned(),
                window: format!("{scope} {}", window.describe()),
            })
    }

    /// The cost a spend would charge, checked against the window that admits
    /// the fewest units with `reserve` kept free.
    pub(crate) fn checked_cost(
        &self,
        endpoint: &str,
        cost: Option<u64>,
        reserve: Reserve,
    ) -> Result<u64, QuotaError> {
        let ep = self.endpoint(endpoint)?;
        let cost = cost.unwrap_or(ep.cost.get());
        if let Some(w) = ep.plan.tightest(reserve)
            && cost > w.admits(reserve)
        {
            let window = if reserve == Reserve::NONE {
                w.describe()
            } else {
                format!(
                    "{} with {reserve} kept free ({} units)",
                    w.describe(),
                    w.admits(reserve)
                )
            };
            return Err(QuotaError::CostTooLarge { cost, window });
        }
        if cost == 0 {
            return Err(QuotaError::CostTooLarge {
                cost,
                window: "a spend costs at least 1 unit".into(),
            });
        }
        Ok(cost)
    }
}
