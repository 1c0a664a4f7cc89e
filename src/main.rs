//! The `antidote` binary: command-line entry points over the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "antidote", version, about = "A Kafka proxy that keeps poison records away from consumers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy in the foreground until SIGINT or SIGTERM.
    Run {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate the config and every policy file it names.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => {
            let _ = config;
            ExitCode::FAILURE
        }
        Command::Check { config } => match antidote::config::Config::load(&config) {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}
