import java.util.Properties;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * Produces Avro records with Apicurio Registry's own Kafka serializer
 * (io.apicurio.registry.serde.avro.AvroKafkaSerializer, 2.x), registering
 * the schema itself. Args: bootstrap topic registryUrl mode count, where mode
 * is `headers` (the global id in the apicurio.value.globalId header, the
 * value the bare datum) or `8byte` (magic byte 0, then the 8-byte global
 * id). Record i has n = i and lat = 95 when i % 4 == 3 (breaks the policy's
 * coordinates rule), else 10. Prints one JSON line: {"sent": count}.
 */
public class ApicurioProducer {
    public static void main(String[] a) throws Exception {
        String bootstrap = a[0], topic = a[1], url = a[2], mode = a[3];
        int count = Integer.parseInt(a[4]);
        Schema schema = new Schema.Parser().parse(
            "{\"type\":\"record\",\"name\":\"Trigger\",\"namespace\":\"geo\",\"fields\":["
            + "{\"name\":\"n\",\"type\":\"int\"},{\"name\":\"lat\",\"type\":\"double\"},"
            + "{\"name\":\"lon\",\"type\":\"double\"}]}");
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
        p.put("value.serializer", "io.apicurio.registry.serde.avro.AvroKafkaSerializer");
        p.put("apicurio.registry.url", url);
        p.put("apicurio.registry.auto-register", "true");
        p.put("apicurio.registry.headers.enabled", String.valueOf(mode.equals("headers")));
        p.put("acks", "all");
        try (KafkaProducer<String, Object> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < count; i++) {
                GenericRecord r = new GenericData.Record(schema);
                r.put("n", i);
                r.put("lat", i % 4 == 3 ? 95.0 : 10.0);
                r.put("lon", 20.0);
                producer.send(new ProducerRecord<>(topic, "k" + i, r)).get();
            }
        }
        System.out.println("{\"sent\": " + count + "}");
    }
}
