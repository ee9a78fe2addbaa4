//! A scheduled ingestion (`[[jobs]]`): its schedule, its items and where
//! they come from, its request template, pagination, sink and retries.

use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono_tz::Tz;

use super::{Location, OnQuotaExhausted, PgTarget, Reserve, Template, defaults};

/// When a job fires by itself.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// A cron expression, seconds first (boxed: it is large, and a job
    /// is read far more often than built).
    Cron(Box<cron::Schedule>),
    /// `schedule = "manual"`: never by itself; `quota-worker trigger` runs it.
    Manual,
}

impl Schedule {
    /// What `schedule` says for a job that only `trigger` runs.
    pub const MANUAL: &'static str = "manual";

    /// The cron schedule; `None` for a manual job.
    pub fn cron(&self) -> Option<&cron::Schedule> {
        match self {
            Schedule::Cron(c) => Some(c),
            Schedule::Manual => None,
        }
    }

    /// Whether only `trigger` runs the job.
    pub fn is_manual(&self) -> bool {
        matches!(self, Schedule::Manual)
    }
}

/// As written: the cron expression, or "manual".
impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Cron(c) => f.write_str(c.source()),
            Schedule::Manual => f.write_str(Self::MANUAL),
        }
    }
}

/// A scheduled ingestion.
#[derive(Debug, Clone)]
pub struct Job {
    /// Its name.
    pub name: String,
    /// The file it is defined in.
    pub file: PathBuf,
    /// When it fires by itself: a cron schedule, or never (`"manual"`).
    pub schedule: Schedule,
    /// The time zone the schedule is read in.
    pub timezone: Tz,
    /// The endpoint each request spends from.
    pub endpoint: String,
    /// Fan-out keys and their values; a tick is one task per combination.
    pub fan_out: Vec<(String, Vec<String>)>,
    /// `[job.fan_out_from]`: items read from data at every tick, combined
    /// with `fan_out` as a cartesian product.
    pub fan_out_from: Option<FanOutFrom>,
    /// Stop or defer on a rejected spend.
    pub on_quota_exhausted: OnQuotaExhausted,
    /// The request template.
    pub request: RequestTemplate,
    /// Pagination, if the endpoint pages.
    pub pagination: Option<Pagination>,
    /// Where records go.
    pub sink: SinkConfig,
    /// Retries of real failures.
    pub retry: Retry,
    /// The share of every window its spends leave free (`reserve = "20%"`).
    pub reserve: Reserve,
    /// `{since}` before the item's first run that ended `done`: now minus this.
    pub since_initial: Duration,
}

impl Job {
    /// Whether a task the quota stopped is sent again to run at its
    /// retry-after (`on_quota_exhausted = "defer"`).
    pub fn defers(&self) -> bool {
        self.on_quota_exhausted == OnQuotaExhausted::Defer
    }

    /// Number of tasks per tick: the product of the fan-out list lengths,
    /// times the rows of `fan_out_from` (as last counted, else `max_items`:
    /// the most a tick can fan out).
    pub fn items(&self) -> u64 {
        let rows = self
            .fan_out_from
            .as_ref()
            .map_or(1, |f| f.rows.unwrap_or(f.max_items.get()));
        self.combinations().saturating_mul(rows)
    }

    /// Combinations of the static `fan_out` lists (1 without any).
    pub fn combinations(&self) -> u64 {
        self.fan_out
            .iter()
            .map(|(_, v)| v.len() as u64)
            .fold(1, u64::saturating_mul)
    }

    /// Pages fetched per task at most.
    pub fn max_pages(&self) -> u32 {
        self.pagination.as_ref().map_or(1, |p| p.max_pages.get())
    }
}

/// One fan-out item: placeholder name → value (`[("region", "US")]`), a
/// `fan_out_from` row's columns first. A task carries one
/// (`queue::TaskArgs::item`); it fills the job's request and sink
/// templates.
pub type Item = Vec<(String, String)>;

