//! `antidote breaker close`: an operator's decision on a partition held by
//! its policy's diversion circuit breaker, written as a marker to the DLT
//! (never through an admin endpoint), which every instance reads back.
//!
//! Without `--divert-through` the breaker closes and the held record is
//! judged again (it diverts, and the breaker trips again if the poison is
//! still systemic). With `--divert-through OFFSET` the diversions up to
//! that offset are accepted and the breaker re-arms after it.

use std::io::Write;
use std::path::PathBuf;

use super::{Context, DltError};
use crate::dlt::trust::{self, Reader};
use crate::dlt_marker::{BreakerMark, Marker};
use crate::policy::Class;

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
    let policy = ctx
        .policies
        .for_topic(&args.topic)
        .filter(|p| p.breaker.is_some())
        .ok_or_else(|| {
            DltError::Usage(format!(
                "no policy with a `breaker:` covers topic {}",
                args.topic
            ))
        })?;
    let dlt = policy.dead_letter_topic(&args.topic, Class::Poison);
    let mut cluster = ctx.dead_letter_cluster()?;
    let n = cluster
        .partitions(&dlt)
        .await?
        .filter(|n| *n > 0)
        .ok_or_else(|| DltError::Usage(format!("dead-letter topic {dlt} does not exist")))?;
    let partition = args.partition.rem_euclid(n as i32);
    // The partition's breaker state as the fleet's markers tell it.
    let (mut open_at, mut closed): (Option<i64>, Option<i64>) = (None, None);
    crate::dlt::read_partition(&mut cluster, &dlt, partition, &mut |p, r| {
        let Some(c) = trust::open(Reader::Replay, &dlt, p, r) else {
            return;
        };
        if let Some(Marker::Breaker(m)) = Marker::parse(&c, r.key) {
            if m.topic != args.topic || m.partition != args.partition {
                return;
            }
            if m.open {
                if open_at.is_none() && closed.is_none_or(|c| m.through > c) {
                    open_at = Some(m.through);
                }
            } else if open_at.is_some_and(|a| a <= m.through) || m.divert {
                open_at = None;
                closed = Some(m.through.max(closed.unwrap_or(i64::MIN)));
            }
        }
    })
    .await?;
    let (through, divert) = match (args.divert_through, open_at) {
        (Some(d), _) => (d, true),
        (None, Some(at)) => (at, false),
        (None, None) => {
            writeln!(
                out,
                "not open          {}-{}: no breaker marker holds it; nothing written",
                args.topic, args.partition
            )?;
            return Ok(());
        }
    };
    let mark = Marker::Breaker(BreakerMark {
        topic: args.topic.clone(),
        partition: args.partition,
        open: false,
        through,
        divert,
    });
    let record = mark.to_record(crate::clock::now_ms(), &trust::seal(&dlt, partition));
    super::replay::produce(&mut cluster, &dlt, partition, &record).await?;
    if divert {
        writeln!(out, "closed            {}-{}: diversions accepted through offset {through}; the breaker re-arms after it", args.topic, args.partition)?;
    } else {
        writeln!(
            out,
            "closed            {}-{} at offset {through}: the held record is judged again",
            args.topic, args.partition
        )?;
    }
    Ok(())
}
