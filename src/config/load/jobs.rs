//! The job files the `jobs` glob names, and each job's own fields: schedule,
//! time zone, endpoint, fan-out, retries and pagination. Its request and
//! sink tables are in [`super::request`] and [`super::sink`].
//!
//! About 750 lines, one `impl Loader` block: a job has the most fields of
//! any table, and each is read by one short function beside its checks and
//! their error texts; split further, a field's checks would sit away from
//! the others of its job that they compare against (cursor fields against
//! the request's placeholders, `max_pages` against the pagination style).

use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use indexmap::IndexMap;

use super::request::{Placeholders, cursor_fields};
use super::{Loader, NAME_RULE, expand_vars, valid_name};
use crate::config::choice::PageStyleName;
use crate::config::defaults as d;
use crate::config::raw::{RawFanOutFrom, RawJob, RawPagination, RawRetry};
use crate::config::{
    CursorAt, DataSource, Endpoint, FanOutFrom, FieldPath, Job, PageFlag, PageStyle, Pagination,
    Reserve, Retry, Schedule, Source,
};
use crate::schedule::source;

/// Fan-out keys the product fills itself.
pub(super) const RESERVED_KEYS: [&str; 7] = [
    "secret",
    "date",
    "job",
    "item",
    "since",
    "since_epoch",
    "cursor",
];