/// `[job.fan_out_from]`: where a job's items come from at every tick.
#[derive(Debug, Clone)]
pub struct FanOutFrom {
    /// The file, and for SQLite the query.
    pub source: DataSource,
    /// The placeholders each row fills, in column order: the CSV header or
    /// the query's result columns, as read at load (or as declared with
    /// `columns` when the source did not exist yet).
    pub columns: Vec<String>,
    /// More rows than this and a tick fans out nothing.
    pub max_items: NonZeroU64,
    /// The rows counted when the source was last read (`check` fills it in
    /// for its report); `None`: not counted.
    pub rows: Option<u64>,
}

/// A `fan_out_from` source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// `csv = "channels.csv"`: the header row names the columns.
    Csv {
        /// Resolved against the config file's directory.
        path: PathBuf,
    },
    /// `sqlite = "…db"` with one read-only `query`.
    Sqlite {
        /// Resolved against the config file's directory.
        path: PathBuf,
        /// One read-only statement.
        query: String,
    },
    /// `postgres = "postgres://…"` with one read-only `query`, run in a
    /// read-only transaction.
    Postgres {
        /// The server (boxed: it is much larger than a path).
        target: Box<PgTarget>,
        /// One read-only statement.
        query: String,
    },
}

impl DataSource {
    /// What errors name it by: the file, or the server's URL.
    pub fn path(&self) -> &Path {
        match self {
            DataSource::Csv { path } | DataSource::Sqlite { path, .. } => path,
            DataSource::Postgres { target, .. } => Path::new(&target.url),
        }
    }
}

/// An HTTP method the request template may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
}

impl Method {
    /// As written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

/// `[job.request]`.
#[derive(Debug, Clone)]
pub struct RequestTemplate {
    /// Method.
    pub method: Method,
    /// URL template.
    pub url: Template,
    /// Query parameters (values are templates).
    pub query: Vec<(String, Template)>,
    /// Headers (values are templates).
    pub headers: Vec<(String, Template)>,
    /// Body template.
    pub body: Option<Template>,
    /// Whether `body` is JSON (a JSON `Content-Type`, or a body that
    /// starts with `{` or `[`): each placeholder's value goes in
    /// JSON-string-escaped, so no value changes the JSON's structure.
    pub body_is_json: bool,
    /// `graphql = { query, variables }` (instead of `body`): the body is
    /// built by a JSON encoder, `{"query": ..., "variables": {...}}`.
    pub graphql: Option<Graphql>,
}

/// `[job.request] graphql`: a GraphQL query and its variables.
#[derive(Debug, Clone)]
pub struct Graphql {
    /// The query, sent as written: it holds no placeholders (values go in
    /// as variables, so none can change the query's structure).
    pub query: String,
    /// The variables, in config order.
    pub variables: Vec<(String, Variable)>,
}

/// One GraphQL variable's value.
#[derive(Debug, Clone)]
pub enum Variable {
    /// Exactly `"{cursor}"`: `null` on a run's first page, the cursor (a
    /// JSON string) after it.
    Cursor,
    /// A template, rendered with the usual placeholders and sent as a JSON
    /// string.
    Text(Template),
}

/// `[job.pagination]`.
#[derive(Debug, Clone)]
pub struct Pagination {
    /// Where the next page is.
    pub style: PageStyle,
    /// Pages per run, a resumed run included.
    pub max_pages: NonZeroU32,
    /// `continue`: a run that stops at `max_pages` with pages left leaves a
    /// checkpoint, and the item's next run goes on from there instead of
    /// starting again at page 1.
    pub continues: bool,
    /// `more` or `last`: a flag in the answer that says whether another
    /// page follows (any style); the run ends on it without requesting one
    /// more page.
    pub flag: Option<PageFlag>,
}

impl Pagination {
    /// Whether its pages carry a cursor (`style = "cursor"`): the one
    /// pagination that gives `{cursor}` a value.
    pub fn has_cursor(&self) -> bool {
        matches!(self.style, PageStyle::Cursor { .. })
    }
}

/// `[job.pagination] more` / `last`: where the answer says whether another
/// page follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageFlag {
    /// `more = "/pointer"`: `true` there means another page follows;
    /// `false`, `null` or nothing ends the run (GraphQL's
    /// `pageInfo.hasNextPage`, Stripe's and Notion's `has_more`).
    More(String),
    /// `last = "/pointer"`: `true` there ends the run (Jira's `isLast`).
    Last(String),
}

