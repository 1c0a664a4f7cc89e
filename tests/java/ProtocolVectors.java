// Wire vectors from Apache Kafka's own generated message classes, for the
// messages whose Kafka 4.4.0 definitions were patched by hand into the
// vendored kafka-protocol crate (vendor/kafka-protocol/VENDORED.md).
//
//   java -cp 'kafka-clients-4.4.0.jar' tests/java/ProtocolVectors.java \
//       > tests/data/protocol-vectors-4.4.0.jsonl
//
// For every changed request and response it serializes, at the version
// Kafka 4.4.0 added and at the previous highest one, an instance with every
// field of that version set to a non-default value (nested arrays, nullable
// fields set, tagged fields); "/nulls" vectors set the nullable fields to
// null instead, and a few carry an unknown tagged field. Output, one JSON
// object per line:
//   {"api": 18, "kind": "request", "name": "ApiVersionsRequest", "version": 5, "hex": "..."}
// tests/protocol_vectors.rs decodes each with the vendored crate, re-encodes
// it and compares the bytes.
//
// Setters that only kafka-clients 4.4 has are called by name (set(...)), so
// the file still compiles with the other tests/java programs against an older
// kafka-clients; running it against one fails with the missing setter named.
// Before printing, every vector is parsed back with Kafka's own reader and
// must equal the message it was written from and re-serialize to the same
// bytes (a value set for a field the version lacks would fail here).
import java.lang.reflect.Constructor;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.AddRaftVoterRequestData;
import org.apache.kafka.common.message.AddRaftVoterResponseData;
import org.apache.kafka.common.message.ApiVersionsRequestData;
import org.apache.kafka.common.message.ApiVersionsResponseData;
import org.apache.kafka.common.message.BrokerHeartbeatRequestData;
import org.apache.kafka.common.message.BrokerHeartbeatResponseData;
import org.apache.kafka.common.message.DeleteGroupsRequestData;
import org.apache.kafka.common.message.DeleteGroupsResponseData;
import org.apache.kafka.common.message.DescribeLogDirsRequestData;
import org.apache.kafka.common.message.DescribeLogDirsResponseData;
import org.apache.kafka.common.message.DescribeShareGroupOffsetsRequestData;
import org.apache.kafka.common.message.DescribeShareGroupOffsetsResponseData;
import org.apache.kafka.common.message.ListOffsetsRequestData;
import org.apache.kafka.common.message.ListOffsetsResponseData;
import org.apache.kafka.common.message.ReadShareGroupStateSummaryRequestData;
import org.apache.kafka.common.message.ReadShareGroupStateSummaryResponseData;
import org.apache.kafka.common.message.ShareAcknowledgeRequestData;
import org.apache.kafka.common.message.ShareAcknowledgeResponseData;
import org.apache.kafka.common.message.ShareFetchRequestData;
import org.apache.kafka.common.message.ShareFetchResponseData;
import org.apache.kafka.common.message.TxnOffsetCommitRequestData;
import org.apache.kafka.common.message.TxnOffsetCommitResponseData;
import org.apache.kafka.common.message.WriteShareGroupStateRequestData;
import org.apache.kafka.common.message.WriteShareGroupStateResponseData;
import org.apache.kafka.common.message.WriteTxnMarkersRequestData;
import org.apache.kafka.common.message.WriteTxnMarkersResponseData;
import org.apache.kafka.common.protocol.ApiMessage;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.MessageUtil;
import org.apache.kafka.common.protocol.Readable;
import org.apache.kafka.common.protocol.types.RawTaggedField;

public class ProtocolVectors {
    // Fixed values, so that the output is the same on every run.
    static final Uuid TOPIC_A = new Uuid(0x0123456789abcdefL, 0x0fedcba987654321L);
    static final Uuid TOPIC_B = new Uuid(0x1111222233334444L, 0x5555666677778888L);
    static final Uuid DIR_A = new Uuid(0x6c6f672d6469722dL, 0x6f66666c696e6521L);
    static final Uuid DIR_B = new Uuid(0x636f72646f6e6564L, 0x2d6c6f672d646972L);
    static final Uuid DIR_C = new Uuid(0x7365636f6e642d63L, 0x6f72646f6e656421L);
    static final Uuid VOTER_DIR = new Uuid(0x766f7465722d6469L, 0x726563746f727921L);

    static int count = 0;

