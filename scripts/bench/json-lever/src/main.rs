//! Issue 15 lever "SIMD JSON parsing": how long do sonic-rs and simd-json take
//! just to parse the reference record (~205 bytes), against antidote's whole
//! judge of it under `policies/geofence.yaml` (strict parse, JSON Schema,
//! rules, header)? The cases alternate in one process, so their ratios hold
//! on a noisy machine even when their times do not.
//!
//! Not part of the workspace (its own dependencies are only for this
//! measurement):
//!   CARGO_TARGET_DIR=/work/lever-target cargo build --release \
//!     --manifest-path scripts/bench/json-lever/Cargo.toml
//!   RUSTFLAGS="-C target-cpu=native" ... (the same, with AVX2 for sonic-rs)
//!   LOOPS=100 REPS=5 /work/lever-target/release/jsonlever
use sonic_rs::JsonContainerTrait;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use antidote_core::kafka::record::{Header, Record};
use antidote_core::policy::PolicySet;

const NOW_MS: i64 = 1_780_000_000_000;
const TRANSITIONS: [&str; 3] = ["ENTER", "EXIT", "DWELL"];

fn json(i: usize) -> Vec<u8> {
    format!(
        "{{\"device_id\":\"{}\",\"geofence_id\":\"{}\",\"lat\":{:.6},\"lon\":{:.6},\
         \"transition\":\"{}\",\"speed_mps\":{:.2},\"event_time_ms\":{},\"accuracy_m\":{:.1}}}",
        format!("device-{:08}-a1b2c3d4e5f6", i % 100_000),
        format!("fence-{:05}-warehouse-north", i % 5_000),
        48.0 + (i % 1000) as f64 * 0.001_234,
        2.0 + (i % 777) as f64 * 0.003_21,
        TRANSITIONS[i % 3],
        (i % 40) as f64 * 0.75,
        NOW_MS - 1000,
        3.5 + (i % 10) as f64,
    )
    .into_bytes()
}

fn time(recs: &[Vec<u8>], loops: usize, mut f: impl FnMut(&[u8]) -> usize) -> f64 {
    let t = Instant::now();
    let mut n = 0usize;
    for _ in 0..loops {
        for r in recs {
            n = n.wrapping_add(f(black_box(r)));
        }
    }
    black_box(n);
    let ns = t.elapsed().as_nanos() as f64 / (loops * recs.len()) as f64;
    ns
}

fn main() {
    let recs: Vec<Vec<u8>> = (0..1024).map(json).collect();
    let set = PolicySet::load(&[Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../policies/geofence.yaml"
    ))
    .to_path_buf()])
    .unwrap();
    let policy = set.policies()[0].clone();
    let hval = b"k-000000000001".to_vec();
    let key = b"device-00000001".to_vec();
    let only = std::env::var("ONLY").ok();
    let loops: usize = std::env::var("LOOPS")
        .ok()
        .map_or(200, |v| v.parse().unwrap());
    let reps: usize = std::env::var("REPS").ok().map_or(5, |v| v.parse().unwrap());
    type F<'a> = Box<dyn FnMut(&[u8]) -> usize + 'a>;
    let mut cases: Vec<(&str, F)> = vec![
        (
            "antidote judge (reference policy)",
            Box::new(|v: &[u8]| {
                let r = Record {
                    offset: 0,
                    timestamp: NOW_MS - 10,
                    key: Some(&key),
                    value: Some(v),
                    headers: vec![Header {
                        key: b"idempotency-key",
                        value: Some(&hval),
                    }],
                };
                policy.judge(&r, NOW_MS).is_valid() as usize
            }),
        ),
        (
            "serde_json Value",
            Box::new(|v: &[u8]| {
                serde_json::from_slice::<serde_json::Value>(v)
                    .unwrap()
                    .as_object()
                    .unwrap()
                    .len()
            }),
        ),
        (
            "serde_json IgnoredAny",
            Box::new(|v: &[u8]| {
                serde_json::from_slice::<serde::de::IgnoredAny>(v).unwrap();
                1
            }),
        ),
        (
            "sonic-rs Value",
            Box::new(|v: &[u8]| {
                sonic_rs::from_slice::<sonic_rs::Value>(v)
                    .unwrap()
                    .as_object()
                    .map_or(0, |o| o.len())
            }),
        ),
        (
            "sonic-rs lazy object iter",
            Box::new(|v: &[u8]| {
                let mut n = 0;
                for kv in sonic_rs::to_object_iter(v) {
                    let (k, val) = kv.unwrap();
                    n += k.len() + val.as_raw_str().len();
                }
                n
            }),
        ),
        (
            "simd-json borrowed Value (with copy)",
            Box::new(|v: &[u8]| {
                let mut b = v.to_vec();
                let val = simd_json::to_borrowed_value(&mut b).unwrap();
                use simd_json::prelude::ValueAsObject;
                val.as_object().map_or(0, |o| o.len())
            }),
        ),
        (
            "simd-json tape (with copy)",
            Box::new(|v: &[u8]| {
                let mut b = v.to_vec();
                let t = simd_json::to_tape(&mut b).unwrap();
                t.0.len()
            }),
        ),
        ("copy only (to_vec)", Box::new(|v: &[u8]| v.to_vec().len())),
    ];
    for (name, f) in cases.iter_mut() {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let _ = time(&recs, 3, f);
    }
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..reps {
        for (i, (name, f)) in cases.iter_mut().enumerate() {
            if only.as_deref().is_some_and(|o| !name.contains(o)) {
                continue;
            }
            results[i].push(time(&recs, loops, f));
        }
    }
    let avg = recs.iter().map(|r| r.len()).sum::<usize>() / recs.len();
    println!(
        "records: 1024 distinct, {avg} bytes on average; {reps} alternating reps of {loops} loops"
    );
    for (i, (name, _)) in cases.iter().enumerate() {
        let mut r = results[i].clone();
        if r.is_empty() {
            continue;
        }
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{name:40} ns/record min {:7.1} median {:7.1} max {:7.1}",
            r[0],
            r[r.len() / 2],
            r[r.len() - 1]
        );
    }
}
