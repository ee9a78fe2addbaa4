//! Promise (SPEC Part 2, "Upstream accounting"): every wait an upstream
//! asks for in `Retry-After` is read, as seconds, as decimal seconds
//! (Shopify's `2.0`) or as an HTTP date, and bounded: a huge one is clamped
//! to `max_block`, a negative or unreadable one is replaced by
//! `throttle_block`, each logged as written; the block says why
//! (`quota --json` `blocked_reason`).
//!
//! Also the harness the `accounting_*` and `resources` modules share: the real binary as a
//! daemon on a real Redis and the simulator in one of its accounting
//! styles, ticks by `trigger --wait`, and what the simulator's request log
//! says about the adapter ([`Measure`]: over-limit answers after the first
//! answer, units used, units the upstream allowed and we left unused).

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use serde_json::Value;
use simulator::{Fault, SimConfig};

use crate::support;
use crate::support::process::Proc;
use crate::support::upstream::Upstream;
use crate::support::world::{self, CREDENTIAL, ENDPOINT, JOB, SECRET};
use crate::support::{ConfigBuilder, Endpoint, Job, RedisServer, TestConfig, Window};

/// The shared rig ([`support::rig::Rig`]: the daemon on its own Redis)
/// and the simulator it pages, with what the accounting modules ask of
/// them: the world's job triggered, its credential's block, and what the
/// simulator's log says ([`Measure`]).
pub(crate) struct Rig {
    pub(crate) upstream: Upstream,
    rig: support::rig::Rig,
}

impl Deref for Rig {
    type Target = support::rig::Rig;

    fn deref(&self) -> &support::rig::Rig {
        &self.rig
    }
}

impl DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut support::rig::Rig {
        &mut self.rig
    }
}

/// The job [`JOB`] on [`ENDPOINT`]: the simulator's videos at `base`, one
/// task per `regions`, unpaged (see [`paged`]), no retries.
pub(crate) fn job(base: &str, regions: &[&str]) -> Job {
    Job::videos(JOB, ENDPOINT, base)
        .fan_out("region", regions.iter().copied())
        .retry(1, None, None)
}

/// `j` paged in `style` (`[job.pagination]` fields), up to `pages` a run.
pub(crate) fn paged(j: Job, style: &[(&str, &str)], pages: u32) -> Job {
    let mut j = j.pagination("max_pages", i64::from(pages));
    for (k, v) in style {
        j = j.pagination(k, *v);
    }
    j
}

/// GitHub as the simulator plays it: `pages` pages a query of 2 items,
/// paged by `Link`, its `x-ratelimit-*` headers (the key, resources and
/// costs are the test's).
pub(crate) fn github(pages: u32) -> SimConfig {
    SimConfig {
        pages_per_query: pages,
        items_per_page: 2,
        style: simulator::SimStyle::Link,
        accounting: simulator::SimAccounting::Github,
        ..SimConfig::default()
    }
}

/// One config: two quick worker slots, the world's credential with
/// `window`, its endpoint as `endpoint` makes it (cost `cost`), and `job`.
pub(crate) fn config(
    window: Window,
    cost: u64,
    endpoint: impl FnOnce(Endpoint) -> Endpoint,
    job: Job,
) -> ConfigBuilder {
    ConfigBuilder::new()
        .worker(world::quick_worker(2))
        .credential(world::credential(window))
        .endpoint(endpoint(Endpoint::new(ENDPOINT, CREDENTIAL, cost)))
        .job(job)
}

impl Rig {
    /// Starts Redis, the simulator on `sim` (with the key [`SECRET`]
    /// added by the caller), `before` on it (another consumer, faults),
    /// and the daemon on the config `config` builds from its base URL.
    pub(crate) fn start(
        sim: SimConfig,
        before: impl FnOnce(&Upstream),
        config: impl FnOnce(&str) -> ConfigBuilder,
    ) -> Rig {
        let redis = RedisServer::start();
        let upstream = Upstream::with(sim);
        before(&upstream);
        let cfg = config(&upstream.base_url()).write();
        let rig = support::rig::Rig::start(redis, cfg, &[]);
        Rig { upstream, rig }
    }

