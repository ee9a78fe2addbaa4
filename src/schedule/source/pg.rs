//! `fan_out_from = { postgres = "postgres://…", query = "SELECT …" }`: a
//! tick's items are the rows of one read-only query, run in a read-only
//! transaction (`BEGIN READ ONLY`), so whatever the query calls cannot write.
//!
//! A write is refused three times over: at load, a query whose first
//! keyword is not SELECT, WITH, VALUES or TABLE, and one whose plan
//! (`EXPLAIN`, which runs nothing) modifies or locks rows (a data-modifying
//! `WITH`, `SELECT … FOR UPDATE`); at every tick, by the server itself, in
//! the read-only transaction (a function that writes, say). The query is
//! prepared, so the server refuses more than one statement.
//!
//! Values arrive in the binary format; text, integers, floats, numerics,
//! booleans, UUIDs and JSON are read, anything else is refused at load with
//! the cast to write (`x::text AS name`). A lock held by another session
//! makes the query wait at most [`LOCK_TIMEOUT`], as a SQLite source waits
//! for a writer.

use std::error::Error as StdError;
use std::future::Future;

use futures::{StreamExt, pin_mut};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, Type};

use super::{SourceError, Spool, column_order, looks_read_only};
use crate::config::PgTarget;
use crate::pg::{self, PgError};

/// How long the query waits for a lock another session holds.
const LOCK_TIMEOUT: &str = "5s";

/// Runs `fut` to completion on a runtime of its own, on a thread of its
/// own: config loading and `check` read sources from synchronous code,
/// which may itself run inside the daemon's runtime (where blocking on
/// that runtime would deadlock or panic).
fn block_on<F>(fut: F) -> Result<F::Output, SourceError>
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(SourceError::Spool)?;
            Ok(rt.block_on(fut))
        })
        .join()
        .unwrap_or_else(|_| Err(SourceError::Spool(std::io::Error::other("reader panicked"))))
    })
}

/// The query's result columns: prepared and checked, not run.
pub(super) fn columns(target: &PgTarget, query: &str) -> Result<Vec<String>, SourceError> {
    block_on(columns_async(target, query))?
}

/// Reads the rows into `spool`, in `columns` order.
pub(super) fn read(
    target: &PgTarget,
    query: &str,
    columns: &[String],
    spool: &mut Spool<'_>,
) -> Result<(), SourceError> {
    block_on(read_async(target, query, columns, spool))?
}

async fn columns_async(target: &PgTarget, query: &str) -> Result<Vec<String>, SourceError> {
    if !looks_read_only(query) {
        return Err(SourceError::NotReadOnly);
    }
    let mut conn = pg::connect(target).await?;
    let q = |e: tokio_postgres::Error| from_query(target, &e);
    let tx = read_only(&mut conn, target).await?;
    let stmt = tx.prepare(query).await.map_err(q)?;
    if stmt.columns().is_empty() {
        return Err(SourceError::NotReadOnly);
    }
    for c in stmt.columns() {
        if !SqlText::accepts(c.type_()) {
            return Err(SourceError::ColumnType {
                column: c.name().to_owned(),
                type_name: c.type_().name().to_owned(),
            });
        }
    }
    // The plan shows a write the first keyword hides (a data-modifying
    // WITH) and row locks; EXPLAIN without ANALYZE runs nothing.
    let plan = tx
        .query_one(&format!("EXPLAIN (FORMAT JSON) {query}"), &[])
        .await
        .map_err(q)?;
    let plan: SqlText = plan.try_get(0).map_err(q)?;
    if plan_writes(&plan.0) {
        return Err(SourceError::NotReadOnly);
    }
    tx.rollback().await.map_err(q)?;
    Ok(stmt.columns().iter().map(|c| c.name().to_owned()).collect())
}

/// Whether an `EXPLAIN (FORMAT JSON)` plan modifies or locks rows.
fn plan_writes(plan: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(plan) else {
        return true;
    };
    fn walk(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(m) => {
                matches!(
                    m.get("Node Type").and_then(|t| t.as_str()),
                    Some("ModifyTable" | "LockRows")
                ) || m.values().any(walk)
            }
            serde_json::Value::Array(a) => a.iter().any(walk),
            _ => false,
        }
    }
    walk(&v)
}

async fn read_async(
    target: &PgTarget,
    query: &str,
    columns: &[String],
    spool: &mut Spool<'_>,
) -> Result<(), SourceError> {
    let mut conn = pg::connect(target).await?;
    let q = |e: tokio_postgres::Error| from_query(target, &e);
    let tx = read_only(&mut conn, target).await?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        .await
        .map_err(q)?;
    let stmt = tx.prepare(query).await.map_err(q)?;
    let now: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
    let order = column_order(std::path::Path::new(&target.url), &now, columns)?;
    let rows = tx
        .query_raw(&stmt, std::iter::empty::<&str>())
        .await
        .map_err(q)?;
    pin_mut!(rows);
    let mut n = 0u64;
    while let Some(row) = rows.next().await {
        let row = row.map_err(q)?;
        n += 1;
        let values = order
            .iter()
            .map(|&i| match row.try_get::<_, Option<SqlText>>(i) {
                Ok(Some(v)) => Ok(v.0),
                Ok(None) => Err("NULL".to_owned()),
                Err(e) => Err(pg::describe(&e, None)),
            });
        spool.push(|| format!("row {n}"), values)?;
    }
    tx.rollback().await.map_err(q)?;
    Ok(())
}

