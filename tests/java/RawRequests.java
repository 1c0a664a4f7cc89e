// One request at an exact version, written and read with kafka-clients' own
// generated message classes (no client deciding the version), for the
// id-only requests of Kafka 4.x: Produce v13, Fetch v18, OffsetCommit and
// OffsetFetch v10 name topics by id only.
//
//   java -cp 'KAFKA_LIB/*:BUILD' RawRequests metadata HOST:PORT TOPIC
//   java -cp ... RawRequests produce HOST:PORT TOPIC_ID PARTITION VERSION BATCH_HEX
//   java -cp ... RawRequests fetch HOST:PORT TOPIC_ID PARTITION OFFSET VERSION
//   java -cp ... RawRequests offsetcommit HOST:PORT GROUP TOPIC_ID PARTITION OFFSET VERSION
//   java -cp ... RawRequests offsetfetch HOST:PORT GROUP TOPIC_ID PARTITION VERSION
//   java -cp ... RawRequests shareoffsets HOST:PORT GROUP TOPIC P1,P2,.. VERSION   (DescribeShareGroupOffsets)
//
// Prints the response as Kafka's own JSON form of the message (one line);
// `fetch` adds {"records_hex": "..."}: the partition's records section as
// it arrived. Record batches go in and out as bytes (the caller builds and
// reads them), and MemoryRecords is reached by reflection: Kafka 4.4 moved
// it to org.apache.kafka.common.record.internal, and this file must compile
// against the 4.1 jars too (ANTIDOTE_KAFKA_VERSION=4.1.2).
import java.io.DataInputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.util.List;
import java.lang.reflect.Method;
import java.util.HexFormat;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.*;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.ApiMessage;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.ObjectSerializationCache;

public class RawRequests {
    static int correlation = 1;

    static ByteBuffer roundtrip(String hostPort, ApiKeys key, short v, ApiMessage body)
            throws Exception {
        String[] hp = hostPort.split(":");
        RequestHeaderData h = new RequestHeaderData().setRequestApiKey(key.id)
            .setRequestApiVersion(v).setCorrelationId(correlation).setClientId("antidote-raw");
        short hv = key.requestHeaderVersion(v);
        ObjectSerializationCache cache = new ObjectSerializationCache();
        int size = h.size(cache, hv) + body.size(cache, v);
        ByteBuffer out = ByteBuffer.allocate(4 + size);
        out.putInt(size);
        ByteBufferAccessor acc = new ByteBufferAccessor(out);
        h.write(acc, cache, hv);
        body.write(acc, cache, v);
        try (Socket s = new Socket(hp[0], Integer.parseInt(hp[1]))) {
            s.setSoTimeout(30000);
            OutputStream os = s.getOutputStream();
            os.write(out.array());
            os.flush();
            DataInputStream in = new DataInputStream(s.getInputStream());
            byte[] resp = new byte[in.readInt()];
            in.readFully(resp);
            ByteBuffer buf = ByteBuffer.wrap(resp);
            ResponseHeaderData rh = new ResponseHeaderData(new ByteBufferAccessor(buf),
                key.responseHeaderVersion(v));
            if (rh.correlationId() != correlation) {
                throw new IllegalStateException("correlation id " + rh.correlationId());
            }
            correlation++;
            return buf;
        }
    }

    /** MemoryRecords.readableRecords(bytes), wherever this Kafka keeps the class. */
    static Object memoryRecords(byte[] bytes) throws Exception {
        Class<?> c;
        try {
            c = Class.forName("org.apache.kafka.common.record.internal.MemoryRecords");
        } catch (ClassNotFoundException e) {
            c = Class.forName("org.apache.kafka.common.record.MemoryRecords");
        }
        return c.getMethod("readableRecords", ByteBuffer.class).invoke(null, ByteBuffer.wrap(bytes));
    }

    static Method setter(Class<?> c, String name) {
        for (Method m : c.getMethods()) {
            if (m.getName().equals(name) && m.getParameterCount() == 1) return m;
        }
        throw new IllegalStateException(c + " has no " + name);
    }