    public static void main(String[] args) throws Exception {
        for (int v : new int[] {4, 5}) {
            emit("request", "ApiVersionsRequest", apiVersionsRequest(v, false), v);
            emit("response", "ApiVersionsResponse", apiVersionsResponse(v), v);
        }
        emit("request", "ApiVersionsRequest/nulls+unknown-tag", apiVersionsRequest(5, true), 5);

        for (int v : new int[] {10, 11}) {
            emit("request", "ListOffsetsRequest", listOffsetsRequest(v), v);
            emit("response", "ListOffsetsResponse", listOffsetsResponse(v), v);
        }

        for (int v : new int[] {5, 6}) {
            emit("request", "TxnOffsetCommitRequest", txnOffsetCommitRequest(v, false), v);
            emit("response", "TxnOffsetCommitResponse", txnOffsetCommitResponse(v), v);
        }
        emit("request", "TxnOffsetCommitRequest/nulls", txnOffsetCommitRequest(6, true), 6);

        for (int v : new int[] {2, 3}) {
            emit("request", "DeleteGroupsRequest", deleteGroupsRequest(), v);
            emit("response", "DeleteGroupsResponse", deleteGroupsResponse(v, false), v);
        }
        emit("response", "DeleteGroupsResponse/nulls", deleteGroupsResponse(3, true), 3);

        for (int v : new int[] {4, 5}) {
            emit("request", "DescribeLogDirsRequest", describeLogDirsRequest(false), v);
            emit("response", "DescribeLogDirsResponse", describeLogDirsResponse(v), v);
        }
        emit("request", "DescribeLogDirsRequest/nulls", describeLogDirsRequest(true), 5);

        for (int v : new int[] {1, 2}) {
            emit("request", "WriteTxnMarkersRequest", writeTxnMarkersRequest(v), v);
            emit("response", "WriteTxnMarkersResponse", writeTxnMarkersResponse(), v);
        }

        for (int v : new int[] {1, 2}) {
            emit("request", "ShareFetchRequest", shareFetchRequest(v, false), v);
            emit("response", "ShareFetchResponse", shareFetchResponse(false), v);
            emit("request", "ShareAcknowledgeRequest", shareAcknowledgeRequest(v, false), v);
            emit("response", "ShareAcknowledgeResponse", shareAcknowledgeResponse(v, false), v);
        }
        emit("request", "ShareFetchRequest/nulls", shareFetchRequest(2, true), 2);
        emit("response", "ShareFetchResponse/nulls", shareFetchResponse(true), 2);
        emit("request", "ShareAcknowledgeRequest/nulls", shareAcknowledgeRequest(2, true), 2);
        emit("response", "ShareAcknowledgeResponse/nulls+unknown-tag", shareAcknowledgeResponse(2, true), 2);

        for (int v : new int[] {0, 1}) {
            emit("request", "WriteShareGroupStateRequest", writeShareGroupStateRequest(v), v);
            emit("response", "WriteShareGroupStateResponse", writeShareGroupStateResponse(false), v);
            emit("request", "ReadShareGroupStateSummaryRequest", readShareGroupStateSummaryRequest(), v);
            emit("response", "ReadShareGroupStateSummaryResponse", readShareGroupStateSummaryResponse(v, false), v);
            emit("request", "DescribeShareGroupOffsetsRequest", describeShareGroupOffsetsRequest(false), v);
            emit("response", "DescribeShareGroupOffsetsResponse", describeShareGroupOffsetsResponse(v, false), v);
        }
        emit("response", "WriteShareGroupStateResponse/nulls", writeShareGroupStateResponse(true), 1);
        emit("response", "ReadShareGroupStateSummaryResponse/nulls", readShareGroupStateSummaryResponse(1, true), 1);
        emit("request", "DescribeShareGroupOffsetsRequest/nulls", describeShareGroupOffsetsRequest(true), 1);
        emit("response", "DescribeShareGroupOffsetsResponse/nulls", describeShareGroupOffsetsResponse(1, true), 1);

        for (int v : new int[] {1, 2}) {
            emit("request", "BrokerHeartbeatRequest", brokerHeartbeatRequest(v, "set"), v);
            emit("response", "BrokerHeartbeatResponse", brokerHeartbeatResponse(), v);
        }
        emit("request", "BrokerHeartbeatRequest/nulls", brokerHeartbeatRequest(2, "null"), 2);
        emit("request", "BrokerHeartbeatRequest/empty+unknown-tag", brokerHeartbeatRequest(2, "empty"), 2);

        for (int v : new int[] {0, 1}) {
            emit("request", "AddRaftVoterRequest", addRaftVoterRequest(v, false), v);
            emit("response", "AddRaftVoterResponse", addRaftVoterResponse(false), v);
        }
        emit("request", "AddRaftVoterRequest/nulls", addRaftVoterRequest(1, true), 1);
        emit("response", "AddRaftVoterResponse/nulls", addRaftVoterResponse(true), 1);

        System.err.println(count + " vectors");
    }

