//! The embedded Redis: when `[redis] url` is omitted, the daemon runs its own
//! `redis-server` on a Unix socket in the state directory.

use std::path::{Path, PathBuf};

/// The embedded Redis's socket in `state_dir`.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("redis.sock")
}
