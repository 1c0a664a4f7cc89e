//! A consumer for benchmarks that speaks Fetch itself (issue 15): it reads
//! partitions from offset 0 to their high watermark as fast as one thread
//! can, so that a benchmark's direct read is not capped by its client.
//! The librdkafka consumer of `scripts/bench/e2e.py` hands every record to
//! Python and tops out at 0.3-0.6 M records/s here, below the issue's
//! 1 M records/s for the direct read, so "c ≥ 0.9 × direct" could not be
//! decided with it.
//!
//! What it does per response is what any consumer must do at least: decode
//! the Fetch response, walk each record batch (CRC, decompression, every
//! record's varints and headers, through `antidote::kafka::batch`), count
//! the records and value bytes, and look for a poison mark in each value.
//! Like librdkafka by default: one Fetch in flight per broker, all of that
//! broker's partitions in it, `max_wait_ms` 10, 1 MiB per partition, 50 MiB
//! per response, no fetch sessions. One thread (a current-thread runtime),
//! so the proxy and the broker keep the other cores; several leaders are
//! read one after the other (the bench broker is one node).
//!
//! `fetch_load BOOTSTRAP TOPIC PARTITIONS EXPECTED [POISON_MARK_HEX]` prints
//! one JSON line with the fields of `e2e.py consume` that
//! `scripts/bench/deterministic.py` reads (`BENCH_CONSUMER=fetch_load`).
//! Exit 0 only when exactly EXPECTED records were read.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use antidote::kafka::batch::{self, Segment};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FETCH_VERSION: i16 = 12;
const METADATA_VERSION: i16 = 9;
/// Gives up when nothing new arrived for this long.
const IDLE: Duration = Duration::from_secs(15);
const MAX_TIME: Duration = Duration::from_secs(300);

type Error = Box<dyn std::error::Error>;

/// One connection, one request in flight at a time.
struct Conn {
    sock: TcpStream,
    correlation: i32,
}

impl Conn {
    async fn open(addr: &str) -> Result<Conn, Error> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        Ok(Conn {
            sock,
            correlation: 0,
        })
    }

    /// Send `req` as `key` version `v`; the response body (after its header).
    async fn call<R: Encodable>(&mut self, key: ApiKey, v: i16, req: &R) -> Result<Bytes, Error> {
        self.correlation += 1;
        let mut body = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(v)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("fetch_load")))
            .encode(&mut body, key.request_header_version(v))?;
        req.encode(&mut body, v)?;
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&body);
        self.sock.write_all(&frame).await?;
        let mut len = [0u8; 4];
        self.sock.read_exact(&mut len).await?;
        let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
        self.sock.read_exact(&mut buf).await?;
        let mut buf = Bytes::from(buf);
        let header = ResponseHeader::decode(&mut buf, key.response_header_version(v))?;
        if header.correlation_id != self.correlation {
            return Err(format!(
                "correlation id {} for {}",
                header.correlation_id, self.correlation
            )
            .into());
        }
        Ok(buf)
    }
}

/// What has been read so far, over every partition.
#[derive(Default)]
struct Tally {
    records: u64,
    value_bytes: u64,
    poison_seen: u64,
    /// When the first records arrived, and how many came in that response.
    first: Option<(Instant, u64)>,
    last: Option<Instant>,
}

/// The leaders of `topic`'s partitions: node address -> partitions.
async fn leaders(bootstrap: &str, topic: &str) -> Result<BTreeMap<String, Vec<i32>>, Error> {
    let mut conn = Conn::open(bootstrap).await?;
    let req = MetadataRequest::default()
        .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default(
        )
        .with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))]));
    let mut body = conn.call(ApiKey::Metadata, METADATA_VERSION, &req).await?;
    let meta = MetadataResponse::decode(&mut body, METADATA_VERSION)?;
    let nodes: HashMap<i32, String> = meta
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port)))
        .collect();
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for t in &meta.topics {
        if t.error_code != 0 {
            return Err(format!("metadata of {topic}: error {}", t.error_code).into());
        }
        for p in &t.partitions {
            let addr = nodes
                .get(&p.leader_id.0)
                .ok_or_else(|| format!("no address for node {}", p.leader_id.0))?;
            out.entry(addr.clone()).or_default().push(p.partition_index);
        }
    }
    Ok(out)
}

