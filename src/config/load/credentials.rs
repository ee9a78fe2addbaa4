//! `[credentials.*]`: where each secret comes from and its windows, and
//! reading the secrets when a command needs them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use indexmap::IndexMap;

use super::jobs::RESERVED_KEYS;
use super::windows::Resources;
use super::{Loader, NAME_RULE, expand_vars, read_bounded, valid_name};
use crate::config::defaults::{self as d, MAX_SECRET_FILE_BYTES as MAX_SECRET, SECRET_TTL};
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
            SecretSource::Command { argv, .. } if argv.iter().any(|a| a.contains(&wanted)) => {
                Some(placeholder.to_owned())
            }
            SecretSource::Command { .. } => {
                let msg = format!(
                    "a template's secret_command must hold {wanted} in its arguments, so each tenant gets its own token"
                );
                self.error(src, &base.join("secret_command"), msg);
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

    /// `secret_env`, `secret_file` or `secret_command`, exactly one. The
    /// secret is not read here: only the commands that send requests need
    /// it.
    fn secret_source(
        &mut self,
        src: &Source,
        dir: &Path,
        base: &FieldPath,
        rc: &RawCredential,
    ) -> Option<SecretSource> {
        if rc.secret_ttl.is_some() && rc.secret_command.is_none() {
            let msg = "secret_ttl is for a token a secret_command mints; a secret_env or secret_file is read as it is";
            self.error(src, &base.join("secret_ttl"), msg);
        }
        if let Some(argv) = &rc.secret_command {
            if rc.secret_env.is_some() || rc.secret_file.is_some() {
                let msg = "give one of secret_env, secret_file or secret_command";
                self.error(src, &base.join("secret_command"), msg);
                return None;
            }
            let ttl = rc.secret_ttl.as_ref().map_or(SECRET_TTL, |t| t.0);
            return self.secret_command(src, dir, base, argv, ttl);
        }
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
                let msg = "missing secret: give secret_env = \"VAR\", secret_file = \"PATH\" or secret_command = [\"PROGRAM\", ...]";
                self.error(src, base, msg);
                None
            }
        }
    }
}

impl Loader<'_> {
    /// `secret_command = ["PROGRAM", "ARG", ...]`: an argv (no shell), each
    /// element `$VARS` expanded (`${CREDENTIALS_DIRECTORY}/app.pem`); a
    /// program with a `/` relative to the config directory, as secret_file
    /// is; `secret_ttl` more than zero. Whether the program is there is
    /// checked with the secrets (`Config::secrets`), not here: `quota` and
    /// the other commands that send nothing do not need it.
    fn secret_command(
        &mut self,
        src: &Source,
        dir: &Path,
        base: &FieldPath,
        argv: &[String],
        ttl: Duration,
    ) -> Option<SecretSource> {
        let at = Location::of(src.error(&base.join("secret_command"), ""));
        if argv.first().is_none_or(|p| p.is_empty()) {
            let msg =
                "secret_command needs a program: [\"/usr/local/bin/token-helper\", \"ARG\", ...]";
            self.errors.push(at.error(msg));
            return None;
        }
        if ttl.is_zero() {
            self.error(src, &base.join("secret_ttl"), "must be more than 0");
        }
        let mut expanded = Vec::with_capacity(argv.len());
        for a in argv {
            match expand_vars(a, self.env) {
                Ok(v) => expanded.push(v),
                Err(e) => {
                    self.errors.push(at.error(e));
                    expanded.push(a.clone());
                }
            }
        }
        if expanded[0].contains('/') {
            expanded[0] = dir.join(&expanded[0]).to_string_lossy().into_owned();
        }
        Some(SecretSource::Command {
            argv: expanded,
            ttl,
            at,
        })
    }
}

/// Where `program` is, when it is a file this process may run: a path
/// (with a `/`) as it is, a bare name looked up in `PATH` as `execvp`
/// does. `Err`: why not, in words.
pub(in crate::config) fn check_program(
    program: &str,
    env: EnvLookup<'_>,
) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = PathBuf::from(program);
        return match std::fs::metadata(&path) {
            Err(e) => Err(format!("cannot run {program}: {e}")),
            Ok(_) if runnable(&path) => Ok(path),
            Ok(_) => Err(format!(
                "cannot run {program}: not an executable file (chmod +x?)"
            )),
        };
    }
    let path = env("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| runnable(p))
        .ok_or_else(|| format!("no executable {program} in PATH ({path})"))
}

/// Reads one secret; an error names the `secret_env` / `secret_file` field
/// and never the secret.
pub(in crate::config) fn read_secret(
    source: &SecretSource,
    env: EnvLookup<'_>,
) -> Result<Secret, ConfigError> {
    match source {
        SecretSource::Env { var, at } => match env(var) {
            Some(v) if !v.is_empty() => Ok(Secret::new(v)),
            Some(_) => Err(at.error(format!("environment variable {var} is empty"))),
            None => Err(at.error(format!("environment variable {var} is not set"))),
        },
        SecretSource::File { path, at } => match read_bounded(path, MAX_SECRET, "a secret file") {
            Ok(v) => {
                let v = v.trim_end_matches(['\n', '\r']);
                if v.is_empty() {
                    Err(at.error(format!("secret file {} is empty", path.display())))
                } else {
                    Ok(Secret::new(v))
                }
            }
            Err(e) => Err(at.error(format!("cannot read secret file {}: {e}", path.display()))),
        },
        // Minted by the daemon when a task needs it (`crate::mint`).
        SecretSource::Command { at, .. } => Err(at.error(
            "a secret_command's secret is minted when a task needs it, not read with the others",
        )),
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
