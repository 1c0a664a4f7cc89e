//! The messages patched by hand to Kafka 4.4.0's definitions in the vendored
//! kafka-protocol crate (vendor/kafka-protocol/VENDORED.md), against bytes
//! written by Kafka's own generated classes: tests/java/ProtocolVectors.java,
//! run with kafka-clients 4.4.0, printed tests/data/protocol-vectors-4.4.0.jsonl.
//! Every vector must decode at its version, consume every byte, re-encode to
//! the same bytes and have a `compute_size` equal to its length; the new
//! fields must carry the values the Java program set. The ApiKey table is
//! Kafka 4.4.0's message JSON (apiKey, validVersions, flexibleVersions).

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponsePartition;
use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Message, StrBytes};
use uuid::Uuid;

const VECTORS: &str = include_str!("data/protocol-vectors-4.4.0.jsonl");

#[derive(Debug)]
struct Vector {
    api: i16,
    kind: String,
    name: String,
    version: i16,
    bytes: Bytes,
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn vectors() -> Vec<Vector> {
    VECTORS
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            Vector {
                api: v["api"].as_i64().expect("api") as i16,
                kind: v["kind"].as_str().expect("kind").to_owned(),
                name: v["name"].as_str().expect("name").to_owned(),
                version: v["version"].as_i64().expect("version") as i16,
                bytes: Bytes::from(unhex(v["hex"].as_str().expect("hex"))),
            }
        })
        .collect()
}

/// The one vector with this name and version.
fn vector(name: &str, version: i16) -> Vector {
    let mut found: Vec<Vector> = vectors()
        .into_iter()
        .filter(|v| v.name == name && v.version == version)
        .collect();
    assert_eq!(found.len(), 1, "{name} v{version} in the vectors file");
    found.remove(0)
}

/// Decode at the vector's version, check every byte was consumed, that
/// `compute_size` is the length and that encoding gives the same bytes.
fn roundtrip<T: Decodable + Encodable + Message>(v: &Vector) -> T {
    let what = format!("{} v{}", v.name, v.version);
    assert!(
        (T::VERSIONS.min..=T::VERSIONS.max).contains(&v.version),
        "{what}: outside {}'s versions {:?}",
        std::any::type_name::<T>(),
        (T::VERSIONS.min, T::VERSIONS.max)
    );
    let mut buf = v.bytes.clone();
    let m = T::decode(&mut buf, v.version).unwrap_or_else(|e| panic!("{what}: decode: {e:#}"));
    assert!(
        buf.is_empty(),
        "{what}: {} bytes left after decode",
        buf.len()
    );
    let size = m
        .compute_size(v.version)
        .unwrap_or_else(|e| panic!("{what}: compute_size: {e:#}"));
    assert_eq!(size, v.bytes.len(), "{what}: compute_size");
    let mut out = BytesMut::new();
    m.encode(&mut out, v.version)
        .unwrap_or_else(|e| panic!("{what}: encode: {e:#}"));
    assert_eq!(hex(&out), hex(&v.bytes), "{what}: re-encoded bytes");
    m
}

fn req<T: Decodable + Encodable + Message>(name: &str, version: i16) -> T {
    roundtrip(&vector(name, version))
}

