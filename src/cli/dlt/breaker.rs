//! `antidote breaker close`: an operator's decision on a partition held by
//! its policy's diversion circuit breaker, written as a marker to the DLT,
//! which every instance reads back. The close itself is
//! `service::breaker::close` (the console's close action too).

use std::io::Write;
use std::path::PathBuf;

use super::{Context, DltError};

/// Arguments of `antidote breaker close`.
#[derive(Debug, Clone, clap::Args)]
pub struct CloseArgs {
    /// The proxy's config file (the cluster and the policies).
    #[arg(long, short)]
    pub config: PathBuf,
    /// The origin topic whose partition is held.
    #[arg(long)]
    pub topic: String,
    #[arg(long)]
    pub partition: i32,
    /// Accept the diversions up to this origin offset; re-arm after it.
    #[arg(long, value_name = "OFFSET")]
    pub divert_through: Option<i64>,
}

/// Write the close marker; what was done, as a line.
pub async fn close(args: &CloseArgs, out: &mut dyn Write) -> Result<(), DltError> {
    let ctx = Context::load(&args.config)?;
    let closed =
        crate::service::breaker::close(&ctx, &args.topic, args.partition, args.divert_through)
            .await?;
    writeln!(out, "{}", closed.line(&args.topic, args.partition))?;
    Ok(())
}
