//! The daemon's HTTP side as a client sees it: plain HTTP/1.0 requests for
//! `/metrics`, `/healthz`, `/readyz` and the status page (no client library
//! between the test and the bytes), and a parser for the Prometheus text
//! format.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

use super::{wait_every, wait_until};

/// `GET path` on `127.0.0.1:port` (HTTP/1.0, 5 s timeouts): status and body,
/// `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(port, "GET", path, &[]).map(|r| (r.status, r.body))
}

/// An HTTP answer: status, header lines (names lowercased) and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// Each header, name lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Answer {
    /// The first header named `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `method path` on `127.0.0.1:port` with extra `headers` (HTTP/1.0, 5 s
/// timeouts), `None` when nothing answers.
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Option<Answer> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name (with `_bucket`, `_sum`, `_count` suffixes as written).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Every sample, in page order.
    pub samples: Vec<Sample>,
    /// The page as served.
    pub text: String,
}

impl Metrics {
    /// Parses the text format (labels values without escaped quotes, which
    /// is all the product writes).
    pub fn parse(text: &str) -> Metrics {
        let mut samples = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad metrics line {line:?}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v
                    .parse()
                    .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}")),
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("bad labels in {line:?}"));
                    let mut labels = BTreeMap::new();
                    for pair in body.split("\",").filter(|p| !p.is_empty()) {
                        let (k, v) = pair
                            .split_once("=\"")
                            .unwrap_or_else(|| panic!("bad label {pair:?} in {line:?}"));
                        labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
                    }
                    (name.to_owned(), labels)
                }
            };
            samples.push(Sample {
                name,
                labels,
                value,
            });
        }
        Metrics {
            samples,
            text: text.to_owned(),
        }
    }

    /// Samples of `name` whose labels include all of `want`.
    pub fn select(&self, name: &str, want: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && want
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The sum of [`Metrics::select`] (0 when none).
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.select(name, want).iter().map(|s| s.value).sum()
    }

    /// The one sample of `name` with labels `want`; panics unless exactly one.
    pub fn one(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        let found = self.select(name, want);
        assert_eq!(
            found.len(),
            1,
            "expected one {name}{want:?}, found {found:?}; page:\n{}",
            self.text
        );
        found[0].value
    }
}

/// Scrapes `/metrics` on `port` (panics unless it answers 200).
pub fn scrape(port: u16) -> Metrics {
    match http_get(port, "/metrics") {
        Some((200, body)) => Metrics::parse(&body),
        other => panic!("GET /metrics on port {port}: {other:?}"),
    }
}

/// Scrapes `/metrics` on `port` until `cond` holds of a scrape, for at
/// most `timeout`: that scrape, or the last one (the caller's assertions
/// then say what it shows). A daemon serves the gauges it reads from Redis
/// again for up to a second (one read per second however many scrapers), so
/// a scrape right after a change can show the value from before it: the
/// test waits for the value it is about, not for the second. The condition
/// must tell the new value from the old (a value that was already true
/// before the change proves nothing).
pub fn scrape_until(
    port: u16,
    timeout: Duration,
    mut cond: impl FnMut(&Metrics) -> bool,
) -> Metrics {
    let mut last = None;
    wait_every(timeout, Duration::from_millis(50), || {
        let m = scrape(port);
        let held = cond(&m);
        last = Some(m);
        held
    });
    last.expect("wait_every looks at least once")
}

/// Waits up to `timeout` until `port` serves `/healthz`.
pub fn wait_http(port: u16, timeout: Duration) -> bool {
    wait_until(timeout, || {
        matches!(http_get(port, "/healthz"), Some((200, _)))
    })
}
