//! Rebuilding a v2 batch that loses records (`splice`), and the header
//! patching shared with `builder`.
//!
//! Owned separately from `batch` (which only reads) because this is the one
//! place that writes batch bytes for clients: it keeps everything a consumer
//! uses to track its position (baseOffset, lastOffsetDelta, timestamps,
//! producer fields, attribute bits 3-6) and changes only batchLength,
//! recordsCount, crc and the records section, as Kafka's log cleaner does.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

use crate::kafka::batch::{
    Batch, BatchError, DecodedBatch, ATTRIBUTES, ATTR_CODEC_MASK, BATCH_LENGTH, CRC, HEADER_LEN,
    LAST_OFFSET_DELTA, LOG_OVERHEAD, RECORDS_COUNT,
};
use crate::kafka::compression::{self, Compression};
use crate::kafka::crc::{self, MARK_EVERY};

/// A batch as [`splice_runs`] rebuilds it, in pieces: new bytes (`head`:
/// the rewritten header, or a whole new batch), then ranges of the
/// original batch sent as they are (`runs`, slices of it, not copies),
/// then new bytes (`tail`: a commit marker). The ranges fit any copy of
/// the same batch (same length and CRC), which is how the verdict cache
/// keeps a spliced batch in a few dozen bytes instead of a copy.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rebuilt {
    head: Bytes,
    runs: Vec<(usize, usize)>,
    tail: Bytes,
}

impl Rebuilt {
    /// New bytes only.
    pub fn whole(bytes: Bytes) -> Rebuilt {
        Rebuilt {
            head: bytes,
            ..Rebuilt::default()
        }
    }

    /// The batch unchanged.
    fn unchanged(batch: &Batch) -> Rebuilt {
        Rebuilt {
            runs: vec![(0, batch.bytes().len())],
            ..Rebuilt::default()
        }
    }

    /// These pieces followed by `tail` (a batch of [`splice_runs`] has none).
    pub(crate) fn followed_by(self, tail: Bytes) -> Rebuilt {
        debug_assert!(self.tail.is_empty(), "one tail");
        Rebuilt { tail, ..self }
    }

    /// Whether every run lies within a batch of `len` bytes (as it does in
    /// any copy of the batch spliced).
    pub fn fits(&self, len: usize) -> bool {
        self.runs.iter().all(|&(s, e)| s <= e && e <= len)
    }

    /// The pieces in order, the runs sliced from `batch`: the bytes that
    /// were spliced, or a copy of them (same length and CRC; see
    /// [`Self::fits`]).
    pub fn pieces<'a>(&'a self, batch: &'a Bytes) -> impl Iterator<Item = Bytes> + 'a {
        let runs = self.runs.iter().map(|&(s, e)| batch.slice(s..e));
        std::iter::once(self.head.clone())
            .chain(runs)
            .chain(std::iter::once(self.tail.clone()))
            .filter(|b| !b.is_empty())
    }

    /// The pieces as one buffer (no copy when there is one piece).
    pub fn join(&self, batch: &Bytes) -> Bytes {
        join(&self.pieces(batch).collect::<Vec<_>>())
    }

    /// Bytes this takes to keep: the runs are ranges, not bytes.
    pub fn memory(&self) -> usize {
        self.head.len() + self.tail.len() + self.runs.len() * std::mem::size_of::<(usize, usize)>()
    }
}

/// Chunks of bytes as one buffer, the one way a list of chunks (a spliced
/// batch's pieces, a rebuilt records section) is made contiguous: no copy
/// when there is one chunk.
pub fn join(chunks: &[Bytes]) -> Bytes {
    match chunks {
        [] => Bytes::new(),
        [one] => one.clone(),
        _ => {
            let mut out = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
            for c in chunks {
                out.extend_from_slice(c);
            }
            out.freeze()
        }
    }
}

/// The most runs of kept records a spliced batch is sent as slices of
/// the original; one with more (many scattered removals) is copied into
/// one buffer, cheaper than as many pieces to write.
const MAX_RUNS: usize = 16;

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
    Ok(splice_runs(batch, decoded, keep, cut_before)?.join(batch.bytes()))
}

