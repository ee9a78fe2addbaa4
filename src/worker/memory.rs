//! What this daemon remembers of the quota between one answer and the
//! next, in its own memory (never in Redis): the units in flight
//! ([`Unanswered`]), the blocks Redis did not take ([`LocalBlocks`]), and
//! what past answers said ([`Remembered`]: throttle streaks, GitHub
//! GraphQL's `x-ratelimit-used`, resources no window mirrors).
//!
//! Every method that reads the time takes `now` from its caller: the
//! worker passes `Instant::now()`, the tests a clock of their own, so what
//! a memory does an hour later is tested without waiting an hour.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::accounting::Used;
use crate::quota::STREAK_MEMORY;

/// One resource of one credential, as this daemon's own memories key it
/// (a tenant's credential by its name, `ig[account=123]`; `None`: the
/// credential's default resource).
pub(super) fn resource_key(credential: &str, resource: Option<&str>) -> String {
    match resource {
        None => credential.to_owned(),
        // A NUL is in neither a credential's nor a resource's name.
        Some(r) => format!("{credential}\0{r}"),
    }
}

/// Units this daemon has spent per credential and resource whose requests
/// have not been answered yet. An answer's "this much is left" was written
/// before the upstream saw them, so a resync leaves room for them:
/// otherwise the window would admit them twice (once in flight, once after
/// the resync).
#[derive(Debug, Default)]
pub(crate) struct Unanswered(Mutex<HashMap<String, u64>>);

impl Unanswered {
    /// Counts `units` of `key` ([`resource_key`]) until the returned guard
    /// drops or lands.
    pub(super) fn fly(self: &Arc<Self>, key: &str, units: u64) -> Flying {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *m.entry(key.to_owned()).or_default() += units;
        Flying {
            all: self.clone(),
            key: key.to_owned(),
            units,
            landed: AtomicBool::new(false),
        }
    }

    /// The units of `key` unanswered now.
    pub(super) fn units(&self, key: &str) -> u64 {
        let m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        m.get(key).copied().unwrap_or(0)
    }

    /// Takes `units` of `key` out.
    fn take(&self, key: &str, units: u64) {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = m.get_mut(key) {
            *n = n.saturating_sub(units);
            if *n == 0 {
                m.remove(key);
            }
        }
    }
}

/// One request's units in [`Unanswered`], until its answer is in
/// ([`Flying::land`]) or it is dropped (however its task ends, a panic
/// included).
#[must_use = "the units count as unanswered only while this lives"]
pub(super) struct Flying {
    all: Arc<Unanswered>,
    key: String,
    units: u64,
    /// Whether its units have left [`Unanswered`] already.
    landed: AtomicBool,
}

impl Flying {
    /// The answer is in: its units are no longer unanswered (the sooner
    /// they leave, the less another answer's resync holds back for them).
    pub(super) fn land(&self) {
        if !self.landed.swap(true, Ordering::AcqRel) {
            self.all.take(&self.key, self.units);
        }
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        if !*self.landed.get_mut() {
            self.all.take(&self.key, self.units);
        }
    }
}

/// Resources of credentials blocked in this process only: when Redis does
/// not take a block (it is down, or the script failed), this daemon still
/// spends nothing on the resource until the block's end. Other daemons do
/// not see it; the upstream will throttle them too, and they block it
/// themselves. Keyed by [`resource_key`].
#[derive(Debug, Default)]
pub(crate) struct LocalBlocks(Mutex<HashMap<String, Instant>>);

impl LocalBlocks {
    /// Holds `key` blocked for `wait` from `now` (never shortening a longer
    /// hold).
    pub(super) fn hold(&self, key: &str, wait: Duration, now: Instant) {
        let until = now + wait;
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let at = held.entry(key.to_owned()).or_insert(until);
        *at = (*at).max(until);
    }

    /// How long `key` stays held after `now`, if it is (a hold that has
    /// ended is forgotten).
    pub(super) fn left(&self, key: &str, now: Instant) -> Option<Duration> {
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let left = (held.get(key)).map(|until| until.saturating_duration_since(now));
        match left {
            Some(d) if d.is_zero() => {
                held.remove(key);
                None
            }
            other => other,
        }
    }
}

/// What this daemon remembers of the upstream from one answer to the next.
#[derive(Debug, Default)]
pub(crate) struct Remembered {
    /// Resources ([`resource_key`]) this daemon saw blocked after a
    /// throttle, or refused a spend on for a block, and when: its next
    /// successful answer there ends the throttle streak in Redis (one call,
    /// only then: most answers end no streak).
    streaks: Mutex<HashMap<String, Instant>>,
    /// GitHub GraphQL: each token's last `x-ratelimit-used`, for a query
    /// that does not ask for its own cost.
    used: Mutex<HashMap<String, Used>>,
    /// Resources an answer named that no window or endpoint of its
    /// credential has (logged once each).
    unmirrored: Mutex<HashSet<String>>,
}

impl Remembered {
    /// A throttle streak may run on `key` from `now`.
    pub(super) fn streak_seen(&self, key: String, now: Instant) {
        let mut m = self.streaks.lock().unwrap_or_else(PoisonError::into_inner);
        m.insert(key, now);
    }

