// One member of a consumer group (Apache Kafka's own consumer) for antidote's
// integration tests: subscribes to a topic with the given group protocol
// (classic, or KIP-848's consumer), prints every record it gets, commits its
// positions after every poll and before giving up partitions, and runs until
// STOP_FILE exists (or TIMEOUT_MS passes); then commits, prints what it
// committed and leaves the group.
//
//   java -cp 'KAFKA_LIB/*:BUILD' JavaMember BOOTSTRAP TOPIC GROUP PROTOCOL CLIENT_ID STOP_FILE TIMEOUT_MS
//
// Output, one JSON object per line:
//   {"assigned": [partitions]}  {"revoked": [partitions]}   (rebalance callbacks)
//   {"record": [partition, offset, "key b64", "value b64"]}
//   {"committed": {"P": offset}}   (the partitions it held at the end)
//   {"error": "ExceptionClass", "message": "..."}   (then exit 2)
import java.nio.file.*;
import java.time.Duration;
import java.util.*;
import java.util.stream.Collectors;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class JavaMember {
    static String b64(byte[] b) {
        return b == null ? "null" : "\"" + Base64.getEncoder().encodeToString(b) + "\"";
    }

    static String parts(Collection<TopicPartition> tps) {
        return tps.stream().map(TopicPartition::partition).sorted().map(String::valueOf)
                .collect(Collectors.joining(", ", "[", "]"));
    }

    static synchronized void out(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], group = args[2], protocol = args[3];
        String clientId = args[4];
        Path stop = Paths.get(args[5]);
        long timeoutMs = Long.parseLong(args[6]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props,
                new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                    // What was delivered is committed before another member
                    // gets the partition: nothing is read twice.
                    if (!tps.isEmpty()) c.commitSync(Duration.ofSeconds(30));
                    out("{\"revoked\": " + parts(tps) + "}");
                }

                public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                    out("{\"assigned\": " + parts(tps) + "}");
                }
            });
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (!Files.exists(stop) && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    out("{\"record\": [" + r.partition() + ", " + r.offset() + ", "
                            + b64(r.key()) + ", " + b64(r.value()) + "]}");
                }
                // The positions, which a commit marker moves past a removed tail.
                if (!c.assignment().isEmpty()) c.commitSync(Duration.ofSeconds(30));
            }
            Set<TopicPartition> held = c.assignment();
            if (!held.isEmpty()) c.commitSync(Duration.ofSeconds(30));
            StringJoiner j = new StringJoiner(", ", "{", "}");
            new TreeMap<Integer, Long>() {{
                c.committed(held, Duration.ofSeconds(10)).forEach(
                        (tp, om) -> put(tp.partition(), om == null ? -1L : om.offset()));
            }}.forEach((p, o) -> j.add("\"" + p + "\": " + o));
            out("{\"committed\": " + j + "}");
        } catch (RuntimeException e) {
            out("{\"error\": " + JavaAdmin.q(e.getClass().getSimpleName()) + ", \"message\": "
                    + JavaAdmin.q(e.getMessage()) + "}");
            System.exit(2);
        }
    }
}