/// Read `parts` of `topic` from `addr`, offset 0 to their high watermarks.
async fn read_node(
    addr: &str,
    topic: &str,
    parts: &[i32],
    mark: &memchr::memmem::Finder<'_>,
    tally: &mut Tally,
    started: Instant,
) -> Result<(), Error> {
    let mut conn = Conn::open(addr).await?;
    let mut next: BTreeMap<i32, i64> = parts.iter().map(|&p| (p, 0)).collect();
    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
    let mut progress = Instant::now();
    loop {
        let todo: Vec<FetchPartition> = next
            .iter()
            .filter(|(p, o)| ends.get(p).is_none_or(|e| **o < *e))
            .map(|(&p, &o)| {
                FetchPartition::default()
                    .with_partition(p)
                    .with_fetch_offset(o)
                    .with_partition_max_bytes(1 << 20)
            })
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        if progress.elapsed() > IDLE || started.elapsed() > MAX_TIME {
            return Err(format!("{addr}: no progress, at {next:?} of {ends:?}").into());
        }
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(10)
            .with_min_bytes(1)
            .with_max_bytes(50 << 20)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(todo)]);
        let mut body = conn.call(ApiKey::Fetch, FETCH_VERSION, &req).await?;
        let resp = FetchResponse::decode(&mut body, FETCH_VERSION)?;
        let now = Instant::now();
        let before = tally.records;
        for t in resp.responses {
            for p in t.partitions {
                if p.error_code != 0 {
                    return Err(
                        format!("{topic}-{}: error {}", p.partition_index, p.error_code).into(),
                    );
                }
                ends.insert(p.partition_index, p.high_watermark);
                let Some(records) = p.records else { continue };
                let offset = next.entry(p.partition_index).or_default();
                for seg in batch::segments(&records) {
                    let Segment::Batch(b) = seg else { continue };
                    if b.next_offset() <= *offset {
                        continue;
                    }
                    *offset = b.next_offset();
                    if b.is_control() {
                        continue;
                    }
                    let d = b.decode()?;
                    for r in d.records() {
                        let v = r.value.unwrap_or_default();
                        tally.records += 1;
                        tally.value_bytes += v.len() as u64;
                        tally.poison_seen += u64::from(mark.find(v).is_some());
                    }
                }
            }
        }
        if tally.records > before {
            progress = now;
            tally.last = Some(now);
            tally.first.get_or_insert((now, tally.records));
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [bootstrap, topic, _partitions, expected, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: fetch_load BOOTSTRAP TOPIC PARTITIONS EXPECTED [POISON_MARK_HEX]".into(),
        );
    };
    let expected: u64 = expected.parse()?;
    let mark: Vec<u8> = match rest.first() {
        Some(hex) if hex.is_ascii() && hex.len() % 2 == 0 => (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<Result<_, _>>()?,
        Some(hex) => return Err(format!("POISON_MARK_HEX {hex:?}: not pairs of hex digits").into()),
        None => br#""lat":91.500000"#.to_vec(),
    };
    let mark = memchr::memmem::Finder::new(&mark);
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut errors = 0u64;
    for (addr, parts) in leaders(bootstrap, topic).await? {
        if let Err(e) = read_node(&addr, topic, &parts, &mark, &mut tally, started).await {
            eprintln!("fetch_load: {e}");
            errors += 1;
        }
    }
    let end = tally.last.unwrap_or_else(Instant::now);
    let secs = end.duration_since(started).as_secs_f64();
    let (t_first, first_n) = tally.first.unwrap_or((started, 0));
    let steady = end.duration_since(t_first).as_secs_f64();
    let rate = |n: u64, s: f64| {
        if s > 0.0 {
            (n as f64 / s).round() as u64
        } else {
            0
        }
    };
    let line = serde_json::json!({
        "consumer": "fetch_load",
        "records": tally.records,
        "expected": expected,
        "value_bytes": tally.value_bytes,
        "seconds": (secs * 1000.0).round() / 1000.0,
        "first_record_after_s": (t_first.duration_since(started).as_secs_f64() * 1000.0).round() / 1000.0,
        "records_per_s": rate(tally.records, secs),
        "steady_records_per_s": rate(tally.records - first_n, steady),
        "errors": errors,
        "poison_seen": tally.poison_seen,
    });
    println!("{line}");
    if tally.records != expected {
        std::process::exit(1);
    }
    Ok(())
}
