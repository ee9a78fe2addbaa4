//! Logs: tracing to stderr, compact text by default (no colours unless stderr
//! is a terminal, so journald gets clean lines) or one JSON object per line.
//! The level comes from `RUST_LOG` (default `info`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber at level `info` unless `RUST_LOG` says
/// otherwise. Calling it twice keeps the first.
pub fn init(format: LogFormat) {
    init_with_default(format, "info");
}

/// Like [`init`], with another default filter (the demo prints its own view
/// and keeps only warnings from the log).
pub fn init_with_default(format: LogFormat, default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.compact().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
