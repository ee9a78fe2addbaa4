//! A `fan_out_from` CSV file read record by record with bounded buffers
//! (issue 22, item 4): a field is kept up to [`FIELD_MAX`] bytes and the
//! rest of it is read past without being kept, so a 150 MB cell costs one
//! field buffer, not 150 MB, and its row is refused naming its line. A
//! record's fields are kept up to the header's count; more is an error.
//!
//! It reads as the `csv` crate's reader did before (`csv_core`, the same
//! parser: RFC 4180 quoting, `,`, CR/LF/CRLF terminators, blank lines
//! skipped, a UTF-8 BOM dropped), with every field trimmed of surrounding
//! whitespace and every record required to have as many fields as the
//! header.

use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use csv_core::{ReadFieldResult, Reader};

/// The longest field kept, bytes: four times the longest value a row may
/// hold once trimmed (`source::MAX_VALUE_BYTES`), the rest room for the
/// whitespace around it. A longer field is read past, not kept.
pub(super) const FIELD_MAX: usize = 4096;

/// Why the file could not be read.
#[derive(Debug, thiserror::Error)]
pub(super) enum CsvError {
    /// Missing, unreadable, or not a regular file.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// A record is malformed.
    #[error("line {line}: {why}")]
    Record {
        /// The line the record starts on.
        line: u64,
        /// What is wrong with it.
        why: String,
    },
}

/// A field as read: its bytes (`None` when longer than [`FIELD_MAX`], read
/// past), and whether it ends its record.
struct RawField {
    bytes: Option<Vec<u8>>,
    record_end: bool,
}

/// What a record's field holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Field {
    /// Its text, trimmed.
    Text(String),
    /// Longer than [`FIELD_MAX`] bytes: not kept.
    TooLong,
}

/// One record of the file.
#[derive(Debug)]
pub(super) struct Record {
    /// The line it starts on (the header is line 1).
    pub(super) line: u64,
    /// Its fields, as many as the header's (at most that many are kept).
    pub(super) fields: Vec<Field>,
    /// How many fields it has.
    count: usize,
}

/// A CSV file, read one record at a time.
pub(super) struct CsvRows {
    input: BufReader<File>,
    core: Reader,
    /// The fields a record must have: the header's count, once read.
    width: Option<usize>,
    /// The field being read, up to [`FIELD_MAX`] bytes.
    buf: Vec<u8>,
    done: bool,
}

impl CsvRows {
    /// Opens `path`, which must be a regular file (a FIFO or a device
    /// would block or never end).
    pub(super) fn open(path: &Path) -> Result<Self, CsvError> {
        if !std::fs::metadata(path)?.is_file() {
            return Err(io::Error::other("not a regular file").into());
        }
        let file = File::open(path)?;
        Ok(CsvRows {
            input: BufReader::with_capacity(64 * 1024, file),
            core: Reader::new(),
            width: None,
            buf: vec![0; FIELD_MAX],
            done: false,
        })
    }

    /// The header: the first record, every name trimmed (none for an empty
    /// file). Each name must be UTF-8 and at most [`FIELD_MAX`] bytes.
    pub(super) fn header(&mut self) -> Result<Vec<String>, CsvError> {
        let Some(first) = self.record(usize::MAX)? else {
            // An empty file: no columns (the caller says what that means).
            self.width = Some(0);
            return Ok(Vec::new());
        };
        let mut names = Vec::with_capacity(first.fields.len());
        for (i, f) in first.fields.into_iter().enumerate() {
            match f {
                Field::Text(name) => names.push(name),
                Field::TooLong => {
                    let why = format!(
                        "the header's column {} is longer than {FIELD_MAX} bytes",
                        i + 1
                    );
                    return Err(self.bad(first.line, why));
                }
            }
        }
        self.width = Some(names.len());
        Ok(names)
    }

    /// The next record after the header, `None` at the end of the file.
    /// Read [`CsvRows::header`] first.
    pub(super) fn next_record(&mut self) -> Result<Option<Record>, CsvError> {
        let width = self.width.expect("the header is read first");
        let Some(record) = self.record(width)? else {
            return Ok(None);
        };
        if record.count != width {
            let why = format!(
                "found a record with {} fields, but the header has {width}",
                record.count
            );
            return Err(self.bad(record.line, why));
        }
        Ok(Some(record))
    }

    /// One record, keeping at most `keep` fields (the count goes on).
    fn record(&mut self, keep: usize) -> Result<Option<Record>, CsvError> {
        if self.done {
            return Ok(None);
        }
        self.skip_line_ends()?;
        let line = self.core.line();
        let mut fields = Vec::new();
        let mut count = 0usize;
        loop {
            let Some(RawField { bytes, record_end }) = self.field()? else {
                self.done = true;
                return Ok(None);
            };
            count += 1;
            if fields.len() < keep {
                fields.push(match bytes {
                    Some(bytes) => match String::from_utf8(bytes) {
                        Ok(s) => Field::Text(s.trim().to_owned()),
                        Err(_) => return Err(self.bad(line, format!("field {count} is not UTF-8"))),
                    },
                    None => Field::TooLong,
                });
            }
            if record_end {
                return Ok(Some(Record {
                    line,
                    fields,
                    count,
                }));
            }
        }
    }

