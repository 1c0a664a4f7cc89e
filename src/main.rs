//! The `antidote` binary: command-line entry points over the library.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use antidote::config::Config;
use antidote::policy::PolicySet;
use antidote::proxy::reload::Stamp;
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
        /// Also check that the brokers and the schema registry answer.
        #[arg(long)]
        connect: bool,
    },
    /// Dead-letter topics: inspect them, replay records from them.
    Dlt {
        #[command(subcommand)]
        command: DltCommand,
    },
    /// The diversion circuit breaker of a policy (`breaker:`).
    Breaker {
        #[command(subcommand)]
        command: BreakerCommand,
    },
}

#[derive(Subcommand)]
enum BreakerCommand {
    /// Close a partition's breaker (a marker in its DLT every instance reads):
    /// the held record is judged again, or with --divert-through the
    /// diversions up to that offset are accepted.
    Close(Box<antidote::cli::dlt::breaker::CloseArgs>),
}

#[derive(Subcommand)]
enum DltCommand {
    /// List or summarise the records of a dead-letter topic (read-only).
    Inspect(Box<antidote::cli::dlt::InspectArgs>),
    /// Re-drive dead-lettered records to their original topic (dry run unless --execute).
    Replay(Box<antidote::cli::dlt::ReplayArgs>),
    /// Give up a blocked key's parked records (ordering: per_key), releasing the key (dry run unless --execute).
    Discard(Box<antidote::cli::dlt::discard::DiscardArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Dlt { command } => dlt(command),
        Command::Breaker {
            command: BreakerCommand::Close(args),
        } => breaker_close(&args),
        Command::Check { config, connect } => match load(&config) {
            Ok((cfg, _, _)) => {
                println!("{}: ok", config.display());
                report_registry(&cfg);
                if cfg.dead_letter.signing_keys.is_empty() {
                    eprintln!("{}: warning: dead_letter.signing_keys is not set: what antidote reads back from its DLTs is trusted by its frame alone, so anyone who can write a DLT can forge it; let only antidote's principal write the DLTs (ACLs), and set signing keys for a fleet (docs/guarantees.md)", config.display());
                }
                if connect && !check_connect(&cfg) {
                    return ExitCode::FAILURE;
                }
                if connect {
                    check_dlts(&config);
                }
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
fn load(path: &Path) -> Result<(Config, PolicySet, Stamp), Vec<String>> {
    let config = Config::load(path).map_err(|e| vec![e.to_string()])?;
    let mut errors = antidote::transport::tls::check(&config);
    // Before the policies are read: an edit made from here on is a change
    // the reload watcher sees.
    let loaded = antidote::proxy::reload::fingerprint(&config.policies);
    let policies = PolicySet::load(&config.policies)
        .map_err(|errs| errors.extend(errs.into_iter().map(|e| e.to_string())));
    if let Ok(p) = &policies {
        if p.uses_registry() && config.schema_registry.is_none() {
            errors.push(format!(
                "{}: a policy sets `registry: true`, so `schema_registry` is required",
                path.display()
            ));
        }
    }
    match policies {
        Ok(p) if errors.is_empty() => Ok((config, p, loaded)),
        _ => Err(errors),
    }
}

/// What `antidote check` says of `schema_registry` (never the password).
fn report_registry(cfg: &Config) {
    let Some(r) = &cfg.schema_registry else {
        return;
    };
    let urls: Vec<String> = r.url.iter().map(|u| u.to_string()).collect();
    let auth = r
        .basic_auth
        .as_ref()
        .map_or("none".to_string(), |a| format!("basic ({})", a.username));
    println!(
        "schema_registry: {} (tried in order); auth {auth}; tls {}; timeout {:?}; cache_ttl {:?}",
        urls.join(", "),
        if r.tls.is_some() { "on" } else { "off" },
        r.timeout,
        r.cache_ttl
    );
}

/// `check --connect`: every bootstrap broker accepts a TCP connection and
/// every registry URL answers HTTP. One line each; false if any fails.
fn check_connect(cfg: &Config) -> bool {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        eprintln!("cannot start the runtime");
        return false;
    };
    rt.block_on(async {
        let mut ok = true;
        for b in &cfg.upstream.bootstrap_servers {
            let addr = (b.host.as_str(), b.port);
            let c = tokio::time::timeout(
                cfg.upstream.connect_timeout,
                tokio::net::TcpStream::connect(addr),
            )
            .await;
            match c {
                Ok(Ok(_)) => println!("broker {b}: answers"),
                Ok(Err(e)) => {
                    ok = false;
                    eprintln!("broker {b}: {e}")
                }
                Err(_) => {
                    ok = false;
                    eprintln!(
                        "broker {b}: no answer in {:?}",
                        cfg.upstream.connect_timeout
                    )
                }
            }
        }
        if let Some(r) = &cfg.schema_registry {
            let reg =
                match antidote::registry::Registry::new(r, antidote::policy::SchemaCache::new()) {
                    Ok(reg) => reg,
                    Err(e) => {
                        eprintln!("{e}");
                        return false;
                    }
                };
            for (url, result) in reg.probe().await {
                match result {
                    Ok(s) if (200..300).contains(&s) => println!("schema registry {url}: answers"),
                    Ok(s) => {
                        ok = false;
                        eprintln!("schema registry {url}: answers HTTP {s}")
                    }
                    Err(e) => {
                        ok = false;
                        eprintln!("schema registry {url}: {e}")
                    }
                }
            }
        }
        ok
    })
}

/// `check --connect`: report each DLT whose configuration can break a
/// promise (retention, cleanup policy, durability); warnings only.
fn check_dlts(path: &Path) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let found = rt.block_on(async {
        let ctx = antidote::cli::dlt::Context::load(path)?;
        antidote::cli::dlt::check::dlt_warnings(&ctx).await
    });
    match found {
        Ok(lines) if lines.is_empty() => {
            println!("dead-letter topics: no configuration breaks a promise")
        }
        Ok(lines) => lines
            .iter()
            .for_each(|l| eprintln!("{}: warning: {l}", path.display())),
        Err(e) => eprintln!(
            "{}: warning: dead-letter topics not checked: {e}",
            path.display()
        ),
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
///
/// Setting the mmap threshold also freezes glibc's trim threshold at its
/// 128 KiB default: every freed response at the top of an arena was then
/// given back to the kernel and faulted in again by the next one (115,000-
/// 158,000 page faults and ~250 ns of CPU per judged record, 1 M records,
/// `scripts/bench/deterministic.py`). Keeping up to 16 MiB free per arena
/// top brings that to 1,400-19,000 faults (−10 % CPU per judged record)
/// for ~8 MB more RSS in that bench. What an arena keeps is multiplied by
/// the arenas, so they are capped at one per core: under the decompression
/// bombs of `tests/test_lying_broker.py` (64 MiB budget) peak growth was
/// 99 MB without the trim setting, 151-157 MB with it and glibc's default
/// 8 arenas per core, 113 MB with one per core.
fn return_large_blocks_to_the_os() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let arenas = libc::c_int::try_from(cores.max(2)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets allocator parameters; called before any
        // other thread exists.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

fn run(path: &Path) -> ExitCode {
    let (config, policies, loaded) = match load(path) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                tracing::error!("{e}");
            }
            return ExitCode::FAILURE;
        }
    };
    antidote::policy::set_log_record_contents(config.logging.record_contents);
    match config.dead_letter.keys() {
        Ok(keys) => antidote::dlt::trust::set_keys(keys),
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    }
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
    match runtime.block_on(antidote::proxy::run(config, policies, loaded)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn breaker_close(args: &antidote::cli::dlt::breaker::CloseArgs) -> ExitCode {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        eprintln!("cannot start the runtime");
        return ExitCode::FAILURE;
    };
    let mut out = std::io::stdout().lock();
    match runtime.block_on(antidote::cli::dlt::breaker::close(args, &mut out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
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
            DltCommand::Inspect(args) => antidote::cli::dlt::inspect::run(args, &mut out).await.map(|()| true),
            DltCommand::Discard(args) => antidote::cli::dlt::discard::run(args, &mut out).await.map(|_| true),
            DltCommand::Replay(args) => antidote::cli::dlt::replay::run(args, &mut out).await.map(|report| {
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
        Err(antidote::cli::dlt::DltError::Output(e))
            if e.kind() == std::io::ErrorKind::BrokenPipe =>
        {
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
