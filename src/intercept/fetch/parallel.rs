//! Planning the partitions of one Fetch response on more than one core.
//! Small responses are planned on the connection's task alone. Larger ones
//! put every partition but the first on a blocking thread, and give the
//! cores left idle to helpers that judge ahead in the largest partitions
//! (`plan::judge_ahead`), so even a response of one partition is judged on
//! several cores. Idle means not planning any response (every connection's
//! planners and helpers are counted): a helper costs more CPU per record
//! (6-15 % measured when judging ahead was built, see git history of BENCHMARKS.md: batches decoded twice, work handed between
//! threads), worth it only on a core that would otherwise wait;
//! `limits.judge_ahead: false` turns helpers off. Helpers never cut a
//! partition into stretches smaller than [`STRETCH_MIN_BYTES`].

use std::cmp::Reverse;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bytes::Bytes;

use super::{cpu_of, FetchFilter, FilterError};
use crate::dlt::blocked::Gate;
use crate::dlt::ledger::Ledger;
use crate::metrics::{self, Observation};
use crate::plan::budget::DecodeBudget;
use crate::plan::verdicts::VerdictCache;
use crate::plan::{self, PartitionPlan, Visibility};

/// Responses with less than this much record data across partitions are
/// planned on the connection's task alone (a thread hand-off costs more).
const PARALLEL_MIN_BYTES: usize = 256 * 1024;

/// One partition of a Fetch response to plan.
pub(super) struct PartitionJob {
    /// (topic index, partition index) in the response.
    pub(super) at: (usize, usize),
    pub(super) policy: Arc<crate::policy::Policy>,
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) records: Bytes,
    pub(super) vis: Visibility,
    /// The partition's blocked keys, for a per_key policy only.
    pub(super) gate: Option<Gate>,
    /// When judging this response should stop (`limits.judge_deadline`).
    pub(super) deadline: Option<Instant>,
}

impl PartitionJob {
    pub(super) fn plan(
        &self,
        now_ms: i64,
        verdicts: &VerdictCache,
        budget: &Arc<DecodeBudget>,
        ledger: &Ledger,
    ) -> PartitionPlan {
        let env = plan::Env {
            verdicts,
            budget,
            already: &|from, to| ledger.diverted_in(&self.topic, self.partition, from, to),
        };
        let input = self.input(now_ms);
        match &self.gate {
            Some(gate) => plan::plan_partition_keyed(&input, &env, gate),
            None => plan::plan_partition_with(&input, &env),
        }
    }

    fn input(&self, now_ms: i64) -> plan::PartitionInput<'_> {
        plan::PartitionInput {
            policy: &self.policy,
            topic: &self.topic,
            partition: self.partition,
            records: &self.records,
            visibility: &self.vis,
            now_ms,
            deadline: self.deadline,
        }
    }

    /// Judge the batches starting in `stretch` of the records section
    /// ahead of the planner (`plan::judge_ahead`); the records judged.
    fn judge_ahead(
        &self,
        now_ms: i64,
        verdicts: &VerdictCache,
        budget: &Arc<DecodeBudget>,
        stretch: std::ops::Range<usize>,
    ) -> u64 {
        let env = plan::Env {
            verdicts,
            budget,
            already: &|_, _| Vec::new(),
        };
        let input = self.input(now_ms);
        plan::judge_ahead(&input, &env, stretch)
    }
}

