//! The postgres sink: a table per job (or per `table`), each page written in
//! one transaction, exactly once; a generated `tsvector` column with a GIN
//! index for `search`; and the search that reads it. The layout is
//! documented for users in docs/jobs.md ("The PostgreSQL layout"); keep the
//! two in step. The table's layout is made sure of in `schema`, searched
//! in `search`; this file writes pages.
//!
//! # Each page once
//!
//! Every row carries its page's id (`job:tick:page:item`, the same when a
//! retried or resumed task fetches that page again, and when a spooled page
//! is replayed). A page's transaction first takes a transaction-scoped
//! advisory lock on the id, then looks for a row with it: if there is one,
//! the page was written before (its rows commit together, so it is all
//! there) and the transaction adds nothing. The lock makes two writers of
//! one page (a replay racing a retry) take turns, so the second sees the
//! first's rows. With `key`, rows are also upserted by `(item, key)` — a
//! record seen again on a later page replaces its row unless that row was
//! fetched later (a late replay never rolls a row back).

mod schema;
mod search;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use super::record::{PageRef, item_column, keyed_rows, warn_missing_keys};
use super::{SinkError, storable};
use crate::config::{Item, Job, PgSink};
use crate::pg::{self, PgError, ident};
pub(crate) use schema::log_tables;
use schema::{KEY_CONFLICT, ensure};
pub use schema::{TableState, check_tables};
pub use search::find;

/// How long one page's transaction may take before the page is spooled
/// (a server that stopped answering must not hold a task for ever).
const PAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// The text search configuration of the `search` column and of queries:
/// words as written, lower-cased, no stemming and no stop words (as the
/// SQLite sink's index), whatever language the records are in.
const TS_CONFIG: &str = "simple";

/// What a job's table must look like.
pub(super) struct TableSpec<'a> {
    pub(super) sink: &'a PgSink,
    /// Upserted by `(item, key)`.
    pub(super) keyed: bool,
    /// `search`'s JSON pointers.
    pub(super) search: &'a [String],
}

impl TableSpec<'_> {
    /// The spec of `job`'s sink, if it is a postgres one.
    pub(super) fn of(job: &Job) -> Option<TableSpec<'_>> {
        let sink = job.sink.postgres.as_ref()?;
        Some(TableSpec {
            sink,
            keyed: job.sink.key.is_some(),
            search: &job.sink.search,
        })
    }

    /// Identifies the layout, to make sure of it once per process.
    fn ready_key(&self) -> String {
        format!(
            "{}\0{}\0{}\0{:?}",
            self.sink.target.url,
            self.sink.table_sql(),
            self.keyed,
            self.search
        )
    }

    fn table(&self) -> String {
        self.sink.table_sql()
    }

    /// An index name, unquoted: the table's own name and a suffix, at most
    /// 63 bytes.
    fn index_name(&self, suffix: &str) -> String {
        let base = self.sink.table.last().map_or("", String::as_str);
        let mut name = format!("{base}_{suffix}");
        while name.len() > 63 {
            let cut = base.len().min(name.len() - 63);
            let mut end = base.len() - cut;
            while !base.is_char_boundary(end) {
                end -= 1;
            }
            name = format!("{}_{suffix}", &base[..end]);
            if cut == 0 {
                break;
            }
        }
        name
    }

    /// An index name, quoted for SQL (in the table's schema, as
    /// `CREATE INDEX` puts it).
    fn index(&self, suffix: &str) -> String {
        ident(&self.index_name(suffix))
    }

    /// An index of the table, schema-qualified as SQL, for `DROP INDEX`.
    fn qualified_index(&self, suffix: &str) -> String {
        let mut parts: Vec<String> = self.sink.table[..self.sink.table.len().saturating_sub(1)]
            .iter()
            .map(|p| ident(p))
            .collect();
        parts.push(self.index(suffix));
        parts.join(".")
    }
}

/// One page, encoded for PostgreSQL.
pub(super) struct PageRows {
    /// The item, as JSON with sorted keys.
    pub(super) item: String,
    /// `job:tick:page:item`.
    pub(super) page_id: String,
    pub(super) fetched_at: DateTime<Utc>,
    /// Each record's key (`None` without `key`, or when the record has no
    /// value there).
    pub(super) keys: Vec<Option<String>>,
    /// Each record, as JSON text.
    pub(super) records: Vec<String>,
}

