//! Shadow windows (`mode = "shadow"`, SPEC Part 4): the spend core evaluates
//! them with the others and never lets them refuse; an admitted spend's
//! reply names the ones that would have (`lua/spend/core.lua`). Here: that
//! reply read ([`refused`]), counted in `qw_shadow_refusals_total` and in
//! the log, a window's first refusal at once and then at most a line a
//! minute ([`note`]), and the 24-hour count `quota` shows read back from
//! each shadow window's ring ([`Limiter::shadow_counts`]).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use super::{Limiter, Plan, QuotaError, WindowUsage, ring};

/// At most one log line a minute per window after its first refusal.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// The shadow windows an admitted spend's reply names after its four
/// values: 1-based numbers of `plan`'s shadow windows.
pub(super) fn refused(reply: &[i64], plan: &Plan) -> Result<Vec<usize>, QuotaError> {
    let Some(rest) = reply.get(4..) else {
        return Ok(Vec::new());
    };
    rest.iter()
        .map(|&n| {
            let i = usize::try_from(n).unwrap_or(0);
            match plan.windows.get(i.wrapping_sub(1)) {
                Some(w) if w.window.is_shadow() => Ok(i),
                _ => Err(QuotaError::Script(format!(
                    "spend named window {n} as a shadow refusal: {reply:?}"
                ))),
            }
        })
        .collect()
}

/// A window's refusals since its last log line.
struct Tally {
    logged: Instant,
    since: u64,
}

impl Tally {
    /// One more refusal at `now`: the count to log and over how long when a
    /// line is due (a minute after the last), else `None`.
    fn add(&mut self, now: Instant) -> Option<(u64, Duration)> {
        self.since += 1;
        let over = now.saturating_duration_since(self.logged);
        if over < LOG_EVERY {
            return None;
        }
        let count = self.since;
        (self.logged, self.since) = (now, 0);
        Some((count, over))
    }
}

/// By credential and window, in this process.
static TALLIES: LazyLock<Mutex<HashMap<String, Tally>>> = LazyLock::new(Mutex::default);

/// Counts `refused` (windows of `plan`, as [`refused`] read them) in
/// `qw_shadow_refusals_total{credential,window}` (the configured
/// credential, never a tenant, as every counter) and logs them: a window's
/// first refusal in this process at once, then at most one line a minute
/// with the count since the last (written at the first refusal a minute or
/// more after it).
pub(super) fn note(plan: &Plan, refused: &[usize]) {
    for &n in refused {
        let w = &plan.windows[n - 1];
        let window = w.window.describe();
        metrics::counter!("qw_shadow_refusals_total", "credential" => plan.family.clone(), "window" => window.clone())
            .increment(1);
        let key = format!("{}\u{0}{}\u{0}{window}", plan.family, w.scope);
        let now = Instant::now();
        let due = {
            let mut tallies = TALLIES.lock().unwrap_or_else(|e| e.into_inner());
            match tallies.get_mut(&key) {
                Some(tally) => tally.add(now).map(Some),
                None => {
                    let first = Tally {
                        logged: now,
                        since: 0,
                    };
                    tallies.insert(key, first);
                    Some(None)
                }
            }
        };
        match due {
            None => {}
            Some(None) => tracing::info!(
                credential = %plan.credential,
                scope = %w.scope,
                window = %window,
                "shadow window would have refused a spend (first shadow refusal; admitted: the window is in mode = \"shadow\")"
            ),
            Some(Some((count, over))) => tracing::info!(
                credential = %plan.credential,
                scope = %w.scope,
                window = %window,
                count,
                over_secs = over.as_secs(),
                "shadow window would have refused {count} spend(s) in the last {}s (admitted: mode = \"shadow\")",
                over.as_secs()
            ),
        }
    }
}

impl Limiter {
    /// `windows` (`plan`'s, as peek read them) with each shadow window's
    /// refusals over the last 24 hours; no read when `plan` has none.
    pub(super) async fn shadow_counts(
        &self,
        plan: &Plan,
        mut windows: Vec<WindowUsage>,
    ) -> Result<Vec<WindowUsage>, QuotaError> {
        let shadows: Vec<(usize, String)> = (plan.windows.iter().enumerate())
            .filter(|(_, w)| w.window.is_shadow())
            .filter_map(|(i, w)| Some((i, w.keys.last()?.clone())))
            .collect();
        if shadows.is_empty() {
            return Ok(windows);
        }
        let keys: Vec<String> = shadows.iter().map(|(_, k)| k.clone()).collect();
        let read = tokio::time::timeout(self.timeout, ring::read(self.conn(), &keys));
        let (_, counts) = read
            .await
            .map_err(|_| self.conn.timed_out(self.timeout))?
            .map_err(QuotaError::from_redis)?;
        for ((i, _), slots) in shadows.iter().zip(counts) {
            windows[*i].shadow_refusals = slots.iter().sum();
        }
        Ok(windows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_logs_at_most_once_a_minute_with_the_count_since_the_last_line() {
        let t0 = Instant::now();
        let mut t = Tally {
            logged: t0,
            since: 0,
        };
        for s in 1..60 {
            assert_eq!(t.add(t0 + Duration::from_secs(s)), None, "{s} s");
        }
        assert_eq!(
            t.add(t0 + Duration::from_secs(61)),
            Some((60, Duration::from_secs(61)))
        );
        assert_eq!(t.add(t0 + Duration::from_secs(62)), None);
        assert_eq!(
            t.add(t0 + Duration::from_secs(200)),
            Some((2, Duration::from_secs(139)))
        );
    }
}
