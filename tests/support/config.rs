//! The one config builder. A test says which credentials, windows,
//! endpoints and jobs it needs; [`ConfigBuilder::write`] renders them as TOML
//! into a temp dir (`config.toml`, and `jobs/<job>.toml` with `jobs =
//! "jobs/*.toml"`) that the real loader reads, like the files an operator
//! writes. Values are rendered by the `toml` crate, so quoting is never
//! hand-rolled; a field without a setter here goes through `set`, so a new
//! config field needs no change to this file before a test can use it.
//!
//! A test about the text itself (line numbers in errors, a shipped file)
//! writes it with [`TestConfig::new`].

use std::path::{Path, PathBuf};
use std::process::Output;

use toml::Value;

use super::redis_server::RedisServer;

/// A cron schedule that never fires while a test runs: ticks come from
/// `trigger`.
pub const NEVER: &str = "0 0 0 1 1 * 2099";

/// An ordered set of `key = value` lines (one TOML table); setting a key
/// again replaces its value in place.
#[derive(Debug, Clone, Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn set(&mut self, key: &str, value: impl Into<Value>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }

    fn push(&mut self, key: &str, item: Value) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, Value::Array(items))) => items.push(item),
            _ => self.set(key, Value::Array(vec![item])),
        }
    }

    fn table(&self) -> Value {
        Value::Table(self.0.iter().cloned().collect())
    }

    /// `key = value` lines, values inline.
    fn lines(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{} = {}\n", key(k), inline(v)))
            .collect()
    }

    /// `[header]` and its lines, or nothing when there are none.
    fn section(&self, header: &str) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            format!("\n[{header}]\n{}", self.lines())
        }
    }
}

/// A key as TOML writes it: bare when it can be, quoted otherwise.
fn key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        k.to_owned()
    } else {
        Value::String(k.to_owned()).to_string()
    }
}

