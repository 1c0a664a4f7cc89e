// A Kafka Connect sink connector for antidote's framework tests: appends one
// JSON line per record it is given ({"partition": P, "offset": O, "value":
// "base64"}) to the file named by its `file` setting, and flushes (fsync)
// when Connect commits offsets, so that what the file holds is at least
// what the committed offsets cover.
//
// The suite's own because Maven Central serves no connect-file 4.4.0 (the
// FileStreamSinkConnector's artifact); it runs in Kafka's own Connect
// runtime (ConnectStandalone), found through its ServiceLoader manifest.
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.*;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.connect.connector.Task;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.sink.SinkConnector;
import org.apache.kafka.connect.sink.SinkRecord;
import org.apache.kafka.connect.sink.SinkTask;

public class LinesSink extends SinkConnector {
    static final ConfigDef CONFIG = new ConfigDef()
        .define("file", ConfigDef.Type.STRING, ConfigDef.Importance.HIGH, "where the lines go");
    private Map<String, String> props;

    @Override public String version() { return "1"; }
    @Override public void start(Map<String, String> props) { this.props = props; }
    @Override public Class<? extends Task> taskClass() { return LinesTask.class; }
    @Override public List<Map<String, String>> taskConfigs(int max) { return List.of(props); }
    @Override public void stop() { }
    @Override public ConfigDef config() { return CONFIG; }

    public static class LinesTask extends SinkTask {
        private FileOutputStream out;

        @Override public String version() { return "1"; }

        @Override public void start(Map<String, String> props) {
            try {
                out = new FileOutputStream(props.get("file"), true);
            } catch (IOException e) {
                throw new ConnectException(e);
            }
        }

        @Override public void put(Collection<SinkRecord> records) {
            StringBuilder b = new StringBuilder();
            for (SinkRecord r : records) {
                byte[] v = (byte[]) r.value();
                b.append("{\"partition\": ").append(r.kafkaPartition())
                 .append(", \"offset\": ").append(r.kafkaOffset())
                 .append(", \"value\": ")
                 .append(v == null ? "null" : "\"" + Base64.getEncoder().encodeToString(v) + "\"")
                 .append("}\n");
            }
            try {
                out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            } catch (IOException e) {
                throw new ConnectException(e);
            }
        }

        @Override public void flush(Map<TopicPartition, OffsetAndMetadata> offsets) {
            try {
                out.getFD().sync();
            } catch (IOException e) {
                throw new ConnectException(e);
            }
        }

        @Override public void stop() {
            try {
                if (out != null) out.close();
            } catch (IOException e) {
                throw new ConnectException(e);
            }
        }
    }
}