/// Where a `style = "cursor"` answer's cursor is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CursorAt {
    /// `cursor = "/pointer"`: at this JSON pointer in the answer.
    Answer(String),
    /// `cursor_record = "/pointer"`: at this JSON pointer inside the
    /// page's last record (Stripe's `starting_after`); an empty records
    /// array ends the run.
    LastRecord(String),
}

/// `[job.pagination] style` and the fields that go with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageStyle {
    /// `"cursor"`: the string or number at `cursor` (a JSON pointer), or
    /// at `cursor_record` in the page's last record, is sent as the query
    /// parameter `param` and is the value of `{cursor}`.
    Cursor {
        /// Where the next page's cursor is in a response.
        cursor: CursorAt,
        /// Query parameter that carries it (none: the request places it
        /// with `{cursor}`).
        param: Option<String>,
    },
    /// `"next_url"`: the URL at `next` (a JSON pointer) replaces the request's
    /// URL and query.
    NextUrl {
        /// JSON pointer to the next page's URL in a response.
        next: String,
    },
    /// `"link"`: the `Link` header's `rel="next"` target replaces the
    /// request's URL and query (RFC 8288).
    Link,
    /// `"page"`: `param` = `start`, `start + step`, ...; the first page whose
    /// records array is empty is the last.
    Page {
        /// Query parameter that carries the number.
        param: String,
        /// The first page's number (or offset).
        start: u64,
        /// What each page adds to it.
        step: u64,
    },
}

/// `[job.sink]`.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// jsonl, sqlite or postgres.
    pub kind: SinkKind,
    /// Path template, relative to the config directory (empty for a
    /// postgres sink, which has none).
    pub path: Template,
    /// Where `path` (`url` for postgres) is written, for errors found at
    /// start (an unwritable sink directory, a table of other columns).
    pub at: Location,
    /// postgres: the server and the table.
    pub postgres: Option<PgSink>,
    /// JSON pointer to the array of records ("" = the whole body).
    pub records: String,
    /// sqlite, postgres: JSON pointers of the fields the full-text index
    /// covers.
    pub search: Vec<String>,
    /// sqlite, postgres: JSON pointer of a record's unique id (re-fetches
    /// replace it).
    pub key: Option<String>,
}

/// Sink kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkKind {
    /// One JSON object per line.
    Jsonl,
    /// SQLite with an FTS5 index.
    Sqlite,
    /// A PostgreSQL table, with a `tsvector` column for `search`.
    Postgres,
}

/// A postgres sink's server and table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgSink {
    /// The server.
    pub target: PgTarget,
    /// The table: `[name]` or `[schema, name]`, each quoted as written
    /// (the job's name when `table` is not written).
    pub table: Vec<String>,
}

impl PgSink {
    /// The table as SQL: each part a quoted identifier.
    pub fn table_sql(&self) -> String {
        let quoted: Vec<String> = self
            .table
            .iter()
            .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
            .collect();
        quoted.join(".")
    }

    /// The table as written (`ingest.trending`).
    pub fn table_name(&self) -> String {
        self.table.join(".")
    }
}

/// Bounded retries with exponential backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all (the first included).
    pub attempts: NonZeroU32,
    /// Wait before the first retry; doubles each time.
    pub backoff: Duration,
    /// Cap on the wait.
    pub max_backoff: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: defaults::RETRY_ATTEMPTS,
            backoff: defaults::RETRY_BACKOFF,
            max_backoff: defaults::RETRY_MAX_BACKOFF,
        }
    }
}

impl Retry {
    /// The wait before retry number `failures` (1 = first retry).
    pub fn backoff_for(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let r = Retry {
            attempts: NonZeroU32::new(5).unwrap(),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
        };
        let waits: Vec<_> = (1..=5).map(|n| r.backoff_for(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
    }
}
