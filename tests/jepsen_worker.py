"""A client process of the network-fault runs (test_jepsen.py), started in a
client namespace. It writes its history as JSON lines to --out; the
checker (jepsen_check.py) reads them.

  produce: a librdkafka producer (idempotent, acks=all) writing records of
           the test's topics until the stop file exists, then flushing.
           One record in `--poison-every` is poison (at random, of a
           random kind). With
           --door, poison goes through a second, non-idempotent producer
           (the door refuses it: its INVALID_RECORD must not cost the valid
           stream a fatal error or an epoch bump each time).
           Lines: {"sent": id, "t": topic, "k": kind}   (once produce() took it)
                  {"ack": id, "t": topic, "k": kind, "p": partition, "o": offset}
                  {"nack": id, "t": topic, "k": kind, "e": error name}
                  (a record sent with neither had no answer: a timeout)
  consume: a librdkafka member of a group (classic or KIP-848 `consumer`)
           subscribed to the topics, committing after each record it
           delivers; a failed commit is noted and the loop goes on.
           Lines: {"d": [topic, partition, offset, id, millis]}
                  {"assigned"|"revoked"|"lost": n, "ms": millis}
                  {"error": text}

Record ids are "<tag>-<n>", in the value's device_id and the header jx-id;
the header jx-kind names the kind (valid or a poison kind of
poison_support.json_value).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import confluent_kafka as ck  # noqa: E402

import poison_support as ps  # noqa: E402

POISON_KINDS = ["lat", "nan", "enum", "noheader", "schema"]


def record(tag: str, n: int, kind: str, key: str) -> tuple[bytes, bytes, list]:
    rid = f"{tag}-{n}"
    d = ps.trigger(n)
    d["device_id"] = rid
    if kind == "lat":
        d["lat"] = 91.5
    elif kind == "nan":
        d["lat"] = float("nan")
    elif kind == "enum":
        d["transition"] = "TELEPORT"
    elif kind == "schema":
        d["extra"] = 1
    value = json.dumps(d).encode()
    headers = [("jx-id", rid.encode()), ("jx-kind", kind.encode())]
    if kind != "noheader":
        headers.insert(0, ("idempotency-key", rid.encode()))
    return key.encode(), value, headers


def record_id(value: bytes | None) -> str:
    try:
        return str(json.loads(value)["device_id"])
    except Exception:  # noqa: BLE001 - a record the test did not write
        return "?"


class Out:
    def __init__(self, path: str):
        self.f = open(path, "a", buffering=1)

    def __call__(self, **obj) -> None:
        self.f.write(json.dumps(obj) + "\n")


def produce(a) -> None:
    out = Out(a.out)
    rng = random.Random(a.seed)
    topics = a.topics.split(",")
    conf = {"bootstrap.servers": a.bootstrap, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": 60000, "socket.timeout.ms": 10000,
            "reconnect.backoff.max.ms": 1000, "log_level": 3}
    main = ck.Producer({**conf, "enable.idempotence": True})
    poison_p = ck.Producer({**conf, "enable.idempotence": False}) if a.door else main

    def report(rid, topic, kind):
        def cb(err, msg):
            if err is None:
                out(ack=rid, t=topic, k=kind, p=msg.partition(), o=msg.offset())
            else:
                out(nack=rid, t=topic, k=kind, e=err.name())
        return cb

    n = 0
    stop = Path(a.stop)
    while not stop.exists():
        n += 1
        topic = topics[n % len(topics)]
        kind = "valid"
        if a.poison_every and rng.randrange(a.poison_every) == 0:
            kind = rng.choice(POISON_KINDS)
        key, value, headers = record(a.tag, n, kind, f"k{rng.randrange(a.keys)}")
        p = main if kind == "valid" else poison_p
        try:
            p.produce(topic, value=value, key=key, headers=headers,
                      on_delivery=report(f"{a.tag}-{n}", topic, kind))
            out(sent=f"{a.tag}-{n}", t=topic, k=kind)
        except BufferError:
            p.poll(1)
        main.poll(0)
        if poison_p is not main:
            poison_p.poll(0)
        time.sleep(1 / a.rate)
    for p in {id(main): main, id(poison_p): poison_p}.values():
        left = p.flush(a.flush_timeout)
        out(flushed=left)


def consume(a) -> None:
    out = Out(a.out)
    conf = {"bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.member,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "group.protocol": a.protocol, "socket.timeout.ms": 10000,
            "reconnect.backoff.max.ms": 1000, "topic.metadata.refresh.interval.ms": 5000,
            "log_level": 3}
    if a.protocol == "classic":
        # A member cut off by a fault loses its partitions after 10 s, not
        # 45 s (KIP-848 groups take theirs from the broker's settings).
        conf.update({"session.timeout.ms": 10000, "heartbeat.interval.ms": 1000})
    c = ck.Consumer(conf)

    def changed(what):
        # The library assigns by itself after the callback (confluent-kafka
        # does when the callback did not).
        return lambda _c, parts: out(**{what: len(parts), "ms": int(time.time() * 1000)})

    c.subscribe(a.topics.split(","), on_assign=changed("assigned"),
                on_revoke=changed("revoked"), on_lost=changed("lost"))
    stop = Path(a.stop)
    try:
        while not stop.exists():
            m = c.poll(0.3)
            if m is None:
                continue
            if m.error():
                if m.error().code() != ck.KafkaError._PARTITION_EOF:
                    out(error=str(m.error()))
                continue
            out(d=[m.topic(), m.partition(), m.offset(), record_id(m.value()),
                   int(time.time() * 1000)])
            try:
                c.commit(message=m, asynchronous=False)
            except ck.KafkaException as e:
                out(error=f"commit: {e}")
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["produce", "consume"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topics", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--tag", default="x")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--poison-every", type=int, default=10)
    ap.add_argument("--door", action="store_true")
    ap.add_argument("--flush-timeout", type=float, default=90.0)
    ap.add_argument("--group", default="")
    ap.add_argument("--member", default="")
    ap.add_argument("--protocol", default="classic")
    a = ap.parse_args()
    (produce if a.mode == "produce" else consume)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
