//! Every Redis key name the product writes, built in one place.
//!
//! Quota keys carry their credential as a Redis Cluster hash tag
//! (`qw:{yt-key1}:...`), so one spend touches one slot. Window keys are named
//! by kind and period, not by position, so reordering windows or changing a
//! limit in the config keeps the spends already recorded. Sliding and bucket
//! windows carry their layout version (`:v2:`), so a script of another layout
//! never reads or writes them.
//!
//! A credential's default resource keeps the key names it always had; the
//! keys of any other resource (`search`, `graphql`: windows, block and its
//! reason and streak, spend history) carry it after the hash tag
//! (`qw:{github}:res:search:blocked`), so a config that never names a
//! resource writes exactly the keys it always did.
//!
//! A tenant of a template credential (`[credentials.ig] template =
//! "account"`) is a credential of its own named `ig[account=<value>]`
//! ([`crate::config::tenant_name`]), so its keys are `qw:{ig[account=123]}:...`: the hash tag
//! comes from the value, never from the secret.

use crate::config::{Scope, Window, WindowKind};

/// `s` as a literal in a SCAN pattern.
pub fn glob_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// What the per-item keys are named after (`<prefix>:<kind>:<job>:<item>`):
/// [`KeySpace::cursor`], [`KeySpace::item_ran`], [`KeySpace::since`],
/// [`KeySpace::validators`], [`KeySpace::item_lock`], [`KeySpace::item_last`].
const ITEM_KINDS: [&str; 6] = ["cursor", "ran", "since", "validators", "lock", "last"];

/// The layout version of sliding and bucket window keys (`lua/spend/log.lua`).
pub const LAYOUT: &str = "v2";

