// A share consumer (KIP-932, Apache Kafka's KafkaShareConsumer) for antidote's
// integration tests: subscribes to a topic in a share group and polls until it
// has N records, an exception, or TIMEOUT_MS; records are acknowledged
// (implicitly, by the next poll) and committed at the end.
//
//   java -cp 'KAFKA_LIB/*:BUILD' JavaShare BOOTSTRAP TOPIC GROUP N TIMEOUT_MS [STOP_FILE]
//
// With STOP_FILE it also stops once that file exists (a consumer sharing a
// group gets an unknown part of the records).
//
// Output, one JSON object per line:
//   {"record": [partition, offset, "key b64", "value b64"]}
//   {"error": "ExceptionClass", "message": "...", "cause": "...", "after_ms": ms}   (the first exception)
//   {"done": records, "after_ms": ms}
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class JavaShare {
    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], group = args[2];
        int n = Integer.parseInt(args[3]);
        long timeoutMs = Long.parseLong(args[4]);
        java.io.File stop = args.length > 5 ? new java.io.File(args[5]) : null;
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "antidote-java-share");
        long t0 = System.currentTimeMillis();
        int got = 0;
        try (KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(props,
                new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            c.subscribe(List.of(topic));
            try {
                while (got < n && System.currentTimeMillis() - t0 < timeoutMs
                        && (stop == null || !stop.exists())) {
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                        got++;
                        System.out.println("{\"record\": [" + r.partition() + ", " + r.offset() + ", "
                                + JavaConsumer.b64(r.key()) + ", " + JavaConsumer.b64(r.value()) + "]}");
                        System.out.flush();
                    }
                }
                c.commitSync(Duration.ofSeconds(30));
            } catch (RuntimeException e) {
                Throwable cause = e.getCause();
                System.out.println("{\"error\": " + JavaAdmin.q(e.getClass().getSimpleName())
                        + ", \"message\": " + JavaAdmin.q(e.getMessage())
                        + ", \"cause\": " + JavaAdmin.q(cause == null ? null : cause.getClass().getSimpleName())
                        + ", \"after_ms\": " + (System.currentTimeMillis() - t0) + "}");
            }
            System.out.println("{\"done\": " + got + ", \"after_ms\": " + (System.currentTimeMillis() - t0) + "}");
            System.out.flush();
            c.close(Duration.ofSeconds(5));
        }
    }
}
