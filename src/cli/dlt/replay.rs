//! `antidote dlt replay`: re-drive dead-lettered records to their original
//! topic (or `--to TOPIC`) once their cause is fixed. Dry run unless
//! `--execute`.
//!
//! The replay is `service::replay` (the console's preview and execute
//! too); this module owns the command line, the per-record lines on
//! stdout and the progress line on stderr.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{Context, DltError};
use crate::service::replay::{Outcome, ReplayPlan, Report, Sink};

/// Arguments of `antidote dlt replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The proxy's config file (the cluster and the CURRENT policies).
    #[arg(long, short)]
    pub config: PathBuf,
    #[command(flatten)]
    pub plan: ReplayPlan,
}

/// Run `dlt replay`; per-record lines go to `out`, progress to stderr.
pub async fn run(args: &ReplayArgs, out: &mut dyn Write) -> Result<Report, DltError> {
    let ctx = Context::load(&args.config)?;
    let mut sink = Lines {
        out,
        progress: Progress::new(args.plan.execute),
    };
    let report = crate::service::replay::run(&ctx, &args.plan, &mut sink).await?;
    sink.out.flush()?;
    sink.progress.finish(&report);
    if !args.plan.execute && report.would_replay > 0 {
        eprintln!("dry run: nothing was written; add --execute to replay");
    }
    Ok(report)
}

/// Each outcome as its line on `out`, and the progress line.
struct Lines<'a> {
    out: &'a mut dyn Write,
    progress: Progress,
}

impl Sink for Lines<'_> {
    fn outcome(&mut self, o: Outcome, _: &Report) -> Result<(), DltError> {
        writeln!(self.out, "{}", o.line())?;
        Ok(())
    }

    fn notice(&mut self, text: &str) {
        eprintln!("{text}");
    }

    fn progress(&mut self, report: &Report) {
        self.progress.tick(report);
    }
}

/// The progress line on stderr: an `indicatif` line redrawn in place when
/// stderr is a terminal; otherwise (a log, a pipe) a plain line at most once
/// a second and a final one, which scripts read.
enum Progress {
    Terminal {
        bar: ProgressBar,
        execute: bool,
    },
    Plain {
        execute: bool,
        last: Option<Instant>,
    },
}

impl Progress {
    fn new(execute: bool) -> Self {
        if !std::io::stderr().is_terminal() {
            return Progress::Plain {
                execute,
                last: None,
            };
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        Progress::Terminal { bar, execute }
    }

    fn tick(&mut self, report: &Report) {
        match self {
            // indicatif limits redraws itself (20 per second by default).
            Progress::Terminal { bar, execute } => bar.set_message(report.line(*execute)),
            Progress::Plain { execute, last } => {
                let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
                if due {
                    *last = Some(Instant::now());
                    eprintln!("{}", report.line(*execute));
                }
            }
        }
    }

    fn finish(&self, report: &Report) {
        match self {
            Progress::Terminal { bar, execute } => bar.finish_with_message(report.line(*execute)),
            Progress::Plain { execute, .. } => eprintln!("{}", report.line(*execute)),
        }
    }
}