/// Key names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// Keys under `prefix` (the config's `[redis] key_prefix`).
    pub fn new(prefix: impl Into<String>) -> Self {
        KeySpace {
            prefix: prefix.into(),
        }
    }

    fn credential(&self, credential: &str) -> String {
        format!("{}:{}", self.prefix, Self::hash_tag(credential))
    }

    /// Where the keys of one resource of `credential` start: the
    /// credential's own for its default resource (`None`).
    fn resource(&self, credential: &str, resource: Option<&str>) -> String {
        match resource {
            None => self.credential(credential),
            Some(r) => format!("{}:res:{r}", self.credential(credential)),
        }
    }

    /// The Redis Cluster hash tag every key of `credential` carries: all of
    /// them hash to its slot, so one spend runs on one node.
    pub fn hash_tag(credential: &str) -> String {
        format!("{{{credential}}}")
    }

    /// A SCAN pattern for every key of every tenant of template
    /// `credential` on `placeholder`.
    pub fn tenants_pattern(&self, credential: &str, placeholder: &str) -> String {
        let tag = glob_literal(&format!("{credential}[{placeholder}="));
        format!("{}:{{{tag}*\\]}}:*", glob_literal(&self.prefix))
    }

    /// The tenant a key found by [`KeySpace::tenants_pattern`] belongs to:
    /// its hash tag (`ig[account=123]`).
    pub fn tenant_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix(":{")?;
        Some(&rest[..rest.find('}')?])
    }

    /// When the upstream block of the credential's default resource ends
    /// (µs since the epoch): [`KeySpace::blocked_in`] of `None`.
    pub fn blocked(&self, credential: &str) -> String {
        self.blocked_in(credential, None)
    }

    /// When the upstream block of one resource of the credential ends (µs
    /// since the epoch); `None`: its default resource.
    pub fn blocked_in(&self, credential: &str, resource: Option<&str>) -> String {
        format!("{}:blocked", self.resource(credential, resource))
    }

    /// Why the credential's default resource is blocked
    /// ([`KeySpace::block_kind_in`] of `None`).
    pub fn block_kind(&self, credential: &str) -> String {
        self.block_kind_in(credential, None)
    }

    /// Why a resource of the credential is blocked, in one stable word
    /// (`quota::BlockReason`), expiring with the block it explains
    /// (`lua/block.lua`).
    pub fn block_kind_in(&self, credential: &str, resource: Option<&str>) -> String {
        format!("{}:blocked:kind", self.resource(credential, resource))
    }

    /// The throttle streak of the credential's default resource
    /// ([`KeySpace::block_streak_in`] of `None`).
    pub fn block_streak(&self, credential: &str) -> String {
        self.block_streak_in(credential, None)
    }

    /// How many throttle answers in a row a resource of the credential has
    /// had (`lua/block.lua`): each one doubles the next block; a success
    /// ends the streak.
    pub fn block_streak_in(&self, credential: &str, resource: Option<&str>) -> String {
        format!("{}:blocked:streak", self.resource(credential, resource))
    }

    /// The latest Redis time a spend on the credential saw.
    pub fn clock(&self, credential: &str) -> String {
        format!("{}:clock", self.credential(credential))
    }

    /// The keys of one window, as the spend script expects them: a sliding
    /// or bucket window's counters, id log, entry stream and settled entries
    /// (layout v2), a fixed window's state hash (unchanged since v1), or a
    /// concurrent window's counters, lease expiries and leased units.
    pub fn window(&self, credential: &str, scope: &Scope, window: &Window) -> Vec<String> {
        let (base, scope) = self.window_base(credential, scope, window);
        match window.kind {
            WindowKind::Sliding | WindowKind::Bucket => ["meta", "log", "ts", "adj"]
                .map(|k| format!("{base}:{LAYOUT}:{k}"))
                .to_vec(),
            WindowKind::Fixed { .. } => vec![format!("{base}:fixed")],
            // One per scope (config validation), named for no lease: a
            // changed lease keeps the leases in flight.
            WindowKind::Concurrent { .. } => {
                let units = units_tag(window);
                ["meta", "lease", "held"]
                    .map(|k| {
                        format!(
                            "{}:{scope}:inflight{units}:{k}",
                            self.credential(credential)
                        )
                    })
                    .to_vec()
            }
        }
    }

    /// A shadow window's refusals (`lua/spend/ring.lua`'s layout: counts
    /// per 5-minute slot over 24 hours), written by the spend it would
    /// have refused. Not a part of the window's state: a change of `mode`
    /// leaves the window's keys as they are.
    pub fn shadow_refusals(&self, credential: &str, scope: &Scope, window: &Window) -> String {
        match window.kind {
            WindowKind::Concurrent { .. } => {
                let (_, scope) = self.window_base(credential, scope, window);
                format!(
                    "{}:{scope}:inflight{}:shadow",
                    self.credential(credential),
                    units_tag(window)
                )
            }
            _ => format!("{}:shadow", self.window_base(credential, scope, window).0),
        }
    }

    /// A window's waiting line (`lua/spend/line.lua`): the
    /// promises made to spends it refused, and their tickets. `None` for a
    /// concurrent window, which keeps none.
    pub fn line(&self, credential: &str, scope: &Scope, window: &Window) -> Option<String> {
        let (base, _) = self.window_base(credential, scope, window);
        match window.kind {
            WindowKind::Sliding | WindowKind::Bucket => Some(format!("{base}:{LAYOUT}:line")),
            WindowKind::Fixed { .. } => Some(format!("{base}:line")),
            WindowKind::Concurrent { .. } => None,
        }
    }

    /// A window's keys' common part, and its scope as they name it.
    fn window_base(&self, credential: &str, scope: &Scope, window: &Window) -> (String, String) {
        let scope = match scope {
            Scope::Credential => "cred".to_owned(),
            Scope::Endpoint(e) => format!("ep:{e}"),
        };
        let base = format!(
            "{}:{scope}:{}{}{}",
            self.resource(credential, window.resource.as_deref()),
            &window.kind_name()[..1],
            window.per.as_millis(),
            units_tag(window)
        );
        (base, scope)
    }

    /// Why the credential's default resource is blocked
    /// ([`KeySpace::block_reason_in`] of `None`).
    pub fn block_reason(&self, credential: &str) -> String {
        self.block_reason_in(credential, None)
    }

    /// Why a resource of the credential is blocked (JSON,
    /// `quota::BlockNote`), kept as long as the block it explains.
    pub fn block_reason_in(&self, credential: &str, resource: Option<&str>) -> String {
        format!("{}:blocked:why", self.resource(credential, resource))
    }

    /// The spend history's ring of one scope of a credential's default
    /// resource ([`KeySpace::spent_in`] of `None`).
    pub fn spent(&self, credential: &str, scope: &Scope) -> String {
        self.spent_in(credential, scope, None)
    }

    /// The 24-hour ring of units spent per 5 minutes (`lua/spend/ring.lua`,
    /// `quota::ring`)
    /// of one scope of a credential's windows of one resource: every window
    /// of a scope and resource sees the same spends.
    pub fn spent_in(&self, credential: &str, scope: &Scope, resource: Option<&str>) -> String {
        let base = self.resource(credential, resource);
        match scope {
            Scope::Credential => format!("{base}:spent:cred"),
            Scope::Endpoint(e) => format!("{base}:spent:ep:{e}"),
        }
    }

    /// The apalis-redis queue name; apalis builds its own keys from it
    /// (`<prefix>:queue:active`, `...:scheduled`, ...).
    pub fn queue(&self) -> String {
        format!("{}:queue", self.prefix)
    }

    /// Tasks waiting to enter the apalis queue (zset: task id -> run at, ms).
    pub fn backlog(&self) -> String {
        format!("{}:backlog", self.prefix)
    }

    /// Their payloads (hash: task id -> JSON).
    pub fn backlog_data(&self) -> String {
        format!("{}:backlog:data", self.prefix)
    }

    /// The wake stream: an entry whenever a task becomes due sooner than
    /// the idle daemons wait for, or apalis gets tasks to fetch
    /// (`lua/feed.lua`); each daemon blocks on it (`XREAD`) instead of
    /// polling.
    pub fn wake(&self) -> String {
        format!("{}:wake", self.prefix)
    }

    /// A stream with an entry whenever a task of `job`'s tick at
    /// `tick_ms` ends while `trigger --wait` waits for it (`"#wait"` in
    /// the tick's outcome hash): what it blocks on.
    pub fn tick_ended(&self, job: &str, tick_ms: i64) -> String {
        format!("{}:tick:{job}:{tick_ms}:ended", self.prefix)
    }

    /// The claim that one daemon fans out `job`'s tick at `tick_ms`.
    pub fn tick_claim(&self, job: &str, tick_ms: i64) -> String {
        format!("{}:tick:{job}:{tick_ms}", self.prefix)
    }

    /// How far a tick's fan-out has got while it is queued in chunks (hash:
    /// owner, lease, next, origin; gone once every task is queued).
    pub fn tick_fan_out(&self, job: &str, tick_ms: i64) -> String {
        format!("{}:tick:{job}:{tick_ms}:fan_out", self.prefix)
    }

    /// The fan-outs being queued (zset: `<job>:<tick_ms>` -> lease end, ms):
    /// where a daemon finds one whose enqueuer died, to finish it.
    pub fn fanning(&self) -> String {
        format!("{}:fanning", self.prefix)
    }

    /// Where a job's ticks start serving their items (hash: tick, turn,
    /// offset, n, first; `lua/rotate.lua`): one small hash per job.
    pub fn fair(&self, job: &str) -> String {
        format!("{}:fair:{job}", self.prefix)
    }

    /// A job's starved items (hash: item key -> the turn its starvation
    /// began; `lua/finish.lua`), bounded by `queue::scripts::finish::STARVED_CAP`.
    pub fn starved(&self, job: &str) -> String {
        format!("{}:starved:{job}", self.prefix)
    }

    /// Where one tick of a job serves its items from, and its turn (hash:
    /// offset, turn; `lua/rotate.lua`), kept as long as the tick's claim.
    pub fn tick_rotation(&self, job: &str, tick_ms: i64) -> String {
        format!("{}:tick:{job}:{tick_ms}:rotation", self.prefix)
    }

    /// Outcome counts of one tick's tasks (hash: outcome -> count, plus "#items").
    pub fn tick_outcomes(&self, job: &str, tick_ms: i64) -> String {
        format!("{}:tick:{job}:{tick_ms}:outcomes", self.prefix)
    }

    /// One job's newest ticks' outcome counts and its last error
    /// (hash, `lua/finish.lua`), for the status page.
    pub fn job_ticks(&self, job: &str) -> String {
        format!("{}:ticks:{job}", self.prefix)
    }

    /// The pagination checkpoint of one job's fan-out item.
    pub fn cursor(&self, job: &str, item: &str) -> String {
        format!("{}:cursor:{job}:{item}", self.prefix)
    }

    /// The newest tick whose run of one job's fan-out item completed.
    pub fn item_ran(&self, job: &str, item: &str) -> String {
        format!("{}:ran:{job}:{item}", self.prefix)
    }

    /// When the last complete run of one job's fan-out item started, in
    /// seconds since the epoch: its next run's `{since}`.
    pub fn since(&self, job: &str, item: &str) -> String {
        format!("{}:since:{job}:{item}", self.prefix)
    }

    /// The `ETag` / `Last-Modified` of page 1 of the last complete run of
    /// one job's fan-out item (JSON), sent back by its next run.
    pub fn validators(&self, job: &str, item: &str) -> String {
        format!("{}:validators:{job}:{item}", self.prefix)
    }

    /// Held while a task works on one job's fan-out item (value: the
    /// holder, `worker::Holder`: task id, and the host and process).
    pub fn item_lock(&self, job: &str, item: &str) -> String {
        format!("{}:lock:{job}:{item}", self.prefix)
    }

    /// The last run of one job's fan-out item that got as far as an
    /// outcome: its tick, the outcome, when it ended (JSON,
    /// `queue::scripts::finish::LastRun`), for `quota-worker state`.
    pub fn item_last(&self, job: &str, item: &str) -> String {
        format!("{}:last:{job}:{item}", self.prefix)
    }

    /// A SCAN pattern that matches every per-item key of `job` (checkpoint,
    /// completed tick, `{since}`, validators, lock, last run) — and some
    /// other keys, which [`KeySpace::item_of`] tells apart.
    pub fn items_pattern(&self, job: &str) -> String {
        format!("{}:*:{}:*", glob_literal(&self.prefix), glob_literal(job))
    }

    /// The item a per-item key of `job` is for (`region=US` of
    /// `qw:cursor:trending:region=US`); `None` for any other key. Job names
    /// hold no `:` (config validation), so the job ends at the first one.
    pub fn item_of<'k>(&self, job: &str, key: &'k str) -> Option<&'k str> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix(':')?;
        let (kind, rest) = rest.split_once(':')?;
        let item = rest.strip_prefix(job)?.strip_prefix(':')?;
        (ITEM_KINDS.contains(&kind) && !item.is_empty()).then_some(item)
    }

    /// Set when a task has ended for good, so a redelivered copy does nothing.
    pub fn task_done(&self, task_id: &str) -> String {
        format!("{}:done:{task_id}", self.prefix)
    }

    /// The jobs running daemons have loaded (hash: job -> Redis time, ms,
    /// a daemon last said it had it; `lua/known.lua`).
    pub fn known_jobs(&self) -> String {
        format!("{}:known:jobs", self.prefix)
    }

    /// The daemons running on this Redis and prefix (hash: daemon id ->
    /// alive-until and what it loaded; `lua/known.lua`).
    pub fn daemons(&self) -> String {
        format!("{}:known:daemons", self.prefix)
    }

    /// Where the queue's trim keeps its scan cursors between calls (hash:
    /// apalis set -> SSCAN cursor), so each call takes one bounded step.
    pub fn trim_cursors(&self) -> String {
        format!("{}:trim", self.prefix)
    }
}

