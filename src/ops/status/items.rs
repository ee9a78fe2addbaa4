//! `GET /api/state/{job}` and `GET /api/state/{job}?item=ITEM`: where a
//! job's items stand, as `quota-worker state JOB [ITEM] --json` prints it
//! (the same reads, `crate::item_state`), so the status page can link each
//! item it names to its state. Read-only, like the rest of the page.
//!
//! Bounded: one such read at a time per process, at most [`API_ITEMS`]
//! items, and the search for items outside the fan-out stops at
//! [`REDIS_READ_BUDGET`]; a list cut short says so (`complete: false`) and
//! names the command that lists every item.

use std::sync::LazyLock;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::super::{OpsState, REDIS_READ_BUDGET};
use super::headers;
use crate::item_state::{self, items};

/// Most items one answer lists.
pub(crate) const API_ITEMS: usize = 1_000;

/// How long the fan-out's source (a file, a database) may take to read.
const SOURCE_BUDGET: std::time::Duration = std::time::Duration::from_secs(10);

/// One read at a time in this process: a loop asking for a large job's
/// state waits for the read in progress instead of adding to Redis's load
/// (a static, not a field of `OpsState`: nothing else needs it).
static ONE_AT_A_TIME: LazyLock<tokio::sync::Mutex<()>> =
    LazyLock::new(|| tokio::sync::Mutex::new(()));

/// `GET /api/state/{job}` (`?item=`: one item's).
pub(super) async fn api(s: &OpsState, job: &str, item: Option<&str>) -> Response {
    let _one = ONE_AT_A_TIME.lock().await;
    let (status, body) = match read(s, job, item).await {
        Ok(body) => (StatusCode::OK, body),
        Err((status, error)) => (status, serde_json::json!({ "error": error }).to_string()),
    };
    (status, headers("application/json"), body).into_response()
}

/// `read` within [`REDIS_READ_BUDGET`].
async fn within<T>(
    read: impl std::future::Future<Output = T>,
) -> Result<T, tokio::time::error::Elapsed> {
    tokio::time::timeout(REDIS_READ_BUDGET, read).await
}

type Failed = (StatusCode, String);

async fn read(s: &OpsState, job: &str, item: Option<&str>) -> Result<String, Failed> {
    let live = s.live();
    let Some(job) = live.config.jobs.get(job) else {
        return Err((StatusCode::NOT_FOUND, format!("unknown job {job:?}")));
    };
    let unavailable = |e: &dyn std::fmt::Display| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Redis did not answer: {e}"),
        )
    };
    let keys = s.queue.keys();
    let mut conn = s.queue.connection();
    let fanned = match tokio::time::timeout(SOURCE_BUDGET, items::fan_out(job)).await {
        Ok(f) => f,
        Err(_) => Err(format!(
            "its source took more than {SOURCE_BUDGET:?} to read"
        )),
    };
    let (list, complete) = match item {
        Some(item) => match within(items::find(&mut conn, keys, job, item, &fanned)).await {
            Ok(Ok(Some(one))) => (vec![one], true),
            Ok(Ok(None)) => {
                let why = format!(
                    "job {} has no item {item:?} (neither in its fan-out nor in Redis)",
                    job.name
                );
                return Err((StatusCode::NOT_FOUND, why));
            }
            Ok(Err(e)) => return Err(unavailable(&e)),
            Err(e) => return Err(unavailable(&e)),
        },
        None => {
            let (mut fanned, fan_error) = match fanned {
                Ok(f) => (f, None),
                Err(why) => (Vec::new(), Some(why)),
            };
            let cut = fanned.len() > API_ITEMS;
            fanned.truncate(API_ITEMS);
            let room = API_ITEMS - fanned.len();
            let held = within(item_state::held_items(&mut conn, keys, &job.name, room)).await;
            let (held, whole) = match held {
                Ok(Ok((held, more))) => (held, !more),
                Ok(Err(e)) => return Err(unavailable(&e)),
                Err(_) => (Default::default(), false),
            };
            (
                items::every_item(fanned, held),
                whole && !cut && fan_error.is_none(),
            )
        }
    };
    let states = within(item_state::read(&mut conn, keys, &job.name, &list)).await;
    let states = match states {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(unavailable(&e)),
        Err(e) => return Err(unavailable(&e)),
    };
    let listing = item_state::Listing {
        job: &job.name,
        items: &states,
        complete: Some(complete),
        every_item: (!complete).then(|| item_state::command_line(&["state", &job.name, "--json"])),
    };
    serde_json::to_string_pretty(&listing).map_err(|e| {
        let why = format!("cannot encode the state: {e}");
        (StatusCode::INTERNAL_SERVER_ERROR, why)
    })
}
