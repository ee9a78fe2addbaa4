//! The postgres sink's table: made what the sink writes, or refused with
//! what differs (at `check`, at `run`'s start, and before the first page a
//! process writes to it).
//!
//! # The table
//!
//! `(item text, key text, page_id text, fetched_at timestamptz, record
//! jsonb)`, created if missing, with an index on `page_id`; with `key`, a
//! unique index on `(item, key)` (not a primary key: a record the key
//! pointer finds nothing in keeps `key` NULL, as in SQLite, and is not
//! lost); with `search`, a column `search tsvector GENERATED ALWAYS AS (…)
//! STORED` over the strings under each field, a GIN index on it, and a
//! column comment naming the fields, so a change of fields re-creates the
//! column. Every step is `IF NOT EXISTS` or checked first, under an
//! advisory lock per table, so daemons starting together and runs repeated
//! are safe. A table that exists with other columns (a missing one, another
//! type, a `NOT NULL` column without a default that rows of this sink
//! cannot fill) is refused with what differs: at `check` and at `run`'s
//! start, as a config error.

use std::collections::HashSet;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use super::{TS_CONFIG, TableSpec};
use crate::config::{Config, ConfigError, ConfigErrors, SinkKind};
use crate::pg::{self, PgError, literal};

/// How long making sure of a table's layout may take (adding the search
/// column rewrites the table).
const SCHEMA_TIMEOUT: Duration = Duration::from_secs(600);

/// How the `search` column's comment starts: the column is this sink's.
const SEARCH_MARK: &str = "quota-worker search ";

/// The columns every sink table has, with their types as `format_type`
/// prints them.
const COLUMNS: [(&str, &str); 5] = [
    ("item", "text"),
    ("key", "text"),
    ("page_id", "text"),
    ("fetched_at", "timestamp with time zone"),
    ("record", "jsonb"),
];

/// One column as the catalog has it.
#[derive(Debug, Clone)]
pub(super) struct Column {
    pub(super) name: String,
    type_name: String,
    not_null: bool,
    has_default: bool,
    generated: bool,
    comment: Option<String>,
}

/// What an existing table lacks or has in the way, for `spec`; empty when
/// this sink can write it. The `search` column is the caller's business.
fn differences(columns: &[Column]) -> Vec<String> {
    let mut out = Vec::new();
    for (name, want) in COLUMNS {
        match columns.iter().find(|c| c.name == name) {
            None => out.push(format!("has no column {name} ({want})")),
            Some(c) if c.type_name != want => out.push(format!(
                "has column {name} of type {}, not {want}",
                c.type_name
            )),
            Some(_) => {}
        }
    }
    for c in columns {
        let ours = COLUMNS.iter().any(|(n, _)| *n == c.name) || c.name == "search";
        if !ours && c.not_null && !c.has_default && !c.generated {
            out.push(format!(
                "has column {} NOT NULL without a default, which rows of this sink cannot fill",
                c.name
            ));
        }
    }
    out
}

/// The columns of `table` (quoted SQL), none when it does not exist.
pub(super) async fn columns(
    client: &impl GenericClient,
    table: &str,
) -> Result<Option<Vec<Column>>, tokio_postgres::Error> {
    let exists = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(None);
    }
    let rows = client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                    a.atthasdef, a.attgenerated <> '', col_description(a.attrelid, a.attnum)
             FROM pg_attribute a
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
             ORDER BY a.attnum",
            &[&table],
        )
        .await?;
    Ok(Some(
        rows.iter()
            .map(|r| Column {
                name: r.get(0),
                type_name: r.get(1),
                not_null: r.get(2),
                has_default: r.get(3),
                generated: r.get(4),
                comment: r.get(5),
            })
            .collect(),
    ))
}

