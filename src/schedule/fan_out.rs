//! A tick's fan-out: one task per item, where the items are the rows of the
//! job's `fan_out_from` source (read now) times every combination of its
//! static `fan_out` lists (a cartesian product).
//!
//! Items are produced one at a time, from any position: a combination is
//! computed from its index, rows stream from the source's spool. So a tick
//! of a million items never holds them all, and a fan-out interrupted at
//! item N resumes at item N.

use std::time::Duration;

use crate::config::{Item, Job};
use crate::queue::{
    Chunk, FAN_OUT_CHUNK, Origin, Queue, QueueError, Rotation, TaskArgs, TickFanOut,
};

use super::source::{self, Refused, Rows, SourceError};

/// The items of one tick of a job.
#[derive(Debug)]
pub struct TickItems<'a> {
    job: &'a Job,
    /// The source's rows, read for this tick; `None` without `fan_out_from`.
    rows: Option<Rows>,
    combinations: u64,
}

impl<'a> TickItems<'a> {
    /// Reads `job`'s source (if any) now. Blocking: file and SQLite I/O.
    pub fn read(job: &'a Job) -> Result<Self, SourceError> {
        let rows = job.fan_out_from.as_ref().map(source::read).transpose()?;
        Ok(Self::with_rows(job, rows))
    }

    /// Reads `job`'s source (if any) now, on a blocking thread.
    pub async fn read_async(job: &'a Job) -> Result<Self, SourceError> {
        let rows = match job.fan_out_from.clone() {
            Some(from) => {
                let read = tokio::task::spawn_blocking(move || source::read(&from));
                let joined = read
                    .await
                    .map_err(|e| SourceError::Spool(std::io::Error::other(e)))?;
                Some(joined?)
            }
            None => None,
        };
        Ok(Self::with_rows(job, rows))
    }

    fn with_rows(job: &'a Job, rows: Option<Rows>) -> Self {
        TickItems {
            job,
            rows,
            combinations: job.combinations(),
        }
    }

    /// How many items.
    pub fn len(&self) -> u64 {
        let rows = self.rows.as_ref().map_or(1, |r| r.count);
        rows.saturating_mul(self.combinations)
    }

    /// The source's rows (that passed), `None` without `fan_out_from`.
    pub fn rows(&self) -> Option<u64> {
        self.rows.as_ref().map(|r| r.count)
    }

    /// Whether there are none (a source without rows).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows of the source skipped for a bad value.
    pub fn refused(&self) -> Option<&Refused> {
        self.rows
            .as_ref()
            .map(|r| &r.refused)
            .filter(|r| r.count > 0)
    }

    /// The refused rows, owned.
    pub fn into_refused(self) -> Option<Refused> {
        self.rows.map(|r| r.refused).filter(|r| r.count > 0)
    }

    /// The job.
    pub fn job(&self) -> &Job {
        self.job
    }

    /// The items from index `start` on, in a stable order: rows in source
    /// order, and for each row every combination of the lists (the last
    /// list varying fastest).
    pub fn from(
        &mut self,
        start: u64,
    ) -> Result<impl Iterator<Item = Result<(u64, Item), SourceError>> + Send + '_, SourceError>
    {
        let (job, combos) = (self.job, self.combinations.max(1));
        let columns: &[String] = job.fan_out_from.as_ref().map_or(&[], |f| &f.columns);
        let (first_row, first_combo) = (start / combos, start % combos);
        let rows: Box<dyn Iterator<Item = Result<Vec<String>, SourceError>> + Send + '_> =
            match &mut self.rows {
                Some(rows) => Box::new(rows.read_from(first_row)?),
                // Without a source: one empty row.
                None => Box::new((first_row == 0).then(|| Ok(Vec::new())).into_iter()),
            };
        let items = rows.enumerate().flat_map(move |(r, row)| {
            let r = first_row + r as u64;
            let from = if r == first_row { first_combo } else { 0 };
            let row = match row {
                Ok(row) => row,
                Err(e) => {
                    return Box::new(std::iter::once(Err(e))) as Box<dyn Iterator<Item = _> + Send>;
                }
            };
            Box::new((from..combos).map(move |c| {
                let mut item: Item = columns.iter().cloned().zip(row.iter().cloned()).collect();
                item.extend(combination(job, c));
                Ok((r * combos + c, item))
            }))
        });
        Ok(items)
    }
}

/// The `c`-th combination of `job`'s static lists (mixed radix, the last
/// list varying fastest).
fn combination(job: &Job, mut c: u64) -> Item {
    let mut item: Item = Vec::with_capacity(job.fan_out.len());
    for (key, values) in job.fan_out.iter().rev() {
        let n = values.len() as u64;
        item.push((key.clone(), values[(c % n) as usize].clone()));
        c /= n;
    }
    item.reverse();
    item
}

/// Every task of one tick of `job` at `tick_ms`, at once: for small
/// fan-outs, tests and benchmarks. A source that cannot be read gives no
/// tasks (logged); the daemon and `trigger` stream [`TickItems`] instead.
pub fn tick_tasks(job: &Job, tick_ms: i64, origin: Origin) -> Vec<TaskArgs> {
    let mut items = match TickItems::read(job) {
        Ok(items) => items,
        Err(e) => {
            tracing::error!(job = %job.name, error = %e, "fan-out source unreadable: no tasks");
            return Vec::new();
        }
    };
    let Ok(iter) = items.from(0) else {
        return Vec::new();
    };
    iter.map_while(Result::ok)
        .map(|(i, item)| TaskArgs::first(&job.name, tick_ms, i, item, origin))
        .collect()
}

/// Most payload bytes in one chunk call, whatever the task count.
const CHUNK_BYTES: usize = 256 << 10;

