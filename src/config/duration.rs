//! Durations as operators write them ("24h", "1m", "1h 30m", "500ms") and
//! print them back.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Parses "24h", "1m", "1h 30m", "1.5h", "500ms", "90 minutes"; the error
/// says what to write instead.
pub fn parse_duration(written: &str) -> Result<Duration, String> {
    let s = written.trim();
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
}
