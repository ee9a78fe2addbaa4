//! `quota-worker keys ENDPOINT [--cost N] [--reserve P%]`: how another program
//! (PHP, Python, ...) calls `lua/spend.lua` to spend from the same windows.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::Exit;
use crate::config::{Config, Reserve};
use crate::quota::{Quotas, SCRIPT};

/// Runs the command.
pub fn run(config: &Config, endpoint: &str, cost: Option<u64>, reserve: Reserve) -> Exit {
    let quotas = Quotas::new(config);
    let cost = match quotas.checked_cost(endpoint, cost, reserve) {
        Ok(c) => c,
        Err(e) => return super::quota_error(config, &e),
    };
    let plan = &quotas.endpoint(endpoint).expect("checked above").plan;
    let script = match script_path(config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::Software;
        }
    };
    let out = json!({
        "script": script,
        "sha1": crate::quota::script().sha(),
        "keys": plan.keys,
        "args": plan.args("spend", "{request_id}", &cost.to_string(), reserve),
    });
    println!("{out:#}");
    Exit::Ok
}

/// A path holding exactly the script this binary runs: the repository's
/// `lua/spend.lua` when it matches, else a copy written to the state directory.
fn script_path(config: &Config) -> Result<PathBuf, String> {
    let candidates = [
        config.dir.join("../lua/spend.lua"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("lua/spend.lua"),
    ];
    for c in candidates {
        if std::fs::read_to_string(&c).is_ok_and(|s| s == SCRIPT) {
            return Ok(std::fs::canonicalize(&c).unwrap_or(c));
        }
    }
    let dir = config.state_dir.join("lua");
    let path = dir.join("spend.lua");
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, SCRIPT))
        .map_err(|e| format!("cannot write the spend script to {}: {e}", path.display()))?;
    Ok(path)
}