impl FetchFilter {
    /// Plan every partition, in order. When the partitions carry at least
    /// [`PARALLEL_MIN_BYTES`] in all, all but the first are planned on
    /// blocking threads while this task plans the first, and the cores
    /// left idle judge ahead in the largest partitions, so one
    /// Fetch response can use more than one core.
    pub(super) async fn plan_all(
        &self,
        mut jobs: Vec<Arc<PartitionJob>>,
        now_ms: i64,
        seen: &mut Observation,
    ) -> Result<Vec<((usize, usize), PartitionPlan)>, FilterError> {
        let sizes: Vec<usize> = jobs.iter().map(|j| j.records.len()).collect();
        let bytes: usize = sizes.iter().sum();
        let idle = match self.judge_ahead {
            true => cores().saturating_sub(PLANNING.load(Ordering::Relaxed)),
            false => 0,
        };
        let helpers = helpers(&sizes, idle);
        // A response with a judging deadline does not wait for its helpers:
        // they judge on for the client's next fetch.
        let wait_for_helpers = jobs.iter().all(|j| j.deadline.is_none());
        let _planning = Planning::enter(jobs.len());
        let alone = jobs.len() < 2 && helpers.iter().all(|h| *h == 0);
        let (verdicts, budget) = (&self.engine.verdicts, &self.engine.budget);
        let mut here = |j: &Arc<PartitionJob>| {
            let (plan, cpu) = cpu_of(|| j.plan(now_ms, verdicts, budget, &self.ledger));
            seen.cpu += cpu;
            (j.at, plan)
        };
        if alone || bytes < PARALLEL_MIN_BYTES {
            return Ok(jobs.iter().map(here).collect());
        }
        // Helpers first, so they start while the partitions are planned.
        let mut ahead = Vec::new();
        for (job, &h) in jobs.iter().zip(&helpers) {
            for stretch in plan::stretches(job.records.len(), h + 1)
                .into_iter()
                .skip(1)
            {
                let (j, verdicts) = (job.clone(), self.engine.verdicts.clone());
                let budget = self.engine.budget.clone();
                let planning = Planning::enter(1);
                ahead.push(tokio::task::spawn_blocking(move || {
                    let _planning = planning;
                    judge_ahead(|| j.judge_ahead(now_ms, &verdicts, &budget, stretch));
                }));
            }
        }
        let rest: Vec<_> = jobs
            .drain(1..)
            .map(|j| {
                let (verdicts, ledger) = (self.engine.verdicts.clone(), self.ledger.clone());
                let budget = self.engine.budget.clone();
                tokio::task::spawn_blocking(move || {
                    (j.at, cpu_of(|| j.plan(now_ms, &verdicts, &budget, &ledger)))
                })
            })
            .collect();
        let mut out = Vec::with_capacity(rest.len() + 1);
        out.extend(jobs.iter().map(&mut here));
        for handle in rest {
            let (at, (plan, cpu)) = handle.await?;
            seen.cpu += cpu;
            out.push((at, plan));
        }
        // Done already unless a plan stopped (held or cut) before their stretch.
        if wait_for_helpers {
            for handle in ahead {
                handle.await?;
            }
        }
        Ok(out)
    }

    /// Judge in the background what the judging deadline cut from each
    /// partition of `planned` (`plan::Cut`), so that the client's next
    /// fetch, which starts at the cut, finds its verdicts ready. At most
    /// one such job per core at once (each holds its response's bytes), on
    /// threads of the lowest priority (`run_behind`); past that, the next
    /// fetch judges the rest itself.
    pub(super) fn judge_behind(
        &self,
        jobs: &[Arc<PartitionJob>],
        planned: &[((usize, usize), PartitionPlan)],
        now_ms: i64,
        seen: &mut Observation,
    ) {
        for (at, plan) in planned {
            let Some(cut) = plan.cut else { continue };
            seen.deadline_cuts += 1;
            let Some(job) = jobs.iter().find(|j| j.at == *at) else {
                continue;
            };
            let (j, verdicts) = (job.clone(), self.engine.verdicts.clone());
            let budget = self.engine.budget.clone();
            // Not counted in PLANNING: at nice 19 it leaves its core to
            // any planner or helper.
            run_behind(Box::new(move || {
                let rest = cut.at..j.records.len();
                judge_ahead(|| j.judge_ahead(now_ms, &verdicts, &budget, rest));
            }));
        }
    }
}

/// Judge ahead in the background (`judge`: how many records it judged),
/// reporting the CPU it took and the records: work for a later response,
/// so not any response's observation.
fn judge_ahead(judge: impl FnOnce() -> u64) {
    let (n, cpu) = cpu_of(judge);
    metrics::global().fetch_rewrite_cpu(cpu);
    metrics::global().judged_ahead(n);
}

/// A job judging behind a cut.
type BehindJob = Box<dyn FnOnce() + Send>;

