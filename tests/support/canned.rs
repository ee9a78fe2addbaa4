//! A daemon paging the hostile upstream's canned answers (issue 22's
//! tests): one job `leak` fanned out over `v`, its request
//! `GET /canned/{v}?key={secret}` to a [`Hostile`], retries off, records at
//! `/items` to `data/{job}/{v}.jsonl`, the metrics listener on a free port;
//! the real binary as a daemon on its own `redis-server`, ticks by
//! `trigger leak --wait`.

use std::ops::Deref;
use std::time::Duration;

use serde_json::Value;

use super::hostile::Hostile;
use super::rig::Rig;
use super::{
    ConfigBuilder, Credential, Endpoint, Job, RedisServer, Request, Sink, Window, free_port,
    wait_until,
};

/// The shared rig ([`Rig`]: the daemon, its Redis and config) and its
/// listener's port.
pub struct CannedRig {
    pub rig: Rig,
    /// The metrics listener's port (`/api/status`, the status page).
    pub port: u16,
}

impl Deref for CannedRig {
    type Target = Rig;

    fn deref(&self) -> &Rig {
        &self.rig
    }
}

impl CannedRig {
    /// Starts it with credential `h` (secret `secret` in `HKEY`, 1,000 an
    /// hour) and `endpoint` (name `h`, on `h`), the job fanned out over
    /// `v = values`.
    pub fn start(upstream: &Hostile, secret: &str, endpoint: Endpoint, values: &[&str]) -> Self {
        let job = Self::job(upstream).fan_out("v", values.iter().copied());
        Self::start_job(secret, endpoint, job, &[])
    }

    /// The job `leak` without its fan-out: requests to `upstream`'s
    /// `/canned/{v}`, retries off, records at `/items` to
    /// `data/{job}/{v}.jsonl`.
    pub fn job(upstream: &Hostile) -> Job {
        let url = format!("{}/canned/{{v}}", upstream.base_url());
        Job::new("leak", "h")
            .retry(1, None, None)
            .request(Request::get(&url).query(&[("key", "{secret}")]))
            .sink(Sink::jsonl("data/{job}/{v}.jsonl").records("/items"))
    }

    /// Starts it with `job` (named `leak`), `files` written into the config
    /// directory first (a `fan_out_from` CSV).
    pub fn start_job(secret: &str, endpoint: Endpoint, job: Job, files: &[(&str, &str)]) -> Self {
        Self::start_with(Self::credential(secret), endpoint, job, files)
    }

    /// The credential `h`: `secret` in `HKEY`, 1,000 an hour.
    pub fn credential(secret: &str) -> Credential {
        Credential::env("h", "HKEY")
            .secret(secret)
            .window(Window::sliding(1000, "1h"))
    }

    /// Starts it with `credential` (named `h`), `endpoint` and `job`,
    /// `files` written into the config directory first.
    pub fn start_with(
        credential: Credential,
        endpoint: Endpoint,
        job: Job,
        files: &[(&str, &str)],
    ) -> Self {
        let redis = RedisServer::start();
        let port = free_port();
        let cfg = ConfigBuilder::new()
            .redis_url(&redis.url())
            .state_dir("state")
            .metrics_listen(&format!("127.0.0.1:{port}"))
            .credential(credential)
            .endpoint(endpoint)
            .job(job)
            .write();
        for (name, text) in files {
            let path = cfg.join(name);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).expect("mkdir for a file of the config");
            }
            std::fs::write(path, text).expect("write a file of the config");
        }
        CannedRig {
            rig: Rig::start(redis, cfg, &[]),
            port,
        }
    }

    /// The endpoint the reproductions use: cost 1, `throttle_block = "30s"`.
    pub fn endpoint() -> Endpoint {
        Endpoint::new("h", "h", 1).throttle_block("30s")
    }

    /// Runs one tick by `trigger leak --wait`: the `items` outcomes the
    /// job has ended with so far (this tick's and the ones before), and the
    /// trigger's output.
    pub fn tick(&self, items: usize) -> (Vec<Value>, String) {
        let t = self.rig.trigger("leak");
        wait_until(Duration::from_secs(10), || {
            self.rig.ended("leak").len() >= items
        });
        let outcomes: Vec<Value> = (self.rig.ended("leak").into_iter())
            .map(|o| o.line)
            .collect();
        assert_eq!(outcomes.len(), items, "{outcomes:#?}");
        (outcomes, format!("{}\n{}", t.stdout, t.stderr))
    }

    /// The outcome of the item whose `v` is `v`.
    pub fn outcome<'o>(outcomes: &'o [Value], v: &str) -> &'o Value {
        outcomes
            .iter()
            .find(|o| o["item"].as_str().is_some_and(|i| i == format!("v={v}")))
            .unwrap_or_else(|| panic!("no outcome for v={v}: {outcomes:#?}"))
    }

    /// An outcome's message (its detail).
    pub fn message(o: &Value) -> &str {
        o["message"].as_str().unwrap_or("")
    }
}
