//! The systemd units: `scripts/check-units` (CI runs it too) has
//! `systemd-analyze verify` accept both units and `systemd-analyze security`
//! rate them 2.0 or lower. Skipped, with a note, where `systemd-analyze` is
//! not installed. And the units agree with the daemon and the shipped config
//! wherever they must, which needs no systemd: `Type=notify` with a watchdog,
//! a stop timeout above the shutdown timeout, `LimitNOFILE=65536`, a credential for every
//! `secret_file` the config reads from `$CREDENTIALS_DIRECTORY`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `Key=value` lines of a unit file's `[Service]` section, in order.
fn service_section(unit: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join(unit)).expect("read unit");
    let mut section = "";
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = if line == "[Service]" { "service" } else { "" };
            continue;
        }
        if section == "service"
            && let Some((k, v)) = line.split_once('=')
        {
            out.push((k.to_owned(), v.to_owned()));
        }
    }
    out
}

fn values<'a>(section: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    section
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

fn one<'a>(section: &'a [(String, String)], key: &str) -> &'a str {
    let v = values(section, key);
    assert_eq!(v.len(), 1, "{key} set once: {v:?}");
    v[0]
}

fn have_systemd_analyze() -> bool {
    Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn unit_files_pass_systemd_analyze_verify_and_the_security_threshold() {
    if !have_systemd_analyze() {
        eprintln!(
            "NOTE: systemd-analyze is not installed: the unit files were not verified here (CI installs it: QW_DEPS_SYSTEMD=1 scripts/deps)"
        );
        return;
    }
    let out = Command::new(repo().join("scripts/check-units"))
        .env("QUOTA_WORKER_BIN", support::bin())
        .output()
        .expect("run scripts/check-units");
    let stdout = support::stdout(&out);
    let stderr = support::stderr(&out);
    assert!(
        out.status.success(),
        "scripts/check-units failed ({:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
    for unit in ["quota-worker.service", "quota-worker@.service"] {
        assert!(
            stdout.contains(&format!("systemd/{unit}: verify ok, exposure within 2.0")),
            "{unit} checked:\n{stdout}"
        );
    }
    // The exposure the tool printed, for the record.
    for line in stdout
        .lines()
        .filter(|l| l.contains("Overall exposure level"))
    {
        eprintln!("{line}");
    }
}

#[test]
fn unit_files_agree_with_the_daemon_and_the_shipped_config() {
    let config = quota_worker::config::Config::load(&repo().join("config/quota-worker.toml"))
        .unwrap_or_else(|e| panic!("the shipped config loads: {e:?}"));
    let raw: toml::Table = std::fs::read_to_string(repo().join("config/quota-worker.toml"))
        .expect("read config")
        .parse()
        .expect("toml");
    for (unit, etc) in [
        ("systemd/quota-worker.service", "/etc/quota-worker"),
        ("systemd/quota-worker@.service", "/etc/quota-worker/%i"),
    ] {
        let s = service_section(unit);
        assert_eq!(one(&s, "Type"), "notify", "{unit}");
        assert_eq!(
            one(&s, "NotifyAccess"),
            "main",
            "{unit}: only the daemon may notify"
        );
        let watchdog = humantime::parse_duration(one(&s, "WatchdogSec")).expect("WatchdogSec");
        // A ping at half the interval; the loops count as stale after
        // STALE_AFTER, so a wedge is caught within one interval of that.
        assert!(
            watchdog >= Duration::from_secs(2),
            "{unit}: WatchdogSec {watchdog:?}"
        );
        let stop = humantime::parse_duration(one(&s, "TimeoutStopSec")).expect("TimeoutStopSec");
        assert!(
            stop > config.worker.shutdown_timeout + Duration::from_secs(5),
            "{unit}: TimeoutStopSec {stop:?} must leave the shutdown timeout ({:?}) room",
            config.worker.shutdown_timeout
        );
        assert_eq!(one(&s, "Restart"), "on-failure");
        // Above systemd's default soft limit of 1,024 (issue 22 item 7:
        // tests/it/listener_limits.rs shows what exhausting it did).
        assert_eq!(one(&s, "LimitNOFILE"), "65536", "{unit}");
        assert_eq!(one(&s, "DynamicUser"), "yes");
        // ExecStart runs `run` on the config in the configuration directory.
        let exec = one(&s, "ExecStart");
        assert_eq!(
            exec,
            format!("/usr/local/bin/quota-worker run -c {etc}/config/quota-worker.toml"),
            "{unit}"
        );
        // ExecReload reloads that config in the running daemon, and waits.
        assert_eq!(
            one(&s, "ExecReload"),
            format!(
                "/usr/local/bin/quota-worker reload --pid $MAINPID -c {etc}/config/quota-worker.toml"
            ),
            "{unit}"
        );
        let conf_dir = one(&s, "ConfigurationDirectory");
        assert_eq!(format!("/etc/{conf_dir}"), etc, "{unit}");
        assert!(one(&s, "StateDirectory").starts_with("quota-worker"));
        // Every credential the config reads from $CREDENTIALS_DIRECTORY is
        // loaded, from the configuration directory's credentials/.
        let creds: Vec<(&str, &str)> = values(&s, "LoadCredential")
            .into_iter()
            .map(|v| v.split_once(':').expect("ID:PATH"))
            .collect();
        let table = raw["credentials"].as_table().expect("[credentials]");
        for (name, c) in table {
            let Some(file) = c.get("secret_file").and_then(|f| f.as_str()) else {
                continue;
            };
            if let Some(rest) = file.strip_prefix("${CREDENTIALS_DIRECTORY") {
                let id = rest.rsplit('/').next().expect("file name");
                assert!(
                    creds
                        .iter()
                        .any(|(cid, path)| *cid == id && *path == format!("{etc}/credentials/{id}")),
                    "{unit}: credential {name} reads $CREDENTIALS_DIRECTORY/{id}, but the unit has no LoadCredential={id}:{etc}/credentials/{id} ({creds:?})"
                );
            }
        }
        for key in [
            "ProtectSystem",
            "ProtectHome",
            "PrivateTmp",
            "PrivateDevices",
            "NoNewPrivileges",
            "RestrictAddressFamilies",
            "SystemCallFilter",
            "CapabilityBoundingSet",
            "MemoryDenyWriteExecute",
            "LockPersonality",
        ] {
            assert!(!values(&s, key).is_empty(), "{unit}: {key} is set");
        }
    }
}
