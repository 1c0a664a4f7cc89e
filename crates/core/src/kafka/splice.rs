//! Rebuilding a v2 batch that loses records (`splice`), and the header
//! patching shared with `builder`.
//!
//! Owned separately from `batch` (which only reads) because this is the one
//! place that writes batch bytes for clients: it keeps everything a consumer
//! uses to track its position (baseOffset, lastOffsetDelta, timestamps,
//! producer fields, attribute bits 3-6) and changes only batchLength,
//! recordsCount, crc and the records section, as Kafka's log cleaner does.

use bytes::{Bytes, BytesMut};

use crate::kafka::batch::{
    Batch, BatchError, DecodedBatch, ATTRIBUTES, ATTR_CODEC_MASK, BATCH_LENGTH, CRC, HEADER_LEN,
    LAST_OFFSET_DELTA, LOG_OVERHEAD, RECORDS_COUNT,
};
use crate::kafka::compression::{self, Compression};
use crate::kafka::crc::MARK_EVERY;

/// Rebuild `batch` keeping only the records `keep[i] == true`, in order.
/// If `cut_before` is `Some(offset)`, records at or after `offset` are also
/// dropped and lastOffsetDelta is lowered so the client fetches `offset` next
/// (used to hold a partition at a record not yet safely diverted).
///
/// `decoded` must come from `batch.decode()` and `keep.len()` must equal
/// `decoded.len()`. `cut_before` must satisfy
/// `baseOffset < offset <= batch.next_offset()`.
///
/// If nothing changes, the original bytes are returned (no copy). A batch
/// that loses every record is written as an empty header: recordsCount 0,
/// codec none, lastOffsetDelta kept (or cut). Control batches are never
/// rewritten: asking to drop anything from one is an error.
pub fn splice(
    batch: &Batch,
    decoded: &DecodedBatch,
    keep: &[bool],
    cut_before: Option<i64>,
) -> Result<Bytes, BatchError> {
    if keep.len() != decoded.len() {
        return Err(BatchError::Invalid(format!(
            "keep has {} entries for {} records",
            keep.len(),
            decoded.len()
        )));
    }
    let count = usize::try_from(batch.records_count()).ok();
    if count != Some(decoded.len())
        || decoded.base_offset() != batch.base_offset()
        || Some(decoded.compression()) != batch.compression()
    {
        return Err(BatchError::Invalid(
            "decoded records do not belong to this batch".into(),
        ));
    }
    let base = batch.base_offset();
    let last_offset_delta = match cut_before {
        None => batch.last_offset_delta(),
        Some(off) => {
            if off <= base || off > batch.next_offset() {
                return Err(BatchError::Invalid(format!(
                    "cut_before {off} outside ({base}, {}]",
                    batch.next_offset()
                )));
            }
            // off - 1 - base fits: base < off <= base + lastOffsetDelta + 1.
            i32::try_from(off - 1 - base)
                .map_err(|_| BatchError::Invalid(format!("cut_before {off} too far")))?
        }
    };
    // Offsets are read only for a cut.
    let kept: Vec<bool> = (keep.iter().enumerate())
        .map(|(i, &k)| k && cut_before.is_none_or(|off| decoded.offset(i).is_none_or(|o| o < off)))
        .collect();
    let n_kept = kept.iter().filter(|&&k| k).count();
    if n_kept == kept.len() && last_offset_delta == batch.last_offset_delta() {
        return Ok(batch.bytes().clone());
    }
    if batch.is_control() {
        return Err(BatchError::Invalid(
            "control batches are passed through, never rewritten".into(),
        ));
    }

    let src = batch.bytes();
    let mut attributes = batch.attributes();
    let mut out = BytesMut::with_capacity(HEADER_LEN + decoded.buffer().len());
    out.extend_from_slice(&src[..HEADER_LEN]);
    // Copied record by record. One copy per run of kept records would be
    // fewer calls, but glibc copies a long run with `rep movsb`, which
    // valgrind counts once per byte (+166 a record, BENCHMARKS.md), so
    // the instruction counts that judge this code could not weigh it;
    // its time was not measured.
    let kept_records = || (decoded.raw_records().zip(&kept)).filter_map(|(r, &k)| k.then_some(r));
    if n_kept == 0 {
        attributes &= !ATTR_CODEC_MASK;
    } else if decoded.compression() == Compression::None {
        kept_records().for_each(|r| out.extend_from_slice(r));
    } else {
        let mut raw = Vec::with_capacity(decoded.buffer().len());
        kept_records().for_each(|r| raw.extend_from_slice(r));
        let codec = decoded.compression();
        out.extend_from_slice(&compression::compress(
            codec,
            &raw,
            decoded.snappy_framing(),
        )?);
    }
    out[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    out[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4].copy_from_slice(&last_offset_delta.to_be_bytes());
    let n = i32::try_from(n_kept).map_err(|_| BatchError::Invalid("too many records".into()))?;
    out[RECORDS_COUNT..RECORDS_COUNT + 4].copy_from_slice(&n.to_be_bytes());
    let derived = match decoded.compression() {
        Compression::None if n_kept > 0 => {
            derived_crc(decoded, &kept, &out[ATTRIBUTES..HEADER_LEN])
        }
        _ => None,
    };
    set_length_and_crc(&mut out, derived)?;
    Ok(out.freeze())
}

/// The runs of `true` in `kept`, as `[first, end)` indexes.
fn runs(kept: &[bool]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let first = i + kept.get(i..)?.iter().position(|&k| k)?;
        i = kept[first..]
            .iter()
            .position(|&k| !k)
            .map_or(kept.len(), |p| first + p);
        Some((first, i))
    })
}

