// Apache Kafka's own Admin client for antidote's integration tests: runs a
// list of commands against whatever bootstrap it is given and prints one
// JSON object per command. A command that fails prints its error and the
// next one runs.
//
//   java -cp 'KAFKA_LIB/*:BUILD' JavaAdmin BOOTSTRAP COMMAND...
//
// Commands (fields separated by ':'):
//   cluster                      {"cluster": id, "controller": node, "nodes": [node...]}
//   create:TOPIC:PARTITIONS      {"created": topic}
//   describe:TOPIC               {"topic": t, "id": uuid, "partitions": [[p, leader node, [replica ids]]...]}
//   offsets:TOPIC:PARTITIONS:TS  {"offsets": {"earliest": {"P": o}, "latest": ..., "ts": ..., "max_ts": ...}}
//                                (ts: the first offset at or after timestamp TS; max_ts: the offset of the
//                                 record with the highest timestamp; -1 when there is none)
//   topics                       {"topics": [names, sorted]}
//   delete:TOPIC                 {"deleted": topic}
//   group:GROUP                  {"group": g, "type": "CLASSIC|CONSUMER|...", "state": s,
//                                 "members": [[client id, [partitions]]...]}
//   feature:NAME:LEVEL           {"feature": name, "level": level}   (upgrade or downgrade a feature)
//   features                     {"finalized": {"name": level}}
//   sharegroup:GROUP             {"share_group": g, "state": s, "members": count}
//   groupconfig:GROUP:NAME:VALUE {"group_config": group}   (set one dynamic group config)
// A node is [id, "host", port]. A failure: {"command": c, "error": "ExceptionClass", "message": m}.
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

