//! Record-batch surgery (magic v2): split a Fetch response's records section
//! into batches, read batch headers, decode a batch's records, and splice a
//! batch that loses records. Pure: bytes in, bytes out, no I/O.
//!
//! This module owns the wire layout of a v2 batch (see
//! `docs/design/protocol-notes.md` sections 1-4 and 9) so that no other
//! layer has to know it. The rules it keeps:
//! - splitting and header reads never copy (`Bytes::slice`), and an
//!   uncompressed batch is decoded without copying record bytes;
//! - anything that is not a complete magic-2 batch (a trailing fragment, a
//!   nonsense length, legacy magic 0/1) is passed through byte for byte;
//! - a rewrite changes only batchLength, recordsCount, crc, the codec bits of
//!   an emptied batch, and the records section (surviving records are copied
//!   byte for byte and recompressed with the batch's codec); lastOffsetDelta
//!   only changes on an explicit `cut_before`;
//! - no input can make it panic or allocate more than its decompression cap.
//!
//! Reading a decoded batch's records lives in `batch/decoded.rs`, splicing
//! in `splice.rs`.

mod decoded;
pub use decoded::DecodedBatch;

use bytes::Bytes;

use crate::kafka::compression::{self, Compression, CompressionError};
use crate::kafka::crc::Marks;

/// Size of the v2 batch header, up to and including recordsCount.
pub const HEADER_LEN: usize = 61;
/// Bytes before the batchLength-counted part: baseOffset + batchLength.
pub const LOG_OVERHEAD: usize = 12;
/// Smallest legal batchLength of a v2 batch (an empty batch).
pub const MIN_BATCH_LENGTH: i32 = (HEADER_LEN - LOG_OVERHEAD) as i32;
/// Smallest batchLength ("message size") of a magic 0 message.
const MIN_LEGACY_LENGTH: i32 = 14;

// Field offsets in the v2 header.
pub(crate) const BASE_OFFSET: usize = 0;
pub(crate) const BATCH_LENGTH: usize = 8;
pub(crate) const LEADER_EPOCH: usize = 12;
pub(crate) const MAGIC: usize = 16;
pub(crate) const CRC: usize = 17;
pub(crate) const ATTRIBUTES: usize = 21;
pub(crate) const LAST_OFFSET_DELTA: usize = 23;
pub(crate) const BASE_TIMESTAMP: usize = 27;
pub(crate) const MAX_TIMESTAMP: usize = 35;
pub(crate) const PRODUCER_ID: usize = 43;
pub(crate) const PRODUCER_EPOCH: usize = 51;
pub(crate) const BASE_SEQUENCE: usize = 53;
pub(crate) const RECORDS_COUNT: usize = 57;

/// Attribute bits.
pub const ATTR_CODEC_MASK: i16 = 0x07;
pub const ATTR_LOG_APPEND_TIME: i16 = 1 << 3;
pub const ATTR_TRANSACTIONAL: i16 = 1 << 4;
pub const ATTR_CONTROL: i16 = 1 << 5;
pub const ATTR_DELETE_HORIZON: i16 = 1 << 6;

/// Errors from decoding or rebuilding a batch.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    #[error("malformed batch: {0}")]
    Malformed(String),
    #[error("compression: {0}")]
    Compression(String),
    /// The decompressed records would exceed the configured cap.
    #[error("decompressed records exceed the limit of {limit} bytes")]
    TooLarge { limit: usize },
    /// The stored CRC does not match the batch: it is corrupt, so it must be
    /// passed through untouched rather than rewritten with a fresh CRC.
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    /// Attribute bits 0-2 name no known codec (5-7).
    #[error("unknown compression codec id {0}")]
    UnknownCodec(u8),
    /// The caller asked for something `splice`/`build_batch` cannot do.
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl From<CompressionError> for BatchError {
    fn from(e: CompressionError) -> Self {
        match e {
            CompressionError::TooLarge { limit } => BatchError::TooLarge { limit },
            other => BatchError::Compression(other.to_string()),
        }
    }
}

/// Timestamp type, attribute bit 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
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

