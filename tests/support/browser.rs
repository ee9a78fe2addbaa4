//! A real browser for the status page: Debian's headless `chromium`, run as
//! its own process group (it forks helpers) with a throwaway profile, for
//! the DOM after load (`--dump-dom`) and a screenshot. Bounded in time; a
//! browser that hangs is killed by its process group, which this started.
//!
//! When `chromium` is not installed the test fails and says how to get it
//! (`scripts/deps`), unless `QW_SKIP_BROWSER=1` asks to skip the browser.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long one browser run may take (a loaded 2-core CI machine included).
const PATIENCE: Duration = Duration::from_secs(90);

/// Headless Chromium with its own profile directory.
pub struct Chromium {
    bin: PathBuf,
    profile: tempfile::TempDir,
}

/// Where `name` is on `PATH`, if it is.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Chromium {
    /// The installed browser; `None` only when `QW_SKIP_BROWSER=1` (then the
    /// caller skips what needs it). Panics, saying what to do, when it is
    /// missing otherwise.
    pub fn find() -> Option<Chromium> {
        if std::env::var("QW_SKIP_BROWSER").as_deref() == Ok("1") {
            eprintln!("QW_SKIP_BROWSER=1: the browser part of this test is skipped");
            return None;
        }
        let bin = ["chromium", "chromium-browser"]
            .iter()
            .find_map(|n| on_path(n))
            .unwrap_or_else(|| {
                panic!(
                    "headless Chromium is needed for the status page test and is not installed: \
                     run `apt-get install -y chromium` (scripts/deps does), or set QW_SKIP_BROWSER=1 to skip it"
                )
            });
        Some(Chromium {
            bin,
            profile: tempfile::tempdir().expect("browser profile dir"),
        })
    }

    fn run(&self, what: &[String], url: &str) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args([
            "--headless",
            // Root (CI, containers) cannot use Chromium's sandbox.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1280,1700",
        ])
        .arg(format!("--user-data-dir={}", self.profile.path().display()))
        .args(what)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
        let child = cmd.spawn().expect("spawn chromium");
        let pgid = child.id() as i32;
        let started = Instant::now();
        let waiter = std::thread::spawn(move || child.wait_with_output());
        let finished =
            super::wait_every(PATIENCE, Duration::from_millis(50), || waiter.is_finished());
        if !finished {
            // SAFETY: kill(2) on the process group of the browser this
            // function started (its own group, made by process_group(0)).
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = waiter.join();
            panic!(
                "chromium did not finish within {PATIENCE:?} on {url} ({:?})",
                started.elapsed()
            );
        }
        // Helpers the browser left behind go with its group.
        // SAFETY: as above; the group may already be gone (ESRCH, ignored).
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        waiter.join().expect("waiter").expect("chromium output")
    }

    /// The DOM of `url` after it loaded, serialized.
    pub fn dump_dom(&self, url: &str) -> String {
        let out = self.run(&["--dump-dom".into()], url);
        let dom = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && dom.contains("</html>"),
            "chromium --dump-dom {url}: {:?}\nstdout: {dom}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        dom
    }

    /// Saves a screenshot of `url` as the PNG `to`.
    pub fn screenshot(&self, url: &str, to: &Path) {
        let _ = std::fs::remove_file(to);
        let out = self.run(&[format!("--screenshot={}", to.display())], url);
        let png = std::fs::read(to).unwrap_or_default();
        assert!(
            png.starts_with(b"\x89PNG"),
            "chromium --screenshot {url} wrote no PNG at {}: {:?}\nstderr: {}",
            to.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
