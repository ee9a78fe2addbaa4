//! The faults, their seeded order, and the loop that injects them: one
//! every 6–14 s, each followed by a wait (at most 30 s) until every daemon
//! answers `/readyz` 200 again, which is what "survived" means in the table.
//! A fault on Redis is injected only while it is whole (a master, its
//! replica in sync, the sentinels agreeing): one that is not yet healed is
//! not failed again (that would test Redis, not the product); an upstream
//! fault stands in for it, and the log says so.

use std::time::{Duration, Instant};

use simulator::Fault as SimFault;

use crate::{Args, KINDS, Log, World};

/// A seeded generator (SplitMix64): the same seed, the same faults.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In `0..n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// In `lo..hi`.
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = (hi - lo).as_millis() as u64;
        lo + Duration::from_millis(self.next() % span.max(1))
    }
}

/// A fault kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// SIGKILL a daemon, start it again 2 s later.
    KillDaemon,
    /// `SENTINEL FAILOVER`.
    SentinelFailover,
    /// SIGKILL the master; start it again once the sentinels promoted the
    /// replica (it comes back as the new master's replica).
    KillMaster,
    /// Stop the master (SIGTERM) and start it again on its data.
    RestartRedis,
    /// The upstream answers 503 to the next 6 requests.
    Upstream5xx,
    /// The upstream holds the next 4 requests 3 s (and charges none).
    UpstreamSlow,
}

impl Fault {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::KillDaemon => "SIGKILL a daemon",
            Fault::SentinelFailover => "SENTINEL FAILOVER",
            Fault::KillMaster => "SIGKILL the master",
            Fault::RestartRedis => "restart Redis",
            Fault::Upstream5xx => "upstream 5xx",
            Fault::UpstreamSlow => "upstream slow",
        }
    }

    fn on_redis(self) -> bool {
        matches!(
            self,
            Fault::SentinelFailover | Fault::KillMaster | Fault::RestartRedis
        )
    }
}

/// One fault injected.
#[derive(Debug, Clone)]
pub(crate) struct Injected {
    pub(crate) fault: Fault,
    /// Seconds since the faults began.
    pub(crate) at: f64,
    /// What exactly (which daemon, which port, how long the failover took).
    pub(crate) detail: String,
    /// Seconds until every daemon answered `/readyz` 200 again; `None`:
    /// not within 30 s.
    pub(crate) ready_after: Option<f64>,
}

/// Injects faults for `args.run_for`; the faults, in order.
pub(crate) fn inject(w: &mut World, args: &Args) -> Log {
    let end = Instant::now() + args.run_for;
    let mut log = Vec::new();
    loop {
        let gap = w
            .rng
            .between(Duration::from_secs(6), Duration::from_secs(14));
        let next = (Instant::now() + gap).min(end);
        // The gap between faults, reaping what exits meanwhile.
        let left = next.saturating_duration_since(Instant::now());
        crate::support::holds_every(left, Duration::from_millis(200), || {
            w.reap();
            true
        });
        if Instant::now() >= end {
            return log;
        }
        let mut fault = KINDS[w.rng.below(KINDS.len())];
        let mut detail = String::new();
        if fault.on_redis() && !w.redis.healthy() {
            detail = format!("instead of {} (Redis not healed yet): ", fault.name());
            fault = Fault::Upstream5xx;
        }
        let at = w.at();
        detail += &apply(w, fault);
        let t = Instant::now();
        let ready = crate::verdict::wait_until(Duration::from_secs(30), || {
            w.reap();
            w.all_ready()
        });
        let ready_after = ready.then(|| t.elapsed().as_secs_f64());
        println!(
            "chaos: t={at:6.1}s {:<18} {detail}; all daemons ready {}",
            fault.name(),
            ready_after.map_or("NOT within 30 s".to_owned(), |s| format!("{s:.1} s after"))
        );
        log.push(Injected {
            fault,
            at,
            detail,
            ready_after,
        });
    }
}

/// Injects `fault`; what it did.
fn apply(w: &mut World, fault: Fault) -> String {
    match fault {
        Fault::KillDaemon => {
            let i = w.rng.below(w.daemons.len());
            w.daemons[i].proc.kill();
            // About time: started again 2 s later, as its unit would be.
            std::thread::sleep(Duration::from_secs(2));
            w.restart_daemon(i);
            format!("{} killed, started again 2 s later", w.daemons[i].label)
        }
        Fault::SentinelFailover => {
            let old = w.redis.master_port().unwrap_or_default();
            let t = Instant::now();
            w.redis.failover();
            match w.redis.wait_new_master(old, Duration::from_secs(30)) {
                Some(p) => format!("{old} -> {p} in {:.1} s", t.elapsed().as_secs_f64()),
                None => format!("{old}: no new master within 30 s"),
            }
        }
        Fault::KillMaster => {
            let i = w.redis.master_index();
            let old = w.redis.servers[i].port();
            let t = Instant::now();
            w.redis.servers[i].kill();
            let promoted = w.redis.wait_new_master(old, Duration::from_secs(30));
            let took = t.elapsed().as_secs_f64();
            w.redis.servers[i].restart();
            match promoted {
                Some(p) => {
                    format!("{old} killed, {p} promoted after {took:.1} s; {old} back as a replica")
                }
                None => format!("{old} killed, no promotion within 30 s; {old} started again"),
            }
        }
        Fault::RestartRedis => {
            let i = w.redis.master_index();
            let t = Instant::now();
            w.redis.servers[i].restart();
            format!(
                "{} stopped and started in {:.1} s",
                w.redis.servers[i].port(),
                t.elapsed().as_secs_f64()
            )
        }
        Fault::Upstream5xx => {
            w.upstream.inject(SimFault::Status(503), 6);
            "the next 6 requests answered 503".to_owned()
        }
        Fault::UpstreamSlow => {
            w.upstream
                .inject(SimFault::Delay(Duration::from_secs(3)), 4);
            "the next 4 requests held 3 s".to_owned()
        }
    }
}
