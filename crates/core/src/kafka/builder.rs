//! Fresh magic-2 batches for the proxy's own dead-letter producer.
//!
//! Owned here, beside the splicer, so that the proxy never needs a generic
//! encoder that would collapse duplicate header keys or drop null values: a
//! dead-lettered record keeps its headers exactly, in order. Batches start at
//! baseOffset 0 (the broker assigns offsets); producer fields default to "no
//! producer" (-1) and can be set for an idempotent producer.

use bytes::{Bytes, BytesMut};

use crate::kafka::batch::{BatchError, HEADER_LEN};
use crate::kafka::compression::{self, Compression, SnappyFraming};
use crate::kafka::splice::finish_header;
use crate::kafka::varint::{varint_len, write_varint, write_varlong};

/// One record to produce.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewRecord {
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    /// Header keys are strings on the wire (UTF-8); duplicates are kept.
    pub headers: Vec<(String, Option<Bytes>)>,
}

impl NewRecord {
    /// The record as a reader sees it (offset 0): for judging or reading
    /// back a record before it is written.
    pub fn as_record(&self) -> crate::kafka::record::Record<'_> {
        crate::kafka::record::Record {
            offset: 0,
            timestamp: self.timestamp,
            key: self.key.as_deref(),
            value: self.value.as_deref(),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| crate::kafka::record::Header {
                    key: k.as_bytes(),
                    value: v.as_deref(),
                })
                .collect(),
        }
    }
}

/// Batch-level settings for `build_batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildOptions {
    pub compression: Compression,
    /// Framing when `compression` is snappy (xerial is what Java writes).
    pub snappy_framing: SnappyFraming,
    /// baseTimestamp; `None` = the smallest record timestamp.
    pub base_timestamp: Option<i64>,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub partition_leader_epoch: i32,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            compression: Compression::None,
            snappy_framing: SnappyFraming::Xerial,
            base_timestamp: None,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            partition_leader_epoch: -1,
        }
    }
}

impl BuildOptions {
    pub fn compression(mut self, c: Compression) -> Self {
        self.compression = c;
        self
    }
    /// Producer fields for an idempotent producer.
    pub fn idempotent(mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
        self
    }
}

fn len_i32(n: usize, what: &str) -> Result<i32, BatchError> {
    i32::try_from(n).map_err(|_| BatchError::Invalid(format!("{what} too large ({n} bytes)")))
}

fn write_nullable(out: &mut Vec<u8>, b: Option<&[u8]>) -> Result<(), BatchError> {
    match b {
        None => write_varint(out, -1),
        Some(b) => {
            write_varint(out, len_i32(b.len(), "field")?);
            out.extend_from_slice(b);
        }
    }
    Ok(())
}

