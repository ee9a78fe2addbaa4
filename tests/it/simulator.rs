//! Promise: the simulated metered API behaves like the upstream it stands in
//! for — it pages, charges per path, rejects a key that is over quota with a
//! 403 `quotaExceeded`, misbehaves on demand without charging, and reports
//! what it saw.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;
use simulator::{CHANNELS, Fault, KeyQuota, SEARCH, SimConfig, Simulator, VIDEOS};

use crate::support::machine;

const HOUR: Duration = Duration::from_secs(3600);

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn reason(&self) -> String {
        self.json()["error"]["errors"][0]["reason"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn header(&self, name: &str) -> Option<u64> {
        self.headers.get(name)?.to_str().ok()?.parse().ok()
    }
}

async fn get(sim: &Simulator, path: &str, query: &[(&str, &str)]) -> Answer {
    get_with(&reqwest::Client::new(), sim, path, query)
        .await
        .expect("request")
}

async fn get_with(
    client: &reqwest::Client,
    sim: &Simulator,
    path: &str,
    query: &[(&str, &str)],
) -> reqwest::Result<Answer> {
    let r = client.get(sim.url(path)).query(query).send().await?;
    Ok(Answer {
        status: r.status(),
        headers: r.headers().clone(),
        body: r.text().await?,
    })
}

fn trending<'a>(key: &'a str, token: Option<&'a str>) -> Vec<(&'a str, &'a str)> {
    let mut q = vec![
        ("chart", "mostPopular"),
        ("regionCode", "US"),
        ("part", "snippet"),
        ("maxResults", "50"),
        ("key", key),
    ];
    if let Some(t) = token {
        q.push(("pageToken", t));
    }
    q
}

