//! `quota-worker search JOB QUERY [--limit N] [--json]`: full-text search
//! over the records a job stored in its SQLite sink (every database file its
//! path template has made) or its PostgreSQL table, best matches first. It
//! reads the sink only: a search never spends quota, and needs neither
//! Redis nor the daemon.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::{Exit, out, outln};
use crate::config::{Config, SinkKind};
use crate::sink::{self, Hit, SinkError};

/// Runs the command.
pub async fn run(config: &Config, job: &str, query: &str, limit: usize, as_json: bool) -> Exit {
    let Some(job) = config.jobs.get(job) else {
        let known: Vec<&str> = config.jobs.keys().map(String::as_str).collect();
        eprintln!(
            "error: unknown job {job:?}; known jobs: {}",
            if known.is_empty() {
                "(none configured)".to_owned()
            } else {
                known.join(", ")
            }
        );
        return Exit::Usage;
    };
    if job.sink.kind == SinkKind::Jsonl {
        eprintln!(
            "error: job {} writes JSON lines ({}); search reads sinks with kind = \"sqlite\" or \"postgres\" and `search` fields",
            job.name, job.sink.path
        );
        return Exit::Usage;
    }
    if job.sink.search.is_empty() {
        eprintln!(
            "warning: job {} indexes no fields (its sink has no `search`): nothing can match",
            job.name
        );
    }
    if let Some(pg) = &job.sink.postgres {
        return postgres(job, pg, query, limit, as_json).await;
    }
    // As the file system names them (issue 24, item 9: `config/../data/…`
    // read as a path no one wrote); a file that went away keeps its name.
    let dbs: Vec<PathBuf> = (sink::databases(config, job).into_iter())
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect();
    if dbs.is_empty() {
        eprintln!(
            "note: job {} has stored nothing yet (no file matches {})",
            job.name,
            config.dir.join(job.sink.path.source()).display()
        );
    }
    let mut hits: Vec<(PathBuf, Hit)> = Vec::new();
    for db in &dbs {
        match sink::find(db, &job.name, query, limit) {
            Ok(found) => hits.extend(found.into_iter().map(|h| (db.clone(), h))),
            // A file of the template's shape that holds no table of this job.
            Err(SinkError::NoIndex { .. }) => {}
            Err(e) => {
                eprintln!("error: {e}");
                return Exit::IoErr;
            }
        }
    }
    // bm25 ranks from different files are close enough to merge on.
    hits.sort_by(|a, b| a.1.rank.total_cmp(&b.1.rank));
    hits.truncate(limit);
    if as_json {
        outln!("{}", as_json_value(&job.name, query, &dbs, &hits));
    } else {
        out!("{}", as_text(&job.name, query, &hits));
    }
    Exit::Ok
}

/// `search` over a postgres sink's table.
async fn postgres(
    job: &crate::config::Job,
    pg: &crate::config::PgSink,
    query: &str,
    limit: usize,
    as_json: bool,
) -> Exit {
    let hits = match sink::find_postgres(job, query, limit).await {
        Ok(h) => h,
        Err(e @ SinkError::NoIndex { .. }) if job.sink.search.is_empty() => {
            eprintln!("note: {e}");
            Vec::new()
        }
        Err(e) => {
            eprintln!("error: {e}");
            return match &e {
                SinkError::Postgres(pg) if pg.is_unreachable() => Exit::Unavailable,
                _ => Exit::IoErr,
            };
        }
    };
    // Where the rows are, as the SQLite results name their file.
    let at = PathBuf::from(format!("{} table {}", pg.target, pg.table_name()));
    let hits: Vec<(PathBuf, Hit)> = hits.into_iter().map(|h| (at.clone(), h)).collect();
    if as_json {
        outln!("{}", as_json_value(&job.name, query, &[at], &hits));
    } else {
        out!("{}", as_text(&job.name, query, &hits));
    }
    Exit::Ok
}

fn as_json_value(job: &str, query: &str, dbs: &[PathBuf], hits: &[(PathBuf, Hit)]) -> Value {
    let results: Vec<Value> = hits
        .iter()
        .map(|(db, h)| {
            json!({
                "item": h.item,
                "key": h.key,
                "fetched_at": h.fetched_at,
                "snippet": h.snippet,
                "database": db,
                "record": h.record,
            })
        })
        .collect();
    json!({"job": job, "query": query, "databases": dbs, "results": results})
}

fn as_text(job: &str, query: &str, hits: &[(PathBuf, Hit)]) -> String {
    let mut out = format!("{} result(s) for {query:?} in job {job}\n", hits.len());
    for (i, (_, h)) in hits.iter().enumerate() {
        let item = match &h.item {
            Value::Object(m) if !m.is_empty() => m
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{k}={}",
                        v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                    )
                })
                .collect::<Vec<_>>()
                .join(","),
            _ => "-".to_owned(),
        };
        let key = h
            .key
            .as_deref()
            .map(|k| format!("  key {k}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "{:>3}. {item}{key}  fetched {}\n",
            i + 1,
            h.fetched_at
        ));
        let snippet = h.snippet.replace('\n', " · ");
        out.push_str(&format!("     {snippet}\n"));
    }
    out
}
