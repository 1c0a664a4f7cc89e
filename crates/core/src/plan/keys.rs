//! Per-key ordering (`ordering: per_key`): which records of a partition are
//! parked behind an earlier diverted record of the same key.
//!
//! Owns the planner's side only: the partition's blocked keys come in
//! through [`KeyGate`] (the proxy keeps them, rebuilt from the DLTs), and
//! the keys this plan diverts for the first time are remembered here, so a
//! record after a diverted record of its key is blocked within the same
//! response too. Never consulted for a policy without `per_key`: those pay
//! no key lookup and no hashing.
//!
//! Null keys never block: they name no entity whose order could be broken.
//! A block applies only to records *after* the key's first diverted record
//! (by offset): a consumer group that reads the partition again from an
//! earlier offset still gets the records that came before it.

use std::collections::HashMap;

use bytes::Bytes;

use crate::dlt_context::{self, Keys, NO_KEYS};
use crate::dlt_record::{H_RELEASED_THROUGH, H_REPLAYED_FROM, RULE_KEY};
use crate::kafka::record::Record;
use crate::policy::{Class, Invalid};

/// Blocked keys of one partition per proxy, at most: a key blocked past
/// this holds the partition (never forgets a key) until keys are released.
pub const MAX_BLOCKED_KEYS_PER_PARTITION: usize = 10_000;

/// Why a key is blocked: its first diverted record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Origin offset of the key's first diverted record (`x-blocked-by`).
    pub first: i64,
    /// That record's class: blocked records go to the same DLT as it.
    pub class: Class,
}

/// The blocked keys of one partition, as the proxy knows them now.
pub trait KeyGate: Sync {
    /// The block on `key`, if it is blocked.
    fn blocked(&self, key: &[u8]) -> Option<Block>;
    /// Whether releasing `key` through origin offset `through` frees it:
    /// every diverted record of its block is at or below `through`.
    fn releases(&self, key: &[u8], through: i64) -> bool;
    /// The origin offset through which `key` was last released, if the
    /// set remembers (`None`: never released, or forgotten).
    fn released_through(&self, _key: &[u8]) -> Option<i64> {
        None
    }
    /// How many keys are blocked now.
    fn len(&self) -> usize;
    /// The keys that authenticate a replayed record coming home (its
    /// `x-replayed-from-dlt` and `x-released-through` are antidote's only
    /// if its frame opens under them).
    fn signing_keys(&self) -> &Keys {
        &NO_KEYS
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A gate with no blocked keys.
pub struct NoKeys;

impl KeyGate for NoKeys {
    fn blocked(&self, _: &[u8]) -> Option<Block> {
        None
    }
    fn releases(&self, _: &[u8], _: i64) -> bool {
        false
    }
    fn len(&self) -> usize {
        0
    }
}

/// What per-key ordering looks at in one record.
pub(super) struct KeyedRecord<'r> {
    pub key: Option<&'r [u8]>,
    pub offset: i64,
    /// Its own verdict's class, when the policy diverts it.
    pub diverted: Option<Class>,
    /// It carries `x-replayed-from-dlt`.
    pub replayed: bool,
}

/// What the planner does with one record under `per_key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeyStep {
    /// Nothing to do: delivered or diverted by its own verdict.
    Free,
    /// Parked behind its key's first diverted record.
    Blocked(Block),
    /// Its own diversion would block a new key past the cap: hold here.
    Full,
}

/// A key released by a replayed record passing through (its
/// `x-released-through` header), for the proxy to apply once delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub key: Bytes,
    pub through: i64,
    /// The offset of the record that carried it.
    pub offset: i64,
}

/// The blocks of one plan: the gate's, plus the keys first diverted (or
/// released: `None`) here.
pub(super) struct KeyOrder<'a> {
    gate: &'a dyn KeyGate,
    local: HashMap<Bytes, Option<Block>>,
}

impl<'a> KeyOrder<'a> {
    pub(super) fn new(gate: &'a dyn KeyGate) -> Self {
        KeyOrder {
            gate,
            local: HashMap::new(),
        }
    }

    /// Whether any record of this plan may be blocked.
    pub(super) fn active(&self) -> bool {
        !self.local.is_empty() || !self.gate.is_empty()
    }

    /// Whether `record` (of `topic`/`partition`) is a record `dlt replay`
    /// wrote back: its frame opens under the gate's keys and names the DLT
    /// record it came from. `Some` of its `x-released-through`, if any. A
    /// producer's own `x-replayed-from-dlt` header is never enough: it is
    /// outside the frame, or the frame does not verify.
    pub(super) fn homecoming(
        &self,
        record: &Record<'_>,
        topic: &str,
        partition: i32,
    ) -> Option<Option<i64>> {
        let ctx = dlt_context::open(record, topic, partition, self.gate.signing_keys()).ok()?;
        ctx.get(H_REPLAYED_FROM)?;
        Some(ctx.num(H_RELEASED_THROUGH))
    }

    /// Whether a release covers `key`'s record at `offset`: in this plan,
    /// or as the gate remembers it.
    pub(super) fn released(&self, key: Option<&[u8]>, offset: i64) -> bool {
        let Some(key) = key else {
            return true; // a record without a key blocks nothing
        };
        matches!(self.local.get(key), Some(None))
            || self.gate.released_through(key).is_some_and(|t| t >= offset)
    }

    fn current(&self, key: &[u8]) -> Option<Block> {
        match self.local.get(key) {
            Some(b) => *b,
            None => self.gate.blocked(key),
        }
    }

    /// Decide for the record at `offset` with `key`; `diverted` is its own
    /// verdict's class when the policy diverts it. A `replayed` record (it
    /// carries `x-replayed-from-dlt`) is a parked record coming home in
    /// order: never blocked, and its `released` header frees its key.
    pub(super) fn step(&mut self, rec: &KeyedRecord<'_>) -> KeyStep {
        let Some(key) = rec.key else {
            return KeyStep::Free;
        };
        let block = self.current(key);
        if !rec.replayed {
            if let Some(b) = block.filter(|b| b.first < rec.offset) {
                return KeyStep::Blocked(b);
            }
        }
        let Some(class) = rec.diverted else {
            return KeyStep::Free;
        };
        if block.is_none() {
            let added = self.local.values().filter(|b| b.is_some()).count();
            if self.gate.len() + added >= MAX_BLOCKED_KEYS_PER_PARTITION {
                return KeyStep::Full;
            }
            let first = rec.offset;
            self.local
                .insert(Bytes::copy_from_slice(key), Some(Block { first, class }));
        }
        KeyStep::Free
    }

    /// A replayed record released `key` through `through` as it passed:
    /// later records of the key flow, if that frees the block.
    pub(super) fn release(&mut self, key: &[u8], through: i64) -> bool {
        // A block begun in this very response cannot have been replayed.
        let frees = !self.local.contains_key(key) && self.gate.releases(key, through);
        if frees {
            self.local.insert(Bytes::copy_from_slice(key), None);
        }
        frees
    }
}

/// The verdict of a record parked behind `block`; `own` is its own
/// verdict, kept in the reason so the operator sees both.
pub(super) fn blocked_invalid(block: Block, own: Option<&Invalid>) -> Invalid {
    let mut reason = format!(
        "key blocked by the diverted record at offset {}",
        block.first
    );
    if let Some(o) = own {
        reason.push_str(&format!(
            "; own verdict: {} {}: {}",
            o.class, o.rule, o.reason
        ));
    }
    Invalid {
        class: Class::Blocked,
        rule: RULE_KEY.to_string(),
        reason,
        contract: None,
    }
}
