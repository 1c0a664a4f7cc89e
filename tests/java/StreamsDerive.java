// A Kafka Streams application for antidote's framework tests: reads INPUT,
// writes "derived:" + value to OUTPUT for each record, with
// processing.guarantee=exactly_once_v2 (a transactional producer, offsets
// committed in the transaction with TxnOffsetCommit, read_committed input).
// Every connection goes to BOOTSTRAP (the proxy in the tests).
//
//   java -cp 'KAFKA_LIB/*:BUILD' StreamsDerive BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR GROUP_PROTOCOL
//
// GROUP_PROTOCOL: classic, or streams (KIP-1071: StreamsGroupHeartbeat).
// Runs until stdin closes, then closes the application (committing its
// last transaction) and prints {"closed": true, "state": "..."}; prints
// {"state": "..."} at each state change and {"uncaught": "..."} on an
// exception, after which the application shuts down.
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;

public class StreamsDerive {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], appId = args[1], input = args[2], output = args[3];
        String stateDir = args[4], protocol = args[5];
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArray().getClass());
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArray().getClass());
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        if (protocol.equals("streams")) {
            p.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
        }
        StreamsBuilder b = new StreamsBuilder();
        b.<byte[], byte[]>stream(input)
            .mapValues(v -> v == null ? null
                : ("derived:" + new String(v, StandardCharsets.UTF_8)).getBytes(StandardCharsets.UTF_8))
            .to(output);
        KafkaStreams streams = new KafkaStreams(b.build(), p);
        streams.setStateListener((now, before) -> say("{\"state\": \"" + now + "\"}"));
        streams.setUncaughtExceptionHandler(e -> {
            say("{\"uncaught\": " + quote(e.toString()) + "}");
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        while (System.in.read() != -1) { }
        streams.close(Duration.ofSeconds(60));
        say("{\"closed\": true, \"state\": \"" + streams.state() + "\"}");
    }

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }
}
