//! Shared fixtures for the micro-benchmarks: ~200-byte geofence trigger
//! records (JSON, Avro, Protobuf), batches of them, and the reference
//! policies from `policies/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use antidote::kafka::builder::{build_batch, BuildOptions, NewRecord};
use antidote::kafka::compression::Compression;
use antidote::policy::{Policy, PolicySet};
use bytes::{BufMut, Bytes, BytesMut};

/// A fixed "now" so that `max_age: 15m` rules pass for generated records.
pub const NOW_MS: i64 = 1_780_000_000_000;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn load_policy(file: &str) -> Arc<Policy> {
    let set = PolicySet::load(&[root().join("policies").join(file)])
        .unwrap_or_else(|e| panic!("loading {file}: {e:?}"));
    set.policies()[0].clone()
}

/// The reference JSON policy without `schema:` (decode + coordinate and field rules).
pub fn json_rules_policy() -> Arc<Policy> {
    json_rules_policy_with("")
}

/// [`json_rules_policy`] with more rules (YAML list items) after its own.
pub fn json_rules_policy_with(more_rules: &str) -> Arc<Policy> {
    let text = r#"
policies:
  - name: geofence-rules-only
    topics: ["geofence.triggers"]
    value:
      format: json
      max_bytes: 65536
    rules:
      - coordinates: { lat: /lat, lon: /lon, reject_null_island: true }
      - field: /transition
        one_of: [ENTER, EXIT, DWELL]
      - field: /speed_mps
        min: 0
        max: 150
        optional: true
      - field: /event_time_ms
        max_age: 15m
        unit: ms
    headers:
      required: [idempotency-key]
"#
    .replace("    headers:\n", &format!("{more_rules}    headers:\n"));
    let set = PolicySet::parse(&text, &root().join("policies/bench-inline.yaml"))
        .unwrap_or_else(|e| panic!("{e:?}"));
    set.policies()[0].clone()
}

const TRANSITIONS: [&str; 3] = ["ENTER", "EXIT", "DWELL"];

/// Fields of one trigger; `poison` puts the latitude out of range.
pub struct Trigger {
    pub device_id: String,
    pub geofence_id: String,
    pub lat: f64,
    pub lon: f64,
    pub transition: usize,
    pub speed_mps: f64,
    pub event_time_ms: i64,
    pub accuracy_m: f64,
}

pub fn trigger(i: usize, poison: bool) -> Trigger {
    Trigger {
        device_id: format!("device-{:08}-a1b2c3d4e5f6", i % 100_000),
        geofence_id: format!("fence-{:05}-warehouse-north", i % 5_000),
        lat: if poison {
            91.5
        } else {
            48.0 + (i % 1000) as f64 * 0.001_234
        },
        lon: 2.0 + (i % 777) as f64 * 0.003_21,
        transition: i % 3,
        speed_mps: (i % 40) as f64 * 0.75,
        event_time_ms: NOW_MS - 1_000 - (i % 60_000) as i64,
        accuracy_m: 3.5 + (i % 10) as f64,
    }
}

pub fn json_value(t: &Trigger) -> Bytes {
    Bytes::from(format!(
        r#"{{"device_id":"{}","geofence_id":"{}","lat":{},"lon":{},"transition":"{}","speed_mps":{},"event_time_ms":{},"accuracy_m":{}}}"#,
        t.device_id,
        t.geofence_id,
        t.lat,
        t.lon,
        TRANSITIONS[t.transition],
        t.speed_mps,
        t.event_time_ms,
        t.accuracy_m
    ))
}

