//! What every section hands back: markdown for `report.md`, data for
//! `report.json`, and the targets it checked.

use serde::Serialize;

/// One target of the benchmark issue, as measured in this run.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared, e.g. "spends/s vs ceiling at 64 callers, cost 1, 1 window".
    pub what: String,
    /// The target, e.g. "≥ 90%".
    pub target: String,
    /// What this run measured, e.g. "94% (31,204 vs 33,190 /s)".
    pub measured: String,
    /// Whether the measurement meets the target.
    pub met: bool,
    /// A correctness promise rather than a speed: missing it fails the run
    /// (exit 1), in smoke mode too. Speed targets never fail it.
    pub correctness: bool,
}

impl Target {
    pub fn new(
        what: impl Into<String>,
        target: impl Into<String>,
        measured: impl Into<String>,
        met: bool,
    ) -> Self {
        Target {
            what: what.into(),
            target: target.into(),
            measured: measured.into(),
            met,
            correctness: false,
        }
    }

    /// Marks it a correctness promise (see [`Target::correctness`]).
    pub fn correctness(mut self) -> Self {
        self.correctness = true;
        self
    }
}

/// The result of one section.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    /// Its name on the command line (`throughput`, `memory`, ...).
    pub key: &'static str,
    /// Heading in report.md.
    pub title: String,
    /// Body in report.md (tables, one line of method), without the heading.
    pub markdown: String,
    /// Every number behind the markdown, for report.json.
    pub data: serde_json::Value,
    /// Targets checked by this section.
    pub targets: Vec<Target>,
}
