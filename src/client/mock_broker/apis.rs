//! The mock broker's answer to each request it speaks (one function per
//! API key), given its state: the protocol side of `mock_broker`, which
//! owns the connections.

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::{Log, State};
use crate::config::HostPort;

pub(super) fn init_producer_id(
    st: &mut State,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
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

pub(super) fn find_coordinator(
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
pub(super) fn api_versions(st: &State) -> ApiVersionsResponse {
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

pub(super) fn metadata(st: &State, req: MetadataRequest, me: &HostPort) -> MetadataResponse {
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

pub(super) fn create(st: &mut State, req: CreateTopicsRequest) -> CreateTopicsResponse {
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

pub(super) fn produce(st: &mut State, req: ProduceRequest) -> ProduceResponse {
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

pub(super) fn list_offsets(st: &State, req: ListOffsetsRequest) -> ListOffsetsResponse {
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
pub(super) fn fetch(st: &mut State, req: FetchRequest) -> (FetchResponse, bool) {
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
