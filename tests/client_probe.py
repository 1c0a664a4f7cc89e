"""Child process for test_connections.py: exercise one client through
`bootstrap` (produce, assign-consume, group-consume with commit), print DONE,
then stay alive until stdin closes so the parent can list its sockets.

usage: client_probe.py {librdkafka|kafka-python} BOOTSTRAP TOPIC"""

import sys
import uuid

import clients as c

kind, bootstrap, topic = sys.argv[1:4]
ep = c.Endpoint(bootstrap)
recs = c.sample_records(5, tag=kind)
group = f"probe-{uuid.uuid4().hex[:8]}"
if kind == "librdkafka":
    c.ck_produce(ep, topic, recs)
    assert c.ck_consume_assign(ep, topic, [0], 5) == recs
    assert c.ck_consume_group(ep, topic, group, 5, timeout=120) == recs
else:
    c.kp_produce(ep, topic, recs)
    assert c.kp_consume_assign(ep, topic, [0], 5) == recs
    assert c.kp_consume_group(ep, topic, group, 5, timeout=120) == recs
print("DONE", flush=True)
sys.stdin.read()  # parent closes stdin when it has looked
