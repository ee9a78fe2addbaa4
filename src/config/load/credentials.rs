//! `[credentials.*]`: where each secret comes from and its windows, and
//! reading the secrets when a command needs them.

use std::path::Path;

use indexmap::IndexMap;

use super::jobs::RESERVED_KEYS;
use super::{Loader, NAME_RULE, expand_vars, read_bounded, valid_name};
use crate::config::defaults::MAX_SECRET_FILE_BYTES as MAX_SECRET;
use crate::config::raw::RawCredential;
use crate::config::{
    ConfigError, Credential, EnvLookup, FieldPath, Location, Secret, SecretSource, Source,
};

impl Loader<'_> {
    /// Every `[credentials.NAME]`, in config order.
    pub(super) fn credentials(
        &mut self,
        src: &Source,
        dir: &Path,
        raw: &IndexMap<String, RawCredential>,
    ) -> IndexMap<String, Credential> {
        let mut out = IndexMap::new();
        for (name, rc) in raw {
            let base = FieldPath::new(["credentials", name.as_str()]);
            self.check_name(src, &base, "credential", name);
            let Some(secret) = self.secret_source(src, dir, &base, rc) else {
                continue;
            };
            let windows = self.windows(src, &base.join("windows"), &rc.windows);
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
