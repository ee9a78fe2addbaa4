//! A credential (`[credentials.NAME]`): one upstream key or token, its
//! windows and resources, and where its secret comes from; a template
//! credential's tenants and their token files; [`Secret`], which never
//! displays.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::{Endpoint, Location, Window, defaults, load, tenant_name};

/// One upstream API key or token.
#[derive(Debug, Clone)]
pub struct Credential {
    /// Its name (not the secret): used in Redis keys and logs.
    pub name: String,
    /// Where its secret comes from.
    pub secret: SecretSource,
    /// Its quota windows, in config order.
    pub windows: Vec<Window>,
    /// The name of its default resource: the one a window or endpoint that
    /// names none belongs to ([`Window::resource`] `None`), and the one an
    /// existing config's keys belong to. `"core"` when one of its endpoints
    /// has `accounting = "github"`, else `"graphql"` when one has
    /// `"github-graphql"`, else `"default"`.
    pub default_resource: String,
    /// `template = "account"`: one credential per value of `{account}`
    /// (the tenant), each with its own secret (`secret_file` holds the
    /// placeholder), windows of this shape, block and Redis keys.
    pub template: Option<String>,
}

impl Credential {
    /// The name of `resource` (`None`: the default resource).
    pub fn resource_name<'a>(&'a self, resource: Option<&'a str>) -> &'a str {
        resource.unwrap_or(&self.default_resource)
    }

    /// `name` as this credential's windows and endpoints hold it: `None`
    /// for the default resource.
    pub fn resource_of(&self, name: &str) -> Option<String> {
        (name != self.default_resource).then(|| name.to_owned())
    }

    /// Its resources, the default first, then each other one its windows
    /// and `endpoints` name, in config order.
    pub fn resources<'a>(
        &'a self,
        endpoints: impl IntoIterator<Item = &'a Endpoint>,
    ) -> Vec<Option<&'a str>> {
        let mut out: Vec<Option<&str>> = vec![None];
        let named = (self.windows.iter().map(|w| w.resource.as_deref())).chain(
            endpoints
                .into_iter()
                .filter(|e| e.credential == self.name)
                .flat_map(|e| {
                    std::iter::once(e.resource.as_deref())
                        .chain(e.windows.iter().map(|w| w.resource.as_deref()))
                }),
        );
        for r in named {
            if !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// One tenant of a template credential: its name as `quota` shows it
    /// and its keys carry it (`ig[account=123]`, [`tenant_name`]).
    /// `None` for a plain credential.
    pub fn tenant(&self, value: &str) -> Option<String> {
        let placeholder = self.template.as_deref()?;
        Some(tenant_name(&self.name, placeholder, value))
    }

    /// The command that mints this credential's secret, with a tenant's
    /// `value` in place of the template's placeholder, and its TTL; the
    /// key its token is kept under in this process (the credential or the
    /// tenant). `None` when the secret is not minted by a command.
    pub fn command(&self, value: Option<&str>) -> Option<(String, Vec<String>, Duration)> {
        let SecretSource::Command { argv, ttl, .. } = &self.secret else {
            return None;
        };
        match (&self.template, value) {
            (Some(placeholder), Some(value)) => {
                let wanted = format!("{{{placeholder}}}");
                let argv = argv.iter().map(|a| a.replace(&wanted, value)).collect();
                Some((self.tenant(value)?, argv, *ttl))
            }
            (Some(_), None) => None,
            (None, _) => Some((self.name.clone(), argv.clone(), *ttl)),
        }
    }

    /// Why a template's command must not run for tenant `value`: the value
    /// starts with `-` and would begin an argument of the command, which
    /// would read it as an option (`--help`, `--output=/etc/x`): values come
    /// from data (`fan_out_from`), not the operator. An argument after a
    /// `--` in the argv is safe (the operator ended the options there).
    /// `None`: it may run (or the secret is not minted, or not a template).
    pub fn command_refusal(&self, value: &str) -> Option<String> {
        let (SecretSource::Command { argv, .. }, Some(placeholder)) =
            (&self.secret, &self.template)
        else {
            return None;
        };
        if !value.starts_with('-') {
            return None;
        }
        let wanted = format!("{{{placeholder}}}");
        let at = argv
            .iter()
            .skip(1)
            .take_while(|a| a.as_str() != "--")
            .any(|a| a.starts_with(&wanted));
        let program = argv.first().map_or("", String::as_str);
        at.then(|| {
            format!(
                "the tenant value {value:?} starts with '-', so {program} would read it as an option; not run (put \"--\" before \"{wanted}\" in secret_command if the command takes it as a value there)"
            )
        })
    }

    /// Whether a command mints this credential's secret.
    pub fn minted(&self) -> bool {
        matches!(self.secret, SecretSource::Command { .. })
    }

    /// Reads one tenant's secret, from `secret_file` with the tenant's
    /// value in place of the placeholder; read at every call, so a changed
    /// token file is picked up by the next task.
    pub fn tenant_secret(&self, value: &str) -> Result<Secret, TenantSecretError> {
        let (Some(placeholder), SecretSource::File { path, .. }) = (&self.template, &self.secret)
        else {
            return Err(TenantSecretError::NotATemplate);
        };
        check_tenant_value(value)?;
        let path = path
            .to_string_lossy()
            .replace(&format!("{{{placeholder}}}"), value);
        let path = PathBuf::from(path);
        match load::read_bounded(&path, defaults::MAX_SECRET_FILE_BYTES, "a secret file") {
            Ok(v) => {
                let v = v.trim_end_matches(['\n', '\r']);
                if v.is_empty() {
                    Err(TenantSecretError::Empty(path))
                } else {
                    Ok(Secret(v.to_owned()))
                }
            }
            Err(why) => Err(TenantSecretError::Unreadable { path, why }),
        }
    }
}