/// Tries of one chunk call before a fan-out gives up: each is idempotent, so
/// a call whose reply was lost is simply sent again.
const CHUNK_ATTEMPTS: u32 = 5;

/// How a tick's fan-out went, when nothing failed.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fanned {
    /// Every task is queued: this many.
    Queued(u64),
    /// The tick is another enqueuer's: claimed by another daemon (or taken
    /// over from this one after its lease ran out).
    Taken {
        /// Who has it.
        by: String,
        /// Its tasks queued so far; `None`: all of them.
        queued: Option<u64>,
    },
}

/// A fan-out that stopped part-way: what was queued, what was not, and why.
#[derive(Debug, thiserror::Error)]
#[error("{queued} of {total} task(s) queued, then: {cause}")]
pub struct FanOutError {
    /// Tasks of the tick queued (by anyone) when it stopped.
    pub queued: u64,
    /// Tasks the tick has.
    pub total: u64,
    /// Why it stopped.
    pub cause: FanOutCause,
}

/// Why a fan-out stopped part-way. The tick's claim stays, with its
/// progress: whoever takes it over when the lease runs out goes on at
/// `queued` (a daemon for a cron tick, `trigger` run again for its own).
#[derive(Debug, thiserror::Error)]
pub enum FanOutCause {
    /// Redis failed on every try of a chunk: retry later.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The spool of the source's rows could not be read back.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The claim expired before the fan-out finished (a day).
    #[error("the tick's claim expired before its fan-out finished")]
    ClaimGone,
}

/// Queues `items` as the tasks of `fan_out`'s tick, from position `start`
/// on (0: claims the tick; else the rest of a fan-out taken over), in
/// chunks of at most [`FAN_OUT_CHUNK`] tasks, each one bounded Redis call
/// under the tick's claim. `progress` hears the count queued after each chunk.
///
/// The items are queued in the tick's rotated order ([`Queue::begin_tick`]):
/// from the one where the job's previous tick first ran out of quota, to
/// the end, then from the first item, so the items starved last time are
/// served first. Every enqueuer of one tick gets the same order, so a
/// fan-out taken over goes on with the same positions.
pub async fn queue_tick(
    queue: &Queue,
    items: &mut TickItems<'_>,
    fan_out: &TickFanOut<'_>,
    start: u64,
    mut progress: impl FnMut(u64),
) -> Result<Fanned, FanOutError> {
    let total = items.len();
    let fail = |queued, cause| FanOutError {
        queued,
        total,
        cause,
    };
    let rotation = queue
        .begin_tick(fan_out.job, fan_out.tick, total)
        .await
        .map_err(|e| fail(start, e.into()))?;
    let wrap = total - rotation.offset.min(total);
    let mut pos = start;
    'restart: loop {
        // Positions up to `run_end` are items in index order from `pos`'s.
        let run_end = if pos < wrap { wrap } else { total };
        let index = rotation.index_at(pos, total);
        let mut iter = items
            .from(index)
            .map_err(|e| fail(pos, e.into()))?
            .take(run_end.saturating_sub(pos) as usize);
        loop {
            let chunk =
                next_chunk(&mut iter, fan_out, rotation, total).map_err(|e| fail(pos, e))?;
            let last = pos + chunk.len() as u64 >= total;
            match send_chunk(queue, fan_out, pos, last, &chunk).await {
                Ok(Chunk::Queued(n)) => {
                    progress(n);
                    let expected = pos + chunk.len() as u64;
                    pos = n;
                    if n != expected || n >= run_end {
                        // Found queued by an earlier call, or the end of a
                        // run of indices: go on from there.
                        continue 'restart;
                    }
                }
                Ok(Chunk::Gap(n)) => {
                    pos = n;
                    continue 'restart;
                }
                Ok(Chunk::Complete(n)) => {
                    progress(n);
                    return Ok(Fanned::Queued(n));
                }
                Ok(Chunk::Taken { by, queued }) => return Ok(Fanned::Taken { by, queued }),
                Ok(Chunk::ClaimGone) => return Err(fail(pos, FanOutCause::ClaimGone)),
                Err(e) => return Err(fail(pos, e.into())),
            }
        }
    }
}

/// The next tasks, `(id, payload)`, bounded in count and bytes.
fn next_chunk(
    iter: &mut impl Iterator<Item = Result<(u64, Item), SourceError>>,
    fan_out: &TickFanOut<'_>,
    rotation: Rotation,
    total: u64,
) -> Result<Vec<(String, String)>, FanOutCause> {
    let (mut chunk, mut bytes) = (Vec::with_capacity(FAN_OUT_CHUNK), 0);
    while chunk.len() < FAN_OUT_CHUNK && bytes < CHUNK_BYTES {
        let Some(next) = iter.next() else { break };
        let (i, item) = next?;
        let task = TaskArgs::in_rotation(fan_out, rotation, total, i, item);
        let payload = serde_json::to_string(&task).map_err(QueueError::from)?;
        bytes += payload.len();
        chunk.push((task.id, payload));
    }
    Ok(chunk)
}

/// One chunk call, sent again on a Redis error (it is idempotent).
async fn send_chunk(
    queue: &Queue,
    fan_out: &TickFanOut<'_>,
    start: u64,
    last: bool,
    chunk: &[(String, String)],
) -> Result<Chunk, QueueError> {
    let mut attempt = 0;
    loop {
        match queue.fan_out_chunk(fan_out, start, last, chunk).await {
            Err(QueueError::Redis(e)) if attempt + 1 < CHUNK_ATTEMPTS => {
                tracing::debug!(job = fan_out.job, tick = fan_out.tick, attempt, error = %e, "fan-out chunk failed; sending it again");
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                attempt += 1;
            }
            r => return r,
        }
    }
}