impl Segment {
    /// The segment's bytes, exactly as they were in the records section.
    pub fn bytes(&self) -> &Bytes {
        match self {
            Segment::Batch(b) => b.bytes(),
            Segment::Legacy(b) | Segment::Partial(b) => b,
        }
    }
}

/// Split a records section into segments. Never fails: anything that is not
/// a complete batch ends up in a trailing `Partial`. Concatenating the
/// segments' bytes gives back `records` exactly. No bytes are copied.
///
/// A batch whose length field is nonsense (negative, shorter than its
/// header) or whose magic is unknown (not 0, 1 or 2) turns the rest of the
/// section into a `Partial`.
pub fn segments(records: &Bytes) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    let total = records.len();
    while pos < total {
        let rest = &records[pos..];
        let Some(len) = rest
            .get(BATCH_LENGTH..BATCH_LENGTH + 4)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_be_bytes)
        else {
            break;
        };
        // Negative lengths fail the conversion; no magic-0 message is shorter
        // than MIN_LEGACY_LENGTH.
        let Ok(len) = usize::try_from(len) else {
            break;
        };
        if len < MIN_LEGACY_LENGTH as usize {
            break;
        }
        let Some(size) = LOG_OVERHEAD.checked_add(len) else {
            break;
        };
        if size > rest.len() {
            break;
        }
        let bytes = records.slice(pos..pos + size);
        match rest[MAGIC] {
            0 | 1 => out.push(Segment::Legacy(bytes)),
            2 if len >= MIN_BATCH_LENGTH as usize => out.push(Segment::Batch(Batch { bytes })),
            _ => break,
        }
        pos += size;
    }
    if pos < total {
        out.push(Segment::Partial(records.slice(pos..)));
    }
    out
}

/// A complete magic-2 batch; cheap to clone (shares the response buffer).
///
/// Invariant: `bytes` is at least `HEADER_LEN` long, magic is 2 and
/// batchLength equals `bytes.len() - LOG_OVERHEAD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    bytes: Bytes,
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

impl Batch {
    /// Wrap the bytes of exactly one complete magic-2 batch.
    pub fn new(bytes: Bytes) -> Result<Batch, BatchError> {
        if bytes.len() < HEADER_LEN {
            return Err(BatchError::Malformed(format!(
                "{} bytes is shorter than a batch header",
                bytes.len()
            )));
        }
        if bytes[MAGIC] != 2 {
            return Err(BatchError::Malformed(format!("magic {}", bytes[MAGIC])));
        }
        let len = i32::from_be_bytes(be(&bytes, BATCH_LENGTH));
        if usize::try_from(len).ok() != Some(bytes.len() - LOG_OVERHEAD) {
            return Err(BatchError::Malformed(format!(
                "batchLength {len} does not match {} bytes",
                bytes.len()
            )));
        }
        Ok(Batch { bytes })
    }

