//! A deterministic Kafka broker for benchmarks (issue 15): the proxy's one
//! mock broker (`antidote::client::mock_broker`, served from memory at the
//! speed of a memory copy) loaded with generated geofence records, so that
//! a benchmark measures the proxy, not the broker. tansu, the real broker
//! of the test suite, swings between 0.17 and 1.18 M records/s from run to
//! run on these machines, which hides any proxy cost below that noise.
//!
//! It holds `--topics` topics (`bench-0`, `bench-1`, ...) of `--partitions`
//! partitions, every one the same pre-encoded record batches (shared, so a
//! topic costs no memory): a benchmark reads a fresh topic per round and
//! the proxy's verdict cache starts cold each time. Records are the JSON of
//! `scripts/bench/e2e.py` (~205 bytes, key `device-NNNNNNNN`, header
//! `idempotency-key`), one in `--poison-every` with latitude 91.5 (invalid
//! under `policies/geofence.yaml`), timestamps at start-up; with
//! `--format avro|protobuf` the same fields in Confluent-framed Avro or
//! Protobuf (`policies/geofence-avro.yaml`, `geofence-protobuf.yaml`).
//!
//! It lists ApiVersions, Metadata (v4-12), ListOffsets (v1-7), Fetch (v4-12;
//! an empty answer waits `max_wait_ms`, at most 100 ms) and Produce v3-9
//! (librdkafka uses the v2 record format only with a broker that lists it),
//! as node 0: enough for a consumer that assigns partitions (no group APIs)
//! and for antidote in front of it. What the mock does with each is its
//! own (`src/client/mock_broker.rs`).
//!
//! `cargo run --release --example bench_broker -- --listen 127.0.0.1:29300`
//! (see `scripts/bench/deterministic.py`, which drives it).

use std::time::{SystemTime, UNIX_EPOCH};

use antidote::client::mock_broker::{Log, MockBroker};
use antidote::kafka::builder::{build_batch, BuildOptions, NewRecord};
use bytes::Bytes;
use kafka_protocol::messages::ApiKey;

struct Args {
    listen: String,
    topics: usize,
    partitions: usize,
    records: usize,
    poison_every: usize,
    batch: usize,
    format: Format,
}

/// How values are encoded: the JSON of `e2e.py`, or the same fields as
/// Avro (`policies/schemas/trigger.avsc`) or Protobuf (`trigger.proto`)
/// with Confluent framing, schema id 1 (as `policies/geofence-avro.yaml`
/// and `geofence-protobuf.yaml` expect).
#[derive(Clone, Copy)]
enum Format {
    Json,
    Avro,
    Protobuf,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json" => Ok(Format::Json),
            "avro" => Ok(Format::Avro),
            "protobuf" => Ok(Format::Protobuf),
            other => Err(format!("unknown format {other}")),
        }
    }
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn parse_args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    Args {
        listen: arg(&a, "--listen", "127.0.0.1:29300".to_string()),
        topics: arg(&a, "--topics", 8),
        partitions: arg(&a, "--partitions", 3),
        records: arg(&a, "--records", 1_000_000),
        poison_every: arg(&a, "--poison-every", 1000),
        batch: arg(&a, "--batch", 500),
        format: arg(&a, "--format", Format::Json),
    }
}

const TRANSITIONS: [&str; 3] = ["ENTER", "EXIT", "DWELL"];

/// The fields of record `i`, as `scripts/bench/e2e.py` writes them.
struct Trigger {
    device_id: String,
    geofence_id: String,
    lat: f64,
    lon: f64,
    transition: usize,
    speed_mps: f64,
    event_time_ms: i64,
    accuracy_m: f64,
}

fn trigger(i: usize, poison: bool, now_ms: i64) -> Trigger {
    Trigger {
        device_id: format!("device-{:08}-a1b2c3d4e5f6", i % 100_000),
        geofence_id: format!("fence-{:05}-warehouse-north", i % 5000),
        lat: if poison {
            91.5
        } else {
            48.0 + (i % 1000) as f64 * 0.001234
        },
        lon: 2.0 + (i % 777) as f64 * 0.00321,
        transition: i % 3,
        speed_mps: (i % 40) as f64 * 0.75,
        event_time_ms: now_ms,
        accuracy_m: 3.5 + (i % 10) as f64,
    }
}

