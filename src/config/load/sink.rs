//! `[job.sink]`: where a job's records go. Its path is a template like the
//! request's, but `{secret}` may not appear in it (it would name files).

use super::request::Placeholders;
use super::{Loader, expand_vars};
use crate::config::defaults as d;
use crate::config::raw::RawSink;
use crate::config::{FieldPath, Location, SinkConfig, SinkKind, Source};

impl Loader<'_> {
    /// `[NAME.sink]`.
    pub(super) fn sink(
        &mut self,
        src: &Source,
        base: &FieldPath,
        raw: RawSink,
        places: &Placeholders<'_>,
    ) -> Option<SinkConfig> {
        let path_at = base.join("path");
        // `$VARS` first (`${STATE_DIRECTORY:-../state}/data/...`), then the
        // `{placeholders}`.
        let path = expand_vars(&raw.path, self.env).unwrap_or_else(|e| {
            self.error(src, &path_at, e);
            raw.path.clone()
        });
        let path = self.template(src, &path_at, &path, places, false);
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
            self.sqlite_only(src, base, &raw);
        }
        Some(SinkConfig {
            kind,
            path: path?,
            at: Location::of(src.error(&path_at, "")),
            records,
            search: raw.search,
            key: raw.key,
        })
    }

    /// A JSON-lines sink has no index and no keys to replace records by.
    fn sqlite_only(&mut self, src: &Source, base: &FieldPath, raw: &RawSink) {
        if !raw.search.is_empty() {
            let msg = "only sqlite sinks have a full-text index";
            self.error(src, &base.join("search"), msg);
        }
        if raw.key.is_some() {
            let msg = "only sqlite sinks replace records by key";
            self.error(src, &base.join("key"), msg);
        }
    }
}