    /// The batch's bytes, exactly as received.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
    pub fn base_offset(&self) -> i64 {
        i64::from_be_bytes(be(&self.bytes, BASE_OFFSET))
    }
    /// Bytes after the batchLength field.
    pub fn batch_length(&self) -> i32 {
        i32::from_be_bytes(be(&self.bytes, BATCH_LENGTH))
    }
    pub fn partition_leader_epoch(&self) -> i32 {
        i32::from_be_bytes(be(&self.bytes, LEADER_EPOCH))
    }
    /// Always 2.
    pub fn magic(&self) -> i8 {
        self.bytes[MAGIC] as i8
    }
    pub fn crc(&self) -> u32 {
        u32::from_be_bytes(be(&self.bytes, CRC))
    }
    /// CRC-32C of everything from `attributes` to the end of the batch.
    pub fn computed_crc(&self) -> u32 {
        crate::kafka::crc::crc32c(&self.bytes[ATTRIBUTES..])
    }
    pub fn crc_valid(&self) -> bool {
        self.crc() == self.computed_crc()
    }
    pub fn attributes(&self) -> i16 {
        i16::from_be_bytes(be(&self.bytes, ATTRIBUTES))
    }
    pub fn last_offset_delta(&self) -> i32 {
        i32::from_be_bytes(be(&self.bytes, LAST_OFFSET_DELTA))
    }
    /// baseOffset + lastOffsetDelta + 1: where a client fetches next.
    /// The offset of the batch's last record (`base + last_offset_delta`,
    /// wrapping like [`Batch::next_offset`]: a hostile batch at the top of
    /// the offset range must not overflow).
    pub fn last_offset(&self) -> i64 {
        self.base_offset()
            .wrapping_add(i64::from(self.last_offset_delta()))
    }
    pub fn next_offset(&self) -> i64 {
        self.base_offset()
            .wrapping_add(i64::from(self.last_offset_delta()))
            .wrapping_add(1)
    }
    pub fn base_timestamp(&self) -> i64 {
        i64::from_be_bytes(be(&self.bytes, BASE_TIMESTAMP))
    }
    pub fn max_timestamp(&self) -> i64 {
        i64::from_be_bytes(be(&self.bytes, MAX_TIMESTAMP))
    }
    pub fn producer_id(&self) -> i64 {
        i64::from_be_bytes(be(&self.bytes, PRODUCER_ID))
    }
    pub fn producer_epoch(&self) -> i16 {
        i16::from_be_bytes(be(&self.bytes, PRODUCER_EPOCH))
    }
    pub fn base_sequence(&self) -> i32 {
        i32::from_be_bytes(be(&self.bytes, BASE_SEQUENCE))
    }
    pub fn records_count(&self) -> i32 {
        i32::from_be_bytes(be(&self.bytes, RECORDS_COUNT))
    }
    /// The raw codec id, attribute bits 0-2.
    pub fn codec_id(&self) -> u8 {
        (self.attributes() & ATTR_CODEC_MASK) as u8
    }
    /// The codec, or `None` if bits 0-2 hold an unassigned id (5-7).
    pub fn compression(&self) -> Option<Compression> {
        Compression::from_id(self.codec_id())
    }
    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes() & ATTR_LOG_APPEND_TIME != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & ATTR_CONTROL != 0
    }
    pub fn has_delete_horizon(&self) -> bool {
        self.attributes() & ATTR_DELETE_HORIZON != 0
    }
    /// The (possibly compressed) records section, after the header. No copy.
    pub fn records_section(&self) -> Bytes {
        self.bytes.slice(HEADER_LEN..)
    }

    /// Verify the CRC, decompress (if needed, capped at
    /// `compression::DEFAULT_MAX_DECOMPRESSED`) and check every record.
    pub fn decode(&self) -> Result<DecodedBatch, BatchError> {
        self.decode_with_limit(compression::DEFAULT_MAX_DECOMPRESSED)
    }

    /// `decode`, refusing a records section that decompresses to more than
    /// `limit` bytes.
    pub fn decode_with_limit(&self, limit: usize) -> Result<DecodedBatch, BatchError> {
        let decoded = self.open_with_limit(limit)?;
        decoded.check()?;
        Ok(decoded)
    }

    /// Verify the CRC and decompress, leaving the records to be checked by
    /// the first walk over them ([`DecodedBatch::try_each_record`], or
    /// [`DecodedBatch::check`]): a batch is read once, as it is judged,
    /// instead of indexed first and read again (issue 30). Every way to
    /// a record fails on a malformed batch, so a caller that walks it
    /// learns it is undecodable before it uses a verdict.
    pub fn open_with_limit(&self, limit: usize) -> Result<DecodedBatch, BatchError> {
        // An uncompressed batch keeps the running CRC of this read, so
        // that a splice derives its new CRC instead of reading it again.
        let (computed, marks) = if self.compression() == Some(Compression::None) {
            Marks::read(
                &self.bytes[ATTRIBUTES..HEADER_LEN],
                &self.bytes[HEADER_LEN..],
            )
        } else {
            (self.computed_crc(), Marks::default())
        };
        let stored = self.crc();
        if stored != computed {
            return Err(BatchError::CrcMismatch { stored, computed });
        }
        let codec = self
            .compression()
            .ok_or(BatchError::UnknownCodec(self.codec_id()))?;
        let count = self.records_count();
        let count = usize::try_from(count)
            .map_err(|_| BatchError::Malformed(format!("negative recordsCount {count}")))?;
        let section = self.records_section();
        let (buf, snappy) = if count == 0 && section.is_empty() {
            (section, None)
        } else {
            compression::decompress(codec, &section, limit)?
        };
        let decoded = DecodedBatch::new(
            buf,
            (self.base_offset(), self.base_timestamp()),
            (codec, snappy.unwrap_or_default()),
            count,
            marks,
        );
        // The record starts count against the same limit as the
        // decompressed bytes (records can be 7 bytes: 4 bytes of index
        // each), so a batch of tiny records cannot allocate past what its
        // decoder was allowed.
        if decoded.memory() > limit {
            return Err(BatchError::TooLarge { limit });
        }
        Ok(decoded)
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;

    use super::decoded::nullable;
    use super::*;
    use crate::kafka::testutil::{RawBatch, RawRecord};

    #[test]
    fn nullable_ranges() {
        // -1 (null), then length 2 "ab", then -2 (invalid), then length 5 past the end.
        let buf = [0x01, 0x04, b'a', b'b', 0x03, 0x0a, b'x'];
        let mut p = 0;
        assert_eq!(nullable(&buf, &mut p), Some(None));
        assert_eq!(nullable(&buf, &mut p), Some(Some(&b"ab"[..])));
        assert_eq!(p, 4);
        assert_eq!(nullable(&buf, &mut p), None);
        let mut p = 5;
        assert_eq!(nullable(&buf, &mut p), None);
    }

    fn batch_of(n: i32, base: i64) -> Bytes {
        RawBatch {
            base_offset: base,
            records: (0..n).map(|i| RawRecord::simple(i, "v")).collect(),
            ..RawBatch::default()
        }
        .encode()
    }

    /// A magic-1 message (offset, size, crc, magic 1, attributes, timestamp,
    /// key null, value "x"); the CRC is not checked by `segments`.
    fn legacy_message() -> Vec<u8> {
        let mut body = vec![0, 0, 0, 0, 1, 0];
        body.extend_from_slice(&5i64.to_be_bytes());
        body.extend_from_slice(&(-1i32).to_be_bytes());
        body.extend_from_slice(&1i32.to_be_bytes());
        body.push(b'x');
        let mut out = 77i64.to_be_bytes().to_vec();
        out.extend_from_slice(&(body.len() as i32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn segments_split_batches_legacy_and_partial_without_copying() {
        let a = batch_of(3, 100);
        let b = batch_of(2, 103);
        let legacy = legacy_message();
        let partial = &batch_of(4, 105)[..70];
        let mut section = Vec::new();
        section.extend_from_slice(&a);
        section.extend_from_slice(&legacy);
        section.extend_from_slice(&b);
        section.extend_from_slice(partial);
        let section = Bytes::from(section);
        let segs = segments(&section);
        assert_eq!(segs.len(), 4);
        assert!(matches!(&segs[0], Segment::Batch(x) if x.bytes() == &a));
        assert!(matches!(&segs[1], Segment::Legacy(x) if x[..] == legacy[..]));
        assert!(matches!(&segs[2], Segment::Batch(x) if x.bytes() == &b));
        assert!(matches!(&segs[3], Segment::Partial(x) if x[..] == partial[..]));
        let mut at = 0;
        for s in &segs {
            assert_eq!(
                s.bytes().as_ptr(),
                section[at..].as_ptr(),
                "zero-copy slice"
            );
            at += s.bytes().len();
        }
        assert_eq!(at, section.len());
    }

    #[test]
    fn segments_of_empty_and_tiny_sections() {
        assert!(segments(&Bytes::new()).is_empty());
        for n in 1..12 {
            let s = Bytes::from(vec![0u8; n]);
            let segs = segments(&s);
            assert!(matches!(&segs[..], [Segment::Partial(p)] if p == &s));
        }
    }

    #[test]
    fn nonsense_lengths_and_magic_make_the_rest_partial() {
        let good = batch_of(1, 0);
        for (len, magic) in [
            (-1i32, 2u8),
            (i32::MIN, 2),
            (0, 2),
            (13, 0),
            (48, 2),
            (60, 3),
            (60, 0xff),
        ] {
            let mut bad = batch_of(1, 1).to_vec();
            bad[8..12].copy_from_slice(&len.to_be_bytes());
            bad[16] = magic;
            let mut section = good.to_vec();
            section.extend_from_slice(&bad);
            section.extend_from_slice(&good);
            let section = Bytes::from(section);
            let segs = segments(&section);
            assert_eq!(segs.len(), 2, "len {len} magic {magic}");
            assert!(matches!(&segs[0], Segment::Batch(_)));
            assert!(matches!(&segs[1], Segment::Partial(p) if p[..] == section[good.len()..]));
        }
    }

    #[test]
    fn header_accessors() {
        let raw = RawBatch {
            base_offset: 5_000_000_000,
            leader_epoch: 12,
            flags: ATTR_TRANSACTIONAL | ATTR_LOG_APPEND_TIME,
            codec: Compression::Lz4,
            last_offset_delta: Some(9),
            base_timestamp: 111,
            max_timestamp: 222,
            producer_id: 333,
            producer_epoch: 4,
            base_sequence: 55,
            records: vec![RawRecord::simple(0, "a"), RawRecord::simple(3, "b")],
            ..RawBatch::default()
        };
        let bytes = raw.encode();
        let b = Batch::new(bytes.clone()).unwrap();
        assert_eq!(b.base_offset(), 5_000_000_000);
        assert_eq!(b.batch_length() as usize, bytes.len() - 12);
        assert_eq!(b.partition_leader_epoch(), 12);
        assert_eq!(b.magic(), 2);
        assert!(b.crc_valid());
        assert_eq!(b.crc(), crc32c::crc32c(&bytes[21..]));
        assert_eq!(
            b.attributes(),
            3 | ATTR_TRANSACTIONAL | ATTR_LOG_APPEND_TIME
        );
        assert_eq!(b.compression(), Some(Compression::Lz4));
        assert_eq!(b.timestamp_type(), TimestampType::LogAppendTime);
        assert!(b.is_transactional());
        assert!(!b.is_control());
        assert!(!b.has_delete_horizon());
        assert_eq!(b.last_offset_delta(), 9);
        assert_eq!(b.next_offset(), 5_000_000_010);
        assert_eq!(b.base_timestamp(), 111);
        assert_eq!(b.max_timestamp(), 222);
        assert_eq!(b.producer_id(), 333);
        assert_eq!(b.producer_epoch(), 4);
        assert_eq!(b.base_sequence(), 55);
        assert_eq!(b.records_count(), 2);
        let d = b.decode().unwrap();
        let offsets: Vec<i64> = d.records().map(|r| r.offset).collect();
        assert_eq!(offsets, [5_000_000_000, 5_000_000_003]);
        let r = d.record(1).unwrap();
        assert_eq!(r.timestamp, 111 + 30);
        assert_eq!(r.key, Some(&b"k3"[..]));
        assert_eq!(r.value, Some(&b"b"[..]));
        assert_eq!(r.headers.len(), 2, "duplicate header keys are kept");
        assert_eq!(r.header("h"), Some(Some(&b"v"[..])));
        assert_eq!(r.headers[1].value, None);
    }

    /// `each_record` (one reused header vector) sees what `record` does,
    /// with no header of an earlier record left over.
    #[test]
    fn each_record_is_record_by_record() {
        let mut with_headers = RawRecord::simple(0, "a");
        let mut without = RawRecord::simple(1, "b");
        without.headers.clear();
        with_headers.headers.push(("x".into(), None));
        let raw = RawBatch {
            records: vec![with_headers, without, RawRecord::simple(2, "c")],
            ..RawBatch::default()
        };
        let d = Batch::new(raw.encode()).unwrap().decode().unwrap();
        let mut seen = Vec::new();
        d.each_record(|i, r| seen.push((i, r.clone()))).unwrap();
        let want: Vec<_> = d.records().enumerate().collect();
        assert_eq!(seen, want);
        assert!(seen[1].1.headers.is_empty() && seen[0].1.headers.len() > 1);
    }

    #[test]
    fn batch_new_rejects_non_batches() {
        let good = batch_of(1, 0);
        assert!(Batch::new(good.slice(..60)).is_err());
        assert!(Batch::new(good.slice(..good.len() - 1)).is_err());
        let mut m = good.to_vec();
        m[16] = 1;
        assert!(Batch::new(Bytes::from(m)).is_err());
    }

    #[test]
    fn uncompressed_decode_does_not_copy_records() {
        let b = Batch::new(batch_of(5, 0)).unwrap();
        let d = b.decode().unwrap();
        assert_eq!(d.buffer().as_ptr(), b.bytes()[HEADER_LEN..].as_ptr());
        let v = d.record(2).unwrap().value.unwrap();
        let range = b.bytes().as_ptr_range();
        assert!(range.contains(&v.as_ptr()));
    }

    #[test]
    fn decode_rejects_bad_crc_and_unknown_codec() {
        let mut bytes = batch_of(2, 0).to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let b = Batch::new(Bytes::from(bytes.clone())).unwrap();
        assert!(!b.crc_valid());
        assert!(matches!(b.decode(), Err(BatchError::CrcMismatch { .. })));

        let mut bytes = batch_of(2, 0).to_vec();
        bytes[22] |= 7;
        let crc = crc32c::crc32c(&bytes[21..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
        let b = Batch::new(Bytes::from(bytes)).unwrap();
        assert_eq!(b.compression(), None);
        assert!(matches!(b.decode(), Err(BatchError::UnknownCodec(7))));
    }

    fn with_records(count: i32, records: &[u8]) -> Batch {
        let mut bytes = batch_of(0, 0).to_vec();
        bytes.truncate(HEADER_LEN);
        bytes[57..61].copy_from_slice(&count.to_be_bytes());
        bytes.extend_from_slice(records);
        let len = (bytes.len() - 12) as i32;
        bytes[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c::crc32c(&bytes[21..]);
        bytes[17..21].copy_from_slice(&crc.to_be_bytes());
        Batch::new(Bytes::from(bytes)).unwrap()
    }

    #[test]
    fn malformed_records_are_errors() {
        let one = crate::kafka::testutil::encode_record(&RawRecord::simple(0, "x"));
        assert_eq!(with_records(1, &one).decode().unwrap().len(), 1);
        let cases: Vec<(i32, Vec<u8>)> = vec![
            (2, one.clone()),                              // count too high
            (-1, one.clone()),                             // negative count
            (i32::MAX, one.clone()),                       // huge count
            (0, one.clone()),                              // bytes left over
            (1, one[..one.len() - 1].to_vec()),            // truncated
            (1, vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff]), // over-long varint
            (1, vec![0x01]),                               // negative length
            (1, vec![0xfe, 0xff, 0xff, 0xff, 0x0f]),       // length i32::MAX
            (1, vec![0x0e, 0, 0, 0, 0x03, 0, 0, 0]),       // key length -2
            (
                1,
                vec![0x18, 0, 0, 0, 1, 1, 0xfe, 0xff, 0xff, 0xff, 0x0f, 0, 0],
            ), // huge header count
            (1, vec![0x0c, 0, 0, 0, 1, 1, 0x01]),          // negative header count
            (1, vec![0x10, 0, 0, 0, 1, 1, 2, 1, 0]),       // null header key
            (1, vec![0x0e, 0, 0, 0, 0, 0, 0, 0]),          // record longer than its fields
        ];
        for (count, recs) in cases {
            let b = with_records(count, &recs);
            assert!(
                matches!(b.decode(), Err(BatchError::Malformed(_))),
                "count {count} records {recs:02x?}"
            );
        }
    }

    #[test]
    fn decompression_cap_is_enforced() {
        let raw = RawBatch {
            codec: Compression::Zstd,
            records: vec![RawRecord {
                value: Some(vec![0; 1 << 20]),
                ..RawRecord::simple(0, "")
            }],
            ..RawBatch::default()
        };
        let b = Batch::new(raw.encode()).unwrap();
        assert!(b.bytes().len() < 10_000);
        assert!(matches!(
            b.decode_with_limit(1 << 19),
            Err(BatchError::TooLarge { .. })
        ));
        assert_eq!(b.decode().unwrap().len(), 1);
    }

    /// `memory` counts where each record starts (4 bytes a record, for
    /// the records recordsCount declares), and a walk keeps exactly that
    /// many; a record's many headers take no index at all.
    #[test]
    fn memory_counts_the_record_starts() {
        let d = Batch::new(batch_of(1000, 0)).unwrap().decode().unwrap();
        // And the CRC marks: 4 bytes per 24 KiB of records, and two.
        let marks = d.marks().memory();
        assert!(marks > 0 && marks <= (d.buffer().len() / crate::kafka::crc::MARK_EVERY + 2) * 4);
        assert_eq!(d.memory(), 1000 * 4 + marks);
        assert!(matches!(d.starts.get(), Some(Ok(s)) if s.len() == 1000));
        let mut records: Vec<RawRecord> = (0..100).map(|i| RawRecord::simple(i, "v")).collect();
        records[0].headers = vec![("h".into(), None); 50];
        let raw = RawBatch {
            records,
            ..RawBatch::default()
        };
        let d = Batch::new(raw.encode()).unwrap().decode().unwrap();
        assert_eq!(d.memory(), 100 * 4 + d.marks().memory());
        assert_eq!(d.record(0).unwrap().headers.len(), 50);
        assert_eq!(d.record(1).unwrap().headers.len(), 2);
    }

    /// An opened batch is checked by its first walk: the records before a
    /// malformed one are read, then the walk fails, and so does every way
    /// to a record after it; a walk that stops early keeps nothing.
    #[test]
    fn a_walk_finds_a_malformed_record_and_remembers_it() {
        let mut raw = RawBatch {
            records: (0..3).map(|i| RawRecord::simple(i, "v")).collect(),
            ..RawBatch::default()
        }
        .encode()
        .to_vec();
        // The last record's last byte is its header value's length: a
        // null header value (-1) becomes length 1, past the record's end.
        *raw.last_mut().unwrap() = 0x02;
        crate::kafka::splice::finish_header(&mut raw).unwrap();
        let b = Batch::new(Bytes::from(raw)).unwrap();
        assert!(matches!(b.decode(), Err(BatchError::Malformed(_))));
        let d = b.open_with_limit(1 << 20).unwrap();
        // Stopped early: nothing is known yet.
        let first = d.try_each_record(|i, _| ControlFlow::Break(i)).unwrap();
        assert_eq!(first, ControlFlow::Break(0));
        assert!(d.starts.get().is_none());
        let mut seen = Vec::new();
        let walked = d.each_record(|i, r| seen.push((i, r.offset)));
        assert!(matches!(walked, Err(BatchError::Malformed(_))));
        assert_eq!(seen, [(0, 1000), (1, 1001)]);
        assert!(matches!(d.check(), Err(BatchError::Malformed(_))));
        assert_eq!(
            (d.len(), d.record(0), d.offset(0), d.raw_record(0)),
            (0, None, None, None)
        );
        // A fresh copy, checked without a walk first, finds the same.
        let again = b.open_with_limit(1 << 20).unwrap();
        assert_eq!(again.record(0), None);
        assert_eq!(
            again.check().unwrap_err().to_string(),
            walked.unwrap_err().to_string()
        );
    }

    /// Tiny records: their starts (4 bytes per 7-byte record) are held to
    /// the decoder's limit, which the planner reserves from the decode
    /// budget; tiny headers take none.
    #[test]
    fn the_starts_of_tiny_records_never_allocate_past_the_limit() {
        let tiny = |headers: usize| RawBatch {
            records: (0..20_000)
                .map(|i| RawRecord {
                    key: None,
                    value: None,
                    headers: vec![(String::new(), None); headers],
                    ..RawRecord::simple(i, "")
                })
                .collect(),
            ..RawBatch::default()
        };
        for headers in [0, 40] {
            let b = Batch::new(tiny(headers).encode()).unwrap();
            let whole = b.decode().unwrap();
            assert_eq!(whole.memory(), 20_000 * 4 + whole.marks().memory());
            assert!(matches!(
                b.decode_with_limit(whole.memory() - 1),
                Err(BatchError::TooLarge { .. })
            ));
            let enough = b.decode_with_limit(whole.memory()).unwrap();
            assert_eq!(enough.len(), 20_000);
            assert_eq!(enough.record(19_999).unwrap().headers.len(), headers);
        }
    }
}
