//! A small in-process Kafka broker for the unit tests of the proxy's own
//! client, the dead-letter writer and the Fetch filter: what tansu cannot
//! be made to do (refuse a batch as too large, fail one
//! partition of a DLT write, start a log after offset 0 as retention does).
//!
//! It speaks just enough of the protocol for the proxy's own client:
//! ApiVersions, Metadata, CreateTopics (configs recorded), FindCoordinator,
//! InitProducerId,
//! Produce (batches stored, with rules for refusing them), ListOffsets and
//! Fetch. Test-only; one node (id 1) on loopback.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

use crate::config::HostPort;

/// One partition's log: batches with their base offsets.
#[derive(Default, Clone)]
pub struct Log {
    pub log_start: i64,
    pub next: i64,
    pub batches: Vec<(i64, Bytes)>,
}

#[derive(Default)]
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
}

pub struct MockBroker {
    pub addr: HostPort,
    pub state: Arc<Mutex<State>>,
}

impl MockBroker {
    pub async fn start() -> MockBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let addr = HostPort {
            host: "127.0.0.1".into(),
            port,
        };
        let state = Arc::new(Mutex::new(State::default()));
        let (st, a) = (state.clone(), addr.clone());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(serve(sock, st.clone(), a.clone()));
            }
        });
        MockBroker { addr, state }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn add_topic(&self, name: &str, partitions: usize) -> Uuid {
        let id = Uuid::from_u128(0x1000 + self.state().topics.len() as u128);
        self.state()
            .topics
            .insert(name.into(), (id, vec![Log::default(); partitions]));
        id
    }

    /// Append a batch (as a producer would) to `topic`/`partition`.
    pub fn append(&self, topic: &str, partition: usize, batch: Bytes) {
        let mut st = self.state();
        if let Some((_, logs)) = st.topics.get_mut(topic) {
            store(&mut logs[partition], batch);
        }
    }

    /// Records of `topic`/`partition` from the log start, decoded.
    pub fn records(&self, topic: &str, partition: usize) -> Vec<(i64, Bytes)> {
        self.state().topics[topic].1[partition].batches.clone()
    }
}

fn store(log: &mut Log, batch: Bytes) -> i64 {
    let mut b = BytesMut::from(&batch[..]);
    b[..8].copy_from_slice(&log.next.to_be_bytes());
    let count = i32::from_be_bytes([b[57], b[58], b[59], b[60]]);
    let base = log.next;
    log.batches.push((base, b.freeze()));
    log.next += i64::from(count);
    base
}

async fn serve(mut sock: TcpStream, st: Arc<Mutex<State>>, me: HostPort) {
    loop {
        let mut len = [0u8; 4];
        if sock.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut buf = vec![0u8; u32::from_be_bytes(len) as usize];
        if sock.read_exact(&mut buf).await.is_err() {
            return;
        }
        let delay =
            if buf.len() >= 2 && i16::from_be_bytes([buf[0], buf[1]]) == ApiKey::Produce as i16 {
                st.lock().unwrap_or_else(|p| p.into_inner()).produce_delay
            } else {
                None
            };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let Some(out) = answer(Bytes::from(buf), &st, &me) else {
            return;
        };
        let mut frame = (out.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&out);
        if sock.write_all(&frame).await.is_err() {
            return;
        }
    }
}

fn answer(mut body: Bytes, st: &Arc<Mutex<State>>, me: &HostPort) -> Option<BytesMut> {
    let key = ApiKey::try_from(i16::from_be_bytes([body[0], body[1]])).ok()?;
    let v = i16::from_be_bytes([body[2], body[3]]);
    let header = RequestHeader::decode(&mut body, key.request_header_version(v)).ok()?;
    let mut st = st.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = BytesMut::new();
    let rh = ResponseHeader::default().with_correlation_id(header.correlation_id);
    let hv = key.response_header_version(v);
    rh.encode(&mut out, hv).ok()?;
    match key {
        ApiKey::ApiVersions => api_versions().encode(&mut out, v).ok()?,
        ApiKey::Metadata => metadata(&st, MetadataRequest::decode(&mut body, v).ok()?, me)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::CreateTopics => create(&mut st, CreateTopicsRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::InitProducerId => {
            let req = InitProducerIdRequest::decode(&mut body, v).ok()?;
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
                .encode(&mut out, v)
                .ok()?
        }
        ApiKey::FindCoordinator => {
            let req = FindCoordinatorRequest::decode(&mut body, v).ok()?;
            let code = st.coordinator_error.unwrap_or(0);
            let node = if code == 0 { 1 } else { -1 };
            let mut resp = FindCoordinatorResponse::default();
            if v >= 4 {
                resp = resp.with_coordinators(
                    req.coordinator_keys
                        .into_iter()
                        .map(|k| {
                            find_coordinator_response::Coordinator::default()
                                .with_key(k)
                                .with_node_id(BrokerId(node))
                                .with_host(StrBytes::from_string(me.host.clone()))
                                .with_port(i32::from(me.port))
                                .with_error_code(code)
                        })
                        .collect(),
                );
            } else {
                resp = resp
                    .with_error_code(code)
                    .with_node_id(BrokerId(node))
                    .with_host(StrBytes::from_string(me.host.clone()))
                    .with_port(i32::from(me.port));
            }
            resp.encode(&mut out, v).ok()?
        }
        ApiKey::Produce => produce(&mut st, ProduceRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::ListOffsets => list_offsets(&st, ListOffsetsRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        ApiKey::Fetch => fetch(&mut st, FetchRequest::decode(&mut body, v).ok()?)
            .encode(&mut out, v)
            .ok()?,
        _ => return None,
    }
    Some(out)
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
        k(ApiKey::CreateTopics, 2, 7),
        k(ApiKey::InitProducerId, 0, 4),
        k(ApiKey::FindCoordinator, 1, 6),
        k(ApiKey::Produce, 3, 9),
        k(ApiKey::ListOffsets, 1, 7),
        k(ApiKey::Fetch, 4, 12),
    ])
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
                                .with_leader_id(BrokerId(1))
                                .with_replica_nodes(vec![BrokerId(1)])
                                .with_isr_nodes(vec![BrokerId(1)])
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(1))
            .with_host(StrBytes::from_string(me.host.clone()))
            .with_port(i32::from(me.port))])
        .with_controller_id(BrokerId(1))
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
                    Some(log) => base = store(log, batch),
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
                        .with_partition_index(p.partition_index);
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

fn fetch(st: &mut State, req: FetchRequest) -> FetchResponse {
    use fetch_response::*;
    let mut topics = Vec::new();
    let mut errors = 0;
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
                    .with_log_start_offset(log.log_start);
                if p.fetch_offset < log.log_start || p.fetch_offset > log.next {
                    errors += 1;
                    return r.with_error_code(1);
                }
                let mut records = BytesMut::new();
                if hide_records > 0 {
                    hide_records -= 1;
                    return r.with_records(Some(records.freeze()));
                }
                for (base, b) in &log.batches {
                    let count = i64::from(i32::from_be_bytes([b[57], b[58], b[59], b[60]]));
                    if base + count > p.fetch_offset && *base + count > log.log_start {
                        records.extend_from_slice(b);
                    }
                }
                r.with_records(Some(records.freeze()))
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
    FetchResponse::default().with_responses(topics)
}
