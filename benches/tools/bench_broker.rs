//! A deterministic Kafka broker for benchmarks (issue 15): serves generated
//! geofence records from memory at the speed of a memory copy, so that a
//! benchmark measures the proxy, not the broker. tansu, the real broker of
//! the test suite, swings between 0.17 and 1.18 M records/s from run to run
//! on these machines, which hides any proxy cost below that noise.
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
//! It answers ApiVersions, Metadata (v4-12), ListOffsets (v1-7) and Fetch
//! (v4-12, honouring `partition_max_bytes` and `max_bytes` with at least one
//! batch, as Kafka does): enough for a consumer that assigns partitions (no
//! group APIs) and for antidote in front of it. It lists Produce v3-9 (as
//! librdkafka needs to use the v2 record format) but closes the connection
//! on a Produce, as on anything else. Not a test double: the suite's fake for unit tests is
//! `src/client/mock_broker.rs`; this one is built for speed only.
//!
//! `cargo run --release --example bench_broker -- --listen 127.0.0.1:29300`
//! (see `scripts/bench/deterministic.py`, which drives it).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use antidote::kafka::builder::{build_batch, BuildOptions, NewRecord};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};

/// One partition's log: batches and the offset each starts at.
struct Log {
    /// (base offset, next offset after the batch, batch bytes).
    batches: Vec<(i64, i64, Bytes)>,
    end: i64,
}

struct Broker {
    host: String,
    port: i32,
    topics: usize,
    partitions: Vec<Log>,
    ids: Vec<uuid::Uuid>,
}

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
/// batches of `args.batch` records with their base offsets set.
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
            let mut log = Log {
                batches: Vec::new(),
                end: 0,
            };
            for chunk in records.chunks(args.batch.max(1)) {
                let built = build_batch(chunk, &BuildOptions::default()).expect("batch");
                let mut b = BytesMut::from(&built[..]);
                b[..8].copy_from_slice(&log.end.to_be_bytes());
                let next = log.end + chunk.len() as i64;
                log.batches.push((log.end, next, b.freeze()));
                log.end = next;
            }
            log
        })
        .collect()
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = parse_args();
    let t0 = std::time::Instant::now();
    let partitions = build_logs(&args);
    let bytes: usize = partitions
        .iter()
        .flat_map(|l| l.batches.iter().map(|b| b.2.len()))
        .sum();
    let listener = TcpListener::bind(&args.listen).await?;
    let addr = listener.local_addr()?;
    let broker = Arc::new(Broker {
        host: addr.ip().to_string(),
        port: i32::from(addr.port()),
        topics: args.topics,
        ids: (0..args.topics)
            .map(|t| uuid::Uuid::from_u128(0xbe7c_0000 + t as u128))
            .collect(),
        partitions,
    });
    println!(
        "bench_broker listening on {addr}: {} topics x {} partitions, {} records, {} batch bytes per topic, built in {:?}",
        args.topics,
        args.partitions,
        args.records,
        bytes,
        t0.elapsed()
    );
    loop {
        let (sock, _) = listener.accept().await?;
        let _ = sock.set_nodelay(true);
        tokio::spawn(serve(sock, broker.clone()));
    }
}

async fn serve(sock: TcpStream, broker: Arc<Broker>) {
    let (mut rd, wr) = sock.into_split();
    let mut wr = BufWriter::new(wr);
    loop {
        let mut len = [0u8; 4];
        if rd.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
        if rd.read_exact(&mut buf).await.is_err() {
            return;
        }
        let Some((out, wait)) = answer(Bytes::from(buf), &broker) else {
            return;
        };
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
        let ok = wr
            .write_all(&(out.len() as u32).to_be_bytes())
            .await
            .is_ok()
            && wr.write_all(&out).await.is_ok()
            && wr.flush().await.is_ok();
        if !ok {
            return;
        }
    }
}