    // ---- ApiVersions (18): request v5 adds ClusterId and NodeId.

    static ApiMessage apiVersionsRequest(int v, boolean nulls) {
        ApiVersionsRequestData m = new ApiVersionsRequestData()
            .setClientSoftwareName("antidote-vectors")
            .setClientSoftwareVersion("4.4.0-test");
        if (v >= 5) {
            set(m, "setClusterId", nulls ? null : "vectors-cluster-4-4");
            set(m, "setNodeId", nulls ? 3 : 7);
        }
        if (nulls) {
            m.unknownTaggedFields().add(new RawTaggedField(5, new byte[] {0x0a, 0x0b}));
        }
        return m;
    }

    static ApiMessage apiVersionsResponse(int v) {
        ApiVersionsResponseData.ApiVersionCollection keys = new ApiVersionsResponseData.ApiVersionCollection();
        keys.add(new ApiVersionsResponseData.ApiVersion().setApiKey((short) 18).setMinVersion((short) 0).setMaxVersion((short) 5));
        keys.add(new ApiVersionsResponseData.ApiVersion().setApiKey((short) 88).setMinVersion((short) 0).setMaxVersion((short) 1));
        ApiVersionsResponseData.SupportedFeatureKeyCollection supported = new ApiVersionsResponseData.SupportedFeatureKeyCollection();
        supported.add(new ApiVersionsResponseData.SupportedFeatureKey().setName("kraft.version").setMinVersion((short) 1).setMaxVersion((short) 1));
        ApiVersionsResponseData.FinalizedFeatureKeyCollection finalized = new ApiVersionsResponseData.FinalizedFeatureKeyCollection();
        finalized.add(new ApiVersionsResponseData.FinalizedFeatureKey().setName("metadata.version").setMaxVersionLevel((short) 29).setMinVersionLevel((short) 27));
        return new ApiVersionsResponseData()
            .setErrorCode((short) 41)
            .setApiKeys(keys)
            .setThrottleTimeMs(12)
            .setSupportedFeatures(supported)
            .setFinalizedFeaturesEpoch(42L)
            .setFinalizedFeatures(finalized)
            .setZkMigrationReady(true);
    }

    // ---- ListOffsets (2): v11 only bumps the version (KIP-1023).

    static ApiMessage listOffsetsRequest(int v) {
        return new ListOffsetsRequestData()
            .setReplicaId(-1)
            .setIsolationLevel((byte) 1)
            .setTopics(List.of(new ListOffsetsRequestData.ListOffsetsTopic()
                .setName("orders")
                .setPartitions(List.of(
                    new ListOffsetsRequestData.ListOffsetsPartition().setPartitionIndex(4).setCurrentLeaderEpoch(9).setTimestamp(v >= 11 ? -6L : -2L),
                    new ListOffsetsRequestData.ListOffsetsPartition().setPartitionIndex(5).setCurrentLeaderEpoch(10).setTimestamp(1700000000000L)))))
            .setTimeoutMs(1500);
    }

    static ApiMessage listOffsetsResponse(int v) {
        return new ListOffsetsResponseData()
            .setThrottleTimeMs(3)
            .setTopics(List.of(new ListOffsetsResponseData.ListOffsetsTopicResponse()
                .setName("orders")
                .setPartitions(List.of(new ListOffsetsResponseData.ListOffsetsPartitionResponse()
                    .setPartitionIndex(4)
                    .setErrorCode((short) 6)
                    .setTimestamp(1700000000000L)
                    .setOffset(12345L)
                    .setLeaderEpoch(9)))));
    }

    // ---- TxnOffsetCommit (28): v6 replaces topic Name (0-5) with TopicId (KIP-1319).