/// Hand `job` to a free background judging thread, or drop it if every
/// one is busy (the next fetch then judges those batches itself). One thread per core, started on first
/// use, each at the lowest priority (nice 19; Linux's nice is per thread),
/// so that judging behind a cut yields its core at once to a response
/// being planned. Not SCHED_IDLE: a planner may wait for a batch one of
/// these threads is judging, and nice 19 still runs on a busy core.
fn run_behind(job: BehindJob) {
    static QUEUE: OnceLock<Option<SyncSender<BehindJob>>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        // A rendezvous channel: a job is taken only by a thread waiting for one.
        let (tx, rx) = std::sync::mpsc::sync_channel::<BehindJob>(0);
        let rx = Arc::new(Mutex::new(rx));
        let mut started = false;
        for i in 0..cores() {
            let rx = rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("antidote-behind-{i}"))
                .spawn(move || {
                    lowest_priority();
                    loop {
                        let job = match rx.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        match job {
                            // A job that panics costs its verdicts, not the thread.
                            Ok(job) => {
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                            }
                            Err(_) => return,
                        }
                    }
                });
            started |= thread.is_ok();
        }
        started.then_some(tx)
    });
    if let Some(tx) = queue {
        let _ = tx.try_send(job);
    }
}

/// Nice 19 for the calling thread (Linux; elsewhere nothing).
fn lowest_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id touches no memory.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
    }
}

/// The smallest stretch of a partition worth a helper: about 1,000
/// records of 250 bytes, a millisecond of judging, against tens of
/// microseconds to hand work to a blocking thread.
pub(super) const STRETCH_MIN_BYTES: usize = 256 * 1024;

/// The cores this process may run on (its CPU affinity and cgroup quota),
/// read once.
pub(super) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Partitions being planned and helpers judging, over all connections.
static PLANNING: AtomicUsize = AtomicUsize::new(0);

/// Counts `n` planners and helpers in [`PLANNING`] while it lives.
struct Planning(usize);

impl Planning {
    fn enter(n: usize) -> Planning {
        PLANNING.fetch_add(n, Ordering::Relaxed);
        Planning(n)
    }
}

impl Drop for Planning {
    fn drop(&mut self) {
        PLANNING.fetch_sub(self.0, Ordering::Relaxed);
    }
}

/// Helpers per partition, for partitions of `sizes` bytes and `cores`
/// idle cores: each partition is planned on a core of its own, and the
/// cores left over go one at a time to the largest partitions whose
/// stretches would stay at least [`STRETCH_MIN_BYTES`] long.
pub(super) fn helpers(sizes: &[usize], cores: usize) -> Vec<usize> {
    let mut out = vec![0usize; sizes.len()];
    let mut spare = cores.saturating_sub(sizes.len());
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| Reverse(sizes[i]));
    while spare > 0 {
        let mut gave = false;
        for &i in &order {
            if spare > 0 && sizes[i] / (out[i] + 2) >= STRETCH_MIN_BYTES {
                out[i] += 1;
                spare -= 1;
                gave = true;
            }
        }
        if !gave {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn one_large_partition_gets_every_other_core() {
        assert_eq!(helpers(&[MIB], 2), [1]);
        assert_eq!(helpers(&[MIB], 4), [3]);
        // 1 MiB makes four stretches of 256 KiB, not more.
        assert_eq!(helpers(&[MIB], 16), [3]);
    }

    #[test]
    fn small_partitions_and_busy_cores_get_none() {
        assert_eq!(helpers(&[STRETCH_MIN_BYTES * 2 - 1], 8), [0]);
        assert_eq!(helpers(&[MIB, MIB], 2), [0, 0]);
        assert_eq!(helpers(&[MIB, MIB, MIB], 2), [0, 0, 0]);
        assert_eq!(helpers(&[], 4), Vec::<usize>::new());
        assert_eq!(helpers(&[MIB], 1), [0]);
    }

    #[test]
    fn spare_cores_go_to_the_largest_partitions_first() {
        assert_eq!(helpers(&[MIB, 4 * MIB, 100], 4), [0, 1, 0]);
        assert_eq!(helpers(&[MIB, 4 * MIB, 100], 6), [1, 2, 0]);
        assert_eq!(helpers(&[4 * MIB, 4 * MIB], 8), [3, 3]);
    }
}