public class JavaAdmin {
    static String q(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') b.append('\\').append(c);
            else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
            else b.append(c);
        }
        return b.append('"').toString();
    }

    static String node(Node n) {
        return n == null ? "null" : "[" + n.id() + ", " + q(n.host()) + ", " + n.port() + "]";
    }

    static String offsets(Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> m) {
        StringJoiner j = new StringJoiner(", ", "{", "}");
        new TreeMap<Integer, Long>() {{
            m.forEach((tp, info) -> put(tp.partition(), info.offset()));
        }}.forEach((p, o) -> j.add("\"" + p + "\": " + o));
        return j.toString();
    }

    static String run(Admin a, String command) throws Exception {
        String[] f = command.split(":");
        switch (f[0]) {
            case "cluster": {
                DescribeClusterResult r = a.describeCluster();
                String nodes = r.nodes().get().stream().sorted(Comparator.comparingInt(Node::id))
                        .map(JavaAdmin::node).collect(Collectors.joining(", ", "[", "]"));
                return "{\"cluster\": " + q(r.clusterId().get()) + ", \"controller\": "
                        + node(r.controller().get()) + ", \"nodes\": " + nodes + "}";
            }
            case "create": {
                a.createTopics(List.of(new NewTopic(f[1], Integer.parseInt(f[2]), (short) 1)))
                        .all().get();
                return "{\"created\": " + q(f[1]) + "}";
            }
            case "describe": {
                TopicDescription d = a.describeTopics(List.of(f[1])).allTopicNames().get().get(f[1]);
                StringJoiner ps = new StringJoiner(", ", "[", "]");
                for (TopicPartitionInfo p : d.partitions()) {
                    ps.add("[" + p.partition() + ", " + node(p.leader()) + ", " + p.replicas().stream()
                            .map(n -> String.valueOf(n.id())).collect(Collectors.joining(", ", "[", "]")) + "]");
                }
                return "{\"topic\": " + q(d.name()) + ", \"id\": " + q(d.topicId().toString())
                        + ", \"partitions\": " + ps + "}";
            }
            case "offsets": {
                String topic = f[1];
                int partitions = Integer.parseInt(f[2]);
                long ts = Long.parseLong(f[3]);
                Map<String, OffsetSpec> specs = new LinkedHashMap<>();
                specs.put("earliest", OffsetSpec.earliest());
                specs.put("latest", OffsetSpec.latest());
                specs.put("ts", OffsetSpec.forTimestamp(ts));
                specs.put("max_ts", OffsetSpec.maxTimestamp());
                StringJoiner out = new StringJoiner(", ", "{", "}");
                for (Map.Entry<String, OffsetSpec> e : specs.entrySet()) {
                    Map<TopicPartition, OffsetSpec> req = new HashMap<>();
                    for (int p = 0; p < partitions; p++) req.put(new TopicPartition(topic, p), e.getValue());
                    out.add(q(e.getKey()) + ": " + offsets(a.listOffsets(req).all().get()));
                }
                return "{\"offsets\": " + out + "}";
            }
            case "topics": {
                return "{\"topics\": " + new TreeSet<>(a.listTopics().names().get()).stream()
                        .map(JavaAdmin::q).collect(Collectors.joining(", ", "[", "]")) + "}";
            }
            case "delete": {
                a.deleteTopics(List.of(f[1])).all().get();
                return "{\"deleted\": " + q(f[1]) + "}";
            }
            case "group": {
                ConsumerGroupDescription g = a.describeConsumerGroups(List.of(f[1]))
                        .describedGroups().get(f[1]).get();
                StringJoiner ms = new StringJoiner(", ", "[", "]");
                for (MemberDescription m : g.members()) {
                    ms.add("[" + q(m.clientId()) + ", " + m.assignment().topicPartitions().stream()
                            .map(TopicPartition::partition).sorted().map(String::valueOf)
                            .collect(Collectors.joining(", ", "[", "]")) + "]");
                }
                return "{\"group\": " + q(g.groupId()) + ", \"type\": " + q(g.type().name())
                        + ", \"state\": " + q(g.groupState().name()) + ", \"members\": " + ms + "}";
            }
            case "feature": {
                short level = Short.parseShort(f[2]);
                FinalizedVersionRange cur = a.describeFeatures().featureMetadata().get()
                        .finalizedFeatures().get(f[1]);
                short now = cur == null ? 0 : cur.maxVersionLevel();
                FeatureUpdate.UpgradeType t = level >= now ? FeatureUpdate.UpgradeType.UPGRADE
                        : FeatureUpdate.UpgradeType.SAFE_DOWNGRADE;
                a.updateFeatures(Map.of(f[1], new FeatureUpdate(level, t)), new UpdateFeaturesOptions())
                        .all().get();
                return "{\"feature\": " + q(f[1]) + ", \"level\": " + level + "}";
            }
            case "features": {
                StringJoiner j = new StringJoiner(", ", "{", "}");
                new TreeMap<>(a.describeFeatures().featureMetadata().get().finalizedFeatures())
                        .forEach((k, v) -> j.add(q(k) + ": " + v.maxVersionLevel()));
                return "{\"finalized\": " + j + "}";
            }
            case "sharegroup": {
                ShareGroupDescription g = a.describeShareGroups(List.of(f[1])).describedGroups()
                        .get(f[1]).get();
                return "{\"share_group\": " + q(g.groupId()) + ", \"state\": " + q(g.groupState().name())
                        + ", \"members\": " + g.members().size() + "}";
            }
            case "groupconfig": {
                ConfigResource r = new ConfigResource(ConfigResource.Type.GROUP, f[1]);
                a.incrementalAlterConfigs(Map.of(r, List.of(new AlterConfigOp(
                        new ConfigEntry(f[2], f[3]), AlterConfigOp.OpType.SET)))).all().get();
                return "{\"group_config\": " + q(f[1]) + "}";
            }
            default:
                throw new IllegalArgumentException("unknown command " + command);
        }
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "antidote-java-admin");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        try (Admin a = Admin.create(props)) {
            for (int i = 1; i < args.length; i++) {
                String line;
                try {
                    line = run(a, args[i]);
                } catch (ExecutionException e) {
                    Throwable c = e.getCause();
                    line = "{\"command\": " + q(args[i]) + ", \"error\": " + q(c.getClass().getSimpleName())
                            + ", \"message\": " + q(c.getMessage()) + "}";
                }
                System.out.println(line);
                System.out.flush();
            }
            a.close(java.time.Duration.ofSeconds(10));
        }
    }
}
