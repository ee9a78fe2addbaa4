//! Upstreams on loopback for the tests that drive processes: the real
//! simulated metered API (`simulator`) on a runtime of its own
//! (those tests are synchronous), a "blackhole" that accepts connections and
//! never answers, and readers of what the simulator saw.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use simulator::{Fault, SimConfig, SimStats, Simulator};

use super::world::{self, SECRET};

/// The simulated upstream, on its own runtime.
pub struct Upstream {
    sim: Option<Simulator>,
    /// The simulator's threads; dropped after it.
    _runtime: tokio::runtime::Runtime,
}

impl Upstream {
    /// [`world::sim`]: `pages` pages per query of `items` items, the one
    /// key [`SECRET`] with room for everything a test does.
    pub fn start(pages: u32, items: u32) -> Self {
        Self::with(world::sim(pages, items))
    }

    /// Starts it with `config`.
    pub fn with(config: SimConfig) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let sim = rt
            .block_on(Simulator::start(config))
            .expect("start simulator");
        Upstream {
            sim: Some(sim),
            _runtime: rt,
        }
    }

    fn sim(&self) -> &Simulator {
        self.sim.as_ref().expect("simulator running")
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        self.sim().base_url()
    }

    /// What it has seen so far.
    pub fn stats(&self) -> SimStats {
        self.sim().stats()
    }

    /// Requests and units of [`SECRET`] in flight at the upstream now.
    pub fn in_flight(&self) -> (u64, u64) {
        self.sim().in_flight(SECRET)
    }

    /// The next `count` requests get `fault`.
    pub fn inject(&self, fault: Fault, count: u32) {
        self.sim().inject(fault, count);
    }

    /// Drops every injected fault not yet used.
    pub fn clear_faults(&self) {
        self.sim().clear_faults();
    }

    /// Requests of [`SECRET`] answered by an injected fault so far (counted
    /// when the fault is taken: a delayed request counts while it is still
    /// waiting).
    pub fn injected(&self) -> u64 {
        self.stats().key(SECRET).injected
    }

    /// Marks every item updated now: `since` sees them again, `ETag`s change.
    pub fn touch(&self) {
        self.sim().touch();
    }

    /// Another program with `key` spends up to `units` now; returns what
    /// it could.
    pub fn burn(&self, key: &str, units: u64) -> u64 {
        self.sim().burn(key, units)
    }

    /// What the upstream would still allow `key` now, by its own count.
    pub fn left(&self, key: &str) -> u64 {
        self.sim().left(key)
    }

    /// Charged (2xx) requests so far.
    pub fn fetched(&self) -> usize {
        self.stats().charges.len()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // Dropping the simulator stops its server; the runtime goes after it.
        self.sim.take();
    }
}

/// How many times each page of each scope (region) was fetched (charged),
/// keyed by `(scope, page token)` with `None` for the first page.
pub fn page_counts(stats: &SimStats) -> HashMap<(String, Option<String>), usize> {
    let mut counts = HashMap::new();
    for (_, scope, token) in stats.fetched_pages() {
        *counts.entry((scope, token)).or_insert(0) += 1;
    }
    counts
}

/// The page number of a simulator page token: 1 for a first page, n for `pn`.
fn page_number(token: Option<&str>) -> u32 {
    match token {
        None => 1,
        Some(t) => t
            .strip_prefix('p')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected page token {t:?}")),
    }
}

/// Page numbers fetched per scope (region), in order: 1 for a first page,
/// n for token `pn`.
pub fn pages_by_scope(stats: &SimStats) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for c in &stats.charges {
        out.entry(c.scope.clone())
            .or_default()
            .push(page_number(c.page_token.as_deref()));
    }
    out
}

/// The record ids the upstream served: `<scope>-p<n>-i<k>` for each charged
/// page of `per_page` items, sorted.
pub fn served_ids(stats: &SimStats, per_page: u32) -> Vec<String> {
    let mut ids = Vec::new();
    for c in &stats.charges {
        let n = page_number(c.page_token.as_deref());
        for k in 1..=per_page {
            ids.push(format!("{}-p{n}-i{k}", c.scope));
        }
    }
    ids.sort();
    ids
}
/// A loopback HTTP "upstream" that accepts connections and never answers:
/// a task fetching from it stays in flight until its request times out.
pub struct Blackhole {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Blackhole {
    /// Listens on a free port of 127.0.0.1.
    pub fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let done = stop.clone();
        // Blocks in accept; `drop` sets `stop` and connects once to wake it.
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !done.load(Ordering::Relaxed) {
                if let Ok((s, _)) = listener.accept() {
                    held.push(s);
                }
            }
        });
        Blackhole {
            port,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept the thread blocks in (it then sees `stop`).
        let woke = std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok();
        if let Some(t) = self.thread.take()
            && woke
        {
            let _ = t.join();
        }
    }
}