/// Round-trips one vector with the message type of its key and kind.
fn check(v: &Vector) {
    match (v.api, v.kind.as_str()) {
        (18, "request") => drop(roundtrip::<ApiVersionsRequest>(v)),
        (18, "response") => drop(roundtrip::<ApiVersionsResponse>(v)),
        (2, "request") => drop(roundtrip::<ListOffsetsRequest>(v)),
        (2, "response") => drop(roundtrip::<ListOffsetsResponse>(v)),
        (28, "request") => drop(roundtrip::<TxnOffsetCommitRequest>(v)),
        (28, "response") => drop(roundtrip::<TxnOffsetCommitResponse>(v)),
        (42, "request") => drop(roundtrip::<DeleteGroupsRequest>(v)),
        (42, "response") => drop(roundtrip::<DeleteGroupsResponse>(v)),
        (35, "request") => drop(roundtrip::<DescribeLogDirsRequest>(v)),
        (35, "response") => drop(roundtrip::<DescribeLogDirsResponse>(v)),
        (27, "request") => drop(roundtrip::<WriteTxnMarkersRequest>(v)),
        (27, "response") => drop(roundtrip::<WriteTxnMarkersResponse>(v)),
        (78, "request") => drop(roundtrip::<ShareFetchRequest>(v)),
        (78, "response") => drop(roundtrip::<ShareFetchResponse>(v)),
        (79, "request") => drop(roundtrip::<ShareAcknowledgeRequest>(v)),
        (79, "response") => drop(roundtrip::<ShareAcknowledgeResponse>(v)),
        (85, "request") => drop(roundtrip::<WriteShareGroupStateRequest>(v)),
        (85, "response") => drop(roundtrip::<WriteShareGroupStateResponse>(v)),
        (87, "request") => drop(roundtrip::<ReadShareGroupStateSummaryRequest>(v)),
        (87, "response") => drop(roundtrip::<ReadShareGroupStateSummaryResponse>(v)),
        (90, "request") => drop(roundtrip::<DescribeShareGroupOffsetsRequest>(v)),
        (90, "response") => drop(roundtrip::<DescribeShareGroupOffsetsResponse>(v)),
        (63, "request") => drop(roundtrip::<BrokerHeartbeatRequest>(v)),
        (63, "response") => drop(roundtrip::<BrokerHeartbeatResponse>(v)),
        (80, "request") => drop(roundtrip::<AddRaftVoterRequest>(v)),
        (80, "response") => drop(roundtrip::<AddRaftVoterResponse>(v)),
        (api, kind) => panic!("{}: no message type for api {api} {kind}", v.name),
    }
}

/// The patched APIs: key, Kafka 4.1's highest version, Kafka 4.4.0's.
const CHANGED: [(i16, i16, i16); 13] = [
    (18, 4, 5),  // ApiVersions
    (2, 10, 11), // ListOffsets
    (28, 5, 6),  // TxnOffsetCommit
    (42, 2, 3),  // DeleteGroups
    (35, 4, 5),  // DescribeLogDirs
    (27, 1, 2),  // WriteTxnMarkers
    (78, 1, 2),  // ShareFetch
    (79, 1, 2),  // ShareAcknowledge
    (85, 0, 1),  // WriteShareGroupState
    (87, 0, 1),  // ReadShareGroupStateSummary
    (90, 0, 1),  // DescribeShareGroupOffsets
    (63, 1, 2),  // BrokerHeartbeat
    (80, 0, 1),  // AddRaftVoter
];

#[test]
fn every_java_vector_round_trips_byte_for_byte() {
    let all = vectors();
    for v in &all {
        check(v);
    }
    // Both kinds of every patched API at both versions are in the file.
    for (api, old, new) in CHANGED {
        for kind in ["request", "response"] {
            for version in [old, new] {
                assert!(
                    all.iter()
                        .any(|v| v.api == api && v.kind == kind && v.version == version),
                    "no {kind} vector for api {api} v{version}"
                );
            }
        }
    }
    assert!(all.len() >= 4 * CHANGED.len(), "{} vectors", all.len());
}

fn assert_versions<T: Message>(key: ApiKey, max: i16) {
    let r = key.valid_versions();
    assert_eq!(r.max, max, "{key:?} valid_versions");
    assert_eq!(
        (T::VERSIONS.min, T::VERSIONS.max),
        (r.min, r.max),
        "{}::VERSIONS",
        std::any::type_name::<T>()
    );
}