/// The postgres sinks of one process: a pool per server, and the tables
/// whose layout it has made sure of.
#[derive(Debug, Default)]
pub(super) struct PgSinks {
    pools: pg::Pools,
    /// Connections per server at most: the tasks that can write at once.
    pool_size: usize,
    /// [`TableSpec::ready_key`]s made sure of.
    ready: Mutex<HashSet<String>>,
}

impl PgSinks {
    pub(super) fn new(pool_size: usize) -> Self {
        PgSinks {
            pool_size,
            ..PgSinks::default()
        }
    }

    /// Writes one page in one transaction; returns the rows it added or
    /// replaced (0 for a page written before).
    pub(super) async fn write(
        &self,
        spec: &TableSpec<'_>,
        page: &PageRows,
    ) -> Result<usize, PgError> {
        let target = &spec.sink.target;
        match tokio::time::timeout(PAGE_TIMEOUT, self.write_page(spec, page)).await {
            Ok(done) => done,
            Err(_) => Err(PgError::timeout(
                target,
                "a page's transaction",
                PAGE_TIMEOUT,
            )),
        }
    }

    async fn write_page(&self, spec: &TableSpec<'_>, page: &PageRows) -> Result<usize, PgError> {
        let target = &spec.sink.target;
        let q = |e: tokio_postgres::Error| PgError::query(target, &e);
        let mut conn = self.pools.get(target, self.pool_size.max(1)).await?;
        let ready_key = spec.ready_key();
        if !self
            .ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ready_key)
        {
            ensure(&mut conn, spec).await?;
            self.ready
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ready_key);
        }
        let t = spec.table();
        let upsert = if spec.keyed {
            format!(
                " ON CONFLICT {KEY_CONFLICT} DO UPDATE SET page_id = excluded.page_id,
                   fetched_at = excluded.fetched_at, record = excluded.record
                 WHERE excluded.fetched_at >= {t}.fetched_at"
            )
        } else {
            String::new()
        };
        // One statement adds the page unless a row of it is there, and says
        // whether one was (the outer EXISTS sees the statement's snapshot,
        // from before the insert). Its snapshot is taken when it starts,
        // after the lock statement before it has returned: a writer of the
        // same page that held the lock has committed by then.
        let lock = conn
            .prepare_cached("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .await
            .map_err(q)?;
        let insert = conn
            .prepare_cached(&format!(
                "WITH added AS (
                   INSERT INTO {t} (item, key, page_id, fetched_at, record)
                   SELECT $1, u.k, $2, $3, u.r::jsonb FROM unnest($4::text[], $5::text[]) AS u(k, r)
                   WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE page_id = $2){upsert}
                   RETURNING 1
                 )
                 SELECT (SELECT count(*) FROM added), EXISTS (SELECT 1 FROM {t} WHERE page_id = $2)"
            ))
            .await
            .map_err(q)?;
        let tx = conn.transaction().await.map_err(q)?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &page.item,
            &page.page_id,
            &page.fetched_at,
            &page.keys,
            &page.records,
        ];
        // Sent together (tokio-postgres pipelines requests polled at once,
        // in the order they are first polled): one round trip for both.
        let lock_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&page.page_id];
        let (_, row) = futures::try_join!(
            tx.execute(&lock, &lock_params),
            tx.query_one(&insert, &params)
        )
        .map_err(q)?;
        let (added, before): (i64, bool) = (row.get(0), row.get(1));
        if before {
            tracing::info!(page_id = %page.page_id, table = %spec.sink.table_name(),
                "this page was written before: nothing added");
        }
        let n = added;
        tx.commit().await.map_err(q)?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }
}

