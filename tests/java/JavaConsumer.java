// A Java consumer (Apache Kafka's own client) for antidote's integration
// tests: reads one topic through whatever bootstrap it is given, until its
// position has reached the end offset of every partition, then prints what
// it read and, in a group, commits and prints the committed offsets.
//
//   java -cp 'KAFKA_LIB/*:BUILD' JavaConsumer assign|group BOOTSTRAP TOPIC PARTITIONS GROUP TIMEOUT_MS [ISOLATION [MAX_PARTITION_FETCH_BYTES]]
//
// Output, one JSON object per line:
//   {"record": [partition, offset, "key b64", "value b64"]}
//   {"end": {"P": end offset}, "position": {"P": position}}
//   {"committed": {"P": offset}}             (group mode only)
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class JavaConsumer {
    static String b64(byte[] b) {
        return b == null ? "null" : "\"" + Base64.getEncoder().encodeToString(b) + "\"";
    }

    static String map(Map<TopicPartition, Long> m) {
        StringJoiner j = new StringJoiner(", ", "{", "}");
        new TreeMap<Integer, Long>() {{
            m.forEach((tp, v) -> put(tp.partition(), v));
        }}.forEach((p, v) -> j.add("\"" + p + "\": " + v));
        return j.toString();
    }

    public static void main(String[] args) {
        String mode = args[0], bootstrap = args[1], topic = args[2];
        int partitions = Integer.parseInt(args[3]);
        String group = args[4];
        long timeoutMs = Long.parseLong(args[5]);
        String isolation = args.length > 6 ? args[6] : "read_uncommitted";
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "antidote-java-test");
        if (args.length > 7) props.put(ConsumerConfig.MAX_PARTITION_FETCH_BYTES_CONFIG, args[7]);
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props,
                new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            if (mode.equals("assign")) {
                c.assign(tps);
                c.seekToBeginning(tps);
            } else {
                c.subscribe(List.of(topic));
            }
            long deadline = System.currentTimeMillis() + timeoutMs;
            Map<TopicPartition, Long> end = null;
            Map<TopicPartition, Long> position = new HashMap<>();
            while (System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println("{\"record\": [" + r.partition() + ", " + r.offset() + ", "
                            + b64(r.key()) + ", " + b64(r.value()) + "]}");
                }
                if (!c.assignment().containsAll(tps)) continue;
                end = c.endOffsets(tps, Duration.ofSeconds(10));
                boolean done = true;
                for (TopicPartition tp : tps) {
                    long pos = c.position(tp, Duration.ofSeconds(10));
                    position.put(tp, pos);
                    done &= pos >= end.get(tp);
                }
                if (done) break;
            }
            System.out.println("{\"end\": " + (end == null ? "{}" : map(end))
                    + ", \"position\": " + map(position) + "}");
            if (mode.equals("group")) {
                c.commitSync(Duration.ofSeconds(30));
                Map<TopicPartition, Long> committed = new HashMap<>();
                c.committed(new HashSet<>(tps), Duration.ofSeconds(10)).forEach(
                        (tp, om) -> committed.put(tp, om == null ? -1L : om.offset()));
                System.out.println("{\"committed\": " + map(committed) + "}");
            }
        }
    }
}
