//! Turns the raw files ([`super::raw`]) into a validated [`Config`]: one
//! function per TOML table, each checking its own fields, all reporting into
//! one [`Loader`] so an operator sees every error of a load at once.
//!
//! Adding a field: a line in its public type ([`super`]), a line in its raw
//! type ([`super::raw`]), and a line in its table's function here (defaults
//! in [`super::defaults`], word choices in [`super::choice`]).

mod accounting;
mod credentials;
mod endpoints;
mod jobs;
mod postgres;
mod request;
mod settings;
mod sink;
mod windows;

pub(super) use credentials::{check_program, read_secret};

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use chrono_tz::Tz;
use indexmap::IndexMap;

use super::choice::Choice;
use super::defaults as d;
use super::raw::RawConfig;
use super::{Config, ConfigError, ConfigErrors, EnvLookup, FieldPath, Source, Window};

/// Collects every error of one load.
pub(super) struct Loader<'a> {
    env: EnvLookup<'a>,
    errors: Vec<ConfigError>,
    /// Endpoints that are defined but invalid (already reported): a job
    /// naming one is not told the endpoint is unknown.
    invalid_endpoints: BTreeSet<String>,
    /// Template credentials (`template = "account"`): their placeholder,
    /// which every job charged to one must fill.
    templates: HashMap<String, String>,
    /// Each credential's windows, to check a job's reserve against them.
    credential_windows: HashMap<String, Vec<Window>>,
    /// Every file read so far, paths and contents: the config's fingerprint.
    read: sha1_smol::Sha1,
}

impl<'a> Loader<'a> {
    pub(super) fn new(env: EnvLookup<'a>) -> Self {
        Loader {
            env,
            errors: Vec::new(),
            invalid_endpoints: BTreeSet::new(),
            templates: HashMap::new(),
            credential_windows: HashMap::new(),
            read: sha1_smol::Sha1::new(),
        }
    }

    /// Reads a config or job file, and counts it in the fingerprint.
    fn source(&mut self, path: &Path) -> Result<Source, ConfigError> {
        let src = read_source(path)?;
        // Length-prefixed, so no two sequences of files hash alike.
        for part in [path.to_string_lossy().as_bytes(), src.text().as_bytes()] {
            self.read.update(&(part.len() as u64).to_le_bytes());
            self.read.update(part);
        }
        Ok(src)
    }

    /// The config file and every job file its `jobs` glob names.
    pub(super) fn load(mut self, path: &Path) -> Result<Config, ConfigErrors> {
        let src = self.source(path)?;
        let raw: RawConfig = toml::from_str(src.text()).map_err(|e| src.from_toml(&e))?;
        let dir = config_dir(path);

        let redis = self.redis(&src, &raw.redis);
        let worker = self.worker(&src, &raw.worker);
        let metrics = self.metrics(&src, &raw.metrics);
        let log_format = self.log(&src, &raw.log);
        let state_dir = self.state_dir(&src, &dir, raw.state_dir.as_deref());
        let credentials = self.credentials(&src, &dir, &raw.credentials, &raw.endpoints);
        let endpoints = self.endpoints(&src, &raw.endpoints, &credentials);
        self.check_upstream_windows(&src, &raw);
        self.credential_windows = (credentials.values())
            .map(|c| (c.name.clone(), c.windows.clone()))
            .collect();
        let jobs = match &raw.jobs {
            Some(glob) => self.jobs(&src, &dir, glob, &endpoints),
            None => IndexMap::new(),
        };

        if !self.errors.is_empty() {
            return Err(ConfigErrors(self.errors));
        }
        Ok(Config {
            path: path.to_owned(),
            dir,
            state_dir,
            redis,
            worker,
            metrics,
            log_format,
            credentials,
            endpoints,
            jobs,
            fingerprint: self.read.digest().to_string()[..12].to_owned(),
        })
    }

    /// Reports `message` at `at` in `src`.
    fn error(&mut self, src: &Source, at: &FieldPath, message: impl Into<String>) {
        self.errors.push(src.error(at, message));
    }

    /// The word written at `at`, or `None` with the error reported.
    fn pick<T: Choice>(&mut self, src: &Source, at: &FieldPath, written: &str) -> Option<T> {
        T::parse(written).map_err(|e| self.error(src, at, e)).ok()
    }

    /// The word written at `at`, `default` when none is; on an error (reported)
    /// also `default`, so the rest of the table is still checked.
    fn pick_or<T: Choice>(
        &mut self,
        src: &Source,
        at: &FieldPath,
        written: Option<&str>,
        default: T,
    ) -> T {
        written.map_or(default, |w| self.pick(src, at, w).unwrap_or(default))
    }

    /// Reports a credential, endpoint or job name that cannot be part of a
    /// Redis key.
    fn check_name(&mut self, src: &Source, at: &FieldPath, what: &str, name: &str) {
        if !valid_name(name) {
            self.error(src, at, format!("bad {what} name {name:?}: {NAME_RULE}"));
        }
    }

    /// An IANA time zone, `default` when none is written (or on an error,
    /// reported with `example` as the name to write).
    fn timezone(
        &mut self,
        src: &Source,
        at: &FieldPath,
        written: Option<&str>,
        default: Tz,
        example: &str,
    ) -> Tz {
        let Some(written) = written else {
            return default;
        };
        written.parse::<Tz>().unwrap_or_else(|_| {
            let msg = format!("unknown time zone {written:?}: use an IANA name like {example:?}");
            self.error(src, at, msg);
            default
        })
    }

