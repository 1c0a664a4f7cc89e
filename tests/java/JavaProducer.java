// A Java producer (Apache Kafka's own client) for antidote's door tests:
// sends each value given on the command line, one at a time (each its own
// batch), to partition 0 with an idempotency-key header, and prints what
// became of each.
//
//   java -cp 'KAFKA_LIB/*:BUILD' JavaProducer plain|idempotent BOOTSTRAP TOPIC VALUE...
//   java -cp ... JavaProducer transactional BOOTSTRAP TOPIC TXN_ID VALUES|VALUES...
//      (transactional: each argument is one transaction, values split on '|')
//   -Dpace.ms=N: wait N ms after each value (plain and idempotent), so that
//   a test can change the topic while the producer writes.
//
// Output, one JSON object per line:
//   {"sent": "value", "offset": N}
//   {"sent": "value", "error": "ExceptionClass", "message": "..."}
//   {"txn": i, "result": "committed"|"aborted", "error": "..."}
import java.util.*;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaProducer {
    static String q(String s) {
        return s == null ? "null" : "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"")
                .replace("\n", "\\n") + "\"";
    }

    static int sent = 0;

    static String send(Producer<byte[], byte[]> p, String topic, String v) {
        try {
            // The door's test policy requires an idempotency-key header.
            RecordHeaders headers = new RecordHeaders();
            headers.add("idempotency-key", ("java-" + (++sent)).getBytes());
            RecordMetadata m = p.send(new ProducerRecord<>(topic, 0, null, null, v.getBytes(),
                    headers)).get();
            return "{\"sent\": " + q(v) + ", \"offset\": " + m.offset() + "}";
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            return "{\"sent\": " + q(v) + ", \"error\": " + q(c.getClass().getSimpleName())
                    + ", \"message\": " + q(c.getMessage()) + "}";
        } catch (InterruptedException e) {
            throw new RuntimeException(e);
        }
    }

    public static void main(String[] args) {
        String mode = args[0], bootstrap = args[1], topic = args[2];
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.LINGER_MS_CONFIG, "0");
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "30000");
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, mode.equals("plain") ? "false" : "true");
        if (mode.equals("plain")) props.put(ProducerConfig.RETRIES_CONFIG, "0");
        int first = 3;
        if (mode.equals("transactional")) {
            props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[3]);
            first = 4;
        }
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(props,
                new ByteArraySerializer(), new ByteArraySerializer())) {
            if (!mode.equals("transactional")) {
                long pace = Long.getLong("pace.ms", 0);
                for (int i = first; i < args.length; i++) {
                    System.out.println(send(p, topic, args[i]));
                    System.out.flush();
                    if (pace > 0) {
                        try {
                            Thread.sleep(pace);
                        } catch (InterruptedException e) {
                            throw new RuntimeException(e);
                        }
                    }
                }
                return;
            }
            p.initTransactions();
            for (int i = first; i < args.length; i++) {
                p.beginTransaction();
                boolean failed = false;
                for (String v : args[i].split("\\|")) {
                    String out = send(p, topic, v);
                    System.out.println(out);
                    failed |= out.contains("\"error\"");
                }
                String result;
                String error = null;
                if (failed) {
                    p.abortTransaction();
                    result = "aborted";
                } else {
                    try {
                        p.commitTransaction();
                        result = "committed";
                    } catch (KafkaException e) {
                        error = e.getClass().getSimpleName() + ": " + e.getMessage();
                        p.abortTransaction();
                        result = "aborted";
                    }
                }
                System.out.println("{\"txn\": " + (i - first) + ", \"result\": " + q(result)
                        + ", \"error\": " + q(error) + "}");
            }
        }
    }
}