/// Whether `value` can be a tenant of a template credential: it names one
/// token file under the template's directories, so a value that could
/// climb out of them (`..`, `a/b`) or names no file (empty, a control
/// character) is none.
pub fn check_tenant_value(value: &str) -> Result<(), TenantSecretError> {
    if value.is_empty()
        || value == "."
        || value == ".."
        || value.contains(['/', '\\', '\0'])
        || value.chars().any(char::is_control)
    {
        return Err(TenantSecretError::BadValue);
    }
    Ok(())
}

/// Why a tenant of a template credential has no secret. The task of that
/// item fails; the daemon and the other tenants go on. Fix the token file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantSecretError {
    /// A bug in the caller: a plain credential has no tenants.
    #[error("the credential is not a template")]
    NotATemplate,
    /// The value cannot name a file (empty, `.`, `..`, a `/`, a control
    /// character): fix the fan-out data.
    #[error(
        "the value cannot name a token file (empty, '.', '..', '/', '\\' or a control character)"
    )]
    BadValue,
    /// The token file is missing or unreadable: create it.
    #[error("cannot read {}: {why}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        why: String,
    },
    /// The token file is empty: write the token into it.
    #[error("{} is empty", .0.display())]
    Empty(PathBuf),
}

/// Where a secret is read from.
#[derive(Debug, Clone)]
pub enum SecretSource {
    /// An environment variable.
    Env {
        /// The variable's name.
        var: String,
        /// Where the config names it.
        at: Location,
    },
    /// A file (e.g. a systemd credential); a trailing newline is dropped.
    File {
        /// The file, `$VARS` expanded, relative to the config directory.
        path: PathBuf,
        /// Where the config names it.
        at: Location,
    },
    /// A command that prints the secret (`secret_command`): a token that
    /// expires, minted by the daemon at first use and again after `ttl`
    /// or a 401 (`crate::mint`). Never read with the other secrets.
    Command {
        /// Program and arguments, `$VARS` expanded; a program with a `/`
        /// relative to the config directory, one without looked up in
        /// `PATH`. A template's holds its placeholder.
        argv: Vec<String>,
        /// `secret_ttl`.
        ttl: Duration,
        /// Where the config names it.
        at: Location,
    },
}

/// A secret value. It never displays, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself: only for building a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// The secrets of every credential, by credential name.
pub type Secrets = HashMap<String, Secret>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_never_prints() {
        assert!(!format!("{:?}", Secret::new("AIzaXYZ")).contains("AIza"));
    }
}
