//! `[credentials.*]`: where each secret comes from and its windows, and
//! reading the secrets when a command needs them.

use std::path::Path;

use indexmap::IndexMap;

use super::{Loader, expand_vars, read_bounded};
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
            let credential = Credential {
                name: name.clone(),
                secret,
                windows,
            };
            out.insert(name.clone(), credential);
        }
        out
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