    /// Whether a successful answer, at `now`, to a request spent at `sent`
    /// ends a streak on `key`: one may run there, and the request left
    /// after this daemon saw it begin (an answer to a request already in
    /// flight when the upstream throttled says nothing about the wait: it
    /// ends no streak, as a throttle answered then lengthens none).
    /// Forgotten once it has.
    pub(super) fn streak_ends(&self, key: &str, sent: Instant, now: Instant) -> bool {
        let mut m = self.streaks.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(seen) = m.get(key).copied() else {
            return false;
        };
        // Redis remembers a streak an hour after its block: past a day,
        // this memory is stale whatever it says.
        if now.saturating_duration_since(seen) > STREAK_MEMORY * 24 {
            m.remove(key);
            return false;
        }
        if sent <= seen {
            return false;
        }
        m.remove(key);
        true
    }

    /// What a GraphQL query cost by the token's `x-ratelimit-used`: the
    /// change since its last answer within the same period (answers that
    /// arrive out of order, or a new period, say nothing). Read and
    /// remembered under one lock: two answers at once are each counted once.
    pub(super) fn used_since(&self, token: &str, now: Used) -> Option<u64> {
        let mut m = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let before = m.get(token).copied();
        match before {
            Some(b) if b.reset == now.reset && now.used <= b.used => None,
            _ => {
                m.insert(token.to_owned(), now);
                before
                    .filter(|b| b.reset == now.reset)
                    .map(|b| now.used - b.used)
            }
        }
    }

    /// Whether `key` is logged as unmirrored for the first time now.
    pub(super) fn first_unmirrored(&self, key: String) -> bool {
        let mut m = (self.unmirrored.lock()).unwrap_or_else(PoisonError::into_inner);
        m.insert(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(used: u64, reset: u64) -> Used {
        Used { used, reset }
    }

    #[test]
    fn units_in_flight_leave_once_whether_landed_or_dropped() {
        let all = Arc::new(Unanswered::default());
        let a = all.fly("gh", 3);
        let b = all.fly("gh", 2);
        let other = all.fly(&resource_key("gh", Some("search")), 7);
        assert_eq!(all.units("gh"), 5);
        a.land();
        a.land();
        assert_eq!(all.units("gh"), 2, "landing twice takes its units once");
        drop(a);
        assert_eq!(all.units("gh"), 2, "a landed guard's drop takes nothing");
        drop(b);
        assert_eq!(all.units("gh"), 0);
        assert_eq!(all.units("gh\0search"), 7, "resources are counted apart");
        drop(other);
        assert!(all.0.lock().unwrap().is_empty(), "nothing left behind");
    }

    #[test]
    fn a_local_block_holds_until_its_end_and_never_shortens() {
        let blocks = LocalBlocks::default();
        let t0 = Instant::now();
        blocks.hold("gh", Duration::from_secs(60), t0);
        blocks.hold("gh", Duration::from_secs(10), t0);
        assert_eq!(blocks.left("gh", t0), Some(Duration::from_secs(60)));
        let later = t0 + Duration::from_secs(45);
        assert_eq!(blocks.left("gh", later), Some(Duration::from_secs(15)));
        assert_eq!(blocks.left("gh", t0 + Duration::from_secs(60)), None);
        assert_eq!(
            blocks.left("gh", t0),
            None,
            "an ended hold is forgotten, even read with an older clock"
        );
        assert_eq!(blocks.left("other", t0), None);
    }

    #[test]
    fn a_streak_ends_on_a_request_sent_after_it_began_once() {
        let mem = Remembered::default();
        let t0 = Instant::now();
        let sec = Duration::from_secs(1);
        assert!(!mem.streak_ends("gh", t0 + sec, t0 + sec), "no streak seen");
        mem.streak_seen("gh".into(), t0 + sec);
        assert!(
            !mem.streak_ends("gh", t0, t0 + 2 * sec),
            "a request in flight when the throttle came says nothing"
        );
        assert!(mem.streak_ends("gh", t0 + 2 * sec, t0 + 3 * sec));
        assert!(!mem.streak_ends("gh", t0 + 2 * sec, t0 + 3 * sec), "once");
    }

    #[test]
    fn a_streak_seen_more_than_a_day_ago_is_forgotten() {
        let mem = Remembered::default();
        let t0 = Instant::now();
        mem.streak_seen("gh".into(), t0);
        let stale = t0 + STREAK_MEMORY * 24 + Duration::from_secs(1);
        assert!(!mem.streak_ends("gh", t0 + Duration::from_secs(1), stale));
        assert!(mem.streaks.lock().unwrap().is_empty());
    }

    #[test]
    fn used_prices_a_query_by_the_change_within_one_period() {
        let mem = Remembered::default();
        assert_eq!(mem.used_since("t", used(10, 100)), None, "first answer");
        assert_eq!(mem.used_since("t", used(13, 100)), Some(3));
        assert_eq!(mem.used_since("t", used(12, 100)), None, "out of order");
        assert_eq!(mem.used_since("t", used(14, 100)), Some(1), "from 13");
        assert_eq!(mem.used_since("t", used(2, 200)), None, "a new period");
        assert_eq!(mem.used_since("u", used(50, 200)), None, "another token");
        assert_eq!(mem.used_since("t", used(5, 200)), Some(3));
    }

    #[test]
    fn an_unmirrored_resource_is_told_once() {
        let mem = Remembered::default();
        assert!(mem.first_unmirrored(resource_key("gh", Some("search"))));
        assert!(!mem.first_unmirrored(resource_key("gh", Some("search"))));
        assert!(mem.first_unmirrored(resource_key("gh", Some("code_search"))));
    }
}
