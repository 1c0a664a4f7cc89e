//! The one mock Kafka broker, in process: for the unit tests of the
//! proxy's own client, the dead-letter writer and the Fetch filter, what
//! tansu cannot be made to do (refuse a batch as too large, fail one
//! partition of a DLT write, start a log after offset 0 as retention does);
//! and, served from memory at the speed of a memory copy, the broker of the
//! deterministic benchmark (`benches/tools/bench_broker.rs`), so that a
//! benchmark measures the proxy, not the broker.
//!
//! It speaks just enough of the protocol for the proxy's own client and a
//! consumer that assigns partitions: ApiVersions, Metadata, CreateTopics
//! (configs recorded), FindCoordinator, InitProducerId, Produce (batches
//! stored, with rules for refusing them), ListOffsets and Fetch (whole
//! batches from the one holding the offset, within `partition_max_bytes`
//! and `max_bytes` but at least one batch, as Kafka does). One node on one
//! address. Compiled for tests and, with the `mock-broker` feature, for the
//! bench tools (the feature is on for every dev build: Cargo.toml).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

use crate::config::HostPort;
use apis::{
    api_versions, create, fetch, find_coordinator, init_producer_id, list_offsets, metadata,
    produce,
};

mod apis;

/// One partition's log: batches with their base offsets. A clone shares
/// the batches' bytes.
#[derive(Default, Clone)]
pub struct Log {
    pub log_start: i64,
    pub next: i64,
    pub batches: Vec<(i64, Bytes)>,
}

impl Log {
    /// Append `batch` at the log's end (its base offset set to it): the
    /// base offset.
    pub fn append(&mut self, batch: Bytes) -> i64 {
        let mut b = BytesMut::from(&batch[..]);
        b[..8].copy_from_slice(&self.next.to_be_bytes());
        let base = self.next;
        self.batches.push((base, b.freeze()));
        self.next += records_count(&batch);
        base
    }

    /// Whole batches from the one holding `offset` (none wholly below the
    /// log start), up to `limit` bytes but at least one batch.
    fn read(&self, offset: i64, limit: usize) -> Bytes {
        let first = (self.batches)
            .partition_point(|(base, b)| base + records_count(b) <= offset.max(self.log_start));
        let mut out = BytesMut::new();
        for (_, batch) in &self.batches[first..] {
            if !out.is_empty() && out.len() + batch.len() > limit {
                break;
            }
            out.extend_from_slice(batch);
        }
        out.freeze()
    }
}

/// recordsCount of a v2 batch (0 for a shorter buffer).
fn records_count(batch: &[u8]) -> i64 {
    match batch.get(57..61) {
        Some(n) => i64::from(i32::from_be_bytes([n[0], n[1], n[2], n[3]])),
        None => 0,
    }
}

pub struct State {
    pub topics: HashMap<String, (Uuid, Vec<Log>)>,
    /// Produce batches larger than this are refused with MESSAGE_TOO_LARGE.
    pub max_batch_bytes: Option<usize>,
    /// Produce batches whose maxTimestamp is past this are refused with
    /// INVALID_TIMESTAMP (Kafka's `message.timestamp.after.max.ms`).
    pub max_timestamp: Option<i64>,
    /// (topic, partition) whose Produce fails with this error code.
    pub fail: HashMap<(String, i32), i16>,
    /// Every Produce partition seen: (topic, partition, records, error code).
    pub produced: Vec<(String, i32, i32, i16)>,
    /// CreateTopics seen: (topic, configs).
    pub created: Vec<(String, Vec<(String, String)>)>,
    /// Fetches answered with an error, to count retries.
    pub fetch_errors: usize,
    /// Answer this many Fetches with NOT_LEADER_OR_FOLLOWER first.
    pub fail_fetches: usize,
    /// Answer this many Fetches with the high watermark but no records
    /// first (tansu 0.6 between raising a watermark and storing the batch).
    pub hide_records: usize,
    /// Fence as Apache Kafka does: InitProducerId bumps the epoch of its
    /// transactional id, and a partition refuses a batch whose epoch is
    /// older than the newest it has appended for that producer id (not the
    /// newest handed out). Off: every InitProducerId gives epoch 0.
    pub kafka_fencing: bool,
    /// The last epoch handed out per transactional id (`kafka_fencing`).
    pub epochs: HashMap<String, i16>,
    /// The newest epoch appended per (topic, partition, producer id).
    pub appended_epochs: HashMap<(String, i32, i64), i16>,
    /// Each Produce waits this long before it is applied and answered.
    pub produce_delay: Option<std::time::Duration>,
    /// FindCoordinator answers this error (e.g. 15, COORDINATOR_NOT_AVAILABLE).
    pub coordinator_error: Option<i16>,
    /// The broker's node id (1 unless set).
    pub node_id: i32,
    /// Only these APIs are listed in ApiVersions and answered (a request of
    /// another closes the connection); `None`: all of the above.
    pub apis: Option<Vec<ApiKey>>,
    /// A Fetch that finds no records waits its `max_wait_ms` (at most
    /// 100 ms) before the answer, as Kafka does; off: answered at once.
    pub fetch_waits: bool,
}

