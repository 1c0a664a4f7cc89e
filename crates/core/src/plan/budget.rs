//! The decode budget: how many decompressed bytes the Fetch rewrites in
//! flight may hold at once, across every connection.
//!
//! A compressed batch must be decompressed before its records can be
//! judged, and a few KB of zstd can expand to the per-batch cap (64 MiB);
//! partitions are planned in parallel and connections are many, so without
//! a shared bound a burst of small responses could ask for gigabytes. Every
//! decompression first reserves its bytes here. A reservation that does not
//! fit is refused and the partition is held at that batch for this response
//! (the client gets the records before it and fetches the rest again, by
//! which time memory has been released): backpressure, never fail-open.
//! When nothing at all is reserved a reservation always succeeds, so one
//! batch can always make progress; decoded memory is bounded by the budget
//! plus one batch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::HoldReason;
use crate::kafka::batch::{Batch, BatchError, DecodedBatch};
use crate::kafka::compression::{Compression, DEFAULT_MAX_DECOMPRESSED};

/// Decompressed bytes shared by all in-flight Fetch rewrites.
#[derive(Debug)]
pub struct DecodeBudget {
    limit: usize,
    used: AtomicUsize,
}

impl DecodeBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(DecodeBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// No bound at all (benchmarks, fuzzing, offline planning).
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX)
    }

    /// Reserve `bytes`, or `None` if they do not fit while something else
    /// holds part of the budget.
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let fits = used == 0 || used.saturating_add(bytes) <= self.limit;
            if !fits {
                return None;
            }
            match self.used.compare_exchange_weak(
                used,
                used.saturating_add(bytes),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Some(Reservation {
                        budget: self.clone(),
                        bytes,
                    })
                }
                Err(now) => used = now,
            }
        }
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// Bytes held against a [`DecodeBudget`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<DecodeBudget>,
    bytes: usize,
}

impl Reservation {
    /// Give back everything above `bytes` (the real size, once known).
    pub fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            self.budget
                .used
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            self.bytes = bytes;
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Decompressed bytes first reserved for a compressed batch, as a multiple
/// of its compressed size; one that expands further is decoded again under
/// the per-batch cap.
const EXPANSION_GUESS: usize = 32;

/// Bytes first reserved for the index of an uncompressed batch (whose
/// records are a slice of the response), as a multiple of its size: 4
/// bytes where each record starts, and a record takes at least 7.
const INDEX_GUESS: usize = 1;

/// Open `batch`, holding what decoding allocates (decompressed bytes and
/// where each record starts) against `budget`: the decoder is limited to
/// the bytes reserved, so it can never allocate past them. Its records
/// are checked as they are first read (judged, or `DecodedBatch::check`).
/// The header list of the record being read is not counted: one at a
/// time, at most 16 times that record's bytes.
pub(crate) fn decode_within(
    batch: &Batch,
    budget: &Arc<DecodeBudget>,
) -> Result<(DecodedBatch, Option<Reservation>), HoldReason> {
    let undecodable = |e: BatchError| HoldReason::Undecodable(e.to_string());
    let uncompressed =
        batch.compression() == Some(Compression::None) || batch.compression().is_none();
    // An uncompressed batch's index may need more than the decompression
    // cap (a batch of records of a few bytes larger than 112 MiB): up to
    // the whole decode budget, so that only an index larger than the
    // budget makes a batch undecodable.
    let cap = if uncompressed {
        DEFAULT_MAX_DECOMPRESSED.max(budget.limit())
    } else {
        DEFAULT_MAX_DECOMPRESSED
    };
    let factor = if uncompressed {
        INDEX_GUESS
    } else {
        EXPANSION_GUESS
    };
    let floor = if uncompressed { 64 << 10 } else { 1 << 20 };
    let guess = batch.bytes().len().saturating_mul(factor).clamp(floor, cap);
    let mut limit = guess;
    loop {
        let mut memory = budget.try_reserve(limit).ok_or(HoldReason::Budget)?;
        // Opened only: judging reads (and so checks) its records.
        match batch.open_with_limit(limit) {
            Ok(d) => {
                memory.shrink_to(d.memory());
                return Ok((d, Some(memory)));
            }
            Err(BatchError::TooLarge { .. }) if limit < cap => limit = cap,
            Err(e) => return Err(undecodable(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_over_the_limit_is_refused_while_another_is_held() {
        let b = DecodeBudget::new(100);
        let first = b.try_reserve(80).expect("fits");
        assert!(b.try_reserve(30).is_none());
        assert!(b.try_reserve(20).is_some());
        drop(first);
        assert_eq!(b.used(), 0);
        assert!(b.try_reserve(30).is_some());
    }

    #[test]
    fn an_empty_budget_always_admits_one_reservation() {
        let b = DecodeBudget::new(10);
        let big = b.try_reserve(1000).expect("nothing else held: progress");
        assert!(b.try_reserve(1).is_none());
        drop(big);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn shrinking_returns_the_difference() {
        let b = DecodeBudget::new(100);
        let mut r = b.try_reserve(90).expect("fits");
        r.shrink_to(10);
        assert_eq!(b.used(), 10);
        assert!(b.try_reserve(90).is_some());
        r.shrink_to(50); // never grows
        assert_eq!(r.bytes(), 10);
    }
}