/// What deriving a CRC costs per run of kept records, in bytes that
/// reading them would cost instead: half of [`MARK_EVERY`] read again at
/// each end on average, and a shift (a few thousand instructions).
const DERIVE_RUN_COST: usize = MARK_EVERY + 8192;

/// The CRC of an uncompressed batch that keeps the records `kept` under
/// the header `head` (attributes to the records), derived from the
/// running CRC of its verification instead of read from every kept byte
/// again (`crc`): one step per run of kept records. `None` when reading
/// them is cheaper (many short runs) or there are no marks.
fn derived_crc(decoded: &DecodedBatch, kept: &[bool], head: &[u8]) -> Option<u32> {
    let spans: Vec<(usize, usize)> = (runs(kept))
        .map(|(first, end)| decoded.span(first, end))
        .collect::<Option<_>>()?;
    let bytes: usize = spans.iter().map(|(s, e)| e - s).sum();
    if spans.len() * DERIVE_RUN_COST > bytes {
        return None;
    }
    decoded
        .marks()
        .derive(decoded.buffer(), head, spans.iter().copied())
}

/// Set batchLength from the buffer's size and recompute the CRC. `out` holds
/// a whole batch (header + records section).
pub(crate) fn finish_header(out: &mut [u8]) -> Result<(), BatchError> {
    set_length_and_crc(out, None)
}

