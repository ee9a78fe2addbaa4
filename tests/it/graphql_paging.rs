//! Promise (SPEC Part 4, "GraphQL requests and pages that say whether more
//! follow", issue 32), through the real binary: a GraphQL connection is
//! paged by its `endCursor` sent in the POST body's variables, and its
//! `hasNextPage` ends the run without one more request; a run the quota
//! stops at page 3 resumes at page 3 with page 3's cursor in its
//! variables; Stripe's lists page by the last object's id until
//! `has_more` is false; a `last` flag ends a page-number run; values from
//! data reach the upstream as the exact strings, in a GraphQL variable and
//! in a JSON body; and an answer whose flag or cursor cannot be read, or a
//! GraphQL answer with errors and no data, fails the task naming what is
//! wrong, with nothing spent for a page never requested.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use simulator::{Fault, Logged, SimConfig, SimStyle};
use toml::Value as Toml;

use crate::accounting::{Rig, config};
use crate::support::rig::Outcome;
use crate::support::world::{ENDPOINT, REGIONS, SECRET};
use crate::support::{Job, Request, Sink, Window};

/// Where the simulator's GraphQL connection is in `data`, as GitHub's
/// issues of a repository are.
const CONNECTION: &[&str] = &["repository", "issues"];
const PAGE_INFO: &str = "/data/repository/issues/pageInfo";
const QUERY: &str = "query($owner: String!, $name: String!, $since: DateTime, $after: String) {
  repository(owner: $owner, name: $name) {
    issues(first: 2, after: $after, filterBy: {since: $since}) {
      pageInfo { hasNextPage endCursor }
      nodes { id number title }
    }
  }
}";

/// A TOML table of string values.
fn table(pairs: &[(&str, &str)]) -> Toml {
    Toml::Table(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Toml::String((*v).to_owned())))
            .collect(),
    )
}

/// `graphql = { query, variables }`.
fn graphql(query: &str, variables: &[(&str, &str)]) -> Toml {
    let mut t = toml::map::Map::new();
    t.insert("query".into(), Toml::String(query.to_owned()));
    t.insert("variables".into(), table(variables));
    Toml::Table(t)
}

/// The simulator serving `style`, `pages` pages of 2 items per scope at
/// `path` (cost 1), the world's key with room for everything.
fn sim(style: SimStyle, path: &str, pages: u32) -> SimConfig {
    crate::support::styles::sim(style, pages, SECRET).cost(path, 1)
}

/// `name`: the issues of `o/{repo}` for each of `repos`, paged by the
/// connection's `endCursor` (with its `hasNextPage` when `more`), up to 10
/// pages a run, no retries.
fn issues(name: &str, base: &str, repos: &[&str], more: bool) -> Job {
    let vars = [
        ("owner", "o"),
        ("name", "{repo}"),
        ("since", "{since}"),
        ("after", "{cursor}"),
    ];
    let request = Request::get(&format!("{base}/graphql"))
        .headers(&[("Authorization", "Bearer {secret}")])
        .set("graphql", graphql(QUERY, &vars));
    let j = Job::new(name, ENDPOINT)
        .fan_out("repo", repos.iter().copied())
        .retry(1, None, None)
        .request(request)
        .pagination("cursor", format!("{PAGE_INFO}/endCursor"))
        .pagination("max_pages", 10)
        .sink(Sink::jsonl("data/{job}/{repo}.jsonl").records("/data/repository/issues/nodes"));
    if more {
        j.pagination("more", format!("{PAGE_INFO}/hasNextPage"))
    } else {
        j
    }
}

/// The daemon (the real binary) on the simulator `sim`, the world's
/// credential with `window`, cost 1, and `jobs`.
fn rig(sim: SimConfig, window: Window, jobs: impl FnOnce(&str) -> Vec<Job>) -> Rig {
    Rig::on(sim, |base| {
        let mut jobs = jobs(base).into_iter();
        let first = jobs.next().expect("a job");
        jobs.fold(config(window, 1, |e| e, first), |b, j| b.job(j))
    })
}