/// The unique index a keyed sink upserts by, such that a key (or an item)
/// of any length is stored: a B-tree entry holds at most 2,704 bytes, and a
/// 10,000-character key in a plain `(item, key)` index refused its whole
/// page for good (`index row requires 11728 bytes`, SQLSTATE 54000; issue
/// 37). Each of the two is indexed by its first 300 characters (at most
/// 1,200 bytes) and a 64-bit hash of all of it (`hashtextextended`,
/// immutable): a value of up to 300 characters is compared exactly, as
/// before; two longer ones are one only when their first 300 characters and
/// their hashes are. Entries stay in item and key order, so writes keep the
/// locality of the `(item, key)` index: 0.88–0.99 × its pages per second at
/// the server, where a unique index on `md5` hashes wrote 0.73–0.97 ×
/// (BENCHMARKS.md section 16).
const KEY_INDEX_COLUMNS: &str =
    "(left(item, 300), hashtextextended(item, 0), left(key, 300), hashtextextended(key, 0))";

/// The conflict target of the upsert: [`KEY_INDEX_COLUMNS`] as `ON
/// CONFLICT` infers an expression index.
pub(super) const KEY_CONFLICT: &str = "((left(item, 300)), (hashtextextended(item, 0)), (left(key, 300)), (hashtextextended(key, 0)))";

/// Whether `table` has a unique index `ON CONFLICT` [`KEY_CONFLICT`] can
/// use: asked of the server (an `EXPLAIN` of such an insert, in a
/// savepoint), whatever its name and however its version prints it.
async fn has_key_index(
    tx: &deadpool_postgres::Transaction<'_>,
    table: &str,
) -> Result<bool, tokio_postgres::Error> {
    tx.batch_execute("SAVEPOINT quota_worker_key_index").await?;
    let asked = tx
        .batch_execute(&format!(
            "EXPLAIN INSERT INTO {table} (item, key, page_id, fetched_at, record)
             VALUES ('', '', '', now(), 'null') ON CONFLICT {KEY_CONFLICT} DO NOTHING"
        ))
        .await;
    match asked {
        Ok(()) => {
            tx.batch_execute("RELEASE SAVEPOINT quota_worker_key_index")
                .await?;
            Ok(true)
        }
        Err(e) if e.code() == Some(&SqlState::INVALID_COLUMN_REFERENCE) => {
            tx.batch_execute("ROLLBACK TO SAVEPOINT quota_worker_key_index")
                .await?;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The unique indexes of `table` without a predicate: each one's name and
/// its columns as `pg_get_indexdef` prints them (`(item, key)`).
async fn unique_indexes(
    client: &impl GenericClient,
    table: &str,
) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT c.relname::text,
                    '(' || array_to_string(ARRAY(
                      SELECT pg_get_indexdef(i.indexrelid, k, false)
                      FROM generate_series(1, i.indnkeyatts) AS k ORDER BY k), ', ') || ')'
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indpred IS NULL",
            &[&table],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The access method (`btree`, `hash`) of the table's index `name`, if it
/// has one of that name.
async fn index_method(
    client: &impl GenericClient,
    table: &str,
    name: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT am.amname::text FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam
             WHERE i.indrelid = to_regclass($1) AND c.relname = $2",
            &[&table, &name],
        )
        .await?
        .map(|r| r.get(0)))
}

/// The `search` column's comment for `fields`.
fn search_mark(fields: &[String]) -> String {
    format!(
        "{SEARCH_MARK}{}",
        serde_json::to_string(fields).unwrap_or_default()
    )
}

/// The generated column's expression: the strings under each field (in
/// arrays and objects there too), as one `tsvector`.
fn search_expr(fields: &[String]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .map(|f| {
            let path: Vec<String> = f
                .split('/')
                .skip(1)
                .map(|t| literal(&t.replace("~1", "/").replace("~0", "~")))
                .collect();
            format!(
                "jsonb_to_tsvector('{TS_CONFIG}'::regconfig, coalesce(record #> ARRAY[{}]::text[], 'null'::jsonb), '[\"string\"]'::jsonb)",
                path.join(", ")
            )
        })
        .collect();
    if parts.is_empty() {
        "''::tsvector".to_owned()
    } else {
        parts.join(" || ")
    }
}

/// What making sure of a table found and did.
#[derive(Debug, Default)]
pub(super) struct Ensured {
    /// Steps taken ("created the table", "added the search column").
    pub(super) done: Vec<String>,
}

/// Makes `spec`'s table what this sink writes: created if missing, its
/// indexes and `search` column added or re-created; refused with what
/// differs when it has other columns. One transaction, under an advisory
/// lock per table.
pub(super) async fn ensure(
    client: &mut deadpool_postgres::Object,
    spec: &TableSpec<'_>,
) -> Result<Ensured, PgError> {
    let target = &spec.sink.target;
    let q = |e: tokio_postgres::Error| PgError::query(target, &e);
    let run = async {
        let tx = client.transaction().await.map_err(q)?;
        let mut ensured = Ensured::default();
        let cols = ensure_table(&tx, spec, &mut ensured).await?;
        mismatch(spec, &cols)?;
        ensure_page_id_index(&tx, spec, &mut ensured).await?;
        if spec.keyed {
            ensure_key_index(&tx, spec, &mut ensured).await?;
        }
        ensure_search(&tx, spec, &cols, &mut ensured).await?;
        tx.commit().await.map_err(q)?;
        Ok(ensured)
    };
    match tokio::time::timeout(SCHEMA_TIMEOUT, run).await {
        Ok(done) => done,
        Err(_) => Err(PgError::timeout(
            target,
            "the table's layout",
            SCHEMA_TIMEOUT,
        )),
    }
}

/// Takes the table's advisory lock, and creates the table if it is
/// missing; returns its columns.
async fn ensure_table(
    tx: &deadpool_postgres::Transaction<'_>,
    spec: &TableSpec<'_>,
    ensured: &mut Ensured,
) -> Result<Vec<Column>, PgError> {
    let q = |e: tokio_postgres::Error| PgError::query(&spec.sink.target, &e);
    let t = spec.table();
    // "already exists, skipping" notices of the IF NOT EXISTS steps would
    // reach the log at every start.
    tx.batch_execute("SET LOCAL client_min_messages = warning")
        .await
        .map_err(q)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('quota-worker table ' || $1, 0))",
        &[&t],
    )
    .await
    .map_err(q)?;
    if let Some(cols) = columns(tx, &t).await.map_err(q)? {
        return Ok(cols);
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {t} (
           item text NOT NULL,
           key text,
           page_id text NOT NULL,
           fetched_at timestamptz NOT NULL,
           record jsonb NOT NULL
         )"
    ))
    .await
    .map_err(q)?;
    ensured.done.push("created the table".into());
    Ok(columns(tx, &t).await.map_err(q)?.unwrap_or_default())
}

