//! Logs: tracing to stderr, compact text by default (no colours unless stderr
//! is a terminal, so journald gets clean lines) or one JSON object per line.
//! The level comes from `RUST_LOG` (default: `info` for `run`, `warn` for the
//! commands that print their own output).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber: `RUST_LOG` if set, else `default` (the
/// commands that print their own output keep only warnings). Calling it twice
/// keeps the first.
pub fn init(format: LogFormat, default: &str) {
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