/// Encode `records` as one magic-2 batch with baseOffset 0, offset deltas
/// 0..n, timestamp deltas from the base timestamp, maxTimestamp the largest
/// record timestamp, CreateTime, not transactional. Errors on an empty
/// record list or a field longer than i32::MAX.
pub fn build_batch(records: &[NewRecord], opts: &BuildOptions) -> Result<Bytes, BatchError> {
    let (Some(min_ts), Some(max_ts)) = (
        records.iter().map(|r| r.timestamp).min(),
        records.iter().map(|r| r.timestamp).max(),
    ) else {
        return Err(BatchError::Invalid(
            "a batch needs at least one record".into(),
        ));
    };
    let count =
        i32::try_from(records.len()).map_err(|_| BatchError::Invalid("too many records".into()))?;
    let base_ts = opts.base_timestamp.unwrap_or(min_ts);

    let mut raw = Vec::new();
    let mut body = Vec::new();
    for (i, r) in records.iter().enumerate() {
        body.clear();
        body.push(0); // record attributes: unused
        write_varlong(&mut body, r.timestamp.wrapping_sub(base_ts));
        write_varint(&mut body, i as i32);
        write_nullable(&mut body, r.key.as_deref())?;
        write_nullable(&mut body, r.value.as_deref())?;
        write_varint(&mut body, len_i32(r.headers.len(), "header count")?);
        for (k, v) in &r.headers {
            write_nullable(&mut body, Some(k.as_bytes()))?;
            write_nullable(&mut body, v.as_deref())?;
        }
        let body_len = len_i32(body.len(), "record")?;
        raw.reserve(varint_len(body_len) + body.len());
        write_varint(&mut raw, body_len);
        raw.extend_from_slice(&body);
    }
    let section = match opts.compression {
        Compression::None => raw,
        c => compression::compress(c, &raw, opts.snappy_framing)?,
    };

    let mut out = BytesMut::with_capacity(HEADER_LEN + section.len());
    out.extend_from_slice(&0i64.to_be_bytes()); // baseOffset
    out.extend_from_slice(&0i32.to_be_bytes()); // batchLength, set below
    out.extend_from_slice(&opts.partition_leader_epoch.to_be_bytes());
    out.extend_from_slice(&[2]); // magic
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, set below
    out.extend_from_slice(&i16::from(opts.compression.id()).to_be_bytes());
    out.extend_from_slice(&(count - 1).to_be_bytes()); // lastOffsetDelta
    out.extend_from_slice(&base_ts.to_be_bytes());
    out.extend_from_slice(&max_ts.to_be_bytes());
    out.extend_from_slice(&opts.producer_id.to_be_bytes());
    out.extend_from_slice(&opts.producer_epoch.to_be_bytes());
    out.extend_from_slice(&opts.base_sequence.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    debug_assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(&section);
    finish_header(&mut out)?;
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::batch::Batch;

    fn rec(ts: i64, v: &str) -> NewRecord {
        NewRecord {
            timestamp: ts,
            key: None,
            value: Some(Bytes::copy_from_slice(v.as_bytes())),
            headers: vec![
                ("x-origin".into(), Some(Bytes::from_static(b"t-0@12"))),
                ("x-origin".into(), None),
            ],
        }
    }

    #[test]
    fn builds_a_fresh_batch() {
        let recs = [rec(50, "a"), rec(20, "b"), rec(90, "c")];
        let opts = BuildOptions::default()
            .compression(Compression::Gzip)
            .idempotent(7, 1, 100);
        let b = Batch::new(build_batch(&recs, &opts).unwrap()).unwrap();
        assert!(b.crc_valid());
        assert_eq!(b.base_offset(), 0);
        assert_eq!(b.last_offset_delta(), 2);
        assert_eq!(b.records_count(), 3);
        assert_eq!(b.base_timestamp(), 20);
        assert_eq!(b.max_timestamp(), 90);
        assert_eq!(
            (b.producer_id(), b.producer_epoch(), b.base_sequence()),
            (7, 1, 100)
        );
        assert_eq!(b.partition_leader_epoch(), -1);
        assert_eq!(b.compression(), Some(Compression::Gzip));
        assert!(!b.is_transactional() && !b.is_control());
        let d = b.decode().unwrap();
        let got: Vec<(i64, i64)> = d.records().map(|r| (r.offset, r.timestamp)).collect();
        assert_eq!(got, [(0, 50), (1, 20), (2, 90)]);
        let r = d.record(0).unwrap();
        assert_eq!(r.key, None);
        assert_eq!(r.headers.len(), 2);
        assert_eq!(r.headers[1].value, None);
    }

    #[test]
    fn defaults_mean_no_producer() {
        let b = Batch::new(build_batch(&[rec(1, "a")], &BuildOptions::default()).unwrap()).unwrap();
        assert_eq!(
            (b.producer_id(), b.producer_epoch(), b.base_sequence()),
            (-1, -1, -1)
        );
        assert_eq!(b.compression(), Some(Compression::None));
    }

    #[test]
    fn empty_record_list_is_an_error() {
        assert!(matches!(
            build_batch(&[], &BuildOptions::default()),
            Err(BatchError::Invalid(_))
        ));
    }
}
