//! Writing a response's diversions to their dead-letter topics before it is
//! released, for every consumer kind: submitted in offset order, retried
//! until `dead_letter.timeout`, and reported per plan as the offsets whose
//! write was not acknowledged in time (a Fetch holds its partition before
//! the first; a ShareFetch withholds them).

use std::time::Duration;

use super::FetchFilter;
use crate::plan::PartitionPlan;

/// Pause before re-submitting a diversion whose write failed.
const RETRY_BACKOFF: Duration = Duration::from_millis(250);

impl FetchFilter {
    /// Write every diversion of `plans`; for each plan, the offsets whose
    /// diversion did not succeed in time, in order (empty if all did).
    pub(crate) async fn divert(&self, plans: &[&PartitionPlan]) -> Vec<Vec<i64>> {
        // Plans that only hold or cut wait for no dead-letter topic.
        if plans.iter().all(|p| p.diversions.is_empty()) {
            return vec![Vec::new(); plans.len()];
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let dl = &self.dead_letter;
        let all_failed = || {
            plans
                .iter()
                .map(|p| p.diversions.iter().map(|d| d.origin_offset).collect())
                .collect()
        };
        if tokio::time::timeout_at(deadline, dl.ready())
            .await
            .map_or(true, |r| r.is_err())
        {
            return all_failed();
        }
        // Submit in offset order (synchronously), then wait for all at once.
        // A write that fails early is retried until the deadline: recovery
        // is quicker, and a consumer held at a poison record does not spin
        // (fetch, fail at once, fetch again) while the DLT is down.
        let mut waits = Vec::new();
        for (plan_idx, plan) in plans.iter().enumerate() {
            for d in &plan.diversions {
                let first = dl.submit(d);
                waits.push(async move {
                    let mut ticket = first;
                    let ok = loop {
                        let outcome = match ticket {
                            Ok(t) => tokio::time::timeout_at(deadline, t.wait()).await,
                            Err(e) => Ok(Err(e)),
                        };
                        match outcome {
                            Ok(Ok(())) => break true,
                            Err(_) => break false, // deadline
                            Ok(Err(_)) => {
                                // Jittered, so held diversions do not retry in step.
                                let pause =
                                    crate::dlt::backoff(0, RETRY_BACKOFF * 2, RETRY_BACKOFF * 2);
                                let retry_at = tokio::time::Instant::now() + pause;
                                if retry_at >= deadline {
                                    tokio::time::sleep_until(deadline).await;
                                    break false;
                                }
                                tokio::time::sleep_until(retry_at).await;
                                ticket = dl.submit(d);
                            }
                        }
                    };
                    (plan_idx, d.origin_offset, ok)
                });
            }
        }
        let mut failed: Vec<Vec<i64>> = vec![Vec::new(); plans.len()];
        for (plan_idx, offset, ok) in futures_join_all(waits).await {
            if !ok {
                failed[plan_idx].push(offset);
            }
        }
        for f in &mut failed {
            f.sort_unstable();
        }
        failed
    }
}

/// Await every future; they all share one deadline, so awaiting them one
/// after another costs no more than awaiting them together.
async fn futures_join_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut out = Vec::with_capacity(futs.len());
    for f in futs {
        out.push(f.await);
    }
    out
}