/// [`json_value`] leaving the optional `speed_mps` out of every other
/// record (odd `event_time_ms`): a topic whose records do not all have
/// the members of the first one.
pub fn json_value_gaps(t: &Trigger) -> Bytes {
    let full = json_value(t);
    if t.event_time_ms % 2 == 0 {
        return full;
    }
    let text = String::from_utf8_lossy(&full).into_owned();
    let speed = format!(r#""speed_mps":{},"#, t.speed_mps);
    Bytes::from(text.replacen(&speed, "", 1))
}

fn zigzag(out: &mut Vec<u8>, v: i64) {
    varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Avro binary datum of `schemas/trigger.avsc`, Confluent-framed with id 1.
pub fn avro_value(t: &Trigger) -> Bytes {
    let mut out = vec![0u8, 0, 0, 0, 1];
    for s in [&t.device_id, &t.geofence_id] {
        zigzag(&mut out, s.len() as i64);
        out.extend_from_slice(s.as_bytes());
    }
    out.extend_from_slice(&t.lat.to_le_bytes());
    out.extend_from_slice(&t.lon.to_le_bytes());
    zigzag(&mut out, t.transition as i64); // enum index
    zigzag(&mut out, 1); // union branch: double
    out.extend_from_slice(&t.speed_mps.to_le_bytes());
    zigzag(&mut out, t.event_time_ms);
    zigzag(&mut out, 1);
    out.extend_from_slice(&t.accuracy_m.to_le_bytes());
    Bytes::from(out)
}

/// Protobuf encoding of `schemas/trigger.proto`, Confluent-framed (id 1,
/// message indexes [0] written as the single byte 0).
pub fn protobuf_value(t: &Trigger) -> Bytes {
    let mut out = vec![0u8, 0, 0, 0, 1, 0];
    for (tag, s) in [(0x0a, &t.device_id), (0x12, &t.geofence_id)] {
        out.push(tag);
        varint(&mut out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    out.push(0x19);
    out.extend_from_slice(&t.lat.to_le_bytes());
    out.push(0x21);
    out.extend_from_slice(&t.lon.to_le_bytes());
    out.push(0x28);
    varint(&mut out, t.transition as u64 + 1);
    out.push(0x31);
    out.extend_from_slice(&t.speed_mps.to_le_bytes());
    out.push(0x38);
    varint(&mut out, t.event_time_ms as u64);
    out.push(0x41);
    out.extend_from_slice(&t.accuracy_m.to_le_bytes());
    Bytes::from(out)
}

pub fn new_record(i: usize, value: Bytes) -> NewRecord {
    NewRecord {
        timestamp: NOW_MS - 500 + (i % 100) as i64,
        key: Some(Bytes::from(format!("device-{:08}", i % 100_000))),
        value: Some(value),
        headers: vec![(
            "idempotency-key".into(),
            Some(Bytes::from(format!("k-{i:012}"))),
        )],
    }
}

/// Is record `i` poison, for a rate of one in `every` (0 = none, 1 = all)?
pub fn is_poison(i: usize, every: usize) -> bool {
    match every {
        0 => false,
        1 => true,
        n => i % n == n / 2,
    }
}

/// A records section: `batches` JSON batches of `per_batch` records each,
/// consecutive offsets, poison one in `poison_every`.
pub fn json_section(
    batches: usize,
    per_batch: usize,
    poison_every: usize,
    codec: Compression,
) -> Bytes {
    section(json_value, batches, per_batch, poison_every, codec)
}

/// `json_section` with the values `value` encodes (JSON, Avro, Protobuf).
pub fn section(
    value: fn(&Trigger) -> Bytes,
    batches: usize,
    per_batch: usize,
    poison_every: usize,
    codec: Compression,
) -> Bytes {
    let mut out = BytesMut::new();
    for b in 0..batches {
        let records: Vec<NewRecord> = (0..per_batch)
            .map(|j| {
                let i = b * per_batch + j;
                new_record(i, value(&trigger(i, is_poison(i, poison_every))))
            })
            .collect();
        let batch =
            build_batch(&records, &BuildOptions::default().compression(codec)).expect("build");
        // build_batch writes baseOffset 0: place the batch at its offset.
        let mut batch = BytesMut::from(&batch[..]);
        batch[..8].copy_from_slice(&((b * per_batch) as i64).to_be_bytes());
        out.put_slice(&batch);
    }
    out.freeze()
}

pub fn policies_dir() -> &'static Path {
    Path::new("policies")
}