/// [`splice`] in pieces: an uncompressed batch that keeps at most
/// [`MAX_RUNS`] runs of records is a new header and those runs as slices
/// of the batch (nothing copied but the header).
pub fn splice_runs(
    batch: &Batch,
    decoded: &DecodedBatch,
    keep: &[bool],
    cut_before: Option<i64>,
) -> Result<Rebuilt, BatchError> {
    check_decoded(batch, decoded, keep)?;
    let last_offset_delta = last_offset_delta(batch, cut_before)?;
    // Offsets are read only for a cut.
    let kept: Cow<[bool]> = match cut_before {
        None => Cow::Borrowed(keep),
        Some(off) => (keep.iter().enumerate())
            .map(|(i, &k)| k && decoded.offset(i).is_none_or(|o| o < off))
            .collect(),
    };
    let n_kept = kept.iter().filter(|&&k| k).count();
    if n_kept == kept.len() && last_offset_delta == batch.last_offset_delta() {
        return Ok(Rebuilt::unchanged(batch));
    }
    if batch.is_control() {
        return Err(BatchError::Invalid(
            "control batches are passed through, never rewritten".into(),
        ));
    }
    rewrite(batch, decoded, (&kept, n_kept), last_offset_delta)
}

/// An error unless `decoded` was decoded from `batch` and `keep` has an
/// entry for each of its records.
fn check_decoded(batch: &Batch, decoded: &DecodedBatch, keep: &[bool]) -> Result<(), BatchError> {
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
    Ok(())
}

/// The spliced batch's lastOffsetDelta: the batch's own, or, cut before
/// `cut_before`, the one that makes the client fetch `cut_before` next.
fn last_offset_delta(batch: &Batch, cut_before: Option<i64>) -> Result<i32, BatchError> {
    let base = batch.base_offset();
    let Some(off) = cut_before else {
        return Ok(batch.last_offset_delta());
    };
    if off <= base || off > batch.next_offset() {
        return Err(BatchError::Invalid(format!(
            "cut_before {off} outside ({base}, {}]",
            batch.next_offset()
        )));
    }
    // off - 1 - base fits: base < off <= base + lastOffsetDelta + 1.
    i32::try_from(off - 1 - base)
        .map_err(|_| BatchError::Invalid(format!("cut_before {off} too far")))
}

/// `batch` rebuilt with the `n_kept` records `kept` and
/// `last_offset_delta`: a new header, then the kept runs of an uncompressed
/// batch as slices of it (copied when more than [`MAX_RUNS`]), the kept
/// records compressed again, or nothing (codec none) when none is kept.
fn rewrite(
    batch: &Batch,
    decoded: &DecodedBatch,
    (kept, n_kept): (&[bool], usize),
    last_offset_delta: i32,
) -> Result<Rebuilt, BatchError> {
    let src = batch.bytes();
    let mut attributes = batch.attributes();
    let mut out = BytesMut::with_capacity(HEADER_LEN);
    out.extend_from_slice(&src[..HEADER_LEN]);
    // Kept runs of an uncompressed batch, as ranges of the records section.
    let mut spans = Vec::new();
    if n_kept == 0 {
        attributes &= !ATTR_CODEC_MASK;
    } else if decoded.compression() == Compression::None {
        spans = (runs(kept))
            .map(|(first, end)| decoded.span(first, end))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| BatchError::Invalid("records not walked".into()))?;
    } else {
        out.extend_from_slice(&recompressed(decoded, kept)?);
    }
    out[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    out[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4].copy_from_slice(&last_offset_delta.to_be_bytes());
    let n = i32::try_from(n_kept).map_err(|_| BatchError::Invalid("too many records".into()))?;
    out[RECORDS_COUNT..RECORDS_COUNT + 4].copy_from_slice(&n.to_be_bytes());
    let records = decoded.buffer();
    let derived = derived_crc(decoded, &spans, &out[ATTRIBUTES..HEADER_LEN]);
    if spans.len() > MAX_RUNS {
        // Copied run by run into the header's buffer.
        out.reserve(spans.iter().map(|(s, e)| e - s).sum());
        spans
            .drain(..)
            .for_each(|(s, e)| out.extend_from_slice(&records[s..e]));
    }
    let sliced: Vec<&[u8]> = spans.iter().map(|&(s, e)| &records[s..e]).collect();
    set_length_and_crc(&mut out, &sliced, derived)?;
    Ok(Rebuilt {
        head: out.freeze(),
        runs: (spans.iter())
            .map(|&(s, e)| (HEADER_LEN + s, HEADER_LEN + e))
            .collect(),
        tail: Bytes::new(),
    })
}