/// The index on `page_id`: a hash index, which holds a value of any length
/// (a page's id holds its item, and an item from `fan_out_from` may be
/// long). A table made before has a B-tree index of that name: it is
/// replaced, once.
async fn ensure_page_id_index(
    tx: &deadpool_postgres::Transaction<'_>,
    spec: &TableSpec<'_>,
    ensured: &mut Ensured,
) -> Result<(), PgError> {
    let q = |e: tokio_postgres::Error| PgError::query(&spec.sink.target, &e);
    let t = spec.table();
    let name = spec.index_name("page_id");
    let method = index_method(tx, &t, &name).await.map_err(q)?;
    if method.as_deref() == Some("hash") {
        return Ok(());
    }
    if method.is_some() {
        tx.batch_execute(&format!("DROP INDEX {}", spec.qualified_index("page_id")))
            .await
            .map_err(q)?;
        ensured.done.push(
            "replaced the B-tree index on page_id by a hash index (items of any length)".into(),
        );
    }
    tx.batch_execute(&format!(
        "CREATE INDEX IF NOT EXISTS {} ON {t} USING hash (page_id)",
        spec.index("page_id"),
    ))
    .await
    .map_err(q)?;
    Ok(())
}

/// A keyed sink's unique index on the hashes of `(item, key)`
/// ([`KEY_INDEX_COLUMNS`]), made unless one is there. A table made before
/// has this sink's unique index on `(item, key)` itself, which refuses a
/// long key: it is replaced, once (an index of that shape under another
/// name is an operator's, and left alone).
async fn ensure_key_index(
    tx: &deadpool_postgres::Transaction<'_>,
    spec: &TableSpec<'_>,
    ensured: &mut Ensured,
) -> Result<(), PgError> {
    let q = |e: tokio_postgres::Error| PgError::query(&spec.sink.target, &e);
    let schema = |why: String| PgError::Schema {
        target: spec.sink.target.url.clone(),
        table: spec.sink.table_name(),
        why,
    };
    let t = spec.table();
    let found = unique_indexes(tx, &t).await.map_err(q)?;
    if !has_key_index(tx, &t).await.map_err(q)? {
        let made = tx
            .batch_execute(&format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS {} ON {t} {KEY_INDEX_COLUMNS}",
                spec.index("item_key_hash")
            ))
            .await;
        match made {
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                return Err(schema(
                    "holds rows that repeat an (item, key): it was written without key; use another table for a keyed sink".into(),
                ));
            }
            other => other.map_err(q)?,
        }
        if !has_key_index(tx, &t).await.map_err(q)? {
            return Err(schema(format!(
                "has no unique index on {KEY_INDEX_COLUMNS}, and {} names something else",
                spec.index("item_key_hash")
            )));
        }
        ensured
            .done
            .push(format!("added the unique index on {KEY_INDEX_COLUMNS}"));
    }
    let old = spec.index_name("item_key");
    if found
        .iter()
        .any(|(n, cols)| *n == old && cols == "(item, key)")
    {
        tx.batch_execute(&format!("DROP INDEX {}", spec.qualified_index("item_key")))
            .await
            .map_err(q)?;
        ensured.done.push(
            "dropped the old unique index on (item, key), which refused keys over 2,704 bytes"
                .into(),
        );
    }
    Ok(())
}

