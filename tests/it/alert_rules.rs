//! The alerting rules (contrib/prometheus/alerts.yml) cannot drift from
//! what the daemon exports: every metric a rule or its unit tests name is
//! on a running daemon's `/metrics`, with every label they group by, match
//! on or print. And `scripts/check-alerts` (CI runs it too) has `promtool`
//! accept the rules and pass their unit tests; skipped, with a note, where
//! promtool is not installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::http::{self, Metrics};
use crate::support::process::run_cli;
use crate::support::rig::Rig;
use crate::support::world;
use crate::support::{self, ConfigBuilder, Credential, Endpoint, RedisServer, Window, free_port};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Labels Prometheus adds to every scraped series itself.
const SCRAPE_LABELS: [&str; 2] = ["job", "instance"];
/// Series Prometheus makes itself (not the daemon's).
const PROMETHEUS_SERIES: [&str; 1] = ["up"];

/// What one rule (or one unit test's series) names: metric → labels.
type Names = BTreeMap<String, BTreeSet<String>>;

/// The identifiers of `text`, with where each starts.
fn identifiers(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        let word = c.is_ascii_alphanumeric() || c == '_';
        match (start, word) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                out.push((s, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// A PromQL expression split into its skeleton (label lists and selectors
/// blanked out, so what is left names metrics and functions) and the labels
/// it groups by (`by (...)`, `without`, `on`, `ignoring`) or matches on
/// (`{label="..."}`, quoted values skipped whole).
fn split_expr(expr: &str) -> (String, BTreeSet<String>) {
    let mut labels = BTreeSet::new();
    let mut skeleton = String::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '{' {
            skeleton.push(c);
            continue;
        }
        // A selector: `name op "value"` pairs up to the closing brace.
        let mut name = String::new();
        let mut in_name = true;
        while let Some(c) = chars.next() {
            match c {
                '}' => break,
                '"' => {
                    while let Some(q) = chars.next() {
                        match q {
                            '\\' => {
                                chars.next();
                            }
                            '"' => break,
                            _ => {}
                        }
                    }
                }
                '=' | '!' | '~' if in_name => {
                    labels.insert(name.trim().to_owned());
                    name.clear();
                    in_name = false;
                }
                ',' => in_name = true,
                _ if in_name => name.push(c),
                _ => {}
            }
        }
        skeleton.push(' ');
    }
    let words = identifiers(&skeleton);
    let mut blank = Vec::new();
    for (at, word) in &words {
        if !["by", "without", "on", "ignoring"].contains(word) {
            continue;
        }
        let after = at + word.len();
        let rest = &skeleton[after..];
        let trimmed = rest.trim_start();
        if let Some(inner) = trimmed.strip_prefix('(') {
            let inner = inner.split(')').next().unwrap_or_default();
            labels.extend(identifiers(inner).into_iter().map(|(_, w)| w.to_owned()));
            let from = after + (rest.len() - trimmed.len());
            blank.push(from..from + inner.len() + 2);
        }
    }
    let mut skeleton = skeleton.into_bytes();
    for r in blank {
        skeleton[r].fill(b' ');
    }
    (String::from_utf8(skeleton).expect("ascii"), labels)
}

/// Per rule of alerts.yml: its name, the metrics its expression reads, and
/// the labels its expression and annotations use. The file is ours and
/// regular: `- alert: NAME`, `expr:` up to `for:` or `labels:`, then
/// `annotations:`.
fn rules(text: &str) -> Vec<(String, Names)> {
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    text.split("- alert: ")
        .skip(1)
        .map(|block| {
            let name = block.lines().next().unwrap_or_default().trim().to_owned();
            let expr_at = block.find("expr:").expect("a rule has an expr");
            let expr = &block[expr_at + 5..];
            let end = ["\n        for:", "\n        labels:"]
                .iter()
                .filter_map(|k| expr.find(k))
                .min()
                .unwrap_or(expr.len());
            let (skeleton, mut labels) = split_expr(&expr[..end]);
            let annotations = block.split("annotations:").nth(1).unwrap_or_default();
            for part in annotations.split("$labels.").skip(1) {
                if let Some((_, w)) = identifiers(part).first() {
                    labels.insert((*w).to_owned());
                }
            }
            let mut names = Names::new();
            for (_, w) in identifiers(&skeleton) {
                if w.starts_with("qw_") || PROMETHEUS_SERIES.contains(&w) {
                    names.insert(w.to_owned(), labels.clone());
                }
            }
            assert!(!names.is_empty(), "rule {name} reads no metric: {skeleton}");
            (name, names)
        })
        .collect()
}

/// The series of alerts_test.yml: `series: 'NAME{label="v", ...}'`.
fn test_series(text: &str) -> Names {
    let mut names = Names::new();
    for line in text.lines() {
        let Some(s) = line.trim().strip_prefix("- series: '") else {
            continue;
        };
        let (name, rest) = s.split_once('{').unwrap_or((s.trim_end_matches('\''), ""));
        let labels = rest
            .split(',')
            .filter_map(|m| m.split_once('='))
            .map(|(k, _)| k.trim().to_owned());
        names.entry(name.to_owned()).or_default().extend(labels);
    }
    names
}

/// Checks each metric of `names` against the scrape: exported, and every
/// label used is one the daemon puts on it (or one Prometheus adds).
fn check_exported(what: &str, names: &Names, scrape: &Metrics, problems: &mut Vec<String>) {
    for (metric, labels) in names {
        if PROMETHEUS_SERIES.contains(&metric.as_str()) {
            continue;
        }
        let samples = scrape.select(metric, &[]);
        if samples.is_empty() {
            problems.push(format!("{what}: {metric} is not on /metrics"));
            continue;
        }
        let exported: BTreeSet<&str> = samples
            .iter()
            .flat_map(|s| s.labels.keys().map(String::as_str))
            .collect();
        for label in labels {
            if !SCRAPE_LABELS.contains(&label.as_str()) && !exported.contains(label.as_str()) {
                problems.push(format!(
                    "{what}: {metric} has no label {label} on /metrics (it has {exported:?})"
                ));
            }
        }
    }
}

#[test]
fn alert_rules_name_only_metrics_and_labels_the_daemon_exports() {
    let rules_text = read("contrib/prometheus/alerts.yml");
    let rules = rules(&rules_text);
    let names: Vec<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    for wanted in [
        "QuotaWorkerNotReady",
        "QuotaWorkerWindowRunsOutWithinAnHour",
        "QuotaWorkerCredentialBlocked",
        "QuotaWorkerDriftHigh",
        "QuotaWorkerTasksFailing",
        "QuotaWorkerCredentialCommandFailing",
    ] {
        assert!(names.contains(&wanted), "{wanted} in {names:?}");
    }

    // A daemon with a plain credential and a template one that has a
    // tenant in Redis (the `tenant` label), a credential command (its
    // zeroed run counters; never run: no task needs it), and a job (its
    // zeroed outcomes).
    let redis = RedisServer::start();
    let port = free_port();
    let cfg = ConfigBuilder::new()
        .credential(world::credential(Window::sliding(9500, "24h")))
        .credential(
            Credential::template("ig", "account", "tokens/{account}")
                .window(Window::sliding(100, "1h")),
        )
        .credential(
            Credential::command("gh", &["/bin/true"], None).window(Window::sliding(100, "1h")),
        )
        .endpoint(world::endpoint())
        .endpoint(Endpoint::new("ig.media", "ig", 1))
        .job(world::videos_job(
            "trending",
            world::ENDPOINT,
            "http://127.0.0.1:9",
            &["US"],
            1,
        ))
        .metrics_listen(&format!("127.0.0.1:{port}"))
        .write();
    std::fs::create_dir_all(cfg.join("tokens")).expect("mkdir tokens");
    std::fs::write(cfg.join("tokens/123"), "ig-token\n").expect("token");
    let (code, out, err) = run_cli(
        &cfg,
        Some(&redis.url()),
        &["spend", "ig.media[account=123]"],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    let mut rig = Rig::start(redis, cfg, &[]);
    assert!(http::wait_http(port, Duration::from_secs(20)));
    // Ready, so qw_ready is 1 (and the gauges were read: every series
    // below is in that scrape).
    let ready = |m: &http::Metrics| m.select("qw_ready", &[]).first().map(|s| s.value) == Some(1.0);
    let scrape = http::scrape_until(port, Duration::from_secs(15), ready);
    assert!(
        ready(&scrape),
        "qw_ready 1 once the daemon is ready:\n{}",
        scrape.text
    );

    let mut problems = Vec::new();
    for (name, names) in &rules {
        check_exported(&format!("rule {name}"), names, &scrape, &mut problems);
    }
    let tests = test_series(&read("contrib/prometheus/alerts_test.yml"));
    check_exported("alerts_test.yml", &tests, &scrape, &mut problems);
    assert!(
        problems.is_empty(),
        "the alerting rules name what the daemon does not export:\n{}\n\n/metrics:\n{}",
        problems.join("\n"),
        scrape.text
    );
    // Each rule's metrics are used by its unit tests too.
    for (name, names) in &rules {
        for metric in names.keys() {
            assert!(
                tests.contains_key(metric),
                "rule {name} reads {metric}, which no unit test in alerts_test.yml feeds"
            );
        }
    }
    rig.daemon.term();
}

fn have_promtool() -> bool {
    Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    if !have_promtool() {
        eprintln!(
            "NOTE: promtool is not installed: the alerting rules' unit tests did not run here (CI installs it: QW_DEPS_PROMTOOL=1 scripts/deps)"
        );
        return;
    }
    let out = Command::new(repo().join("scripts/check-alerts"))
        .output()
        .expect("run scripts/check-alerts");
    let stdout = support::stdout(&out);
    let stderr = support::stderr(&out);
    assert!(
        out.status.success() && stdout.contains("check ok, unit tests pass"),
        "scripts/check-alerts failed ({:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
}
