//! Closing a partition's diversion circuit breaker: an operator's decision
//! written as a marker to the policy's DLT, which every instance reads
//! back (`dlt::breaker` applies it). Behind `antidote breaker close` and
//! the console's close action.
//!
//! Without `divert_through` the breaker closes and the held record is
//! judged again (it diverts, and the breaker trips again if the poison is
//! still systemic). With `divert_through: OFFSET` the diversions up to
//! that offset are accepted and the breaker re-arms after it.

use super::{Context, DltError};
use crate::dlt::trust::{self, Reader};
use crate::dlt_marker::{BreakerMark, Marker};
use crate::policy::Class;

/// What a close did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// No open marker holds the partition: nothing written.
    NotOpen,
    /// A close marker was written: the held record at `through` is judged
    /// again, or (`divert`) diversions through `through` are accepted.
    At { through: i64, divert: bool },
}

impl Closed {
    /// The line `antidote breaker close` prints.
    pub fn line(&self, topic: &str, partition: i32) -> String {
        match self {
            Closed::NotOpen => format!(
                "not open          {topic}-{partition}: no breaker marker holds it; nothing written"
            ),
            Closed::At { through, divert: true } => format!(
                "closed            {topic}-{partition}: diversions accepted through offset {through}; the breaker re-arms after it"
            ),
            Closed::At { through, divert: false } => format!(
                "closed            {topic}-{partition} at offset {through}: the held record is judged again"
            ),
        }
    }
}

/// Close the breaker of `topic`/`partition` (see the module comment).
pub async fn close(
    ctx: &Context,
    topic: &str,
    partition: i32,
    divert_through: Option<i64>,
) -> Result<Closed, DltError> {
    let policy = ctx
        .policies
        .for_topic(topic)
        .filter(|p| p.breaker.is_some())
        .ok_or_else(|| {
            DltError::Usage(format!("no policy with a `breaker:` covers topic {topic}"))
        })?;
    let dlt = policy.dead_letter_topic(topic, Class::Poison);
    let mut cluster = ctx.dead_letter_cluster()?;
    let n = cluster
        .partitions(&dlt)
        .await?
        .filter(|n| *n > 0)
        .ok_or_else(|| DltError::Usage(format!("dead-letter topic {dlt} does not exist")))?;
    let dlt_partition = partition.rem_euclid(n as i32);
    // The partition's breaker state as the fleet's markers tell it.
    let (mut open_at, mut closed): (Option<i64>, Option<i64>) = (None, None);
    crate::dlt::read_partition(&mut cluster, &dlt, dlt_partition, &mut |p, r| {
        let Some(c) = trust::open(Reader::Replay, &dlt, p, r) else {
            return;
        };
        if let Some(Marker::Breaker(m)) = Marker::parse(&c, r.key) {
            if m.topic != topic || m.partition != partition {
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
    let (through, divert) = match (divert_through, open_at) {
        (Some(d), _) => (d, true),
        (None, Some(at)) => (at, false),
        (None, None) => return Ok(Closed::NotOpen),
    };
    let mark = Marker::Breaker(BreakerMark {
        topic: topic.to_string(),
        partition,
        open: false,
        through,
        divert,
    });
    let record = mark.to_record(crate::clock::now_ms(), &trust::seal(&dlt, dlt_partition));
    super::replay::produce(&mut cluster, &dlt, dlt_partition, &record).await?;
    Ok(Closed::At { through, divert })
}