    static ApiMessage txnOffsetCommitRequest(int v, boolean nulls) {
        TxnOffsetCommitRequestData m = new TxnOffsetCommitRequestData()
            .setTransactionalId("txn-vectors")
            .setGroupId("group-vectors")
            .setProducerId(9001L)
            .setProducerEpoch((short) 3)
            .setMemberId("member-vectors")
            .setGroupInstanceId(nulls ? null : "instance-vectors");
        // GenerationId in kafka-clients before 4.4.
        set(m, "setGenerationIdOrMemberEpoch", 17);
        TxnOffsetCommitRequestData.TxnOffsetCommitRequestTopic topic = new TxnOffsetCommitRequestData.TxnOffsetCommitRequestTopic()
            .setPartitions(List.of(
                new TxnOffsetCommitRequestData.TxnOffsetCommitRequestPartition()
                    .setPartitionIndex(2).setCommittedOffset(100L).setCommittedLeaderEpoch(5)
                    .setCommittedMetadata(nulls ? null : "meta-2"),
                new TxnOffsetCommitRequestData.TxnOffsetCommitRequestPartition()
                    .setPartitionIndex(3).setCommittedOffset(200L).setCommittedLeaderEpoch(6)
                    .setCommittedMetadata("meta-3")));
        if (v >= 6) {
            set(topic, "setTopicId", TOPIC_A);
        } else {
            topic.setName("orders");
        }
        return m.setTopics(List.of(topic));
    }

    static ApiMessage txnOffsetCommitResponse(int v) {
        TxnOffsetCommitResponseData.TxnOffsetCommitResponseTopic topic = new TxnOffsetCommitResponseData.TxnOffsetCommitResponseTopic()
            .setPartitions(List.of(
                new TxnOffsetCommitResponseData.TxnOffsetCommitResponsePartition().setPartitionIndex(2).setErrorCode((short) 22),
                new TxnOffsetCommitResponseData.TxnOffsetCommitResponsePartition().setPartitionIndex(3).setErrorCode((short) 100)));
        if (v >= 6) {
            set(topic, "setTopicId", TOPIC_A);
        } else {
            topic.setName("orders");
        }
        return new TxnOffsetCommitResponseData().setThrottleTimeMs(4).setTopics(List.of(topic));
    }

    // ---- DeleteGroups (42): response v3 adds a per-group nullable ErrorMessage.

    static ApiMessage deleteGroupsRequest() {
        return new DeleteGroupsRequestData().setGroupsNames(List.of("group-a", "group-b"));
    }

    static ApiMessage deleteGroupsResponse(int v, boolean nulls) {
        DeleteGroupsResponseData.DeletableGroupResultCollection results = new DeleteGroupsResponseData.DeletableGroupResultCollection();
        DeleteGroupsResponseData.DeletableGroupResult a = new DeleteGroupsResponseData.DeletableGroupResult()
            .setGroupId("group-a").setErrorCode((short) 68);
        DeleteGroupsResponseData.DeletableGroupResult b = new DeleteGroupsResponseData.DeletableGroupResult()
            .setGroupId("group-b").setErrorCode((short) 69);
        if (v >= 3 && !nulls) {
            set(a, "setErrorMessage", "The group is not empty.");
            set(b, "setErrorMessage", "The group id does not exist.");
        }
        results.add(a);
        results.add(b);
        return new DeleteGroupsResponseData().setThrottleTimeMs(5).setResults(results);
    }

    // ---- DescribeLogDirs (35): response v5 adds IsCordoned.

    static ApiMessage describeLogDirsRequest(boolean nulls) {
        if (nulls) {
            return new DescribeLogDirsRequestData().setTopics(null);
        }
        DescribeLogDirsRequestData.DescribableLogDirTopicCollection topics = new DescribeLogDirsRequestData.DescribableLogDirTopicCollection();
        topics.add(new DescribeLogDirsRequestData.DescribableLogDirTopic().setTopic("orders").setPartitions(List.of(0, 1)));
        return new DescribeLogDirsRequestData().setTopics(topics);
    }

    static ApiMessage describeLogDirsResponse(int v) {
        DescribeLogDirsResponseData.DescribeLogDirsResult result = new DescribeLogDirsResponseData.DescribeLogDirsResult()
            .setErrorCode((short) 57)
            .setLogDir("/var/lib/kafka/data-1")
            .setTopics(List.of(new DescribeLogDirsResponseData.DescribeLogDirsTopic()
                .setName("orders")
                .setPartitions(List.of(new DescribeLogDirsResponseData.DescribeLogDirsPartition()
                    .setPartitionIndex(1).setPartitionSize(4096L).setOffsetLag(3L).setIsFutureKey(true)))))
            .setTotalBytes(1_000_000_000_000L)
            .setUsableBytes(500_000_000_000L);
        if (v >= 5) {
            set(result, "setIsCordoned", true);
        }
        return new DescribeLogDirsResponseData()
            .setThrottleTimeMs(6)
            .setErrorCode((short) 29)
            .setResults(List.of(result));
    }

    // ---- WriteTxnMarkers (27): request v2 adds TransactionVersion (KIP-1228).