    /// Consumes the line ends before a record (the rest of a CRLF, blank
    /// lines), as the parser would skip them, so that the line a record
    /// starts on is its first byte's.
    fn skip_line_ends(&mut self) -> Result<(), CsvError> {
        loop {
            let data = self.input.fill_buf()?;
            match data.first() {
                Some(b'\n') => self.core.set_line(self.core.line() + 1),
                Some(b'\r') => {}
                _ => return Ok(()),
            }
            self.input.consume(1);
        }
    }

    /// One field; `None` at the end of input.
    fn field(&mut self) -> Result<Option<RawField>, CsvError> {
        let CsvRows {
            input, core, buf, ..
        } = self;
        let mut len = 0;
        let mut too_long = false;
        // Where a field too long to keep is read into, and dropped.
        let mut scratch = [0u8; 4096];
        loop {
            let data = input.fill_buf()?;
            let output: &mut [u8] = if too_long {
                &mut scratch
            } else {
                &mut buf[len..]
            };
            let (res, nin, nout) = core.read_field(data, output);
            input.consume(nin);
            if !too_long {
                len += nout;
            }
            match res {
                ReadFieldResult::InputEmpty => {}
                ReadFieldResult::OutputFull => too_long = true,
                ReadFieldResult::Field { record_end } => {
                    let bytes = (!too_long).then(|| buf[..len].to_vec());
                    return Ok(Some(RawField { bytes, record_end }));
                }
                ReadFieldResult::End => return Ok(None),
            }
        }
    }

    fn bad(&self, line: u64, why: String) -> CsvError {
        CsvError::Record { line, why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each record's line and fields.
    type Records = Vec<(u64, Vec<Field>)>;

    fn rows(text: &[u8]) -> (Vec<String>, Result<Records, CsvError>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.csv");
        std::fs::write(&path, text).unwrap();
        let mut r = CsvRows::open(&path).unwrap();
        let header = r.header().unwrap();
        let mut out = Vec::new();
        let all = loop {
            match r.next_record() {
                Ok(Some(rec)) => out.push((rec.line, rec.fields)),
                Ok(None) => break Ok(out),
                Err(e) => break Err(e),
            }
        };
        (header, all)
    }

    fn text(s: &str) -> Field {
        Field::Text(s.to_owned())
    }

    /// The csv crate's reading, as before: quotes, escaped quotes, commas
    /// and line breaks inside quotes, CRLF, a BOM, blank lines, trimming.
    #[test]
    fn reads_as_the_csv_crate_did() {
        let (h, all) =
            rows(b"\xEF\xBB\xBF a , b\r\n\"x,1\",\"say \"\"hi\"\"\" \r\n\r\n\"two\nlines\",z\n");
        assert_eq!(h, ["a", "b"]);
        let all = all.unwrap();
        assert_eq!(all[0], (2, vec![text("x,1"), text("say \"hi\"")]));
        assert_eq!(all[1], (4, vec![text("two\nlines"), text("z")]));
        assert_eq!(all.len(), 2);
        let (h, all) = rows(b"");
        assert!(h.is_empty());
        assert!(all.unwrap().is_empty());
    }

    /// Issue 22, item 4: a field is kept up to FIELD_MAX bytes; a longer
    /// one is read past and named, and the rows after it still read.
    #[test]
    fn issue_22_4_a_field_too_long_is_read_past_not_kept() {
        let long = "y".repeat(FIELD_MAX + 1);
        let csv = format!(
            "a,b\n1,ok\n2,\"{long}\"\n3,{long}\n4,{}\n",
            "z".repeat(FIELD_MAX)
        );
        let (_, all) = rows(csv.as_bytes());
        let all = all.unwrap();
        assert_eq!(all[0], (2, vec![text("1"), text("ok")]));
        assert_eq!(all[1], (3, vec![text("2"), Field::TooLong]));
        assert_eq!(all[2], (4, vec![text("3"), Field::TooLong]));
        assert_eq!(
            all[3].1[1],
            Field::TooLong,
            "exactly FIELD_MAX is not kept either"
        );
        assert_eq!(all.len(), 4);
    }

    /// A ragged record, a field that is not UTF-8 and a header name over
    /// FIELD_MAX are errors naming the line; a record of a million fields
    /// keeps no more than the header's.
    #[test]
    fn malformed_records_are_errors_naming_their_line() {
        let e = rows(b"a,b\n1,2\n3\n").1.unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: found a record with 1 fields, but the header has 2"
        );
        let e = rows(b"a\n1\n\xff\n").1.unwrap_err();
        assert!(
            e.to_string().ends_with("line 3: field 1 is not UTF-8"),
            "{e}"
        );
        let wide = format!("a\n{}\n", ",".repeat(1_000_000));
        let e = rows(wide.as_bytes()).1.unwrap_err();
        assert!(
            e.to_string()
                .ends_with("found a record with 1000001 fields, but the header has 1"),
            "{e}"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.csv");
        std::fs::write(&path, format!("a,{}\n1,2\n", "h".repeat(FIELD_MAX + 1))).unwrap();
        let e = CsvRows::open(&path).unwrap().header().unwrap_err();
        assert!(
            e.to_string()
                .ends_with("line 1: the header's column 2 is longer than 4096 bytes"),
            "{e}"
        );
    }
}
