//! The decode benchmark (issue 39): MB/s of the product's body decoder on
//! large realistic pages, one side per build (`--features after`: the
//! decoder of issue 39; without: the one before it). `benches/decode/run`
//! builds both sides and runs them in alternating rounds; this program
//! runs one side once: `decode-bench SECONDS` prints one line per page,
//! `<page> <bytes> <MB/s> <heap>`. MB/s is per second of this thread's
//! CPU time, not of the clock: on a machine shared with other work (this
//! one has 2 cores and often a load of 8) the clock counts the time the
//! thread waited for a core, which neither decoder spends. The heap is
//! the most the allocator held at once while one page was decoded, beyond
//! what it held before (the decoded page and everything decoding it
//! took), counted by a wrapper around the system allocator that only
//! counts during that one decode.
//!
//! The pages are made here, the same on both sides: `issues` is a page of
//! 2,000 GitHub issues as the REST API answers them (nested users and
//! labels, text with escapes and non-ASCII, URLs, ids, counts, nulls;
//! 5.7 MB); `numbers` is a page of 20,000 time-series points (floats,
//! timestamps, counts: the worst case for numbers kept as text; 1.4 MB).

// The decoder's own module references `crate::config::fmt_size`.
#![allow(dead_code)]

#[path = "decode/mod.rs"]
mod decode;

mod config {
    pub(crate) fn fmt_size(bytes: u64) -> String {
        format!("{bytes} B")
    }
}

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The system allocator, counting bytes held while `COUNTING`.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static HELD: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            let held = HELD.fetch_add(layout.size() as isize, Relaxed) + layout.size() as isize;
            PEAK.fetch_max(held, Relaxed);
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if COUNTING.load(Relaxed) {
            HELD.fetch_sub(layout.size() as isize, Relaxed);
        }
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            // The old and the new block both live while it moves.
            let held = HELD.fetch_add(new_size as isize, Relaxed) + new_size as isize;
            PEAK.fetch_max(held, Relaxed);
            HELD.fetch_sub(layout.size() as isize, Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// This thread's CPU time, seconds.
fn thread_cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid pointer to a timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// The most heap one decode of `page` held at once, bytes.
fn peak_heap(page: &[u8]) -> isize {
    HELD.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    black_box(decode_page(black_box(page)));
    COUNTING.store(false, Relaxed);
    PEAK.load(Relaxed)
}

/// What the product's answer reads a page with: 4 x the default
/// `max_body` (16 MiB).
const BUDGET: u64 = 4 * (16 << 20);

/// One page decoded as the product decodes a 2xx answer's body; the
/// number of records, so nothing is optimized away.
#[cfg(feature = "after")]
fn decode_page(body: &[u8]) -> usize {
    let text = decode::text::text(body, None);
    let d = decode::decode_text(&text, "/items", BUDGET).expect("decodes");
    d.body["items"].as_array().map_or(0, Vec::len)
}

#[cfg(not(feature = "after"))]
fn decode_page(body: &[u8]) -> usize {
    let v = decode::decode(body, BUDGET).expect("decodes");
    v["items"].as_array().map_or(0, Vec::len)
}

/// A small, fixed pseudo-random sequence (the same pages on both sides).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() as usize) % from.len()]
    }
}

const WORDS: &[&str] = &[
    "the",
    "runner",
    "fails",
    "when",
    "cache",
    "is",
    "cold",
    "Überprüfung",
    "naïve",
    "retry",
    "timeout",
    "\\\"quoted\\\"",
    "path\\/to\\/file",
    "línea",
    "😀",
    "panic",
    "at",
    "src/lib.rs:42",
    "\\n",
    "workflow",
    "请求",
    "merge",
    "conflict",
    "\\t",
    "réseau",
];

fn text(r: &mut Lcg, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(r.pick(WORDS));
    }
    s
}

fn user(r: &mut Lcg, out: &mut String) {
    let id = 1_000 + r.next() % 9_000_000;
    let login = format!("user{id}");
    write!(
        out,
        r#"{{"login":"{login}","id":{id},"node_id":"MDQ6VXNlcj{id}","avatar_url":"https://avatars.githubusercontent.com/u/{id}?v=4","gravatar_id":"","url":"https://api.github.com/users/{login}","html_url":"https://github.com/{login}","type":"User","user_view_type":"public","site_admin":false}}"#
    )
    .unwrap();
}

