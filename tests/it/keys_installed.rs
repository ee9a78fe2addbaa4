//! Promise (issue 12 item 7): `keys` names a script file that exists and
//! holds exactly the script the binary runs, wherever the binary is
//! installed — not a path into the build directory — and `keys --script`
//! prints it; an unknown endpoint in `spend` or `keys` lists the known ones.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{self, TestConfig};

use quota_worker::quota::SCRIPT;

const CONFIG: &str = r#"
[credentials.k]
secret_env = "K"
windows = [{ units = 100, per = "1h" }]

[endpoints."api.read"]
credential = "k"
cost = 1

[endpoints."api.write"]
credential = "k"
cost = 5
"#;

/// The binary copied to `dir/bin`, away from the checkout and its build
/// directory, as an installed one is.
fn installed(dir: &Path) -> PathBuf {
    let bin = dir.join("bin/quota-worker");
    std::fs::create_dir_all(bin.parent().expect("dir")).expect("mkdir");
    std::fs::copy(support::bin(), &bin).expect("copy the binary");
    bin
}

fn run(bin: &Path, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin);
    cmd.arg("-c").arg(config).args(args);
    cmd.env_remove("QUOTA_WORKER_CONFIG")
        .env_remove("STATE_DIRECTORY")
        .env_remove("QUOTA_WORKER_REDIS_URL")
        .current_dir(config.parent().expect("config dir"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the installed binary")
}

fn script_of(o: &Output) -> PathBuf {
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(o));
    let v = support::json(o);
    PathBuf::from(v["script"].as_str().expect("script path"))
}

#[test]
fn keys_names_a_script_that_exists_for_an_installed_binary() {
    let root = tempfile::tempdir().expect("tempdir");
    let bin = installed(root.path());
    let etc = root.path().join("etc/quota-worker");
    std::fs::create_dir_all(&etc).expect("mkdir");
    let config = etc.join("quota-worker.toml");
    std::fs::write(&config, CONFIG).expect("config");
    let state = root.path().join("var/lib/quota-worker");

    let script = script_of(&run(
        &bin,
        &config,
        &["keys", "api.read"],
        &[("STATE_DIRECTORY", state.to_str().expect("utf-8"))],
    ));
    assert!(
        !script.starts_with(env!("CARGO_MANIFEST_DIR")),
        "{} is in the checkout",
        script.display()
    );
    assert_eq!(script, state.join("lua/spend.lua"));
    assert_eq!(std::fs::read_to_string(&script).expect("it exists"), SCRIPT);

    // A state directory this user cannot write (a file in its place): a copy
    // in the temporary directory instead, still the same script.
    let blocked = root.path().join("not-a-dir");
    std::fs::write(&blocked, "").expect("file");
    let script = script_of(&run(
        &bin,
        &config,
        &["keys", "api.write"],
        &[("STATE_DIRECTORY", blocked.to_str().expect("utf-8"))],
    ));
    assert!(
        script.starts_with(std::env::temp_dir()),
        "{}",
        script.display()
    );
    assert_eq!(std::fs::read_to_string(&script).expect("it exists"), SCRIPT);
    let _ = std::fs::remove_file(&script);

    // Or the script itself, or the function library.
    let o = run(&bin, &config, &["keys", "--script"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
    assert_eq!(support::stdout(&o), SCRIPT);
    let o = run(&bin, &config, &["keys", "--library"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
    assert_eq!(support::stdout(&o), quota_worker::quota::library().source());
}

#[test]
fn an_unknown_endpoint_lists_the_known_ones() {
    let cfg = TestConfig::new(CONFIG, &[]);
    for cmd in ["spend", "keys"] {
        let o = cfg.run(&[cmd, "api.reed"], &[]);
        assert_eq!(o.status.code(), Some(64), "{cmd}");
        assert!(
            support::stderr(&o)
                .contains(r#"unknown endpoint "api.reed"; known endpoints: api.read, api.write"#),
            "{cmd}: {}",
            support::stderr(&o)
        );
    }
}

/// A reader that stops early (`keys --script | head`) is not an error: the
/// command exits 0 and does not panic on the closed pipe.
#[test]
fn keys_output_into_a_closed_pipe_exits_0_without_a_panic() {
    use std::io::Read;
    let cfg = TestConfig::new(CONFIG, &[]);
    for args in [&["keys", "--script"][..], &["keys", "api.read"][..]] {
        let mut child = crate::support::process::command(&cfg.path(), args, &cfg.env())
            .spawn()
            .expect("run quota-worker");
        // Close the read end before the binary has loaded its config.
        drop(child.stdout.take());
        let status = child.wait().expect("wait");
        let mut err = String::new();
        child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .ok();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(status.code(), Some(0), "{args:?}: {err}");
    }
}