/// The `search` column: re-created when its fields changed, dropped when
/// the sink has none, added when it has some and the column is missing.
async fn ensure_search(
    tx: &deadpool_postgres::Transaction<'_>,
    spec: &TableSpec<'_>,
    cols: &[Column],
    ensured: &mut Ensured,
) -> Result<(), PgError> {
    let q = |e: tokio_postgres::Error| PgError::query(&spec.sink.target, &e);
    let t = spec.table();
    let ours = cols.iter().find(|c| is_our_search(c));
    let wanted = search_mark(spec.search);
    let built = ours.is_some_and(|c| c.comment.as_deref() == Some(wanted.as_str()));
    if ours.is_some() && (spec.search.is_empty() || !built) {
        tx.batch_execute(&format!("ALTER TABLE {t} DROP COLUMN search"))
            .await
            .map_err(q)?;
        ensured.done.push("dropped the old search column".into());
    }
    if spec.search.is_empty() || built {
        return Ok(());
    }
    tx.batch_execute(&format!(
        "ALTER TABLE {t} ADD COLUMN search tsvector GENERATED ALWAYS AS ({}) STORED;
         CREATE INDEX IF NOT EXISTS {} ON {t} USING gin (search);
         COMMENT ON COLUMN {t}.search IS {}",
        search_expr(spec.search),
        spec.index("search"),
        literal(&wanted)
    ))
    .await
    .map_err(q)?;
    ensured
        .done
        .push(format!("added the search column over {:?}", spec.search));
    Ok(())
}

/// What [`check_tables`] found for one sink.
pub enum TableState {
    /// It matches (or was made to).
    Ready {
        /// What was done to it.
        done: Vec<String>,
    },
    /// It will be created at the first page (`check` creates nothing).
    Missing,
    /// The server does not answer now: checked when it does.
    Unreachable(String),
}

