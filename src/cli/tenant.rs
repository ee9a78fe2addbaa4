//! Naming one tenant of a template credential on the command line, as
//! other tools do: `spend` and `keys` take `ENDPOINT[placeholder=VALUE]`
//! (`ig.media[account=123]`: the endpoint's cost and windows, the tenant's
//! keys), `quota` takes the tenant's own name (`ig[account=123]`). The value
//! is written as is or percent-encoded, as `quota` shows it. A name the
//! config cannot take is refused with what to write instead; nothing here
//! reads a token.

use crate::config::{self, Config};

/// Why a name on the command line names no tenant. Each says what to
/// write instead; fix the command line (exit 64).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantNameError {
    /// `spend ig[account=1]` where `ig` is a credential: a spend is charged
    /// to an endpoint (its cost, its own windows).
    #[error(
        "{name:?} names credential {credential}, and {command} takes an endpoint (its cost and windows); \
         {credential}'s endpoints: {endpoints} (quota-worker {command} '{example}')"
    )]
    CredentialNotEndpoint {
        /// As given.
        name: String,
        /// The command (`spend`, `keys`).
        command: &'static str,
        /// The credential it names.
        credential: String,
        /// The endpoints charged to it, comma-separated.
        endpoints: String,
        /// What to write, for the first of them.
        example: String,
    },
    /// A template's endpoint without a tenant: whose windows?
    #[error(
        "endpoint {endpoint} spends from template credential {credential}: name one tenant, as '{endpoint}[{placeholder}=VALUE]'"
    )]
    NeedsTenant {
        /// The endpoint.
        endpoint: String,
        /// Its template credential.
        credential: String,
        /// The template's placeholder.
        placeholder: String,
    },
    /// A tenant of a credential that is not a template.
    #[error(
        "{name:?}: credential {credential} is not a template, so it has no tenants; write {plain:?}"
    )]
    NotATemplate {
        /// As given.
        name: String,
        /// The plain credential.
        credential: String,
        /// What to write.
        plain: String,
    },
    /// The template is on another placeholder.
    #[error(
        "{name:?}: credential {credential} is a template on {{{placeholder}}}, not {{{given}}}: write '{base}[{placeholder}=VALUE]'"
    )]
    WrongPlaceholder {
        /// As given.
        name: String,
        /// The endpoint or credential before the brackets.
        base: String,
        /// The template credential.
        credential: String,
        /// Its placeholder.
        placeholder: String,
        /// The placeholder given.
        given: String,
    },
    /// A value no tenant can have (it could not name a token file).
    #[error("{name:?}: {why}, so it is no tenant of {credential}")]
    BadValue {
        /// As given.
        name: String,
        /// The template credential.
        credential: String,
        /// Why (config's rule for tenant values).
        why: config::TenantSecretError,
    },
    /// Brackets that do not hold `placeholder=VALUE` (or a value that is
    /// not percent-encoded UTF-8).
    #[error(
        "{name:?}: a tenant is written {base}[{placeholder}=VALUE], the value as is or percent-encoded UTF-8"
    )]
    Shape {
        /// As given.
        name: String,
        /// The endpoint or credential before the brackets.
        base: String,
        /// The template's placeholder (or `placeholder`).
        placeholder: String,
    },
}