#[test]
fn patched_messages_have_kafka_4_4_versions() {
    assert_versions::<ApiVersionsRequest>(ApiKey::ApiVersions, 5);
    assert_versions::<ApiVersionsResponse>(ApiKey::ApiVersions, 5);
    assert_versions::<ListOffsetsRequest>(ApiKey::ListOffsets, 11);
    assert_versions::<ListOffsetsResponse>(ApiKey::ListOffsets, 11);
    assert_versions::<TxnOffsetCommitRequest>(ApiKey::TxnOffsetCommit, 6);
    assert_versions::<TxnOffsetCommitResponse>(ApiKey::TxnOffsetCommit, 6);
    assert_versions::<DeleteGroupsRequest>(ApiKey::DeleteGroups, 3);
    assert_versions::<DeleteGroupsResponse>(ApiKey::DeleteGroups, 3);
    assert_versions::<DescribeLogDirsRequest>(ApiKey::DescribeLogDirs, 5);
    assert_versions::<DescribeLogDirsResponse>(ApiKey::DescribeLogDirs, 5);
    assert_versions::<WriteTxnMarkersRequest>(ApiKey::WriteTxnMarkers, 2);
    assert_versions::<WriteTxnMarkersResponse>(ApiKey::WriteTxnMarkers, 2);
    assert_versions::<ShareFetchRequest>(ApiKey::ShareFetch, 2);
    assert_versions::<ShareFetchResponse>(ApiKey::ShareFetch, 2);
    assert_versions::<ShareAcknowledgeRequest>(ApiKey::ShareAcknowledge, 2);
    assert_versions::<ShareAcknowledgeResponse>(ApiKey::ShareAcknowledge, 2);
    assert_versions::<WriteShareGroupStateRequest>(ApiKey::WriteShareGroupState, 1);
    assert_versions::<WriteShareGroupStateResponse>(ApiKey::WriteShareGroupState, 1);
    assert_versions::<ReadShareGroupStateSummaryRequest>(ApiKey::ReadShareGroupStateSummary, 1);
    assert_versions::<ReadShareGroupStateSummaryResponse>(ApiKey::ReadShareGroupStateSummary, 1);
    assert_versions::<DescribeShareGroupOffsetsRequest>(ApiKey::DescribeShareGroupOffsets, 1);
    assert_versions::<DescribeShareGroupOffsetsResponse>(ApiKey::DescribeShareGroupOffsets, 1);
    assert_versions::<BrokerHeartbeatRequest>(ApiKey::BrokerHeartbeat, 2);
    assert_versions::<BrokerHeartbeatResponse>(ApiKey::BrokerHeartbeat, 2);
    assert_versions::<AddRaftVoterRequest>(ApiKey::AddRaftVoter, 1);
    assert_versions::<AddRaftVoterResponse>(ApiKey::AddRaftVoter, 1);
    // Nested structs carry the message's versions too.
    assert_eq!(TxnOffsetCommitRequestTopic::VERSIONS.max, 6);
    assert_eq!(DeletableGroupResult::VERSIONS.max, 3);
    assert_eq!(DescribeShareGroupOffsetsResponsePartition::VERSIONS.max, 1);
}

// The values below are the ones tests/java/ProtocolVectors.java sets.
const TOPIC_A: Uuid = Uuid::from_u64_pair(0x0123456789abcdef, 0x0fedcba987654321);
const DIR_A: Uuid = Uuid::from_u64_pair(0x6c6f672d6469722d, 0x6f66666c696e6521);
const DIR_B: Uuid = Uuid::from_u64_pair(0x636f72646f6e6564, 0x2d6c6f672d646972);
const DIR_C: Uuid = Uuid::from_u64_pair(0x7365636f6e642d63, 0x6f72646f6e656421);

fn s(x: &Option<StrBytes>) -> Option<&str> {
    x.as_ref().map(StrBytes::as_str)
}

#[test]
fn api_versions_v5_carries_cluster_and_node_id() {
    let m: ApiVersionsRequest = req("ApiVersionsRequest", 5);
    assert_eq!(s(&m.cluster_id), Some("vectors-cluster-4-4"));
    assert_eq!(m.node_id, 7);
    assert_eq!(m.client_software_name.as_str(), "antidote-vectors");
    let m: ApiVersionsRequest = req("ApiVersionsRequest/nulls+unknown-tag", 5);
    assert_eq!(m.cluster_id, None);
    assert_eq!(m.node_id, 3);
    assert_eq!(
        m.unknown_tagged_fields.get(&5).map(|b| &b[..]),
        Some(&[0x0a, 0x0b][..])
    );
    // v4 has neither: the defaults of the JSON (null, -1).
    let m: ApiVersionsRequest = req("ApiVersionsRequest", 4);
    assert_eq!((m.cluster_id, m.node_id), (None, -1));
    let m: ApiVersionsResponse = req("ApiVersionsResponse", 5);
    let keys: Vec<_> = m
        .api_keys
        .iter()
        .map(|k| (k.api_key, k.min_version, k.max_version))
        .collect();
    assert_eq!(keys, [(18, 0, 5), (88, 0, 1)]);
    assert_eq!(m.finalized_features_epoch, 42);
    assert!(m.zk_migration_ready);
}