    static ApiMessage writeTxnMarkersRequest(int v) {
        WriteTxnMarkersRequestData.WritableTxnMarker marker = new WriteTxnMarkersRequestData.WritableTxnMarker()
            .setProducerId(9001L)
            .setProducerEpoch((short) 3)
            .setTransactionResult(true)
            .setTopics(List.of(new WriteTxnMarkersRequestData.WritableTxnMarkerTopic()
                .setName("orders").setPartitionIndexes(List.of(0, 2))))
            .setCoordinatorEpoch(11);
        if (v >= 2) {
            set(marker, "setTransactionVersion", (byte) 2);
        }
        return new WriteTxnMarkersRequestData().setMarkers(List.of(marker));
    }

    static ApiMessage writeTxnMarkersResponse() {
        return new WriteTxnMarkersResponseData().setMarkers(List.of(new WriteTxnMarkersResponseData.WritableTxnMarkerResult()
            .setProducerId(9001L)
            .setTopics(List.of(new WriteTxnMarkersResponseData.WritableTxnMarkerTopicResult()
                .setName("orders")
                .setPartitions(List.of(new WriteTxnMarkersResponseData.WritableTxnMarkerPartitionResult()
                    .setPartitionIndex(2).setErrorCode((short) 48)))))));
    }

    // ---- ShareFetch (78): request v2 adds ShareAcquireMode and IsRenewAck (KIP-1206, KIP-1222).

    static ApiMessage shareFetchRequest(int v, boolean nulls) {
        ShareFetchRequestData.FetchPartitionCollection partitions = new ShareFetchRequestData.FetchPartitionCollection();
        partitions.add(new ShareFetchRequestData.FetchPartition()
            .setPartitionIndex(0)
            .setAcknowledgementBatches(List.of(new ShareFetchRequestData.AcknowledgementBatch()
                .setFirstOffset(10L).setLastOffset(12L)
                .setAcknowledgeTypes(v >= 2 ? List.of((byte) 1, (byte) 4, (byte) 2) : List.of((byte) 1, (byte) 3, (byte) 2)))));
        ShareFetchRequestData.FetchTopicCollection topics = new ShareFetchRequestData.FetchTopicCollection();
        topics.add(new ShareFetchRequestData.FetchTopic().setTopicId(TOPIC_A).setPartitions(partitions));
        ShareFetchRequestData m = new ShareFetchRequestData()
            .setGroupId(nulls ? null : "share-group")
            .setMemberId(nulls ? null : "share-member")
            .setShareSessionEpoch(2)
            .setMaxWaitMs(500)
            .setMinBytes(1)
            .setMaxBytes(1048576)
            .setMaxRecords(500)
            .setBatchSize(100)
            .setTopics(topics)
            .setForgottenTopicsData(List.of(new ShareFetchRequestData.ForgottenTopic().setTopicId(TOPIC_B).setPartitions(List.of(3, 4))));
        if (v >= 2) {
            set(m, "setShareAcquireMode", (byte) 1);
            set(m, "setIsRenewAck", true);
        }
        return m;
    }

    static ApiMessage shareFetchResponse(boolean nulls) throws Exception {
        ShareFetchResponseData.ShareFetchableTopicResponseCollection responses = new ShareFetchResponseData.ShareFetchableTopicResponseCollection();
        ShareFetchResponseData.PartitionData partition = new ShareFetchResponseData.PartitionData()
            .setPartitionIndex(0)
            .setErrorCode((short) 6)
            .setErrorMessage(nulls ? null : "partition error")
            .setAcknowledgeErrorCode((short) 121)
            .setAcknowledgeErrorMessage(nulls ? null : "acknowledge error")
            .setCurrentLeader(new ShareFetchResponseData.LeaderIdAndEpoch().setLeaderId(2).setLeaderEpoch(8))
            .setAcquiredRecords(List.of(new ShareFetchResponseData.AcquiredRecords().setFirstOffset(10L).setLastOffset(19L).setDeliveryCount((short) 2)));
        // Records are opaque bytes to the crate (Option<Bytes>); nullable only in
        // v0, so the /nulls vector has empty records instead.
        set(partition, "setRecords", records(nulls ? new byte[0] : new byte[] {1, 2, 3, 4, 5, 6, 7, 8, 9}));
        responses.add(new ShareFetchResponseData.ShareFetchableTopicResponse().setTopicId(TOPIC_A).setPartitions(List.of(partition)));
        ShareFetchResponseData.NodeEndpointCollection endpoints = new ShareFetchResponseData.NodeEndpointCollection();
        endpoints.add(new ShareFetchResponseData.NodeEndpoint().setNodeId(2).setHost("broker-2.example").setPort(9092).setRack(nulls ? null : "rack-b"));
        return new ShareFetchResponseData()
            .setThrottleTimeMs(7)
            .setErrorCode((short) 0x7a)
            .setErrorMessage(nulls ? null : "top-level error")
            .setAcquisitionLockTimeoutMs(30000)
            .setResponses(responses)
            .setNodeEndpoints(endpoints);
    }