    /// [`Rig::start`] with nothing done to the simulator first.
    pub(crate) fn on(sim: SimConfig, config: impl FnOnce(&str) -> ConfigBuilder) -> Rig {
        Self::start(sim, |_| {}, config)
    }

    /// `trigger JOB --wait`: the exit code and the summary line.
    pub(crate) fn trigger(&self) -> (Option<i32>, String) {
        self.trigger_job(JOB)
    }

    /// `trigger job --wait`: the exit code and the summary line.
    pub(crate) fn trigger_job(&self, job: &str) -> (Option<i32>, String) {
        let t = self.rig.trigger(job);
        (t.code, t.summary().to_owned())
    }

    /// `quota CREDENTIAL --json`'s credential.
    pub(crate) fn quota(&self) -> Value {
        self.rig.quota(CREDENTIAL)
    }

    /// `quota credential --json`'s credential.
    pub(crate) fn quota_of(&self, credential: &str) -> Value {
        self.rig.quota(credential)
    }

    /// The credential's block, as `quota --json` shows it.
    pub(crate) fn blocked(&self) -> (Duration, Option<String>) {
        let q = self.quota();
        let ms = q["blocked_for_ms"].as_u64().expect("blocked_for_ms");
        let why = q["blocked_reason"].as_str().map(str::to_owned);
        (Duration::from_millis(ms), why)
    }

    /// Ends the block in force now, as if its time had passed (a test
    /// cannot wait a minute); its reasons go with it, as they would (the
    /// streak stays: it outlives the block by an hour).
    pub(crate) fn end_block(&self) {
        let keys = crate::support::keys::keys();
        let () = self.redis.cmd(&[
            "DEL",
            &keys.blocked(CREDENTIAL),
            &keys.block_kind(CREDENTIAL),
            &keys.block_reason(CREDENTIAL),
        ]);
    }

    /// What the simulator's log says about this run.
    pub(crate) fn measure(&self, adapter: &str) -> Measure {
        let stats = self.upstream.stats();
        let key = stats.key(SECRET);
        let ours: Vec<_> = stats
            .requests
            .iter()
            .filter(|r| r.key.as_deref() == Some(SECRET))
            .collect();
        let m = Measure {
            requests: ours.len(),
            over_limit: ours.iter().filter(|r| r.over_limit).count(),
            over_limit_after_first: ours.iter().skip(1).filter(|r| r.over_limit).count(),
            used: key.units,
            burned: key.burned,
            left: self.upstream.left(SECRET),
        };
        println!(
            "accounting {adapter}: {} requests, over-limit answers {} ({} after the first answer); units used {}, burned by another consumer {}, allowed but left unused {}",
            m.requests, m.over_limit, m.over_limit_after_first, m.used, m.burned, m.left
        );
        m
    }
}

/// One run, from the simulator's request log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measure {
    /// Requests quota-worker sent.
    pub(crate) requests: usize,
    /// The upstream's own over-limit answers to them.
    pub(crate) over_limit: usize,
    /// ... after the first answer (which resynced the windows).
    pub(crate) over_limit_after_first: usize,
    /// Units the upstream charged quota-worker.
    pub(crate) used: u64,
    /// Units another consumer spent on the same key.
    pub(crate) burned: u64,
    /// Units the upstream would still allow now: left unused.
    pub(crate) left: u64,
}

/// The log lines with `message`, as JSON.
fn logged(d: &Proc, message: &str) -> Vec<Value> {
    d.messages(message)
}

