//! What `/proc` says about a process: its parent, command name and state
//! (`/proc/PID/stat`, parsed in one place), its children, its environment
//! and its memory, and the peak memory of a command run to its end.
//! Linux only, as the product's systemd integration is.

/// The fields of `/proc/PID/stat` the tests need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The command name (`comm`, at most 15 bytes).
    pub comm: String,
    /// `R`, `S`, `D`, `T`, `Z`, `X`, ...
    pub state: String,
    /// The parent's pid.
    pub ppid: u32,
}

/// Reads `/proc/PID/stat`; `None` when the process is gone.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
    // it runs from the first '(' to the last ')'.
    let (open, close) = (text.find('(')?, text.rfind(')')?);
    let comm = text.get(open + 1..close)?.to_owned();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.to_owned();
    let ppid = rest.next()?.parse().ok()?;
    Some(Stat { comm, state, ppid })
}

/// Whether `pid` is a live process (a zombie waiting to be reaped is not).
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != "Z" && s.state != "X")
}

/// Pids of the children of `parent` whose command name is `comm`.
pub fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| stat(*pid).is_some_and(|s| s.ppid == parent && s.comm == comm))
        .collect()
}

/// The pid of `parent`'s child running `comm`, if any.
pub fn child_pid(parent: u32, comm: &str) -> Option<u32> {
    children_named(parent, comm).into_iter().next()
}

/// The environment of process `pid`, as `NAME=value` strings.
pub fn environ(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/environ: {e}"));
    raw.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// A field of `/proc/PID/status` in KiB: `VmHWM` (the peak resident set),
/// `VmRSS` (the resident set now).
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// Runs `cmd` (its stdout and stderr piped) to its end: its exit code, its
/// stdout and stderr, and its peak resident set in KiB, read from `VmHWM`
/// every 5 ms while it runs (a lower bound, at most 5 ms short).
///
/// Not `wait4`'s `ru_maxrss`: a child spawned from the test binary counts
/// the test binary's own peak from before its `exec` (the kernel keeps the
/// old image's high-water mark), hundreds of MiB when other tests run.
pub fn run_with_peak_kib(mut cmd: std::process::Command) -> (Option<i32>, String, String, u64) {
    let mut child = cmd.spawn().expect("spawn");
    let (out, o) = super::process::collect_lines(child.stdout.take().expect("stdout"));
    let (err, e) = super::process::collect_lines(child.stderr.take().expect("stderr"));
    let pid = child.id();
    let mut peak = 0;
    let mut status = None;
    let every = std::time::Duration::from_millis(5);
    super::wait_every(std::time::Duration::from_secs(24 * 3600), every, || {
        // Read before reaping: once reaped, the pid may be another's.
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
            peak = peak.max(hwm.unwrap_or(0));
        }
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    let status = status.expect("the command ended");
    let _ = (o.join(), e.join());
    let text =
        |l: std::sync::Arc<std::sync::Mutex<Vec<String>>>| l.lock().expect("lines").join("\n");
    (status.code(), text(out), text(err), peak)
}