/// What `spend`/`keys` (`command`) spends from, by `name`: an endpoint, and
/// the tenant value when its credential is a template. `Ok(None)`: no such
/// endpoint or credential (the caller lists the known endpoints).
pub fn endpoint(
    config: &Config,
    name: &str,
    command: &'static str,
) -> Result<Option<(String, Option<String>)>, TenantNameError> {
    if let Some(ep) = config.endpoints.get(name) {
        return match template(config, &ep.credential) {
            Some(placeholder) => Err(TenantNameError::NeedsTenant {
                endpoint: name.to_owned(),
                credential: ep.credential.clone(),
                placeholder: placeholder.to_owned(),
            }),
            None => Ok(Some((name.to_owned(), None))),
        };
    }
    let base = name.split_once('[').map_or(name, |(b, _)| b);
    if let Some(ep) = config.endpoints.get(base) {
        let value = tenant_value(config, name, base, &ep.credential)?;
        return Ok(Some((base.to_owned(), Some(value))));
    }
    if config.credentials.contains_key(base) {
        let endpoints: Vec<&str> = (config.endpoints.values())
            .filter(|e| e.credential == base)
            .map(|e| e.name.as_str())
            .collect();
        // The tenant as given, when it was given.
        let given = &name[base.len()..];
        let example = match (endpoints.first(), template(config, base)) {
            (Some(e), Some(_)) if !given.is_empty() => format!("{e}{given}"),
            (Some(e), Some(p)) => format!("{e}[{p}=VALUE]"),
            (Some(e), None) => (*e).to_owned(),
            (None, _) => "ENDPOINT".to_owned(),
        };
        let endpoints = if endpoints.is_empty() {
            "(none)".to_owned()
        } else {
            endpoints.join(", ")
        };
        return Err(TenantNameError::CredentialNotEndpoint {
            name: name.to_owned(),
            command,
            credential: base.to_owned(),
            endpoints,
            example,
        });
    }
    Ok(None)
}

/// Checks `name`, a tenant's name as `quota` shows it
/// (`ig[account=123]`), when it is written as one of a configured
/// credential. `Ok(())` also for a name of no configured credential (the
/// caller says it is unknown).
pub fn credential(config: &Config, name: &str) -> Result<(), TenantNameError> {
    match name.split_once('[') {
        Some((base, _)) if config.credentials.contains_key(base) => {
            tenant_value(config, name, base, base).map(drop)
        }
        _ => Ok(()),
    }
}

/// The placeholder of `credential`, when it is a template.
fn template<'c>(config: &'c Config, credential: &str) -> Option<&'c str> {
    config.credentials.get(credential)?.template.as_deref()
}

/// The tenant value `name` (`base[placeholder=VALUE]`) gives `credential`
/// (the credential of `base`, or `base` itself).
fn tenant_value(
    config: &Config,
    name: &str,
    base: &str,
    credential: &str,
) -> Result<String, TenantNameError> {
    let Some(placeholder) = template(config, credential) else {
        return Err(TenantNameError::NotATemplate {
            name: name.to_owned(),
            credential: credential.to_owned(),
            plain: base.to_owned(),
        });
    };
    let shape = || TenantNameError::Shape {
        name: name.to_owned(),
        base: base.to_owned(),
        placeholder: placeholder.to_owned(),
    };
    let (_, given, value) = crate::config::parse_tenant(name).ok_or_else(shape)?;
    if given != placeholder {
        return Err(TenantNameError::WrongPlaceholder {
            name: name.to_owned(),
            base: base.to_owned(),
            credential: credential.to_owned(),
            placeholder: placeholder.to_owned(),
            given: given.to_owned(),
        });
    }
    config::check_tenant_value(&value).map_err(|why| TenantNameError::BadValue {
        name: name.to_owned(),
        credential: credential.to_owned(),
        why,
    })?;
    Ok(value)
}

/// [`endpoint`] for a command: an unknown name or one the config cannot
/// take is printed (known endpoints listed) and exits 64.
pub(crate) fn endpoint_or_exit(
    config: &Config,
    name: &str,
    command: &'static str,
) -> Result<(String, Option<String>), super::Exit> {
    match endpoint(config, name, command) {
        Ok(Some(found)) => Ok(found),
        Ok(None) => Err(super::quota_error(
            config,
            &crate::quota::QuotaError::UnknownEndpoint(name.to_owned()),
        )),
        Err(e) => {
            eprintln!("error: {e}");
            Err(super::Exit::Usage)
        }
    }
}
