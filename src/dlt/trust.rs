//! The one gate between a record read back from a DLT (or replayed into an
//! origin topic) and anything that acts on it: the ledger rebuild and tail,
//! the DLT follower (blocked keys, breakers, re-drive), `dlt replay` and `dlt inspect`.
//!
//! A record is antidote's only if its frame opens
//! (`antidote_core::dlt_context::open`): the reserved names of its context
//! each once, and, with signing keys, a signature that verifies for the
//! partition it was read from. A refused record is counted in
//! `antidote_dlt_records_refused_total{reader,reason}` and logged once per
//! reader and reason, never with its contents.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use tracing::warn;

use crate::dlt_context::{self, Context, Keys};
use crate::kafka::record::Record;
use crate::replay::DltRecord;

/// Who read a record, for the metric and the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reader {
    Ledger,
    Tail,
    /// The DLT follower (blocked keys, breakers, re-drive).
    Follower,
    Replay,
    Inspect,
    Discard,
}

impl Reader {
    pub fn as_str(self) -> &'static str {
        match self {
            Reader::Ledger => "ledger",
            Reader::Tail => "tail",
            Reader::Follower => "follower",
            Reader::Replay => "replay",
            Reader::Inspect => "inspect",
            Reader::Discard => "discard",
        }
    }
}

static KEYS: OnceLock<Keys> = OnceLock::new();

/// Set the process's signing keys (`dead_letter.signing_keys`), once, at
/// start: by `antidote run` before anything is read or written, and by the
/// `dlt` commands. A second call is ignored (the first keys stay).
pub fn set_keys(keys: Keys) {
    let _ = KEYS.set(keys);
}

/// The process's signing keys; none until [`set_keys`].
pub fn keys() -> &'static Keys {
    KEYS.get().unwrap_or(&dlt_context::NO_KEYS)
}

/// The seal of a record written to `topic`/`partition` with the process's
/// keys.
pub fn seal(topic: &str, partition: i32) -> dlt_context::Seal<'_> {
    dlt_context::Seal::new(keys(), topic, partition)
}

/// The context of `r`, read at `topic`/`partition`, if antidote may act on
/// it; `None` (counted, logged once) otherwise.
pub fn open<'a>(
    reader: Reader,
    topic: &str,
    partition: i32,
    r: &Record<'a>,
) -> Option<Context<'a>> {
    open_with(reader, keys(), topic, partition, r)
}

/// The DLT record `r` read at `topic`/`partition`, if it is antidote's
/// (its frame opens, see [`open`]); markers are `Some`
/// too (with no origin).
pub fn dlt_record(
    reader: Reader,
    topic: &str,
    partition: i32,
    r: &Record<'_>,
) -> Option<DltRecord> {
    let ctx = open(reader, topic, partition, r)?;
    Some(DltRecord::from_context(topic, partition, r, &ctx, keys()))
}

/// [`open`] with explicit keys.
pub fn open_with<'a>(
    reader: Reader,
    keys: &Keys,
    topic: &str,
    partition: i32,
    r: &Record<'a>,
) -> Option<Context<'a>> {
    match dlt_context::open(r, topic, partition, keys) {
        Ok(ctx) => Some(ctx),
        Err(why) => {
            crate::metrics::global().dlt_record_refused(reader.as_str(), why.as_str());
            static LOGGED: Mutex<Option<HashSet<(Reader, &'static str)>>> = Mutex::new(None);
            let first = LOGGED
                .lock()
                .map(|mut g| {
                    g.get_or_insert_with(HashSet::new)
                        .insert((reader, why.as_str()))
                })
                .unwrap_or(false);
            if first {
                warn!(
                    reader = reader.as_str(),
                    reason = why.as_str(),
                    topic,
                    partition,
                    offset = r.offset,
                    "a record read back is not antidote's own and is ignored (logged once per reader and reason; antidote_dlt_records_refused_total counts them)"
                );
            }
            None
        }
    }
}