#[test]
fn retry_after_is_read_in_every_form_and_bounded() {
    let _machine = crate::support::machine::timing();
    let sim = SimConfig {
        pages_per_query: 1,
        items_per_page: 2,
        ..SimConfig::default()
    }
    .key(SECRET, 1_000_000, Duration::from_secs(3600));
    let rig = Rig::on(sim, |base| {
        config(
            Window::sliding(1000, "1h"),
            1,
            |e| e.throttle_block("7s").set("max_block", "30s"),
            job(base, &["US"]),
        )
    });
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(5));
    // (Retry-After as sent, the block it must make: at least, at most)
    let cases: [(&str, Duration, Duration); 5] = [
        ("2.0", Duration::from_millis(1500), Duration::from_secs(2)),
        ("3", Duration::from_millis(2500), Duration::from_secs(3)),
        (&date, Duration::from_secs(2), Duration::from_secs(5)),
        // Negative and garbage: throttle_block (7 s), logged as written.
        ("-5", Duration::from_secs(6), Duration::from_secs(7)),
        // Years: max_block (30 s), logged as written.
        (
            "99999999999",
            Duration::from_secs(29),
            Duration::from_secs(30),
        ),
    ];
    for (raw, at_least, at_most) in cases {
        rig.upstream.inject(Fault::RetryAfter(raw.to_owned()), 1);
        let (code, summary) = rig.trigger();
        assert_eq!(code, Some(75), "{raw}: {summary}");
        assert!(summary.contains("1 upstream_throttled"), "{raw}: {summary}");
        let (blocked, why) = rig.blocked();
        assert!(
            blocked >= at_least && blocked <= at_most,
            "Retry-After {raw:?}: blocked for {blocked:?}, expected {at_least:?}..={at_most:?}"
        );
        assert_eq!(why.as_deref(), Some("429"), "{raw}");
        rig.end_block();
        // A successful answer ends the throttle streak, so each case's
        // block is its own (throttles in a row would double it).
        let (code, summary) = rig.trigger();
        assert_eq!(code, Some(0), "{raw}: the run after the block: {summary}");
    }
    let garbage = logged(
        &rig.daemon,
        "Retry-After is neither seconds nor an HTTP date; using throttle_block",
    );
    assert_eq!(garbage.len(), 1, "{garbage:?}");
    assert_eq!(garbage[0]["raw"], "-5");
    let clamped = logged(
        &rig.daemon,
        "the upstream asked for a longer wait than max_block; clamped to max_block",
    );
    assert_eq!(clamped.len(), 1, "{clamped:?}");
    assert_eq!(clamped[0]["raw"], "99999999999");
    // Each throttled task says how long and why.
    let throttled: Vec<_> = (rig.outcomes().into_iter())
        .filter(|o| o.kind == "upstream_throttled")
        .collect();
    assert_eq!(throttled.len(), cases.len());
    assert!(
        (throttled[0].message).contains("credential blocked for 2s (429)"),
        "{}",
        throttled[0]
    );
}

/// docs/upstreams.md's worked configs (each a config file and a job file)
/// load as written, each with its adapter and a mirrored window.
#[test]
fn the_worked_configs_in_the_docs_load() {
    let doc = include_str!("../../docs/upstreams.md");
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    let pairs: Vec<(&str, &str)> = blocks
        .windows(2)
        .filter(|w| w[0].starts_with("# config/") && w[1].starts_with("# jobs/"))
        .map(|w| (w[0], w[1]))
        .collect();
    assert_eq!(
        pairs.len(),
        5,
        "GitHub, GitHub GraphQL, Shopify, Instagram, IETF"
    );
    let mut capped = 0;
    for (config, job) in pairs {
        let name = job
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("# jobs/");
        let cfg = TestConfig::new(&format!("jobs = \"jobs/*.toml\"\n{config}"), &[(name, job)]);
        let loaded = quota_worker::config::Config::load(&cfg.path())
            .unwrap_or_else(|e| panic!("docs/upstreams.md, {name}: {e}"));
        let e = loaded.endpoints.values().next().expect("an endpoint");
        assert!(e.accounting.is_some(), "{name}");
        let cred = &loaded.credentials[&e.credential];
        assert!(cred.windows.iter().any(|w| w.upstream), "{name}");
        // The token's concurrent cap, as the comment says, holds every
        // endpoint's requests, whatever their resource.
        for e in loaded.endpoints.values() {
            let cap = (loaded.credentials[&e.credential].windows.iter())
                .find(|w| w.is_concurrent() && w.every_resource);
            if let Some(cap) = cap {
                let spent = loaded.windows_of(e);
                assert!(spent.iter().any(|(_, w)| *w == cap), "{name}: {}", e.name);
                capped += 1;
            }
        }
    }
    assert!(
        capped >= 3,
        "GitHub's REST, search and GraphQL endpoints: {capped}"
    );
}