    // ---- ShareAcknowledge (79): request v2 adds IsRenewAck, response v2 AcquisitionLockTimeoutMs.

    static ApiMessage shareAcknowledgeRequest(int v, boolean nulls) {
        ShareAcknowledgeRequestData.AcknowledgePartitionCollection partitions = new ShareAcknowledgeRequestData.AcknowledgePartitionCollection();
        partitions.add(new ShareAcknowledgeRequestData.AcknowledgePartition()
            .setPartitionIndex(1)
            .setAcknowledgementBatches(List.of(new ShareAcknowledgeRequestData.AcknowledgementBatch()
                .setFirstOffset(20L).setLastOffset(21L).setAcknowledgeTypes(List.of((byte) 1, v >= 2 ? (byte) 4 : (byte) 3)))));
        ShareAcknowledgeRequestData.AcknowledgeTopicCollection topics = new ShareAcknowledgeRequestData.AcknowledgeTopicCollection();
        topics.add(new ShareAcknowledgeRequestData.AcknowledgeTopic().setTopicId(TOPIC_B).setPartitions(partitions));
        ShareAcknowledgeRequestData m = new ShareAcknowledgeRequestData()
            .setGroupId(nulls ? null : "share-group")
            .setMemberId(nulls ? null : "share-member")
            .setShareSessionEpoch(3)
            .setTopics(topics);
        if (v >= 2) {
            set(m, "setIsRenewAck", true);
        }
        return m;
    }

    static ApiMessage shareAcknowledgeResponse(int v, boolean nulls) {
        ShareAcknowledgeResponseData.ShareAcknowledgeTopicResponseCollection responses = new ShareAcknowledgeResponseData.ShareAcknowledgeTopicResponseCollection();
        responses.add(new ShareAcknowledgeResponseData.ShareAcknowledgeTopicResponse()
            .setTopicId(TOPIC_B)
            .setPartitions(List.of(new ShareAcknowledgeResponseData.PartitionData()
                .setPartitionIndex(1)
                .setErrorCode((short) 121)
                .setErrorMessage(nulls ? null : "invalid record state")
                .setCurrentLeader(new ShareAcknowledgeResponseData.LeaderIdAndEpoch().setLeaderId(3).setLeaderEpoch(4)))));
        ShareAcknowledgeResponseData.NodeEndpointCollection endpoints = new ShareAcknowledgeResponseData.NodeEndpointCollection();
        endpoints.add(new ShareAcknowledgeResponseData.NodeEndpoint().setNodeId(3).setHost("broker-3.example").setPort(9093).setRack(nulls ? null : "rack-c"));
        ShareAcknowledgeResponseData m = new ShareAcknowledgeResponseData()
            .setThrottleTimeMs(8)
            .setErrorCode((short) 0x7b)
            .setErrorMessage(nulls ? null : "top-level error")
            .setResponses(responses)
            .setNodeEndpoints(endpoints);
        if (v >= 2) {
            set(m, "setAcquisitionLockTimeoutMs", 15000);
        }
        if (nulls) {
            m.unknownTaggedFields().add(new RawTaggedField(9, new byte[] {0x01, 0x02, 0x03}));
        }
        return m;
    }

    // ---- WriteShareGroupState (85), ReadShareGroupStateSummary (87),
    // DescribeShareGroupOffsets (90): v1 adds DeliveryCompleteCount / Lag (KIP-1226).

    static ApiMessage writeShareGroupStateRequest(int v) {
        WriteShareGroupStateRequestData.PartitionData partition = new WriteShareGroupStateRequestData.PartitionData()
            .setPartition(1)
            .setStateEpoch(2)
            .setLeaderEpoch(3)
            .setStartOffset(40L)
            .setStateBatches(List.of(
                new WriteShareGroupStateRequestData.StateBatch().setFirstOffset(40L).setLastOffset(44L).setDeliveryState((byte) 2).setDeliveryCount((short) 1),
                new WriteShareGroupStateRequestData.StateBatch().setFirstOffset(45L).setLastOffset(45L).setDeliveryState((byte) 4).setDeliveryCount((short) 5)));
        if (v >= 1) {
            set(partition, "setDeliveryCompleteCount", 5);
        }
        return new WriteShareGroupStateRequestData()
            .setGroupId("share-group")
            .setTopics(List.of(new WriteShareGroupStateRequestData.WriteStateData().setTopicId(TOPIC_A).setPartitions(List.of(partition))));
    }

