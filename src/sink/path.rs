//! Sink paths and their directories: a path rendered for an item and a day
//! ([`render_path`]), each value [encoded](sanitize) into one component,
//! the part every item shares ([`fixed_dir`]), the SQLite files a job has
//! written ([`databases`]), and the test writes that prove a directory can
//! take a page ([`probe_dir`], [`probe_room`], [`check_dirs`]).
//!
//! `sink.path` is a [`Template`] with `{job}`, `{date}` (the fetch's UTC day,
//! `YYYY-MM-DD`) and the fan-out keys. Values come from outside the operator's
//! template, so each is [encoded](sanitize) into one plain path component,
//! injectively (two different values never share a file): `%`, `/`, `\`
//! and control characters are percent-encoded (`a/b` → `a%2Fb`), and a
//! whole `.` or `..` becomes `%2E` or `%2E%2E`, an empty value `%`, so no
//! value can climb out of the directory the template names. Relative paths
//! resolve against the config file's directory. `check` and `run` create and
//! test each sink's directory up to its first placeholder ([`check_dirs`]).

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use chrono::NaiveDate;

use crate::config::{Config, ConfigError, ConfigErrors, Item, Job, SinkKind, Template};

/// Whether `job`'s sink writes files (JSON lines, SQLite), so that it has a
/// directory to create and probe; a PostgreSQL sink has none.
pub(super) fn has_dir(job: &Job) -> bool {
    job.sink.kind != SinkKind::Postgres
}

/// `job`'s sink path for `item` on `date`, as the template renders it
/// (relative paths are relative to the config directory; see
/// [`Sinks::path`](super::Sinks::path)). Every substituted value is [sanitized](sanitize).
pub fn render_path(job: &Job, item: &Item, date: NaiveDate) -> PathBuf {
    render(&job.sink.path, &job.name, item, date)
}

fn render(template: &Template, job: &str, item: &Item, date: NaiveDate) -> PathBuf {
    let date = date.format("%Y-%m-%d").to_string();
    let job = sanitize(job);
    let item: Vec<(&str, String)> = item
        .iter()
        .map(|(k, v)| (k.as_str(), sanitize(v)))
        .collect();
    let rendered = template.render(|name| match name {
        "job" => Some(job.as_str()),
        "date" => Some(date.as_str()),
        key => Some(
            item.iter()
                .find(|(k, _)| *k == key)
                .map_or("_", |(_, v)| v.as_str()),
        ),
    });
    PathBuf::from(rendered)
}

/// Makes `value` safe as (part of) one path component, so that it can
/// neither add a directory level nor climb out of one, and injectively, so
/// that two values never name one file: `%`, `/`, `\` and control
/// characters become `%XX` (upper-case hex); a whole `.` or `..` becomes
/// `%2E` or `%2E%2E`, the empty string `%` (every other `%` in the result
/// starts an `%XX`, so each result decodes to one value).
pub fn sanitize(value: &str) -> String {
    match value {
        "" => "%".to_owned(),
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        _ => {
            let mut out = String::with_capacity(value.len());
            for c in value.chars() {
                if matches!(c, '%' | '/' | '\\') || c.is_ascii_control() {
                    out.push_str(&format!("%{:02X}", c as u32));
                } else {
                    out.push(c);
                }
            }
            out
        }
    }
}

/// The part of `job`'s sink directory that every item and day shares: the
/// path up to the directory holding its first placeholder other than
/// `{job}` (the whole path's directory when it has none), relative to the
/// config directory. `data/{job}/{region}/{date}.jsonl` → `data/trending`.
pub fn fixed_dir(job: &Job) -> PathBuf {
    fixed_part(&job.sink.path, &job.name)
}

fn fixed_part(template: &Template, job: &str) -> PathBuf {
    let rendered = with_holes(template, job);
    let fixed = match rendered.split_once('\0') {
        Some((before, _)) => match before.rfind('/') {
            Some(i) => &before[..i],
            None => "",
        },
        None => rendered.rsplit_once('/').map_or("", |(dir, _)| dir),
    };
    PathBuf::from(fixed)
}