/// `trigger JOB --wait`, and the outcome lines of `job` the daemon logged
/// once there are `n` more than `before`.
fn run(rig: &Rig, job: &str, n: usize) -> (Option<i32>, Vec<Outcome>) {
    let before = outcomes_of(rig, job).len();
    let (code, summary) = rig.trigger_job(job);
    let logged = crate::support::wait_until(Duration::from_secs(10), || {
        outcomes_of(rig, job).len() >= before + n
    });
    assert!(logged, "{job}: {summary}\n{}", rig.daemon.log());
    (code, outcomes_of(rig, job)[before..].to_vec())
}

fn outcomes_of(rig: &Rig, job: &str) -> Vec<Outcome> {
    (rig.outcomes().into_iter())
        .filter(|o| o.job == job)
        .collect()
}

/// The requests the upstream got, from the `from`th on, of `scope`.
fn requests(rig: &Rig, from: usize, scope: &str) -> Vec<Logged> {
    (rig.upstream.stats().requests.into_iter())
        .skip(from)
        .filter(|r| r.scope == scope)
        .collect()
}

/// The `variables.after` each of `requests` carried.
fn afters<'a>(requests: impl IntoIterator<Item = &'a Logged>) -> Vec<Value> {
    (requests.into_iter())
        .map(|r| r.variables()["after"].clone())
        .collect()
}

/// An outcome line's pages and units.
fn pages_units(o: &Outcome) -> (Option<u64>, Option<u64>) {
    (Some(o.pages), Some(o.units))
}

/// The ids of the records written to `path` (a JSON lines file), sorted.
fn written_ids(rig: &Rig, path: &str) -> Vec<String> {
    let text = std::fs::read_to_string(rig.cfg.join(path)).unwrap_or_default();
    let mut ids: Vec<String> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            v["record"]["id"].as_str().expect("an id").to_owned()
        })
        .collect();
    ids.sort();
    ids
}

/// The ids the simulator serves for `scope`'s pages `1..=pages`, sorted.
fn served(scope: &str, pages: u32) -> Vec<String> {
    let mut ids: Vec<String> = (1..=pages)
        .flat_map(|n| (1..=2).map(move |i| format!("{scope}-p{n}-i{i}")))
        .collect();
    ids.sort();
    ids
}

