//! A time zone's UTC offsets as a short table the spend script can read.
//!
//! Lua in Redis has no time zone database, but a fixed window must reset at
//! local midnight whatever the DST rules say (YouTube resets at midnight
//! Pacific: 07:00 UTC in summer, 08:00 in winter). So the caller hands the
//! script the zone's offsets and the instants they start, from a year back to
//! [`YEARS_AHEAD`] years ahead; the script finds the period with Redis's clock.

use chrono::{DateTime, Datelike, Offset, TimeZone, Utc};
use chrono_tz::Tz;

/// How far ahead the table reaches. The daemon rebuilds it at every start; only
/// a `keys` printout kept for years would go stale (it then keeps the last
/// offset, off by at most the DST shift).
pub(crate) const YEARS_AHEAD: i32 = 10;

fn offset_ms(tz: Tz, at_ms: i64) -> i64 {
    let at = DateTime::<Utc>::from_timestamp_millis(at_ms).unwrap_or_default();
    i64::from(
        tz.offset_from_utc_datetime(&at.naive_utc())
            .fix()
            .local_minus_utc(),
    ) * 1000
}

/// `"<offset_ms>|<utc_ms>|<offset_ms>|..."`: the offset in force at the start
/// of the range, then each change and the offset it brings, ascending.
pub(crate) fn table(tz: Tz, now: DateTime<Utc>) -> String {
    let start = Utc
        .with_ymd_and_hms(now.year() - 1, 1, 1, 0, 0, 0)
        .single()
        .unwrap_or(now)
        .timestamp_millis();
    let end = Utc
        .with_ymd_and_hms(now.year() + YEARS_AHEAD, 1, 1, 0, 0, 0)
        .single()
        .unwrap_or(now)
        .timestamp_millis();
    let mut out = offset_ms(tz, start).to_string();
    // Offsets change at most a few times a year and never twice in a day, so
    // stepping by 12 hours finds every change; bisection finds its second.
    const STEP: i64 = 12 * 3_600_000;
    let mut t = start;
    let mut cur = offset_ms(tz, t);
    while t < end {
        let next = t + STEP;
        let off = offset_ms(tz, next);
        if off != cur {
            let (mut lo, mut hi) = (t, next);
            while hi - lo > 1000 {
                let mid = lo + (hi - lo) / 2;
                if offset_ms(tz, mid) == cur {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            // Offsets change on whole seconds.
            let at = hi - hi.rem_euclid(1000);
            out.push_str(&format!("|{at}|{off}"));
            cur = off;
        }
        t = next;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_is_one_offset() {
        assert_eq!(table(Tz::UTC, Utc::now()), "0");
    }

    #[test]
    fn los_angeles_changes_at_2am_local() {
        let now = Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap();
        let t = table(chrono_tz::America::Los_Angeles, now);
        let parts: Vec<i64> = t.split('|').map(|p| p.parse().unwrap()).collect();
        // 2025-01-01: PST.
        assert_eq!(parts[0], -8 * 3_600_000);
        // 2025-03-09 02:00 PST = 10:00 UTC: PDT begins.
        let spring = Utc
            .with_ymd_and_hms(2025, 3, 9, 10, 0, 0)
            .unwrap()
            .timestamp_millis();
        assert_eq!(&parts[1..3], &[spring, -7 * 3_600_000]);
        // 2025-11-02 02:00 PDT = 09:00 UTC: back to PST.
        let fall = Utc
            .with_ymd_and_hms(2025, 11, 2, 9, 0, 0)
            .unwrap()
            .timestamp_millis();
        assert_eq!(&parts[3..5], &[fall, -8 * 3_600_000]);
        // Two changes a year for 11 years.
        assert_eq!((parts.len() - 1) / 2, 22);
    }
}
