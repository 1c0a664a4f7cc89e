//! Structured splice fuzzing: well-formed batches (arbitrary keys, values,
//! headers, timestamps, codec, base offset, optional trailing garbage) built
//! with `build_batch`, then `check_splice_invariants` with an arbitrary
//! removal mask and cut. Reaches deep into splice and re-compression, which
//! raw bytes rarely do (a random CRC-valid compressed batch is unlikely).
#![no_main]

use antidote::kafka::builder::{build_batch, BuildOptions, NewRecord};
use antidote::kafka::compression::{Compression, SnappyFraming};
use bytes::Bytes;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Rec {
    ts_delta: i16,
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

#[derive(Arbitrary, Debug)]
struct OneBatch {
    codec: u8,
    xerial: bool,
    base_offset: u32,
    base_ts: i64,
    records: Vec<Rec>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    batches: Vec<OneBatch>,
    trailing: Vec<u8>,
    remove: Vec<u8>,
    cut: Option<u8>,
}

fuzz_target!(|input: Input| {
    let mut section = Vec::new();
    for b in input.batches.iter().take(4) {
        let records: Vec<NewRecord> = b
            .records
            .iter()
            .take(64)
            .map(|r| NewRecord {
                timestamp: b.base_ts.wrapping_add(i64::from(r.ts_delta)),
                key: r.key.clone().map(Bytes::from),
                value: r.value.clone().map(Bytes::from),
                headers: r.headers.iter().take(4).map(|(k, v)| (k.clone(), v.clone().map(Bytes::from))).collect(),
            })
            .collect();
        let codec = match b.codec % 5 {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            _ => Compression::Zstd,
        };
        let mut opts = BuildOptions::default().compression(codec);
        opts.snappy_framing = if b.xerial { SnappyFraming::Xerial } else { SnappyFraming::Raw };
        let Ok(batch) = build_batch(&records, &opts) else { continue };
        let mut batch = batch.to_vec();
        batch[..8].copy_from_slice(&i64::from(b.base_offset).to_be_bytes());
        section.extend_from_slice(&batch);
    }
    section.extend_from_slice(&input.trailing);
    antidote::kafka::fuzz::check_splice_invariants(&section, &input.remove, input.cut.map(usize::from));
});
