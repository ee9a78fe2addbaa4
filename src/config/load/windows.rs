//! `windows = [...]` of a credential or an endpoint: units, period and kind
//! (sliding, fixed with a reset time and a time zone, or a bucket), or a
//! concurrent window's units in flight and lease; and the resource each
//! belongs to.

use std::collections::BTreeSet;
use std::num::NonZeroU64;
use std::time::Duration;

use super::Loader;
use crate::config::choice::WindowKindName;
use crate::config::defaults as d;
use crate::config::raw::RawWindow;
use crate::config::{
    FieldPath, Source, Window, WindowKind, WindowMode, fmt_duration, resource_name_ok,
};

const DAY: Duration = Duration::from_secs(86_400);

/// The resources a window list is read against: its credential's default
/// one (a window naming it holds `None`, as one naming none does) and the
/// resource of a window that names none (an endpoint's own windows: the
/// endpoint's).
pub(super) struct Resources<'a> {
    pub(super) default: &'a str,
    pub(super) unnamed: Option<&'a str>,
}

impl Loader<'_> {
    /// A window list, in config order. Windows of one resource, kind and
    /// period may differ in units only (a shadow window trying another
    /// number for the same limit): each after the first is keyed by its
    /// units, whatever its mode, so that a change of `mode` keeps its keys.
    pub(super) fn windows(
        &mut self,
        src: &Source,
        base: &FieldPath,
        raw: &[RawWindow],
        resources: &Resources<'_>,
    ) -> Vec<Window> {
        let mut out: Vec<Window> = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, rw) in raw.iter().enumerate() {
            let at = base.join(i);
            let Some(mut w) = self.window(src, &at, rw) else {
                continue;
            };
            w.resource = match rw.resource.as_deref() {
                None => resources.unnamed.map(str::to_owned),
                Some(name) => self.resource(src, &at.join("resource"), name),
            }
            .filter(|r| r != resources.default);
            // A credential's list (no endpoint's resource to fall back on).
            w.every_resource =
                w.is_concurrent() && rw.resource.is_none() && resources.unnamed.is_none();
            let limit = (w.resource.clone(), w.kind_name(), w.per);
            w.keyed_by_units = seen.iter().any(|(l, _)| *l == limit);
            if !seen.insert((limit, w.units)) {
                let (kind, per) = (w.kind_name(), fmt_duration(w.per));
                let of = w.resource.as_deref().unwrap_or(resources.default);
                let msg = if w.is_concurrent() {
                    format!(
                        "two concurrent windows of {} in flight of resource {of:?} in one list: keep one",
                        w.units
                    )
                } else {
                    format!(
                        "two {kind} windows of {}/{per} of resource {of:?} in one list: keep one",
                        w.units
                    )
                };
                self.error(src, &at, msg);
                continue;
            }
            out.push(w);
        }
        out
    }

    /// A resource's name, if it can be one (it is part of Redis keys).
    pub(super) fn resource(&mut self, src: &Source, at: &FieldPath, name: &str) -> Option<String> {
        if resource_name_ok(name) {
            return Some(name.to_owned());
        }
        let msg = format!(
            "bad resource name {name:?}: 1 to 64 of a-z, 0-9, '_', '-' and '.' (GitHub's \"core\", \"search\", \"graphql\")"
        );
        self.error(src, at, msg);
        None
    }

    /// One `{ units, per, kind, reset, timezone, mode }`, or a concurrent
    /// window's `{ kind = "concurrent", units, lease }`.
    fn window(&mut self, src: &Source, at: &FieldPath, rw: &RawWindow) -> Option<Window> {
        let Some(units) = NonZeroU64::new(rw.units) else {
            self.error(src, &at.join("units"), "must be at least 1");
            return None;
        };
        if units.get() > d::MAX_COUNT {
            // Reported, and the window kept, so that nothing else cascades.
            self.error(src, &at.join("units"), d::MAX_COUNT_RULE);
        }
        let mode = self.pick_or(
            src,
            &at.join("mode"),
            rw.mode.as_deref(),
            WindowMode::Enforce,
        );
        let kind = rw.kind.as_deref().unwrap_or(d::WINDOW_KIND);
        let (per, kind) = match self.pick(src, &at.join("kind"), kind)? {
            WindowKindName::Concurrent => {
                return self
                    .concurrent(src, at, rw, units)
                    .map(|w| Window { mode, ..w });
            }
            WindowKindName::Sliding => (self.period(src, at, rw)?, self.sliding(src, at, rw)),
            WindowKindName::Fixed => {
                let per = self.period(src, at, rw)?;
                (per, self.fixed(src, at, rw, per))
            }
            WindowKindName::Bucket => {
                let per = self.period(src, at, rw)?;
                (per, self.bucket(src, at, rw, units, per))
            }
        };
        Some(Window {
            units,
            per,
            kind,
            upstream: rw.upstream.unwrap_or(false),
            resource: None,
            every_resource: false,
            mode,
            keyed_by_units: false,
        })
    }

    /// The `per` of a window that counts per period (and no `lease`, which
    /// only a concurrent window has): whole milliseconds, in bounds.
    fn period(&mut self, src: &Source, at: &FieldPath, rw: &RawWindow) -> Option<Duration> {
        if rw.lease.is_some() {
            let msg =
                "only a concurrent window has a lease; add kind = \"concurrent\" or remove it";
            self.error(src, &at.join("lease"), msg);
        }
        let Some(per) = rw.per.as_ref().map(|p| p.0) else {
            let msg = "missing: how long the window is (\"1h\", \"24h\", ...)";
            self.error(src, &at.join("per"), msg);
            return None;
        };
        if per < d::MIN_WINDOW || per > d::MAX_WINDOW {
            let (min, max) = (fmt_duration(d::MIN_WINDOW), fmt_duration(d::MAX_WINDOW));
            self.error(
                src,
                &at.join("per"),
                format!("must be between {min} and {max}"),
            );
            return None;
        }
        if !per.subsec_nanos().is_multiple_of(1_000_000) {
            self.error(src, &at.join("per"), "must be whole milliseconds");
            return None;
        }
        Some(per)
    }

    /// `kind = "concurrent"`: at most `units` in flight. It counts no
    /// period, resets never and mirrors no upstream count, so `per`,
    /// `reset`, `timezone` and `upstream` are mistakes; `lease`, if given,
    /// is how long a lease lasts when no settle returns it.
    fn concurrent(
        &mut self,
        src: &Source,
        at: &FieldPath,
        rw: &RawWindow,
        units: NonZeroU64,
    ) -> Option<Window> {
        let fields = [
            (
                "per",
                rw.per.is_some(),
                "a concurrent window counts requests in flight, not per period: remove it (lease = \"...\" says how long a lease lasts)",
            ),
            (
                "reset",
                rw.reset.is_some(),
                "only fixed windows reset: remove it",
            ),
            (
                "timezone",
                rw.timezone.is_some(),
                "only fixed windows reset: remove it",
            ),
            (
                "upstream",
                rw.upstream == Some(true),
                "no upstream reports requests in flight: remove it",
            ),
        ];
        for (field, set, msg) in fields {
            if set {
                self.error(src, &at.join(field), msg);
            }
        }
        let lease = rw.lease.as_ref().map(|l| l.0);
        if let Some(l) = lease
            && (l < d::MIN_LEASE
                || l > d::MAX_WINDOW
                || !l.subsec_nanos().is_multiple_of(1_000_000))
        {
            let (min, max) = (fmt_duration(d::MIN_LEASE), fmt_duration(d::MAX_WINDOW));
            self.error(
                src,
                &at.join("lease"),
                format!("must be whole milliseconds between {min} and {max}"),
            );
            return None;
        }
        Some(Window {
            units,
            per: Duration::ZERO,
            kind: WindowKind::Concurrent { lease },
            upstream: false,
            resource: None,
            every_resource: false,
            mode: WindowMode::Enforce,
            keyed_by_units: false,
        })
    }

    /// `kind = "sliding"`: it has no reset, so `reset` and `timezone` are
    /// mistakes.
    fn sliding(&mut self, src: &Source, at: &FieldPath, rw: &RawWindow) -> WindowKind {
        for (field, v) in [("reset", &rw.reset), ("timezone", &rw.timezone)] {
            if v.is_some() {
                let msg = "only fixed windows reset; add kind = \"fixed\" or remove it";
                self.error(src, &at.join(field), msg);
            }
        }
        WindowKind::Sliding
    }

    /// `kind = "bucket"`: a leaky bucket refills continuously, so it has no
    /// reset; the spend script keeps its level exact in units x
    /// milliseconds, below 2^53.
    fn bucket(
        &mut self,
        src: &Source,
        at: &FieldPath,
        rw: &RawWindow,
        units: NonZeroU64,
        per: Duration,
    ) -> WindowKind {
        for (field, v) in [("reset", &rw.reset), ("timezone", &rw.timezone)] {
            if v.is_some() {
                let msg = "only fixed windows reset; a bucket refills continuously";
                self.error(src, &at.join(field), msg);
            }
        }
        if u128::from(units.get()) * per.as_millis() >= 1 << 53 {
            let msg = "a bucket's units x per (in ms) must stay below 2^53: lower units or per";
            self.error(src, at, msg);
        }
        WindowKind::Bucket
    }

    /// `kind = "fixed"`: calendar periods from `reset` in `timezone`.
    fn fixed(&mut self, src: &Source, at: &FieldPath, rw: &RawWindow, per: Duration) -> WindowKind {
        let (per_ms, day_ms) = (per.as_millis(), DAY.as_millis());
        if !(day_ms.is_multiple_of(per_ms) || per_ms.is_multiple_of(day_ms)) {
            let msg =
                "a fixed window's period must divide a day (\"1h\", \"15m\") or be whole days";
            self.error(src, &at.join("per"), msg);
        }
        let reset_src = rw.reset.as_deref().unwrap_or(d::WINDOW_RESET);
        let reset = parse_reset(reset_src).unwrap_or_else(|| {
            let msg = format!("invalid reset time {reset_src:?}: write \"HH:MM\" or \"HH:MM:SS\"");
            self.error(src, &at.join("reset"), msg);
            Duration::ZERO
        });
        let timezone = self.timezone(
            src,
            &at.join("timezone"),
            rw.timezone.as_deref(),
            d::WINDOW_TIMEZONE,
            "America/Los_Angeles",
        );
        WindowKind::Fixed { reset, timezone }
    }
}

/// "HH:MM" or "HH:MM:SS" as an offset from midnight.
fn parse_reset(s: &str) -> Option<Duration> {
    let mut it = s.split(':');
    let h: u64 = it.next()?.parse().ok()?;
    let m: u64 = it.next()?.parse().ok()?;
    let sec: u64 = it.next().map_or(Some(0), |x| x.parse().ok())?;
    if it.next().is_some() || h > 23 || m > 59 || sec > 59 {
        return None;
    }
    Some(Duration::from_secs(h * 3600 + m * 60 + sec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_times_parse() {
        assert_eq!(parse_reset("00:00"), Some(Duration::ZERO));
        assert_eq!(
            parse_reset("09:30:15"),
            Some(Duration::from_secs(9 * 3600 + 1800 + 15))
        );
        assert_eq!(parse_reset("24:00"), None);
        assert_eq!(parse_reset("9"), None);
    }
}