/// [`finish_header`] with the CRC already known (`Some`), or computed.
fn set_length_and_crc(out: &mut [u8], crc: Option<u32>) -> Result<(), BatchError> {
    let len = i32::try_from(out.len() - LOG_OVERHEAD)
        .map_err(|_| BatchError::Invalid("batch larger than 2 GiB".into()))?;
    out[BATCH_LENGTH..BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
    let crc = crc.unwrap_or_else(|| crc32c::crc32c(&out[ATTRIBUTES..]));
    // Every test and fuzzer of splice checks a derived CRC here.
    debug_assert_eq!(crc, crc32c::crc32c(&out[ATTRIBUTES..]), "derived crc");
    out[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::batch::{
        segments, Segment, ATTR_CONTROL, ATTR_DELETE_HORIZON, ATTR_LOG_APPEND_TIME,
        ATTR_TRANSACTIONAL,
    };
    use crate::kafka::compression::SnappyFraming;
    use crate::kafka::fuzz::check_one;
    use crate::kafka::testutil::{expected_independent, independent_decode, RawBatch, RawRecord};

    const CODECS: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    fn five(codec: Compression, flags: i16) -> RawBatch {
        RawBatch::compacted_five(codec, flags)
    }

    /// Splice `raw` and compare against both decoders; returns the output.
    fn run(raw: &RawBatch, keep: &[bool], cut: Option<i64>) -> Bytes {
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        check_one(&batch, &decoded, keep, cut);
        let out = splice(&batch, &decoded, keep, cut).unwrap();
        let survivors: Vec<&RawRecord> = raw
            .records
            .iter()
            .zip(keep)
            .filter(|(r, k)| {
                **k && cut.is_none_or(|c| raw.base_offset + i64::from(r.offset_delta) < c)
            })
            .map(|(r, _)| r)
            .collect();
        if !survivors.is_empty() {
            assert_eq!(
                independent_decode(&out).unwrap(),
                expected_independent(raw.base_offset, raw.base_timestamp, &survivors)
            );
        }
        out
    }

    #[test]
    fn poison_first_middle_last_and_all_for_every_codec() {
        for codec in CODECS {
            let raw = five(codec, 0);
            for keep in [
                [false, true, true, true, true],
                [true, true, false, true, true],
                [true, true, true, true, false],
                [false, true, false, true, false],
            ] {
                let out = Batch::new(run(&raw, &keep, None)).unwrap();
                assert_eq!(out.compression(), Some(codec), "codec kept");
                assert_eq!(out.next_offset(), 1010);
                assert_eq!(out.last_offset_delta(), 9);
            }
            let out = Batch::new(run(&raw, &[false; 5], None)).unwrap();
            assert_eq!(out.records_count(), 0);
            assert_eq!(out.compression(), Some(Compression::None));
            assert_eq!(out.bytes().len(), HEADER_LEN);
            assert_eq!(out.last_offset_delta(), 9);
            assert_eq!(out.next_offset(), 1010);
            assert!(out.crc_valid());
            assert!(out.decode().unwrap().is_empty());
        }
    }

    #[test]
    fn runs_are_the_stretches_of_kept_records() {
        let of = |k: &[bool]| runs(k).collect::<Vec<_>>();
        assert_eq!(of(&[]), []);
        assert_eq!(of(&[false, false]), []);
        assert_eq!(of(&[true]), [(0, 1)]);
        assert_eq!(of(&[true, false, true, true]), [(0, 1), (2, 4)]);
        assert_eq!(of(&[false, true, true, false]), [(1, 3)]);
    }

    /// A large uncompressed batch that loses a few records gets its CRC
    /// derived from the marks of its verification (held to a full read by
    /// `set_length_and_crc` in debug builds, and here by `check_one`); one
    /// that keeps many short runs has its CRC read in full.
    #[test]
    fn a_large_batch_that_loses_few_records_derives_its_crc() {
        let raw = RawBatch {
            base_offset: 5000,
            records: (0..3000)
                .map(|i| RawRecord::simple(i, &"v".repeat(60 + i as usize % 50)))
                .collect(),
            ..RawBatch::default()
        };
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        let head = &batch.bytes()[ATTRIBUTES..HEADER_LEN];
        let n = decoded.len();
        for cuts in [
            &[0][..],
            &[1500],
            &[n - 1],
            &[3, 4, 5, n - 1],
            &[100, 1000, 2000],
        ] {
            let mut keep = vec![true; n];
            for &c in cuts {
                keep[c] = false;
            }
            assert!(derived_crc(&decoded, &keep, head).is_some(), "{cuts:?}");
            run(&raw, &keep, None);
            run(&raw, &keep, Some(7500));
        }
        let alternate: Vec<bool> = (0..n).map(|i| i % 2 == 0).collect();
        assert_eq!(runs(&alternate).count(), n / 2);
        assert_eq!(derived_crc(&decoded, &alternate, head), None);
        run(&raw, &alternate, None);
        // Compressed batches have no marks: their CRC is always read.
        let lz4 = RawBatch {
            codec: Compression::Lz4,
            ..raw.clone()
        };
        let batch = Batch::new(lz4.encode()).unwrap();
        assert!(batch.decode().unwrap().marks().is_empty());
        run(&lz4, &[vec![false], vec![true; n - 1]].concat(), None);
    }

    #[test]
    fn nothing_removed_returns_the_original_bytes() {
        let batch = Batch::new(five(Compression::Gzip, 0).encode()).unwrap();
        let decoded = batch.decode().unwrap();
        let out = splice(&batch, &decoded, &[true; 5], None).unwrap();
        assert_eq!(out.as_ptr(), batch.bytes().as_ptr());
        let out = splice(&batch, &decoded, &[true; 5], Some(batch.next_offset())).unwrap();
        assert_eq!(out.as_ptr(), batch.bytes().as_ptr());
    }

    #[test]
    fn flags_and_producer_fields_survive() {
        for flags in [
            ATTR_TRANSACTIONAL,
            ATTR_LOG_APPEND_TIME,
            ATTR_DELETE_HORIZON,
            ATTR_TRANSACTIONAL | ATTR_LOG_APPEND_TIME | ATTR_DELETE_HORIZON,
        ] {
            for codec in [Compression::None, Compression::Zstd] {
                let raw = five(codec, flags);
                let out = Batch::new(run(&raw, &[true, false, true, true, true], None)).unwrap();
                assert_eq!(out.attributes(), flags | i16::from(codec.id()));
                assert_eq!(out.producer_id(), raw.producer_id);
                assert_eq!(out.producer_epoch(), raw.producer_epoch);
                assert_eq!(out.base_sequence(), raw.base_sequence);
                assert_eq!(out.partition_leader_epoch(), raw.leader_epoch);
                assert_eq!(out.max_timestamp(), raw.max_timestamp);
                let empty = Batch::new(run(&raw, &[false; 5], None)).unwrap();
                assert_eq!(empty.attributes(), flags, "emptied: codec none, flags kept");
            }
        }
    }

    #[test]
    fn control_batches_are_never_rewritten() {
        let raw = RawBatch {
            flags: ATTR_CONTROL | ATTR_TRANSACTIONAL,
            records: vec![RawRecord {
                key: Some(vec![0, 0, 0, 1]), // COMMIT marker key
                value: Some(vec![0, 0, 0, 0, 0, 5]),
                headers: vec![],
                ..RawRecord::simple(0, "")
            }],
            ..RawBatch::default()
        };
        let bytes = raw.encode();
        let batch = Batch::new(bytes.clone()).unwrap();
        assert!(batch.is_control());
        let decoded = batch.decode().unwrap();
        assert_eq!(splice(&batch, &decoded, &[true], None).unwrap(), bytes);
        assert!(matches!(
            splice(&batch, &decoded, &[false], None),
            Err(BatchError::Invalid(_))
        ));
    }

    #[test]
    fn cut_holds_the_partition_at_an_offset() {
        for codec in CODECS {
            let raw = five(codec, ATTR_TRANSACTIONAL);
            // Cut at 1003: keep 1000 and 1001 (minus removed), fetch 1003 next.
            let out = Batch::new(run(&raw, &[true; 5], Some(1003))).unwrap();
            assert_eq!(out.next_offset(), 1003);
            assert_eq!(out.records_count(), 2);
            let out = Batch::new(run(&raw, &[false, true, true, true, true], Some(1003))).unwrap();
            assert_eq!(out.records_count(), 1);
            // Cut at a gap (1006): keeps 1000..1004.
            let out = Batch::new(run(&raw, &[true; 5], Some(1006))).unwrap();
            assert_eq!((out.records_count(), out.next_offset()), (4, 1006));
            // Cut right after the base: an empty batch that fetches base + 1 next.
            let out = Batch::new(run(&raw, &[true; 5], Some(1001))).unwrap();
            assert_eq!((out.records_count(), out.next_offset()), (1, 1001));
            let out = Batch::new(run(&raw, &[false; 5], Some(1001))).unwrap();
            assert_eq!((out.records_count(), out.next_offset()), (0, 1001));
            assert_eq!(out.last_offset_delta(), 0);
        }
    }

    #[test]
    fn invalid_requests_are_errors() {
        let batch = Batch::new(five(Compression::None, 0).encode()).unwrap();
        let decoded = batch.decode().unwrap();
        for cut in [i64::MIN, 999, 1000, 1011, i64::MAX] {
            assert!(
                matches!(
                    splice(&batch, &decoded, &[true; 5], Some(cut)),
                    Err(BatchError::Invalid(_))
                ),
                "cut {cut}"
            );
        }
        assert!(matches!(
            splice(&batch, &decoded, &[true; 4], None),
            Err(BatchError::Invalid(_))
        ));
        let other = Batch::new(
            RawBatch {
                records: vec![RawRecord::simple(0, "x")],
                ..RawBatch::default()
            }
            .encode(),
        )
        .unwrap();
        assert!(matches!(
            splice(&other, &decoded, &[true; 5], None),
            Err(BatchError::Invalid(_))
        ));
    }

    #[test]
    fn snappy_framing_is_kept() {
        for framing in [SnappyFraming::Raw, SnappyFraming::Xerial] {
            let raw = RawBatch {
                framing,
                ..five(Compression::Snappy, 0)
            };
            let out = Batch::new(run(&raw, &[true, false, true, false, true], None)).unwrap();
            let section = out.records_section();
            assert_eq!(
                section.starts_with(crate::kafka::compression::XERIAL_MAGIC),
                framing == SnappyFraming::Xerial
            );
            assert_eq!(out.decode().unwrap().snappy_framing(), framing);
        }
    }

    #[test]
    fn spliced_section_keeps_legacy_and_partial_bytes() {
        let legacy = {
            // magic-0 message: offset, size 14, crc, magic 0, attributes, key -1, value -1.
            let mut m = 5i64.to_be_bytes().to_vec();
            m.extend_from_slice(&14i32.to_be_bytes());
            m.extend_from_slice(&[
                1, 2, 3, 4, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ]);
            m
        };
        let batch = five(Compression::Lz4, 0).encode();
        let mut section = legacy.clone();
        section.extend_from_slice(&batch);
        section.extend_from_slice(&batch[..100]);
        let section = Bytes::from(section);
        let mut out = Vec::new();
        for seg in segments(&section) {
            match seg {
                Segment::Batch(b) => {
                    let d = b.decode().unwrap();
                    out.extend_from_slice(
                        &splice(&b, &d, &[true, false, true, true, true], None).unwrap(),
                    );
                }
                Segment::Legacy(l) => {
                    assert_eq!(&l[..], &legacy[..]);
                    out.extend_from_slice(&l);
                }
                Segment::Partial(p) => {
                    assert_eq!(&p[..], &batch[..100]);
                    out.extend_from_slice(&p);
                }
            }
        }
        assert!(out.starts_with(&legacy));
        assert!(out.ends_with(&batch[..100]));
        assert!(out.len() < section.len());
    }
}
