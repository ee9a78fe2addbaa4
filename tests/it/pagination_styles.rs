//! Promise (SPEC Part 2 "Pagination styles", issue 12 item 1): every style
//! — a cursor (string or number), a next URL (absolute or relative), the
//! `Link` header, page numbers — fetches every page of an item exactly once
//! per run, counted in the simulator's own request log; a next page on
//! another origin is never requested; `continue = true` crawls `max_pages`
//! deeper each run; and no key or value in Redis ever holds the secret that
//! Meta puts into its next URLs, while the resumed run sends it again.

use std::time::Duration;

use quota_worker::outcome::OutcomeKind;
use simulator::{SimStyle, Simulator};

use crate::support::pipeline::{Pipeline, kinds};
use crate::support::styles::{
    self, GITHUB, META, NUMERIC, PAGES, RELATIVE, Style, config, job, once_each, sim,
};
use crate::support::world;
use crate::support::{Job, Window};

const WAIT: Duration = Duration::from_secs(30);

/// The daemon in-process on `style`'s simulator of `pages` pages, the
/// credential's secret `key` with `window`, running the jobs `jobs` builds.
async fn start(
    style: &Style,
    pages: u32,
    window: Window,
    key: &str,
    jobs: impl FnOnce(&str) -> Vec<Job>,
) -> Pipeline {
    styles::pipeline(style, pages, key, window, |e| e, jobs).await
}

/// Each style, two runs of two items of three pages: each run asks for each
/// page once (page numbers: and for the empty fourth), and writes each
/// record once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_style_fetches_every_page_exactly_once_per_run() {
    for style in [GITHUB, META, RELATIVE, PAGES, NUMERIC] {
        let mut p = start(&style, 3, world::wide(), world::SECRET, |base| {
            vec![job("crawl", &style, base, &["a", "b"], &[], 10)]
        })
        .await;
        let last = if style.sim == SimStyle::PageNumber {
            4
        } else {
            3
        };
        for run in 1..=2 {
            let from = p.sim_stats().requests.len();
            let evs = p.tick("crawl", 2, WAIT).await;
            assert!(
                evs.iter().all(|s| s.kind() == OutcomeKind::Done),
                "{} run {run}: {:?}\n{evs:#?}",
                style.name,
                kinds(&evs)
            );
            let per_page = p.sim_stats().requests_per_page(from);
            assert_eq!(
                per_page,
                once_each(&["a", "b"], 1..=last),
                "{} run {run}: requests per (item, page)",
                style.name
            );
            println!(
                "{}: run {run}: requests per (item, page) {per_page:?}",
                style.name
            );
            for s in &evs {
                assert_eq!(s.ev.outcome.records, 6, "{}: {s:?}", style.name);
                assert_eq!(s.ev.outcome.units, u64::from(last), "{}: {s:?}", style.name);
            }
        }
        assert_eq!(p.sink_records().len(), 2 * 2 * 6, "{}", style.name);
        p.stop().await;
    }
}

/// A numeric cursor pages on (it silently ended paging as `done` after
/// page 1 before issue 12), and is sent back as its decimal text.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_numeric_cursor_pages_on() {
    let mut p = start(&NUMERIC, 4, world::wide(), world::SECRET, |base| {
        vec![job("crawl", &NUMERIC, base, &["a"], &[], 10)]
    })
    .await;
    let evs = p.tick("crawl", 1, WAIT).await;
    assert_eq!(evs[0].kind(), OutcomeKind::Done, "{evs:?}");
    assert_eq!(evs[0].ev.outcome.pages, 4);
    let sent: Vec<Option<String>> = p
        .sim_stats()
        .requests
        .iter()
        .map(|r| {
            r.query
                .iter()
                .find(|(k, _)| k == "page")
                .map(|(_, v)| v.clone())
        })
        .collect();
    assert_eq!(
        sent,
        [None, Some("2".into()), Some("3".into()), Some("4".into())]
    );
    p.stop().await;
}

