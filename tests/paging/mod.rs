//! What the pagination-style and incremental tests share: a config with one
//! credential and endpoint on the simulator, a job in one of the simulator's
//! styles ([`Style`]), and a scan of every key and value in Redis for the
//! secret. The daemon runs in-process (`pipeline::Pipeline`).
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::time::Duration;

use quota_worker::simulator::{SimConfig, SimStats, SimStyle};

use crate::pipeline::NEVER;

/// The environment variable the credential's secret comes from.
pub const KEY_ENV: &str = "QW_TEST_API";
/// The path every job here pages.
pub const PATH: &str = "/items";
/// The endpoint every job here spends on.
pub const ENDPOINT: &str = "api.items";

/// `config.toml`: the credential `api` with `window`, the endpoint
/// [`ENDPOINT`] (cost 1, plus `endpoint_extra` lines), two worker slots.
pub fn config(window: &str, endpoint_extra: &str) -> String {
    format!(
        r#"
jobs = "jobs/*.toml"

[redis]
url = "@REDIS@"

[worker]
concurrency = 2
poll_interval = "20ms"
shutdown_timeout = "5s"

[metrics]
listen = "off"

[credentials.api]
secret_env = "{KEY_ENV}"
windows = [{window}]

[endpoints."{ENDPOINT}"]
credential = "api"
cost = 1
{endpoint_extra}
"#
    )
}

/// A simulator style as a job pages it: where the key goes, where the
/// records are, the `[job.pagination]` lines.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    /// The simulator's.
    pub sim: SimStyle,
    /// A name for messages.
    pub name: &'static str,
    /// `[job.request]` lines that send the key.
    pub auth: &'static str,
    /// `[job.sink] records`.
    pub records: &'static str,
    /// `[job.pagination]` lines (without `max_pages`).
    pub pagination: &'static str,
}

/// GitHub: the key as a bearer token, `Link` headers.
pub const GITHUB: Style = Style {
    sim: SimStyle::Link,
    name: "link (GitHub)",
    auth: r#"headers = { Authorization = "Bearer {secret}" }"#,
    records: "",
    pagination: r#"style = "link""#,
};

/// Meta: the key in the query, echoed in the absolute `paging.next`.
pub const META: Style = Style {
    sim: SimStyle::NextUrl,
    name: "next_url (Meta)",
    auth: r#"query_key = "access_token""#,
    records: "/data",
    pagination: "style = \"next_url\"\nnext = \"/paging/next\"",
};

/// Salesforce-like: a bearer token, a relative `nextRecordsUrl`.
pub const RELATIVE: Style = Style {
    sim: SimStyle::RelativeNext,
    name: "next_url, relative",
    auth: r#"headers = { Authorization = "Bearer {secret}" }"#,
    records: "/records",
    pagination: "style = \"next_url\"\nnext = \"/nextRecordsUrl\"",
};

/// Page numbers, until an empty page.
pub const PAGES: Style = Style {
    sim: SimStyle::PageNumber,
    name: "page",
    auth: r#"query_key = "key""#,
    records: "/items",
    pagination: "style = \"page\"\nparam = \"page\"",
};

/// A numeric cursor (`"next_page": 2`), the default style.
pub const NUMERIC: Style = Style {
    sim: SimStyle::NumericCursor,
    name: "cursor, numeric",
    auth: r#"query_key = "key""#,
    records: "/items",
    pagination: "cursor = \"/next_page\"\nparam = \"page\"",
};

/// `jobs/NAME.toml`: `name` paging `base`'s [`PATH`] in `style`, fanned
/// out over `repo = repos`, `query` extra query pairs (`a = "b", ...`),
/// `pagination_extra` lines (`continue = true`), records into
/// `data/{job}/{repo}.jsonl`.
pub fn job(
    name: &str,
    style: &Style,
    repos: &[&str],
    query: &str,
    max_pages: u32,
    pagination_extra: &str,
) -> (String, String) {
    let repos: Vec<String> = repos.iter().map(|r| format!("{r:?}")).collect();
    // The key goes in the query under the name `query_key` gives, or in
    // the headers the style names.
    let (key_pair, headers) = match style.auth.strip_prefix("query_key = ") {
        Some(param) => (
            format!(", {} = \"{{secret}}\"", param.trim_matches('"')),
            "",
        ),
        None => (String::new(), style.auth),
    };
    let text = format!(
        r#"
[{name}]
schedule = "{NEVER}"
endpoint = "{ENDPOINT}"
fan_out = {{ repo = [{repos}] }}
retry = {{ attempts = 1 }}

[{name}.request]
url = "@SIM@{PATH}"
query = {{ repo = "{{repo}}"{query}{key_pair} }}
{headers}

[{name}.pagination]
{pagination}
max_pages = {max_pages}
{pagination_extra}

[{name}.sink]
kind = "jsonl"
path = "data/{{job}}/{{repo}}.jsonl"
records = "{records}"
"#,
        repos = repos.join(", "),
        pagination = style.pagination,
        records = style.records,
    );
    (format!("{name}.toml"), text)
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

/// Requests per `(scope, page)` since request number `from` of the log.
pub fn per_page(stats: &SimStats, from: usize) -> BTreeMap<(String, u32), usize> {
    stats.requests_per_page(from)
}

/// `(scope, page) -> 1` for pages `pages` of each scope: what one run of
/// each item asks for.
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
/// fields and values, list, set and sorted-set members), as text.
pub fn everything_in(url: &str) -> Vec<String> {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
    let mut out = Vec::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE").arg(&k).query(&mut conn).expect("TYPE");
        let values: Vec<String> = match kind.as_str() {
            "string" => vec![redis::cmd("GET").arg(&k).query(&mut conn).expect("GET")],
            "hash" => redis::cmd("HGETALL")
                .arg(&k)
                .query(&mut conn)
                .expect("HGETALL"),
            "list" => redis::cmd("LRANGE")
                .arg(&k)
                .arg(0)
                .arg(-1)
                .query(&mut conn)
                .expect("LRANGE"),
            "set" => redis::cmd("SMEMBERS")
                .arg(&k)
                .query(&mut conn)
                .expect("SMEMBERS"),
            "zset" => redis::cmd("ZRANGE")
                .arg(&k)
                .arg(0)
                .arg(-1)
                .query(&mut conn)
                .expect("ZRANGE"),
            // Gone since KEYS listed it.
            "none" => Vec::new(),
            other => panic!("key {k} has a type this scan does not read: {other}"),
        };
        out.push(k);
        out.extend(values);
    }
    out
}
