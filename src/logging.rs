//! Logs: tracing to stderr, compact text by default (no colours unless stderr
//! is a terminal, so journald gets clean lines) or one JSON object per line.
//! The level comes from `RUST_LOG` (default: `info` for `run`, `warn` for the
//! commands that print their own output).
//!
//! Log lines carry text from outside: upstream answers (error bodies, header
//! values), fan-out values, paths. In the text format every control
//! character in a message or field is escaped (`\r`, `\x1b`, ...), so such
//! text can neither forge a log line (CR, LF) nor drive the terminal that
//! shows it (ESC sequences); JSON escapes them itself.

use std::fmt;
use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};

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
        LogFormat::Text => builder
            .compact()
            .fmt_fields(EscapedFields::default())
            .try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// The text format's fields (the message among them), formatted as
/// tracing-subscriber does and then with every control character escaped.
/// (tracing-subscriber escapes ESC and a few others in the message only; a
/// CR, or anything in a `%`-formatted field, went out raw.) Field names are
/// not italicised on a terminal.
#[derive(Debug, Default)]
pub struct EscapedFields(DefaultFields);

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut plain = String::new();
        self.0.format_fields(Writer::new(&mut plain), fields)?;
        escape_controls(&mut writer, &plain)
    }
}

/// Writes `text` with its control characters (C0, DEL, C1) escaped.
fn escape_controls(out: &mut impl fmt::Write, text: &str) -> fmt::Result {
    for c in text.chars() {
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c.is_ascii_control() => write!(out, "\\x{:02x}", c as u32)?,
            c if c.is_control() => write!(out, "\\u{{{:x}}}", c as u32)?,
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn control_characters_in_messages_and_fields_are_escaped() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .compact()
            .fmt_fields(EscapedFields::default())
            .finish();
        let hostile = "US\r\x1b[31mFAKE\x07\u{9b}0m\n";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(item = %hostile, debugged = ?hostile, "answered: {hostile}");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        // One line, ending in the only newline, with no control character.
        assert_eq!(out.matches('\n').count(), 1, "{out:?}");
        assert!(out.ends_with('\n'), "{out:?}");
        let line = out.trim_end_matches('\n');
        assert!(!line.chars().any(char::is_control), "{line:?}");
        // What was sent stays readable.
        assert!(
            line.contains(r"item=US\r\x1b[31mFAKE\x07\u{9b}0m\n"),
            "{line:?}"
        );
        assert!(line.contains(r"answered: US\r"), "{line:?}");
    }
}
