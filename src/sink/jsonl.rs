//! The JSON lines sink: a page's records appended as lines to one file,
//! whole, with its room counted for the spool and the stuck-sink probe.
//!
//! # What concurrent appends guarantee
//!
//! One line per record: `{"job", "item", "fetched_at", "record"}`. A page is
//! serialized into one buffer and appended with one `write_all` on a file
//! opened with `O_APPEND`. On a local file system (ext4, xfs, btrfs, tmpfs)
//! that is enough for whole, never interleaved pages between any number of
//! writers, threads or processes: with `O_APPEND` the kernel moves the offset
//! to the end of the file and writes in one step under the inode's lock, so
//! a `write(2)` to a regular file lands contiguously after every earlier one.
//! The one gap is a *short* write (disk full, file size limit, a fatal signal
//! mid-copy): `write_all` would then issue a second `write(2)` that another
//! writer could precede. To close it every writer also holds an exclusive
//! `flock` for its append, truncates its own partial page away when the
//! append fails, and starts on a fresh line if the file ends in a torn line
//! (left by a writer killed mid-write or by power loss), so that damage stays
//! one unparsable line and never swallows a good record. Readers should skip
//! a line that does not parse. The data is `fdatasync`ed before `write`
//! returns, because a page costs quota and the worker checkpoints its cursor
//! right after.
//!
//! Limits: on NFS `O_APPEND` is emulated by each client (it computes the
//! offset from its cached size), so writers on *different hosts* can
//! overwrite each other unless `flock` reaches the server's lock manager;
//! give each host its own file there. Delivery is at least once: a task
//! retried after a failure that followed a successful write (or cancelled
//! while its write ran) writes the page again; SQLite with `key` absorbs that.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Serialize, Serializer};
use serde_json::Value;

use super::{SinkError, blocking};
use crate::config::{Item, Job};

/// Appends `records` of `job`'s `item`, fetched at `fetched_at` (its
/// fixed-width text), to `path` as one page; how many were written.
pub(super) async fn write(
    path: PathBuf,
    job: &Job,
    item: &Item,
    fetched_at: &str,
    records: &[Value],
) -> Result<usize, SinkError> {
    if records.is_empty() {
        return Ok(0);
    }
    // Encoding happens here, borrowing the records, so the blocking task
    // gets bytes to write rather than a copy of the page.
    let mut buf = Vec::with_capacity(256 * records.len());
    for record in records {
        let line = Line {
            job: &job.name,
            item: ItemJson(item),
            fetched_at,
            record,
        };
        serde_json::to_writer(&mut buf, &line).map_err(SinkError::Encode)?;
        buf.push(b'\n');
    }
    blocking(move || append(&path, &buf).map_err(|source| SinkError::Io { path, source })).await?;
    Ok(records.len())
}

/// One line of a JSON lines sink; fields in this order.
#[derive(Serialize)]
struct Line<'a> {
    job: &'a str,
    item: ItemJson<'a>,
    fetched_at: &'a str,
    record: &'a Value,
}

/// The room one page needs in the spool or in a JSON lines sink, bytes:
/// `page` (as the spool writes it) plus, for each record, what a sink line
/// adds around it.
pub(super) fn room_for(job: &str, item: &Item, page: &impl Serialize, records: usize) -> u64 {
    let line = Line {
        job,
        item: ItemJson(item),
        fetched_at: "2000-01-01T00:00:00.000Z",
        record: &Value::Null,
    };
    let per_line = encoded_len(&line).saturating_sub(4) + 1;
    encoded_len(page).saturating_add(per_line.saturating_mul(records as u64))
}

/// How many bytes `value` encodes to as JSON, counted, not kept.
fn encoded_len(value: &impl Serialize) -> u64 {
    struct Count(u64);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

/// An item as a JSON object, keys in fan-out order.
struct ItemJson<'a>(&'a Item);

impl Serialize for ItemJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// Appends one page (whole lines) to `path`; see the module docs for why
/// this never interleaves with other writers.
fn append(path: &Path, page: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // The final component is never followed: a symbolic link planted in a
    // shared sink directory cannot redirect pages into another file
    // (ELOOP; docs/security.md).
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.lock()?;
    let appended = append_locked(&mut file, page);
    let unlocked = file.unlock();
    appended?;
    unlocked?;
    file.sync_data()
}

/// The append proper, under the exclusive `flock` every writer takes.
///
/// The torn-line check needs that lock: without it, it can read the end of
/// another writer's page while that page is being copied in, and add a blank
/// line. (Checked: with the lock removed and this check kept, the
/// concurrency tests fail; with both removed, `O_APPEND` alone passes them.)
fn append_locked(file: &mut File, page: &[u8]) -> io::Result<()> {
    let start = file.metadata()?.len();
    let torn = start > 0 && {
        let mut last = [0u8];
        file.read_exact_at(&mut last, start - 1)?;
        last[0] != b'\n'
    };
    let written = if torn {
        // Isolate the torn line someone left, rather than extend it.
        let mut buf = Vec::with_capacity(page.len() + 1);
        buf.push(b'\n');
        buf.extend_from_slice(page);
        file.write_all(&buf)
    } else {
        file.write_all(page)
    };
    if let Err(e) = written {
        // Nobody appended since `start` (we hold the lock): take our partial
        // page back so a retry does not leave half of it behind.
        let _ = file.set_len(start);
        return Err(e);
    }
    Ok(())
}
