//! `[job.sink]`: where a job's records go. A file sink's path is a template
//! like the request's, but `{secret}` may not appear in it (it would name
//! files); a postgres sink names a server and a table instead.

use std::path::Path;

use super::request::Placeholders;
use super::{Loader, expand_vars};
use crate::config::defaults as d;
use crate::config::postgres::parse_table;
use crate::config::raw::RawSink;
use crate::config::{FieldPath, Location, PgSink, SinkConfig, SinkKind, Source, Template};

impl Loader<'_> {
    /// `[NAME.sink]`.
    pub(super) fn sink(
        &mut self,
        src: &Source,
        base: &FieldPath,
        dir: &Path,
        job: &str,
        raw: RawSink,
        places: &Placeholders<'_>,
    ) -> Option<SinkConfig> {
        let kind = self.pick_or(
            src,
            &base.join("kind"),
            Some(raw.kind.as_str()),
            SinkKind::Jsonl,
        );
        let records = raw
            .records
            .clone()
            .unwrap_or_else(|| d::SINK_RECORDS.into());
        self.check_pointer(src, &base.join("records"), &records, false, "/items");
        for (i, f) in raw.search.iter().enumerate() {
            let at = base.join("search").join(i);
            self.check_pointer(src, &at, f, true, "/snippet/title");
        }
        if let Some(k) = &raw.key {
            self.check_pointer(src, &base.join("key"), k, true, "/id");
        }
        if kind == SinkKind::Jsonl {
            self.indexed_only(src, base, &raw);
        }
        let (path, at, postgres) = if kind == SinkKind::Postgres {
            let (at, pg) = self.postgres_sink(src, base, dir, job, &raw)?;
            (Template::parse("").ok(), at, Some(pg))
        } else {
            let (path, at) = self.sink_path(src, base, &raw, places)?;
            (path, at, None)
        };
        Some(SinkConfig {
            kind,
            path: path?,
            at,
            postgres,
            records,
            search: raw.search,
            key: raw.key,
        })
    }

    /// A file sink's `path` (and none of a postgres sink's fields).
    fn sink_path(
        &mut self,
        src: &Source,
        base: &FieldPath,
        raw: &RawSink,
        places: &Placeholders<'_>,
    ) -> Option<(Option<Template>, Location)> {
        for (field, set) in [
            ("url", raw.url.is_some()),
            ("password_file", raw.password_file.is_some()),
            ("table", raw.table.is_some()),
        ] {
            if set {
                let msg = format!("only postgres sinks have {field}");
                self.error(src, &base.join(field), msg);
            }
        }
        let path_at = base.join("path");
        let Some(written) = &raw.path else {
            let msg =
                "missing path: the file records go to, e.g. path = \"data/{job}/{date}.jsonl\"";
            self.error(src, base, msg);
            return None;
        };
        // `$VARS` first (`${STATE_DIRECTORY:-../state}/data/...`), then the
        // `{placeholders}`.
        let path = expand_vars(written, self.env).unwrap_or_else(|e| {
            self.error(src, &path_at, e);
            written.clone()
        });
        let path = self.template(src, &path_at, &path, places, false);
        Some((path, Location::of(src.error(&path_at, ""))))
    }

    /// A postgres sink's `url`, `password_file` and `table` (and no `path`).
    fn postgres_sink(
        &mut self,
        src: &Source,
        base: &FieldPath,
        dir: &Path,
        job: &str,
        raw: &RawSink,
    ) -> Option<(Location, PgSink)> {
        if raw.path.is_some() {
            let msg = "a postgres sink writes to a table, not a file: remove path (table = \"...\" names the table)";
            self.error(src, &base.join("path"), msg);
        }
        let table = match &raw.table {
            Some(t) => match parse_table(t) {
                Ok(parts) => Some(parts),
                Err(e) => {
                    self.error(src, &base.join("table"), e);
                    None
                }
            },
            // The job's name, quoted as one identifier whatever it holds.
            None => Some(vec![job.to_owned()]),
        };
        let Some(url) = &raw.url else {
            let msg =
                "missing url: the server, e.g. url = \"postgres://ingest@127.0.0.1:5432/ingest\"";
            self.error(src, base, msg);
            return None;
        };
        let target = self.pg_target(
            src,
            dir,
            (url, base.join("url")),
            (raw.password_file.as_deref(), base.join("password_file")),
        )?;
        let at = target.at.clone();
        Some((
            at,
            PgSink {
                target,
                table: table?,
            },
        ))
    }

    /// A JSON-lines sink has no index and no keys to replace records by.
    fn indexed_only(&mut self, src: &Source, base: &FieldPath, raw: &RawSink) {
        if !raw.search.is_empty() {
            let msg = "only sqlite and postgres sinks have a full-text index";
            self.error(src, &base.join("search"), msg);
        }
        if raw.key.is_some() {
            let msg = "only sqlite and postgres sinks replace records by key";
            self.error(src, &base.join("key"), msg);
        }
    }
}
