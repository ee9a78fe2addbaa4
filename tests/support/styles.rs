//! Jobs in each of the simulator's pagination styles ([`Style`]: GitHub's
//! `Link`, Meta's `paging.next`, a relative next URL, page numbers, a
//! numeric cursor) on the world's credential and endpoint
//! ([`super::world`]), for the pagination and incremental tests; and a scan
//! of every key and value in a Redis, to show a secret is nowhere in it.

use std::collections::BTreeMap;
use std::time::Duration;

use simulator::{SimConfig, SimStyle};

use super::config::{ConfigBuilder, Endpoint, Job, Request, Sink, Window};
use super::pipeline::Pipeline;
use super::world::{self, ENDPOINT};

/// The path every job here pages.
pub const PATH: &str = "/items";

/// Where a job sends the key.
#[derive(Debug, Clone, Copy)]
pub enum Auth {
    /// In the query parameter of this name.
    Query(&'static str),
    /// As `Authorization: Bearer KEY`.
    Bearer,
}

/// A simulator style as a job pages it.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    /// The simulator's.
    pub sim: SimStyle,
    /// A name for messages.
    pub name: &'static str,
    /// Where the key goes.
    pub auth: Auth,
    /// `[job.sink] records`.
    pub records: &'static str,
    /// `[job.pagination]` fields (besides `max_pages`).
    pub pagination: &'static [(&'static str, &'static str)],
}

/// GitHub: the key as a bearer token, `Link` headers, the array as the body.
pub const GITHUB: Style = Style {
    sim: SimStyle::Link,
    name: "link (GitHub)",
    auth: Auth::Bearer,
    records: "",
    pagination: &[("style", "link")],
};

/// Meta: the key in the query, echoed in the absolute `paging.next`.
pub const META: Style = Style {
    sim: SimStyle::NextUrl,
    name: "next_url (Meta)",
    auth: Auth::Query("access_token"),
    records: "/data",
    pagination: &[("style", "next_url"), ("next", "/paging/next")],
};

/// Salesforce-like: a bearer token, a relative `nextRecordsUrl`.
pub const RELATIVE: Style = Style {
    sim: SimStyle::RelativeNext,
    name: "next_url, relative",
    auth: Auth::Bearer,
    records: "/records",
    pagination: &[("style", "next_url"), ("next", "/nextRecordsUrl")],
};

/// Page numbers, until an empty page.
pub const PAGES: Style = Style {
    sim: SimStyle::PageNumber,
    name: "page",
    auth: Auth::Query("key"),
    records: "/items",
    pagination: &[("style", "page"), ("param", "page")],
};

/// A numeric cursor (`"next_page": 2`), in the default style.
pub const NUMERIC: Style = Style {
    sim: SimStyle::NumericCursor,
    name: "cursor, numeric",
    auth: Auth::Query("key"),
    records: "/items",
    pagination: &[("cursor", "/next_page"), ("param", "page")],
};

/// The world's credential with the secret `secret` (the secret tests
/// spell theirs) and one `window`, its endpoint (more fields with
/// `endpoint`), two quick worker slots, and `jobs`.
pub fn config(
    secret: &str,
    window: Window,
    endpoint: impl FnOnce(Endpoint) -> Endpoint,
    jobs: impl IntoIterator<Item = Job>,
) -> ConfigBuilder {
    let mut b = ConfigBuilder::new()
        .worker(world::quick_worker(2))
        .credential(world::credential(window).secret(secret))
        .endpoint(endpoint(world::endpoint()));
    for j in jobs {
        b = b.job(j);
    }
    b
}

/// The daemon in-process ([`Pipeline`]) on `style`'s simulator of `pages`
/// pages, with [`config`] for the secret `key` and `window`, the endpoint as
/// `endpoint` makes it, and the jobs `jobs` builds from the simulator's
/// base URL.
pub async fn pipeline(
    style: &Style,
    pages: u32,
    key: &str,
    window: Window,
    endpoint: impl FnOnce(Endpoint) -> Endpoint,
    jobs: impl FnOnce(&str) -> Vec<Job>,
) -> Pipeline {
    Pipeline::start(sim(style.sim, pages, key), |base| {
        config(key, window, endpoint, jobs(base))
    })
    .await
}

