//! Section `anatomy`: where a call's time goes inside Redis, read from
//! `INFO commandstats` (reset before each measurement): the Redis CPU time
//! per call (`FCALL` of the spend core's library, or `EVALSHA` of a script)
//! and per command it ran. Beside the library: the same files as one script
//! (what Redis 6 runs; here through a Redis user refused `FUNCTION` and
//! `FCALL`), and the script as it was before the library
//! (`tests/support/fixtures/spend_before_33.lua`), all in the same run. It explains two targets the
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
use quota_worker::quota::{Decision, Limiter, Operation, Quotas, request_id};
use serde::Serialize;
use serde_json::json;

use crate::Ctx;
use crate::common::{self, Plan, TIMEOUT, drive, median};
use crate::growth::{HUGE, NAIVE, PER_MS, PER_US, fill_ours, naive_key, ours_keys, quotas};
use crate::report::Section;

static FLOOR: std::sync::LazyLock<Lua> =
    std::sync::LazyLock::new(|| Lua::new(include_str!("../baseline/layout_floor.lua")));

/// lua/spend.lua as it was before the function library (issue 33).
static BEFORE: std::sync::LazyLock<Lua> = std::sync::LazyLock::new(|| {
    Lua::new(include_str!(
        "../../tests/support/fixtures/spend_before_33.lua"
    ))
});

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
    ScriptAdmit,
    BeforeAdmit,
    BeforeReject1,
}

impl Call {
    const ALL: [Call; 10] = [
        Call::NaiveAdmit,
        Call::FloorAdmit,
        Call::OursAdmit,
        Call::OursReject1,
        Call::OursReject100,
        Call::BucketAdmit,
        Call::ConcurrentAdmit,
        Call::ScriptAdmit,
        Call::BeforeAdmit,
        Call::BeforeReject1,
    ];