impl Default for State {
    fn default() -> Self {
        State {
            topics: HashMap::new(),
            max_batch_bytes: None,
            max_timestamp: None,
            fail: HashMap::new(),
            produced: Vec::new(),
            created: Vec::new(),
            fetch_errors: 0,
            fail_fetches: 0,
            hide_records: 0,
            kafka_fencing: false,
            epochs: HashMap::new(),
            appended_epochs: HashMap::new(),
            produce_delay: None,
            coordinator_error: None,
            node_id: 1,
            apis: None,
            fetch_waits: false,
        }
    }
}

pub struct MockBroker {
    pub addr: HostPort,
    pub state: Arc<Mutex<State>>,
}

impl MockBroker {
    /// A broker on a free loopback port.
    pub async fn start() -> MockBroker {
        MockBroker::bind("127.0.0.1:0").await.expect("bind")
    }

    /// A broker listening on `addr` (`host:port`).
    pub async fn bind(addr: &str) -> std::io::Result<MockBroker> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let addr = HostPort {
            host: local.ip().to_string(),
            port: local.port(),
        };
        let state = Arc::new(Mutex::new(State::default()));
        let (st, a) = (state.clone(), addr.clone());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let _ = sock.set_nodelay(true);
                tokio::spawn(serve(sock, st.clone(), a.clone()));
            }
        });
        Ok(MockBroker { addr, state })
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add_topic(&self, name: &str, partitions: usize) -> Uuid {
        self.add_logs(name, vec![Log::default(); partitions])
    }

    /// Add topic `name` holding `logs` (clones of one log share its bytes).
    pub fn add_logs(&self, name: &str, logs: Vec<Log>) -> Uuid {
        let mut st = self.state();
        let id = Uuid::from_u128(0x1000 + st.topics.len() as u128);
        st.topics.insert(name.into(), (id, logs));
        id
    }

    /// Append a batch (as a producer would) to `topic`/`partition`.
    pub fn append(&self, topic: &str, partition: usize, batch: Bytes) {
        let mut st = self.state();
        if let Some((_, logs)) = st.topics.get_mut(topic) {
            logs[partition].append(batch);
        }
    }

    /// Records of `topic`/`partition` from the log start, decoded.
    pub fn records(&self, topic: &str, partition: usize) -> Vec<(i64, Bytes)> {
        self.state().topics[topic].1[partition].batches.clone()
    }
}

async fn serve(sock: TcpStream, st: Arc<Mutex<State>>, me: HostPort) {
    let lock = |st: &Arc<Mutex<State>>| st.lock().unwrap_or_else(|p| p.into_inner()).produce_delay;
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
        let produce =
            buf.len() >= 2 && i16::from_be_bytes([buf[0], buf[1]]) == ApiKey::Produce as i16;
        if let Some(d) = lock(&st).filter(|_| produce) {
            tokio::time::sleep(d).await;
        }
        let Some((out, wait)) = answer(Bytes::from(buf), &st, &me) else {
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

/// The encoded response (header and body) and, for a Fetch that found no
/// records when [`State::fetch_waits`], how long to wait first.
fn answer(
    mut body: Bytes,
    st: &Arc<Mutex<State>>,
    me: &HostPort,
) -> Option<(BytesMut, Option<Duration>)> {
    let key = ApiKey::try_from(i16::from_be_bytes([*body.first()?, *body.get(1)?])).ok()?;
    let v = i16::from_be_bytes([*body.get(2)?, *body.get(3)?]);
    let header = RequestHeader::decode(&mut body, key.request_header_version(v)).ok()?;
    let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
    if st.apis.as_ref().is_some_and(|apis| !apis.contains(&key)) {
        return None;
    }
    let mut out = BytesMut::new();
    let rh = ResponseHeader::default().with_correlation_id(header.correlation_id);
    if key == ApiKey::ApiVersions && v > 3 {
        // Kafka's answer to a too-new ApiVersions: v0, UNSUPPORTED_VERSION.
        rh.encode(&mut out, 0).ok()?;
        api_versions(&st)
            .with_error_code(35)
            .encode(&mut out, 0)
            .ok()?;
        return Some((out, None));
    }
    rh.encode(&mut out, key.response_header_version(v)).ok()?;
    let mut wait = None;
    match key {
        ApiKey::ApiVersions => api_versions(&st).encode(&mut out, v).ok()?,
        ApiKey::Metadata => metadata(&st, MetadataRequest::decode(&mut body, v).ok()?, me)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::CreateTopics => create(&mut st, CreateTopicsRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::InitProducerId => {
            init_producer_id(&mut st, InitProducerIdRequest::decode(&mut body, v).ok()?)
                .encode(&mut out, v)
                .ok()?
        }
        ApiKey::FindCoordinator => find_coordinator(
            &st,
            FindCoordinatorRequest::decode(&mut body, v).ok()?,
            v,
            me,
        )
        .encode(&mut out, v)
        .ok()?,
        ApiKey::Produce => produce(&mut st, ProduceRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::ListOffsets => list_offsets(&st, ListOffsetsRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::Fetch => {
            let req = FetchRequest::decode(&mut body, v).ok()?;
            let max_wait = Duration::from_millis(req.max_wait_ms.clamp(0, 100) as u64);
            let (resp, empty) = fetch(&mut st, req);
            if empty && st.fetch_waits {
                wait = Some(max_wait);
            }
            resp.encode(&mut out, v).ok()?
        }
        _ => return None,
    }
    Some((out, wait))
}