/// `name` paging `base`'s [`PATH`] in `style`, fanned out over `repo =
/// repos`, with `query` (more pairs; the key goes in by the style), at most
/// `max_pages` a run, no retries, records into `data/{job}/{repo}.jsonl`.
pub fn job(
    name: &str,
    style: &Style,
    base: &str,
    repos: &[&str],
    query: &[(&str, &str)],
    max_pages: u32,
) -> Job {
    let mut pairs = vec![("repo", "{repo}")];
    pairs.extend_from_slice(query);
    let mut request = Request::get(&format!("{base}{PATH}"));
    match style.auth {
        Auth::Query(param) => pairs.push((param, "{secret}")),
        Auth::Bearer => request = request.headers(&[("Authorization", "Bearer {secret}")]),
    }
    let mut j = Job::new(name, ENDPOINT)
        .fan_out("repo", repos.iter().copied())
        .retry(1, None, None)
        .request(request.query(&pairs))
        .sink(Sink::jsonl("data/{job}/{repo}.jsonl").records(style.records))
        .pagination("max_pages", i64::from(max_pages));
    for (k, v) in style.pagination {
        j = j.pagination(k, *v);
    }
    j
}

/// The simulator in `style`: `pages` pages of 2 items per scope, [`PATH`]
/// costing 1, the key `key` with room for everything.
pub fn sim(style: SimStyle, pages: u32, key: &str) -> SimConfig {
    SimConfig {
        pages_per_query: pages,
        items_per_page: 2,
        style,
        ..SimConfig::default()
    }
    .cost(PATH, 1)
    .key(key, 1_000_000, Duration::from_secs(3600))
}

/// `(scope, page) -> 1` for `pages` of each scope: what one run of each
/// item asks the upstream for.
pub fn once_each(
    scopes: &[&str],
    pages: std::ops::RangeInclusive<u32>,
) -> BTreeMap<(String, u32), usize> {
    scopes
        .iter()
        .flat_map(|s| pages.clone().map(move |p| ((s.to_string(), p), 1)))
        .collect()
}

/// Every spelling of `secret` a leak could take: as it is, percent-encoded
/// (upper and lower hex, `+` for spaces) and JSON-escaped.
pub fn spellings(secret: &str) -> Vec<String> {
    let encoded: String = secret
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let json = serde_json::to_string(secret).expect("json");
    vec![
        secret.to_owned(),
        encoded.to_lowercase(),
        encoded.replace("%20", "+"),
        json[1..json.len() - 1].to_owned(),
        encoded,
    ]
}

/// Every key in the Redis at `url` and every value it holds (strings, hash
/// fields and values, list, set and sorted-set members, stream entries), as
/// text; a binary value (a window's msgpack counters) as lossy UTF-8, which
/// keeps any secret inside it readable.
pub fn everything_in(url: &str) -> Vec<String> {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
    let mut out = Vec::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE").arg(&k).query(&mut conn).expect("TYPE");
        let read: &[&str] = match kind.as_str() {
            "string" => &["GET"],
            "hash" => &["HGETALL"],
            "list" => &["LRANGE", "0", "-1"],
            "set" => &["SMEMBERS"],
            "zset" => &["ZRANGE", "0", "-1"],
            "stream" => &["XRANGE", "-", "+"],
            // Gone since KEYS listed it.
            "none" => &[],
            other => panic!("key {k} has a type this scan does not read: {other}"),
        };
        if let Some((cmd, rest)) = read.split_first() {
            let v: redis::Value = redis::cmd(cmd)
                .arg(&k)
                .arg(rest)
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("{cmd} {k}: {e}"));
            out.push(k);
            texts(v, &mut out);
        }
    }
    out
}

/// Every string in a reply, nested ones included, as text.
fn texts(v: redis::Value, out: &mut Vec<String>) {
    use redis::Value as V;
    match v {
        V::Nil | V::Okay => {}
        V::BulkString(b) => out.push(String::from_utf8_lossy(&b).into_owned()),
        V::SimpleString(s) => out.push(s),
        V::Array(vs) | V::Set(vs) => vs.into_iter().for_each(|v| texts(v, out)),
        V::Map(kvs) => kvs.into_iter().for_each(|(k, v)| {
            texts(k, out);
            texts(v, out);
        }),
        other => out.push(format!("{other:?}")),
    }
}
