//! The dead-letter side of the running proxy, by role:
//!
//! - [`writer`]: writes diverted records to their DLTs, acknowledged, once
//!   per original record (the producer, the fleet's producer lease, the
//!   replay fence);
//! - [`ledger`]: which records are in their DLT already, read back from the
//!   DLTs (rebuild) and kept in step with the fleet's writes (tail);
//! - [`follower`]: the one reader of the DLTs for what acts on their
//!   contents: the keys parked behind a diverted record ([`blocked`]), the
//!   diversion circuit breakers ([`breaker`]) and re-drive ([`redrive`]),
//!   each handed every record as a [`read::Event`];
//! - [`trust`]: the one gate every record read back passes through;
//! - [`write`]: one record with acks=all (replays, re-drive, markers).
//!
//! The DLT record format (header names, markers) is the core's
//! (`dlt_record`, `dlt_context`, `dlt_marker`); replay's decision too
//! (`replay`). The `antidote dlt` commands are `cli::dlt`.

pub mod blocked;
pub mod breaker;
pub mod follower;
pub mod ledger;
pub mod read;
pub mod redrive;
pub mod trust;
pub mod write;
pub mod writer;

use std::time::Duration;

pub use antidote_core::dlt_record::*;
pub use ledger::rebuild::trusted;
pub use ledger::{Ledger, LedgerKey, OffsetSet};
pub use read::{read_partition, read_partition_end, read_partition_while, read_topic};
pub use writer::{DeadLetter, DivertError, Ticket, Workers};

/// A pause of about `base * 2^attempt` (at most `cap`), drawn from its upper
/// half at random, so that retries of independent writes (and of several
/// proxies) do not fall in step.
pub fn backoff(attempt: u32, base: Duration, cap: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let full = base.saturating_mul(1u32 << attempt.min(16)).min(cap);
    // RandomState is seeded per instance: enough randomness for jitter.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let half = full / 2;
    half + Duration::from_nanos(r % (half.as_nanos() as u64 + 1))
}