/// Every SQLite file `job`'s sink has written so far (its path template
/// with each placeholder but `{job}` matching any value), sorted.
pub fn databases(config: &Config, job: &Job) -> Vec<PathBuf> {
    let full = config.dir.join(with_holes(&job.sink.path, &job.name));
    let pattern: Vec<String> = full
        .to_string_lossy()
        .split('\0')
        .map(glob::Pattern::escape)
        .collect();
    let mut out: Vec<PathBuf> = glob::glob(&pattern.join("*"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

/// `template` rendered with the job's (encoded) name and a NUL where each
/// other value goes: a NUL can be in no path.
fn with_holes(template: &Template, job: &str) -> String {
    let name = sanitize(job);
    template.render(|p| match p {
        "job" => Some(name.as_str()),
        _ => Some("\0"),
    })
}

/// Creates `dir` if missing and writes, syncs and removes a small file in
/// it: what a page write needs, short of the page.
pub fn probe_dir(dir: &Path) -> io::Result<()> {
    probe_room(dir, PROBE_BYTES)
}

/// The test write of [`probe_dir`], bytes.
const PROBE_BYTES: u64 = 4096;

/// Creates `dir` if missing and writes, syncs and removes a file of
/// `bytes` (at least [`PROBE_BYTES`]) in it: proof of room for a page of
/// that size, as the file system stands.
pub fn probe_room(dir: &Path, bytes: u64) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let probe = dir.join(format!(
        ".quota-worker-probe-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut f| {
            let block = [b'\n'; 64 * 1024];
            let mut left = bytes.max(PROBE_BYTES);
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                f.write_all(&block[..n])?;
                left -= n as u64;
            }
            f.sync_all()
        });
    let removed = std::fs::remove_file(&probe);
    written?;
    // Left behind is harmless (a dot-file no reader takes for a page).
    removed.or_else(|e| match e.kind() {
        io::ErrorKind::NotFound => Ok(()),
        _ => Err(e),
    })
}

/// The longest file name Linux file systems take (`NAME_MAX`: ext4, XFS,
/// Btrfs, tmpfs).
pub const NAME_MAX: usize = 255;

/// Why `job`'s sink path cannot exist for some of its static `fan_out`
/// values: a file name longer than [`NAME_MAX`] with each placeholder's
/// longest value (every combination of the lists is an item, so the
/// longest ones meet). Names that take a `fan_out_from` column are not
/// known before a tick: such an item fails alone when it comes
/// ([`SinkError::NeverWritable`](super::SinkError::NeverWritable)).
pub fn name_too_long(job: &Job) -> Option<String> {
    let longest: Vec<(&str, String)> = job
        .fan_out
        .iter()
        .map(|(k, values)| {
            let v = values.iter().map(|v| sanitize(v)).max_by_key(String::len);
            (k.as_str(), v.unwrap_or_default())
        })
        .collect();
    let name = sanitize(&job.name);
    let rendered = job.sink.path.render(|p| match p {
        "job" => Some(name.as_str()),
        "date" => Some("2000-01-01"),
        key => Some(
            longest
                .iter()
                .find(|(k, _)| *k == key)
                .map_or("\0", |(_, v)| v.as_str()),
        ),
    });
    let too_long = rendered
        .split('/')
        .find(|c| !c.contains('\0') && c.len() > NAME_MAX)?;
    let short = |s: &str| match s.char_indices().nth(40) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    };
    let values: Vec<String> = longest
        .iter()
        .filter(|(k, _)| job.sink.path.placeholders().any(|p| p == *k))
        .map(|(k, v)| format!("{k} = {:?} ({} bytes)", short(v), v.len()))
        .collect();
    Some(format!(
        "a file name of this path would be {} bytes ({:?}) with the longest fan_out values ({}); a file name is at most {NAME_MAX} bytes: shorten the values or the path",
        too_long.len(),
        short(too_long),
        values.join(", ")
    ))
}

