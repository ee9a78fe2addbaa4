//! What tests and benchmarks need to know of a sliding window's Redis layout
//! (v2, `lua/spend.lua`): writing many entries into it at chosen past times,
//! and reading when a request was spent. Kept in one place so the layout is
//! known here and in the script only; the window's key names come from
//! `KeySpace::window` (`support::keys::window`): meta, log, ts, adj.

use super::RedisServer;

/// The seeding script (`seed_window.lua`).
pub const SEED: &str = include_str!("seed_window.lua");

/// The script that takes a window's newest entry back (`pop_newest.lua`).
#[allow(dead_code, reason = "the benchmark uses it, the tests do not")]
pub const POP: &str = include_str!("pop_newest.lua");

/// The command that takes entry `id`, the newest of the window `keys`
/// (meta, log, ts, adj), back out, as if never spent; returns its units.
#[allow(dead_code, reason = "the benchmark uses it, the tests do not")]
pub fn pop_cmd(keys: &[String], id: &str) -> redis::Cmd {
    let mut c = redis::cmd("EVAL");
    c.arg(POP).arg(4).arg(keys).arg(id);
    c
}

/// Where `n` seeded entries go: entry `i` is `{prefix}{i:07}`, spent at
/// `first + i / group * step` µs.
#[derive(Debug, Clone, Copy)]
pub struct Seed<'a> {
    pub prefix: &'a str,
    pub n: usize,
    pub cost: u64,
    pub first_us: i64,
    pub step_us: i64,
    pub group: usize,
    /// The window's period, ms.
    pub per_ms: u64,
}

impl Seed<'_> {
    /// The command that appends the entries to the window `keys` (meta, log,
    /// ts, adj); returns the window's total position after them.
    pub fn cmd(&self, keys: &[String]) -> redis::Cmd {
        let mut c = redis::cmd("EVAL");
        c.arg(SEED)
            .arg(4)
            .arg(keys)
            .arg(self.prefix)
            .arg(self.n)
            .arg(self.cost)
            .arg(self.first_us)
            .arg(self.step_us)
            .arg(self.group.max(1))
            .arg(self.per_ms);
        c
    }

    /// Appends them to the window `keys` on `server`.
    pub fn write(&self, server: &RedisServer, keys: &[String]) {
        let _: i64 = self
            .cmd(keys)
            .query(&mut server.conn())
            .expect("seed the window");
    }
}

/// The read-only snapshot script (`snapshot_window.lua`).
#[allow(dead_code, reason = "the benchmark uses it, the tests do not")]
pub const SNAPSHOT: &str = include_str!("snapshot_window.lua");

/// One window's entries at one instant: what each request id was charged
/// and when (µs, Redis time).
#[allow(dead_code, reason = "the benchmark uses it, the tests do not")]
pub fn snapshot_cmd(keys: &[String]) -> redis::Cmd {
    let mut c = redis::cmd("EVAL");
    c.arg(SNAPSHOT).arg(4).arg(keys);
    c
}

/// Decodes [`snapshot_cmd`]'s reply: request id -> (spend time µs, units),
/// for every id whose entry the snapshot holds with its predecessor.
#[allow(dead_code, reason = "the benchmark uses it, the tests do not")]
pub fn snapshot_entries(
    (base, ids, entries): (i64, Vec<(String, f64)>, Vec<i64>),
) -> std::collections::HashMap<String, (i64, u64)> {
    let mut before = std::collections::HashMap::new();
    let mut prev = base;
    let mut at = std::collections::HashMap::new();
    for pair in entries.chunks(2) {
        let (pos, t) = (pair[0], pair[1]);
        if pos > base {
            before.insert(pos, prev);
            at.insert(pos, t);
        }
        prev = pos;
    }
    ids.into_iter()
        .filter_map(|(id, pos)| {
            let pos = pos as i64;
            Some((id, (*at.get(&pos)?, (pos - before.get(&pos)?) as u64)))
        })
        .collect()
}

/// When `id` was spent in the window `keys` (µs, Redis time), if it holds it.
pub fn spend_time_us(server: &RedisServer, keys: &[String], id: &str) -> Option<i64> {
    let (log, ts) = (&keys[1], &keys[2]);
    let pos: Option<f64> = server.cmd(&["ZSCORE", log, id]);
    let pos = format!("{}", pos? as i64);
    let rows: Vec<(String, Vec<String>)> = server.cmd(&["XRANGE", ts, &pos, &pos]);
    let (entry, _) = rows.first()?;
    entry.split_once('-').and_then(|(_, t)| t.parse().ok())
}

/// Entries the stream of the window `keys` holds: one per spend (expired
/// ones are dropped lazily, a few calls later).
pub fn stream_len(server: &RedisServer, keys: &[String]) -> i64 {
    server.cmd(&["XLEN", &keys[2]])
}
