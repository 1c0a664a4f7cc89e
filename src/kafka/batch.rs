//! Record-batch surgery (magic v2): split a Fetch response's records section
//! into batches, decode a batch's records, and splice a batch that loses
//! records. Pure: bytes in, bytes out, no I/O.
//!
//! STUB: the real implementation is being written; the API below is the
//! contract the interception layer codes against.

use bytes::Bytes;

use crate::kafka::compression::Compression;
use crate::kafka::record::Record;

/// Errors from decoding or rebuilding a batch.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("malformed batch: {0}")]
    Malformed(String),
    #[error("compression: {0}")]
    Compression(String),
}

/// One piece of a records section, split by `batchLength`.
#[derive(Debug, Clone)]
pub enum Segment {
    /// A complete magic-2 batch.
    Batch(Batch),
    /// A complete batch with magic 0 or 1: passed through untouched.
    Legacy(Bytes),
    /// Trailing bytes that do not hold a complete batch: passed through untouched.
    Partial(Bytes),
}

/// Split a records section into segments. Never fails: anything that is not
/// a complete batch ends up in a trailing `Partial`.
pub fn segments(_records: &Bytes) -> Vec<Segment> {
    todo!()
}

/// A complete magic-2 batch; cheap to clone (shares the response buffer).
#[derive(Debug, Clone)]
pub struct Batch {
    bytes: Bytes,
}

impl Batch {
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
    pub fn base_offset(&self) -> i64 {
        todo!()
    }
    pub fn last_offset_delta(&self) -> i32 {
        todo!()
    }
    /// baseOffset + lastOffsetDelta + 1: where a client fetches next.
    pub fn next_offset(&self) -> i64 {
        todo!()
    }
    pub fn producer_id(&self) -> i64 {
        todo!()
    }
    pub fn records_count(&self) -> i32 {
        todo!()
    }
    pub fn crc(&self) -> u32 {
        todo!()
    }
    pub fn compression(&self) -> Compression {
        todo!()
    }
    pub fn is_transactional(&self) -> bool {
        todo!()
    }
    pub fn is_control(&self) -> bool {
        todo!()
    }
    /// Decompress (if needed) and index the records.
    pub fn decode(&self) -> Result<DecodedBatch, BatchError> {
        todo!()
    }
}

/// A batch's records, decompressed and indexed.
pub struct DecodedBatch {}

impl DecodedBatch {
    pub fn len(&self) -> usize {
        todo!()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn records(&self) -> impl Iterator<Item = Record<'_>> {
        std::iter::empty()
    }
}

/// Rebuild `batch` keeping only the records `keep[i] == true`, in order.
/// If `cut_before` is `Some(offset)`, records at or after `offset` are also
/// dropped and lastOffsetDelta is lowered so the client fetches `offset` next
/// (used to hold a partition at a record not yet safely diverted).
pub fn splice(
    _batch: &Batch,
    _decoded: &DecodedBatch,
    _keep: &[bool],
    _cut_before: Option<i64>,
) -> Result<Bytes, BatchError> {
    todo!()
}
