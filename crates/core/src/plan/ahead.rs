//! Judging ahead: a helper judges a later stretch of one partition's
//! batches while the planner walks the partition from its start, so one
//! large partition of a Fetch response is judged on more than one core.
//!
//! A helper only fills the verdict cache. The planner stays the only one
//! that decides what is sent, diverted or held: it finds the helper's
//! verdicts in the cache, or waits for the batch a helper is judging at
//! that moment (the cache lets one caller judge a batch and the others
//! wait), or judges a batch itself if the helper has not reached it yet
//! (the helper then finds it judged and skips it). So nothing about the
//! outcome depends on which thread got where first; only who spent the
//! CPU does.
//!
//! A helper stops at the first segment it cannot judge (a legacy message
//! set, trailing bytes, a batch that does not decode): the planner reaches
//! it and decides, as it would alone. It never takes more than half of
//! the decode budget, so a planner is not held for lack of budget because
//! a helper was decoding.

use std::ops::Range;

use super::budget::decode_within;
use super::planner::{Env, PartitionInput};
use crate::kafka::batch::{self, Segment};
use crate::kafka::compression::Compression;

/// Judge the data batches of `input` that start within `bytes` of its
/// records section (batch boundaries decide: a batch belongs to the
/// stretch its first byte is in), putting their verdicts in
/// `env.verdicts`. Returns the records this call judged.
pub fn judge_ahead(input: &PartitionInput<'_>, env: &Env<'_>, bytes: Range<usize>) -> u64 {
    let (policy, topic) = (input.policy, input.topic);
    let mut judged = 0u64;
    let mut at = 0usize;
    for seg in batch::segments(input.records) {
        let start = at;
        at += seg.bytes().len();
        if start < bytes.start {
            continue;
        }
        if start >= bytes.end {
            break;
        }
        let Segment::Batch(b) = seg else { break };
        if b.is_control() {
            continue;
        }
        if env
            .verdicts
            .lookup(policy, topic, input.partition, &b)
            .is_some()
        {
            continue;
        }
        let compressed = !matches!(b.compression(), None | Some(Compression::None));
        if compressed && env.budget.used() > env.budget.limit() / 2 {
            break;
        }
        let Ok((decoded, _memory)) = decode_within(&b, env.budget) else {
            break;
        };
        let here =
            env.verdicts
                .judge_ahead(policy, (topic, input.partition), &b, &decoded, input.now_ms);
        if here {
            judged += decoded.len() as u64;
        }
    }
    judged
}

/// `len` bytes cut into `parts` stretches of about the same size, in
/// order: the planner takes the first, helpers the others.
pub fn stretches(len: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    (0..parts)
        .map(|i| len * i / parts..len * (i + 1) / parts)
        .collect()
}
