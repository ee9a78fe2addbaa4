//! `[credentials.*]`: where each secret comes from and its windows, and
//! reading the secrets when a command needs them.

use std::path::Path;

use indexmap::IndexMap;

use super::jobs::RESERVED_KEYS;
use super::windows::Resources;
use super::{Loader, NAME_RULE, expand_vars, read_bounded, valid_name};
use crate::config::defaults::{self as d, MAX_SECRET_FILE_BYTES as MAX_SECRET};
use crate::config::raw::{RawCredential, RawEndpoint};
use crate::config::{
    ConfigError, Credential, EnvLookup, FieldPath, Location, Secret, SecretSource, Source,
};

impl Loader<'_> {
    /// Every `[credentials.NAME]`, in config order; `endpoints` (as
    /// written) say which resource is its default.
    pub(super) fn credentials(
        &mut self,
        src: &Source,
        dir: &Path,
        raw: &IndexMap<String, RawCredential>,
        endpoints: &IndexMap<String, RawEndpoint>,
    ) -> IndexMap<String, Credential> {
        let mut out = IndexMap::new();
        for (name, rc) in raw {
            let base = FieldPath::new(["credentials", name.as_str()]);
            self.check_name(src, &base, "credential", name);
            let Some(secret) = self.secret_source(src, dir, &base, rc) else {
                continue;
            };
            let default_resource = default_resource(name, endpoints);
            let resources = Resources {
                default: default_resource,
                unnamed: None,
            };
            let windows = self.windows(src, &base.join("windows"), &rc.windows, &resources);
            let template = rc
                .template
                .as_ref()
                .and_then(|t| self.credential_template(src, &base, t, &secret));
            if let Some(t) = &template {
                self.templates.insert(name.clone(), t.clone());
            }
            let credential = Credential {
                name: name.clone(),
                secret,
                windows,
                default_resource: default_resource.to_owned(),
                template,
            };
            out.insert(name.clone(), credential);
        }
        out
    }

    /// `template = "account"`: a placeholder name no fan-out may take for
    /// itself, and a `secret_file` that holds it (each tenant's own token).
    fn credential_template(
        &mut self,
        src: &Source,
        base: &FieldPath,
        placeholder: &str,
        secret: &SecretSource,
    ) -> Option<String> {
        if !valid_name(placeholder) || RESERVED_KEYS.contains(&placeholder) {
            let msg = format!(
                "bad template placeholder {placeholder:?}: {NAME_RULE}; {} are taken",
                RESERVED_KEYS.join(", ")
            );
            self.error(src, &base.join("template"), msg);
            return None;
        }
        let wanted = format!("{{{placeholder}}}");
        match secret {
            SecretSource::File { path, .. } if path.to_string_lossy().contains(&wanted) => {
                Some(placeholder.to_owned())
            }
            SecretSource::File { .. } => {
                let msg = format!(
                    "a template's secret_file must hold {wanted}, so each tenant has its own token: secret_file = \"tokens/{wanted}\""
                );
                self.error(src, &base.join("secret_file"), msg);
                None
            }
            SecretSource::Env { .. } => {
                let msg = format!(
                    "a template reads each tenant's token from a file: secret_file = \"tokens/{wanted}\", not secret_env"
                );
                self.error(src, &base.join("secret_env"), msg);
                None
            }
        }
    }

    /// `secret_env` or `secret_file`, exactly one. The secret is not read
    /// here: only the commands that send requests need it.
    fn secret_source(
        &mut self,
        src: &Source,
        dir: &Path,
        base: &FieldPath,
        rc: &RawCredential,
    ) -> Option<SecretSource> {
        match (&rc.secret_env, &rc.secret_file) {
            (Some(var), None) => Some(SecretSource::Env {
                var: var.clone(),
                at: Location::of(src.error(&base.join("secret_env"), "")),
            }),
            (None, Some(file)) => {
                let at = Location::of(src.error(&base.join("secret_file"), ""));
                let path = expand_vars(file, self.env).unwrap_or_else(|e| {
                    self.errors.push(at.error(e));
                    file.clone()
                });
                let path = dir.join(path);
                Some(SecretSource::File { path, at })
            }
            (Some(_), Some(_)) => {
                let msg = "give secret_env or secret_file, not both";
                self.error(src, &base.join("secret_file"), msg);
                None
            }
            (None, None) => {
                let msg = "missing secret: give secret_env = \"VAR\" or secret_file = \"PATH\"";
                self.error(src, base, msg);
                None
            }
        }
    }
}

/// Reads one secret; an error names the `secret_env` / `secret_file` field
/// and never the secret.
pub(in crate::config) fn read_secret(
    source: &SecretSource,
    env: EnvLookup<'_>,
) -> Result<Secret, ConfigError> {
    match source {
        SecretSource::Env { var, at } => match env(var) {
            Some(v) if !v.is_empty() => Ok(Secret(v)),
            Some(_) => Err(at.error(format!("environment variable {var} is empty"))),
            None => Err(at.error(format!("environment variable {var} is not set"))),
        },
        SecretSource::File { path, at } => match read_bounded(path, MAX_SECRET, "a secret file") {
            Ok(v) => {
                let v = v.trim_end_matches(['\n', '\r']);
                if v.is_empty() {
                    Err(at.error(format!("secret file {} is empty", path.display())))
                } else {
                    Ok(Secret(v.to_owned()))
                }
            }
            Err(e) => Err(at.error(format!("cannot read secret file {}: {e}", path.display()))),
        },
    }
}

/// Credential `name`'s default resource, by its endpoints' `accounting`
/// as written: GitHub REST's `"core"` when one of them reads GitHub REST,
/// else `"graphql"` when one reads GitHub GraphQL, else `"default"`.
fn default_resource(name: &str, endpoints: &IndexMap<String, RawEndpoint>) -> &'static str {
    let accounting = |a: &str| {
        (endpoints.values()).any(|e| e.credential == name && e.accounting.as_deref() == Some(a))
    };
    if accounting("github") {
        d::GITHUB_RESOURCE
    } else if accounting("github-graphql") {
        d::GITHUB_GRAPHQL_RESOURCE
    } else {
        d::RESOURCE
    }
}
