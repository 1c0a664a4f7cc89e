// Starts Kroxylicious (kroxylicious-runtime from Maven Central, which has no
// launcher of its own there) from a YAML config, for scripts/bench-e2e.sh's
// pass-through peer on Apache Kafka. Prints {"started": true} once listening.
//
//   java -cp '.tools/kroxylicious-V/lib/*' KroxyliciousPeer.java CONFIG.yaml
import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.internal.config.Features;
import java.nio.file.Files;
import java.nio.file.Path;

public class KroxyliciousPeer {
    public static void main(String[] args) throws Exception {
        ConfigParser parser = new ConfigParser();
        var config = parser.parseConfiguration(Files.readString(Path.of(args[0])));
        try (KafkaProxy proxy = new KafkaProxy(parser, config, Features.defaultFeatures())) {
            proxy.startup();
            System.out.println("{\"started\": true}");
            System.out.flush();
            proxy.block();
        }
    }
}