    /// A field holding a JSON pointer; `non_empty` when "" (the whole body)
    /// makes no sense there. `example` is a pointer to suggest.
    fn check_pointer(
        &mut self,
        src: &Source,
        at: &FieldPath,
        pointer: &str,
        non_empty: bool,
        example: &str,
    ) {
        if !valid_pointer(pointer) || (non_empty && pointer.is_empty()) {
            let msg = format!("{pointer:?} is not a JSON pointer like {example:?}");
            self.error(src, at, msg);
        }
    }
}

/// Reads a config or job file.
fn read_source(path: &Path) -> Result<Source, ConfigError> {
    let text = read_bounded(path, d::MAX_CONFIG_FILE_BYTES, "a config or job file")
        .map_err(|e| Source::file_error(path, format!("cannot read: {e}")))?;
    Ok(Source::new(path, text))
}

/// Reads a file of at most `limit` bytes (`what` names the kind of file in
/// the error). Anything but a regular file is refused unopened: reading a
/// device (`-c /dev/zero`) never ends, opening a FIFO blocks.
pub(crate) fn read_bounded(path: &Path, limit: u64, what: &str) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;

    let too_big = |size: &str| {
        let max = fmt_bytes(limit);
        format!("it is {size}, more than the {max} {what} may have")
    };
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    let t = meta.file_type();
    let kind = match () {
        _ if t.is_file() => None,
        _ if t.is_dir() => Some("a directory"),
        _ if t.is_char_device() => Some("a character device"),
        _ if t.is_block_device() => Some("a block device"),
        _ if t.is_fifo() => Some("a FIFO"),
        _ if t.is_socket() => Some("a socket"),
        _ => Some("not a file"),
    };
    if let Some(kind) = kind {
        return Err(format!("it is {kind}, not a regular file"));
    }
    if meta.len() > limit {
        return Err(too_big(&format!("{} bytes", meta.len())));
    }
    // Bounded again while reading: the file may grow, and some (in /proc)
    // say they are empty.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit + 1).read_to_string(&mut text))
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > limit {
        return Err(too_big("larger"));
    }
    Ok(text)
}

/// "1 MiB", "64 KiB", "100 bytes".
fn fmt_bytes(n: u64) -> String {
    match n {
        _ if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        _ if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{} KiB", n >> 10),
        _ => format!("{n} bytes"),
    }
}

/// The config file's directory, absolute where it exists: relative paths in
/// the config resolve against it.
fn config_dir(path: &Path) -> PathBuf {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

const NAME_RULE: &str =
    "names may use letters, digits, '.', '_' and '-' (they become parts of Redis keys)";

/// A JSON pointer as RFC 6901 spells it ("" or starting with '/').
fn valid_pointer(p: &str) -> bool {
    p.is_empty() || p.starts_with('/')
}

/// Expands `$VAR`, `${VAR}` and `${VAR:-default}` (default when unset or
/// empty), for `$CREDENTIALS_DIRECTORY` and `$STATE_DIRECTORY` under systemd.
fn expand_vars(s: &str, env: EnvLookup<'_>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, default, tail) = if let Some(inner) = after.strip_prefix('{') {
            let end = inner
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
            let body = &inner[..end];
            match body.split_once(":-") {
                Some((name, default)) => (name, Some(default), &inner[end + 1..]),
                None => (body, None, &inner[end + 1..]),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], None, &after[end..])
        };
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("bad variable name {name:?} in {s:?}"));
        }
        let v = match (env(name).filter(|v| !v.is_empty()), default) {
            (Some(v), _) => v,
            (None, Some(d)) => d.to_owned(),
            (None, None) => return Err(format!("environment variable {name} is not set")),
        };
        out.push_str(&v);
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x".repeat(100)).unwrap();
        assert_eq!(read_bounded(&file, 100, "a file").unwrap().len(), 100);
        let err = read_bounded(&file, 99, "a file").unwrap_err();
        assert_eq!(
            err,
            "it is 100 bytes, more than the 99 bytes a file may have"
        );
        let err = read_bounded(dir.path(), 100, "a file").unwrap_err();
        assert_eq!(err, "it is a directory, not a regular file");
        let err = read_bounded(Path::new("/dev/zero"), 100, "a file").unwrap_err();
        assert_eq!(err, "it is a character device, not a regular file");
        // A FIFO would block the open: refused before it.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid, NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_bounded(&fifo, 100, "a file").unwrap_err();
        assert_eq!(err, "it is a FIFO, not a regular file");
        assert_eq!(fmt_bytes(d::MAX_CONFIG_FILE_BYTES), "1 MiB");
        assert_eq!(fmt_bytes(d::MAX_SECRET_FILE_BYTES), "64 KiB");
    }

    #[test]
    fn expands_systemd_variables() {
        let env =
            |k: &str| (k == "CREDENTIALS_DIRECTORY").then(|| "/run/credentials/qw".to_owned());
        assert_eq!(
            expand_vars("$CREDENTIALS_DIRECTORY/yt-key1", &env).unwrap(),
            "/run/credentials/qw/yt-key1"
        );
        assert_eq!(
            expand_vars("${CREDENTIALS_DIRECTORY}/k", &env).unwrap(),
            "/run/credentials/qw/k"
        );
        assert!(
            expand_vars("$NOPE/k", &env)
                .unwrap_err()
                .contains("NOPE is not set")
        );
        assert_eq!(
            expand_vars("${NOPE:-../secrets}/k", &env).unwrap(),
            "../secrets/k"
        );
        assert_eq!(
            expand_vars("${CREDENTIALS_DIRECTORY:-x}/k", &env).unwrap(),
            "/run/credentials/qw/k"
        );
    }
}
