//! Decoded views of upstream text, for the scrubber: the text with its JSON
//! escapes (`\/`, `\"`, `\uXXXX`, surrogate pairs) or its percent-encoding
//! (either case) decoded, each decoded byte mapped back to the bytes of the
//! text it came from. The scrubber matches the secret in every view and
//! removes what each match came from, so a secret is found however the
//! upstream spelled it, mixed spellings within one occurrence included.
//!
//! The map is sparse (one segment per escape and per run of plain bytes),
//! so a view of a large string costs its bytes and a few words per escape,
//! never a word per byte.

use std::borrow::Cow;

/// Where a run of a view's bytes came from.
#[derive(Debug, Clone, Copy)]
struct Seg {
    /// The view position the run starts at.
    at: usize,
    /// Where it came from in the original text.
    from: usize,
    /// 0: plain bytes, byte `at + i` came from `from + i`. Otherwise every
    /// byte of the run is the decoding of the `esc` bytes at `from`.
    esc: usize,
}

/// One spelling of a text: its bytes and where each came from.
#[derive(Debug)]
pub(super) struct View<'t> {
    pub(super) bytes: Cow<'t, [u8]>,
    segs: Vec<Seg>,
    /// Where an escape cut short by the end of a cut text starts, in the
    /// original (`\u00`, `%2`): it is not in `bytes`.
    pub(super) partial_from: Option<usize>,
}

impl<'t> View<'t> {
    /// The text as it is.
    pub(super) fn raw(text: &'t str) -> Self {
        View {
            bytes: Cow::Borrowed(text.as_bytes()),
            segs: vec![Seg {
                at: 0,
                from: 0,
                esc: 0,
            }],
            partial_from: None,
        }
    }

    fn seg(&self, p: usize) -> Seg {
        let i = self.segs.partition_point(|s| s.at <= p);
        self.segs[i.saturating_sub(1)]
    }

    /// Where byte `p` of the view starts in the original.
    pub(super) fn start(&self, p: usize) -> usize {
        let s = self.seg(p);
        if s.esc == 0 {
            s.from + (p - s.at)
        } else {
            s.from
        }
    }

    /// Where byte `p` of the view ends in the original (exclusive).
    pub(super) fn end(&self, p: usize) -> usize {
        let s = self.seg(p);
        if s.esc == 0 {
            s.from + (p - s.at) + 1
        } else {
            s.from + s.esc
        }
    }

    /// Whether the view holds `b`.
    pub(super) fn has(&self, b: u8) -> bool {
        memchr::memchr(b, &self.bytes).is_some()
    }

    /// This view with its JSON string escapes decoded. `cut`: the text is
    /// the start of a longer one, so an escape at its very end may be cut
    /// short (`partial_from`).
    pub(super) fn json_unescaped(&self, cut: bool) -> View<'static> {
        self.decode(b'\\', cut, json_escape)
    }

    /// This view with its `%XX` triplets decoded (either case); `+` stays.
    pub(super) fn percent_decoded(&self, cut: bool) -> View<'static> {
        self.decode(b'%', cut, percent_escape)
    }

    /// Decodes every escape that starts with `lead`; `escape` reads one at
    /// the start of its slice: its length and its bytes, or `Partial` when
    /// the slice ends inside it, or `None` when it is no escape.
    fn decode(&self, lead: u8, cut: bool, escape: fn(&[u8]) -> Escape) -> View<'static> {
        let src: &[u8] = &self.bytes;
        let mut b = Builder {
            src: self,
            out: Vec::with_capacity(src.len()),
            segs: Vec::new(),
            partial_from: self.partial_from,
        };
        let mut last = 0;
        let mut i = 0;
        while let Some(off) = memchr::memchr(lead, &src[i..]) {
            let at = i + off;
            match escape(&src[at..]) {
                Escape::Decoded(len, bytes) => {
                    b.copy(last, at);
                    b.escape(at, at + len, &bytes);
                    last = at + len;
                    i = last;
                }
                Escape::Partial if cut => {
                    b.copy(last, at);
                    // Ahead of an escape cut short by an earlier view.
                    b.partial_from = Some(self.start(at).min(b.partial_from.unwrap_or(usize::MAX)));
                    last = src.len();
                    break;
                }
                Escape::Partial | Escape::None => i = at + 1,
            }
        }
        b.copy(last, src.len());
        View {
            bytes: Cow::Owned(b.out),
            segs: b.segs,
            partial_from: b.partial_from,
        }
    }
}

/// A view being built from another.
struct Builder<'s, 't> {
    src: &'s View<'t>,
    out: Vec<u8>,
    segs: Vec<Seg>,
    partial_from: Option<usize>,
}

impl Builder<'_, '_> {
    /// Copies `src` bytes `a..b` as they are, keeping where each came from.
    fn copy(&mut self, a: usize, b: usize) {
        let src = self.src;
        let mut p = a;
        while p < b {
            let i = src.segs.partition_point(|s| s.at <= p) - 1;
            let s = src.segs[i];
            let seg_end = src.segs.get(i + 1).map_or(src.bytes.len(), |n| n.at);
            let upto = seg_end.min(b);
            let from = if s.esc == 0 {
                s.from + (p - s.at)
            } else {
                s.from
            };
            self.segs.push(Seg {
                at: self.out.len(),
                from,
                esc: s.esc,
            });
            self.out.extend_from_slice(&src.bytes[p..upto]);
            p = upto;
        }
    }

