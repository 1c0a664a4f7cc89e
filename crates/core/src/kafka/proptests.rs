//! Property tests for `batch` + `splice` + `builder`: for any batch (random
//! records with null keys/values and duplicate header keys, offset gaps, any
//! codec, any flags) and any removal set and cut, the spliced batch parses
//! with an independent decoder (`kafka-protocol`), has a valid CRC, keeps
//! the surviving records exactly, and keeps the next fetch offset (or moves
//! it to the cut).

use bytes::Bytes;
use proptest::prelude::*;

use crate::kafka::batch::{
    segments, Batch, Segment, ATTR_DELETE_HORIZON, ATTR_LOG_APPEND_TIME, ATTR_TRANSACTIONAL,
    HEADER_LEN,
};
use crate::kafka::builder::{build_batch, BuildOptions, NewRecord};
use crate::kafka::compression::{Compression, SnappyFraming};
use crate::kafka::fuzz::{check_one, check_splice_invariants};
use crate::kafka::marker::splice_marking_tail;
use crate::kafka::splice::splice;
use crate::kafka::testutil::{expected_independent, independent_decode, RawBatch, RawRecord};

fn codec() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Gzip),
        Just(Compression::Snappy),
        Just(Compression::Lz4),
        Just(Compression::Zstd),
    ]
}

fn bytes_opt() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        1 => Just(None),
        4 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Some),
    ]
}

fn headers() -> impl Strategy<Value = Vec<(String, Option<Vec<u8>>)>> {
    // A small key alphabet so duplicate keys are common.
    proptest::collection::vec(
        (
            prop_oneof![Just("a".to_string()), Just("b".to_string()), "[a-z]{0,6}"],
            bytes_opt(),
        ),
        0..5,
    )
}

