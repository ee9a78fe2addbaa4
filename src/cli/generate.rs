//! `quota-worker completions SHELL` and `quota-worker manpages DIR`: shell
//! completions (clap_complete) and man pages (clap_mangen) made from the
//! binary's own argument definitions, so they cannot disagree with what it
//! accepts. The Debian package installs both (scripts/package).
//!
//! Made by the binary, not by a build script: a build script cannot use the
//! library its package builds, and the definitions use its types (`Reserve`,
//! `LogFormat`, the duration grammar); a build script would also make every
//! `cargo build` of a developer run it.

use std::io::Write;
use std::path::Path;

use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, italic, roman};

use super::Exit;

/// Prints the completion script for `shell` on stdout.
pub fn completions(mut cmd: clap::Command, shell: clap_complete::Shell) -> Exit {
    // Into memory first: clap_complete panics on a failed write (a closed
    // pipe, `| head`).
    let mut script = Vec::new();
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, &mut cmd, name, &mut script);
    match std::io::stdout().write_all(&script) {
        Ok(()) => Exit::Ok,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Exit::Ok,
        Err(e) => {
            eprintln!("error: cannot write the completion script: {e}");
            Exit::IoErr
        }
    }
}

/// Writes `quota-worker.1` and one page per command (`quota-worker-run.1`,
/// …) into `dir`, creating it.
pub fn manpages(cmd: clap::Command, dir: &Path) -> Exit {
    match write_manpages(cmd, dir) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!(
                "error: cannot write the man pages into {}: {e}",
                dir.display()
            );
            Exit::IoErr
        }
    }
}

fn write_manpages(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let cmd = cmd.disable_help_subcommand(true);
    // One page per command, as clap_mangen names them (the top page lists
    // them as quota-worker-run(1), ...); the top page is written again below
    // with the sections an operator looks for.
    clap_mangen::generate_to(cmd.clone(), dir)?;
    let man = Man::new(cmd.clone());
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    description().to_writer(&mut page)?;
    man.render_options_section(&mut page)?;
    man.render_subcommands_section(&mut page)?;
    operator_sections().to_writer(&mut page)?;
    man.render_version_section(&mut page)?;
    std::fs::write(dir.join(man.get_filename()), page)
}

fn description() -> Roff {
    let mut r = Roff::new();
    r.control("SH", ["DESCRIPTION"]).text([roman(
        "quota-worker ingests data from metered HTTP APIs (a daily or hourly quota, weighted costs per call) on cron schedules. \
         Each job's tick fans out into tasks queued in Redis; any worker of any daemon takes one and, before every request, \
         spends the endpoint's cost from the credential's shared, exact quota windows in Redis. When the quota says no, the \
         task stops at once with the retry-after, and the next run resumes at the page where it stopped.",
    )]);
    r.control("PP", []).text([
        roman("Under systemd, "),
        bold("quota-worker run"),
        roman(" is the service (quota-worker.service; quota-worker@NAME.service for more instances on one host); the other commands are for operators and scripts."),
    ]);
    r
}

/// FILES, ENVIRONMENT, EXIT STATUS and SEE ALSO: what clap does not know.
/// Over 80 lines because it is the pages' text, one table per section, kept
/// together so the man page reads as one document here too; no logic.
fn operator_sections() -> Roff {
    let mut r = Roff::new();
    let item = |r: &mut Roff, term: &str, text: &str| {
        r.control("TP", []).text([bold(term)]).text([roman(text)]);
    };
    r.control("SH", ["FILES"]);
    for (term, text) in [
        (
            "/etc/quota-worker/config/quota-worker.toml",
            "The config the service runs: credentials, windows, endpoints, the jobs glob, Redis, the metrics listener.",
        ),
        (
            "/etc/quota-worker/jobs/*.toml",
            "The jobs: schedule, endpoint, request, fan-out, pagination, sink.",
        ),
        (
            "/etc/quota-worker/credentials/",
            "The API keys, root's alone (mode 0700); systemd hands the service its copy (LoadCredential), which secret_file reads under $CREDENTIALS_DIRECTORY.",
        ),
        (
            "/var/lib/quota-worker/",
            "The service's state (StateDirectory): the embedded Redis with its AOF, the sinks' records, the spool.",
        ),
        (
            "/usr/share/doc/quota-worker/docs/",
            "The reference: configuration.md, jobs.md, commands.md, service.md, metrics.md, ...",
        ),
    ] {
        item(&mut r, term, text);
    }
    r.control("SH", ["ENVIRONMENT"]);
    for (term, text) in [
        (
            "QUOTA_WORKER_CONFIG",
            "The config file, when -c is not given.",
        ),
        ("QUOTA_WORKER_REDIS_URL", "Overrides [redis] url."),
        (
            "QUOTA_WORKER_METRICS_LISTEN",
            "Overrides [metrics] listen (\"off\" disables the listener).",
        ),
        (
            "STATE_DIRECTORY, CREDENTIALS_DIRECTORY",
            "Set by systemd; the shipped config reads its state and keys from them. Set STATE_DIRECTORY=/var/lib/quota-worker to run a command against the service's embedded Redis.",
        ),
        (
            "RUST_LOG",
            "The log level filter (info for run and trigger, warn for the others).",
        ),
    ] {
        item(&mut r, term, text);
    }
    r.control("SH", ["EXIT STATUS"]);
    for (term, text) in [
        ("0", "Success; spend: allowed."),
        ("1", "trigger --wait: a task ended failed."),
        ("64", "Usage: a bad argument, an unknown job or endpoint."),
        ("69", "Redis (or the embedded redis-server) unavailable."),
        (
            "75",
            "spend: rejected by a window; trigger --wait: a task stopped for quota; state reset: a task holds the item.",
        ),
        (
            "78",
            "The config is invalid (file:line:column and the field are printed), a secret cannot be read, a sink directory cannot be written.",
        ),
    ] {
        item(&mut r, term, text);
    }
    r.control("SH", ["SEE ALSO"]).text([
        bold("systemctl"),
        roman("(1), "),
        bold("journalctl"),
        roman("(1), "),
        bold("systemd.exec"),
        roman("(5); "),
        italic("/usr/share/doc/quota-worker/docs/commands.md"),
        roman(" (every command and exit code), "),
        italic("/usr/share/doc/quota-worker/docs/service.md"),
        roman(" (the service)."),
    ]);
    r
}