#[test]
fn txn_offset_commit_v6_names_topics_by_id() {
    let m: TxnOffsetCommitRequest = req("TxnOffsetCommitRequest", 6);
    assert_eq!(m.topics.len(), 1);
    assert_eq!(m.topics[0].topic_id, TOPIC_A);
    assert!(m.topics[0].name.is_empty(), "no name on the wire at v6");
    // GenerationIdOrMemberEpoch in 4.4's JSON; the Rust name stays.
    assert_eq!(m.generation_id, 17);
    assert_eq!(s(&m.group_instance_id), Some("instance-vectors"));
    assert_eq!(
        s(&m.topics[0].partitions[1].committed_metadata),
        Some("meta-3")
    );
    let m: TxnOffsetCommitRequest = req("TxnOffsetCommitRequest/nulls", 6);
    assert_eq!(m.group_instance_id, None);
    assert_eq!(m.topics[0].partitions[0].committed_metadata, None);
    let m: TxnOffsetCommitRequest = req("TxnOffsetCommitRequest", 5);
    assert_eq!(m.topics[0].name.as_str(), "orders");
    assert_eq!(m.topics[0].topic_id, Uuid::nil());
    let m: TxnOffsetCommitResponse = req("TxnOffsetCommitResponse", 6);
    assert_eq!(m.topics[0].topic_id, TOPIC_A);
    assert_eq!(m.topics[0].partitions[1].error_code, 100);
    let m: TxnOffsetCommitResponse = req("TxnOffsetCommitResponse", 5);
    assert_eq!(m.topics[0].name.as_str(), "orders");
}