fn raw_batch() -> impl Strategy<Value = RawBatch> {
    let records = proptest::collection::vec(
        (1i32..4, -1000i64..1000, bytes_opt(), bytes_opt(), headers()),
        1..25,
    )
    .prop_map(|rs| {
        let mut delta = -1;
        rs.into_iter()
            .map(|(gap, ts, key, value, headers)| {
                delta += gap; // strictly increasing, with gaps (compaction)
                RawRecord {
                    offset_delta: delta,
                    timestamp_delta: ts,
                    key,
                    value,
                    headers,
                }
            })
            .collect::<Vec<_>>()
    });
    (
        records,
        codec(),
        any::<bool>(),
        0i64..1 << 40,
        0i16..16,
        0i32..5,
        any::<i64>(),
        any::<i64>(),
    )
        .prop_map(
            |(records, codec, raw_snappy, base, flags, extra_lod, bts, mts)| {
                let last = records.last().map_or(0, |r| r.offset_delta);
                RawBatch {
                    base_offset: base,
                    // LogAppendTime, transactional, delete-horizon; never control.
                    flags: (flags << 3)
                        & (ATTR_LOG_APPEND_TIME | ATTR_TRANSACTIONAL | ATTR_DELETE_HORIZON),
                    codec,
                    framing: if raw_snappy {
                        SnappyFraming::Raw
                    } else {
                        SnappyFraming::Xerial
                    },
                    // Compacted tails: lastOffsetDelta may exceed the last record's delta.
                    last_offset_delta: Some(last + extra_lod),
                    base_timestamp: bts >> 2,
                    max_timestamp: mts,
                    records,
                    ..RawBatch::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn splice_keeps_survivors_and_next_offset(
        raw in raw_batch(),
        mask in proptest::collection::vec(any::<bool>(), 25),
        cut in proptest::option::of(0usize..30),
    ) {
        let bytes = raw.encode();
        let batch = Batch::new(bytes.clone()).unwrap();
        let decoded = batch.decode().unwrap();
        prop_assert_eq!(decoded.len(), raw.records.len());
        let keep: Vec<bool> = mask[..decoded.len()].to_vec();
        // A cut at a record offset, or (index past the end) anywhere up to next_offset.
        let cut = cut.map(|k| match decoded.offset(k) {
            Some(o) => o,
            None => batch.base_offset() + 1 + (k as i64 % (i64::from(batch.last_offset_delta()) + 1)),
        }).filter(|&o| o > batch.base_offset());

        // Invariants checked with our own decoder.
        check_one(&batch, &decoded, &keep, cut);

        let out = splice(&batch, &decoded, &keep, cut).unwrap();
        let rebuilt = Batch::new(out.clone()).unwrap();
        prop_assert!(rebuilt.crc_valid());
        prop_assert_eq!(rebuilt.next_offset(), cut.unwrap_or(batch.next_offset()));
        let survivors: Vec<&RawRecord> = raw
            .records
            .iter()
            .zip(&keep)
            .filter(|(r, k)| **k && cut.is_none_or(|c| raw.base_offset + i64::from(r.offset_delta) < c))
            .map(|(r, _)| r)
            .collect();
        prop_assert_eq!(rebuilt.records_count() as usize, survivors.len());

        // Independent decoder.
        if survivors.is_empty() {
            prop_assert_eq!(out.len(), HEADER_LEN);
            prop_assert_eq!(rebuilt.codec_id(), 0);
            prop_assert_eq!(rebuilt.attributes(), batch.attributes() & !7);
            prop_assert_eq!(rebuilt.batch_length(), 49);
            // The independent decoder must accept an emptied batch too.
            let recs = independent_decode(&out).map_err(TestCaseError::fail)?;
            prop_assert!(recs.is_empty());
        } else {
            let got = independent_decode(&out).map_err(TestCaseError::fail)?;
            prop_assert_eq!(got, expected_independent(raw.base_offset, raw.base_timestamp, &survivors));
        }
    }

    /// Large uncompressed batches that lose a few records, where a splice
    /// derives its CRC from the checked one's running CRC (`kafka::crc`):
    /// the spliced batch's CRC holds and it keeps exactly the survivors.
    #[test]
    fn a_large_batch_losing_few_records_keeps_a_valid_crc(
        sizes in proptest::collection::vec(0usize..4000, 20..120),
        lost in proptest::collection::vec(any::<prop::sample::Index>(), 0..5),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let raw = RawBatch {
            base_offset: 1 << 40,
            records: (sizes.iter().enumerate())
                .map(|(i, &n)| RawRecord::simple(i as i32, &"x".repeat(n)))
                .collect(),
            ..RawBatch::default()
        };
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        let n = decoded.len();
        let mut keep = vec![true; n];
        for i in &lost {
            keep[i.index(n)] = false;
        }
        let cut = cut.map(|i| raw.base_offset + 1 + i.index(n) as i64);
        check_one(&batch, &decoded, &keep, cut);
        let out = splice(&batch, &decoded, &keep, cut).unwrap();
        let survivors: Vec<&RawRecord> = (raw.records.iter().zip(&keep))
            .filter(|(r, k)| **k && cut.is_none_or(|c| raw.base_offset + i64::from(r.offset_delta) < c))
            .map(|(r, _)| r)
            .collect();
        if !survivors.is_empty() {
            let got = independent_decode(&out).map_err(TestCaseError::fail)?;
            prop_assert_eq!(got, expected_independent(raw.base_offset, raw.base_timestamp, &survivors));
        }
    }

    #[test]
    fn a_marked_tail_keeps_survivors_and_next_offset(
        raw in raw_batch(),
        mask in proptest::collection::vec(any::<bool>(), 25),
    ) {
        let batch = Batch::new(raw.encode()).unwrap();
        let decoded = batch.decode().unwrap();
        let keep: Vec<bool> = mask[..decoded.len()].to_vec();
        let out = splice_marking_tail(&batch, &decoded, &keep).unwrap();
        let mut parts = Vec::new();
        for seg in segments(&out) {
            let Segment::Batch(b) = seg else {
                return Err(TestCaseError::fail("not a whole batch"));
            };
            prop_assert!(b.crc_valid());
            parts.push(b);
        }
        let marked = keep.last() == Some(&false);
        let (first, last) = (&parts[0], &parts[parts.len() - 1]);
        prop_assert_eq!(last.is_control(), marked);
        let cut_data_kept = marked && batch.last_offset_delta() > 0;
        prop_assert_eq!(parts.len(), if cut_data_kept { 2 } else { 1 });
        prop_assert_eq!(first.base_offset(), batch.base_offset());
        prop_assert_eq!(last.next_offset(), batch.next_offset());
        if parts.len() == 2 {
            prop_assert_eq!(first.next_offset(), last.base_offset());
        }
        if marked {
            prop_assert_eq!((last.records_count(), last.last_offset_delta()), (1, 0));
        }
        let mut got = Vec::new();
        for b in parts.iter().filter(|b| !b.is_control()) {
            let d = b.decode().unwrap();
            got.extend((0..d.len()).map(|i| d.raw_record(i).unwrap().to_vec()));
        }
        let want: Vec<Vec<u8>> = (0..decoded.len())
            .filter(|&i| keep[i])
            .map(|i| decoded.raw_record(i).unwrap().to_vec())
            .collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn built_batches_decode_independently(
        recs in proptest::collection::vec(
            (any::<i64>().prop_map(|t| t >> 2), bytes_opt(), bytes_opt(), headers()), 1..20),
        codec in codec(),
        idempotent in any::<bool>(),
    ) {
        let records: Vec<NewRecord> = recs
            .iter()
            .map(|(ts, k, v, h)| NewRecord {
                timestamp: *ts,
                key: k.clone().map(Bytes::from),
                value: v.clone().map(Bytes::from),
                headers: h.iter().map(|(k, v)| (k.clone(), v.clone().map(Bytes::from))).collect(),
            })
            .collect();
        let mut opts = BuildOptions::default().compression(codec);
        if idempotent {
            opts = opts.idempotent(99, 2, 1234);
        }
        let out = build_batch(&records, &opts).unwrap();
        let batch = Batch::new(out.clone()).unwrap();
        prop_assert!(batch.crc_valid());
        prop_assert_eq!(batch.base_offset(), 0);
        prop_assert_eq!(batch.next_offset(), records.len() as i64);
        prop_assert_eq!(batch.compression(), Some(codec));
        prop_assert_eq!(batch.producer_id(), if idempotent { 99 } else { -1 });
        prop_assert_eq!(batch.base_sequence(), if idempotent { 1234 } else { -1 });
        prop_assert_eq!(batch.max_timestamp(), recs.iter().map(|r| r.0).max().unwrap());
        let decoded = batch.decode().unwrap();
        for (i, (r, want)) in decoded.records().zip(&records).enumerate() {
            prop_assert_eq!(r.offset, i as i64);
            prop_assert_eq!(r.timestamp, want.timestamp);
            prop_assert_eq!(r.key, want.key.as_deref());
            prop_assert_eq!(r.value, want.value.as_deref());
            let hs: Vec<(&[u8], Option<&[u8]>)> = r.headers.iter().map(|h| (h.key, h.value)).collect();
            let want_hs: Vec<(&[u8], Option<&[u8]>)> =
                want.headers.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
            prop_assert_eq!(hs, want_hs);
        }
        let raws: Vec<RawRecord> = records
            .iter()
            .enumerate()
            .map(|(i, r)| RawRecord {
                offset_delta: i as i32,
                timestamp_delta: r.timestamp - batch.base_timestamp(),
                key: r.key.as_ref().map(|b| b.to_vec()),
                value: r.value.as_ref().map(|b| b.to_vec()),
                headers: r.headers.iter().map(|(k, v)| (k.clone(), v.as_ref().map(|b| b.to_vec()))).collect(),
            })
            .collect();
        let refs: Vec<&RawRecord> = raws.iter().collect();
        let got = independent_decode(&out).map_err(TestCaseError::fail)?;
        prop_assert_eq!(got, expected_independent(0, batch.base_timestamp(), &refs));
    }

    #[test]
    fn sections_split_back_to_their_bytes(
        batches in proptest::collection::vec(raw_batch(), 0..4),
        tail in proptest::collection::vec(any::<u8>(), 0..80),
        mask in proptest::collection::vec(any::<u8>(), 0..16),
        cut in proptest::option::of(0usize..10),
    ) {
        let mut section = Vec::new();
        for b in &batches {
            section.extend_from_slice(&b.encode());
        }
        let n_batches = batches.len();
        section.extend_from_slice(&tail);
        let bytes = Bytes::from(section.clone());
        let segs = segments(&bytes);
        prop_assert!(segs.len() >= n_batches);
        for s in &segs[..n_batches] {
            prop_assert!(matches!(s, Segment::Batch(_)));
        }
        check_splice_invariants(&section, &mask, cut);
    }

    #[test]
    fn garbage_never_panics(
        data in proptest::collection::vec(any::<u8>(), 0..300),
        mask in proptest::collection::vec(any::<u8>(), 0..8),
        cut in proptest::option::of(0usize..10),
    ) {
        check_splice_invariants(&data, &mask, cut);
    }

    #[test]
    fn corrupted_batches_never_panic(
        raw in raw_batch(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        fix_crc in any::<bool>(),
        mask in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut bytes = raw.encode().to_vec();
        for (at, x) in flips {
            let n = bytes.len();
            bytes[at % n] ^= x;
        }
        if fix_crc && bytes.len() >= HEADER_LEN {
            let crc = crc32c::crc32c(&bytes[21..]);
            bytes[17..21].copy_from_slice(&crc.to_be_bytes());
        }
        check_splice_invariants(&bytes, &mask, None);
    }
}

/// The other direction: batches written by `kafka-protocol`'s encoder (C
/// liblz4 frames, xerial snappy, flate2 gzip, zstd) decode and splice here.
#[test]
fn kafka_protocol_encoded_batches_decode_and_splice() {
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression as KpCompression, Record as KpRecord, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType,
    };
    let codecs = [
        (KpCompression::None, Compression::None),
        (KpCompression::Gzip, Compression::Gzip),
        (KpCompression::Snappy, Compression::Snappy),
        (KpCompression::Lz4, Compression::Lz4),
        (KpCompression::Zstd, Compression::Zstd),
    ];
    for (kp, ours) in codecs {
        let records: Vec<KpRecord> = (0..6)
            .map(|i| KpRecord {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 3,
                producer_id: 77,
                producer_epoch: 1,
                timestamp_type: TimestampType::Creation,
                offset: 500 + i,
                sequence: 10 + i as i32,
                timestamp: 1_000 + i * 7,
                key: (i % 2 == 0).then(|| Bytes::from(format!("key-{i}"))),
                value: Some(Bytes::from(vec![b'v'; 100 * i as usize])),
                headers: IndexMap::from([(
                    StrBytes::from_static_str("trace"),
                    Some(Bytes::from(format!("t{i}"))),
                )]),
            })
            .collect();
        let mut buf = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression: kp,
            },
        )
        .unwrap();
        let section = buf.freeze();
        let segs = segments(&section);
        assert_eq!(segs.len(), 1, "{ours:?}");
        let Segment::Batch(batch) = &segs[0] else {
            panic!("not a batch")
        };
        assert_eq!(batch.compression(), Some(ours));
        assert!(batch.is_transactional());
        let decoded = batch.decode().unwrap();
        for (r, want) in decoded.records().zip(&records) {
            assert_eq!(r.offset, want.offset);
            assert_eq!(r.timestamp, want.timestamp);
            assert_eq!(r.key, want.key.as_deref());
            assert_eq!(r.value, want.value.as_deref());
            assert_eq!(r.header("trace"), Some(want.headers[0].as_deref()));
        }
        let keep = [true, false, true, true, false, true];
        check_one(batch, &decoded, &keep, None);
        check_one(batch, &decoded, &keep, Some(503));
        let out = splice(batch, &decoded, &keep, None).unwrap();
        let got: Vec<i64> = independent_decode(&out)
            .unwrap()
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(got, [500, 502, 503, 505], "{ours:?}");
    }
}
