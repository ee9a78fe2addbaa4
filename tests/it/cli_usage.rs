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

/// `completions` and `manpages` need no config (the package build runs them
/// where there is none) and cover every command the binary has: its own
/// `--help` lists them.
#[test]
fn completions_and_man_pages_cover_every_command_and_need_no_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let help = stdout(&run(&["--help"], &[], dir.path()));
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(
        commands.len() >= 10,
        "commands in --help: {commands:?}\n{help}"
    );
    for shell in ["bash", "zsh", "fish"] {
        let o = run(&["completions", shell], &[], dir.path());
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for c in &commands {
            assert!(script.contains(c), "{shell} completion lacks {c}");
        }
    }
    let man = dir.path().join("man");
    let o = run(&["manpages", man.to_str().expect("utf-8")], &[], dir.path());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // roff spells a hyphen `\-`.
    let top = std::fs::read_to_string(man.join("quota-worker.1"))
        .expect("quota-worker.1")
        .replace("\\-", "-");
    for c in &commands {
        assert!(
            man.join(format!("quota-worker-{c}.1")).is_file(),
            "no page for {c}"
        );
        assert!(
            top.contains(&format!("quota-worker-{c}")),
            "quota-worker.1 does not list {c}"
        );
    }
    for section in ["FILES", "ENVIRONMENT", "EXIT STATUS", "SEE ALSO"] {
        assert!(
            top.contains(&format!(".SH \"{section}\"")) || top.contains(&format!(".SH {section}")),
            "quota-worker.1 has no {section}:\n{top}"
        );
    }
    // A directory that cannot be made: 74, said.
    let o = run(&["manpages", "/proc/no/such"], &[], dir.path());
    assert_eq!(o.status.code(), Some(74), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot write the man pages"),
        "{}",
        stderr(&o)
    );
}
