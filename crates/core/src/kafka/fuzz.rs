//! A fuzz-friendly entry point for the batch code: arbitrary bytes in,
//! panics only if an invariant of `segments`/`decode`/`splice` is broken.
//!
//! Kept as ordinary library code (no cargo-fuzz set-up) so that property
//! tests, a future fuzz target and ad-hoc checks all exercise the same list of
//! invariants.

use bytes::Bytes;

use crate::kafka::batch::{segments, Batch, Segment};
use crate::kafka::splice::splice;

/// Split `section`, and for every batch that decodes, splice it with the
/// removal mask (bit `i` of `remove`, counted across all decoded records in
/// order, set = drop) and, if `cut_index` is `Some(k)`, a cut before the
/// `k`-th record of each batch (skipped where that would be invalid). Panics
/// if any invariant fails:
/// - the segments are the section, byte for byte, with at most one
///   `Partial`, at the end;
/// - every rebuilt batch parses, has a valid CRC, the same baseOffset,
///   timestamps, producer fields and attribute bits 3-6, and the same next
///   offset (or the cut offset);
/// - its records are exactly the kept ones, with the same offsets,
///   timestamps, keys, values and headers, and the same raw bytes.
pub fn check_splice_invariants(section: &[u8], remove: &[u8], cut_index: Option<usize>) {
    let section = Bytes::copy_from_slice(section);
    let segs = segments(&section);
    let joined: Vec<u8> = segs.iter().flat_map(|s| s.bytes().to_vec()).collect();
    assert_eq!(
        joined,
        &section[..],
        "segments must cover the section exactly"
    );
    for (i, s) in segs.iter().enumerate() {
        if matches!(s, Segment::Partial(_)) {
            assert_eq!(i, segs.len() - 1, "Partial only at the end");
            assert!(!s.bytes().is_empty());
        }
    }
    let mut bit = 0usize;
    for seg in &segs {
        let Segment::Batch(batch) = seg else { continue };
        walks_agree(batch);
        let Ok(decoded) = batch.decode() else {
            continue;
        };
        let keep: Vec<bool> = (0..decoded.len())
            .map(|_| {
                let b = remove.get(bit / 8).is_some_and(|m| m >> (bit % 8) & 1 == 1);
                bit += 1;
                !b
            })
            .collect();
        let cut = cut_index
            .and_then(|k| decoded.offset(k))
            .filter(|&o| o > batch.base_offset() && o <= batch.next_offset());
        check_one(batch, &decoded, &keep, cut);
    }
}

/// An opened batch's first walk finds what `decode` finds: the same
/// error, or the same records, each record read alone the same as walked.
fn walks_agree(batch: &crate::kafka::batch::Batch) {
    let decoded = batch.decode().map_err(|e| e.to_string());
    let Ok(opened) = batch.open_with_limit(super::compression::DEFAULT_MAX_DECOMPRESSED) else {
        assert!(decoded.is_err(), "open fails only where decode does");
        return;
    };
    let mut walked = Vec::new();
    let end = opened.each_record(|i, r| walked.push((i, r.clone())));
    match (&decoded, end) {
        (Ok(d), Ok(())) => {
            assert_eq!(walked.len(), d.len());
            for (i, r) in &walked {
                assert_eq!(d.record(*i).as_ref(), Some(r));
                assert_eq!(opened.record(*i).as_ref(), Some(r));
            }
            let raws: Vec<&[u8]> = opened.raw_records().collect();
            let joined: Vec<u8> = raws.concat();
            assert_eq!(&joined[..], &opened.buffer()[..], "records tile the buffer");
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, &b.to_string());
            assert!(opened.check().is_err() && opened.record(0).is_none());
        }
        (a, b) => panic!("decode {a:?} but walk {b:?}"),
    }
}

/// Splice one batch and assert the invariants listed on
/// `check_splice_invariants`.
pub fn check_one(
    batch: &Batch,
    decoded: &crate::kafka::batch::DecodedBatch,
    keep: &[bool],
    cut: Option<i64>,
) {
    let out = match splice(batch, decoded, keep, cut) {
        Ok(out) => out,
        Err(e) => {
            // The only refusal for valid arguments: rewriting a control batch.
            assert!(batch.is_control(), "splice failed: {e}");
            return;
        }
    };
    let rebuilt = Batch::new(out).expect("rebuilt batch is one complete batch");
    assert!(rebuilt.crc_valid(), "crc");
    assert_eq!(rebuilt.base_offset(), batch.base_offset());
    assert_eq!(
        rebuilt.partition_leader_epoch(),
        batch.partition_leader_epoch()
    );
    assert_eq!(rebuilt.base_timestamp(), batch.base_timestamp());
    assert_eq!(rebuilt.max_timestamp(), batch.max_timestamp());
    assert_eq!(rebuilt.producer_id(), batch.producer_id());
    assert_eq!(rebuilt.producer_epoch(), batch.producer_epoch());
    assert_eq!(rebuilt.base_sequence(), batch.base_sequence());
    assert_eq!(rebuilt.attributes() & !7, batch.attributes() & !7);
    assert_eq!(
        rebuilt.next_offset(),
        cut.unwrap_or_else(|| batch.next_offset()),
        "next fetch offset"
    );
    let again = rebuilt.decode().expect("rebuilt batch decodes");
    let expected: Vec<usize> = (0..decoded.len())
        .filter(|&i| keep[i] && cut.is_none_or(|c| decoded.offset(i).is_some_and(|o| o < c)))
        .collect();
    assert_eq!(again.len(), expected.len());
    assert_eq!(rebuilt.records_count() as usize, expected.len());
    if expected.is_empty() {
        assert_eq!(rebuilt.codec_id(), 0, "an emptied batch is uncompressed");
        assert_eq!(rebuilt.bytes().len(), crate::kafka::batch::HEADER_LEN);
    } else {
        assert_eq!(rebuilt.codec_id(), batch.codec_id());
    }
    for (j, &i) in expected.iter().enumerate() {
        assert_eq!(again.record(j), decoded.record(i));
        assert_eq!(again.raw_record(j), decoded.raw_record(i));
    }
}