#[test]
fn new_fields_decode_to_the_values_java_wrote() {
    let m: DeleteGroupsResponse = req("DeleteGroupsResponse", 3);
    assert_eq!(
        s(&m.results[0].error_message),
        Some("The group is not empty.")
    );
    assert_eq!(
        s(&m.results[1].error_message),
        Some("The group id does not exist.")
    );
    let m: DeleteGroupsResponse = req("DeleteGroupsResponse/nulls", 3);
    assert_eq!(m.results[0].error_message, None);
    assert_eq!(m.results[0].error_code, 68);

    let m: DescribeLogDirsResponse = req("DescribeLogDirsResponse", 5);
    assert!(m.results[0].is_cordoned);
    assert_eq!(m.results[0].usable_bytes, 500_000_000_000);
    let m: DescribeLogDirsResponse = req("DescribeLogDirsResponse", 4);
    assert!(!m.results[0].is_cordoned);
    let m: DescribeLogDirsRequest = req("DescribeLogDirsRequest/nulls", 5);
    assert_eq!(m.topics, None);

    let m: WriteTxnMarkersRequest = req("WriteTxnMarkersRequest", 2);
    assert_eq!(m.markers[0].transaction_version, 2);
    assert_eq!(m.markers[0].coordinator_epoch, 11);
    let m: WriteTxnMarkersRequest = req("WriteTxnMarkersRequest", 1);
    assert_eq!(m.markers[0].transaction_version, 0);

    let m: ShareFetchRequest = req("ShareFetchRequest", 2);
    assert_eq!((m.share_acquire_mode, m.is_renew_ack), (1, true));
    assert_eq!(m.batch_size, 100);
    let acks = &m.topics[0].partitions[0].acknowledgement_batches[0].acknowledge_types;
    assert_eq!(acks, &[1, 4, 2], "4 = Renew");
    let m: ShareFetchRequest = req("ShareFetchRequest", 1);
    assert_eq!((m.share_acquire_mode, m.is_renew_ack), (0, false));
    let m: ShareFetchRequest = req("ShareFetchRequest/nulls", 2);
    assert!(m.group_id.is_none() && m.member_id.is_none());
    let m: ShareFetchResponse = req("ShareFetchResponse", 2);
    let p = &m.responses[0].partitions[0];
    assert_eq!(p.records.as_deref(), Some(&[1, 2, 3, 4, 5, 6, 7, 8, 9][..]));
    assert_eq!(m.acquisition_lock_timeout_ms, 30000);

    let m: ShareAcknowledgeRequest = req("ShareAcknowledgeRequest", 2);
    assert!(m.is_renew_ack);
    let m: ShareAcknowledgeResponse = req("ShareAcknowledgeResponse", 2);
    assert_eq!(m.acquisition_lock_timeout_ms, 15000);
    assert_eq!(m.node_endpoints[0].port, 9093);
    let m: ShareAcknowledgeResponse = req("ShareAcknowledgeResponse", 1);
    assert_eq!(m.acquisition_lock_timeout_ms, 0);
    let m: ShareAcknowledgeResponse = req("ShareAcknowledgeResponse/nulls+unknown-tag", 2);
    assert_eq!(m.error_message, None);
    assert_eq!(
        m.unknown_tagged_fields.get(&9).map(|b| &b[..]),
        Some(&[1, 2, 3][..])
    );

    let m: WriteShareGroupStateRequest = req("WriteShareGroupStateRequest", 1);
    assert_eq!(m.topics[0].partitions[0].delivery_complete_count, 5);
    assert_eq!(m.topics[0].partitions[0].state_batches.len(), 2);
    let m: WriteShareGroupStateRequest = req("WriteShareGroupStateRequest", 0);
    assert_eq!(m.topics[0].partitions[0].delivery_complete_count, -1);
    let m: ReadShareGroupStateSummaryResponse = req("ReadShareGroupStateSummaryResponse", 1);
    assert_eq!(m.results[0].partitions[0].delivery_complete_count, 6);
    assert_eq!(m.results[0].partitions[0].start_offset, 40);
    let m: ReadShareGroupStateSummaryResponse = req("ReadShareGroupStateSummaryResponse", 0);
    assert_eq!(m.results[0].partitions[0].delivery_complete_count, -1);
    let m: DescribeShareGroupOffsetsResponse = req("DescribeShareGroupOffsetsResponse", 1);
    let p = &m.groups[0].topics[0].partitions[0];
    assert_eq!((p.lag, p.leader_epoch, p.error_code), (123, 3, 3));
    let m: DescribeShareGroupOffsetsResponse = req("DescribeShareGroupOffsetsResponse", 0);
    assert_eq!(m.groups[0].topics[0].partitions[0].lag, -1);

    let m: BrokerHeartbeatRequest = req("BrokerHeartbeatRequest", 2);
    assert_eq!(m.offline_log_dirs, [DIR_A]);
    assert_eq!(m.cordoned_log_dirs, Some(vec![DIR_B, DIR_C]));
    let m: BrokerHeartbeatRequest = req("BrokerHeartbeatRequest/nulls", 2);
    assert_eq!(m.cordoned_log_dirs, None);
    let m: BrokerHeartbeatRequest = req("BrokerHeartbeatRequest/empty+unknown-tag", 2);
    assert_eq!(m.cordoned_log_dirs, Some(vec![]));
    assert_eq!(
        m.unknown_tagged_fields.get(&6).map(|b| &b[..]),
        Some(&[0x42][..])
    );
    let m: BrokerHeartbeatRequest = req("BrokerHeartbeatRequest", 1);
    assert_eq!((m.offline_log_dirs.len(), m.cordoned_log_dirs), (1, None));

    let m: AddRaftVoterRequest = req("AddRaftVoterRequest", 1);
    assert!(!m.ack_when_committed);
    assert_eq!(m.listeners[1].port, 65000);
    let m: AddRaftVoterRequest = req("AddRaftVoterRequest", 0);
    assert!(m.ack_when_committed, "default true below v1");
}

fn encode<T: Encodable>(m: &T, version: i16) -> anyhow::Result<Vec<u8>> {
    let mut out = BytesMut::new();
    m.encode(&mut out, version)?;
    Ok(out.to_vec())
}