    static ApiMessage writeShareGroupStateResponse(boolean nulls) {
        return new WriteShareGroupStateResponseData().setResults(List.of(new WriteShareGroupStateResponseData.WriteStateResult()
            .setTopicId(TOPIC_A)
            .setPartitions(List.of(new WriteShareGroupStateResponseData.PartitionResult()
                .setPartition(1).setErrorCode((short) 15).setErrorMessage(nulls ? null : "coordinator not available")))));
    }

    static ApiMessage readShareGroupStateSummaryRequest() {
        return new ReadShareGroupStateSummaryRequestData()
            .setGroupId("share-group")
            .setTopics(List.of(new ReadShareGroupStateSummaryRequestData.ReadStateSummaryData()
                .setTopicId(TOPIC_A)
                .setPartitions(List.of(new ReadShareGroupStateSummaryRequestData.PartitionData().setPartition(1).setLeaderEpoch(3)))));
    }

    static ApiMessage readShareGroupStateSummaryResponse(int v, boolean nulls) {
        ReadShareGroupStateSummaryResponseData.PartitionResult partition = new ReadShareGroupStateSummaryResponseData.PartitionResult()
            .setPartition(1)
            .setErrorCode((short) 74)
            .setErrorMessage(nulls ? null : "fenced leader epoch")
            .setStateEpoch(2)
            .setLeaderEpoch(3)
            .setStartOffset(40L);
        if (v >= 1) {
            set(partition, "setDeliveryCompleteCount", 6);
        }
        return new ReadShareGroupStateSummaryResponseData().setResults(List.of(new ReadShareGroupStateSummaryResponseData.ReadStateSummaryResult()
            .setTopicId(TOPIC_A).setPartitions(List.of(partition))));
    }

    static ApiMessage describeShareGroupOffsetsRequest(boolean nulls) {
        return new DescribeShareGroupOffsetsRequestData().setGroups(List.of(new DescribeShareGroupOffsetsRequestData.DescribeShareGroupOffsetsRequestGroup()
            .setGroupId("share-group")
            .setTopics(nulls ? null : List.of(new DescribeShareGroupOffsetsRequestData.DescribeShareGroupOffsetsRequestTopic()
                .setTopicName("orders").setPartitions(List.of(0, 1))))));
    }

    static ApiMessage describeShareGroupOffsetsResponse(int v, boolean nulls) {
        DescribeShareGroupOffsetsResponseData.DescribeShareGroupOffsetsResponsePartition partition = new DescribeShareGroupOffsetsResponseData.DescribeShareGroupOffsetsResponsePartition()
            .setPartitionIndex(1)
            .setStartOffset(40L)
            .setLeaderEpoch(3)
            .setErrorCode((short) 3)
            .setErrorMessage(nulls ? null : "unknown topic or partition");
        if (v >= 1) {
            set(partition, "setLag", 123L);
        }
        return new DescribeShareGroupOffsetsResponseData()
            .setThrottleTimeMs(9)
            .setGroups(List.of(new DescribeShareGroupOffsetsResponseData.DescribeShareGroupOffsetsResponseGroup()
                .setGroupId("share-group")
                .setTopics(List.of(new DescribeShareGroupOffsetsResponseData.DescribeShareGroupOffsetsResponseTopic()
                    .setTopicName("orders").setTopicId(TOPIC_A).setPartitions(List.of(partition))))
                .setErrorCode((short) 69)
                .setErrorMessage(nulls ? null : "group id not found")));
    }

    // ---- BrokerHeartbeat (63): request v2 adds tagged CordonedLogDirs (tag 1, nullable).

    static ApiMessage brokerHeartbeatRequest(int v, String cordoned) {
        BrokerHeartbeatRequestData m = new BrokerHeartbeatRequestData()
            .setBrokerId(4)
            .setBrokerEpoch(77L)
            .setCurrentMetadataOffset(1234L)
            .setWantFence(true)
            .setWantShutDown(true)
            .setOfflineLogDirs(List.of(DIR_A));
        if (v >= 2) {
            switch (cordoned) {
                case "set": set(m, "setCordonedLogDirs", List.of(DIR_B, DIR_C)); break;
                case "empty": set(m, "setCordonedLogDirs", new ArrayList<Uuid>()); break;
                default: set(m, "setCordonedLogDirs", null);
            }
        }
        if (cordoned.equals("empty")) {
            m.unknownTaggedFields().add(new RawTaggedField(6, new byte[] {0x42}));
        }
        return m;
    }

