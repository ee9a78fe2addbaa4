//! Section `anatomy`: where a call's time goes inside Redis, read from
//! `INFO commandstats` (reset before each measurement): the Redis CPU time
//! per `EVALSHA` and per command the script ran. It explains two targets the
//! throughput and reject sections measure:
//!
//! - admitting at cost 1 against the naive log: beside both runs the
//!   *layout floor* (`benches/baseline/layout_floor.lua`), a script that
//!   makes only the calls any admission in spend.lua's layout must make (id,
//!   entry, counters) and checks nothing. Its time is the best any script on
//!   this layout can do; the gap from it to ours is our logic;
//! - refusing at cost 100 against cost 1 on a window of 10,000 cost-1
//!   entries: the one lookup both make (`XRANGE … COUNT 1`) is timed apart;
//! - a bucket window's admission against a sliding one's (the bucket
//!   section's target), without the client's share of the time;
//! - a concurrent window's admission (a lease) against a sliding one's (the
//!   concurrent section's target), likewise.
//!
//! Callers share one connection, as in the other sections. Nothing here
//! asserts a speed.

use std::collections::BTreeMap;
use std::time::Duration;

use quota_worker::config::Config;
use quota_worker::conn::Conn;
use quota_worker::conn::Lua;
use quota_worker::quota::{Decision, Limiter, Quotas, request_id};
use serde::Serialize;
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Plan, TIMEOUT, drive, median};
use crate::growth::{HUGE, NAIVE, PER_MS, PER_US, fill_ours, naive_key, ours_keys, quotas};
use crate::report::Section;
use crate::support::TestConfig;

static FLOOR: std::sync::LazyLock<Lua> =
    std::sync::LazyLock::new(|| Lua::new(include_str!("../baseline/layout_floor.lua")));

/// Units of the full window the refusals run on (entries of 1 unit).
const FULL: u64 = 10_000;

/// The calls measured.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Call {
    NaiveAdmit,
    FloorAdmit,
    OursAdmit,
    OursReject1,
    OursReject100,
    BucketAdmit,
    ConcurrentAdmit,
}

impl Call {
    const ALL: [Call; 7] = [
        Call::NaiveAdmit,
        Call::FloorAdmit,
        Call::OursAdmit,
        Call::OursReject1,
        Call::OursReject100,
        Call::BucketAdmit,
        Call::ConcurrentAdmit,
    ];

    fn label(self) -> &'static str {
        match self {
            Call::NaiveAdmit => "naive log, admit cost 1",
            Call::FloorAdmit => "layout floor, admit cost 1",
            Call::OursAdmit => "spend.lua, admit cost 1",
            Call::OursReject1 => "spend.lua, refuse cost 1 (10,000 entries of 1)",
            Call::OursReject100 => "spend.lua, refuse cost 100 (10,000 entries of 1)",
            Call::BucketAdmit => "spend.lua, admit cost 1, bucket window",
            Call::ConcurrentAdmit => "spend.lua, admit cost 1, concurrent window (a lease)",
        }
    }
}

/// One measurement: Redis µs per EVALSHA and per inner command (per EVALSHA).
#[derive(Debug, Clone, Default, Serialize)]
struct Cost {
    evalsha_us: f64,
    /// Command -> µs it took per EVALSHA (its calls x its µs per call / EVALSHAs).
    commands: BTreeMap<String, f64>,
}

impl Cost {
    fn commands_us(&self) -> f64 {
        self.commands.values().sum()
    }
}

/// `INFO commandstats` as command -> (calls, µs).
async fn commandstats(conn: &mut Conn) -> BTreeMap<String, (f64, f64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{f}=")))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        out.insert(name.to_owned(), (field("calls"), field("usec")));
    }
    out
}

struct Bench {
    limiter: Limiter,
    /// The bucket section's credentials (`bk`: a bucket that never fills)
    /// and the concurrent section's (`cc`: a concurrent window that never
    /// fills), on one limiter each.
    bucket: Limiter,
    concurrent: Limiter,
    conn: Conn,
    floor_keys: Vec<String>,
}