/// A value on one line: tables as inline tables.
fn inline(v: &Value) -> String {
    match v {
        Value::Table(t) => {
            let fields: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", key(k), inline(v)))
                .collect();
            format!("{{ {} }}", fields.join(", "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(inline).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// A list of strings as a TOML array.
fn strings<S: Into<String>>(values: impl IntoIterator<Item = S>) -> Value {
    Value::Array(
        values
            .into_iter()
            .map(|s| Value::String(s.into()))
            .collect(),
    )
}

/// `{ units = N, per = "1h" }`, sliding unless made fixed or a bucket.
#[derive(Debug, Clone)]
pub struct Window(Fields);

impl Window {
    /// At most `units` in any trailing `per` (`"1h"`, `"500ms"`, ...).
    pub fn sliding(units: u64, per: &str) -> Self {
        let mut f = Fields::default();
        f.set("units", units as i64);
        f.set("per", per);
        Window(f)
    }

    /// At most `units` per calendar period of `per` (`kind = "fixed"`).
    pub fn fixed(units: u64, per: &str) -> Self {
        let mut w = Self::sliding(units, per);
        w.0.set("kind", "fixed");
        w
    }

    /// A burst of `units`, refilled continuously at `units / per`
    /// (`kind = "bucket"`).
    pub fn bucket(units: u64, per: &str) -> Self {
        let mut w = Self::sliding(units, per);
        w.0.set("kind", "bucket");
        w
    }

    /// At most `units` (weighted by cost) in flight at once
    /// (`kind = "concurrent"`).
    pub fn concurrent(units: u64) -> Self {
        let mut f = Fields::default();
        f.set("units", units as i64);
        f.set("kind", "concurrent");
        Window(f)
    }

    /// How long a concurrent window's lease lasts unreturned (`"300ms"`).
    pub fn lease(mut self, lease: &str) -> Self {
        self.0.set("lease", lease);
        self
    }

    /// When a fixed period starts (`"00:00"`).
    pub fn reset(mut self, at: &str) -> Self {
        self.0.set("reset", at);
        self
    }

    /// The time zone of a fixed window's reset.
    pub fn timezone(mut self, tz: &str) -> Self {
        self.0.set("timezone", tz);
        self
    }

    /// `mode = "shadow"`: evaluated and recorded, never refusing.
    pub fn shadow(mut self) -> Self {
        self.0.set("mode", "shadow");
        self
    }

    /// `upstream = true`: it mirrors the upstream's own limit.
    pub fn upstream(mut self) -> Self {
        self.0.set("upstream", true);
        self
    }

    /// `resource = "NAME"`: the upstream resource it belongs to (GitHub's
    /// `search`, an IETF limit's name).
    pub fn resource(mut self, name: &str) -> Self {
        self.0.set("resource", name);
        self
    }
}

/// `[credentials.NAME]`.
#[derive(Debug, Clone)]
pub struct Credential {
    name: String,
    fields: Fields,
    secret: Option<(String, String)>,
}

impl Credential {
    /// A credential whose secret comes from the environment variable `var`.
    pub fn env(name: &str, var: &str) -> Self {
        let mut fields = Fields::default();
        fields.set("secret_env", var);
        Credential {
            name: name.to_owned(),
            fields,
            secret: None,
        }
    }

    /// A credential whose secret is read from `secret_file` (relative to
    /// the config's directory), again at every reload.
    pub fn file(name: &str, secret_file: &str) -> Self {
        let mut fields = Fields::default();
        fields.set("secret_file", secret_file);
        Credential {
            name: name.to_owned(),
            fields,
            secret: None,
        }
    }

    /// A template credential: one tenant per value of `{placeholder}`,
    /// each tenant's token in `secret_file` (holding the placeholder,
    /// relative to the config's directory).
    pub fn template(name: &str, placeholder: &str, secret_file: &str) -> Self {
        let mut fields = Fields::default();
        fields.set("template", placeholder);
        fields.set("secret_file", secret_file);
        Credential {
            name: name.to_owned(),
            fields,
            secret: None,
        }
    }

    /// A credential whose secret `argv` prints (`secret_command`), run
    /// again after `ttl` (`secret_ttl`) when given.
    pub fn command(name: &str, argv: &[&str], ttl: Option<&str>) -> Self {
        let mut fields = Fields::default();
        let argv = argv
            .iter()
            .map(|a| Value::String((*a).to_owned()))
            .collect();
        fields.set("secret_command", Value::Array(argv));
        if let Some(ttl) = ttl {
            fields.set("secret_ttl", ttl);
        }
        Credential {
            name: name.to_owned(),
            fields,
            secret: None,
        }
    }

    /// Makes it a template credential over `{placeholder}`.
    pub fn templated(mut self, placeholder: &str) -> Self {
        self.fields.set("template", placeholder);
        self
    }

    /// The value of its `secret_env` that every process run on the written
    /// config gets ([`TestConfig::env`]).
    pub fn secret(mut self, value: &str) -> Self {
        let Some(Value::String(var)) = self
            .fields
            .0
            .iter()
            .find_map(|(k, v)| (k == "secret_env").then_some(v.clone()))
        else {
            panic!("credential {}: a secret value needs secret_env", self.name);
        };
        self.secret = Some((var, value.to_owned()));
        self
    }

    /// Adds a window (in order: window 1 is the first added).
    pub fn window(mut self, w: Window) -> Self {
        self.fields.push("windows", w.0.table());
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// `[endpoints."NAME"]`.
#[derive(Debug, Clone)]
pub struct Endpoint {
    name: String,
    fields: Fields,
}

impl Endpoint {
    /// An endpoint costing `cost` units of `credential` per request.
    pub fn new(name: &str, credential: &str, cost: u64) -> Self {
        let mut fields = Fields::default();
        fields.set("credential", credential);
        fields.set("cost", cost as i64);
        Endpoint {
            name: name.to_owned(),
            fields,
        }
    }

    /// Adds a window of the endpoint's own.
    pub fn window(mut self, w: Window) -> Self {
        self.fields.push("windows", w.0.table());
        self
    }

    /// The request timeout.
    pub fn timeout(self, d: &str) -> Self {
        self.set("timeout", d)
    }

    /// The block after a 429/403 without Retry-After.
    pub fn throttle_block(self, d: &str) -> Self {
        self.set("throttle_block", d)
    }

    /// `"fail-closed"` or `"fail-open"`.
    pub fn limiter_unavailable(self, policy: &str) -> Self {
        self.set("limiter_unavailable", policy)
    }

    /// The header the upstream reports a request's real cost in.
    pub fn cost_header(self, header: &str) -> Self {
        self.set("cost_header", header)
    }

    /// GitHub-style `remaining` / `reset` headers.
    pub fn ratelimit_headers(self, remaining: &str, reset: &str) -> Self {
        let mut t = Fields::default();
        t.set("remaining", remaining);
        t.set("reset", reset);
        self.set("ratelimit_headers", t.table())
    }

    /// Any other field.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.set(key, value);
        self
    }
}

/// `[JOB.request]`.
#[derive(Debug, Clone)]
pub struct Request(Fields);

impl Request {
    /// `GET url` (placeholders allowed).
    pub fn get(url: &str) -> Self {
        let mut f = Fields::default();
        f.set("url", url);
        Request(f)
    }

    /// Query parameters, in order.
    pub fn query(mut self, params: &[(&str, &str)]) -> Self {
        let mut t = Fields::default();
        for (k, v) in params {
            t.set(k, *v);
        }
        self.0.set("query", t.table());
        self
    }

    /// Any other field (`method`, `body`).
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.0.set(key, value);
        self
    }

    /// Request headers, in order.
    pub fn headers(mut self, headers: &[(&str, &str)]) -> Self {
        let mut t = Fields::default();
        for (k, v) in headers {
            t.set(k, *v);
        }
        self.0.set("headers", t.table());
        self
    }
}

/// `[JOB.sink]`.
#[derive(Debug, Clone)]
pub struct Sink(Fields);

impl Sink {
    /// JSON lines at `path` (placeholders allowed).
    pub fn jsonl(path: &str) -> Self {
        let mut f = Fields::default();
        f.set("kind", "jsonl");
        f.set("path", path);
        Sink(f)
    }

    /// A SQLite database at `path`.
    pub fn sqlite(path: &str) -> Self {
        let mut f = Fields::default();
        f.set("kind", "sqlite");
        f.set("path", path);
        Sink(f)
    }

    /// A PostgreSQL table at `url` (the job's name unless [`Sink::table`]).
    pub fn postgres(url: &str) -> Self {
        let mut f = Fields::default();
        f.set("kind", "postgres");
        f.set("url", url);
        Sink(f)
    }

    /// postgres: the table.
    pub fn table(mut self, table: &str) -> Self {
        self.0.set("table", table);
        self
    }

    /// postgres: the password's file.
    pub fn password_file(mut self, path: &str) -> Self {
        self.0.set("password_file", path);
        self
    }

    /// The JSON pointer to the records array (`"/items"`).
    pub fn records(mut self, pointer: &str) -> Self {
        self.0.set("records", pointer);
        self
    }

    /// SQLite, postgres: the JSON pointer to a record's key.
    pub fn key(mut self, pointer: &str) -> Self {
        self.0.set("key", pointer);
        self
    }

    /// SQLite, postgres: the JSON pointers the full-text index holds.
    pub fn search(mut self, pointers: &[&str]) -> Self {
        self.0.set("search", strings(pointers.iter().copied()));
        self
    }
}

/// One job, written to `jobs/<name>.toml`.
#[derive(Debug, Clone)]
pub struct Job {
    name: String,
    fields: Fields,
    request: Fields,
    pagination: Fields,
    sink: Fields,
}

impl Job {
    /// A job on `endpoint` that never fires by itself ([`NEVER`]), with
    /// `request` and `sink` to be set.
    pub fn new(name: &str, endpoint: &str) -> Self {
        let mut fields = Fields::default();
        fields.set("schedule", NEVER);
        fields.set("endpoint", endpoint);
        Job {
            name: name.to_owned(),
            fields,
            request: Fields::default(),
            pagination: Fields::default(),
            sink: Fields::default(),
        }
    }

    /// The simulator's trending videos at `base` (`http://127.0.0.1:PORT`),
    /// one request per `region` of the fan-out (set it with
    /// [`Job::fan_out`]), records to `data/{job}/{region}.jsonl`; unpaged
    /// until [`Job::pages`].
    pub fn videos(name: &str, endpoint: &str, base: &str) -> Self {
        Self::videos_by(name, endpoint, base, "region")
    }

    /// [`Job::videos`] with the fan-out key `key` in place of `region`
    /// (`account` for a template credential's tenants).
    pub fn videos_by(name: &str, endpoint: &str, base: &str, key: &str) -> Self {
        let value = format!("{{{key}}}");
        Self::new(name, endpoint)
            .request(Request::get(&format!("{base}/youtube/v3/videos")).query(&[
                ("chart", "mostPopular"),
                ("regionCode", value.as_str()),
                ("part", "snippet"),
                ("maxResults", "50"),
                ("key", "{secret}"),
            ]))
            .sink(Sink::jsonl(&format!("data/{{job}}/{value}.jsonl")).records("/items"))
    }

    /// The cron schedule.
    pub fn schedule(self, cron: &str) -> Self {
        self.set("schedule", cron)
    }

    /// One task per value of `key` (the fan-out's only key).
    pub fn fan_out<S: Into<String>>(self, key: &str, values: impl IntoIterator<Item = S>) -> Self {
        let mut t = Fields::default();
        t.set(key, strings(values));
        self.set("fan_out", t.table())
    }

    /// `"stop"` or `"defer"`.
    pub fn on_quota_exhausted(self, what: &str) -> Self {
        self.set("on_quota_exhausted", what)
    }

    /// `retry = { attempts = N, backoff = .., max_backoff = .. }`
    /// (durations left out when `None`).
    pub fn retry(self, attempts: u32, backoff: Option<&str>, max_backoff: Option<&str>) -> Self {
        let mut t = Fields::default();
        t.set("attempts", i64::from(attempts));
        if let Some(b) = backoff {
            t.set("backoff", b);
        }
        if let Some(m) = max_backoff {
            t.set("max_backoff", m);
        }
        self.set("retry", t.table())
    }

    /// The request template.
    pub fn request(mut self, r: Request) -> Self {
        self.request = r.0;
        self
    }

    /// The simulator's paging: `nextPageToken` into `pageToken`, at most
    /// `max_pages` pages a run.
    pub fn pages(self, max_pages: u32) -> Self {
        self.paginate("/nextPageToken", "pageToken", max_pages)
    }

    /// Pagination by a cursor read at `cursor` and sent as `param`.
    pub fn paginate(mut self, cursor: &str, param: &str, max_pages: u32) -> Self {
        self.pagination.set("cursor", cursor);
        self.pagination.set("param", param);
        self.pagination.set("max_pages", i64::from(max_pages));
        self
    }

    /// Any field of `[JOB.pagination]` (`style`, `next`, `continue`, ...).
    pub fn pagination(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.pagination.set(key, value);
        self
    }

    /// The sink.
    pub fn sink(mut self, s: Sink) -> Self {
        self.sink = s.0;
        self
    }

    /// Any other field of the job's table.
    pub fn set(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.set(key, value);
        self
    }

    fn render(&self) -> String {
        let name = key(&self.name);
        let mut out = format!("[{name}]\n{}", self.fields.lines());
        out += &self.request.section(&format!("{name}.request"));
        out += &self.pagination.section(&format!("{name}.pagination"));
        out += &self.sink.section(&format!("{name}.sink"));
        out
    }
}

/// The `[worker]` section.
#[derive(Debug, Clone, Default)]
pub struct Worker(Fields);

impl Worker {
    /// Tasks one daemon runs at once.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.0.set("concurrency", i64::from(n));
        self
    }

    /// How long running tasks get after SIGTERM.
    pub fn shutdown_timeout(mut self, d: &str) -> Self {
        self.0.set("shutdown_timeout", d);
        self
    }

    /// How soon a dead daemon's tasks come back.
    pub fn recover_after(mut self, d: &str) -> Self {
        self.0.set("recover_after", d);
        self
    }

    /// How often an idle worker looks for tasks.
    pub fn poll_interval(mut self, d: &str) -> Self {
        self.0.set("poll_interval", d);
        self
    }

    /// How long a task of a job no daemon has is given back before it fails.
    pub fn unknown_job_grace(mut self, d: &str) -> Self {
        self.0.set("unknown_job_grace", d);
        self
    }
}

/// A whole configuration: `config.toml` and its job files.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    top: Fields,
    redis: Fields,
    worker: Fields,
    metrics: Fields,
    log: Fields,
    credentials: Vec<Credential>,
    endpoints: Vec<Endpoint>,
    jobs: Vec<Job>,
}

impl ConfigBuilder {
    /// Nothing but `[metrics] listen = "off"`: a daemon binds no port unless
    /// the test gives it one (tests run side by side).
    pub fn new() -> Self {
        ConfigBuilder::default().metrics_listen("off")
    }

    /// `state_dir`, relative to the config file.
    pub fn state_dir(mut self, dir: &str) -> Self {
        self.top.set("state_dir", dir);
        self
    }

    /// `[redis] url` (leave it out for `QUOTA_WORKER_REDIS_URL` or the
    /// embedded Redis).
    pub fn redis_url(mut self, url: &str) -> Self {
        self.redis.set("url", url);
        self
    }

    /// `[redis] key_prefix`: keys of their own on a shared server (the
    /// benchmark's sections).
    #[allow(dead_code, reason = "the benchmark uses it, the tests do not")]
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.redis.set("key_prefix", prefix);
        self
    }

    /// `[redis] timeout`.
    pub fn redis_timeout(mut self, d: &str) -> Self {
        self.redis.set("timeout", d);
        self
    }

    /// `[redis] quota_nodes`: the windows on a Redis Cluster.
    pub fn quota_nodes<S: Into<String>>(mut self, urls: impl IntoIterator<Item = S>) -> Self {
        self.redis.set("quota_nodes", strings(urls));
        self
    }

    /// `[redis] quota_replicas`.
    pub fn quota_replicas(mut self, n: i64) -> Self {
        self.redis.set("quota_replicas", n);
        self
    }

    /// `[redis] sentinels` and `master_name`: the master found through
    /// sentinels (`url`, if set, then names no host).
    pub fn sentinels<S: Into<String>>(
        mut self,
        urls: impl IntoIterator<Item = S>,
        master_name: &str,
    ) -> Self {
        self.redis.set("sentinels", strings(urls));
        self.redis.set("master_name", master_name);
        self
    }

    /// `[redis] queue_replicas`.
    pub fn queue_replicas(mut self, n: i64) -> Self {
        self.redis.set("queue_replicas", n);
        self
    }

    /// The `[worker]` section.
    pub fn worker(mut self, w: Worker) -> Self {
        self.worker = w.0;
        self
    }

    /// `[metrics] listen` (`"off"` by default here).
    pub fn metrics_listen(mut self, addr: &str) -> Self {
        self.metrics.set("listen", addr);
        self
    }

    /// `[log] format`.
    pub fn log_format(mut self, format: &str) -> Self {
        self.log.set("format", format);
        self
    }

    /// Adds a credential.
    pub fn credential(mut self, c: Credential) -> Self {
        self.credentials.push(c);
        self
    }

    /// Adds an endpoint.
    pub fn endpoint(mut self, e: Endpoint) -> Self {
        self.endpoints.push(e);
        self
    }

    /// Adds a job (its own file, `jobs/<name>.toml`).
    pub fn job(mut self, j: Job) -> Self {
        self.jobs.push(j);
        self
    }

    /// `config.toml`'s text.
    pub fn render(&self) -> String {
        let mut top = self.top.clone();
        if !self.jobs.is_empty() {
            top.set("jobs", "jobs/*.toml");
        }
        let mut out = top.lines();
        out += &self.redis.section("redis");
        out += &self.worker.section("worker");
        out += &self.metrics.section("metrics");
        out += &self.log.section("log");
        for c in &self.credentials {
            out += &c.fields.section(&format!("credentials.{}", key(&c.name)));
        }
        for e in &self.endpoints {
            out += &e.fields.section(&format!("endpoints.{}", key(&e.name)));
        }
        out
    }

    /// Writes `config.toml` and `jobs/<name>.toml` into a new temp dir.
    pub fn write(&self) -> TestConfig {
        self.write_to(tempfile::tempdir().expect("tempdir"))
    }

    /// [`ConfigBuilder::write`] into a new temp dir under `base` (a file
    /// system of the caller's choosing: the benchmark's sinks).
    #[allow(dead_code, reason = "the benchmark uses it, the tests do not")]
    pub fn write_in(&self, base: &Path) -> TestConfig {
        self.write_to(tempfile::tempdir_in(base).expect("tempdir"))
    }

    fn write_to(&self, dir: tempfile::TempDir) -> TestConfig {
        let mut cfg = TestConfig {
            dir,
            env: Vec::new(),
        };
        cfg.rewrite(self);
        cfg
    }
}

/// A config directory for one test: `dir/config.toml` plus job files, and
/// the secrets' environment to run it with.
pub struct TestConfig {
    /// The directory (config.toml, jobs/, and what a run leaves: data/, state/).
    pub dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl TestConfig {
    /// Writes `config.toml` with exactly `config`, and `jobs/*.toml` from
    /// `jobs` (name, text).
    pub fn new(config: &str, jobs: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config.toml"), config).expect("write config");
        if !jobs.is_empty() {
            std::fs::create_dir_all(dir.path().join("jobs")).expect("mkdir jobs");
        }
        for (name, text) in jobs {
            std::fs::write(dir.path().join("jobs").join(name), text).expect("write job");
        }
        TestConfig {
            dir,
            env: Vec::new(),
        }
    }

    /// Writes `config`'s files over this directory's, as an operator edits
    /// them between two runs (or before a reload): job files of jobs it does
    /// not have are removed; the secrets' environment becomes `config`'s.
    pub fn rewrite(&mut self, config: &ConfigBuilder) {
        std::fs::write(self.path(), config.render()).expect("write config");
        let keep: Vec<String> = (config.jobs.iter())
            .map(|j| format!("{}.toml", j.name))
            .collect();
        for entry in std::fs::read_dir(self.join("jobs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".toml") && !keep.contains(&name) {
                std::fs::remove_file(entry.path()).expect("remove job file");
            }
        }
        if !config.jobs.is_empty() {
            std::fs::create_dir_all(self.join("jobs")).expect("mkdir jobs");
        }
        for j in &config.jobs {
            std::fs::write(self.join(format!("jobs/{}.toml", j.name)), j.render())
                .expect("write job");
        }
        self.env = config
            .credentials
            .iter()
            .filter_map(|c| c.secret.clone())
            .collect();
    }

    /// The config file.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("config.toml")
    }

    /// A path inside the config directory.
    pub fn join(&self, p: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(p)
    }

    /// The secrets' environment ([`Credential::secret`]).
    pub fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// Runs the binary to completion with `-c config.toml` and `args`:
    /// `RUST_LOG=warn`, the secrets' environment, then `env`, nothing
    /// inherited that would change what it does.
    pub fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut all = vec![("RUST_LOG", "warn")];
        all.extend(self.env());
        all.extend_from_slice(env);
        super::process::command(&self.path(), args, &all)
            .output()
            .expect("run quota-worker")
    }

    /// Runs the binary against `server` (through `QUOTA_WORKER_REDIS_URL`).
    pub fn run_on(&self, server: &RedisServer, args: &[&str]) -> Output {
        self.run(args, &[("QUOTA_WORKER_REDIS_URL", &server.url())])
    }
}
