"""The client side of scripts/demo.sh: an unmodified confluent-kafka
producer writes to the broker, an unmodified consumer reads through antidote
(only bootstrap.servers differs), and the dead-letter topic is read back."""
import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

broker, proxy = sys.argv[1], sys.argv[2]
topic = "geofence.triggers"
admin = AdminClient({"bootstrap.servers": broker})
admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)

now = int(time.time() * 1000)
def trigger(i, lat=52.37, transition="ENTER"):
    return json.dumps({"device_id": f"dev-{i}", "geofence_id": "amsterdam-centraal", "lat": lat,
                       "lon": 4.90, "transition": transition, "speed_mps": 1.4,
                       "event_time_ms": now, "accuracy_m": 8.0}).encode()

records = [trigger(0), trigger(1, lat=91.5), trigger(2), b'{"lat": NaN}', trigger(4, transition="TELEPORT"), trigger(5)]
p = Producer({"bootstrap.servers": broker})
for i, v in enumerate(records):
    p.produce(topic, key=f"dev-{i}".encode(), value=v, headers=[("idempotency-key", f"k{i}".encode())])
p.flush(10)
print(f"== produced {len(records)} records to {topic} (3 of them poison)")

c = Consumer({"bootstrap.servers": proxy, "group.id": "demo", "enable.auto.commit": False})
c.assign([TopicPartition(topic, 0, 0)])
got, deadline = [], time.time() + 10
while time.time() < deadline and len(got) < 3:
    m = c.poll(0.5)
    if m is not None and not m.error():
        got.append(m)
print(f"== the consumer (through antidote) received {len(got)} records:")
for m in got:
    print(f"   offset {m.offset()}: {m.value().decode()[:70]}...")
c.close()

d = Consumer({"bootstrap.servers": broker, "group.id": "demo-dlt"})
d.assign([TopicPartition(topic + ".dlt", 0, 0)])
dlt, deadline = [], time.time() + 10
while time.time() < deadline and len(dlt) < 3:
    m = d.poll(0.5)
    if m is not None and not m.error():
        dlt.append(m)
print(f"== the dead-letter topic {topic}.dlt holds {len(dlt)} records:")
for m in dlt:
    h = {k: v.decode() for k, v in m.headers()}
    print(f"   original offset {h['x-original-offset']}: [{h['x-error-class']}/{h['x-error-rule']}] {h['x-error']}")
d.close()