/// Writes `records` of `job`'s `item` as one page (`at`; `None` for a page
/// spooled by a version that did not keep it), exactly once, through `pg`'s
/// pool for the sink's server; how many rows were written.
pub(super) async fn write(
    pg: &PgSinks,
    job: &Job,
    item: &Item,
    at: Option<PageRef>,
    records: &[Value],
    fetched_at: DateTime<Utc>,
) -> Result<usize, SinkError> {
    let Some(spec) = TableSpec::of(job) else {
        return Ok(0);
    };
    let item = item_column(item);
    let page_id = match at {
        Some(at) => page_id(&job.name, at.tick, at.page, &item),
        // The fetch time stands in for the page: the same at every
        // replay of that spooled page.
        None => format!(
            "{}:at:{}:{item}",
            job.name,
            fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true)
        ),
    };
    // What PostgreSQL cannot hold (U+0000, numbers past numeric's
    // range) is rewritten here, in this sink only (storable.rs).
    let mut altered = Vec::new();
    let fixed: Vec<std::borrow::Cow<'_, Value>> = records
        .iter()
        .map(|r| match storable::storable(r) {
            Some((v, a)) => {
                altered.push(a);
                std::borrow::Cow::Owned(v)
            }
            None => std::borrow::Cow::Borrowed(r),
        })
        .collect();
    let (rows, missing_keys) = keyed_rows(job, fixed.iter().map(|r| r.as_ref()))?;
    warn_missing_keys(job, missing_keys);
    let page = page_rows(item, page_id, fetched_at, spec.keyed, rows);
    let written = pg
        .write(&spec, &page)
        .await
        .map_err(|e| SinkError::Postgres(Box::new(e)))?;
    count_altered(job, &altered);
    Ok(written)
}

/// Counts and logs the records a sink wrote altered (once per page written).
fn count_altered(job: &Job, altered: &[storable::Altered]) {
    if altered.is_empty() {
        return;
    }
    let mut by_reason: Vec<(&'static str, u64)> = Vec::new();
    for reason in altered.iter().flat_map(|a| a.reasons()) {
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            None => by_reason.push((reason, 1)),
        }
    }
    for (reason, n) in &by_reason {
        metrics::counter!("qw_records_altered_total", "qw_job" => job.name.clone(), "reason" => *reason)
            .increment(*n);
    }
    tracing::info!(job = %job.name, altered = ?by_reason,
        "records held what PostgreSQL cannot store (U+0000 written as U+FFFD; numbers past numeric's range written as strings)");
}

/// One page's rows: with `keyed`, one per key (the last of a key on the
/// page wins: one statement may not touch a row twice).
pub(super) fn page_rows(
    item: String,
    page_id: String,
    fetched_at: DateTime<Utc>,
    keyed: bool,
    rows: Vec<(Option<String>, String)>,
) -> PageRows {
    let rows = if keyed {
        let mut last: HashMap<&str, usize> = HashMap::new();
        for (i, (k, _)) in rows.iter().enumerate() {
            if let Some(k) = k {
                last.insert(k, i);
            }
        }
        let keep: Vec<bool> = (rows.iter().enumerate())
            .map(|(i, (k, _))| k.as_deref().is_none_or(|k| last[k] == i))
            .collect();
        rows.into_iter()
            .zip(keep)
            .filter_map(|(r, keep)| keep.then_some(r))
            .collect()
    } else {
        rows
    };
    let (keys, records) = rows.into_iter().unzip();
    PageRows {
        item,
        page_id,
        fetched_at,
        keys,
        records,
    }
}

/// A page's id: the same for every fetch of that page of that run.
pub(super) fn page_id(job: &str, tick: i64, page: u32, item: &str) -> String {
    format!("{job}:{tick}:{page}:{item}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_keeps_the_last_record_of_each_key() {
        let rows = vec![
            (Some("a".into()), "1".into()),
            (None, "2".into()),
            (Some("b".into()), "3".into()),
            (Some("a".into()), "4".into()),
            (None, "5".into()),
        ];
        let p = page_rows("{}".into(), "p".into(), Utc::now(), true, rows.clone());
        assert_eq!(p.records, ["2", "3", "4", "5"]);
        assert_eq!(p.keys, [None, Some("b".into()), Some("a".into()), None]);
        let p = page_rows("{}".into(), "p".into(), Utc::now(), false, rows);
        assert_eq!(p.records.len(), 5);
    }

    #[test]
    fn page_ids_name_job_tick_page_and_item() {
        assert_eq!(
            page_id("trending", 1_700_000_000_000, 3, r#"{"region":"US"}"#),
            r#"trending:1700000000000:3:{"region":"US"}"#
        );
    }
}
