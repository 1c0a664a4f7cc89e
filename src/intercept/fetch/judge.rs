//! The judging steps every consumer kind shares, between building the
//! partition jobs and delivering: plan each partition (`parallel`),
//! resolve registry misses and plan again (`transient`), judge on in the
//! background past a deadline cut, and where the circuit breaker cuts.
//! What was judged is reported once per partition when it is delivered
//! (`fetch::count`). A Fetch and a ShareFetch differ only in what
//! they do with the plans (hold by offset, or settle by acquisition).

use std::sync::Arc;

use bytes::Bytes;
use uuid::Uuid;

use super::parallel::PartitionJob;
use super::{FetchFilter, FilterError};
use crate::metrics::Observation;
use crate::plan::PartitionPlan;

impl FetchFilter {
    /// Plan `jobs` (with registry misses resolved, within the registry's
    /// wait); each plan with where it is in the response.
    pub(super) async fn judge(
        &self,
        jobs: &[Arc<PartitionJob>],
        now: i64,
        seen: &mut Observation,
    ) -> Result<Vec<((usize, usize), PartitionPlan)>, FilterError> {
        let mut planned = self.plan_all(jobs.to_vec(), now, seen).await?;
        if let Some(registry) = self.engine.registry() {
            self.resolve_transient(registry, jobs, &mut planned, now)
                .await?;
        }
        self.judge_behind(jobs, &planned, now, seen);
        Ok(planned)
    }

    /// The offset from which `plan`'s diversions must not be written: the
    /// circuit breaker is open or trips there (`None`: write them all).
    /// A record in its DLT already is neither counted nor cut.
    pub(super) fn breaker_cut(&self, plan: &PartitionPlan) -> Option<i64> {
        let ledger = self.dead_letter.ledger();
        self.breakers.cut(plan, |d| {
            ledger.contains(&(d.origin_topic.clone(), d.origin_partition, d.origin_offset))
        })
    }

    /// Tell the ledger topic `name`'s id, as a response names it, but only
    /// from a topic entry that proves the id is live: a partition with
    /// records and no error. An entry that carries only an error (a client
    /// still asking by a deleted topic's id, answered UNKNOWN_TOPIC_ID)
    /// proves nothing, and believing it would wipe the ledger's entries of
    /// the topic recreated under that name.
    pub(super) fn observe_topic_id<'a>(
        &self,
        name: &Arc<str>,
        id: Uuid,
        partitions: impl IntoIterator<Item = (i16, Option<&'a Bytes>)>,
    ) {
        let live = partitions
            .into_iter()
            .any(|(error, records)| error == 0 && records.is_some_and(|r| !r.is_empty()));
        if live {
            self.dead_letter.ledger().observe_topic_id(name, id);
        }
    }
}