/// The encoded response (header + body) and, for a Fetch with nothing to
/// return, how long to wait first (its `max_wait_ms`, at most 100 ms).
fn answer(mut body: Bytes, b: &Broker) -> Option<(BytesMut, Option<Duration>)> {
    if body.len() < 4 {
        return None;
    }
    let key = ApiKey::try_from(i16::from_be_bytes([body[0], body[1]])).ok()?;
    let v = i16::from_be_bytes([body[2], body[3]]);
    let header = RequestHeader::decode(&mut body, key.request_header_version(v)).ok()?;
    let mut out = BytesMut::new();
    let rh = ResponseHeader::default().with_correlation_id(header.correlation_id);
    let mut wait = None;
    if key == ApiKey::ApiVersions && v > 3 {
        // Kafka's answer to a too-new ApiVersions: v0, UNSUPPORTED_VERSION.
        rh.encode(&mut out, 0).ok()?;
        api_versions()
            .with_error_code(35)
            .encode(&mut out, 0)
            .ok()?;
        return Some((out, None));
    }
    rh.encode(&mut out, key.response_header_version(v)).ok()?;
    match key {
        ApiKey::ApiVersions => api_versions().encode(&mut out, v).ok()?,
        ApiKey::Metadata => metadata(b, MetadataRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::ListOffsets => list_offsets(b, ListOffsetsRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::Fetch => {
            let req = FetchRequest::decode(&mut body, v).ok()?;
            let max_wait = Duration::from_millis(req.max_wait_ms.clamp(0, 100) as u64);
            let (resp, empty) = fetch(b, req);
            if empty {
                wait = Some(max_wait);
            }
            resp.encode(&mut out, v).ok()?
        }
        _ => return None,
    }
    Some((out, wait))
}

fn api_versions() -> ApiVersionsResponse {
    use api_versions_response::ApiVersion;
    let k = |key: ApiKey, min, max| {
        ApiVersion::default()
            .with_api_key(key as i16)
            .with_min_version(min)
            .with_max_version(max)
    };
    ApiVersionsResponse::default().with_api_keys(vec![
        k(ApiKey::ApiVersions, 0, 3),
        k(ApiKey::Metadata, 4, 12),
        k(ApiKey::ListOffsets, 1, 7),
        k(ApiKey::Fetch, 4, 12),
        // Never answered (the connection is closed): librdkafka enables
        // the v2 record format only for a broker that lists Produce v3+.
        k(ApiKey::Produce, 3, 9),
    ])
}

/// `bench-N` → N, when N names one of the topics.
fn topic_index(b: &Broker, name: &str) -> Option<usize> {
    name.strip_prefix("bench-")?
        .parse()
        .ok()
        .filter(|&t| t < b.topics)
}

fn metadata(b: &Broker, req: MetadataRequest) -> MetadataResponse {
    use metadata_response::*;
    let names: Vec<String> = match req.topics {
        Some(ts) => ts
            .iter()
            .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
            .collect(),
        None => (0..b.topics).map(|t| format!("bench-{t}")).collect(),
    };
    let topics = names
        .into_iter()
        .map(|n| {
            let idx = topic_index(b, &n);
            let t = MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(n))));
            let Some(idx) = idx else {
                return t.with_error_code(3);
            };
            t.with_topic_id(b.ids[idx]).with_partitions(
                (0..b.partitions.len() as i32)
                    .map(|p| {
                        MetadataResponsePartition::default()
                            .with_partition_index(p)
                            .with_leader_id(BrokerId(0))
                            .with_replica_nodes(vec![BrokerId(0)])
                            .with_isr_nodes(vec![BrokerId(0)])
                    })
                    .collect(),
            )
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(0))
            .with_host(StrBytes::from_string(b.host.clone()))
            .with_port(b.port)])
        .with_cluster_id(Some(StrBytes::from_static_str("bench")))
        .with_controller_id(BrokerId(0))
        .with_topics(topics)
}

fn list_offsets(b: &Broker, req: ListOffsetsRequest) -> ListOffsetsResponse {
    use list_offsets_response::*;
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let known = topic_index(b, t.name.as_str()).is_some();
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let r = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_timestamp(-1);
                    match b.partitions.get(p.partition_index as usize) {
                        Some(log) if known => {
                            r.with_offset(if p.timestamp == -1 { log.end } else { 0 })
                        }
                        _ => r.with_error_code(3),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(parts)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// Whole batches from the one holding `offset`, up to `limit` bytes (at
/// least one batch, as Kafka returns an oversized first batch).
fn read(log: &Log, offset: i64, limit: usize) -> Bytes {
    let first = log.batches.partition_point(|(_, next, _)| *next <= offset);
    let mut out = BytesMut::new();
    for (_, _, batch) in &log.batches[first..] {
        if !out.is_empty() && out.len() + batch.len() > limit {
            break;
        }
        out.extend_from_slice(batch);
    }
    out.freeze()
}

/// The response, and whether it holds no records at all.
fn fetch(b: &Broker, req: FetchRequest) -> (FetchResponse, bool) {
    use fetch_response::*;
    let mut budget = usize::try_from(req.max_bytes).unwrap_or(0).max(1);
    let mut empty = true;
    let mut topics = Vec::new();
    for t in req.topics {
        let known = topic_index(b, t.topic.as_str()).is_some();
        let parts = t
            .partitions
            .iter()
            .map(|p| {
                let r = PartitionData::default().with_partition_index(p.partition);
                let Some(log) = b.partitions.get(p.partition as usize).filter(|_| known) else {
                    return r.with_error_code(3);
                };
                let r = r
                    .with_high_watermark(log.end)
                    .with_last_stable_offset(log.end)
                    .with_log_start_offset(0)
                    .with_aborted_transactions(Some(vec![]));
                if p.fetch_offset < 0 || p.fetch_offset > log.end {
                    return r.with_error_code(1);
                }
                let limit = budget.min(usize::try_from(p.partition_max_bytes).unwrap_or(0));
                let records = if budget == 0 {
                    Bytes::new()
                } else {
                    read(log, p.fetch_offset, limit.max(1))
                };
                budget = budget.saturating_sub(records.len());
                empty &= records.is_empty();
                r.with_records(Some(records))
            })
            .collect();
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic)
                .with_partitions(parts),
        );
    }
    (FetchResponse::default().with_responses(topics), empty)
}
