//! Promise (SPEC "Tokens that expire"): a credential's `secret_command`
//! mints its token at first use, again once `secret_ttl` has passed and
//! after a 401 (the page is then sent again with the new token, once);
//! never per request. Its failure ends the tasks that need the token
//! `failed` ("credential command failed: …") with nothing spent and
//! nothing sent, and is not run again within a minute; the daemon runs on.
//! A template runs it per tenant (`{account}` in the argv). The token is
//! never in the logs (the command's standard error is logged scrubbed),
//! Redis, `/api/status`, `/metrics` or the sink.
//!
//! The real binary, a real `redis-server`, the hostile upstream's `/auth`
//! (200 with a record echoing the token for the tokens it accepts, 401
//! for any other), and a shell script as the command that counts its runs.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support;
use crate::support::config::{ConfigBuilder, Credential, Endpoint, Job, Request, Sink, Window};
use crate::support::hostile::Hostile;
use crate::support::http::{http_get, scrape};
use crate::support::rig::Outcome;
use crate::support::{RedisServer, TestConfig, free_port, wait_until};

/// What every token the script prints holds: nothing the daemon writes may.
const MARK: &str = "SEKRIT";

/// The command: counts its runs per first argument in `runs-ARG`, fails
/// while `fail` exists, else prints `tok-ARG-N-SEKRIT` and says so on its
/// standard error (which the daemon logs, scrubbed).
const SCRIPT: &str = r#"#!/bin/sh
d=$(dirname "$0")
n=$(( $(cat "$d/runs-$1" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$d/runs-$1"
if [ -e "$d/fail" ]; then
  echo "token service unreachable for $1" >&2
  exit 2
fi
echo "minting for $1: tok-$1-$n-SEKRIT" >&2
echo "tok-$1-$n-SEKRIT"
"#;

fn token(arg: &str, n: u32) -> String {
    format!("tok-{arg}-{n}-{MARK}")
}

/// A job `name` on endpoint `endpoint` fetching `/auth?key={secret}` once
/// per value of `placeholder`.
fn job(name: &str, endpoint: &str, upstream: &Hostile, placeholder: &str, values: &[&str]) -> Job {
    let url = format!("{}/auth", upstream.base_url());
    Job::new(name, endpoint)
        .fan_out(placeholder, values.iter().copied())
        .retry(1, None, None)
        .request(Request::get(&url).query(&[("key", "{secret}")]))
        .sink(Sink::jsonl(&format!("data/{{job}}/{{{placeholder}}}.jsonl")).records("/items"))
}

/// The shared rig ([`support::rig::Rig`]) and the minting script.
struct Rig {
    rig: support::rig::Rig,
    script: PathBuf,
}

impl Deref for Rig {
    type Target = support::rig::Rig;

    fn deref(&self) -> &support::rig::Rig {
        &self.rig
    }
}

impl Rig {
    fn runs(&self, arg: &str) -> u32 {
        let path = self.script.with_file_name(format!("runs-{arg}"));
        std::fs::read_to_string(path).map_or(0, |t| t.trim().parse().expect("count"))
    }

    /// `trigger JOB --wait`, then the outcomes of that tick (`items` of them).
    fn tick(&self, job: &str, items: usize) -> Vec<Outcome> {
        self.rig.tick(job, items).0
    }
}

impl Rig {
    /// Credential `name`'s command as `/api/status` shows it, once it is
    /// in state `want` (the page reads at most once a second).
    fn token_on_status(&self, name: &str, want: &str) -> Value {
        let read = || {
            let v = self.status();
            (v["credentials"].as_array().expect("credentials").iter())
                .find(|c| c["name"] == name)
                .map(|c| c["token"].clone())
                .unwrap_or(Value::Null)
        };
        let mut last = Value::Null;
        wait_until(Duration::from_secs(10), || {
            last = read();
            last["state"] == want
        });
        assert_eq!(
            last["state"], want,
            "{name}'s token on /api/status: {last:#}"
        );
        last
    }
}

fn outcome(o: &Outcome) -> (&str, &str) {
    (&o.kind, &o.message)
}

fn start(upstream: &Hostile, dir: &Path) -> Rig {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("mint");
    std::fs::write(&script, SCRIPT).expect("write the script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let s = script.to_str().expect("utf-8 path");
    let redis = RedisServer::start();
    let port = free_port();
    let window = || Window::sliding(1000, "1h");
    let cfg = ConfigBuilder::new()
        .redis_url(&redis.url())
        .state_dir("state")
        .metrics_listen(&format!("127.0.0.1:{port}"))
        .credential(Credential::command("gh", &[s, "gh"], None).window(window()))
        .credential(Credential::command("short", &[s, "short"], Some("1s")).window(window()))
        .credential(
            Credential::command("tpl", &[s, "{account}"], None)
                .templated("account")
                .window(window()),
        )
        .endpoint(Endpoint::new("gh", "gh", 1))
        .endpoint(Endpoint::new("short", "short", 1))
        .endpoint(Endpoint::new("tpl", "tpl", 1))
        .job(job("pull", "gh", upstream, "v", &["a"]))
        .job(job("brief", "short", upstream, "v", &["a"]))
        .job(job("tenants", "tpl", upstream, "account", &["t1", "t2"]))
        .write();
    Rig {
        rig: support::rig::Rig::start(redis, cfg, &[]),
        script,
    }
}

#[test]
fn a_command_mints_at_first_use_after_its_ttl_and_after_a_401_and_its_failure_spends_nothing() {
    let upstream = Hostile::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let rig = start(&upstream, dir.path());
    assert_eq!(rig.runs("gh"), 0, "not run before a task needs it");
    rig.token_on_status("gh", "unused");

    // First use: minted once, kept for the next task (TTL 1h).
    upstream.accept_tokens(&[&token("gh", 1)]);
    for _ in 0..2 {
        let o = rig.tick("pull", 1);
        assert_eq!(outcome(&o[0]).0, "done", "{o:#?}");
    }
    assert_eq!(rig.runs("gh"), 1, "one run for two tasks");
    // The status page says when it was minted and when it is replaced.
    let t = rig.token_on_status("gh", "fresh");
    let renews = t["renews_in_ms"].as_u64().expect("renews_in_ms");
    assert!((3_000_000..=3_600_000).contains(&renews), "{t:#}");
    assert!(
        t["minted_ago_ms"].as_u64().expect("minted_ago_ms") < 600_000,
        "{t:#}"
    );

    // A 401 (the token revoked): minted again, the page sent again with
    // the new token, the task done; both requests spent.
    upstream.accept_tokens(&[&token("gh", 2)]);
    let (sent, used) = (upstream.count(), rig.used("gh"));
    let o = rig.tick("pull", 1);
    assert_eq!(outcome(&o[0]).0, "done", "{o:#?}");
    assert_eq!(rig.runs("gh"), 2);
    let keys: Vec<String> = upstream.seen()[sent..]
        .iter()
        .map(|s| {
            s.query()
                .into_iter()
                .find(|(k, _)| k == "key")
                .map(|(_, v)| v)
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(
        keys,
        [token("gh", 1), token("gh", 2)],
        "the 401, then the retry"
    );
    assert_eq!(rig.used("gh"), used + 2);

    // A second 401 within the minute: not minted again; the task fails
    // with the upstream's answer.
    upstream.accept_tokens(&[]);
    let o = rig.tick("pull", 1);
    assert_eq!(outcome(&o[0]).0, "failed", "{o:#?}");
    assert!(outcome(&o[0]).1.contains("401"), "{o:#?}");
    assert_eq!(rig.runs("gh"), 2, "at most one 401 re-mint a minute");
    rig.token_on_status("gh", "refused");

    // TTL 1 s: the next task past it mints again.
    upstream.accept_tokens(&[&token("short", 1), &token("short", 2)]);
    assert_eq!(outcome(&rig.tick("brief", 1)[0]).0, "done");
    // About time: past the token's 1 s TTL.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(outcome(&rig.tick("brief", 1)[0]).0, "done");
    assert_eq!(rig.runs("short"), 2, "minted again after its TTL");

    // It fails (past the TTL): the task fails saying why, nothing is sent
    // or spent; the next task within the minute does not run it again.
    std::fs::write(dir.path().join("fail"), "").expect("touch fail");
    // About time: past the token's 1 s TTL again.
    std::thread::sleep(Duration::from_millis(1500));
    let (sent, used) = (upstream.count(), rig.used("short"));
    let o = rig.tick("brief", 1);
    let (kind, msg) = outcome(&o[0]);
    assert_eq!(kind, "failed", "{o:#?}");
    assert!(msg.starts_with("credential command failed: "), "{msg}");
    assert!(msg.contains("exited with exit status: 2"), "{msg}");
    let o = rig.tick("brief", 1);
    let (kind, msg) = outcome(&o[0]);
    assert_eq!(kind, "failed", "{o:#?}");
    assert!(
        msg.ends_with("it runs again at most once a minute"),
        "{msg}"
    );
    assert_eq!(rig.runs("short"), 3, "not run again within the minute");
    assert_eq!(
        (upstream.count(), rig.used("short")),
        (sent, used),
        "nothing sent or spent"
    );
    assert!(
        rig.daemon
            .log()
            .contains("token service unreachable for short")
    );
    // The operator sees the failure and why on the status page.
    let t = rig.token_on_status("short", "failed");
    let error = t["error"].as_str().expect("error");
    assert!(error.contains("exited with exit status: 2"), "{t:#}");
    let (_, page) = http_get(rig.listener(), "/").expect("the status page");
    assert!(
        page.contains(r#"class="token" data-state="failed""#)
            && page.contains("exited with exit status: 2"),
        "{page}"
    );
    std::fs::remove_file(dir.path().join("fail")).expect("rm fail");

    // A template: one run and one token per tenant.
    upstream.accept_tokens(&[&token("t1", 1), &token("t2", 1)]);
    let o = rig.tick("tenants", 2);
    assert!(o.iter().all(|o| outcome(o).0 == "done"), "{o:#?}");
    assert_eq!((rig.runs("t1"), rig.runs("t2")), (1, 1));
    rig.token_on_status("tpl[account=t1]", "fresh");

    let m = scrape(rig.listener());
    let runs = |c: &str, r: &str| {
        m.one(
            "qw_credential_commands_total",
            &[("credential", c), ("result", r)],
        )
    };
    assert_eq!(
        (
            runs("gh", "minted"),
            runs("short", "minted"),
            runs("short", "failed")
        ),
        (2.0, 2.0, 1.0)
    );
    assert_eq!(runs("tpl", "minted"), 2.0);

    // The tokens are nowhere: the log (the command's stderr is there,
    // scrubbed), Redis, /api/status, /metrics, the sink.
    let log = rig.daemon.log();
    assert!(
        log.contains("minting for gh: [redacted]"),
        "its stderr logged, scrubbed"
    );
    assert!(!log.contains(MARK), "a token in the log");
    for (key, value) in crate::secrets::redis_dump(&rig.redis) {
        assert!(
            !key.contains(MARK) && !value.contains(MARK),
            "a token in Redis at {key}"
        );
    }
    let (_, status) = http_get(rig.listener(), "/api/status").expect("/api/status");
    assert!(!status.contains(MARK), "a token in /api/status");
    let (_, metrics) = http_get(rig.listener(), "/metrics").expect("/metrics");
    assert!(!metrics.contains(MARK), "a token in /metrics");
    let sink = std::fs::read_to_string(rig.cfg.join("data/pull/a.jsonl")).expect("sink");
    assert!(
        sink.contains("[redacted]") && !sink.contains(MARK),
        "{sink}"
    );
}

#[test]
fn check_finds_a_missing_program_and_runs_the_command_only_with_secrets() {
    let upstream = Hostile::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("mint");
    std::fs::write(&script, SCRIPT).expect("write the script");
    let s = script.to_str().expect("utf-8 path");
    let cfg = ConfigBuilder::new()
        .credential(
            Credential::command("gh", &[s, "gh"], Some("50m")).window(Window::sliding(10, "1h")),
        )
        .endpoint(Endpoint::new("gh", "gh", 1))
        .job(job("pull", "gh", &upstream, "v", &["a"]))
        .write();
    let runs = || std::fs::read_to_string(dir.path().join("runs-gh")).ok();
    // Not executable: refused, exit 78, naming the field.
    let out = cfg.run(&["check"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("credentials.gh.secret_command") && err.contains("not an executable file"),
        "{err}"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    // Exit 0 and its stdout.
    let passes = |args: &[&str]| {
        let out = cfg.run(args, &[]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = passes(&["check"]);
    let said = "credential gh: secret_command's program is there and executable (not run";
    assert!(text.contains(said), "{text}");
    assert_eq!(runs(), None, "check does not run it");
    let text = passes(&["check", "--with-secrets"]);
    let said = "credential gh: secret_command printed a token (15 bytes)";
    assert!(text.contains(said), "{text}");
    assert!(!text.contains(MARK));
    assert_eq!(runs().as_deref(), Some("1\n"));
    // Failing: exit 78 and why, no token.
    std::fs::write(dir.path().join("fail"), "").expect("touch fail");
    let out = cfg.run(&["check", "--with-secrets"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("credential gh: credential command failed: ")
            && err.contains("exit status: 2"),
        "{err}"
    );
    // A secret_ttl without a command, a template without its placeholder.
    let bad = TestConfig::new(
        &format!(
            "[credentials.a]\nsecret_env = \"X\"\nsecret_ttl = \"5m\"\nwindows = [{{ units = 1, per = \"1h\" }}]\n\
             [credentials.b]\ntemplate = \"account\"\nsecret_command = [\"{s}\"]\nwindows = [{{ units = 1, per = \"1h\" }}]\n"
        ),
        &[],
    );
    let out = bad.run(&["check"], &[("X", "x")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("credentials.a.secret_ttl"), "{err}");
    assert!(
        err.contains("credentials.b.secret_command") && err.contains("{account}"),
        "{err}"
    );
}

/// The three helpers of issue 37 (item 4): each records its own pid and
/// its child's in `pids-NAME`, so the test can count what outlives it.
const LEAKY: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo $$ >> "$d/pids-leaky"
sleep 1037 &
echo $! >> "$d/pids-leaky"
echo partial
wait
"#;
const BACKGROUND: &str = r#"#!/bin/sh
d=$(dirname "$0")
echo $$ >> "$d/pids-bg"
sleep 1038 &
echo $! >> "$d/pids-bg"
echo tok-bg-SEKRIT
exit 0
"#;
const LOUD: &str = r#"#!/bin/sh
head -c 100000000 /dev/zero | tr '\0' a
echo
"#;

/// Issue 37, item 4: `secret_command` timeouts leaked processes and
/// misjudged a helper that succeeded. `echo partial; sleep` under `sh`:
/// `sh` was killed at 10 s and `sleep` lived on (one more at every run); a
/// helper that printed its token and exited 0 but left a background child
/// holding its standard output was "killed at 10 s" and its token thrown
/// away; one printing 100 MB was told "exit status 141". Now the helper
/// runs in its own process group, killed whole at the timeout (and once it
/// has exited: none of its processes outlives it), and is judged by its
/// exit status and what it printed before exiting, at most 64 KiB.
#[test]
fn issue_37_4_a_credential_command_is_judged_by_its_exit_and_no_process_of_it_outlives_it() {
    use std::os::unix::fs::PermissionsExt;
    let upstream = Hostile::start();
    upstream.accept_tokens(&["tok-bg-SEKRIT"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let script = |name: &str, text: &str| -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write the script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path.to_str().expect("utf-8 path").to_owned()
    };
    let (leaky, bg, loud) = (
        script("leaky", LEAKY),
        script("bg", BACKGROUND),
        script("loud", LOUD),
    );
    let redis = RedisServer::start();
    let window = || Window::sliding(1000, "1h");
    let mut builder = ConfigBuilder::new()
        .redis_url(&redis.url())
        .state_dir("state");
    for (name, path) in [("leaky", &leaky), ("bg", &bg), ("loud", &loud)] {
        builder = builder
            .credential(Credential::command(name, &[path.as_str()], None).window(window()))
            .endpoint(Endpoint::new(name, name, 1))
            .job(job(name, name, &upstream, "v", &["a"]));
    }
    let cfg = builder.write();
    let rig = Rig {
        rig: support::rig::Rig::start(redis, cfg, &[]),
        script: dir.path().join("leaky"),
    };
    let pids = |name: &str| -> Vec<u32> {
        std::fs::read_to_string(dir.path().join(format!("pids-{name}")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    };
    let alive = |name: &str| -> Vec<u32> {
        pids(name)
            .into_iter()
            .filter(|p| crate::support::procfs::alive(*p))
            .collect()
    };

    // Exit 0 with the token printed, a background child still holding its
    // standard output: the token is used at once, and the child is gone.
    let t0 = std::time::Instant::now();
    let o = rig.tick("bg", 1);
    assert_eq!(outcome(&o[0]).0, "done", "{o:#?}");
    assert!(t0.elapsed() < Duration::from_secs(9), "{:?}", t0.elapsed());
    assert_eq!(pids("bg").len(), 2, "the helper and its child ran");
    assert!(
        wait_until(Duration::from_secs(5), || alive("bg").is_empty()),
        "still alive: {:?}",
        alive("bg")
    );

    // Past the timeout: the whole group killed, none of it outlives it.
    let o = rig.tick("leaky", 1);
    let (kind, msg) = outcome(&o[0]);
    assert_eq!(kind, "failed", "{o:#?}");
    assert!(msg.contains("did not finish within 10 s"), "{msg}");
    assert_eq!(pids("leaky").len(), 2, "the helper and its child ran");
    assert!(
        wait_until(Duration::from_secs(5), || alive("leaky").is_empty()),
        "outlived the timeout: {:?}",
        alive("leaky")
    );

    // 100 MB on its standard output: "printed more than 64 KiB", at once.
    let t0 = std::time::Instant::now();
    let o = rig.tick("loud", 1);
    let (kind, msg) = outcome(&o[0]);
    assert_eq!(kind, "failed", "{o:#?}");
    assert!(msg.contains("printed more than 64 KiB"), "{msg}");
    assert!(t0.elapsed() < Duration::from_secs(9), "{:?}", t0.elapsed());
    assert!(!rig.daemon.log().contains("SEKRIT"), "a token in the log");
}

/// Issue 37 (low): `check` misreported a template credential whose token a
/// `secret_command` mints ("0 with a token file", "mint[account=alice]: the
/// credential is not a template") while `run` minted for every tenant; and
/// a fan-out value `--help` reached the command as an option. `check` says
/// each tenant's token is minted, `--with-secrets` runs the command for one
/// tenant, and a value starting with `-` in an argument of its own is
/// refused (its task fails saying why, the command not run; `check` warns).
#[test]
fn issue_37_4_a_template_command_in_check_and_a_tenant_that_looks_like_an_option() {
    use std::os::unix::fs::PermissionsExt;
    let upstream = Hostile::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("mint");
    std::fs::write(&script, SCRIPT).expect("write the script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let s = script.to_str().expect("utf-8 path");
    let redis = RedisServer::start();
    let build = |values: &[&str]| {
        ConfigBuilder::new()
            .redis_url(&redis.url())
            .state_dir("state")
            .credential(
                Credential::command("tpl", &[s, "{account}"], None)
                    .templated("account")
                    .window(Window::sliding(1000, "1h")),
            )
            .endpoint(Endpoint::new("tpl", "tpl", 1))
            .job(job("tenants", "tpl", &upstream, "account", values))
            .write()
    };
    let runs = |arg: &str| std::fs::read_to_string(dir.path().join(format!("runs-{arg}"))).ok();
    let cfg = build(&["alice", "bob"]);
    let out = cfg.run(&["check"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        text.contains(
            "2 tenant(s) in the jobs' items now, each one's token minted by secret_command"
        ),
        "{text}"
    );
    assert!(
        !text.contains("token file")
            && !err.contains("token file")
            && !err.contains("not a template"),
        "{text}{err}"
    );
    let out = cfg.run(&["check", "--with-secrets"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("credential tpl[account=alice] (one tenant; each tenant's runs when a task needs it): secret_command printed a token"),
        "{text}"
    );
    assert_eq!((runs("alice").as_deref(), runs("bob")), (Some("1\n"), None));

    let cfg = build(&["alice", "--help"]);
    let out = cfg.run(&["check"], &[]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(
            "warning: credential tpl: 1 tenant(s) would reach secret_command as an option"
        ) && text.contains("the tenant value \"--help\" starts with '-'"),
        "{text}"
    );
    upstream.accept_tokens(&[&token("alice", 2)]);
    let rig = Rig {
        rig: support::rig::Rig::start(redis, cfg, &[]),
        script: script.clone(),
    };
    let o = rig.tick("tenants", 2);
    let by = |v: &str| {
        o.iter()
            .find(|o| o.line["item"] == format!("account={v}"))
            .map(outcome)
            .unwrap_or_else(|| panic!("no outcome for {v}: {o:#?}"))
    };
    assert_eq!(by("alice").0, "done", "{o:#?}");
    let (kind, msg) = by("--help");
    assert_eq!(kind, "failed", "{o:#?}");
    assert!(
        msg.starts_with("credential command failed: the tenant value \"--help\" starts with '-'"),
        "{msg}"
    );
    assert_eq!(runs("--help"), None, "the command did not run for it");
}
