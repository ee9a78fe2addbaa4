//! Full-text search over a postgres sink's table (`quota-worker search`
//! for a job whose sink is postgres): its generated `search` column, read
//! with `websearch_to_tsquery`.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use super::schema::columns;
use super::{TS_CONFIG, TableSpec};
use crate::config::Job;
use crate::pg::{self, PgError};
use crate::sink::error::SinkError;
use crate::sink::record::{Hit, search_text};

/// Full-text search over `job`'s postgres table: the best `limit` rows
/// whose `search` column matches `query` (`websearch_to_tsquery`: words,
/// "quoted phrases", `or`, `-word`), best first (`ts_rank`, negated so that
/// lower is better, as SQLite's bm25), with a snippet of the matching text
/// (matches in `[...]`).
pub async fn find(job: &Job, query: &str, limit: usize) -> Result<Vec<Hit>, SinkError> {
    let Some(spec) = TableSpec::of(job) else {
        return Ok(Vec::new());
    };
    let target = &spec.sink.target;
    let pg_err = |e: PgError| SinkError::Postgres(Box::new(e));
    let q = |e: tokio_postgres::Error| pg_err(PgError::query(target, &e));
    let conn = pg::connect(target).await.map_err(pg_err)?;
    let t = spec.table();
    let has_search = columns(&conn, &t)
        .await
        .map_err(q)?
        .is_some_and(|cols| cols.iter().any(|c| c.name == "search"));
    if !has_search {
        return Err(SinkError::NoIndex {
            path: std::path::PathBuf::from(format!("{} table {}", target, spec.sink.table_name())),
            job: job.name.clone(),
        });
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = conn
        .query(
            &format!(
                "SELECT item, key, fetched_at, record::text, ts_rank(search, q) AS rank
                 FROM {t}, websearch_to_tsquery('{TS_CONFIG}', $1) AS q
                 WHERE search @@ q ORDER BY rank DESC, fetched_at DESC LIMIT $2"
            ),
            &[&query, &limit],
        )
        .await
        .map_err(q)?;
    let mut hits = Vec::new();
    let mut texts = Vec::new();
    for r in &rows {
        let item: String = r.get(0);
        let record: String = r.get(3);
        let fetched_at: DateTime<Utc> = r.get(2);
        let rank: f32 = r.get(4);
        let (Ok(item), Ok(record)) = (
            serde_json::from_str::<Value>(&item),
            serde_json::from_str::<Value>(&record),
        ) else {
            tracing::warn!(table = %spec.sink.table_name(), "stored record or item is not JSON");
            continue;
        };
        texts.push(search_text(&record, spec.search));
        hits.push(Hit {
            item,
            key: r.get(1),
            fetched_at: fetched_at.to_rfc3339_opts(SecondsFormat::Millis, true),
            snippet: String::new(),
            record,
            rank: -f64::from(rank),
        });
    }
    if !hits.is_empty() {
        let snippets = conn
            .query(
                &format!(
                    "SELECT ts_headline('{TS_CONFIG}', t, websearch_to_tsquery('{TS_CONFIG}', $1),
                       'StartSel=[, StopSel=], MaxWords=20, MinWords=6, MaxFragments=2, FragmentDelimiter=\" … \"')
                     FROM unnest($2::text[]) WITH ORDINALITY AS u(t, n) ORDER BY n"
                ),
                &[&query, &texts],
            )
            .await
            .map_err(q)?;
        for (hit, row) in hits.iter_mut().zip(&snippets) {
            hit.snippet = row.get(0);
        }
    }
    Ok(hits)
}