/// The cursor the simulator's connection answers page `n` of `scope`
/// with (its `endCursor`): JSON text, quotes and braces in it.
fn cursor(scope: &str, n: u32) -> Value {
    Value::String(format!(r#"{{"last":"{scope}-p{n}-i2","page":{n}}}"#))
}

/// 5 pages of a GraphQL connection: exactly 5 requests, each a POST whose
/// `variables.after` is `null`, then each page's `endCursor`; every record
/// once in the sink. The same job without `more` needs a 6th request (the
/// empty page that ends it): `hasNextPage` is what saves it.
#[test]
fn five_pages_of_a_graphql_connection_take_exactly_five_requests() {
    let rig = rig(
        sim(SimStyle::Graphql(CONNECTION), "/graphql", 5),
        crate::support::world::wide(),
        |base| {
            vec![
                issues("issues", base, &["tokio", "serde"], true),
                issues("nomore", base, &["mio"], false),
            ]
        },
    );
    let (code, outcomes) = run(&rig, "issues", 2);
    assert_eq!(code, Some(0), "{outcomes:#?}");
    for o in &outcomes {
        assert_eq!(o.kind, "done", "{o}");
        assert_eq!(o.message, "all pages fetched", "{o}");
        assert_eq!(pages_units(o), (Some(5), Some(5)), "{o}");
    }
    for repo in ["tokio", "serde"] {
        let scope = format!("o/{repo}");
        let sent = requests(&rig, 0, &scope);
        let pages: Vec<Option<u32>> = sent.iter().map(|r| r.page).collect();
        assert_eq!(
            pages,
            (1..=5).map(Some).collect::<Vec<_>>(),
            "{scope}: no 6th"
        );
        let after = afters(&sent);
        let mut want = vec![Value::Null];
        want.extend((1..=4).map(|n| cursor(&scope, n)));
        assert_eq!(after, want, "{scope}: the cursor the upstream got");
        for r in &sent {
            assert_eq!(r.method, "POST", "{r:?}");
            assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
            assert_eq!(r.variables()["name"], *repo, "{r:?}");
            assert_eq!(r.status, 200, "{r:?}");
        }
        let ids = written_ids(&rig, &format!("data/issues/{repo}.jsonl"));
        assert_eq!(ids, served(&scope, 5), "{scope}: every record once");
    }
    println!(
        "graphql: 5 pages of each of 2 items in {} requests",
        rig.upstream.stats().requests.len()
    );

    let from = rig.upstream.stats().requests.len();
    let (code, outcomes) = run(&rig, "nomore", 1);
    assert_eq!(code, Some(0), "{outcomes:#?}");
    let pages: Vec<Option<u32>> = requests(&rig, from, "o/mio")
        .iter()
        .map(|r| r.page)
        .collect();
    assert_eq!(pages, (1..=6).map(Some).collect::<Vec<_>>(), "without more");
}

/// A window of 2 requests per 2 s stops the run at page 3; the next tick
/// resumes at page 3 with page 2's `endCursor` in `variables.after` (the
/// cursor that asks for page 3), and so on to the last page; `{since}`
/// stays the run's until it completes, then moves.
#[test]
fn a_graphql_run_stopped_at_page_3_resumes_there_with_its_cursor() {
    // Three pages inside one window's 2 s would not stop at page 3.
    let _machine = crate::support::machine::timing();
    let rig = rig(
        sim(SimStyle::Graphql(CONNECTION), "/graphql", 5),
        Window::sliding(2, "2s"),
        |base| vec![issues("issues", base, &["tokio"], true)],
    );
    let scope = "o/tokio";
    let mut runs = Vec::new();
    for (run_no, (pages, want)) in [
        (&[1, 2][..], "quota_exhausted"),
        (&[3, 4], "quota_exhausted"),
        (&[5], "done"),
    ]
    .into_iter()
    .enumerate()
    {
        let from = rig.upstream.stats().requests.len();
        let (_, outcomes) = run(&rig, "issues", 1);
        let o = &outcomes[0];
        assert_eq!(o.kind, want, "run {}: {o}", run_no + 1);
        let sent = requests(&rig, from, scope);
        let got: Vec<u32> = sent.iter().map(|r| r.page.expect("a page")).collect();
        assert_eq!(got, pages, "run {}: pages requested", run_no + 1);
        if want == "quota_exhausted" {
            assert_eq!(
                o.page,
                u64::from(pages[pages.len() - 1]) + 1,
                "stopped at: {o}"
            );
        }
        // The first request of a resumed run carries the cursor of the
        // page before it, as the upstream gave it.
        let first = &sent[0];
        let want_after = match pages[0] {
            1 => Value::Null,
            n => cursor(scope, n - 1),
        };
        assert_eq!(first.variables()["after"], want_after, "run {}", run_no + 1);
        runs.push(sent);
        // The window frees 2 s after its spends.
        let free =
            crate::support::wait_every(Duration::from_secs(10), Duration::from_millis(100), || {
                rig.used(crate::support::world::CREDENTIAL) == 0
            });
        assert!(free, "run {}: the window did not free", run_no + 1);
    }
    let since: Vec<Value> = runs
        .iter()
        .flatten()
        .map(|r| r.variables()["since"].clone())
        .collect();
    assert!(
        since.iter().all(|s| *s == since[0]),
        "one {{since}} for the run: {since:?}"
    );
    assert_eq!(
        written_ids(&rig, "data/issues/tokio.jsonl"),
        served(scope, 5)
    );

    // Complete: the next run starts over, at page 1, with a newer since
    // (the issues updated since then: all of them again).
    rig.upstream.touch();
    let from = rig.upstream.stats().requests.len();
    let (_, outcomes) = run(&rig, "issues", 1);
    assert_eq!(outcomes[0].kind, "quota_exhausted", "{}", outcomes[0]);
    let sent = requests(&rig, from, scope);
    assert_eq!(sent[0].page, Some(1));
    assert_eq!(sent[0].variables()["after"], Value::Null);
    assert_ne!(
        sent[0].variables()["since"],
        since[0],
        "since moved on completion"
    );
}

/// Stripe: `starting_after` = the id of the page's last object, until
/// `has_more` is false: 4 pages in 4 requests.
#[test]
fn a_stripe_list_pages_by_the_last_id_until_has_more_is_false() {
    let rig = rig(
        sim(SimStyle::Stripe, "/v1/customers", 4),
        crate::support::world::wide(),
        |base| {
            let request = Request::get(&format!("{base}/v1/customers"))
                .headers(&[("Authorization", "Bearer {secret}")])
                .query(&[("limit", "2")]);
            vec![
                Job::new("customers", ENDPOINT)
                    .retry(1, None, None)
                    .request(request)
                    .pagination("cursor_record", "/id")
                    .pagination("param", "starting_after")
                    .pagination("more", "/has_more")
                    .pagination("max_pages", 10)
                    .sink(Sink::jsonl("data/{job}.jsonl").records("/data")),
            ]
        },
    );
    let (code, outcomes) = run(&rig, "customers", 1);
    assert_eq!(code, Some(0), "{outcomes:#?}");
    let o = &outcomes[0];
    assert_eq!(
        (Some(o.kind.as_str()), Some(o.pages)),
        (Some("done"), Some(4)),
        "{o}"
    );
    let sent = requests(&rig, 0, "all");
    let after: Vec<Option<String>> = sent
        .iter()
        .map(|r| {
            (r.query.iter())
                .find(|(k, _)| k == "starting_after")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert_eq!(
        after,
        [
            None,
            Some("all-p1-i2".into()),
            Some("all-p2-i2".into()),
            Some("all-p3-i2".into())
        ]
    );
    assert_eq!(written_ids(&rig, "data/customers.jsonl"), served("all", 4));
}

/// A page-number job: 8 items of 3 pages. With `more = "/has_more"` each
/// run asks for 3 pages, not the empty 4th: 24 units, not 32 (the same
/// job without the flag, measured beside it). With `last = "/isLast"`
/// (Jira's), the same.
#[test]
fn a_more_or_last_flag_saves_the_empty_page_24_units_not_32() {
    let page_job = |name: &str, base: &str, flag: Option<(&str, &str)>| {
        let request = Request::get(&format!("{base}/items"))
            .query(&[("region", "{region}"), ("key", "{secret}")]);
        let j = Job::new(name, ENDPOINT)
            .fan_out("region", REGIONS)
            .retry(1, None, None)
            .request(request)
            .pagination("style", "page")
            .pagination("param", "page")
            .pagination("max_pages", 10)
            .sink(Sink::jsonl("data/{job}/{region}.jsonl").records("/items"));
        match flag {
            Some((k, v)) => j.pagination(k, v),
            None => j,
        }
    };
    let rig = rig(
        sim(SimStyle::PageNumber, "/items", 3),
        crate::support::world::wide(),
        |base| {
            vec![
                page_job("more", base, Some(("more", "/has_more"))),
                page_job("last", base, Some(("last", "/isLast"))),
                page_job("counted", base, None),
            ]
        },
    );
    let mut units = BTreeMap::new();
    for job in ["more", "last", "counted"] {
        let from = rig.upstream.stats().requests.len();
        let (code, outcomes) = run(&rig, job, REGIONS.len());
        assert_eq!(code, Some(0), "{job}: {outcomes:#?}");
        let spent: u64 = outcomes.iter().map(|o| o.units).sum();
        let requested = rig.upstream.stats().requests.len() - from;
        assert_eq!(spent, requested as u64, "{job}: a unit per request");
        units.insert(job, spent);
        for o in &outcomes {
            assert_eq!(o.kind, "done", "{job}: {o}");
            assert_eq!(o.records, 6, "{job}: {o}");
        }
    }
    println!("page style, 8 items x 3 pages: units spent per run {units:?}");
    assert_eq!(units["more"], 24);
    assert_eq!(units["last"], 24);
    assert_eq!(units["counted"], 32);
    let q = rig.quota();
    assert_eq!(q["windows"][0]["used"], 24 + 24 + 32, "{q}");
}

/// Issue 32's injection: a CSV fan-out value with `"`, `\`, `}`, `{`,
/// non-ASCII text and the literal text `{secret}` reaches the upstream as
/// the exact string, as a GraphQL variable and inside a JSON `body`; the
/// `{secret}` in it is text, never the key.
#[test]
fn values_from_data_reach_the_upstream_as_the_exact_strings() {
    const NASTY: &str = "a\"b\\c}d{e ünï {secret}";
    let csv = tempfile::tempdir().expect("tempdir");
    let csv_path = csv.path().join("values.csv");
    std::fs::write(
        &csv_path,
        format!("v\n\"{}\"\n", NASTY.replace('"', "\"\"")),
    )
    .expect("csv");
    let from_csv = |j: Job| {
        let mut t = toml::map::Map::new();
        t.insert("csv".into(), Toml::String(csv_path.display().to_string()));
        j.set("fan_out_from", Toml::Table(t))
    };
    let query = "query($v: String!, $after: String) { repository(owner: \"o\", name: $v) { issues(first: 2, after: $after) { nodes { id } } } }";
    let rig = rig(
        sim(SimStyle::Graphql(CONNECTION), "/graphql", 1),
        crate::support::world::wide(),
        |base| {
            let sink = || Sink::jsonl("data/{job}.jsonl").records("/data/repository/issues/nodes");
            let variables = Request::get(&format!("{base}/graphql"))
                .headers(&[("Authorization", "Bearer {secret}")])
                .set("graphql", graphql(query, &[("v", "{v}")]));
            // Braces that are the body's own are doubled.
            let body = serde_json::json!({ "query": query, "variables": { "v": "VALUE" } })
                .to_string()
                .replace('{', "{{")
                .replace('}', "}}")
                .replace("VALUE", "{v}");
            let json_body = Request::get(&format!("{base}/graphql"))
                .set("method", "POST")
                .headers(&[("Authorization", "Bearer {secret}")])
                .set("body", body);
            vec![
                from_csv(
                    Job::new("variables", ENDPOINT)
                        .request(variables)
                        .sink(sink()),
                ),
                from_csv(Job::new("body", ENDPOINT).request(json_body).sink(sink())),
            ]
        },
    );
    for job in ["variables", "body"] {
        let from = rig.upstream.stats().requests.len();
        let (code, outcomes) = run(&rig, job, 1);
        assert_eq!(code, Some(0), "{job}: {outcomes:#?}");
        let sent: Vec<Logged> = rig
            .upstream
            .stats()
            .requests
            .into_iter()
            .skip(from)
            .collect();
        assert_eq!(sent.len(), 1, "{job}");
        let r = &sent[0];
        let body: Value = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("{job}: the body is not JSON ({e}): {}", r.body));
        assert_eq!(body["variables"]["v"], NASTY, "{job}: {}", r.body);
        assert_eq!(body["query"], query, "{job}: the query as written");
        assert!(
            !r.body.contains(SECRET),
            "{job}: {{secret}} in a value is text: {}",
            r.body
        );
        println!("{job}: the upstream got {}", r.body);
    }
}

/// Bad answers, each on page 1 of a run that would go on: a `more` that is
/// not a boolean, a cursor that is an object, a GraphQL answer with errors
/// and no data (on an endpoint without GraphQL accounting). Each ends the
/// task `failed` with a message naming what is wrong, after one request
/// and one unit: nothing spent for a page never requested.
#[test]
fn a_bad_flag_a_bad_cursor_or_errors_without_data_fail_the_task() {
    let cases: [(&str, &str, &str); 3] = [
        (
            "flag",
            r#"{"data":{"repository":{"issues":{"pageInfo":{"hasNextPage":"yes","endCursor":"c"},"nodes":[]}}}}"#,
            r#"bad response: the more flag at "/data/repository/issues/pageInfo/hasNextPage" is a string, not a boolean"#,
        ),
        (
            "cursor",
            r#"{"data":{"repository":{"issues":{"pageInfo":{"hasNextPage":true,"endCursor":{"page":1}},"nodes":[]}}}}"#,
            r#"bad response: the cursor at "/data/repository/issues/pageInfo/endCursor" is an object, not a string or number"#,
        ),
        (
            "errors",
            r#"{"errors":[{"type":"NOT_FOUND","message":"Could not resolve to a Repository with the name 'o/tokio'."}]}"#,
            "bad response: GraphQL answer has errors and no data: NOT_FOUND: Could not resolve to a Repository with the name 'o/tokio'.",
        ),
    ];
    let rig = rig(
        sim(SimStyle::Graphql(CONNECTION), "/graphql", 5),
        crate::support::world::wide(),
        |base| vec![issues("issues", base, &["tokio"], true)],
    );
    let mut used = 0;
    for (what, body, says) in cases {
        let from = rig.upstream.stats().requests.len();
        rig.upstream.inject(
            Fault::Body {
                status: 200,
                body: body.to_owned(),
            },
            1,
        );
        let (code, outcomes) = run(&rig, "issues", 1);
        assert_eq!(code, Some(1), "{what}: {outcomes:#?}");
        let o = &outcomes[0];
        assert_eq!(o.kind, "failed", "{what}: {o}");
        assert_eq!(o.message, says, "{what}: {o}");
        assert_eq!(o.units, 1, "{what}: {o}");
        assert_eq!(
            rig.upstream.stats().requests.len() - from,
            1,
            "{what}: one request"
        );
        used += 1;
        assert_eq!(rig.quota()["windows"][0]["used"], used, "{what}");
    }
}

/// The config and job blocks docs/upstreams.md marks as tested by `test`,
/// as written there, then copied as a user would: the token read from the
/// world's variable, `origin` moved to the simulator's (`base`), and the
/// lines a test config always has (the jobs glob, no metrics listener).
/// Returns the config written out.
fn docs_config(test: &str, origin: &str, base: &str) -> crate::support::TestConfig {
    let docs = include_str!("../../docs/upstreams.md");
    let marker = format!("<!-- tested: it::graphql_paging::{test} ");
    let from = docs
        .find(&marker)
        .unwrap_or_else(|| panic!("{marker} in docs/upstreams.md"));
    let blocks: Vec<&str> = docs[from..]
        .split("```toml\n")
        .skip(1)
        .take(2)
        .map(|b| &b[..b.find("```").expect("a closed block")])
        .collect();
    let [config, job] = blocks[..] else {
        panic!("{test}: two toml blocks after the marker");
    };
    assert!(
        config.starts_with("# config/quota-worker.toml\n"),
        "{config}"
    );
    let name = job
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# jobs/"))
        .expect("the job block names its file");
    let secret_env = config
        .lines()
        .find_map(|l| l.strip_prefix("secret_env = "))
        .expect("secret_env");
    let config = config.replace(
        &format!("secret_env = {secret_env}"),
        &format!("secret_env = \"{}\"", crate::support::world::KEY_ENV),
    );
    let config = format!("jobs = \"jobs/*.toml\"\n\n[metrics]\nlisten = \"off\"\n\n{config}");
    assert!(job.contains(origin), "{test}: {origin} in the job");
    let job = job.replace(origin, base);
    crate::support::TestConfig::new(&config, &[(name, &job)])
}

/// Rows the SQLite sink at `path` holds in `table`.
fn rows(cfg: &crate::support::TestConfig, path: &str, table: &str) -> i64 {
    let conn = rusqlite::Connection::open(cfg.join(path)).expect("open");
    conn.query_row(&format!(r#"SELECT count(*) FROM "{table}""#), [], |r| {
        r.get(0)
    })
    .expect("count")
}

/// The daemon (the real binary) on `cfg`, on its own Redis and `upstream`:
/// `trigger job --wait` on a daemon of its own, then the outcome lines
/// (`n` of them), and the config back once the daemon stopped.
fn run_docs(
    cfg: crate::support::TestConfig,
    upstream: &crate::support::upstream::Upstream,
    job: &str,
    n: usize,
) -> (Option<i32>, Vec<Outcome>, crate::support::TestConfig) {
    let redis = crate::support::RedisServer::start();
    let mut rig = crate::support::rig::Rig::start(redis, cfg, &[]);
    let (outcomes, t) = rig.tick(job, n);
    assert!(
        outcomes.len() == n,
        "{}\n{}",
        rig.daemon.log(),
        upstream.stats().requests.len()
    );
    rig.daemon.term();
    rig.daemon.wait_exit(Duration::from_secs(20));
    (t.code, outcomes, rig.cfg)
}

/// docs/upstreams.md's GitHub GraphQL config, as written, against the
/// simulator in GitHub's GraphQL style (the `graphql` resource,
/// `x-ratelimit-*`, `data.rateLimit`): each repository's 3 pages in 3
/// requests, `after` from each page's `endCursor`, every issue in the
/// SQLite sink once, each query settled to its `rateLimit.cost`.
#[test]
fn the_docs_github_graphql_config_pages_each_repository() {
    let upstream = crate::support::upstream::Upstream::with(
        SimConfig {
            accounting: simulator::SimAccounting::Github,
            ..sim(SimStyle::Graphql(CONNECTION), "/graphql", 3)
        }
        .resource("graphql", 5000, Duration::from_secs(3600), &["/graphql"]),
    );
    let cfg = docs_config(
        "the_docs_github_graphql_config_pages_each_repository",
        "https://api.github.com",
        &upstream.base_url(),
    );
    let (code, outcomes, cfg) = run_docs(cfg, &upstream, "issues", 2);
    assert_eq!(code, Some(0), "{outcomes:#?}");
    for o in &outcomes {
        assert_eq!(o.kind, "done", "{o}");
        assert_eq!(pages_units(o), (Some(3), Some(3)), "{o}");
    }
    let stats = upstream.stats();
    for repo in ["tokio", "mio"] {
        let scope = format!("tokio-rs/{repo}");
        let sent: Vec<&Logged> = stats.requests.iter().filter(|r| r.scope == scope).collect();
        let after = afters(sent.iter().copied());
        assert_eq!(
            after,
            [Value::Null, cursor(&scope, 1), cursor(&scope, 2)],
            "{scope}"
        );
        assert!(
            sent.iter()
                .all(|r| r.resource.as_deref() == Some("graphql"))
        );
    }
    assert_eq!(rows(&cfg, "data/github.db", "issues"), 2 * 3 * 2);
}

/// docs/upstreams.md's Shopify config, as written, against the simulator
/// in Shopify's style (a leaky bucket, `extensions.cost`): 3 pages in 3
/// requests, each spent at 112 and settled to its `actualQueryCost`.
#[test]
fn the_docs_shopify_graphql_config_pages_the_products() {
    let path = "/admin/api/2025-01/graphql.json";
    let upstream = crate::support::upstream::Upstream::with(
        SimConfig {
            pages_per_query: 3,
            items_per_page: 2,
            style: SimStyle::Graphql(&["products"]),
            accounting: simulator::SimAccounting::Shopify { actual_percent: 10 },
            ..SimConfig::default()
        }
        .cost(path, 112)
        .key(SECRET, 1000, Duration::from_secs(20)),
    );
    let cfg = docs_config(
        "the_docs_shopify_graphql_config_pages_the_products",
        "https://example.myshopify.com",
        &upstream.base_url(),
    );
    let (code, outcomes, cfg) = run_docs(cfg, &upstream, "products", 1);
    assert_eq!(code, Some(0), "{outcomes:#?}");
    let o = &outcomes[0];
    assert_eq!(o.kind, "done", "{o}");
    // 112 spent up front per query, settled to 12 (10%, rounded up).
    assert_eq!(pages_units(o), (Some(3), Some(36)), "{o}");
    let stats = upstream.stats();
    let after = afters(&stats.requests);
    assert_eq!(after, [Value::Null, cursor("all", 1), cursor("all", 2)]);
    let query = stats.requests[0].variables()["query"].clone();
    let query = query.as_str().expect("the query variable");
    assert!(
        query.starts_with("updated_at:>'") && query.ends_with("Z'"),
        "{query}"
    );
    assert_eq!(rows(&cfg, "data/shopify.db", "products"), 3 * 2);
}
