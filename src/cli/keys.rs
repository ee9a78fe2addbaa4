//! `quota-worker keys ENDPOINT [--cost N] [--reserve P%]`: how another program
//! (PHP, Python, ...) calls the spend core to spend from the same windows
//! (and, on an endpoint with a concurrent window, to return the lease a
//! spend takes): by `FCALL` of the function library the daemon loads
//! (Redis 7), or by `EVALSHA` of the one script built from the same source
//! (any Redis), with the same KEYS and ARGV. `keys --script` prints that
//! script, `keys --library` the library (`FUNCTION LOAD`). An endpoint of a
//! template credential is named with one tenant (`keys 'ig.media[account=123]'`):
//! the keys are that tenant's.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::Exit;
use crate::config::{Config, Reserve};
use crate::keys::KeySpace;
use crate::quota::{Op, Operation, Quotas, SCRIPT};

/// What another program replaces with a unique id per upstream request
/// (the spend core refuses it as it stands).
const REQUEST_ID: &str = "{request_id}";

/// Runs the command.
pub fn run(config: &Config, name: &str, cost: Option<u64>, reserve: Reserve) -> Exit {
    let (endpoint, tenant) = match super::tenant::endpoint_or_exit(config, name, "keys") {
        Ok(found) => found,
        Err(code) => return code,
    };
    let quotas = Quotas::new(config);
    let cost = match quotas.checked_cost(&endpoint, cost, reserve) {
        Ok(c) => c,
        Err(e) => return super::quota_error(config, &e),
    };
    let ep = match quotas.endpoint_for(&endpoint, tenant.as_deref()) {
        Ok(ep) => ep,
        Err(e) => return super::quota_error(config, &e),
    };
    let plan = &ep.plan;
    let script = match script_path(config) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Exit::Software;
        }
    };
    let spend = plan.layout(&Operation::Spend {
        request_id: REQUEST_ID,
        cost,
        reserve,
        ticket: None,
        history: true,
    });
    let mut out = json!({
        "script": script,
        "sha1": crate::quota::script().sha(),
        "keys": spend.keys,
        "args": spend.args,
        "fcall": fcall(Op::Spend),
    });
    if tenant.is_some() {
        // The tenant's name, as `quota` shows it and its keys carry it.
        out["tenant"] = json!(plan.credential);
    }
    if ep.takes_lease() {
        out["settle"] = settle(plan, lease_ms(config, &endpoint));
    }
    if !config.redis.quota_nodes.is_empty() {
        out["cluster"] = cluster(config, &plan.credential);
    }
    if config.redis.quota_replicas > 0 {
        out["wait"] = wait(config);
    }
    emit(&format!("{out:#}\n"))
}

/// Writes `text` to stdout. A reader that stops early (`keys ... | head`)
/// is not an error, where `print!` would panic on the closed pipe.
fn emit(text: &str) -> Exit {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Exit::Ok,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Exit::Ok,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            Exit::IoErr
        }
    }
}

/// How long an endpoint's lease lasts unreturned: the longest of its
/// concurrent windows'.
fn lease_ms(config: &Config, endpoint: &str) -> u64 {
    let ep = &config.endpoints[endpoint];
    (config.windows_of(ep).iter())
        .filter_map(|(_, w)| w.lease_for(ep))
        .max()
        .map_or(0, |l| l.as_millis() as u64)
}

/// How to return the lease a spend takes on an endpoint with a concurrent
/// window: the same script, op `settle`, once the request's answer has been
/// read or the request failed.
fn settle(plan: &crate::quota::Plan, lease_ms: u64) -> serde_json::Value {
    let mut settle = plan.layout(&Operation::Settle {
        request_id: REQUEST_ID,
        actual: 0,
        history: true,
    });
    // The cost is the caller's to fill in.
    settle.args[2] = "{cost}".to_owned();
    json!({
        "keys": settle.keys,
        "args": settle.args,
        "fcall": fcall(Op::Settle),
        "lease_ms": lease_ms,
        "how": format!(
            "an admitted spend holds a lease in the endpoint's concurrent window(s) until it is settled:              once the request's answer has been read (or the request failed), run the same script with these keys and args,              {{request_id}} the spend's id and {{cost}} what the request cost (the spend's cost when the upstream says nothing;              0 when it was never sent, which also refunds its units); the reply is [windows that held the spend].              A lease not returned lapses {lease_ms} ms after the spend"
        ),
    })
}