/// `BEGIN READ ONLY` on `conn`: whatever the query calls cannot write.
async fn read_only<'c>(
    conn: &'c mut deadpool_postgres::Object,
    target: &PgTarget,
) -> Result<deadpool_postgres::Transaction<'c>, SourceError> {
    (conn.build_transaction().read_only(true).start())
        .await
        .map_err(|e| from_query(target, &e))
}

/// A statement's error: "cannot execute … in a read-only transaction" is
/// the query trying to write.
fn from_query(target: &PgTarget, e: &tokio_postgres::Error) -> SourceError {
    if e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) {
        return SourceError::NotReadOnly;
    }
    SourceError::Pg(PgError::query(target, e))
}

/// A value as placeholder text, from the binary format of the types a
/// fan-out's values usually have.
struct SqlText(String);

type Failure = Box<dyn StdError + Sync + Send>;

impl<'a> FromSql<'a> for SqlText {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Failure> {
        let text = match *ty {
            Type::BOOL => bool::from_sql(ty, raw)?.to_string(),
            Type::INT2 => i16::from_sql(ty, raw)?.to_string(),
            Type::INT4 => i32::from_sql(ty, raw)?.to_string(),
            Type::INT8 => i64::from_sql(ty, raw)?.to_string(),
            Type::OID => u32::from_sql(ty, raw)?.to_string(),
            Type::FLOAT4 => f32::from_sql(ty, raw)?.to_string(),
            Type::FLOAT8 => f64::from_sql(ty, raw)?.to_string(),
            Type::NUMERIC => numeric(raw)?,
            Type::UUID => uuid::Uuid::from_slice(raw)?.to_string(),
            // jsonb's binary format is a version byte, then the text.
            Type::JSONB => match raw.split_first() {
                Some((1, text)) => std::str::from_utf8(text)?.to_owned(),
                _ => return Err("unknown jsonb format".into()),
            },
            _ => std::str::from_utf8(raw)?.to_owned(),
        };
        Ok(SqlText(text))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::TEXT
                | Type::VARCHAR
                | Type::BPCHAR
                | Type::NAME
                | Type::UNKNOWN
                | Type::JSON
                | Type::JSONB
                | Type::BOOL
                | Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::OID
                | Type::FLOAT4
                | Type::FLOAT8
                | Type::NUMERIC
                | Type::UUID
        ) || ty.name() == "citext"
    }
}

/// A `numeric` in PostgreSQL's binary format (base-10000 digits) as
/// decimal text: `ndigits, weight, sign, dscale` (each 16 bits), then the
/// digits.
fn numeric(raw: &[u8]) -> Result<String, Failure> {
    let word = |i: usize| -> Result<u16, Failure> {
        raw.get(i * 2..i * 2 + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "short numeric".into())
    };
    let (ndigits, weight, sign, dscale) = (
        usize::from(word(0)?),
        i32::from(word(1)? as i16),
        word(2)?,
        usize::from(word(3)?),
    );
    match sign {
        0xC000 => return Ok("NaN".into()),
        0xD000 => return Ok("Infinity".into()),
        0xF000 => return Ok("-Infinity".into()),
        _ => {}
    }
    let digits: Vec<u16> = (0..ndigits)
        .map(|i| word(4 + i))
        .collect::<Result<_, _>>()?;
    let digit = |pos: i32| -> u16 {
        usize::try_from(weight - pos)
            .ok()
            .and_then(|i| digits.get(i))
            .copied()
            .unwrap_or(0)
    };
    let mut out = String::new();
    if sign == 0x4000 {
        out.push('-');
    }
    // The integer part: digit groups from `weight` down to 0.
    if weight < 0 {
        out.push('0');
    } else {
        for pos in (0..=weight).rev() {
            let d = digit(pos);
            if out.is_empty() || out == "-" {
                out.push_str(&d.to_string());
            } else {
                out.push_str(&format!("{d:04}"));
            }
        }
    }
    if dscale > 0 {
        out.push('.');
        let mut frac = String::new();
        let mut pos = -1;
        while frac.len() < dscale {
            frac.push_str(&format!("{:04}", digit(pos)));
            pos -= 1;
        }
        frac.truncate(dscale);
        out.push_str(&frac);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(ndigits: u16, weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> String {
        let mut raw = Vec::new();
        for w in [ndigits, weight as u16, sign, dscale].iter().chain(digits) {
            raw.extend_from_slice(&w.to_be_bytes());
        }
        numeric(&raw).unwrap()
    }

    #[test]
    fn numerics_read_as_decimal_text() {
        assert_eq!(num(1, 0, 0, 0, &[42]), "42");
        assert_eq!(num(2, 1, 0, 0, &[12, 3456]), "123456");
        assert_eq!(num(2, 0, 0x4000, 2, &[7, 5000]), "-7.50");
        assert_eq!(num(1, -1, 0, 4, &[25]), "0.0025");
        assert_eq!(num(0, 0, 0, 0, &[]), "0");
        assert_eq!(num(1, 2, 0, 0, &[1]), "100000000");
        assert_eq!(num(0, 0, 0xC000, 0, &[]), "NaN");
    }

    #[test]
    fn a_plan_that_modifies_or_locks_rows_writes() {
        assert!(!plan_writes(r#"[{"Plan": {"Node Type": "Seq Scan"}}]"#));
        assert!(plan_writes(
            r#"[{"Plan": {"Node Type": "CTE Scan", "Plans": [{"Node Type": "ModifyTable"}]}}]"#
        ));
        assert!(plan_writes(r#"[{"Plan": {"Node Type": "LockRows"}}]"#));
        assert!(plan_writes("not json"));
    }
}
