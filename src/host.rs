//! This host and process, as the product names them to other processes:
//! in apalis worker names, tick claims, and the item lock's holder (which
//! `quota-worker state` shows as "in flight on HOST").

use std::sync::LazyLock;

/// This host's name (`gethostname`), or `host` when it has none.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// `host:pid`: this process, read once.
pub(crate) fn process() -> &'static str {
    static PROCESS: LazyLock<String> =
        LazyLock::new(|| format!("{}:{}", hostname(), std::process::id()));
    &PROCESS
}
