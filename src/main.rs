//! The `quota-worker` binary: parses arguments, sets up logging, loads the
//! config and hands over to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use quota_worker::cli::{self, Exit};
use quota_worker::config::{Config, LogFormat, Reserve};

/// Spend weighted quota units from shared sliding windows in Redis before
/// every request to a metered API.
#[derive(Parser, Debug)]
#[command(name = "quota-worker", version, about, long_about = None)]
struct Args {
    /// Config file [default: $QUOTA_WORKER_CONFIG, then config/quota-worker.toml]
    #[arg(
        short,
        long,
        global = true,
        env = "QUOTA_WORKER_CONFIG",
        value_name = "FILE"
    )]
    config: Option<PathBuf>,

    /// Log line format: text (default) or json
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<LogFormat>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate config, jobs and secrets; show fire times and worst-case spending per window
    Check {
        /// Also run each credential's secret_command once, to see that it prints a token
        #[arg(long)]
        with_secrets: bool,
    },
    /// Spend once from an endpoint's windows (exit 0 allowed, 75 rejected, 69 Redis unreachable)
    Spend {
        /// Endpoint name, as in [endpoints."NAME"] (of a template credential: one tenant, NAME[account=VALUE])
        endpoint: String,
        /// Units to spend [default: the endpoint's cost]
        #[arg(long)]
        cost: Option<u64>,
        /// Admit only if every window keeps this share of its units free ("20%")
        #[arg(long, value_name = "PERCENT", default_value = "0%")]
        reserve: Reserve,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Settle a spend to its actual cost: 0 refunds it; any cost returns its lease (exit 0; 64 unknown endpoint or id)
    Settle {
        /// Endpoint name, as given to `spend`
        endpoint: String,
        /// The spend's id, as `spend` printed it
        id: String,
        /// What the request really cost, in units (0: it was never sent)
        cost: u64,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Show used / remaining / frees-in of every window, live from Redis
    Quota {
        /// Only this credential (a template's tenants, or one: NAME[account=VALUE])
        credential: Option<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Lift a credential's upstream blocks (and with --drift forget its windows' drift): for an operator who knows better than the last answer
    Unblock {
        /// Credential name (of a template: one tenant, NAME[account=VALUE])
        credential: String,
        /// Only this resource's block and windows (GitHub's core, search, graphql) [default: every resource]
        #[arg(long, value_name = "NAME")]
        resource: Option<String>,
        /// Also forget the drift the windows hold
        #[arg(long)]
        drift: bool,
    },
    /// Where each item of a job stands (last run, where the next resumes, {since}, validators, who holds it); `state reset` starts items over
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    State {
        #[command(subcommand)]
        reset: Option<StateCommand>,
        /// Job name
        #[arg(required = true)]
        job: Option<String>,
        /// One item, as `trigger --wait` names it (region=US) [default: every item]
        item: Option<String>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Run the scheduler and workers in the foreground (systemd Type=notify)
    Run,
    /// Reload a running daemon's config (SIGHUP) and wait until it has: systemd's ExecReload=
    Reload {
        /// The daemon's process id (systemd: $MAINPID)
        #[arg(long)]
        pid: u32,
        /// How long to wait for the daemon to say it reloaded
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
        timeout: std::time::Duration,
    },
    /// Enqueue one tick of a job now
    Trigger {
        /// Job name
        job: String,
        /// Show progress until the tick's tasks end, then a summary
        #[arg(long)]
        wait: bool,
    },
    /// Run the daemon on config/demo.toml against an embedded Redis and a simulated metered API
    Demo {
        /// How long to run
        #[arg(long = "for", value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
        for_: std::time::Duration,
        /// Where records and state go [default: a new directory under /tmp]
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Full-text search over what a job stored in its SQLite or PostgreSQL sink (spends nothing)
    Search {
        /// Job name
        job: String,
        /// Words that must all match (case and accents ignored; "word*" matches a prefix)
        query: String,
        /// At most this many results, best first
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Pages a sink refused for good (kept under <state_dir>/spool/%rejected/): list them, or write them again once the cause is fixed
    Spool {
        #[command(subcommand)]
        action: SpoolAction,
    },
    /// Print how another program calls the spend core to spend from an endpoint's windows
    Keys {
        /// Endpoint name (of a template credential: one tenant, NAME[account=VALUE])
        #[arg(required_unless_present_any = ["script", "library"])]
        endpoint: Option<String>,
        /// Print the spend script itself instead (EVALSHA, any Redis)
        #[arg(long, conflicts_with_all = ["endpoint", "cost", "reserve", "library"])]
        script: bool,
        /// Print the function library instead (FUNCTION LOAD, Redis 7)
        #[arg(long, conflicts_with_all = ["endpoint", "cost", "reserve"])]
        library: bool,
        /// Units to spend [default: the endpoint's cost]
        #[arg(long)]
        cost: Option<u64>,
        /// Admit only if every window keeps this share of its units free ("20%")
        #[arg(long, value_name = "PERCENT", default_value = "0%")]
        reserve: Reserve,
    },
    /// Print the shell completion script for SHELL (the Debian package installs bash, zsh and fish's)
    Completions {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Write the man pages, quota-worker.1 and one per command (quota-worker-run.1, ...), into DIR
    Manpages {
        /// Where to write them (created if missing)
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

/// `spool`'s own commands.
#[derive(Subcommand, Debug)]
enum SpoolAction {
    /// List the kept pages: job, item, when fetched and refused, the error, what each holds
    List {
        /// Only this job's
        job: Option<String>,
        /// Print one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Write JOB's kept pages again, once, with its sink as now configured, and lift their hold (exit 0 all written, 1 one still refused, 75 the sink could not take one now)
    Retry {
        /// Job name
        job: String,
    },
}

/// `state`'s own command.
#[derive(Subcommand, Debug)]
enum StateCommand {
    /// Start an item (or every item of the job) over: forget its checkpoint, {since} and validators, so its next run fetches from page 1 (refused, exit 75, while a task holds it)
    Reset {
        /// Job name
        job: String,
        /// One item, as `trigger --wait` names it (region=US) [default: every item]
        item: Option<String>,
        /// Set {since} to this instead of forgetting it: RFC 3339 (2026-11-01T00:00:00Z), a date (2026-11-01) or an age (30d)
        #[arg(long, value_name = "VALUE")]
        since: Option<String>,
    },
}

/// Completions and man pages come from this very definition, so they
/// cannot disagree with what the binary accepts; no config is read.
fn generate(command: &Command) -> Option<ExitCode> {
    let cli = <Args as clap::CommandFactory>::command();
    let code = match command {
        Command::Completions { shell } => cli::generate::completions(cli, *shell),
        Command::Manpages { dir } => cli::generate::manpages(cli, dir),
        _ => return None,
    };
    Some(code.into())
}

/// The config's duration grammar, so `--for` reads like `per = "..."`.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    quota_worker::config::parse_duration(s)
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let code = if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            };
            let _ = e.print();
            return code.into();
        }
    };
    if let Some(code) = generate(&args.command) {
        return code;
    }
    // The demo has its own config unless one is given.
    let path = match (&args.command, args.config) {
        (Command::Demo { .. }, None) => PathBuf::from("config/demo.toml"),
        (_, c) => cli::config_path(c),
    };
    let config = match cli::load(&path) {
        Ok(c) => c,
        Err(code) => return code.into(),
    };
    let format = args
        .log_format
        .or(config.log_format)
        .unwrap_or(LogFormat::Text);
    let default_level = match args.command {
        Command::Demo { .. }
        | Command::Spend { .. }
        | Command::Settle { .. }
        | Command::Quota { .. }
        | Command::Keys { .. }
        | Command::Search { .. }
        | Command::Spool { .. }
        | Command::Reload { .. }
        | Command::Unblock { .. }
        | Command::State { .. }
        | Command::Check { .. } => "warn",
        _ => "info",
    };
    quota_worker::logging::init(format, default_level);

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return Exit::Software.into();
        }
    };
    runtime.block_on(dispatch(args.command, config)).into()
}

/// Runs `command` on `config`; its exit code.
async fn dispatch(command: Command, config: Config) -> Exit {
    match command {
        Command::Check { with_secrets } => {
            cli::check::run(&config, chrono::Utc::now(), with_secrets).await
        }
        Command::Spend {
            endpoint,
            cost,
            reserve,
            json,
        } => cli::spend::run(&config, &endpoint, cost, reserve, json).await,
        Command::Settle {
            endpoint,
            id,
            cost,
            json,
        } => cli::settle::run(&config, &endpoint, &id, cost, json).await,
        Command::Quota { credential, json } => {
            cli::quota::run(&config, credential.as_deref(), json).await
        }
        Command::Keys {
            endpoint: Some(endpoint),
            cost,
            reserve,
            ..
        } => cli::keys::run(&config, &endpoint, cost, reserve),
        Command::Keys { library: true, .. } => cli::keys::print_library(),
        Command::Keys { .. } => cli::keys::print_script(),
        Command::Search {
            job,
            query,
            limit,
            json,
        } => cli::search::run(&config, &job, &query, limit, json).await,
        Command::Spool {
            action: SpoolAction::List { job, json },
        } => cli::spool::list(&config, job.as_deref(), json),
        Command::Spool {
            action: SpoolAction::Retry { job },
        } => cli::spool::retry(&config, &job).await,
        Command::Unblock {
            credential,
            resource,
            drift,
        } => cli::unblock::run(&config, &credential, resource.as_deref(), drift).await,
        Command::State {
            reset: Some(StateCommand::Reset { job, item, since }),
            ..
        } => cli::state::reset(&config, &job, item.as_deref(), since.as_deref()).await,
        Command::State {
            job: Some(job),
            item,
            json,
            ..
        } => cli::state::show(&config, &job, item.as_deref(), json).await,
        // clap requires JOB without `reset`.
        Command::State { .. } => Exit::Usage,
        Command::Run => cli::run::run(config).await,
        Command::Reload { pid, timeout } => cli::reload::run(&config, pid, timeout).await,
        Command::Trigger { job, wait } => cli::trigger::run(&config, &job, wait).await,
        Command::Demo { for_, out } => {
            let out = out.unwrap_or_else(|| {
                std::env::temp_dir().join(format!(
                    "quota-worker-demo-{}",
                    chrono::Utc::now().format("%Y%m%d-%H%M%S")
                ))
            });
            cli::demo::run(config, for_, &out).await
        }
        // Done by `generate`, before any config was read.
        Command::Completions { .. } | Command::Manpages { .. } => Exit::Ok,
    }
}
