//! The one world the integration tests describe, named once: the simulated
//! metered API with its key [`SECRET`], the credential [`CREDENTIAL`] that
//! holds that key (read from [`KEY_ENV`]), the endpoint [`ENDPOINT`] that
//! spends on it, and the job [`JOB`] paging the simulator's videos per
//! region of [`REGIONS`]. The builders compose in that order —
//! [`credential`] → [`endpoint`] → [`job`] → [`config`] — and a test changes
//! what its promise is about (a window, a timeout, a fan-out) on the piece
//! it gets back:
//!
//! ```ignore
//! let cfg = ConfigBuilder::new()
//!     .credential(world::credential(Window::sliding(10, "1h")))
//!     .endpoint(world::endpoint().timeout("5s"))
//!     .job(world::job(&upstream.base_url()).pages(1))
//!     .write();
//! ```
//!
//! or, with room for everything, `world::config(world::job(base)).write()`.

use std::time::Duration;

use simulator::SimConfig;

use super::config::{ConfigBuilder, Credential, Endpoint, Job, Window, Worker};

/// The credential every test's world spends on.
pub const CREDENTIAL: &str = "sim";
/// The environment variable [`CREDENTIAL`]'s secret comes from.
pub const KEY_ENV: &str = "QW_TEST_KEY";
/// The API key the simulator knows ([`sim`], `Upstream::start`), and the
/// value of [`KEY_ENV`] every process run on a world config gets.
pub const SECRET: &str = "sim-key";
/// The endpoint on [`CREDENTIAL`], cost 1.
pub const ENDPOINT: &str = "sim.videos";
/// The job [`job`] defines.
pub const JOB: &str = "trending";
/// Eight regions: the fan-out of SPEC's example job.
pub const REGIONS: [&str; 8] = ["US", "GB", "DE", "FR", "IN", "BR", "AU", "CA"];

/// A window with room for everything a test does: a million units an hour.
pub fn wide() -> Window {
    Window::sliding(1_000_000, "1h")
}

/// The credential [`CREDENTIAL`] with one window, its secret [`SECRET`] in
/// [`KEY_ENV`] (every process run on the written config gets it; a test
/// about a secret's spelling gives its own with `.secret(..)`).
pub fn credential(window: Window) -> Credential {
    Credential::env(CREDENTIAL, KEY_ENV)
        .secret(SECRET)
        .window(window)
}

/// The endpoint [`ENDPOINT`] on [`CREDENTIAL`], cost 1, the default request
/// timeout (30 s).
pub fn endpoint() -> Endpoint {
    Endpoint::new(ENDPOINT, CREDENTIAL, 1)
}

/// The job [`JOB`] on [`ENDPOINT`]: the simulator at `upstream`, per region
/// of [`REGIONS`], at most 3 pages a run, never fired by its schedule.
pub fn job(upstream: &str) -> Job {
    Job::videos(JOB, ENDPOINT, upstream)
        .fan_out("region", REGIONS)
        .pages(3)
}

/// The simulator's videos of `regions` at `upstream` on `endpoint`, up to
/// `pages` pages a run, three attempts 100–200 ms apart: the jobs of the
/// operations tests, which name several.
pub fn videos_job(name: &str, endpoint: &str, upstream: &str, regions: &[&str], pages: u32) -> Job {
    Job::videos(name, endpoint, upstream)
        .fan_out("region", regions.iter().copied())
        .pages(pages)
        .retry(3, Some("100ms"), Some("200ms"))
}

/// [`credential`] with room for everything ([`wide`]), [`endpoint`] and
/// `job` (usually [`job`], tuned). No `[redis] url`: daemons get theirs
/// from `QUOTA_WORKER_REDIS_URL`, or run the embedded Redis.
pub fn config(job: Job) -> ConfigBuilder {
    ConfigBuilder::new()
        .credential(credential(wide()))
        .endpoint(endpoint())
        .job(job)
}

/// A daemon with nothing to do: `credential` (usually [`credential`]), the
/// endpoint [`ENDPOINT`] on it, and the job [`JOB`] that never fires (its
/// upstream is nowhere). Its loops run and beat as in production; nothing
/// is fetched.
pub fn idle(credential: Credential) -> ConfigBuilder {
    ConfigBuilder::new()
        .endpoint(Endpoint::new(ENDPOINT, credential.name(), 1))
        .credential(credential)
        .job(videos_job(JOB, ENDPOINT, "http://127.0.0.1:9", &["US"], 1))
}

/// `concurrency` slots that look for tasks every 20 ms and get 5 s to drain:
/// a test measures its tasks, not the poll interval.
pub fn quick_worker(concurrency: u32) -> Worker {
    Worker::default()
        .concurrency(concurrency)
        .poll_interval("20ms")
        .shutdown_timeout("5s")
}

/// The simulator: `pages` pages per query of `items` items, and [`SECRET`]
/// with a million units an hour (a test about the upstream's own quota
/// builds its `SimConfig` with `.key(SECRET, units, per)` instead: the
/// simulator refuses a key given twice).
pub fn sim(pages: u32, items: u32) -> SimConfig {
    SimConfig {
        pages_per_query: pages,
        items_per_page: items,
        ..SimConfig::default()
    }
    .key(SECRET, 1_000_000, Duration::from_secs(3600))
}

/// The job `name` over `regions` at the simulator at `base`, one page of
/// each, every record into one file (`data/{job}.jsonl`), with room for
/// everything and `worker`: a fan-out of many small tasks (the queue's
/// tests: thousands of them).
pub fn fan_out(base: &str, worker: Worker, name: &str, regions: Vec<String>) -> ConfigBuilder {
    ConfigBuilder::new()
        .worker(worker)
        .credential(credential(wide()))
        .endpoint(endpoint())
        .job(one_file_job(name, base, regions))
}

/// The job `name` on [`ENDPOINT`]: the simulator's videos at `base` per
/// region of `regions`, unpaged, every record into one file
/// (`data/{job}.jsonl`).
pub fn one_file_job<S: Into<String>>(
    name: &str,
    base: &str,
    regions: impl IntoIterator<Item = S>,
) -> Job {
    Job::videos(name, ENDPOINT, base)
        .fan_out("region", regions)
        .sink(super::config::Sink::jsonl("data/{job}.jsonl").records("/items"))
}

/// `job` on two quick worker slots ([`quick_worker`]), the world's
/// credential with 1,000 units an hour, and `endpoint` (the world's, as the
/// test tunes it): the config of the tests of the upstream's answers
/// (retries, throttles).
pub fn answering(endpoint: Endpoint, job: Job) -> ConfigBuilder {
    ConfigBuilder::new()
        .worker(quick_worker(2))
        .credential(credential(Window::sliding(1000, "1h")))
        .endpoint(endpoint)
        .job(job)
}