    /// The command Redis counts the call under.
    fn top(self) -> &'static str {
        match self {
            Call::NaiveAdmit
            | Call::FloorAdmit
            | Call::ScriptAdmit
            | Call::BeforeAdmit
            | Call::BeforeReject1 => "evalsha",
            _ => "fcall",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Call::NaiveAdmit => "naive log, admit cost 1",
            Call::FloorAdmit => "layout floor, admit cost 1",
            Call::OursAdmit => "spend core (FCALL), admit cost 1",
            Call::OursReject1 => "spend core (FCALL), refuse cost 1 (10,000 entries of 1)",
            Call::OursReject100 => "spend core (FCALL), refuse cost 100 (10,000 entries of 1)",
            Call::BucketAdmit => "spend core (FCALL), admit cost 1, bucket window",
            Call::ConcurrentAdmit => {
                "spend core (FCALL), admit cost 1, concurrent window (a lease)"
            }
            Call::ScriptAdmit => "spend core as one script (EVALSHA, Redis 6), admit cost 1",
            Call::BeforeAdmit => "before: spend.lua (EVALSHA), admit cost 1",
            Call::BeforeReject1 => {
                "before: spend.lua (EVALSHA), refuse cost 1 (10,000 entries of 1)"
            }
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

/// Everything a call needs, cloned into each caller.
#[derive(Clone)]
struct Clients {
    limiter: Limiter,
    /// The bucket section's credentials (`bk`: a bucket that never fills)
    /// and the concurrent section's (`cc`: a concurrent window that never
    /// fills), on one limiter each.
    bucket: Limiter,
    concurrent: Limiter,
    /// `an` and `rj` again, through a Redis user refused `FUNCTION` and
    /// `FCALL`: the spend core as one script, as on Redis 6.
    script: Limiter,
    conn: Conn,
    floor_keys: Vec<String>,
}

struct Bench {
    clients: Clients,
    conn: Conn,
}

impl Clients {
    /// The pre-library script's spend of `cost` on endpoint `endpoint`
    /// (the same keys and arguments as ours, without the history).
    async fn before(&self, endpoint: &str, cost: u64) -> Vec<i64> {
        let plan = &self
            .limiter
            .quotas()
            .endpoint(endpoint)
            .expect("endpoint")
            .plan;
        let id = request_id();
        let layout = plan.layout(&Operation::Spend {
            request_id: &id,
            cost,
            reserve: quota_worker::config::Reserve::NONE,
            ticket: None,
            history: false,
        });
        let mut call = BEFORE.call();
        call.key(layout.keys).arg(layout.args);
        call.invoke(&mut self.conn.clone()).await.expect("before")
    }

    /// One call of `what`; panics if it is not admitted / refused as meant.
    async fn once(self, what: Call) {
        let mut conn = self.conn.clone();
        let (spent, want_allowed) = match what {
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
                (r[0] == 1, true)
            }
            Call::FloorAdmit => {
                let _: Vec<i64> = FLOOR
                    .call()
                    .key(&self.floor_keys)
                    .arg(request_id())
                    .arg(1)
                    .invoke(&mut conn)
                    .await
                    .expect("floor call");
                (true, true)
            }
            Call::OursAdmit | Call::ScriptAdmit => {
                let l = if what == Call::OursAdmit {
                    &self.limiter
                } else {
                    &self.script
                };
                let d = l.spend("an", Some(1), &request_id()).await;
                (d.expect("spend").is_allowed(), true)
            }
            Call::OursReject1 | Call::OursReject100 => {
                let cost = if what == Call::OursReject1 { 1 } else { 100 };
                let d = self.limiter.spend("rj", Some(cost), &request_id()).await;
                (!matches!(d.expect("spend"), Decision::Rejected(_)), false)
            }
            Call::BucketAdmit => {
                let d = self.bucket.spend("bk", Some(1), &request_id()).await;
                (d.expect("spend").is_allowed(), true)
            }
            Call::ConcurrentAdmit => {
                let d = self.concurrent.spend("cc", Some(1), &request_id()).await;
                (d.expect("spend").is_allowed(), true)
            }
            Call::BeforeAdmit => (self.before("an", 1).await[0] == 1, true),
            Call::BeforeReject1 => (self.before("rj", 1).await[0] == 1, false),
        };
        assert_eq!(spent, want_allowed, "{}: admitted {spent}", what.label());
    }
}

impl Bench {
    /// Runs `what` at `n` callers for `d`; its Redis cost per call.
    async fn measure(&mut self, what: Call, n: usize, d: Duration) -> Cost {
        common::reset_stats(&mut self.conn).await;
        let clients = self.clients.clone();
        let (calls, _, _) = drive(n, d, move || clients.clone().once(what)).await;
        let stats = commandstats(&mut self.conn).await;
        let (evals, usec) = stats.get(what.top()).copied().unwrap_or((0.0, 0.0));
        assert!(
            evals >= calls as f64,
            "{}: {evals} {} counted for {calls} calls",
            what.label(),
            what.top(),
        );
        let mut commands = BTreeMap::new();
        for (name, (c, u)) in &stats {
            let outside = matches!(
                name.as_str(),
                "evalsha"
                    | "eval"
                    | "fcall"
                    | "info"
                    | "config|resetstat"
                    | "function|list"
                    | "function|load"
            );
            if c > &0.0 && !outside {
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

    let bucket_cfg = crate::bucket::config();
    let bucket = Limiter::new(
        conn.clone(),
        std::sync::Arc::new(Quotas::new(
            &Config::load(&bucket_cfg.path()).expect("bucket bench config"),
        )),
        TIMEOUT,
    )
    .without_history();
    let concurrent_cfg = crate::concurrent::config();
    let concurrent = Limiter::new(
        conn.clone(),
        std::sync::Arc::new(Quotas::new(
            &Config::load(&concurrent_cfg.path()).expect("concurrent bench config"),
        )),
        TIMEOUT,
    )
    .without_history();
    // A user refused FUNCTION and FCALL: the spend core runs as one script.
    // With a password: redis-rs sends no AUTH for a URL with a user and no
    // password, and the connection would run as the default user.
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "noscripts", "on", ">bench", "~*", "&*", "+@all"][..])
        .arg(&["-function", "-fcall", "-fcall_ro"][..])
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    let url = ctx
        .redis
        .url()
        .replacen("redis://", "redis://noscripts:bench@", 1);
    let script_conn = quota_worker::conn::connect(
        &quota_worker::conn::Master::Url(quota_worker::config::RedisUrl::new(url)),
        TIMEOUT,
        "bench",
    )
    .await
    .expect("connect as noscripts");
    let script = Limiter::new(script_conn, q.clone(), TIMEOUT).without_history();
    let mut bench = Bench {
        clients: Clients {
            limiter,
            bucket,
            concurrent,
            script,
            conn: conn.clone(),
            floor_keys,
        },
        conn: conn.clone(),
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
         `FCALL` (the spend core's library) or `EVALSHA` (a script), and the µs each command \
         inside it took per call. The spend core as one script runs through a Redis user refused \
         `FUNCTION` and `FCALL` (what Redis 6 runs); \"before\" is `lua/spend.lua` as it was \
         before the library (`tests/support/fixtures/spend_before_33.lua`). {n} callers on one \
         connection, {} interleaved rounds of {} ms, the median round (range in brackets). \
         \"rate ÷ naive\" is what the time per call allows: naive µs ÷ this call's µs. The \
         layout floor (`benches/baseline/layout_floor.lua`) makes only the calls any admission \
         in the spend core's layout must make (read clock and counters, record the id, append the \
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
    let script_vs_fcall = costs[7].evalsha_us / costs[2].evalsha_us;
    let before_vs_fcall = costs[8].evalsha_us / costs[2].evalsha_us;
    let before_reject_vs_fcall = costs[9].evalsha_us / costs[3].evalsha_us;
    let lua = |i: usize| costs[i].evalsha_us - costs[i].commands_us();
    let xr = |i: usize| costs[i].commands.get("XRANGE").copied().unwrap_or(0.0);
    md.push_str(&format!(
        "\nAt cost 1 the layout floor itself allows {floor_vs_naive:.2}× the naive log's rate; \
         the spend core (FCALL) runs at {ours_vs_floor:.2}× the floor. Against the script as \
         it was before the library, in the same run: an admit costs {before_vs_fcall:.2}× \
         (before ÷ now) as much Redis CPU ({:.1} µs of Lua and call bridge before, {:.1} µs \
         now), a refusal {before_reject_vs_fcall:.2}×; the same files as one script \
         (EVALSHA, Redis 6) cost {script_vs_fcall:.2}× the FCALL. A refusal at cost 100 spends \
         {:.1} µs in its `XRANGE` where one at cost 1 spends {:.1} µs: the entry 100 units on \
         sits further into its stream node (up to 100 entries, which Redis walks from the \
         node's start), the same constant at any window size (the growth section). A bucket \
         window's admission allows {bucket_vs_sliding:.2}× the rate of a sliding one's (the \
         bucket section's target, here without the client's share); a concurrent window's \
         (a lease) {concurrent_vs_sliding:.2}× (the concurrent section's).\n",
        lua(8),
        lua(2),
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
            "script_cost_vs_fcall": script_vs_fcall,
            "before_cost_vs_fcall": before_vs_fcall,
            "before_refusal_cost_vs_fcall": before_reject_vs_fcall,
            "calls": data,
        }),
        targets: Vec::new(),
    }
}
