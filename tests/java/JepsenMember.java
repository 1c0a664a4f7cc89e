// One member of a consumer group (Apache Kafka's own consumer) for the
// network-fault runs (test_jepsen.py): subscribes to topics with the given
// group protocol (classic, or KIP-848's consumer), prints every record it
// gets, commits after every poll, and runs until STOP_FILE exists. Unlike
// JavaMember it rides out faults: a failed commit or poll is printed and the
// loop goes on, as an application that must not stop would do.
//
//   java -cp 'KAFKA_LIB/*:BUILD' JepsenMember BOOTSTRAP TOPICS(,) GROUP PROTOCOL CLIENT_ID STOP_FILE
//
// Output, one JSON object per line:
//   {"d": ["topic", partition, offset, "value b64"|null, millis]}
//   {"assigned": n} {"revoked": n}    {"error": "ExceptionClass", "message": "..."}
import java.nio.file.*;
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class JepsenMember {
    static synchronized void out(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static void error(Exception e) {
        out("{\"error\": " + JavaAdmin.q(e.getClass().getSimpleName()) + ", \"message\": "
                + JavaAdmin.q(String.valueOf(e.getMessage())) + "}");
    }

    public static void main(String[] args) {
        String bootstrap = args[0], group = args[2], protocol = args[3], clientId = args[4];
        List<String> topics = List.of(args[1].split(","));
        Path stop = Paths.get(args[5]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.METADATA_MAX_AGE_CONFIG, "5000");
        if (protocol.equals("classic")) {
            // A member cut off by a fault loses its partitions after 10 s, not
            // 45 s (KIP-848 groups take theirs from the broker's settings).
            props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
            props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        }
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(props,
                new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            c.subscribe(topics, new ConsumerRebalanceListener() {
                public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                    out("{\"revoked\": " + tps.size() + "}");
                    if (tps.isEmpty()) return;
                    try {
                        c.commitSync(Duration.ofSeconds(10));
                    } catch (RuntimeException e) {
                        error(e);
                    }
                }

                public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                    out("{\"assigned\": " + tps.size() + "}");
                }
            });
            Base64.Encoder b64 = Base64.getEncoder();
            while (!Files.exists(stop)) {
                try {
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                        String v = r.value() == null ? "null"
                                : "\"" + b64.encodeToString(r.value()) + "\"";
                        out("{\"d\": [" + JavaAdmin.q(r.topic()) + ", " + r.partition() + ", "
                                + r.offset() + ", " + v + ", " + System.currentTimeMillis() + "]}");
                    }
                    if (!c.assignment().isEmpty()) c.commitSync(Duration.ofSeconds(10));
                } catch (org.apache.kafka.common.errors.WakeupException
                         | org.apache.kafka.common.errors.InterruptException e) {
                    throw e;
                } catch (RuntimeException e) {
                    error(e);
                }
            }
        }
    }
}