impl Bench {
    /// One call of `what`; panics if it is not admitted / refused as meant.
    async fn once(
        limiter: Limiter,
        [bucket, concurrent]: [Limiter; 2],
        mut conn: Conn,
        keys: Vec<String>,
        what: Call,
    ) {
        match what {
            Call::NaiveAdmit => {
                let r: Vec<i64> = NAIVE
                    .call()
                    .key(naive_key("an"))
                    .arg(request_id())
                    .arg(1)
                    .arg(HUGE)
                    .arg(PER_MS)
                    .invoke(&mut conn)
                    .await
                    .expect("naive spend");
                assert_eq!(r[0], 1, "naive: refused on a window that never fills");
            }
            Call::FloorAdmit => {
                let _: Vec<i64> = FLOOR
                    .call()
                    .key(&keys)
                    .arg(request_id())
                    .arg(1)
                    .invoke(&mut conn)
                    .await
                    .expect("floor call");
            }
            Call::OursAdmit => {
                let d = limiter.spend("an", Some(1), &request_id()).await;
                assert!(
                    d.expect("spend").is_allowed(),
                    "ours: refused on a window that never fills"
                );
            }
            Call::OursReject1 | Call::OursReject100 => {
                let cost = if what == Call::OursReject1 { 1 } else { 100 };
                let d = limiter.spend("rj", Some(cost), &request_id()).await;
                assert!(
                    matches!(d.expect("spend"), Decision::Rejected(_)),
                    "ours: admitted on a full window"
                );
            }
            Call::BucketAdmit => {
                let d = bucket.spend("bk", Some(1), &request_id()).await;
                assert!(
                    d.expect("spend").is_allowed(),
                    "ours: refused by a bucket that never fills"
                );
            }
            Call::ConcurrentAdmit => {
                let d = concurrent.spend("cc", Some(1), &request_id()).await;
                assert!(
                    d.expect("spend").is_allowed(),
                    "ours: refused by a concurrent window that never fills"
                );
            }
        }
    }

    /// Runs `what` at `n` callers for `d`; its Redis cost per call.
    async fn measure(&mut self, what: Call, n: usize, d: Duration) -> Cost {
        common::reset_stats(&mut self.conn).await;
        let (limiter, others, conn, keys) = (
            self.limiter.clone(),
            [self.bucket.clone(), self.concurrent.clone()],
            self.conn.clone(),
            self.floor_keys.clone(),
        );
        let (calls, _, _) = drive(n, d, move || {
            Bench::once(
                limiter.clone(),
                others.clone(),
                conn.clone(),
                keys.clone(),
                what,
            )
        })
        .await;
        let stats = commandstats(&mut self.conn).await;
        let (evals, usec) = stats.get("evalsha").copied().unwrap_or((0.0, 0.0));
        assert!(
            evals >= calls as f64,
            "{}: {evals} EVALSHA counted for {calls} calls",
            what.label()
        );
        let mut commands = BTreeMap::new();
        for (name, (c, u)) in &stats {
            if c > &0.0 && !matches!(name.as_str(), "evalsha" | "info" | "config|resetstat") {
                commands.insert(name.to_uppercase(), u / evals);
            }
        }
        Cost {
            evalsha_us: usec / evals,
            commands,
        }
    }
}