#[test]
fn new_fields_below_their_version_are_dropped_or_refused_as_the_json_says() {
    // Ignorable fields are dropped at older versions.
    let with = ApiVersionsRequest::default()
        .with_cluster_id(Some(StrBytes::from_static_str("c")))
        .with_node_id(7);
    assert_eq!(
        encode(&with, 4).unwrap(),
        encode(&ApiVersionsRequest::default(), 4).unwrap()
    );
    assert_ne!(
        encode(&with, 5).unwrap(),
        encode(&ApiVersionsRequest::default(), 5).unwrap()
    );
    let topic = TxnOffsetCommitRequestTopic::default()
        .with_name(TopicName(StrBytes::from_static_str("orders")))
        .with_topic_id(TOPIC_A);
    // v5 writes only the name, v6 only the id.
    assert_eq!(
        encode(&topic, 5).unwrap(),
        [0x07, b'o', b'r', b'd', b'e', b'r', b's', 0x01, 0x00]
    );
    let mut v6 = vec![];
    v6.extend_from_slice(TOPIC_A.as_bytes());
    v6.extend_from_slice(&[0x01, 0x00]);
    assert_eq!(encode(&topic, 6).unwrap(), v6);
    // Non-ignorable ones are an error when set to a non-default value.
    let fetch = ShareFetchRequest::default().with_is_renew_ack(true);
    assert!(encode(&fetch, 1).is_err());
    assert!(encode(&fetch, 2).is_ok());
    let ack = ShareAcknowledgeRequest::default().with_is_renew_ack(true);
    assert!(encode(&ack, 1).is_err());
    let voter = AddRaftVoterRequest::default().with_ack_when_committed(false);
    assert!(encode(&voter, 0).is_err());
    assert!(encode(&AddRaftVoterRequest::default(), 0).is_ok());
    // Versions past 4.4.0's are still refused.
    assert!(encode(&ApiVersionsRequest::default(), 6).is_err());
    assert!(ApiVersionsRequest::decode(&mut Bytes::from_static(&[0, 0, 0, 0]), 6).is_err());
}