/// `check` and `run` at start: creates and tests each job's sink directory
/// up to its first placeholder ([`fixed_dir`]); each one that cannot be
/// written, and each path that cannot exist for a static `fan_out` value
/// ([`name_too_long`]), is an error at the job's `sink.path` naming why.
pub fn check_dirs(config: &Config) -> Result<(), ConfigErrors> {
    let mut seen = HashSet::new();
    let mut errors: Vec<ConfigError> = Vec::new();
    for job in config.jobs.values().filter(|j| has_dir(j)) {
        if let Some(why) = name_too_long(job) {
            errors.push(job.sink.at.error(why));
        }
        let dir = config.dir.join(fixed_dir(job));
        if !seen.insert(dir.clone()) {
            continue;
        }
        if let Err(e) = probe_dir(&dir) {
            let msg = format!(
                "the sink directory {} cannot be written: {e}",
                dir.display()
            );
            errors.push(job.sink.at.error(msg));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn item(pairs: &[(&str, &str)]) -> Item {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn date() -> NaiveDate {
        NaiveDate::from_ymd_opt(2024, 5, 1).expect("valid date")
    }

    fn path(template: &str, job: &str, it: &[(&str, &str)]) -> String {
        let t = Template::parse(template).expect("template");
        render(&t, job, &item(it), date())
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn renders_job_date_and_fan_out_keys() {
        assert_eq!(
            path(
                "data/{job}/{region}/{date}.jsonl",
                "trending",
                &[("region", "US")]
            ),
            "data/trending/US/2024-05-01.jsonl"
        );
        assert_eq!(
            path(
                "{job}-{lang}-{region}.db",
                "a.b-c",
                &[("region", "GB"), ("lang", "en")]
            ),
            "a.b-c-en-GB.db"
        );
    }

    #[test]
    fn values_never_leave_their_path_component() {
        let t = "data/{region}/x.jsonl";
        assert_eq!(path(t, "j", &[("region", "..")]), "data/%2E%2E/x.jsonl");
        assert_eq!(path(t, "j", &[("region", ".")]), "data/%2E/x.jsonl");
        assert_eq!(path(t, "j", &[("region", "")]), "data/%/x.jsonl");
        assert_eq!(
            path(t, "j", &[("region", "../../etc/passwd")]),
            "data/..%2F..%2Fetc%2Fpasswd/x.jsonl"
        );
        assert_eq!(path(t, "j", &[("region", "/abs")]), "data/%2Fabs/x.jsonl");
        assert_eq!(
            path(t, "j", &[("region", "a\\b\0c\r\u{1b}")]),
            "data/a%5Cb%00c%0D%1B/x.jsonl"
        );
        // Dots inside a name are fine: only whole "." and ".." climb.
        assert_eq!(path(t, "j", &[("region", "...")]), "data/.../x.jsonl");
        assert_eq!(path(t, "j", &[("region", "v1.2")]), "data/v1.2/x.jsonl");
        // The job name is encoded too.
        assert_eq!(path("{job}.db", "..", &[]), "%2E%2E.db");
        // Every rendered path stays a plain relative path under data/.
        for v in ["..", ".", "../..", "a/../..", "/", "\\..\\", "\0"] {
            let p = PathBuf::from(path(t, "j", &[("region", v)]));
            let parts: Vec<_> = p.components().collect();
            assert_eq!(parts.len(), 3, "{v:?} -> {}", p.display());
            assert!(
                parts
                    .iter()
                    .all(|c| matches!(c, std::path::Component::Normal(_))),
                "{v:?} -> {}",
                p.display()
            );
        }
    }

    /// Regression (issue 9): `a/b` and `a_b` both wrote `a_b.jsonl`, so two
    /// items' records mixed in one file. The encoding is injective.
    #[test]
    fn sink_paths_are_injective() {
        let values = [
            "a/b", "a_b", "a%2Fb", "a%b", "a\\b", "", "%", ".", "..", "%2E", "_", "__", "a\rb",
            "a%0Db", "a\0b", "a%00b",
        ];
        let mut seen = HashMap::new();
        for v in values {
            let encoded = sanitize(v);
            if let Some(other) = seen.insert(encoded.clone(), v) {
                panic!("{v:?} and {other:?} both encode to {encoded:?}");
            }
        }
    }

    #[test]
    fn the_fixed_part_of_a_sink_path_ends_before_the_first_value() {
        let fixed = |t: &str| {
            let t = Template::parse(t).expect("template");
            fixed_part(&t, "trending").to_string_lossy().into_owned()
        };
        assert_eq!(fixed("data/{job}/{region}/{date}.jsonl"), "data/trending");
        assert_eq!(fixed("data/x-{region}/a.jsonl"), "data");
        assert_eq!(fixed("{job}.sqlite"), "");
        assert_eq!(fixed("/var/lib/q/{job}.sqlite"), "/var/lib/q");
        assert_eq!(fixed("out/all.jsonl"), "out");
        assert_eq!(fixed("{region}/x.jsonl"), "");
    }
}