    public static void main(String[] a) throws Exception {
        String mode = a[0], hp = a[1];
        switch (mode) {
            case "metadata": {
                short v = 13;
                MetadataRequestData req = new MetadataRequestData()
                    .setTopics(List.of(new MetadataRequestData.MetadataRequestTopic().setName(a[2])))
                    .setAllowAutoTopicCreation(false);
                ByteBuffer b = roundtrip(hp, ApiKeys.METADATA, v, req);
                MetadataResponseData r = new MetadataResponseData(new ByteBufferAccessor(b), v);
                System.out.println(MetadataResponseDataJsonConverter.write(r, v));
                break;
            }
            case "produce": {
                Uuid id = Uuid.fromString(a[2]);
                int partition = Integer.parseInt(a[3]);
                short v = Short.parseShort(a[4]);
                Object records = memoryRecords(HexFormat.of().parseHex(a[5]));
                ProduceRequestData.TopicProduceDataCollection topics =
                    new ProduceRequestData.TopicProduceDataCollection();
                ProduceRequestData.PartitionProduceData pd =
                    new ProduceRequestData.PartitionProduceData().setIndex(partition);
                setter(pd.getClass(), "setRecords").invoke(pd, records);
                topics.add(new ProduceRequestData.TopicProduceData().setTopicId(id)
                    .setPartitionData(List.of(pd)));
                ProduceRequestData req = new ProduceRequestData().setAcks((short) -1)
                    .setTimeoutMs(30000).setTopicData(topics);
                ByteBuffer b = roundtrip(hp, ApiKeys.PRODUCE, v, req);
                ProduceResponseData r = new ProduceResponseData(new ByteBufferAccessor(b), v);
                System.out.println(ProduceResponseDataJsonConverter.write(r, v));
                break;
            }
            case "fetch": {
                Uuid id = Uuid.fromString(a[2]);
                int partition = Integer.parseInt(a[3]);
                long offset = Long.parseLong(a[4]);
                short v = Short.parseShort(a[5]);
                FetchRequestData req = new FetchRequestData().setMaxWaitMs(500).setMinBytes(1)
                    .setMaxBytes(1 << 20).setIsolationLevel((byte) 0).setSessionId(0)
                    .setSessionEpoch(-1)
                    .setTopics(List.of(new FetchRequestData.FetchTopic().setTopicId(id)
                        .setPartitions(List.of(new FetchRequestData.FetchPartition()
                            .setPartition(partition).setFetchOffset(offset)
                            .setPartitionMaxBytes(1 << 20)))));
                ByteBuffer b = roundtrip(hp, ApiKeys.FETCH, v, req);
                FetchResponseData r = new FetchResponseData(new ByteBufferAccessor(b), v);
                String hex = "";
                for (FetchResponseData.FetchableTopicResponse t : r.responses()) {
                    for (FetchResponseData.PartitionData p : t.partitions()) {
                        Object recs = p.records();
                        if (recs == null) continue;
                        ByteBuffer bb = ((ByteBuffer) recs.getClass().getMethod("buffer")
                            .invoke(recs)).duplicate();
                        byte[] bytes = new byte[bb.remaining()];
                        bb.get(bytes);
                        hex = HexFormat.of().formatHex(bytes);
                        p.setRecords(null);
                    }
                }
                System.out.println(FetchResponseDataJsonConverter.write(r, v));
                System.out.println("{\"records_hex\": \"" + hex + "\"}");
                break;
            }
            case "offsetcommit": {
                Uuid id = Uuid.fromString(a[3]);
                short v = Short.parseShort(a[6]);
                OffsetCommitRequestData req = new OffsetCommitRequestData().setGroupId(a[2])
                    .setGenerationIdOrMemberEpoch(-1).setMemberId("")
                    .setTopics(List.of(new OffsetCommitRequestData.OffsetCommitRequestTopic()
                        .setTopicId(id)
                        .setPartitions(List.of(new OffsetCommitRequestData.OffsetCommitRequestPartition()
                            .setPartitionIndex(Integer.parseInt(a[4]))
                            .setCommittedOffset(Long.parseLong(a[5]))))));
                ByteBuffer b = roundtrip(hp, ApiKeys.OFFSET_COMMIT, v, req);
                OffsetCommitResponseData r = new OffsetCommitResponseData(new ByteBufferAccessor(b), v);
                System.out.println(OffsetCommitResponseDataJsonConverter.write(r, v));
                break;
            }
            case "offsetfetch": {
                Uuid id = Uuid.fromString(a[3]);
                short v = Short.parseShort(a[5]);
                OffsetFetchRequestData req = new OffsetFetchRequestData().setGroups(List.of(
                    new OffsetFetchRequestData.OffsetFetchRequestGroup().setGroupId(a[2])
                        .setTopics(List.of(new OffsetFetchRequestData.OffsetFetchRequestTopics()
                            .setTopicId(id).setPartitionIndexes(List.of(Integer.parseInt(a[4])))))));
                ByteBuffer b = roundtrip(hp, ApiKeys.OFFSET_FETCH, v, req);
                OffsetFetchResponseData r = new OffsetFetchResponseData(new ByteBufferAccessor(b), v);
                System.out.println(OffsetFetchResponseDataJsonConverter.write(r, v));
                break;
            }
            case "shareoffsets": {
                short v = Short.parseShort(a[5]);
                List<Integer> parts = new java.util.ArrayList<>();
                for (String p : a[4].split(",")) parts.add(Integer.parseInt(p));
                DescribeShareGroupOffsetsRequestData req = new DescribeShareGroupOffsetsRequestData()
                    .setGroups(List.of(new DescribeShareGroupOffsetsRequestData.DescribeShareGroupOffsetsRequestGroup()
                        .setGroupId(a[2])
                        .setTopics(List.of(new DescribeShareGroupOffsetsRequestData.DescribeShareGroupOffsetsRequestTopic()
                            .setTopicName(a[3]).setPartitions(parts)))));
                ByteBuffer b = roundtrip(hp, ApiKeys.DESCRIBE_SHARE_GROUP_OFFSETS, v, req);
                DescribeShareGroupOffsetsResponseData r =
                    new DescribeShareGroupOffsetsResponseData(new ByteBufferAccessor(b), v);
                System.out.println(DescribeShareGroupOffsetsResponseDataJsonConverter.write(r, v));
                break;
            }
            default:
                throw new IllegalArgumentException(mode);
        }
    }
}
