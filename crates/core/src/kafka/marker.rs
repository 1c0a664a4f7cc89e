//! Carrying a removed tail offset to the client: a batch that loses its last
//! record is spliced to end just before its last offset, and a commit marker
//! (a one-record control batch) takes that offset. Pure: bytes in, bytes out.
//!
//! Why: librdkafka's position and committed offset follow the records it
//! hands to the application (last delivered offset + 1) and the control
//! records it reads, not a batch's lastOffsetDelta (rdkafka_queue.c,
//! `rd_kafka_q_serve_rkmessages`; rdkafka_op.c, `rd_kafka_op_handle_std`:
//! "Control messages must not be exposed to the application but we need to
//! store their offsets", librdkafka issue 2539, fixed in 1.4). A partition
//! that ends in removed records therefore left librdkafka one or more
//! offsets short of the high watermark, for ever on a quiet partition.
//! kafkajs resolves an offset it sees only through records too.
//!
//! The marker is what a transactional log holds after a batch: data, then a
//! commit marker at the next offset. It belongs to no producer (producerId
//! -1), so it can neither end nor open a transaction: read_committed clients
//! skip COMMIT markers (librdkafka "always ignore", Java, kafka-python and
//! kafkajs act only on ABORT), read_uncommitted clients skip every control
//! batch. A marker is only ever written over an offset whose record was
//! removed for good (diverted and acknowledged, or dropped): never at a
//! hold, which must make the client fetch that offset again.

use bytes::{Bytes, BytesMut};

use crate::kafka::batch::{
    Batch, BatchError, DecodedBatch, ATTRIBUTES, ATTR_CODEC_MASK, ATTR_CONTROL, ATTR_TRANSACTIONAL,
    BASE_OFFSET, HEADER_LEN, LAST_OFFSET_DELTA, RECORDS_COUNT,
};
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::kafka::splice::{finish_header, splice_runs, Rebuilt};

/// Control record key: version 0, type 1 (COMMIT).
const COMMIT_KEY: [u8; 4] = [0, 0, 0, 1];
/// Control record value (EndTransactionMarker): version 0, coordinatorEpoch 0.
const COMMIT_VALUE: [u8; 6] = [0; 6];

/// `splice(batch, decoded, keep, None)`, except that when the batch's last
/// record is removed the result ends with a commit marker at the batch's
/// last offset (baseOffset + lastOffsetDelta): the kept records in a batch
/// cut just before that offset (left out when the marker is the batch's
/// only offset), then the marker. The client's next fetch offset is the
/// same either way (the batch's last offset + 1).
///
/// Anything else (nothing removed, the last record kept, a control batch,
/// a record outside the batch's offset range) is exactly `splice`.
pub fn splice_marking_tail(
    batch: &Batch,
    decoded: &DecodedBatch,
    keep: &[bool],
) -> Result<Bytes, BatchError> {
    Ok(splice_marking_tail_runs(batch, decoded, keep)?.join(batch.bytes()))
}

/// [`splice_marking_tail`] in pieces ([`splice_runs`]).
pub fn splice_marking_tail_runs(
    batch: &Batch,
    decoded: &DecodedBatch,
    keep: &[bool],
) -> Result<Rebuilt, BatchError> {
    let Some(last) = removed_tail(batch, decoded, keep) else {
        return splice_runs(batch, decoded, keep, None);
    };
    let marker = commit_marker(last, batch.partition_leader_epoch(), batch.max_timestamp())?;
    if last == batch.base_offset() {
        return Ok(Rebuilt::whole(marker));
    }
    Ok(splice_runs(batch, decoded, keep, Some(last))?.followed_by(marker))
}