/// A next URL or `Link` on another origin is never requested: a second
/// listener, the one the upstream points at, sees nothing; the task ends
/// `failed` ("next page leaves the origin") having spent only for the page
/// that pointed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_next_page_on_another_origin_is_never_requested() {
    for style in [GITHUB, META] {
        let foreign = Simulator::start(sim(style.sim, 3, world::SECRET))
            .await
            .expect("foreign");
        let mut upstream = sim(style.sim, 3, world::SECRET);
        upstream.next_origin = Some(foreign.base_url());
        let mut p = Pipeline::start(upstream, |base| {
            let j = job("crawl", &style, base, &["a", "b"], &[], 10);
            config(world::SECRET, world::wide(), |e| e, [j])
        })
        .await;
        let evs = p.tick("crawl", 2, WAIT).await;
        assert_eq!(evs.len(), 2, "{evs:?}");
        for s in &evs {
            let o = &s.ev.outcome;
            assert_eq!(o.kind, OutcomeKind::Failed, "{}: {o:?}", style.name);
            assert!(o.detail.contains("next page leaves the origin"), "{o:?}");
            assert!(
                o.detail.contains(&foreign.base_url()),
                "names the origin: {o:?}"
            );
            assert!(
                !o.detail.contains(world::SECRET),
                "no secret in the detail: {o:?}"
            );
            assert_eq!((o.pages, o.units), (1, 1), "{o:?}");
        }
        assert!(
            foreign.stats().requests.is_empty(),
            "{}: the foreign origin was reached: {:#?}",
            style.name,
            foreign.stats().requests
        );
        assert_eq!(p.sim_stats().requests.len(), 2, "page 1 of each item only");
        assert_eq!(p.used(world::CREDENTIAL).await, 2);
        p.stop().await;
        foreign.shutdown().await;
    }
}

/// `continue = true`, `max_pages = 2`, five pages: run 1 fetches pages 1–2,
/// run 2 pages 3–4, run 3 page 5 (the crawl is complete), run 4 starts
/// again at page 1. Each run is `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn continue_crawls_max_pages_deeper_each_run() {
    for style in [GITHUB, NUMERIC, PAGES] {
        let mut p = start(&style, 5, world::wide(), world::SECRET, |base| {
            vec![job("crawl", &style, base, &["a"], &[], 2).pagination("continue", true)]
        })
        .await;
        let expect: [&[u32]; 4] = if style.sim == SimStyle::PageNumber {
            // Page 6 is the empty one that ends the crawl.
            [&[1, 2], &[3, 4], &[5, 6], &[1, 2]]
        } else {
            [&[1, 2], &[3, 4], &[5], &[1, 2]]
        };
        for (run, pages) in expect.iter().enumerate() {
            let from = p.sim_stats().requests.len();
            let evs = p.tick("crawl", 1, WAIT).await;
            assert_eq!(evs[0].kind(), OutcomeKind::Done, "{}: {evs:?}", style.name);
            let got: Vec<u32> = p.sim_stats().requests[from..]
                .iter()
                .map(|r| r.page.expect("a page"))
                .collect();
            assert_eq!(&got, pages, "{} run {}", style.name, run + 1);
        }
        p.stop().await;
    }
}

/// Meta puts the token into `paging.next`. A run interrupted by the quota
/// at page 3 keeps its next URL — with the token as `{secret}`: no key or
/// value anywhere in Redis holds the secret in any spelling — and the next
/// run resumes at page 3, the token sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_meta_next_url_is_stored_without_the_token_and_resumed_with_it() {
    // `/` and `+` make the encoded spellings differ from the token.
    let token = "EAAG/tok+en9";
    let mut p = start(&META, 4, Window::sliding(2, "2s"), token, |base| {
        vec![job("media", &META, base, &["a"], &[("limit", "2")], 10)]
    })
    .await;

    let tick = p.trigger("media").await;
    let evs = p.wait_tick("media", tick, 1, WAIT).await;
    let o = &evs[0].ev.outcome;
    assert_eq!(o.kind, OutcomeKind::QuotaExhausted, "{o:?}");
    assert_eq!((o.pages, o.page), (2, 3), "{o:?}");

    let everything = styles::everything_in(&p.redis.url());
    assert!(
        everything.iter().any(|v| v.contains("after=c3")),
        "the checkpoint holds the next URL: {everything:#?}"
    );
    for spelling in styles::spellings(token) {
        let leaks: Vec<&String> = everything
            .iter()
            .filter(|v| v.contains(&spelling))
            .collect();
        assert!(leaks.is_empty(), "{spelling:?} is in Redis: {leaks:#?}");
    }

    // The window frees 2 s after the spends, which came before the end.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let from = p.sim_stats().requests.len();
    let tick = p.trigger("media").await;
    let evs = p.wait_tick("media", tick, 1, WAIT).await;
    let o = &evs[0].ev.outcome;
    assert_eq!(o.kind, OutcomeKind::Done, "{o:?}");
    let resumed = &p.sim_stats().requests[from..];
    let pages: Vec<Option<u32>> = resumed.iter().map(|r| r.page).collect();
    assert_eq!(pages, [Some(3), Some(4)], "resumed at page 3");
    for r in resumed {
        assert_eq!(r.key.as_deref(), Some(token), "the token sent again: {r:?}");
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.query.contains(&("limit".into(), "2".into())), "{r:?}");
    }
    assert_eq!(p.sim_stats().key(token).ok, 4);
    p.stop().await;
}