    /// `src` bytes `a..b` decode to `bytes`.
    fn escape(&mut self, a: usize, b: usize, bytes: &[u8]) {
        let from = self.src.start(a);
        self.segs.push(Seg {
            at: self.out.len(),
            from,
            esc: self.src.end(b - 1) - from,
        });
        self.out.extend_from_slice(bytes);
    }
}

/// What an escape's lead starts.
enum Escape {
    /// An escape of this many bytes, decoding to these.
    Decoded(usize, Vec<u8>),
    /// An escape the text ends inside.
    Partial,
    /// Not an escape: the lead is a plain byte.
    None,
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// `%XX`, either case.
fn percent_escape(s: &[u8]) -> Escape {
    match (s.get(1).copied().map(hex), s.get(2).copied().map(hex)) {
        (Some(Some(h)), Some(Some(l))) => Escape::Decoded(3, vec![h << 4 | l]),
        (None, _) | (Some(Some(_)), None) => Escape::Partial,
        _ => Escape::None,
    }
}

/// Four hex digits at the start of `s`: `Err(true)` when `s` ends first.
fn hex4(s: &[u8]) -> Result<u32, bool> {
    let mut v = 0u32;
    for i in 0..4 {
        let Some(&b) = s.get(i) else { return Err(true) };
        v = v << 4 | u32::from(hex(b).ok_or(false)?);
    }
    Ok(v)
}

/// A JSON string escape (RFC 8259 section 7), a surrogate pair as one.
fn json_escape(s: &[u8]) -> Escape {
    let simple = |b: u8| Escape::Decoded(2, vec![b]);
    match s.get(1) {
        None => Escape::Partial,
        Some(&c @ (b'"' | b'\\' | b'/')) => simple(c),
        Some(b'b') => simple(0x08),
        Some(b'f') => simple(0x0c),
        Some(b'n') => simple(b'\n'),
        Some(b'r') => simple(b'\r'),
        Some(b't') => simple(b'\t'),
        Some(b'u') => {
            let unit = match hex4(&s[2..]) {
                Ok(u) => u,
                Err(true) => return Escape::Partial,
                Err(false) => return Escape::None,
            };
            let (len, code) = if (0xD800..0xDC00).contains(&unit) {
                // A high surrogate: the pair is one character.
                match (s.get(6..8), hex4(s.get(8..).unwrap_or_default())) {
                    (Some(b"\\u"), Ok(low)) if (0xDC00..0xE000).contains(&low) => {
                        (12, 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
                    }
                    (Some(b"\\u"), Err(true)) => return Escape::Partial,
                    (None, _) if s.len() < 8 && (s.len() < 7 || s[6] == b'\\') => {
                        return Escape::Partial;
                    }
                    _ => return Escape::None,
                }
            } else {
                (6, unit)
            };
            match char::from_u32(code) {
                Some(c) => Escape::Decoded(len, c.to_string().into_bytes()),
                None => Escape::None,
            }
        }
        Some(_) => Escape::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each decoded byte maps back to the escape it came from.
    #[test]
    fn views_map_back_to_the_text() {
        let text = r"a\/b%2Fc\u00e4\ud83d\ude00z";
        let j = View::raw(text).json_unescaped(false);
        assert_eq!(j.bytes.as_ref(), "a/b%2Fcä😀z".as_bytes());
        assert_eq!((j.start(1), j.end(1)), (1, 3), r"\/");
        assert_eq!((j.start(2), j.end(2)), (3, 4), "b");
        let ae = "a/b%2Fc".len();
        assert_eq!((j.start(ae), j.end(ae + 1)), (8, 14), r"\u00e4");
        let p = j.percent_decoded(false);
        assert_eq!(p.bytes.as_ref(), "a/b/cä😀z".as_bytes());
        assert_eq!((p.start(3), p.end(3)), (4, 7), "%2F");
        assert_eq!((p.start(4), p.end(4)), (7, 8), "c");
        let last = p.bytes.len() - 1;
        assert_eq!((p.start(last), p.end(last)), (text.len() - 1, text.len()));
    }

    /// An escape cut short at the end of a cut text is not decoded, and
    /// says where it starts; in a whole text it is plain bytes.
    #[test]
    fn escapes_cut_short_are_partial() {
        for (text, at) in [
            ("ab\\u00", 2),
            ("ab%2", 2),
            ("ab\\", 2),
            ("ab\\ud83d\\u", 2),
        ] {
            let v = View::raw(text);
            let d = if text.contains('%') {
                v.percent_decoded(true)
            } else {
                v.json_unescaped(true)
            };
            assert_eq!(d.bytes.as_ref(), b"ab", "{text}");
            assert_eq!(d.partial_from, Some(at), "{text}");
            let whole = v.json_unescaped(false);
            assert_eq!(whole.partial_from, None);
        }
        assert_eq!(
            View::raw("%zz").percent_decoded(true).bytes.as_ref(),
            b"%zz"
        );
    }
}