/// Kafka 4.4.0's message JSON: apiKey, name, validVersions (None: "none"),
/// and the first flexible version of the request and of the response.
#[allow(clippy::type_complexity)]
const KAFKA_4_4_0_KEYS: &[(i16, &str, Option<(i16, i16)>, Option<i16>, Option<i16>)] = &[
    (0, "Produce", Some((3, 13)), Some(9), Some(9)),
    (1, "Fetch", Some((4, 18)), Some(12), Some(12)),
    (2, "ListOffsets", Some((1, 11)), Some(6), Some(6)),
    (3, "Metadata", Some((0, 13)), Some(9), Some(9)),
    (4, "LeaderAndIsr", None, None, None),
    (5, "StopReplica", None, None, None),
    (6, "UpdateMetadata", None, None, None),
    (7, "ControlledShutdown", None, None, None),
    (8, "OffsetCommit", Some((2, 10)), Some(8), Some(8)),
    (9, "OffsetFetch", Some((1, 10)), Some(6), Some(6)),
    (10, "FindCoordinator", Some((0, 6)), Some(3), Some(3)),
    (11, "JoinGroup", Some((0, 9)), Some(6), Some(6)),
    (12, "Heartbeat", Some((0, 4)), Some(4), Some(4)),
    (13, "LeaveGroup", Some((0, 5)), Some(4), Some(4)),
    (14, "SyncGroup", Some((0, 5)), Some(4), Some(4)),
    (15, "DescribeGroups", Some((0, 6)), Some(5), Some(5)),
    (16, "ListGroups", Some((0, 5)), Some(3), Some(3)),
    (17, "SaslHandshake", Some((0, 1)), None, None),
    (18, "ApiVersions", Some((0, 5)), Some(3), Some(3)),
    (19, "CreateTopics", Some((2, 7)), Some(5), Some(5)),
    (20, "DeleteTopics", Some((1, 6)), Some(4), Some(4)),
    (21, "DeleteRecords", Some((0, 2)), Some(2), Some(2)),
    (22, "InitProducerId", Some((0, 6)), Some(2), Some(2)),
    (23, "OffsetForLeaderEpoch", Some((2, 4)), Some(4), Some(4)),
    (24, "AddPartitionsToTxn", Some((0, 5)), Some(3), Some(3)),
    (25, "AddOffsetsToTxn", Some((0, 4)), Some(3), Some(3)),
    (26, "EndTxn", Some((0, 5)), Some(3), Some(3)),
    (27, "WriteTxnMarkers", Some((1, 2)), Some(1), Some(1)),
    (28, "TxnOffsetCommit", Some((0, 6)), Some(3), Some(3)),
    (29, "DescribeAcls", Some((1, 3)), Some(2), Some(2)),
    (30, "CreateAcls", Some((1, 3)), Some(2), Some(2)),
    (31, "DeleteAcls", Some((1, 3)), Some(2), Some(2)),
    (32, "DescribeConfigs", Some((1, 4)), Some(4), Some(4)),
    (33, "AlterConfigs", Some((0, 2)), Some(2), Some(2)),
    (34, "AlterReplicaLogDirs", Some((1, 2)), Some(2), Some(2)),
    (35, "DescribeLogDirs", Some((1, 5)), Some(2), Some(2)),
    (36, "SaslAuthenticate", Some((0, 2)), Some(2), Some(2)),
    (37, "CreatePartitions", Some((0, 3)), Some(2), Some(2)),
    (38, "CreateDelegationToken", Some((1, 3)), Some(2), Some(2)),
    (39, "RenewDelegationToken", Some((1, 2)), Some(2), Some(2)),
    (40, "ExpireDelegationToken", Some((1, 2)), Some(2), Some(2)),
    (
        41,
        "DescribeDelegationToken",
        Some((1, 3)),
        Some(2),
        Some(2),
    ),
    (42, "DeleteGroups", Some((0, 3)), Some(2), Some(2)),
    (43, "ElectLeaders", Some((0, 2)), Some(2), Some(2)),
    (
        44,
        "IncrementalAlterConfigs",
        Some((0, 1)),
        Some(1),
        Some(1),
    ),
    (
        45,
        "AlterPartitionReassignments",
        Some((0, 1)),
        Some(0),
        Some(0),
    ),
    (
        46,
        "ListPartitionReassignments",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (47, "OffsetDelete", Some((0, 0)), None, None),
    (48, "DescribeClientQuotas", Some((0, 1)), Some(1), Some(1)),
    (49, "AlterClientQuotas", Some((0, 1)), Some(1), Some(1)),
    (
        50,
        "DescribeUserScramCredentials",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (
        51,
        "AlterUserScramCredentials",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (52, "Vote", Some((0, 2)), Some(0), Some(0)),
    (53, "BeginQuorumEpoch", Some((0, 1)), Some(1), Some(1)),
    (54, "EndQuorumEpoch", Some((0, 1)), Some(1), Some(1)),
    (55, "DescribeQuorum", Some((0, 2)), Some(0), Some(0)),
    (56, "AlterPartition", Some((2, 3)), Some(0), Some(0)),
    (57, "UpdateFeatures", Some((0, 2)), Some(0), Some(0)),
    (58, "Envelope", Some((0, 0)), Some(0), Some(0)),
    (59, "FetchSnapshot", Some((0, 1)), Some(0), Some(0)),
    (60, "DescribeCluster", Some((0, 2)), Some(0), Some(0)),
    (61, "DescribeProducers", Some((0, 0)), Some(0), Some(0)),
    (62, "BrokerRegistration", Some((0, 4)), Some(0), Some(0)),
    (63, "BrokerHeartbeat", Some((0, 2)), Some(0), Some(0)),
    (64, "UnregisterBroker", Some((0, 0)), Some(0), Some(0)),
    (65, "DescribeTransactions", Some((0, 0)), Some(0), Some(0)),
    (66, "ListTransactions", Some((0, 2)), Some(0), Some(0)),
    (67, "AllocateProducerIds", Some((0, 0)), Some(0), Some(0)),
    (68, "ConsumerGroupHeartbeat", Some((0, 1)), Some(0), Some(0)),
    (69, "ConsumerGroupDescribe", Some((0, 1)), Some(0), Some(0)),
    (70, "ControllerRegistration", Some((0, 0)), Some(0), Some(0)),
    (
        71,
        "GetTelemetrySubscriptions",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (72, "PushTelemetry", Some((0, 0)), Some(0), Some(0)),
    (73, "AssignReplicasToDirs", Some((0, 0)), Some(0), Some(0)),
    (74, "ListConfigResources", Some((0, 1)), Some(0), Some(0)),
    (
        75,
        "DescribeTopicPartitions",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (76, "ShareGroupHeartbeat", Some((1, 1)), Some(0), Some(0)),
    (77, "ShareGroupDescribe", Some((1, 1)), Some(0), Some(0)),
    (78, "ShareFetch", Some((1, 2)), Some(0), Some(0)),
    (79, "ShareAcknowledge", Some((1, 2)), Some(0), Some(0)),
    (80, "AddRaftVoter", Some((0, 1)), Some(0), Some(0)),
    (81, "RemoveRaftVoter", Some((0, 0)), Some(0), Some(0)),
    (82, "UpdateRaftVoter", Some((0, 0)), Some(0), Some(0)),
    (
        83,
        "InitializeShareGroupState",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (84, "ReadShareGroupState", Some((0, 0)), Some(0), Some(0)),
    (85, "WriteShareGroupState", Some((0, 1)), Some(0), Some(0)),
    (86, "DeleteShareGroupState", Some((0, 0)), Some(0), Some(0)),
    (
        87,
        "ReadShareGroupStateSummary",
        Some((0, 1)),
        Some(0),
        Some(0),
    ),
    (88, "StreamsGroupHeartbeat", Some((0, 1)), Some(0), Some(0)),
    (89, "StreamsGroupDescribe", Some((0, 1)), Some(0), Some(0)),
    (
        90,
        "DescribeShareGroupOffsets",
        Some((0, 1)),
        Some(0),
        Some(0),
    ),
    (91, "AlterShareGroupOffsets", Some((0, 0)), Some(0), Some(0)),
    (
        92,
        "DeleteShareGroupOffsets",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (
        93,
        "StreamsGroupTopologyDescriptionUpdate",
        Some((0, 0)),
        Some(0),
        Some(0),
    ),
    (94, "UnregisterController", Some((0, 0)), Some(0), Some(0)),
];

#[test]
fn api_keys_match_kafka_4_4_0() {
    for &(n, name, versions, req_flex, resp_flex) in KAFKA_4_4_0_KEYS {
        let Some((min, max)) = versions else {
            // Removed in Kafka 4.0 (validVersions "none"): not a key to the crate.
            assert!(ApiKey::try_from(n).is_err(), "{name} ({n}) has no versions");
            continue;
        };
        let key = ApiKey::try_from(n).unwrap_or_else(|_| panic!("{name} ({n}) is unknown"));
        assert_eq!(format!("{key:?}"), name, "key {n}");
        assert_eq!(key as i16, n);
        let r = key.valid_versions();
        assert_eq!((r.min, r.max), (min, max), "{name} ({n}) valid_versions");
        for v in min..=max {
            let flexible = |first: Option<i16>| first.is_some_and(|f| v >= f);
            let want_req = if flexible(req_flex) { 2 } else { 1 };
            assert_eq!(
                key.request_header_version(v),
                want_req,
                "{name} v{v} request header"
            );
            // ApiVersions responses keep header v0 at every version (KIP-511).
            let want_resp = if key == ApiKey::ApiVersions {
                0
            } else if flexible(resp_flex) {
                1
            } else {
                0
            };
            assert_eq!(
                key.response_header_version(v),
                want_resp,
                "{name} v{v} response header"
            );
        }
    }
    // Nothing else converts, and iter() lists exactly the keys with versions.
    let known: Vec<i16> = KAFKA_4_4_0_KEYS
        .iter()
        .filter(|k| k.2.is_some())
        .map(|k| k.0)
        .collect();
    for n in -5..=300i16 {
        assert_eq!(
            ApiKey::try_from(n).is_ok(),
            known.contains(&n),
            "api key {n}"
        );
    }
    let listed: Vec<i16> = ApiKey::iter().map(|k| k as i16).collect();
    assert_eq!(listed, known);
}
