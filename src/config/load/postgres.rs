//! A `postgres://` URL and its `password_file`, as a sink and a
//! `fan_out_from` write them: checked here, connected to by `crate::pg`.

use std::path::Path;

use super::{Loader, expand_vars};
use crate::config::postgres::parse_url;
use crate::config::{FieldPath, Location, PasswordFrom, PgTarget, Source};

impl Loader<'_> {
    /// The server `url` (at `url_at`) names, logged in to with
    /// `password_file` (at `password_at`) or libpq's password file.
    pub(super) fn pg_target(
        &mut self,
        src: &Source,
        dir: &Path,
        (url, url_at): (&str, FieldPath),
        (password_file, password_at): (Option<&str>, FieldPath),
    ) -> Option<PgTarget> {
        let (conn, tls) = match parse_url(url, dir) {
            Ok(parsed) => parsed,
            Err(e) => {
                self.error(src, &url_at, e);
                return None;
            }
        };
        let password = match password_file {
            Some(file) => {
                let at = Location::of(src.error(&password_at, ""));
                // `${CREDENTIALS_DIRECTORY:-../secrets}/pg`, as secret files.
                let path = expand_vars(file, self.env).unwrap_or_else(|e| {
                    self.errors.push(at.error(e));
                    file.to_owned()
                });
                PasswordFrom::File {
                    path: dir.join(path),
                    at,
                }
            }
            None => self.pgpass(),
        };
        Some(PgTarget {
            url: url.to_owned(),
            conn,
            tls,
            password,
            at: Location::of(src.error(&url_at, "")),
        })
    }

    /// libpq's password file: `PGPASSFILE`, else `~/.pgpass` when it exists.
    fn pgpass(&self) -> PasswordFrom {
        let file = (self.env)("PGPASSFILE")
            .filter(|f| !f.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                let home = (self.env)("HOME").filter(|h| !h.is_empty())?;
                let f = Path::new(&home).join(".pgpass");
                f.is_file().then_some(f)
            });
        file.map_or(PasswordFrom::None, PasswordFrom::PassFile)
    }
}