    static ApiMessage brokerHeartbeatResponse() {
        return new BrokerHeartbeatResponseData()
            .setThrottleTimeMs(10)
            .setErrorCode((short) 51)
            .setIsCaughtUp(true)
            .setIsFenced(false)
            .setShouldShutDown(true);
    }

    // ---- AddRaftVoter (80): request v1 adds AckWhenCommitted (default true).

    static ApiMessage addRaftVoterRequest(int v, boolean nulls) {
        AddRaftVoterRequestData.ListenerCollection listeners = new AddRaftVoterRequestData.ListenerCollection();
        listeners.add(new AddRaftVoterRequestData.Listener().setName("CONTROLLER").setHost("controller-5.example").setPort(9093));
        listeners.add(new AddRaftVoterRequestData.Listener().setName("CONTROLLER_TLS").setHost("controller-5.example").setPort(65000));
        AddRaftVoterRequestData m = new AddRaftVoterRequestData()
            .setClusterId(nulls ? null : "vectors-cluster-4-4")
            .setTimeoutMs(30000)
            .setVoterId(5)
            .setVoterDirectoryId(VOTER_DIR)
            .setListeners(listeners);
        if (v >= 1) {
            set(m, "setAckWhenCommitted", false);
        }
        return m;
    }

    static ApiMessage addRaftVoterResponse(boolean nulls) {
        return new AddRaftVoterResponseData()
            .setThrottleTimeMs(11)
            .setErrorCode((short) 116)
            .setErrorMessage(nulls ? null : "voter already present");
    }

    // ---- helpers

    /** Calls a one-argument setter by name (kafka-clients 4.4 only setters). */
    static <T> T set(T target, String setter, Object value) {
        for (Method m : target.getClass().getMethods()) {
            if (m.getName().equals(setter) && m.getParameterCount() == 1) {
                try {
                    m.invoke(target, value);
                } catch (ReflectiveOperationException e) {
                    throw new IllegalStateException(setter + " failed", e);
                }
                return target;
            }
        }
        throw new IllegalStateException(target.getClass().getName() + " has no " + setter
            + ": these vectors need kafka-clients 4.4.0");
    }

    /** MemoryRecords over raw bytes (org.apache.kafka.common.record.internal in 4.4). */
    static Object records(byte[] bytes) throws Exception {
        Class<?> cls;
        try {
            cls = Class.forName("org.apache.kafka.common.record.internal.MemoryRecords");
        } catch (ClassNotFoundException e) {
            cls = Class.forName("org.apache.kafka.common.record.MemoryRecords");
        }
        return cls.getMethod("readableRecords", ByteBuffer.class).invoke(null, ByteBuffer.wrap(bytes));
    }

    static void emit(String kind, String name, ApiMessage msg, int version) throws Exception {
        short v = (short) version;
        if (v < msg.lowestSupportedVersion() || v > msg.highestSupportedVersion()) {
            throw new IllegalStateException(name + " v" + v + " is outside "
                + msg.lowestSupportedVersion() + "-" + msg.highestSupportedVersion());
        }
        byte[] bytes = MessageUtil.byteBufferToArray(MessageUtil.toByteBufferAccessor(msg, v).buffer());
        // Kafka's own reader must give back the same message and bytes.
        Constructor<?> read = msg.getClass().getConstructor(Readable.class, short.class);
        ApiMessage back = (ApiMessage) read.newInstance(new ByteBufferAccessor(ByteBuffer.wrap(bytes)), v);
        if (!back.equals(msg)) {
            throw new IllegalStateException(name + " v" + v + " does not read back equal:\n  wrote " + msg + "\n  read  " + back);
        }
        byte[] again = MessageUtil.byteBufferToArray(MessageUtil.toByteBufferAccessor(back, v).buffer());
        if (!Arrays.equals(bytes, again)) {
            throw new IllegalStateException(name + " v" + v + " re-serializes differently");
        }
        StringBuilder hex = new StringBuilder(bytes.length * 2);
        for (byte b : bytes) {
            hex.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
        }
        System.out.println("{\"api\": " + msg.apiKey() + ", \"kind\": \"" + kind + "\", \"name\": \"" + name
            + "\", \"version\": " + version + ", \"hex\": \"" + hex + "\"}");
        count++;
    }
}