/// Regression (issue 12's leftover): with `style = "page"` and a SQLite
/// sink with a `key`, a page whose records the sink already holds newer
/// copies of (another host fetched them later; its clock runs ahead) stores
/// nothing, and the run ended there as if the page were empty: page 2 and
/// on were never fetched. A page-number run ends on a page with no records,
/// not on one that stored nothing new. The real binary, the simulator's
/// page-number style, the database pre-seeded with every record a day newer
/// than this run's fetch: every page of each item is fetched once (the
/// empty fourth too), each run is `done` with all its pages, and no stored
/// row is overwritten by the older copies.
#[test]
fn a_page_number_run_goes_on_past_pages_a_keyed_sqlite_sink_holds_newer() {
    use crate::support::rig::Rig;
    use crate::support::world;
    use crate::support::{RedisServer, Sink, upstream::Upstream};
    use quota_worker::config::Config;
    use quota_worker::sink::{PageRef, Sinks};

    const PAGES_PER_ITEM: u32 = 3;
    let repos = ["a", "b"];
    let upstream = Upstream::with(sim(SimStyle::PageNumber, PAGES_PER_ITEM, world::SECRET));
    let redis = RedisServer::start();
    let crawl = job("crawl", &PAGES, &upstream.base_url(), &repos, &[], 10).sink(
        Sink::sqlite("data/{job}.sqlite")
            .records("/items")
            .key("/id"),
    );
    let cfg = config(world::SECRET, world::wide(), |e| e, [crawl]).write();

    // Every record the upstream will serve, stored as fetched tomorrow.
    let loaded = Config::load(&cfg.path()).expect("config");
    let job = &loaded.jobs["crawl"];
    let tomorrow = chrono::Utc::now() + chrono::Duration::days(1);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for repo in repos {
        let item = vec![("repo".to_owned(), repo.to_owned())];
        for n in 1..=PAGES_PER_ITEM {
            let page = serde_json::json!({"items": (1..=2).map(|i| serde_json::json!({
                "id": format!("{repo}-p{n}-i{i}"),
                "title": "stored by a host whose clock runs ahead",
            })).collect::<Vec<_>>()});
            let w = rt
                .block_on(Sinks::new(loaded.dir.clone()).write(
                    job,
                    &item,
                    PageRef { tick: 0, page: 1 },
                    &page,
                    tomorrow,
                ))
                .expect("seed the sink");
            assert_eq!(w.stored, 2, "seeded");
        }
    }

    let mut rig = Rig::start(redis, cfg, &[(world::KEY_ENV, world::SECRET)]);
    let (ended, t) = rig.tick("crawl", repos.len());
    assert_eq!(t.code, Some(0), "every task ends done\n{t:#?}");
    let per_page = upstream.stats().requests_per_page(0);
    assert_eq!(
        per_page,
        once_each(&repos, 1..=PAGES_PER_ITEM + 1),
        "requests per (item, page): every page once, the empty one ending the run"
    );
    assert_eq!(rig.outcomes().len(), repos.len(), "{ended:#?}");
    for o in ended {
        assert_eq!(o.kind, "done", "{o}");
        assert_eq!(o.message, "all pages fetched", "{o}");
        assert_eq!(o.pages, u64::from(PAGES_PER_ITEM) + 1, "{o}");
        assert_eq!(o.records, 0, "the newer stored copies stay: {o}");
    }
    let db = rig.cfg.join("data/crawl.sqlite");
    let conn = rusqlite::Connection::open(&db).expect("open");
    let newer: i64 = conn
        .query_row(
            r#"SELECT count(*) FROM "crawl" WHERE json_extract(record, '$.title') = 'stored by a host whose clock runs ahead'"#,
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(newer, (repos.len() as u32 * PAGES_PER_ITEM * 2) as i64);
    let d = &mut rig.daemon;
    d.term();
    assert!(
        d.wait_exit(Duration::from_secs(20)).is_some(),
        "daemon stops"
    );
}
