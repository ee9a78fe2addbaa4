//! Durations as operators write them ("24h", "1m", "1h 30m", "500ms") and
//! print them back.
//!
//! Parsing is humantime's, behind a check of the units: humantime also reads
//! `M` (a month of 30.44 days), `y` (365.25 days) and sub-millisecond units.
//! A month or a year has no fixed length, and `"1M"` beside `"1m"` is one
//! shift-key away from a window 43,830 times too long, so those are errors
//! that say what to write; nothing in the product counts below a millisecond,
//! so `ns` and `us` are errors too.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The units a duration may use, short form first (the one errors suggest).
const UNITS: &[&[&str]] = &[
    &["ms", "msec", "millis"],
    &["s", "sec", "secs", "second", "seconds"],
    &["m", "min", "mins", "minute", "minutes"],
    &["h", "hr", "hrs", "hour", "hours"],
    &["d", "day", "days"],
    &["w", "wk", "wks", "week", "weeks"],
];

/// Units humantime reads that are refused, with what to write instead.
const REFUSED: &[(&[&str], &str)] = &[
    (
        &["M", "month", "months"],
        "months have no fixed length: write days, e.g. \"30d\" (minutes are \"m\")",
    ),
    (
        &["y", "yr", "yrs", "year", "years"],
        "years have no fixed length: write days, e.g. \"365d\"",
    ),
    (
        &["ns", "nsec", "nanos", "us", "usec", "µs"],
        "the smallest unit is ms",
    ),
];

/// Parses "24h", "1m", "1h 30m", "1.5h", "500ms", "90 minutes"; the error
/// says what to write instead.
pub fn parse_duration(written: &str) -> Result<Duration, String> {
    let s = written.trim();
    for unit in s
        .split(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
        .filter(|u| !u.is_empty())
    {
        if let Some((_, why)) = REFUSED.iter().find(|(units, _)| units.contains(&unit)) {
            return Err(format!("invalid duration {written:?}: {why}"));
        }
        if !UNITS.iter().any(|names| names.contains(&unit)) {
            return Err(format!(
                "invalid duration {written:?}: unknown unit {unit:?}; use ms, s, m, h, d or w, e.g. \"24h\", \"1m\", \"500ms\""
            ));
        }
    }
    humantime::parse_duration(s).map_err(|e| {
        format!("invalid duration {written:?} ({e}); write e.g. \"24h\", \"1m\", \"500ms\"")
    })
}

/// A duration field in a raw config type; its parse error reaches the
/// operator positioned at the field (serde carries the span).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dur(pub(super) Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

/// A duration as an operator writes it: "24h", "1m", "1h 30m", "500ms".
pub fn fmt_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    if d < Duration::from_secs(60) && d.subsec_millis() != 0 {
        return format!("{:.1}s", d.as_secs_f64());
    }
    let mut s = d.as_secs();
    let mut out = String::new();
    // Days only from two on: "24h" reads as the config wrote it.
    for (unit, len) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if s >= len && (unit != "d" || s >= 2 * len) {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_config() {
        assert_eq!(fmt_duration(Duration::from_secs(86_400)), "24h");
        assert_eq!(fmt_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(fmt_duration(Duration::from_secs(5_400)), "1h 30m");
        assert_eq!(fmt_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(fmt_duration(Duration::from_millis(59_787)), "59.8s");
        assert_eq!(fmt_duration(Duration::from_secs(60)), "1m");
    }

    #[test]
    fn unambiguous_forms_parse() {
        let secs = |s: &str| parse_duration(s).map(|d| d.as_secs_f64());
        assert_eq!(secs("1m"), Ok(60.0));
        assert_eq!(secs("90 minutes"), Ok(5400.0));
        assert_eq!(secs("1h 30m"), Ok(5400.0));
        assert_eq!(secs("1h30m"), Ok(5400.0));
        assert_eq!(secs("1.5h"), Ok(5400.0));
        assert_eq!(secs(" 30d "), Ok(30.0 * 86_400.0));
        assert_eq!(secs("2w"), Ok(14.0 * 86_400.0));
        assert_eq!(secs("500ms"), Ok(0.5));
        for printed in ["24h", "1h 30m", "500ms", "59.8s", "7d"] {
            assert!(parse_duration(printed).is_ok(), "{printed}");
        }
    }

    #[test]
    fn months_years_and_sub_millisecond_units_are_refused() {
        // Regression (issue 12): "1M" was a month of 30.44 days, one key from
        // "1m", and "1y" a year of 365.25 days.
        let err = |s: &str| parse_duration(s).unwrap_err();
        assert!(
            err("1M").contains("months have no fixed length"),
            "{}",
            err("1M")
        );
        assert!(err("1M").contains("\"30d\""));
        assert!(err("2 months").contains("months"));
        assert!(err("1d 1M").contains("months"));
        assert!(err("1y").contains("years have no fixed length"));
        assert!(err("1year").contains("\"365d\""));
        assert!(err("10us").contains("smallest unit is ms"));
        assert!(err("5x").contains("unknown unit \"x\""));
        assert!(err("1H").contains("unknown unit \"H\""));
        assert!(err("30").contains("invalid duration \"30\""));
        assert!(err("").contains("invalid duration"));
    }
}
