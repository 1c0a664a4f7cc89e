import java.net.URL;
import java.net.URLClassLoader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.stream.Collectors;

import com.google.protobuf.DescriptorProtos.DescriptorProto;
import com.google.protobuf.DescriptorProtos.FieldDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * Produces records with Apicurio Registry's own 3.x Kafka serializers
 * (io.apicurio.registry.serde.avro.AvroKafkaSerializer,
 * .protobuf.ProtobufKafkaSerializer and .jsonschema.JsonSchemaKafkaSerializer),
 * which register their schemas themselves, for tests/test_apicurio_serdes.py.
 * Every mode runs in one JVM (its start is the slow part).
 * Args: bootstrap registryV3Url count mode=topic..., where mode is
 * - `default`: nothing set but the URL: 3.x's default framing
 *   (Default4ByteIdHandler: magic byte 0, the 4-byte content id);
 * - `headers-content`: the content id in the apicurio.value.contentId header;
 * - `headers-global`: use-id=globalId, the apicurio.value.globalId header;
 * - `8byte`: Legacy8ByteIdHandler with use-id=globalId (magic byte 0, the
 *   8-byte global id: 2.x's default);
 * - `proto-headers`: Protobuf (a DynamicMessage of geo.Trigger), the content
 *   id in the header;
 * - `proto-default`: Protobuf, nothing set: the default framing, then the
 *   Ref (the type's name) where Confluent's indexes would be;
 * - `proto-indexes`: Protobuf, send-indexes=true and send-type-ref=false:
 *   the default framing with Confluent's message indexes instead of the Ref;
 * - `json-headers`: JSON Schema (the schema from a class-path resource,
 *   `apicurio.registry.artifact.schema.location`), the content id in the header;
 * - `keys-headers`: Avro keys (geo.DeviceKey, artifact {topic}-key) and
 *   values, both with the content id in headers (apicurio.key.contentId,
 *   apicurio.value.contentId);
 * - `keys-8byte`: Avro keys and values, both Legacy8ByteIdHandler with
 *   use-id=globalId.
 * Other modes' keys are strings "k" + i. Record i has n = i and lat = 95
 * when i % 4 == 3 (breaks the policy's coordinates rule), else 10. A send
 * that fails (a proxy's door refusing it) is reported, not fatal. Prints
 * one JSON line: {"sent": written, "refused": {topic: ["i Exception: msg", ...]}}.
 */
public class ApicurioProducer {
    static final Schema AVRO = new Schema.Parser().parse(
        "{\"type\":\"record\",\"name\":\"Trigger\",\"namespace\":\"geo\",\"fields\":["
        + "{\"name\":\"n\",\"type\":\"int\"},{\"name\":\"lat\",\"type\":\"double\"},"
        + "{\"name\":\"lon\",\"type\":\"double\"}]}");

    static final Schema AVRO_KEY = new Schema.Parser().parse(
        "{\"type\":\"record\",\"name\":\"DeviceKey\",\"namespace\":\"geo\",\"fields\":["
        + "{\"name\":\"device_id\",\"type\":\"string\"}]}");

    static final String JSON_SCHEMA = "{\"$schema\":\"http://json-schema.org/draft-07/schema#\","
        + "\"title\":\"Trigger\",\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"},"
        + "\"lat\":{\"type\":\"number\"},\"lon\":{\"type\":\"number\"}},"
        + "\"required\":[\"n\",\"lat\",\"lon\"]}";

    public static void main(String[] a) throws Exception {
        String bootstrap = a[0], url = a[1];
        // The JSON Schema serializer reads its schema from the class path.
        Path dir = Files.createTempDirectory("apicurio-schemas");
        Path schema = Files.writeString(dir.resolve("trigger.schema.json"), JSON_SCHEMA);
        dir.toFile().deleteOnExit();  // deleted in reverse order: the file first
        schema.toFile().deleteOnExit();
        Thread.currentThread().setContextClassLoader(new URLClassLoader(
            new URL[] {dir.toUri().toURL()}, Thread.currentThread().getContextClassLoader()));
        int count = Integer.parseInt(a[2]), total = 0;
        StringBuilder refused = new StringBuilder();
        for (int k = 3; k < a.length; k++) {
            String[] mt = a[k].split("=", 2);
            List<String> failed = produce(config(bootstrap, url, mt[0]), mt[0], mt[1], count);
            total += count - failed.size();
            if (!failed.isEmpty()) {
                refused.append(refused.length() == 0 ? "" : ", ").append(quote(mt[1]))
                    .append(": [").append(failed.stream().map(ApicurioProducer::quote)
                        .collect(Collectors.joining(", "))).append("]");
            }
        }
        System.out.println("{\"sent\": " + total + ", \"refused\": {" + refused + "}}");
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') {
                b.append('\\').append(ch);
            } else if (ch < 0x20) {
                b.append(String.format("\\u%04x", (int) ch));
            } else {
                b.append(ch);
            }
        }
        return b.append('"').toString();
    }

    /** The producer's configuration for one mode. */
    static Properties config(String bootstrap, String url, String mode) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("key.serializer", mode.startsWith("keys")
            ? "io.apicurio.registry.serde.avro.AvroKafkaSerializer"
            : "org.apache.kafka.common.serialization.StringSerializer");
        p.put("value.serializer", mode.startsWith("proto")
            ? "io.apicurio.registry.serde.protobuf.ProtobufKafkaSerializer"
            : mode.startsWith("json")
            ? "io.apicurio.registry.serde.jsonschema.JsonSchemaKafkaSerializer"
            : "io.apicurio.registry.serde.avro.AvroKafkaSerializer");
        p.put("apicurio.registry.url", url);
        p.put("apicurio.registry.auto-register", "true");
        switch (mode) {
            case "default":
            case "proto-default":
                break;
            case "proto-indexes":
                p.put("apicurio.registry.serde.send-indexes", "true");
                p.put("apicurio.registry.serde.send-type-ref", "false");
                break;
            case "json-headers":
                p.put("apicurio.registry.artifact.schema.location", "trigger.schema.json");
                // fall through: the content id in the header
            case "headers-content":
            case "proto-headers":
            case "keys-headers":
                p.put("apicurio.registry.headers.enabled", "true");
                p.put("apicurio.registry.use-id", "contentId");
                break;
            case "headers-global":
                p.put("apicurio.registry.headers.enabled", "true");
                p.put("apicurio.registry.use-id", "globalId");
                break;
            case "8byte":
            case "keys-8byte":
                p.put("apicurio.registry.headers.enabled", "false");
                p.put("apicurio.registry.id-handler",
                      "io.apicurio.registry.serde.Legacy8ByteIdHandler");
                p.put("apicurio.registry.use-id", "globalId");
                break;
            default:
                throw new IllegalArgumentException("unknown mode " + mode);
        }
        return p;
    }

    /** Sends `count` records one at a time; returns those refused, as
     *  "i ExceptionClass: message". */
    static List<String> produce(Properties p, String mode, String topic, int count)
            throws Exception {
        Descriptor proto = mode.startsWith("proto") ? protoTrigger() : null;
        List<String> failed = new ArrayList<>();
        try (KafkaProducer<Object, Object> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < count; i++) {
                double lat = i % 4 == 3 ? 95.0 : 10.0;
                Object v = proto != null ? proto(proto, i, lat)
                    : mode.startsWith("json") ? json(i, lat) : avro(i, lat);
                Object key = mode.startsWith("keys") ? avroKey(i) : "k" + i;
                try {
                    producer.send(new ProducerRecord<>(topic, key, v)).get();
                } catch (ExecutionException e) {
                    failed.add(i + " " + e.getCause().getClass().getSimpleName() + ": "
                        + e.getCause().getMessage());
                }
            }
        }
        return failed;
    }

    static GenericRecord avroKey(int n) {
        GenericRecord r = new GenericData.Record(AVRO_KEY);
        r.put("device_id", "d-" + n);
        return r;
    }

    static GenericRecord avro(int n, double lat) {
        GenericRecord r = new GenericData.Record(AVRO);
        r.put("n", n);
        r.put("lat", lat);
        r.put("lon", 20.0);
        return r;
    }

    static Map<String, Object> json(int n, double lat) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("n", n);
        m.put("lat", lat);
        m.put("lon", 20.0);
        return m;
    }

    static DynamicMessage proto(Descriptor d, int n, double lat) {
        return DynamicMessage.newBuilder(d)
            .setField(d.findFieldByName("n"), n)
            .setField(d.findFieldByName("lat"), lat)
            .setField(d.findFieldByName("lon"), 20.0)
            .build();
    }

    /** geo.Trigger { int32 n = 1; double lat = 2; double lon = 3; }, built
     *  without protoc. */
    static Descriptor protoTrigger() throws Exception {
        DescriptorProto msg = DescriptorProto.newBuilder().setName("Trigger")
            .addField(field("n", 1, FieldDescriptorProto.Type.TYPE_INT32))
            .addField(field("lat", 2, FieldDescriptorProto.Type.TYPE_DOUBLE))
            .addField(field("lon", 3, FieldDescriptorProto.Type.TYPE_DOUBLE))
            .build();
        FileDescriptorProto file = FileDescriptorProto.newBuilder()
            .setName("geo/trigger.proto")
            .setPackage("geo").setSyntax("proto3").addMessageType(msg).build();
        return FileDescriptor.buildFrom(file, new FileDescriptor[0])
            .findMessageTypeByName("Trigger");
    }

    static FieldDescriptorProto field(String name, int number, FieldDescriptorProto.Type type) {
        return FieldDescriptorProto.newBuilder().setName(name).setNumber(number).setType(type)
            .setLabel(FieldDescriptorProto.Label.LABEL_OPTIONAL).build();
    }
}
