//! The `antidote` binary: command-line entry points over the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use antidote::config::Config;
use antidote::policy::PolicySet;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "antidote",
    version,
    about = "A Kafka proxy that keeps poison records away from consumers"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy in the foreground until SIGINT or SIGTERM.
    Run {
        /// Config file; `ANTIDOTE_CONFIG` when not given.
        #[arg(long, short, env = "ANTIDOTE_CONFIG")]
        config: PathBuf,
    },
    /// Validate the config and every policy file it names; exit non-zero on any error.
    Check {
        /// Config file; `ANTIDOTE_CONFIG` when not given.
        #[arg(long, short, env = "ANTIDOTE_CONFIG")]
        config: PathBuf,
    },
    /// Dead-letter topics: inspect them, replay records from them.
    Dlt {
        #[command(subcommand)]
        command: DltCommand,
    },
}

#[derive(Subcommand)]
enum DltCommand {
    /// List or summarise the records of a dead-letter topic (read-only).
    Inspect(Box<antidote::dlt::InspectArgs>),
    /// Re-drive dead-lettered records to their original topic (dry run unless --execute).
    Replay(Box<antidote::dlt::ReplayArgs>),
    /// Give up a blocked key's parked records (ordering: per_key), releasing the key (dry run unless --execute).
    Discard(Box<antidote::dlt::discard::DiscardArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Dlt { command } => dlt(command),
        Command::Check { config } => match load(&config) {
            Ok(_) => {
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in errors {
                    eprintln!("{e}");
                }
                ExitCode::FAILURE
            }
        },
    }
}

/// The config and its policies, or every error found in them.
/// The config and its policies, or every error found in them (policies and
/// TLS files are all checked, so one run reports everything).
fn load(path: &Path) -> Result<(Config, PolicySet), Vec<String>> {
    let config = Config::load(path).map_err(|e| vec![e.to_string()])?;
    let mut errors = antidote::transport::tls::check(&config);
    let policies = PolicySet::load(&config.policies)
        .map_err(|errs| errors.extend(errs.into_iter().map(|e| e.to_string())));
    match policies {
        Ok(p) if errors.is_empty() => Ok((config, p)),
        _ => Err(errors),
    }
}

/// glibc's malloc raises its mmap threshold each time a large block is
/// freed (up to 32 MiB); after that, freed decode buffers stay in the
/// per-thread arenas, and RSS grows past `limits.decode_budget` although
/// live memory does not (measured: 418 MB of growth for a 64 MiB budget in
/// `tests/test_lying_broker.py`, 94 MB with this). A fixed threshold keeps
/// every block of 4 MiB or more (decompressed batches, record indexes, large
/// responses) in a mapping of its own, returned to the system when freed;
/// ordinary responses stay below it and keep reusing arena memory.
fn return_large_blocks_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
    }
}

fn run(path: &Path) -> ExitCode {
    let (config, policies) = match load(path) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                tracing::error!("{e}");
            }
            return ExitCode::FAILURE;
        }
    };
    antidote::policy::set_log_record_contents(config.logging.record_contents);
    return_large_blocks_to_the_os();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(antidote::proxy::run(config, policies)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn dlt(command: DltCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let result = runtime.block_on(async {
        match &command {
            DltCommand::Inspect(args) => antidote::dlt::inspect::run(args, &mut out).await.map(|()| true),
            DltCommand::Discard(args) => antidote::dlt::discard::run(args, &mut out).await.map(|_| true),
            DltCommand::Replay(args) => antidote::dlt::replay::run(args, &mut out).await.map(|report| {
                if report.failed > 0 {
                    eprintln!("{} record(s) failed to replay; run the same command again to retry them", report.failed);
                }
                report.failed == 0
            }),
        }
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        // Some records could not be written: 2, distinct from a usage or connection error.
        Ok(false) => ExitCode::from(2),
        Err(antidote::dlt::DltError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("ANTIDOTE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
