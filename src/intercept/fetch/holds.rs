//! Where this connection's partitions are held: one client connection's
//! memory of the holds it was answered with, so a repeated hold at the same
//! offset sends no records at all.

use std::collections::HashMap;
use std::sync::Arc;

/// Partitions this connection has been answered with a hold, and where.
///
/// The first time a partition is held at offset C, the client gets the
/// records before C (it may not have them yet). Held at the same C again,
/// the client is already at C, so it gets no records at all: an answer
/// whose records all lie below the fetch offset looks to librdkafka like a
/// record too large to fetch (it doubles its fetch size and ends in
/// MSG_SIZE_TOO_LARGE), whereas no records is an ordinary "nothing new".
#[derive(Debug, Default)]
pub struct Holds {
    pub(super) at: HashMap<(Arc<str>, i32), i64>,
}

impl Holds {
    /// Record a hold at `offset`; whether records before it should be sent.
    pub(super) fn hold(&mut self, topic: &Arc<str>, partition: i32, offset: i64) -> bool {
        self.at.insert((topic.clone(), partition), offset) != Some(offset)
    }

    pub(super) fn release(&mut self, topic: &Arc<str>, partition: i32) {
        if !self.at.is_empty() {
            self.at.remove(&(topic.clone(), partition));
        }
    }
}