/// `check` (`create = false`: looks only) and `run` at start (`create`:
/// makes each table what its sink writes): every postgres sink's table.
/// A password that cannot be read, a login refused, a table of other
/// columns are errors at the sink's `url` (exit 78); a server that does not
/// answer is reported, and checked when the first page is written.
pub async fn check_tables(
    config: &Config,
    create: bool,
) -> Result<Vec<(String, TableState)>, ConfigErrors> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let mut errors: Vec<ConfigError> = Vec::new();
    for job in config
        .jobs
        .values()
        .filter(|j| j.sink.kind == SinkKind::Postgres)
    {
        let Some(spec) = TableSpec::of(job) else {
            continue;
        };
        if !seen.insert(spec.ready_key()) {
            continue;
        }
        let what = format!(
            "job {}: table {} at {}",
            job.name,
            spec.sink.table_name(),
            spec.sink.target
        );
        match check_table(&spec, create).await {
            Ok(state) => found.push((what, state)),
            Err(e) if e.is_unreachable() => found.push((what, TableState::Unreachable(e.detail()))),
            Err(e) => errors.push(job.sink.at.error(e.to_string())),
        }
    }
    if errors.is_empty() {
        Ok(found)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Logs what [`check_tables`] found, for `run` at start and for a reload
/// (both make the tables): what was done to each at INFO, a server that
/// does not answer at WARN.
pub(crate) fn log_tables(tables: &[(String, TableState)]) {
    for (what, state) in tables {
        match state {
            TableState::Ready { done } => {
                for step in done {
                    tracing::info!(sink = %what, "postgres sink: {step}");
                }
            }
            TableState::Missing => {}
            TableState::Unreachable(why) => tracing::warn!(sink = %what, error = %why,
                "postgres sink: the server does not answer; its table is checked, and pages spooled meanwhile written, once it does"),
        }
    }
}

async fn check_table(spec: &TableSpec<'_>, create: bool) -> Result<TableState, PgError> {
    let target = &spec.sink.target;
    let mut conn = pg::connect(target).await?;
    if create {
        return Ok(TableState::Ready {
            done: ensure(&mut conn, spec).await?.done,
        });
    }
    let q = |e: tokio_postgres::Error| PgError::query(target, &e);
    let Some(cols) = columns(&conn, &spec.table()).await.map_err(q)? else {
        return Ok(TableState::Missing);
    };
    mismatch(spec, &cols)?;
    Ok(TableState::Ready { done: Vec::new() })
}

/// Whether `c` is the `search` column this sink made (generated, marked).
fn is_our_search(c: &Column) -> bool {
    c.name == "search"
        && c.generated
        && c.comment
            .as_deref()
            .is_some_and(|m| m.starts_with(SEARCH_MARK))
}

/// The error for a table this sink cannot write, if `cols` make one.
fn mismatch(spec: &TableSpec<'_>, cols: &[Column]) -> Result<(), PgError> {
    let mut diff = differences(cols);
    let theirs = cols.iter().any(|c| c.name == "search" && !is_our_search(c));
    if theirs && !spec.search.is_empty() {
        diff.push("has a column search of its own, where this sink's search = [...] puts its generated tsvector".into());
    }
    if diff.is_empty() {
        return Ok(());
    }
    Err(PgError::Schema {
        target: spec.sink.target.url.clone(),
        table: spec.sink.table_name(),
        why: format!(
            "{}: use another table (table = \"...\"), or make this one match (docs/jobs.md, \"The PostgreSQL layout\")",
            diff.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, ty: &str) -> Column {
        Column {
            name: name.into(),
            type_name: ty.into(),
            not_null: false,
            has_default: false,
            generated: false,
            comment: None,
        }
    }

    #[test]
    fn a_table_of_other_columns_says_what_differs() {
        let ours: Vec<Column> = COLUMNS.iter().map(|(n, t)| col(n, t)).collect();
        assert!(differences(&ours).is_empty());
        let mut extra = ours.clone();
        extra.push(col("note", "text"));
        assert!(
            differences(&extra).is_empty(),
            "a nullable extra column is fine"
        );
        extra.push(Column {
            not_null: true,
            ..col("owner", "text")
        });
        assert_eq!(
            differences(&extra),
            ["has column owner NOT NULL without a default, which rows of this sink cannot fill"]
        );
        let other = vec![
            col("id", "integer"),
            col("record", "text"),
            col("item", "text"),
        ];
        assert_eq!(
            differences(&other),
            [
                "has no column key (text)",
                "has no column page_id (text)",
                "has no column fetched_at (timestamp with time zone)",
                "has column record of type text, not jsonb",
            ]
        );
    }

    #[test]
    fn the_search_expression_reads_each_pointer() {
        assert_eq!(
            search_expr(&["/snippet/title".into(), "/a~1b/0".into()]),
            "jsonb_to_tsvector('simple'::regconfig, coalesce(record #> ARRAY['snippet', 'title']::text[], 'null'::jsonb), '[\"string\"]'::jsonb) || \
             jsonb_to_tsvector('simple'::regconfig, coalesce(record #> ARRAY['a/b', '0']::text[], 'null'::jsonb), '[\"string\"]'::jsonb)"
        );
    }
}