/// ":u<units>" for a window keyed by its units
/// ([`Window::keyed_by_units`]), "" for every other.
fn units_tag(window: &Window) -> String {
    if window.keyed_by_units {
        format!(":u{}", window.units)
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU64;
    use std::time::Duration;

    #[test]
    fn keys_share_the_credential_hash_tag() {
        let ks = KeySpace::new("qw");
        let w = Window {
            units: NonZeroU64::new(9500).unwrap(),
            per: Duration::from_secs(86_400),
            kind: WindowKind::Sliding,
            upstream: false,
            resource: None,
            every_resource: false,
            mode: Default::default(),
            keyed_by_units: false,
        };
        let keys = ks.window(
            "yt-key1",
            &Scope::Endpoint("youtube.search.list".into()),
            &w,
        );
        assert_eq!(
            keys,
            [
                "qw:{yt-key1}:ep:youtube.search.list:s86400000:v2:meta",
                "qw:{yt-key1}:ep:youtube.search.list:s86400000:v2:log",
                "qw:{yt-key1}:ep:youtube.search.list:s86400000:v2:ts",
                "qw:{yt-key1}:ep:youtube.search.list:s86400000:v2:adj"
            ]
        );
        assert_eq!(ks.blocked("yt-key1"), "qw:{yt-key1}:blocked");
        // Another resource's keys carry it; the default one's are as ever.
        let search = Window {
            resource: Some("search".into()),
            ..w
        };
        assert_eq!(
            ks.window("gh", &Scope::Credential, &search)[0],
            "qw:{gh}:res:search:cred:s86400000:v2:meta"
        );
        assert_eq!(
            ks.blocked_in("gh", Some("search")),
            "qw:{gh}:res:search:blocked"
        );
        assert_eq!(
            ks.spent_in("gh", &Scope::Credential, Some("search")),
            "qw:{gh}:res:search:spent:cred"
        );
        assert_eq!(ks.spent("gh", &Scope::Credential), "qw:{gh}:spent:cred");
        assert_eq!(ks.block_streak("gh"), "qw:{gh}:blocked:streak");
        assert_eq!(ks.tenant_of("qw:{gh}:res:search:blocked"), Some("gh"));
    }

    /// A window after the first of its kind, period and resource carries
    /// its units, whatever its mode; its shadow ring sits beside its keys.
    #[test]
    fn a_window_keyed_by_units_keeps_its_keys_in_either_mode() {
        let ks = KeySpace::new("qw");
        let tried = Window {
            units: NonZeroU64::new(10).unwrap(),
            per: Duration::from_secs(60),
            kind: WindowKind::Sliding,
            upstream: false,
            resource: None,
            every_resource: false,
            mode: crate::config::WindowMode::Shadow,
            keyed_by_units: true,
        };
        let keys = ks.window("k", &Scope::Credential, &tried);
        assert_eq!(keys[0], "qw:{k}:cred:s60000:u10:v2:meta");
        let enforced = Window {
            mode: crate::config::WindowMode::Enforce,
            ..tried.clone()
        };
        assert_eq!(ks.window("k", &Scope::Credential, &enforced), keys);
        assert_eq!(
            ks.shadow_refusals("k", &Scope::Credential, &tried),
            "qw:{k}:cred:s60000:u10:shadow"
        );
        let lease = Window {
            kind: WindowKind::Concurrent { lease: None },
            ..tried
        };
        assert_eq!(
            ks.window("k", &Scope::Credential, &lease)[0],
            "qw:{k}:cred:inflight:u10:meta"
        );
    }

    /// Every per-item key of a job is found by its pattern and read back
    /// to its item; another job's, a tick's or a window's key is not.
    #[test]
    fn per_item_keys_name_their_item() {
        let ks = KeySpace::new("qw");
        let item = "region=US,lang=en";
        for key in [
            ks.cursor("trending", item),
            ks.item_ran("trending", item),
            ks.since("trending", item),
            ks.validators("trending", item),
            ks.item_lock("trending", item),
            ks.item_last("trending", item),
        ] {
            assert_eq!(ks.item_of("trending", &key), Some(item), "{key}");
        }
        assert_eq!(ks.items_pattern("trending"), "qw:*:trending:*");
        for other in [
            ks.cursor("trending2", item),
            ks.cursor("trend", item),
            ks.tick_outcomes("trending", 5),
            ks.starved("trending"),
            ks.fair("trending"),
            "qw:{sim}:cred:s1000:v2:meta".to_owned(),
        ] {
            assert_eq!(ks.item_of("trending", &other), None, "{other}");
        }
        assert_eq!(KeySpace::new("a*b").items_pattern("j"), "a\\*b:*:j:*");
    }

    #[test]
    fn tenant_names_keep_one_hash_tag_and_never_collide() {
        use crate::config::{parse_tenant, tenant_name as tenant};
        let ks = KeySpace::new("qw");
        assert_eq!(tenant("ig", "account", "123"), "ig[account=123]");
        assert_eq!(
            ks.blocked(&tenant("ig", "account", "123")),
            "qw:{ig[account=123]}:blocked"
        );
        // Braces, brackets, '%', '=' and glob characters cannot end the tag
        // or the name, or turn two values into one name.
        let values = [
            "a}b", "a{b}", "a%7Db", "x]", "x]y", "=", "*", "a b", "a%20b", "ä", "a/b",
        ];
        let names: Vec<String> = values.iter().map(|v| tenant("ig", "account", v)).collect();
        for (v, n) in values.iter().zip(&names) {
            let key = ks.clock(n);
            assert_eq!(ks.tenant_of(&key), Some(n.as_str()), "{v:?}");
            let inner = &n["ig[account=".len()..n.len() - 1];
            assert!(
                !inner.contains(['{', '}', '[', ']', '*', '?', '=', ' ']),
                "{v:?} -> {n}"
            );
            let (c, p, back) = parse_tenant(n).unwrap();
            assert_eq!((c, p, back.as_str()), ("ig", "account", *v));
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!(
            ks.tenants_pattern("ig", "account"),
            "qw:{ig\\[account=*\\]}:*"
        );
    }
}