/// What a client gets in place of a batch removed whole (its records
/// diverted as one raw DLT record because they cannot be read): an empty
/// batch over its offsets but the last (its header kept, recordsCount 0,
/// codec none), then a commit marker at the last offset, so every client's
/// position passes the batch. Only the header is read, never the records.
pub fn replace_whole(batch: &Batch) -> Result<Bytes, BatchError> {
    let base = batch.base_offset();
    let last = batch.last_offset();
    if batch.is_control() || last < base {
        return Err(BatchError::Invalid(
            "only a data batch with a sane offset range is replaced".into(),
        ));
    }
    let marker = commit_marker(last, batch.partition_leader_epoch(), batch.max_timestamp())?;
    if last == base {
        return Ok(marker);
    }
    let delta = i32::try_from(last - 1 - base)
        .map_err(|_| BatchError::Invalid("offset range too large".into()))?;
    let mut out = BytesMut::with_capacity(HEADER_LEN + marker.len());
    out.extend_from_slice(&batch.bytes()[..HEADER_LEN]);
    let attributes = batch.attributes() & !ATTR_CODEC_MASK;
    out[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    out[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4].copy_from_slice(&delta.to_be_bytes());
    out[RECORDS_COUNT..RECORDS_COUNT + 4].copy_from_slice(&0i32.to_be_bytes());
    finish_header(&mut out)?;
    out.extend_from_slice(&marker);
    Ok(out.freeze())
}

/// The batch's last offset, if a marker may take it: the batch's final
/// record is removed and every kept record lies before the last offset
/// (a malformed batch with records past lastOffsetDelta is left alone, so a
/// cut can never drop a kept record).
fn removed_tail(batch: &Batch, decoded: &DecodedBatch, keep: &[bool]) -> Option<i64> {
    if batch.is_control() || keep.len() != decoded.len() || keep.last() != Some(&false) {
        return None;
    }
    let base = batch.base_offset();
    let last = base.checked_add(i64::from(batch.last_offset_delta()))?;
    if last < base {
        return None;
    }
    let kept_before_last = (0..decoded.len())
        .filter(|&i| keep[i])
        .all(|i| decoded.offset(i).is_some_and(|o| (base..last).contains(&o)));
    kept_before_last.then_some(last)
}

/// A one-record control batch holding a COMMIT marker at `offset`.
pub fn commit_marker(
    offset: i64,
    partition_leader_epoch: i32,
    timestamp: i64,
) -> Result<Bytes, BatchError> {
    let record = NewRecord {
        timestamp,
        key: Some(Bytes::from_static(&COMMIT_KEY)),
        value: Some(Bytes::from_static(&COMMIT_VALUE)),
        headers: Vec::new(),
    };
    let opts = BuildOptions {
        partition_leader_epoch,
        ..BuildOptions::default()
    };
    let mut out = BytesMut::from(&build_batch(&[record], &opts)?[..]);
    out[BASE_OFFSET..BASE_OFFSET + 8].copy_from_slice(&offset.to_be_bytes());
    let attributes = ATTR_CONTROL | ATTR_TRANSACTIONAL;
    out[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    finish_header(&mut out)?;
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::batch::{segments, Segment, ATTR_LOG_APPEND_TIME};
    use crate::kafka::compression::Compression;
    use crate::kafka::splice::splice;
    use crate::kafka::testutil::{RawBatch, RawRecord};

    /// `RawBatch::compacted_five` with a partition leader epoch to carry.
    fn five(codec: Compression, flags: i16) -> RawBatch {
        RawBatch {
            leader_epoch: 7,
            ..RawBatch::compacted_five(codec, flags)
        }
    }

    /// (control?, baseOffset, record offsets, next offset) of each batch.
    fn shape(section: &Bytes) -> Vec<(bool, i64, Vec<i64>, i64)> {
        segments(section)
            .into_iter()
            .map(|s| match s {
                Segment::Batch(b) => {
                    assert!(b.crc_valid(), "crc");
                    let d = b.decode().unwrap();
                    let offsets = d.records().map(|r| r.offset).collect();
                    (b.is_control(), b.base_offset(), offsets, b.next_offset())
                }
                other => panic!("not a whole batch: {other:?}"),
            })
            .collect()
    }

    fn run(raw: &RawBatch, keep: &[bool]) -> Bytes {
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        splice_marking_tail(&batch, &decoded, keep).unwrap()
    }

    #[test]
    fn a_removed_tail_ends_in_a_commit_marker_at_the_batch_last_offset() {
        for codec in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let raw = five(codec, 0);
            let out = run(&raw, &[true, false, true, true, false]);
            assert_eq!(
                shape(&out),
                vec![
                    (false, 1000, vec![1000, 1003, 1004], 1009),
                    (true, 1009, vec![1009], 1010)
                ],
                "{codec:?}"
            );
            let data = Batch::new(out.slice(..out.len() - 78)).unwrap();
            assert_eq!(data.compression(), Some(codec), "codec kept");
        }
    }

    #[test]
    fn the_marker_is_a_commit_of_no_producer_with_the_batch_epoch() {
        let raw = five(Compression::None, ATTR_LOG_APPEND_TIME);
        let out = run(&raw, &[true, true, true, true, false]);
        let segs = segments(&out);
        let Some(Segment::Batch(m)) = segs.last() else {
            panic!("no marker")
        };
        assert!(m.is_control() && m.is_transactional());
        assert_eq!(m.compression(), Some(Compression::None));
        assert_eq!(
            (m.producer_id(), m.producer_epoch(), m.base_sequence()),
            (-1, -1, -1)
        );
        assert_eq!(m.partition_leader_epoch(), 7);
        assert_eq!((m.last_offset_delta(), m.records_count()), (0, 1));
        assert_eq!(m.max_timestamp(), raw.max_timestamp);
        assert_eq!(m.bytes().len(), 78);
        let d = m.decode().unwrap();
        let r = d.record(0).unwrap();
        assert_eq!(r.key, Some(&COMMIT_KEY[..]));
        assert_eq!(r.value, Some(&COMMIT_VALUE[..]));
        assert!(r.headers.is_empty());
    }

    #[test]
    fn an_emptied_batch_is_an_empty_header_then_the_marker() {
        let raw = five(Compression::Lz4, 0);
        assert_eq!(
            shape(&run(&raw, &[false; 5])),
            vec![(false, 1000, vec![], 1009), (true, 1009, vec![1009], 1010)]
        );
    }

    #[test]
    fn a_one_offset_batch_becomes_only_the_marker() {
        let raw = RawBatch {
            base_offset: 42,
            records: vec![RawRecord::simple(0, "x")],
            ..RawBatch::default()
        };
        assert_eq!(shape(&run(&raw, &[false])), vec![(true, 42, vec![42], 43)]);
    }

    #[test]
    fn a_kept_tail_or_nothing_removed_is_plain_splice() {
        let raw = five(Compression::Snappy, 0);
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        for keep in [
            [true; 5],
            [false, true, true, true, true],
            [true, false, false, false, true],
        ] {
            assert_eq!(
                splice_marking_tail(&batch, &decoded, &keep).unwrap(),
                splice(&batch, &decoded, &keep, None).unwrap()
            );
        }
        let out = splice_marking_tail(&batch, &decoded, &[true; 5]).unwrap();
        assert_eq!(out.as_ptr(), batch.bytes().as_ptr(), "untouched: no copy");
    }

    #[test]
    fn a_record_past_last_offset_delta_gets_no_marker() {
        // lastOffsetDelta 1 but a record at delta 3: cutting at 1001 would
        // drop the kept record 1003.
        let raw = RawBatch {
            records: vec![
                RawRecord::simple(0, "a"),
                RawRecord::simple(3, "b"),
                RawRecord::simple(1, "c"),
            ],
            last_offset_delta: Some(1),
            ..RawBatch::default()
        };
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        let keep = [true, true, false];
        assert_eq!(
            splice_marking_tail(&batch, &decoded, &keep).unwrap(),
            splice(&batch, &decoded, &keep, None).unwrap()
        );
    }

    #[test]
    fn control_batches_are_never_marked() {
        let marker = commit_marker(5, 0, 0).unwrap();
        let batch = Batch::new(marker.clone()).unwrap();
        let decoded = batch.decode().unwrap();
        assert!(removed_tail(&batch, &decoded, &[false]).is_none());
        assert_eq!(
            splice_marking_tail(&batch, &decoded, &[true]).unwrap(),
            marker
        );
    }

    #[test]
    fn a_batch_replaced_whole_keeps_its_offsets_and_ends_in_a_marker() {
        let mut raw = five(Compression::Zstd, 0).encode().to_vec();
        let last = raw.len() - 1;
        raw[last] ^= 0x55; // corrupt: only the header is used
        let batch = Batch::new(Bytes::from(raw)).unwrap();
        assert!(batch.decode().is_err());
        let out = replace_whole(&batch).expect("replaced");
        let segs = segments(&out);
        let [Segment::Batch(empty), Segment::Batch(marker)] = &segs[..] else {
            panic!("an empty batch then a marker: {} segments", segs.len());
        };
        assert_eq!((empty.base_offset(), empty.records_count()), (1000, 0));
        assert_eq!(empty.next_offset(), 1009);
        assert_eq!(empty.compression(), Some(Compression::None));
        assert!(empty.crc_valid() && marker.crc_valid());
        assert!(marker.is_control());
        assert_eq!((marker.base_offset(), marker.next_offset()), (1009, 1010));
    }
}