/// The records `kept` of a compressed batch, compressed again with its
/// codec (and framing).
fn recompressed(decoded: &DecodedBatch, kept: &[bool]) -> Result<Vec<u8>, BatchError> {
    let kept_records =
        (decoded.raw_records().zip(kept.iter())).filter_map(|(r, &k)| k.then_some(r));
    let mut raw = Vec::with_capacity(decoded.buffer().len());
    kept_records.for_each(|r| raw.extend_from_slice(r));
    Ok(compression::compress(
        decoded.compression(),
        &raw,
        decoded.snappy_framing(),
    )?)
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

/// The CRC of an uncompressed batch that keeps the runs of records
/// `spans` (ranges of its records section) under the header `head`
/// (attributes to the records), derived from the running CRC of its
/// verification instead of read from every kept byte again: one step per
/// run. `None` when reading them is cheaper (many short runs), there are
/// no runs or no marks.
fn derived_crc(decoded: &DecodedBatch, spans: &[(usize, usize)], head: &[u8]) -> Option<u32> {
    let bytes: usize = spans.iter().map(|(s, e)| e - s).sum();
    if spans.is_empty() || spans.len() * DERIVE_RUN_COST > bytes {
        return None;
    }
    decoded
        .marks()
        .derive(decoded.buffer(), head, spans.iter().copied())
}

/// Set batchLength from the buffer's size and recompute the CRC. `out` holds
/// a whole batch (header + records section).
pub(crate) fn finish_header(out: &mut [u8]) -> Result<(), BatchError> {
    set_length_and_crc(out, &[], None)
}

/// [`finish_header`] for a batch of `out` followed by `more`, with the CRC
/// already known (`Some`), or computed.
fn set_length_and_crc(out: &mut [u8], more: &[&[u8]], crc: Option<u32>) -> Result<(), BatchError> {
    let total = out.len() + more.iter().map(|m| m.len()).sum::<usize>();
    let len = i32::try_from(total - LOG_OVERHEAD)
        .map_err(|_| BatchError::Invalid("batch larger than 2 GiB".into()))?;
    out[BATCH_LENGTH..BATCH_LENGTH + 4].copy_from_slice(&len.to_be_bytes());
    let read = |out: &[u8]| {
        let head = crc::crc32c(&out[ATTRIBUTES..]);
        more.iter().fold(head, |crc, m| crc::append(crc, m))
    };
    let crc = crc.unwrap_or_else(|| read(out));
    // Every test and fuzzer of splice checks a derived CRC here.
    debug_assert_eq!(crc, read(out), "derived crc");
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
        let spans = |keep: &[bool]| -> Vec<(usize, usize)> {
            runs(keep)
                .map(|(f, e)| decoded.span(f, e).unwrap())
                .collect()
        };
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
            assert!(
                derived_crc(&decoded, &spans(&keep), head).is_some(),
                "{cuts:?}"
            );
            run(&raw, &keep, None);
            run(&raw, &keep, Some(7500));
        }
        let alternate: Vec<bool> = (0..n).map(|i| i % 2 == 0).collect();
        assert_eq!(runs(&alternate).count(), n / 2);
        assert_eq!(derived_crc(&decoded, &spans(&alternate), head), None);
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

    /// An uncompressed batch that loses few records is sent as a new
    /// header and slices of the batch; with more runs than [`MAX_RUNS`]
    /// it is one new buffer. Either way the bytes are `splice`'s.
    #[test]
    fn kept_runs_are_slices_of_the_batch_until_there_are_too_many() {
        let raw = RawBatch {
            records: (0..200).map(|i| RawRecord::simple(i, "value")).collect(),
            ..RawBatch::default()
        };
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        let src = batch.bytes().as_ptr_range();
        let within = |p: &Bytes| src.contains(&p.as_ptr()) && p.len() < batch.bytes().len();
        for removed in [1, MAX_RUNS - 1, MAX_RUNS, MAX_RUNS + 1, 90] {
            let keep: Vec<bool> = (0..200).map(|i| i % 2 == 1 || i / 2 >= removed).collect();
            let runs = runs(&keep).count();
            let rebuilt = splice_runs(&batch, &decoded, &keep, None).unwrap();
            let pieces: Vec<Bytes> = rebuilt.pieces(batch.bytes()).collect();
            if runs <= MAX_RUNS {
                assert_eq!(pieces.len(), 1 + runs, "{removed}");
                assert_eq!(pieces[0].len(), HEADER_LEN);
                assert!(pieces[1..].iter().all(within), "{removed}: slices");
            } else {
                assert_eq!(pieces.len(), 1, "{removed}: one buffer");
                assert!(!within(&pieces[0]));
            }
            assert!(rebuilt.memory() < HEADER_LEN + 16 * (MAX_RUNS + 1) || runs > MAX_RUNS);
            // The same ranges fit a copy of the batch, not a shorter one.
            assert!(rebuilt.fits(batch.bytes().len()));
            assert_eq!(rebuilt.fits(batch.bytes().len() - 1), runs > MAX_RUNS);
            let copy = Bytes::copy_from_slice(batch.bytes());
            assert_eq!(rebuilt.join(&copy), rebuilt.join(batch.bytes()));
            run(&raw, &keep, None);
        }
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