fn issue(r: &mut Lcg, n: u64, out: &mut String) {
    let words = 60 + (r.next() % 200) as usize;
    let repo = "https://api.github.com/repos/octo-org/octo-repo";
    write!(
        out,
        r#"{{"url":"{repo}/issues/{n}","repository_url":"{repo}","labels_url":"{repo}/issues/{n}/labels{{/name}}","comments_url":"{repo}/issues/{n}/comments","html_url":"https://github.com/octo-org/octo-repo/issues/{n}","id":{},"node_id":"I_kwDOBm{n}","number":{n},"title":"{}","user":"#,
        2_000_000_000 + r.next() % 100_000_000,
        text(r, 6)
    )
    .unwrap();
    user(r, out);
    out.push_str(r#","labels":["#);
    for l in 0..(r.next() % 4) {
        if l > 0 {
            out.push(',');
        }
        let name = r.pick(&[
            "bug",
            "enhancement",
            "good first issue",
            "help wanted",
            "ci",
        ]);
        write!(
            out,
            r#"{{"id":{},"node_id":"LA_kwDO{l}","url":"{repo}/labels/{name}","name":"{name}","color":"d73a4a","default":{},"description":"{}"}}"#,
            100_000 + r.next() % 900_000,
            l == 0,
            text(r, 4)
        )
        .unwrap();
    }
    out.push_str(
        r#"],"state":"open","locked":false,"assignee":null,"assignees":[],"milestone":null,"#,
    );
    write!(
        out,
        r#""comments":{},"created_at":"2024-0{}-1{}T0{}:12:34Z","updated_at":"2024-09-2{}T1{}:00:00Z","closed_at":null,"author_association":"CONTRIBUTOR","active_lock_reason":null,"body":"{}","reactions":{{"url":"{repo}/issues/{n}/reactions","total_count":{},"+1":{},"-1":0,"laugh":0,"hooray":0,"confused":0,"heart":{},"rocket":0,"eyes":0}},"timeline_url":"{repo}/issues/{n}/timeline","performed_via_github_app":null,"state_reason":null,"score":{}.{}}}"#,
        r.next() % 40,
        1 + r.next() % 9,
        r.next() % 10,
        r.next() % 10,
        r.next() % 10,
        r.next() % 10,
        text(r, words),
        r.next() % 50,
        r.next() % 30,
        r.next() % 10,
        r.next() % 100,
        r.next() % 1000,
    )
    .unwrap();
}

fn issues() -> Vec<u8> {
    let mut r = Lcg(39);
    let mut out = String::from(r#"{"total_count":2000,"incomplete_results":false,"items":["#);
    for n in 0..2_000 {
        if n > 0 {
            out.push(',');
        }
        issue(&mut r, 10_000 + n, &mut out);
    }
    out.push_str("]}");
    out.into_bytes()
}

fn numbers() -> Vec<u8> {
    let mut r = Lcg(7);
    let mut out = String::from(r#"{"series":"cpu","items":["#);
    for n in 0..20_000u64 {
        if n > 0 {
            out.push(',');
        }
        write!(
            out,
            r#"{{"t":{},"v":{}.{:03},"min":{}.{},"max":{}.{:04},"n":{},"p99":{}e-{}}}"#,
            1_700_000_000 + n * 60,
            r.next() % 100,
            r.next() % 1000,
            r.next() % 50,
            r.next() % 10,
            50 + r.next() % 50,
            r.next() % 10_000,
            r.next() % 5000,
            1 + r.next() % 9,
            1 + r.next() % 3,
        )
        .unwrap();
    }
    out.push_str("]}");
    out.into_bytes()
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    for (name, page) in [("issues", issues()), ("numbers", numbers())] {
        // Once to warm up, and to check it decodes.
        assert!(decode_page(&page) > 0);
        let heap = peak_heap(&page);
        let budget = Duration::from_secs_f64(seconds);
        let start = Instant::now();
        let cpu = thread_cpu();
        let mut runs = 0u32;
        while start.elapsed() < budget {
            black_box(decode_page(black_box(&page)));
            runs += 1;
        }
        let secs = thread_cpu() - cpu;
        let mbps = page.len() as f64 * f64::from(runs) / secs / 1e6;
        println!("{name} {} {mbps:.1} {heap}", page.len());
    }
}
