//! Promise (issue 12 item 6): several daemons writing one SQLite sink wait
//! for each other's lock. A write never fails with "database is locked" —
//! not even while the daemons open a new database file at the same moment
//! and switch it to WAL, where SQLite answers "busy" without waiting — so
//! no page is spooled or fetched twice, and every record is stored once.

use std::time::Duration;

use crate::support::rig::Rig;
use crate::support::upstream::{Upstream, page_counts};
use crate::support::world::{self, JOB};
use crate::support::{RedisServer, Sink, Worker};

const REGIONS: [&str; 16] = [
    "US", "GB", "DE", "FR", "IN", "BR", "AU", "CA", "JP", "KR", "MX", "IT", "ES", "NL", "SE", "PL",
];
const PAGES: u32 = 3;
const ITEMS: u32 = 5;

#[test]
fn two_daemons_on_one_new_sqlite_file_never_fail_on_its_lock() {
    let upstream = Upstream::start(PAGES, ITEMS);
    // A new database file per round: the race is in creating it.
    for round in 0..3 {
        let job = world::job(&upstream.base_url())
            .fan_out("region", REGIONS)
            .pages(PAGES)
            .sink(
                Sink::sqlite("data/{job}.sqlite")
                    .records("/items")
                    .search(&["/snippet/title"])
                    .key("/id"),
            );
        let cfg = world::config(job)
            .worker(Worker::default().concurrency(8))
            .write();
        let before = upstream.fetched();
        // Two daemons, started at once, on a Redis of their own each round.
        let (mut rig, mut others) = Rig::start_n(RedisServer::start(), cfg, 2, &[]);
        let t = rig.trigger(JOB);
        assert_eq!(t.code, Some(0), "round {round}\n{t:#?}");
        let (a, b) = (&mut rig.daemon, &mut others[0]);
        for d in [&a, &b] {
            let log = d.log();
            assert!(
                !log.contains("locked") && !log.contains("spooled"),
                "round {round}: {} met a locked database:\n{log}",
                d.label
            );
        }
        let fetched = upstream.fetched() - before;
        assert_eq!(fetched, REGIONS.len() * PAGES as usize, "round {round}");
        let rows: i64 = rusqlite::Connection::open(rig.cfg.join("data/trending.sqlite"))
            .and_then(|c| c.query_row(r#"SELECT count(*) FROM "trending""#, [], |r| r.get(0)))
            .expect("count rows");
        assert_eq!(
            rows,
            i64::from(REGIONS.len() as u32 * PAGES * ITEMS),
            "round {round}"
        );
        a.term();
        b.term();
        let _ = a.wait_exit(Duration::from_secs(20));
        let _ = b.wait_exit(Duration::from_secs(20));
    }
    let counts = page_counts(&upstream.stats());
    // Three rounds of new ticks: each page exactly three times, never more.
    assert!(counts.values().all(|n| *n == 3), "{counts:?}");
}