fn json(t: &Trigger) -> Vec<u8> {
    format!(
        "{{\"device_id\":\"{}\",\"geofence_id\":\"{}\",\"lat\":{:.6},\"lon\":{:.6},\
         \"transition\":\"{}\",\"speed_mps\":{:.2},\"event_time_ms\":{},\"accuracy_m\":{:.1}}}",
        t.device_id,
        t.geofence_id,
        t.lat,
        t.lon,
        TRANSITIONS[t.transition],
        t.speed_mps,
        t.event_time_ms,
        t.accuracy_m,
    )
    .into_bytes()
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(out: &mut Vec<u8>, v: i64) {
    varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Confluent framing (magic 0, schema id 1) + Avro binary of `trigger.avsc`.
fn avro(t: &Trigger) -> Vec<u8> {
    let mut out = vec![0, 0, 0, 0, 1];
    for s in [&t.device_id, &t.geofence_id] {
        zigzag(&mut out, s.len() as i64);
        out.extend_from_slice(s.as_bytes());
    }
    out.extend_from_slice(&t.lat.to_le_bytes());
    out.extend_from_slice(&t.lon.to_le_bytes());
    zigzag(&mut out, t.transition as i64);
    zigzag(&mut out, 1); // union branch "double"
    out.extend_from_slice(&t.speed_mps.to_le_bytes());
    zigzag(&mut out, t.event_time_ms);
    zigzag(&mut out, 1);
    out.extend_from_slice(&t.accuracy_m.to_le_bytes());
    out
}

/// Confluent framing (magic 0, schema id 1, message index list [0] written
/// as the single byte 0) + Protobuf of `trigger.proto`'s `Trigger`.
fn protobuf(t: &Trigger) -> Vec<u8> {
    let mut out = vec![0, 0, 0, 0, 1, 0];
    for (field, s) in [(1u64, &t.device_id), (2, &t.geofence_id)] {
        varint(&mut out, field << 3 | 2);
        varint(&mut out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    for (field, d) in [(3u64, t.lat), (4, t.lon)] {
        varint(&mut out, field << 3 | 1);
        out.extend_from_slice(&d.to_le_bytes());
    }
    varint(&mut out, 5 << 3);
    varint(&mut out, t.transition as u64 + 1); // ENTER = 1
    varint(&mut out, 6 << 3 | 1);
    out.extend_from_slice(&t.speed_mps.to_le_bytes());
    varint(&mut out, 7 << 3);
    varint(&mut out, t.event_time_ms as u64);
    varint(&mut out, 8 << 3 | 1);
    out.extend_from_slice(&t.accuracy_m.to_le_bytes());
    out
}

fn record(i: usize, poison: bool, now_ms: i64, format: Format) -> NewRecord {
    let t = trigger(i, poison, now_ms);
    let value = match format {
        Format::Json => json(&t),
        Format::Avro => avro(&t),
        Format::Protobuf => protobuf(&t),
    };
    NewRecord {
        timestamp: now_ms,
        key: Some(Bytes::from(format!("device-{:08}", i % 100_000))),
        value: Some(Bytes::from(value)),
        headers: vec![(
            "idempotency-key".into(),
            Some(Bytes::from(format!("k-{i:012}"))),
        )],
    }
}

/// Records round-robin over partitions (as e2e.py produces them), cut into
/// batches of `args.batch` records.
fn build_logs(args: &Args) -> Vec<Log> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut per_part: Vec<Vec<NewRecord>> = vec![Vec::new(); args.partitions];
    for i in 0..args.records {
        let poison = args.poison_every > 0 && i % args.poison_every == args.poison_every / 2;
        per_part[i % args.partitions].push(record(i, poison, now_ms, args.format));
    }
    per_part
        .into_iter()
        .map(|records| {
            let mut log = Log::default();
            for chunk in records.chunks(args.batch.max(1)) {
                log.append(build_batch(chunk, &BuildOptions::default()).expect("batch"));
            }
            log
        })
        .collect()
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = parse_args();
    let t0 = std::time::Instant::now();
    let logs = build_logs(&args);
    let bytes: usize = logs
        .iter()
        .flat_map(|l| l.batches.iter().map(|b| b.1.len()))
        .sum();
    let broker = MockBroker::bind(&args.listen).await?;
    {
        let mut st = broker.state();
        st.node_id = 0;
        st.fetch_waits = true;
        st.apis = Some(vec![
            ApiKey::ApiVersions,
            ApiKey::Metadata,
            ApiKey::ListOffsets,
            ApiKey::Fetch,
            ApiKey::Produce,
        ]);
    }
    for t in 0..args.topics {
        broker.add_logs(&format!("bench-{t}"), logs.clone());
    }
    println!(
        "bench_broker listening on {}: {} topics x {} partitions, {} records, {} batch bytes per topic, built in {:?}",
        broker.addr,
        args.topics,
        args.partitions,
        args.records,
        bytes,
        t0.elapsed()
    );
    std::future::pending().await
}
