//! Handing the records one follower round reads to the readers they are
//! due to (the ledger, the blocked keys and breakers, re-drive), each
//! record opened once and given to a reader only at or after its position,
//! and noting what the round found out on the way: diversions learned,
//! partitions recreated, where re-drive ran out of room.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::Readers;
use crate::dlt::blocked::BlockedKeys;
use crate::dlt::breaker::Breakers;
use crate::dlt::ledger::rebuild::trusted;
use crate::dlt::ledger::tail::DltPartition;
use crate::dlt::ledger::Ledger;
use crate::dlt::read::Event;
use crate::dlt::redrive::Scheduler;
use crate::dlt::trust::{self, Reader};
use crate::dlt_marker::Marker;
use crate::dlt_record::Origin;
use crate::kafka::record::Record;
use crate::policy::PolicySet;

/// Where the blocked keys and re-drive go on in one DLT partition (`None`:
/// its log start). The ledger keeps its own (`Ledger::tail_position`).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Positions {
    pub blocked: Option<i64>,
    pub redrive: Option<i64>,
}

/// Who reads one DLT partition this round, and where each stood when the
/// round began.
#[derive(Debug, Clone, Copy)]
pub(super) struct Start {
    pub who: Readers,
    /// The ledger's tail position (`None`: the log start).
    pub ledger: Option<i64>,
    pub at: Positions,
}

/// What handing a round's records found out.
#[derive(Default)]
pub(super) struct Handed {
    /// Where re-drive ran out of room, per partition.
    pub stopped: HashMap<DltPartition, i64>,
    /// Partitions found recreated or truncated: every reader reads them
    /// again from their start.
    pub reset: HashSet<DltPartition>,
    /// Other instances' diversions the ledger learned.
    pub learned: u64,
}

/// The readers of one round, given its records one by one ([`Hand::give`]).
pub(super) struct Hand<'a> {
    pub policies: &'a PolicySet,
    pub starts: &'a HashMap<DltPartition, Start>,
    pub ledger: &'a Ledger,
    /// The policy topics' current ids (for trusting a diversion).
    pub ids: &'a HashMap<String, Uuid>,
    pub keys: Option<(&'a BlockedKeys, &'a Breakers)>,
    pub redrive: Option<&'a mut Scheduler>,
    pub out: Handed,
}

impl Hand<'_> {
    /// Give the record `r` of partition `p` of `dlt` to each reader it is
    /// due to; `None` says the partition was found recreated or truncated.
    pub fn give(&mut self, dlt: &str, p: i32, r: Option<&Record<'_>>) {
        let key = (dlt.to_string(), p);
        let Some(r) = r else {
            self.out.stopped.remove(&key);
            self.out.reset.insert(key);
            return;
        };
        let Some(&start) = self.starts.get(&key) else {
            return;
        };
        let (ledger_at, at) = match self.out.reset.contains(&key) {
            true => (None, Positions::default()),
            false => (start.ledger, start.at),
        };
        // A record antidote cannot show it wrote is never acted on.
        let Some(ctx) = trust::open(Reader::Follower, dlt, p, r) else {
            return;
        };
        let event = match Marker::parse(&ctx, r.key) {
            Some(m) => Event::Marker(m),
            None => Event::Diverted {
                ctx: &ctx,
                record: r,
            },
        };
        let due = |pos: Option<i64>| pos.is_none_or(|pos| r.offset >= pos);
        if start.who.ledger && due(ledger_at) {
            self.learn(dlt, &event);
        }
        if let Some((blocked, breakers)) =
            self.keys.filter(|_| start.who.blocked && due(at.blocked))
        {
            blocked.observe(breakers, self.policies, dlt, &event);
        }
        if let Some(s) = self
            .redrive
            .as_mut()
            .filter(|_| start.who.redrive && due(at.redrive))
        {
            // A reader out of room stops at a record and is given it again
            // in a later round.
            if !self.out.stopped.contains_key(&key) && !s.observe((dlt, p), r.offset, &event) {
                self.out.stopped.insert(key, r.offset);
            }
        }
    }

    /// The ledger learns a diversion read back from `dlt` when its origin
    /// is one the policies send there.
    fn learn(&mut self, dlt: &str, event: &Event<'_>) {
        let Event::Diverted { ctx, .. } = event else {
            return;
        };
        let Some(o) = Origin::of(ctx) else {
            return;
        };
        if trusted(self.policies, dlt, &o, self.ids.get(&*o.topic).copied())
            && self.ledger.learn(&(o.topic, o.partition, o.offset))
        {
            self.out.learned += 1;
        }
    }
}
