//! Promise: the command line follows sysexits — 64 for a bad command line,
//! 0 for `--help` — and finds its config through `-c`, then
//! `$QUOTA_WORKER_CONFIG`, then `config/quota-worker.toml`.

use std::process::Command;

use crate::support::{ConfigBuilder, Credential, Endpoint, Window, bin, stderr, stdout};

fn run(args: &[&str], env: &[(&str, &str)], dir: &std::path::Path) -> std::process::Output {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .current_dir(dir)
        .env_remove("QUOTA_WORKER_CONFIG")
        .env_remove("QUOTA_WORKER_REDIS_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run quota-worker")
}

#[test]
fn a_bad_command_line_exits_64_and_help_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [
        &["frobnicate"][..],
        &["spend"],
        &["spend", "e", "--cost", "many"],
        &["quota", "--bogus"],
    ] {
        let o = run(args, &[], dir.path());
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", stderr(&o));
    }
    for args in [&["--help"][..], &["spend", "--help"], &["demo", "--help"]] {
        let o = run(args, &[], dir.path());
        assert_eq!(o.status.code(), Some(0), "{args:?}");
        assert!(stdout(&o).contains("Usage"), "{args:?}: {}", stdout(&o));
    }
}

#[test]
fn the_config_comes_from_the_flag_then_the_environment_then_the_default() {
    let cfg = ConfigBuilder::new()
        .credential(Credential::env("k", "K").window(Window::sliding(5, "1h")))
        .endpoint(Endpoint::new("e", "k", 1))
        .write();
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let path = cfg.path();
    let path = path.to_str().expect("utf-8 path");

    // No flag, no variable, no config/quota-worker.toml here: a config error
    // that names the default path.
    let o = run(&["keys", "e"], &[], elsewhere.path());
    assert_eq!(o.status.code(), Some(78));
    assert!(
        stderr(&o).contains("config/quota-worker.toml"),
        "{}",
        stderr(&o)
    );

    // The variable.
    let o = run(
        &["keys", "e"],
        &[("QUOTA_WORKER_CONFIG", path)],
        elsewhere.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let blocked = crate::support::keys::keys().blocked("k");
    assert!(stdout(&o).contains(&blocked), "{}", stdout(&o));

    // The flag wins over the variable.
    let o = run(
        &["-c", path, "keys", "e"],
        &[("QUOTA_WORKER_CONFIG", "/nonexistent.toml")],
        elsewhere.path(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // The default, relative to the working directory.
    std::fs::create_dir_all(cfg.join("config")).expect("mkdir");
    std::fs::copy(cfg.path(), cfg.join("config/quota-worker.toml")).expect("copy");
    let o = run(&["keys", "e"], &[], cfg.dir.path());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // An unknown endpoint is a usage error, not a config error.
    let o = run(&["-c", path, "spend", "nope"], &[], elsewhere.path());
    assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unknown endpoint \"nope\""),
        "{}",
        stderr(&o)
    );
}
