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
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

use crate::config::HostPort;

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

fn init_producer_id(st: &mut State, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let epoch = match req.transactional_id {
        Some(id) if st.kafka_fencing => {
            let e = st.epochs.entry(id.to_string()).or_insert(-1);
            *e += 1;
            *e
        }
        _ => 0,
    };
    InitProducerIdResponse::default()
        .with_producer_id(ProducerId(4000))
        .with_producer_epoch(epoch)
}

fn find_coordinator(
    st: &State,
    req: FindCoordinatorRequest,
    v: i16,
    me: &HostPort,
) -> FindCoordinatorResponse {
    let code = st.coordinator_error.unwrap_or(0);
    let node = if code == 0 { st.node_id } else { -1 };
    let host = || StrBytes::from_string(me.host.clone());
    let resp = FindCoordinatorResponse::default();
    if v < 4 {
        return resp
            .with_error_code(code)
            .with_node_id(BrokerId(node))
            .with_host(host())
            .with_port(i32::from(me.port));
    }
    resp.with_coordinators(
        req.coordinator_keys
            .into_iter()
            .map(|k| {
                find_coordinator_response::Coordinator::default()
                    .with_key(k)
                    .with_node_id(BrokerId(node))
                    .with_host(host())
                    .with_port(i32::from(me.port))
                    .with_error_code(code)
            })
            .collect(),
    )
}

/// The APIs the mock speaks, or those of [`State::apis`].
fn api_versions(st: &State) -> ApiVersionsResponse {
    use api_versions_response::ApiVersion;
    let all = [
        (ApiKey::ApiVersions, 0, 3),
        (ApiKey::Metadata, 4, 12),
        (ApiKey::CreateTopics, 2, 7),
        (ApiKey::InitProducerId, 0, 4),
        (ApiKey::FindCoordinator, 1, 6),
        (ApiKey::Produce, 3, 9),
        (ApiKey::ListOffsets, 1, 7),
        (ApiKey::Fetch, 4, 12),
    ];
    let listed = |key: &ApiKey| st.apis.as_ref().is_none_or(|apis| apis.contains(key));
    ApiVersionsResponse::default().with_api_keys(
        (all.into_iter())
            .filter(|(key, ..)| listed(key))
            .map(|(key, min, max)| {
                ApiVersion::default()
                    .with_api_key(key as i16)
                    .with_min_version(min)
                    .with_max_version(max)
            })
            .collect(),
    )
}

fn metadata(st: &State, req: MetadataRequest, me: &HostPort) -> MetadataResponse {
    use metadata_response::*;
    let names: Vec<String> = match req.topics {
        Some(ts) => ts
            .iter()
            .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
            .collect(),
        None => st.topics.keys().cloned().collect(),
    };
    let topics = names
        .into_iter()
        .map(|n| {
            let t = MetadataResponseTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(n.clone()))));
            match st.topics.get(&n) {
                None => t.with_error_code(3),
                Some((id, logs)) => t.with_topic_id(*id).with_partitions(
                    (0..logs.len() as i32)
                        .map(|p| {
                            MetadataResponsePartition::default()
                                .with_partition_index(p)
                                .with_leader_id(BrokerId(st.node_id))
                                .with_replica_nodes(vec![BrokerId(st.node_id)])
                                .with_isr_nodes(vec![BrokerId(st.node_id)])
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(st.node_id))
            .with_host(StrBytes::from_string(me.host.clone()))
            .with_port(i32::from(me.port))])
        .with_cluster_id(Some(StrBytes::from_static_str("mock")))
        .with_controller_id(BrokerId(st.node_id))
        .with_topics(topics)
}

fn create(st: &mut State, req: CreateTopicsRequest) -> CreateTopicsResponse {
    use create_topics_response::CreatableTopicResult;
    let mut results = Vec::new();
    for t in req.topics {
        let name = t.name.to_string();
        let configs = t
            .configs
            .iter()
            .map(|c| {
                (
                    c.name.to_string(),
                    c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                )
            })
            .collect();
        st.created.push((name.clone(), configs));
        let code = if st.topics.contains_key(&name) { 36 } else { 0 };
        let id = Uuid::from_u128(0x1000 + st.topics.len() as u128);
        st.topics
            .entry(name.clone())
            .or_insert_with(|| (id, vec![Log::default(); t.num_partitions.max(1) as usize]));
        results.push(
            CreatableTopicResult::default()
                .with_name(t.name)
                .with_error_code(code),
        );
    }
    CreateTopicsResponse::default().with_topics(results)
}