impl Loader<'_> {
    /// Every job of every file `pattern` matches, in file then config order.
    pub(super) fn jobs(
        &mut self,
        src: &Source,
        dir: &Path,
        pattern: &str,
        endpoints: &IndexMap<String, Endpoint>,
    ) -> IndexMap<String, Job> {
        let mut jobs = IndexMap::new();
        let paths = match glob::glob(&dir.join(pattern).to_string_lossy()) {
            Ok(paths) => paths,
            Err(e) => {
                let msg = format!("bad glob {pattern:?}: {e}");
                self.error(src, &FieldPath::new(["jobs"]), msg);
                return jobs;
            }
        };
        let mut files: Vec<PathBuf> = paths
            .filter_map(Result::ok)
            .map(|p| normalize(&p))
            .collect();
        files.sort();
        for file in files {
            self.job_file(&file, dir, endpoints, &mut jobs);
        }
        jobs
    }

    /// One job file: a table of jobs. A name already defined elsewhere is
    /// an error, not an override.
    fn job_file(
        &mut self,
        file: &Path,
        dir: &Path,
        endpoints: &IndexMap<String, Endpoint>,
        jobs: &mut IndexMap<String, Job>,
    ) {
        let src = match self.source(file) {
            Ok(s) => s,
            Err(e) => return self.errors.push(e),
        };
        let raw: IndexMap<String, RawJob> = match toml::from_str(src.text()) {
            Ok(r) => r,
            Err(e) => return self.errors.push(src.from_toml(&e)),
        };
        for (name, rj) in raw {
            if let Some(prev) = jobs.get(&name) {
                let msg = format!("job {name:?} is also defined in {}", prev.file.display());
                self.error(&src, &FieldPath::new([name.as_str()]), msg);
                continue;
            }
            if let Some(job) = self.job(&src, dir, &name, rj, endpoints) {
                jobs.insert(name, job);
            }
        }
    }

    /// `[NAME]` in a job file, with its request, pagination, sink and retry
    /// tables; `None` when anything in it is wrong (reported).
    fn job(
        &mut self,
        src: &Source,
        dir: &Path,
        name: &str,
        rj: RawJob,
        endpoints: &IndexMap<String, Endpoint>,
    ) -> Option<Job> {
        let base = FieldPath::new([name]);
        let errors_before = self.errors.len();
        self.check_name(src, &base, "job", name);
        let schedule = self.schedule(src, &base.join("schedule"), &rj.schedule);
        let timezone = self.timezone(
            src,
            &base.join("timezone"),
            rj.timezone.as_deref(),
            d::JOB_TIMEZONE,
            "Europe/Berlin",
        );
        let endpoint_valid =
            self.job_endpoint(src, &base.join("endpoint"), &rj.endpoint, endpoints);
        let fan_out = self.fan_out(src, &base.join("fan_out"), rj.fan_out);
        let on_quota_exhausted = self.pick_or(
            src,
            &base.join("on_quota_exhausted"),
            rj.on_quota_exhausted.as_deref(),
            d::ON_QUOTA_EXHAUSTED,
        );
        let from_written = rj.fan_out_from.is_some();
        let fan_out_from = rj
            .fan_out_from
            .and_then(|raw| self.fan_out_from(src, &base.join("fan_out_from"), dir, raw, &fan_out));
        let columns = fan_out_from.as_ref().map_or(&[][..], |f| &f.columns[..]);
        if endpoint_valid && !(from_written && fan_out_from.is_none()) {
            let at = base.join("endpoint");
            self.check_tenant_filled(src, &at, &endpoints[&rj.endpoint], columns, &fan_out);
        }
        // A source that failed (reported) leaves its columns unknown: its
        // placeholders are not reported again.
        let places = Placeholders::of(columns, &fan_out)
            .with_unknown_columns(from_written && fan_out_from.is_none());
        let request = self.request(src, &base.join("request"), &rj.request, &places);
        let cursor_in = cursor_fields(&base.join("request"), &rj.request);
        let pagination = (rj.pagination.as_ref())
            .and_then(|p| self.pagination(src, &base.join("pagination"), p, !cursor_in.is_empty()));
        if let Some(at) = cursor_in.first()
            && (rj.pagination.is_none() || pagination.is_some())
        {
            self.check_cursor_given(src, &base, at, pagination.as_ref());
        }
        let sink = self.sink(src, &base.join("sink"), dir, name, rj.sink, &places);
        let retry = self.retry(src, &base.join("retry"), rj.retry.as_ref());
        let endpoint = endpoints.get(&rj.endpoint);
        let reserve = self.reserve(src, &base.join("reserve"), rj.reserve.as_deref(), endpoint);
        let since_initial = rj.since_initial.map_or(d::SINCE_INITIAL, |s| s.0);

        if self.errors.len() > errors_before || !endpoint_valid {
            return None;
        }
        Some(Job {
            name: name.to_owned(),
            file: src.path().to_owned(),
            schedule: schedule?,
            timezone,
            endpoint: rj.endpoint,
            fan_out,
            fan_out_from,
            on_quota_exhausted,
            request: request?,
            pagination,
            sink: sink?,
            retry,
            reserve,
            since_initial,
        })
    }

    /// `reserve = "20%"`: a whole percent, and with it kept free the
    /// endpoint's cost must still fit every window its spends touch.
    fn reserve(
        &mut self,
        src: &Source,
        at: &FieldPath,
        raw: Option<&str>,
        endpoint: Option<&Endpoint>,
    ) -> Reserve {
        let reserve = match raw.map(str::parse::<Reserve>) {
            None => return Reserve::NONE,
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                self.error(src, at, e);
                return Reserve::NONE;
            }
        };
        let Some(ep) = endpoint else {
            return reserve;
        };
        // The credential's windows (of the endpoint's resource) count only
        // when the endpoint charges it.
        let own = (ep.charge_credential)
            .then(|| self.credential_windows.get(&ep.credential))
            .flatten();
        let own = (own.into_iter().flatten()).filter(|w| w.serves(ep.resource.as_deref()));
        let tightest = (own.chain(&ep.windows)).min_by_key(|w| w.admits(reserve));
        if let Some(w) = tightest.filter(|w| ep.cost.get() > w.admits(reserve)) {
            let msg = format!(
                "with {reserve} kept free, window {} admits {} units at most, less than {}'s cost {}: no request could ever be admitted",
                w.describe(),
                w.admits(reserve),
                ep.name,
                ep.cost
            );
            self.error(src, at, msg);
        }
        reserve
    }

    /// `schedule`: cron with seconds first, or `"manual"` (only `trigger`
    /// runs the job).
    fn schedule(&mut self, src: &Source, at: &FieldPath, raw: &str) -> Option<Schedule> {
        if raw.trim() == Schedule::MANUAL {
            return Some(Schedule::Manual);
        }
        cron::Schedule::from_str(raw.trim())
            .map(|c| Schedule::Cron(Box::new(c)))
            .map_err(|e| {
                let msg = format!(
                    "bad cron expression {raw:?}: {e} (six or seven fields, seconds first: \"0 */30 * * * *\"; or \"manual\": only `trigger` runs the job)"
                );
                self.error(src, at, msg);
            })
            .ok()
    }

    /// `endpoint`: whether it names a valid endpoint. One that is defined
    /// but invalid was reported already and is not reported again.
    fn job_endpoint(
        &mut self,
        src: &Source,
        at: &FieldPath,
        name: &str,
        endpoints: &IndexMap<String, Endpoint>,
    ) -> bool {
        if endpoints.contains_key(name) {
            return true;
        }
        if !self.invalid_endpoints.contains(name) {
            let known: Vec<_> = endpoints.keys().map(String::as_str).collect();
            let msg = format!("unknown endpoint {name:?} (known: {})", known.join(", "));
            self.error(src, at, msg);
        }
        false
    }

    /// A job charged to a template credential must say which tenant each
    /// item is: its placeholder must be a fan-out key or a `fan_out_from`
    /// column.
    fn check_tenant_filled(
        &mut self,
        src: &Source,
        at: &FieldPath,
        endpoint: &Endpoint,
        columns: &[String],
        fan_out: &[(String, Vec<String>)],
    ) {
        let Some(placeholder) = self.templates.get(&endpoint.credential) else {
            return;
        };
        let filled = columns.contains(placeholder) || fan_out.iter().any(|(k, _)| k == placeholder);
        if !filled {
            let msg = format!(
                "endpoint {:?} is charged to credential {:?}, a template on {{{placeholder}}}: this job must provide {{{placeholder}}} (a fan_out key or a fan_out_from column), one tenant per item",
                endpoint.name, endpoint.credential
            );
            self.error(src, at, msg);
        }
    }

    /// `fan_out = { key = [values] }`: each key a placeholder, each list
    /// non-empty.
    fn fan_out(
        &mut self,
        src: &Source,
        base: &FieldPath,
        raw: IndexMap<String, Vec<String>>,
    ) -> Vec<(String, Vec<String>)> {
        let mut out = Vec::new();
        for (key, values) in raw {
            let at = base.join(key.as_str());
            if !valid_name(&key) || RESERVED_KEYS.contains(&key.as_str()) {
                let msg = format!(
                    "bad fan-out key {key:?}: {NAME_RULE}; {} are taken",
                    RESERVED_KEYS.join(", ")
                );
                self.error(src, &at, msg);
            }
            if values.is_empty() {
                self.error(src, &at, "an empty list fans out to no tasks at all");
            }
            // Control characters would reach URLs, headers and log lines.
            let bad = |v: &&String| v.is_empty() || v.chars().any(char::is_control);
            if let Some(v) = values.iter().find(bad) {
                let msg = format!(
                    "bad value {v:?}: values must be non-empty, without control characters (CR, LF, tab, ESC, ...)"
                );
                self.error(src, &at, msg);
            }
            out.push((key, values));
        }
        out
    }

    /// `[NAME.fan_out_from]`: a CSV file (`csv`) or a SQLite file and one
    /// read-only `query` (`sqlite`, `query`), paths relative to the config
    /// file's directory. The source is read now for its columns (the
    /// placeholders it fills): the CSV header, the query prepared. A source
    /// that cannot be read is an error, unless `columns` declares them and
    /// the file is not there yet (another job's sink may create it): then
    /// `check` warns and ticks fan out nothing until it can be read.
    fn fan_out_from(
        &mut self,
        src: &Source,
        base: &FieldPath,
        dir: &Path,
        raw: RawFanOutFrom,
        fan_out: &[(String, Vec<String>)],
    ) -> Option<FanOutFrom> {
        let (source, at) = self.data_source(src, base, dir, &raw)?;
        let max_items = raw
            .max_items
            .map_or(Some(d::FAN_OUT_MAX_ITEMS), NonZeroU64::new);
        let Some(max_items) = max_items else {
            self.error(src, &base.join("max_items"), "must be at least 1");
            return None;
        };
        let columns = match (source::columns(&source), raw.columns) {
            (Ok(found), None) => found,
            (Ok(found), Some(declared)) => {
                let mut sorted = (found.clone(), declared.clone());
                sorted.0.sort();
                sorted.1.sort();
                if sorted.0 != sorted.1 {
                    let msg = format!(
                        "the source's columns are {found:?}; columns = {declared:?} must name the same ones"
                    );
                    self.error(src, &base.join("columns"), msg);
                }
                declared
            }
            // The table may be another job's sink, not made yet; the server
            // may be down now. The declared columns stand in for the query's.
            (Err(e), Some(declared))
                if e.is_missing()
                    || matches!(
                        e,
                        source::SourceError::Sqlite { .. } | source::SourceError::Pg(_)
                    ) =>
            {
                if let DataSource::Sqlite { query, .. } | DataSource::Postgres { query, .. } =
                    &source
                    && !source::looks_read_only(query)
                {
                    let e = source::SourceError::NotReadOnly;
                    self.error(src, &base.join("query"), e.to_string());
                }
                declared
            }
            (Err(e), declared) => {
                self.source_error(src, base, at, &e, declared.is_some());
                return None;
            }
        };
        self.check_columns(src, base, &columns, fan_out);
        Some(FanOutFrom {
            source,
            columns,
            max_items,
            rows: None,
        })
    }

    /// A source that cannot be read at load: the error at the field to fix
    /// (`query` for what the query does), with what to declare when the
    /// source is only missing or down now.
    fn source_error(
        &mut self,
        src: &Source,
        base: &FieldPath,
        at: FieldPath,
        e: &source::SourceError,
        declared: bool,
    ) {
        use source::SourceError as E;
        let mut msg = e.to_string();
        if e.is_missing() && !declared {
            msg.push_str(match e {
                E::Pg(_) => "; to load while it is down, declare the placeholders the query fills: columns = [\"repo\", ...]",
                _ => "; if another job creates it, declare the placeholders it will fill: columns = [\"channel\", ...]",
            });
        }
        let at = match e {
            E::MultipleStatements | E::NotReadOnly | E::ColumnType { .. } | E::Sqlite { .. } => {
                base.join("query")
            }
            E::Pg(pg) if pg.code().is_some() => base.join("query"),
            _ => at,
        };
        self.error(src, &at, msg);
    }

    /// `csv`, or `sqlite` or `postgres` with `query`: the source, and the
    /// field naming its file or server.
    fn data_source(
        &mut self,
        src: &Source,
        base: &FieldPath,
        dir: &Path,
        raw: &RawFanOutFrom,
    ) -> Option<(DataSource, FieldPath)> {
        let written: Vec<&str> = [
            ("csv", raw.csv.is_some()),
            ("sqlite", raw.sqlite.is_some()),
            ("postgres", raw.postgres.is_some()),
        ]
        .into_iter()
        .filter_map(|(f, set)| set.then_some(f))
        .collect();
        if raw.password_file.is_some() && raw.postgres.is_none() {
            let msg = "password_file logs in to a postgres source: name it with postgres = \"postgres://...\"";
            self.error(src, &base.join("password_file"), msg);
        }
        let source = match written[..] {
            [one] => one,
            [] => {
                let msg = "needs a source: csv = \"file.csv\", or sqlite = \"file.db\" or postgres = \"postgres://...\" with a query";
                self.error(src, base, msg);
                return None;
            }
            [_, second, ..] => {
                let msg = format!(
                    "a fan-out reads one source: {}, not several",
                    written.join(" or ")
                );
                self.error(src, &base.join(second), msg);
                return None;
            }
        };
        let at = base.join(source);
        match (source, &raw.query) {
            ("csv", None) => {
                let path = self.source_path(src, &at, dir, raw.csv.as_deref()?)?;
                Some((DataSource::Csv { path }, at))
            }
            ("csv", Some(_)) => {
                let msg = "query reads a database: name it with sqlite = \"...db\" or postgres = \"postgres://...\"";
                self.error(src, &base.join("query"), msg);
                None
            }
            ("sqlite", Some(query)) => {
                let path = self.source_path(src, &at, dir, raw.sqlite.as_deref()?)?;
                let query = query.clone();
                Some((DataSource::Sqlite { path, query }, at))
            }
            ("postgres", Some(query)) => {
                let url = raw.postgres.as_deref()?;
                let password = (raw.password_file.as_deref(), base.join("password_file"));
                let target = Box::new(self.pg_target(src, dir, (url, at.clone()), password)?);
                let query = query.clone();
                Some((DataSource::Postgres { target, query }, at))
            }
            (_, None) => {
                let msg = format!(
                    "a {source} source needs its query: query = \"SELECT ... AS channel FROM ...\""
                );
                self.error(src, &at, msg);
                None
            }
            _ => None,
        }
    }

    /// A source file's path, `$VARS` expanded (as in sink paths:
    /// `${STATE_DIRECTORY:-../state}/...`), relative to the config file.
    fn source_path(
        &mut self,
        src: &Source,
        at: &FieldPath,
        dir: &Path,
        written: &str,
    ) -> Option<PathBuf> {
        match expand_vars(written, self.env) {
            Ok(p) => Some(dir.join(p)),
            Err(e) => {
                self.error(src, at, e);
                None
            }
        }
    }

    /// Each column must make a placeholder no other fills.
    fn check_columns(
        &mut self,
        src: &Source,
        base: &FieldPath,
        columns: &[String],
        fan_out: &[(String, Vec<String>)],
    ) {
        let at = base.join("columns");
        if columns.is_empty() {
            self.error(src, &at, "the source has no columns");
        }
        for (i, c) in columns.iter().enumerate() {
            if !valid_name(c) || RESERVED_KEYS.contains(&c.as_str()) {
                let msg = format!(
                    "column {c:?} cannot be a placeholder: {NAME_RULE}; {} are taken (rename it: SELECT x AS name)",
                    RESERVED_KEYS.join(", ")
                );
                self.error(src, &at, msg);
            } else if columns[..i].contains(c) {
                self.error(src, &at, format!("column {c:?} appears twice"));
            } else if fan_out.iter().any(|(k, _)| k == c) {
                let msg = format!("column {c:?} is also a fan_out key: one placeholder, one value");
                self.error(src, &at, msg);
            }
        }
    }

    /// `{cursor}` at `at` has a value only where the job's pagination has
    /// a cursor (`style = "cursor"`): the error names both fields.
    fn check_cursor_given(
        &mut self,
        src: &Source,
        base: &FieldPath,
        at: &FieldPath,
        pagination: Option<&Pagination>,
    ) {
        let table = base.join("pagination");
        let has = match pagination.map(|p| &p.style) {
            Some(PageStyle::Cursor { .. }) => return,
            Some(PageStyle::NextUrl { .. }) => "style = \"next_url\": it has no cursor",
            Some(PageStyle::Link) => "style = \"link\": it has no cursor",
            Some(PageStyle::Page { .. }) => "style = \"page\": it counts pages, it has no cursor",
            None => "no table at all",
        };
        let msg = format!(
            "{{cursor}} has no value: it is the cursor of {table} style = \"cursor\" (cursor or cursor_record), and {table} has {has}"
        );
        self.error(src, at, msg);
    }

    /// `[NAME.pagination]`: the style, the fields it needs (and none of
    /// the others'), `more` or `last`, `max_pages` and `continue`.
    /// `cursor_in_request`: the request places the cursor itself
    /// (`{cursor}`), so `param` may be left out.
    fn pagination(
        &mut self,
        src: &Source,
        base: &FieldPath,
        p: &RawPagination,
        cursor_in_request: bool,
    ) -> Option<Pagination> {
        // An unknown style is one error, not one more per field it lacks.
        let style = match p.style.as_deref() {
            None => d::PAGE_STYLE,
            Some(written) => self.pick(src, &base.join("style"), written)?,
        };
        let (word, uses): (&str, &[&str]) = match style {
            PageStyleName::Cursor => ("cursor", &["cursor", "cursor_record", "param"]),
            PageStyleName::NextUrl => ("next_url", &["next"]),
            PageStyleName::Link => ("link", &[]),
            PageStyleName::Page => ("page", &["param", "start", "step"]),
        };
        let written = [
            ("cursor", p.cursor.is_some()),
            ("cursor_record", p.cursor_record.is_some()),
            ("param", p.param.is_some()),
            ("next", p.next.is_some()),
            ("start", p.start.is_some()),
            ("step", p.step.is_some()),
        ];
        for (field, _) in written.iter().filter(|(f, set)| *set && !uses.contains(f)) {
            let msg = format!(
                "style = {word:?} has no {field} (it uses: {})",
                fields(uses)
            );
            self.error(src, &base.join(*field), msg);
        }
        let style = match style {
            PageStyleName::Cursor => PageStyle::Cursor {
                cursor: self.cursor_at(src, base, p),
                // The request may place the cursor itself.
                param: match p.param.as_deref() {
                    None if cursor_in_request => None,
                    written => Some(self.param(src, base, written, "the cursor")),
                },
            },
            PageStyleName::NextUrl => PageStyle::NextUrl {
                next: self.required_pointer(src, base, "next", p.next.as_deref(), "/paging/next"),
            },
            PageStyleName::Link => PageStyle::Link,
            PageStyleName::Page => PageStyle::Page {
                param: self.param(src, base, p.param.as_deref(), "the page number"),
                start: p.start.unwrap_or(d::PAGE_START),
                step: match p.step {
                    Some(0) => {
                        self.error(src, &base.join("step"), "must be at least 1");
                        d::PAGE_STEP
                    }
                    step => step.unwrap_or(d::PAGE_STEP),
                },
            },
        };
        let Some(max_pages) = NonZeroU32::new(p.max_pages) else {
            self.error(src, &base.join("max_pages"), "must be at least 1");
            return None;
        };
        let flag = self.page_flag(src, base, p);
        Some(Pagination {
            style,
            max_pages,
            continues: p.continues.unwrap_or(d::PAGE_CONTINUE),
            flag,
        })
    }

    /// `cursor` or `cursor_record`: exactly one.
    fn cursor_at(&mut self, src: &Source, base: &FieldPath, p: &RawPagination) -> CursorAt {
        match (&p.cursor, &p.cursor_record) {
            (Some(_), Some(_)) => {
                let msg = "cursor and cursor_record cannot both be written: the cursor is in the answer (cursor) or in its last record (cursor_record)";
                self.error(src, &base.join("cursor_record"), msg);
                CursorAt::Answer(String::new())
            }
            (None, Some(ptr)) => {
                self.check_pointer(src, &base.join("cursor_record"), ptr, true, "/id");
                CursorAt::LastRecord(ptr.clone())
            }
            (Some(ptr), None) => CursorAt::Answer(self.required_pointer(
                src,
                base,
                "cursor",
                Some(ptr),
                "/nextPageToken",
            )),
            (None, None) => {
                let msg = "missing: a JSON pointer like \"/nextPageToken\", or cursor_record = \"/id\" for the id of the page's last record (Stripe)";
                self.error(src, &base.join("cursor"), msg);
                CursorAt::Answer(String::new())
            }
        }
    }

    /// `more` or `last`: at most one, a JSON pointer.
    fn page_flag(&mut self, src: &Source, base: &FieldPath, p: &RawPagination) -> Option<PageFlag> {
        match (&p.more, &p.last) {
            (Some(_), Some(_)) => {
                let msg = "more and last cannot both be written: more = true says another page follows, last = true says none does; write the one the upstream sends";
                self.error(src, &base.join("last"), msg);
                None
            }
            (Some(ptr), None) => {
                self.check_pointer(src, &base.join("more"), ptr, true, "/has_more");
                Some(PageFlag::More(ptr.clone()))
            }
            (None, Some(ptr)) => {
                self.check_pointer(src, &base.join("last"), ptr, true, "/isLast");
                Some(PageFlag::Last(ptr.clone()))
            }
            (None, None) => None,
        }
    }

    /// A pagination field holding a JSON pointer that the style needs.
    fn required_pointer(
        &mut self,
        src: &Source,
        base: &FieldPath,
        field: &str,
        written: Option<&str>,
        example: &str,
    ) -> String {
        match written {
            Some(ptr) => {
                self.check_pointer(src, &base.join(field), ptr, true, example);
                ptr.to_owned()
            }
            None => {
                let msg = format!("missing: a JSON pointer like {example:?}");
                self.error(src, &base.join(field), msg);
                String::new()
            }
        }
    }

    /// `param`: the query parameter that carries `what`.
    fn param(
        &mut self,
        src: &Source,
        base: &FieldPath,
        written: Option<&str>,
        what: &str,
    ) -> String {
        match written {
            Some(p) if !p.is_empty() => p.to_owned(),
            _ => {
                let msg = format!("must name the query parameter that carries {what}");
                self.error(src, &base.join("param"), msg);
                String::new()
            }
        }
    }

    /// `retry = { attempts, backoff, max_backoff }`, each defaulted alone.
    fn retry(&mut self, src: &Source, base: &FieldPath, raw: Option<&RawRetry>) -> Retry {
        let Some(r) = raw else {
            return Retry::default();
        };
        let attempts = r.attempts.map_or(Some(d::RETRY_ATTEMPTS), NonZeroU32::new);
        let attempts = attempts.unwrap_or_else(|| {
            self.error(src, &base.join("attempts"), "must be at least 1");
            d::RETRY_ATTEMPTS
        });
        Retry {
            attempts,
            backoff: r.backoff.map_or(d::RETRY_BACKOFF, |b| b.0),
            max_backoff: r.max_backoff.map_or(d::RETRY_MAX_BACKOFF, |b| b.0),
        }
    }
}

/// `a`, `a and b`, `a, b and c`, or `nothing else`.
fn fields(names: &[&str]) -> String {
    match names {
        [] => "nothing else".into(),
        [one] => (*one).into(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}