#[tokio::test]
async fn pagination_walks_every_page_and_stops() {
    let sim = Simulator::start(SimConfig::default().key("k", 10_000, HOUR))
        .await
        .expect("start");
    let mut token: Option<String> = None;
    let mut ids = Vec::new();
    for page in 1..=3 {
        let a = get(&sim, VIDEOS, &trending("k", token.as_deref())).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        let v = a.json();
        assert_eq!(v["kind"], "youtube#videoListResponse");
        let items = v["items"].as_array().expect("items");
        assert_eq!(items.len(), 5, "items_per_page caps maxResults=50");
        for (i, item) in items.iter().enumerate() {
            assert_eq!(item["id"], format!("US-p{page}-i{}", i + 1));
            for field in ["title", "description", "channelTitle"] {
                assert!(item["snippet"][field].is_string(), "{field} in {item}");
            }
        }
        ids.extend(items.iter().map(|i| i["id"].clone()));
        token = v["nextPageToken"].as_str().map(str::to_string);
        assert_eq!(token.is_some(), page < 3, "page {page}: {v}");
    }
    assert_eq!(ids.len(), 15);

    // Deterministic: the same page twice is the same answer.
    let again = get(&sim, VIDEOS, &trending("k", Some("p2"))).await.json();
    assert_eq!(again["items"][0]["id"], "US-p2-i1");

    let stats = sim.stats();
    assert_eq!(stats.key("k").units, 4);
    assert_eq!(stats.key("k").ok, 4);
    let pages = stats.fetched_pages();
    assert_eq!(pages[0], (VIDEOS.to_string(), "US".to_string(), None));
    assert_eq!(pages[2].2.as_deref(), Some("p3"));
    assert_eq!(
        stats.duplicate_pages(),
        vec![(VIDEOS.to_string(), "US".to_string(), Some("p2".to_string()))]
    );
    assert!(
        stats
            .charges
            .iter()
            .all(|c| c.query.iter().all(|(k, _)| k != "key")),
        "charges do not keep the key parameter"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn bad_parameters_and_keys_are_400_and_not_charged() {
    let config = SimConfig {
        pages_per_query: 2,
        ..SimConfig::default()
    }
    .key("k", 10_000, HOUR);
    let sim = Simulator::start(config).await.expect("start");

    let small = get(
        &sim,
        VIDEOS,
        &[("regionCode", "GB"), ("maxResults", "2"), ("key", "k")],
    )
    .await;
    assert_eq!(small.json()["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(small.json()["items"][1]["id"], "GB-p1-i2");

    for token in ["p3", "p1", "nope", "p02"] {
        let a = get(&sim, VIDEOS, &trending("k", Some(token))).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "token {token}");
        assert_eq!(a.reason(), "invalidPageToken");
    }
    let last = get(&sim, VIDEOS, &trending("k", Some("p2"))).await.json();
    assert!(
        last.get("nextPageToken").is_none(),
        "p2 is the last of 2: {last}"
    );

    let unknown = get(&sim, VIDEOS, &trending("other", None)).await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    assert_eq!(unknown.reason(), "keyInvalid");
    let missing = get(&sim, VIDEOS, &[("regionCode", "US")]).await;
    assert_eq!(missing.reason(), "keyInvalid");
    let no_path = get(&sim, "/youtube/v3/playlists", &[("key", "k")]).await;
    assert_eq!(no_path.status, StatusCode::NOT_FOUND);

    let stats = sim.stats();
    assert_eq!(stats.key("k").units, 2, "only the two 200s are charged");
    assert_eq!(stats.key("k").bad_requests, 4);
    assert_eq!(stats.invalid_keys, 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn each_path_charges_its_own_cost() {
    let config = SimConfig::default()
        .key("k", 10_000, HOUR)
        .cost("/api/things", 7);
    let sim = Simulator::start(config).await.expect("start");
    let k = [("key", "k")];
    assert_eq!(
        get(&sim, VIDEOS, &trending("k", None)).await.status,
        StatusCode::OK
    );
    let search = get(&sim, SEARCH, &[("q", "cats"), ("key", "k")])
        .await
        .json();
    assert_eq!(search["kind"], "youtube#searchListResponse");
    assert_eq!(search["items"][0]["id"]["videoId"], "cats-p1-i1");
    let channels = get(&sim, CHANNELS, &[("id", "UC1,UC2"), ("key", "k")])
        .await
        .json();
    assert_eq!(channels["items"][1]["id"], "UC2");
    assert!(channels.get("nextPageToken").is_none());
    assert_eq!(get(&sim, "/api/things", &k).await.status, StatusCode::OK);

    let stats = sim.stats();
    assert_eq!(stats.key("k").units, 1 + 100 + 1 + 7);
    let costs: Vec<(String, u64)> = stats
        .charges
        .iter()
        .map(|c| (c.path.clone(), c.cost))
        .collect();
    assert_eq!(
        costs,
        vec![
            (VIDEOS.into(), 1),
            (SEARCH.into(), 100),
            (CHANNELS.into(), 1),
            ("/api/things".into(), 7)
        ]
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_key_over_quota_gets_403_quota_exceeded() {
    let sim = Simulator::start(SimConfig::default().key("k", 250, HOUR))
        .await
        .expect("start");
    let q = [("q", "x"), ("key", "k")];
    assert_eq!(get(&sim, SEARCH, &q).await.status, StatusCode::OK);
    assert_eq!(get(&sim, SEARCH, &q).await.status, StatusCode::OK);
    let over = get(&sim, SEARCH, &q).await;
    assert_eq!(over.status, StatusCode::FORBIDDEN);
    assert_eq!(over.reason(), "quotaExceeded");
    assert_eq!(over.json()["error"]["errors"][0]["domain"], "youtube.quota");
    assert_eq!(
        over.json()["error"]["message"],
        "The request cannot be completed because you have exceeded your quota."
    );
    assert!(
        over.headers.get("retry-after").is_none(),
        "YouTube mode sends none"
    );
    // 50 units are left: cheap calls still fit.
    assert_eq!(
        get(&sim, VIDEOS, &trending("k", None)).await.status,
        StatusCode::OK
    );

    let k = sim.stats().key("k");
    assert_eq!((k.units, k.ok, k.quota_errors, k.injected), (201, 3, 1, 0));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_never_overspend_a_key() {
    let sim = Simulator::start(SimConfig::default().key("k", 20, HOUR))
        .await
        .expect("start");
    let client = reqwest::Client::new();
    let url = sim.url(VIDEOS);
    let answers = futures::future::join_all((0..60).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client.get(url).query(&trending("k", None)).send().await;
            r.expect("request").status()
        }
    }))
    .await;
    let ok = answers.iter().filter(|s| **s == StatusCode::OK).count();
    let forbidden = answers
        .iter()
        .filter(|s| **s == StatusCode::FORBIDDEN)
        .count();
    assert_eq!((ok, forbidden), (20, 40));
    let stats = sim.stats();
    assert_eq!(stats.key("k").units, 20);
    assert_eq!(stats.key("k").quota_errors, 40);
    assert_eq!(stats.max_units_in_any_window("k", HOUR), 20);
    assert!(stats.charges.windows(2).all(|w| w[0].at <= w[1].at));
    sim.shutdown().await;
}

#[tokio::test]
async fn windows_trail_and_the_rate_limit_says_rate_limit_exceeded() {
    let _machine = machine::timing();
    let window = Duration::from_millis(500);
    let config = SimConfig {
        keys: vec![
            KeyQuota::new("day", 2, window),
            KeyQuota::new("minute", 1_000, HOUR).with_rate(2, window),
        ],
        ..SimConfig::default()
    };
    let sim = Simulator::start(config).await.expect("start");
    for key in ["day", "minute"] {
        let q = trending(key, None);
        assert_eq!(get(&sim, VIDEOS, &q).await.status, StatusCode::OK);
        assert_eq!(get(&sim, VIDEOS, &q).await.status, StatusCode::OK);
        let over = get(&sim, VIDEOS, &q).await;
        assert_eq!(over.status, StatusCode::FORBIDDEN);
        let want = if key == "day" {
            "quotaExceeded"
        } else {
            "rateLimitExceeded"
        };
        assert_eq!(over.reason(), want);
    }
    tokio::time::sleep(window + Duration::from_millis(50)).await;
    for key in ["day", "minute"] {
        let again = get(&sim, VIDEOS, &trending(key, None)).await;
        assert_eq!(again.status, StatusCode::OK, "{key}: the window has passed");
    }
    let stats = sim.stats();
    for key in ["day", "minute"] {
        assert_eq!(stats.key(key).quota_errors, 1);
        assert_eq!(stats.key(key).units, 3);
        assert_eq!(stats.max_units_in_any_window(key, window), 2);
        assert_eq!(stats.max_units_in_any_window(key, HOUR), 3);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn injected_faults_answer_as_told_and_are_not_charged() {
    let sim = Simulator::start(SimConfig::default().key("k", 10_000, HOUR))
        .await
        .expect("start");
    let videos = trending("k", None);
    let search = [("q", "x"), ("key", "k")];

    sim.inject_on(VIDEOS, Fault::Status(503), 2);
    assert_eq!(
        get(&sim, SEARCH, &search).await.status,
        StatusCode::OK,
        "other path"
    );
    for _ in 0..2 {
        let a = get(&sim, VIDEOS, &videos).await;
        assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(a.reason(), "backendError");
    }
    assert_eq!(
        get(&sim, VIDEOS, &videos).await.status,
        StatusCode::OK,
        "used up"
    );

    sim.inject(Fault::Status(500), 1);
    sim.inject(
        Fault::TooManyRequests {
            retry_after_secs: 7,
        },
        1,
    );
    sim.inject(Fault::RateLimitExceeded, 1);
    sim.inject(Fault::Garbage, 1);
    assert_eq!(
        get(&sim, SEARCH, &search).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let throttled = get(&sim, VIDEOS, &videos).await;
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(throttled.header("retry-after"), Some(7));
    let limited = get(&sim, VIDEOS, &videos).await;
    assert_eq!(limited.status, StatusCode::FORBIDDEN);
    assert_eq!(limited.reason(), "rateLimitExceeded");
    let garbage = get(&sim, VIDEOS, &videos).await;
    assert_eq!(garbage.status, StatusCode::OK);
    assert_eq!(garbage.body, "not json");

    sim.inject(Fault::Delay(Duration::from_millis(500)), 1);
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .expect("client");
    let err = get_with(&impatient, &sim, VIDEOS, &videos)
        .await
        .err()
        .expect("the delayed answer times the client out");
    assert!(err.is_timeout(), "{err}");

    sim.inject(Fault::Status(503), 5);
    sim.clear_faults();
    assert_eq!(get(&sim, VIDEOS, &videos).await.status, StatusCode::OK);

    let k = sim.stats().key("k");
    assert_eq!(
        k.units,
        100 + 1 + 1,
        "only the three normal answers are charged"
    );
    assert_eq!(k.ok, 3);
    assert_eq!(k.injected, 2 + 4 + 1);
    assert_eq!(k.too_many_requests, 1);
    assert_eq!(k.quota_errors, 0, "injected 403s are not real quota errors");
    sim.shutdown().await;
}

#[tokio::test]
async fn max_units_in_any_window_measures_what_was_charged() {
    let _machine = machine::timing();
    let sim = Simulator::start(SimConfig::default().key("k", 10_000, HOUR))
        .await
        .expect("start");
    let q = [("q", "x"), ("key", "k")];
    get(&sim, SEARCH, &q).await;
    get(&sim, VIDEOS, &trending("k", None)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    get(&sim, VIDEOS, &trending("k", None)).await;
    get(&sim, VIDEOS, &trending("k", None)).await;
    get(&sim, VIDEOS, &trending("k", None)).await;

    let stats = sim.stats();
    assert_eq!(
        stats.max_units_in_any_window("k", Duration::from_millis(300)),
        101
    );
    assert_eq!(stats.max_units_in_any_window("k", HOUR), 104);
    assert_eq!(stats.max_units_in_any_window("other", HOUR), 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn github_mode_reports_remaining_reset_and_cost() {
    let config = SimConfig {
        ratelimit_headers: true,
        cost_header: true,
        ..SimConfig::default()
    }
    .key("k", 205, HOUR);
    let sim = Simulator::start(config).await.expect("start");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();

    let first = get(&sim, SEARCH, &[("q", "x"), ("key", "k")]).await;
    assert_eq!(first.header("x-ratelimit-limit"), Some(205));
    assert_eq!(first.header("x-ratelimit-remaining"), Some(105));
    assert_eq!(first.header("x-ratelimit-used"), Some(100));
    assert_eq!(first.header("x-quota-cost"), Some(100));
    let reset = first.header("x-ratelimit-reset").expect("reset");
    assert!(
        (now + 3599..=now + 3602).contains(&reset),
        "reset {reset}, now {now}"
    );

    let second = get(&sim, VIDEOS, &trending("k", None)).await;
    assert_eq!(second.header("x-ratelimit-remaining"), Some(104));
    assert_eq!(second.header("x-quota-cost"), Some(1));

    get(&sim, SEARCH, &[("q", "y"), ("key", "k")]).await;
    let over = get(&sim, SEARCH, &[("q", "z"), ("key", "k")]).await;
    assert_eq!(over.status, StatusCode::FORBIDDEN);
    assert_eq!(over.reason(), "quotaExceeded");
    assert_eq!(over.header("x-quota-cost"), Some(0));
    assert_eq!(over.header("x-ratelimit-remaining"), Some(4));
    let retry = over.header("retry-after").expect("retry-after");
    assert!((3598..=3600).contains(&retry), "retry-after {retry}");

    sim.inject(Fault::Status(503), 1);
    let injected = get(&sim, VIDEOS, &trending("k", None)).await;
    assert_eq!(injected.header("x-quota-cost"), Some(0));
    assert_eq!(injected.header("x-ratelimit-remaining"), Some(4));
    sim.shutdown().await;
}

#[tokio::test]
async fn it_binds_loopback_only_and_stops_on_shutdown() {
    let public = "0.0.0.0:0".parse().expect("addr");
    let err = Simulator::start_on(public, SimConfig::default())
        .await
        .expect_err("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let zero_pages = SimConfig {
        pages_per_query: 0,
        ..SimConfig::default()
    };
    assert!(Simulator::start(zero_pages).await.is_err());

    let sim = Simulator::start(SimConfig::default()).await.expect("start");
    assert!(sim.addr().ip().is_loopback());
    assert_eq!(
        sim.base_url(),
        format!("http://127.0.0.1:{}", sim.addr().port())
    );
    let url = sim.url(VIDEOS);
    sim.shutdown().await;
    let after = reqwest::Client::new().get(url).send().await;
    assert!(after.is_err(), "nothing listens after shutdown");
}

/// With `hold`, answers are held open, and the most requests (and units,
/// weighted by the paths' costs) in flight at once per key are recorded:
/// what the concurrency tests measure at the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_records_the_most_requests_in_flight_at_once() {
    let sim = Simulator::start(
        SimConfig::default()
            .key("k", 10_000, HOUR)
            .key("other", 10_000, HOUR)
            .cost(SEARCH, 3)
            .hold(Duration::from_millis(1000)),
    )
    .await
    .expect("start");
    let client = reqwest::Client::new();
    // Four at once (one of them a search, cost 3), then one alone.
    let mut all = Vec::new();
    for path in [VIDEOS, VIDEOS, VIDEOS, SEARCH] {
        let (client, url) = (client.clone(), sim.url(path));
        all.push(tokio::spawn(async move {
            let r = client
                .get(url)
                .query(&[("key", "k"), ("q", "x")])
                .send()
                .await;
            r.expect("request").status()
        }));
    }
    for a in all {
        assert_eq!(a.await.expect("join"), StatusCode::OK);
    }
    assert_eq!(
        get(&sim, VIDEOS, &[("key", "k")]).await.status,
        StatusCode::OK
    );
    let stats = sim.stats();
    let k = stats.key("k");
    assert_eq!((k.max_in_flight, k.max_in_flight_units), (4, 6), "{k:?}");
    assert_eq!(stats.key("other").max_in_flight, 0, "counted per key");
}