fn produce(st: &mut State, req: ProduceRequest) -> ProduceResponse {
    use produce_response::*;
    let mut topics = Vec::new();
    for t in req.topic_data {
        let name = t.name.to_string();
        let mut parts = Vec::new();
        for p in t.partition_data {
            let batch = p.records.unwrap_or_default();
            let count = if batch.len() >= 61 {
                i32::from_be_bytes([batch[57], batch[58], batch[59], batch[60]])
            } else {
                0
            };
            let code = if let Some(&c) = st.fail.get(&(name.clone(), p.index)) {
                c
            } else if st.max_batch_bytes.is_some_and(|m| batch.len() > m) {
                crate::client::errors::MESSAGE_TOO_LARGE
            } else if st.max_timestamp.is_some_and(|m| {
                batch.len() >= 61
                    && i64::from_be_bytes(batch[35..43].try_into().expect("8 bytes")) > m
            }) {
                crate::client::errors::INVALID_TIMESTAMP
            } else if st.kafka_fencing && batch.len() >= 61 {
                let pid = i64::from_be_bytes(batch[43..51].try_into().expect("8 bytes"));
                let epoch = i16::from_be_bytes([batch[51], batch[52]]);
                let newest = st
                    .appended_epochs
                    .entry((name.clone(), p.index, pid))
                    .or_insert(epoch);
                if pid >= 0 && epoch < *newest {
                    crate::client::errors::INVALID_PRODUCER_EPOCH
                } else {
                    *newest = epoch;
                    0
                }
            } else {
                0
            };
            let mut base = -1;
            if code == 0 {
                match st
                    .topics
                    .get_mut(&name)
                    .and_then(|(_, l)| l.get_mut(p.index as usize))
                {
                    Some(log) => base = log.append(batch),
                    None => continue,
                }
            }
            st.produced.push((name.clone(), p.index, count, code));
            parts.push(
                PartitionProduceResponse::default()
                    .with_index(p.index)
                    .with_error_code(code)
                    .with_base_offset(base),
            );
        }
        topics.push(
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_partition_responses(parts),
        );
    }
    ProduceResponse::default().with_responses(topics)
}

fn list_offsets(st: &State, req: ListOffsetsRequest) -> ListOffsetsResponse {
    use list_offsets_response::*;
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let logs = st.topics.get(t.name.as_str()).map(|x| &x.1);
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let r = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_timestamp(-1);
                    match logs.and_then(|l| l.get(p.partition_index as usize)) {
                        None => r.with_error_code(3),
                        Some(log) => r.with_offset(if p.timestamp == -2 {
                            log.log_start
                        } else {
                            log.next
                        }),
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

/// The response, and whether it holds no records at all.
fn fetch(st: &mut State, req: FetchRequest) -> (FetchResponse, bool) {
    use fetch_response::*;
    let mut topics = Vec::new();
    let (mut errors, mut empty) = (0, true);
    let mut budget = usize::try_from(req.max_bytes).unwrap_or(0).max(1);
    let mut fail_fetches = st.fail_fetches;
    let mut hide_records = st.hide_records;
    for t in req.topics {
        let logs = st.topics.get(t.topic.as_str()).map(|x| &x.1);
        let parts = t
            .partitions
            .iter()
            .map(|p| {
                let r = PartitionData::default().with_partition_index(p.partition);
                if fail_fetches > 0 {
                    fail_fetches -= 1;
                    errors += 1;
                    return r.with_error_code(6);
                }
                let Some(log) = logs.and_then(|l| l.get(p.partition as usize)) else {
                    errors += 1;
                    return r.with_error_code(3);
                };
                let r = r
                    .with_high_watermark(log.next)
                    .with_last_stable_offset(log.next)
                    .with_log_start_offset(log.log_start)
                    .with_aborted_transactions(Some(vec![]));
                if p.fetch_offset < log.log_start || p.fetch_offset > log.next {
                    errors += 1;
                    return r.with_error_code(1);
                }
                if hide_records > 0 {
                    hide_records -= 1;
                    return r.with_records(Some(Bytes::new()));
                }
                let limit = budget.min(usize::try_from(p.partition_max_bytes).unwrap_or(0));
                let records = match budget {
                    0 => Bytes::new(),
                    _ => log.read(p.fetch_offset, limit.max(1)),
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
    st.fetch_errors += errors;
    st.fail_fetches = fail_fetches;
    st.hide_records = hide_records;
    (FetchResponse::default().with_responses(topics), empty)
}
