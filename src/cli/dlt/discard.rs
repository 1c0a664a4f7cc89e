//! `antidote dlt discard`: give up a blocked key's parked records
//! (`ordering: per_key`) without replaying them, so the key is released and
//! its new records are delivered again.
//!
//! Nothing is deleted: the records stay in the DLT, and a discard marker
//! (`dlt_marker`) says that the key's records up to an origin offset are
//! given up. The proxy (and every other instance, and a restarted one)
//! reads the marker from the DLT and releases the key; `dlt replay` skips
//! the records it covers when it gathers a key's records. Dry run unless
//! `--execute`.

use crate::dlt::trust::Reader;
use std::io::Write;
use std::path::PathBuf;

use super::{read_dlt, show_bytes, Context, DltError};
use crate::service::replay::keys::{group_of, released, write_marker, GroupKey};

/// Arguments of `antidote dlt discard`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiscardArgs {
    /// The proxy's config file (the cluster and the policies).
    #[arg(long, short)]
    pub config: PathBuf,
    /// The dead-letter topic holding the key's records.
    #[arg(long)]
    pub topic: String,
    /// The key to release (UTF-8).
    #[arg(long)]
    pub key: String,
    /// Only this origin topic.
    #[arg(long)]
    pub origin_topic: Option<String>,
    /// Only this origin partition.
    #[arg(long)]
    pub origin_partition: Option<i32>,
    /// Really write the discard markers; without it nothing is written.
    #[arg(long)]
    pub execute: bool,
}

/// Run `dlt discard`; one line per key and origin partition; the number of
/// groups discarded (or that would be).
pub async fn run(args: &DiscardArgs, out: &mut dyn Write) -> Result<usize, DltError> {
    let ctx = Context::load(&args.config)?;
    let mut cluster = ctx.dead_letter_cluster()?;
    if cluster.partitions(&args.topic).await?.is_none() {
        return Err(DltError::Usage(format!(
            "dead-letter topic {} does not exist",
            args.topic
        )));
    }
    let done = released(&mut cluster, &args.topic).await?;
    let key = args.key.as_bytes();
    let records = read_dlt(Reader::Discard, &mut cluster, &args.topic, |r| {
        r.key.as_deref() == Some(key)
            && args
                .origin_topic
                .as_ref()
                .is_none_or(|t| r.origin_topic.as_ref() == Some(t))
            && args
                .origin_partition
                .is_none_or(|p| r.origin_partition == Some(p))
    })
    .await?;
    let mut groups: std::collections::BTreeMap<GroupKey, (i64, usize)> = Default::default();
    for r in &records {
        let (Some(g), Some(o)) = (group_of(&ctx.policies, r), r.origin_offset) else {
            continue;
        };
        if done.get(&g).is_some_and(|t| o <= *t) {
            continue;
        }
        let e = groups.entry(g).or_insert((o, 0));
        e.0 = e.0.max(o);
        e.1 += 1;
    }
    for (g, (through, n)) in &groups {
        let what = format!(
            "key {} of {}-{}: {n} record(s) through offset {through}",
            show_bytes(Some(&g.2)),
            g.0,
            g.1
        );
        if args.execute {
            write_marker(&mut cluster, &args.topic, g, *through, true).await?;
            writeln!(out, "discarded         {what}")?;
        } else {
            writeln!(out, "would discard     {what}")?;
        }
    }
    if groups.is_empty() {
        writeln!(
            out,
            "nothing to discard: no blocked record of this key in {}",
            args.topic
        )?;
    } else if !args.execute {
        eprintln!("dry run: nothing was written; add --execute to discard");
    }
    Ok(groups.len())
}