pub async fn run(ctx: &Ctx) -> Section {
    let plan = Plan::quick_or(
        ctx.quick,
        Plan {
            callers: vec![16],
            rounds: 5,
            round: Duration::from_millis(1_000),
        },
    );
    let n = plan.callers[0];
    let mut conn = common::connect(&ctx.redis).await;
    common::flushall(&mut conn).await;
    let q = quotas(&[("an", HUGE), ("rj", FULL)]);
    let limiter = Limiter::new(conn.clone(), q.clone(), TIMEOUT).without_history();
    let floor_keys = ["block", "clock", "meta", "log", "ts"]
        .map(|k| format!("floor:{{an}}:{k}"))
        .to_vec();

    // The refusals' window: exactly full, its 10,000 entries spread over the
    // last 30 minutes (as in the reject section).
    let now = common::redis_now_us(&mut conn).await;
    fill_ours(
        &mut conn,
        &ours_keys(&q, "rj"),
        7,
        FULL as usize,
        1,
        now - PER_US / 2,
        now - 1_000_000,
    )
    .await;
    let u = limiter.peek("rj").await.expect("peek").windows[0].clone();
    assert_eq!(
        (u.used, u.remaining),
        (FULL, 0),
        "the refusals' window is full"
    );

    let bucket_cfg = TestConfig::new(crate::bucket::CONFIG, &[]);
    let bucket = Limiter::new(
        conn.clone(),
        std::sync::Arc::new(Quotas::new(
            &Config::load(&bucket_cfg.path()).expect("bucket bench config"),
        )),
        TIMEOUT,
    )
    .without_history();
    let concurrent_cfg = TestConfig::new(crate::concurrent::CONFIG, &[]);
    let concurrent = Limiter::new(
        conn.clone(),
        std::sync::Arc::new(Quotas::new(
            &Config::load(&concurrent_cfg.path()).expect("concurrent bench config"),
        )),
        TIMEOUT,
    )
    .without_history();
    let mut bench = Bench {
        limiter,
        bucket,
        concurrent,
        conn: conn.clone(),
        floor_keys,
    };
    // rounds[call] = one Cost per round; round 0 warms up and is dropped.
    let mut rounds: Vec<Vec<Cost>> = Call::ALL.iter().map(|_| Vec::new()).collect();
    for r in 0..plan.rounds + 1 {
        for k in 0..Call::ALL.len() {
            let i = (k + r) % Call::ALL.len();
            let c = bench.measure(Call::ALL[i], n, plan.round).await;
            if r > 0 {
                rounds[i].push(c);
            }
        }
    }
    // The round with the median EVALSHA time stands for each call.
    let pick = |i: usize| -> Cost {
        let mut v = rounds[i].clone();
        v.sort_by(|a, b| a.evalsha_us.total_cmp(&b.evalsha_us));
        v[v.len() / 2].clone()
    };
    let costs: Vec<Cost> = (0..Call::ALL.len()).map(pick).collect();
    let spread = |i: usize| {
        let v: Vec<f64> = rounds[i].iter().map(|c| c.evalsha_us).collect();
        let (lo, hi) = common::min_max(&v);
        (median(v), lo, hi)
    };
    let naive = costs[0].evalsha_us;

    let mut md = format!(
        "Redis CPU per call from `INFO commandstats` (reset before each measurement): µs per \
         `EVALSHA`, and the µs each command inside it took per call. {n} callers on one \
         connection, {} interleaved rounds of {} ms, the median round (range in brackets). \
         \"rate ÷ naive\" is what the time per call allows: naive µs ÷ this call's µs. The \
         layout floor (`benches/baseline/layout_floor.lua`) makes only the calls any admission \
         in spend.lua's layout must make (read clock and counters, record the id, append the \
         entry, write the counters) and checks nothing.\n\n\
         | call | µs per call | rate ÷ naive | commands inside (µs per call) | commands in all | the rest: Lua and the call bridge |\n\
         |---|---:|---:|---|---:|---:|\n",
        plan.rounds,
        plan.round.as_millis()
    );
    let mut data = Vec::new();
    for (i, call) in Call::ALL.iter().enumerate() {
        let c = &costs[i];
        let (m, lo, hi) = spread(i);
        let inside = c
            .commands
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        md.push_str(&format!(
            "| {} | {:.1} ({lo:.1}–{hi:.1}) | {:.2}× | {inside} | {:.1} | {:.1} |\n",
            call.label(),
            m,
            naive / c.evalsha_us,
            c.commands_us(),
            c.evalsha_us - c.commands_us(),
        ));
        data.push(json!({
            "call": call.label(),
            "evalsha_us": { "median": m, "min": lo, "max": hi },
            "median_round": c,
        }));
    }
    let floor_vs_naive = naive / costs[1].evalsha_us;
    let ours_vs_floor = costs[1].evalsha_us / costs[2].evalsha_us;
    let bucket_vs_sliding = costs[2].evalsha_us / costs[5].evalsha_us;
    let concurrent_vs_sliding = costs[2].evalsha_us / costs[6].evalsha_us;
    let xr = |i: usize| costs[i].commands.get("XRANGE").copied().unwrap_or(0.0);
    md.push_str(&format!(
        "\nAt cost 1 the layout floor itself allows {floor_vs_naive:.2}× the naive log's rate; \
         spend.lua runs at {ours_vs_floor:.2}× the floor. A refusal at cost 100 spends \
         {:.1} µs in its `XRANGE` where one at cost 1 spends {:.1} µs: the entry 100 units on \
         sits further into its stream node (up to 100 entries, which Redis walks from the \
         node's start), the same constant at any window size (the growth section). A bucket \
         window's admission allows {bucket_vs_sliding:.2}× the rate of a sliding one's (the \
         bucket section's target, here without the client's share); a concurrent window's \
         (a lease) {concurrent_vs_sliding:.2}× (the concurrent section's).\n",
        xr(4),
        xr(3),
    ));
    common::flushall(&mut conn).await;
    Section {
        key: "anatomy",
        title: "Where a call's time goes inside Redis (issue 11)".into(),
        markdown: md,
        data: json!({
            "callers": n,
            "rounds": plan.rounds,
            "round_ms": plan.round.as_millis() as u64,
            "floor_rate_vs_naive": floor_vs_naive,
            "ours_rate_vs_floor": ours_vs_floor,
            "bucket_rate_vs_sliding": bucket_vs_sliding,
            "concurrent_rate_vs_sliding": concurrent_vs_sliding,
            "calls": data,
        }),
        targets: Vec::new(),
    }
}