/// How to call operation `op` as a function of the library (Redis 7).
fn fcall(op: Op) -> serde_json::Value {
    let f = op.function();
    let library = crate::quota::library().name();
    json!({
        "function": f.name(),
        "library": library,
        "how": format!(
            "on Redis 7 and later: FCALL {} <number of keys> <keys> <args>, the same keys and args as EVALSHA takes \
             (cheaper for Redis: the library's helpers are loaded once, not run on every call); \
             a quota-worker process loads library {library} where it is missing; on an error \
             \"Function not found\" (no quota-worker has called since the Redis started, or lost it) \
             either load it (FUNCTION LOAD with the text `quota-worker keys --library` prints) and call again, \
             or call the script by EVALSHA as below",
            f.name()
        ),
    })
}

/// How to call the script on the cluster of `[redis] quota_nodes`.
fn cluster(config: &Config, credential: &str) -> serde_json::Value {
    let tag = KeySpace::hash_tag(credential);
    let nodes: Vec<String> = (config.redis.quota_nodes.iter())
        .map(ToString::to_string)
        .collect();
    json!({
        "nodes": nodes,
        "hash_tag": tag,
        "how": format!(
            "every key carries the hash tag {tag}, so all of them are in one slot (CLUSTER KEYSLOT {tag}); \
             send FCALL (or EVALSHA) to the master that owns it (a cluster client routes both by their first key and follows MOVED/ASK); \
             on NOSCRIPT, send EVAL with the script's text to the same node; quota-worker loads its library on every master"
        ),
    })
}

/// The `WAIT` that `[redis] quota_replicas` asks after an admitted spend.
fn wait(config: &Config) -> serde_json::Value {
    let replicas = config.redis.quota_replicas;
    let timeout_ms = crate::quota::replica_wait(config.redis.timeout).as_millis() as u64;
    json!({
        "replicas": replicas,
        "timeout_ms": timeout_ms,
        "how": format!(
            "after an admitted spend (reply[1] == 1), send WAIT {replicas} {timeout_ms} on the same connection to the same node \
             (pipelined after EVALSHA, so nothing else runs between them); if it answers fewer than {replicas}, \
             the spend may be lost in a failover: do not send the request, and refund it \
             (the same script, op \"settle\", the same request id, actual cost 0)"
        ),
    })
}

/// Prints the spend script this binary runs (`keys --script`).
pub fn print_script() -> Exit {
    emit(SCRIPT)
}

/// Prints the function library this binary loads (`keys --library`), as
/// `FUNCTION LOAD` takes it.
pub fn print_library() -> Exit {
    emit(crate::quota::library().source())
}

/// A path holding exactly the script this binary runs, wherever the binary
/// is installed: a copy written to `<state_dir>/lua/spend.lua`, else (a
/// state directory this user may not write) to the temporary directory.
fn script_path(config: &Config) -> Result<PathBuf, String> {
    let sha = crate::quota::script().sha();
    let places = [
        config.state_dir.join("lua/spend.lua"),
        std::env::temp_dir().join(format!("quota-worker-spend-{sha}.lua")),
    ];
    let mut errors = Vec::new();
    for path in places {
        match write_script(&path) {
            Ok(()) => return Ok(std::fs::canonicalize(&path).unwrap_or(path)),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    Err(format!(
        "cannot write the spend script ({}); `quota-worker keys --script` prints it",
        errors.join("; ")
    ))
}

/// Makes `path` hold the script: left alone when it already is this user's
/// own regular file holding it, else written whole (a temporary file
/// renamed into place), never half.
///
/// The temporary file is new and of an unguessable name (`O_EXCL` never
/// follows a link): in the shared temporary directory, a predictable name
/// is a link another user plants to have this process overwrite one of its
/// files. And a script file there that another user owns (or a link to
/// one) is not ours to hand out: they could change it after `keys` printed
/// its path. Our own user id is read off the temporary file.
fn write_script(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".spend.lua.{}", uuid::Uuid::new_v4().simple()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, SCRIPT.as_bytes())?;
            f.metadata()
        })
        .and_then(|ours| {
            let theirs = std::fs::symlink_metadata(path);
            let same = theirs.is_ok_and(|m| m.is_file() && m.uid() == ours.uid())
                && std::fs::read_to_string(path).is_ok_and(|s| s == SCRIPT);
            if same {
                std::fs::remove_file(&tmp)
            } else {
                std::fs::rename(&tmp, path)
            }
        });
    written.inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}
