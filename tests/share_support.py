"""Helpers of tests/test_share_groups.py: exact metric deltas, the groups'
KIP-1191 DLQs, and Kafka's own VerifiableShareConsumer.

- `Counters`: a proxy's /metrics read when a test starts; `delta` is what a
  counter gained since, so a test's checks do not depend on what earlier
  tests of the module did through the same proxy.
- `make_dlq`: a topic a share group may use as its broker DLQ (KIP-1191):
  the broker's `dlq.` prefix and `errors.deadletterqueue.group.enable=true`
  on the topic; the group names it in `errors.deadletterqueue.topic.name`.
- `VerifiableShare`: `org.apache.kafka.tools.VerifiableShareConsumer`
  (kafka-tools 4.4) in the background, its JSON events collected.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import harness as h


class Counters:
    """A proxy's metrics page when the test started; `delta(name, **labels)`
    is the growth of that counter (summed over the samples whose labels
    include `labels`) since then."""

    def __init__(self, proxy):
        self.proxy = proxy
        self.before = proxy.metrics()
        self.now = self.before

    def read(self) -> "Counters":
        self.now = self.proxy.metrics()
        return self

    def delta(self, name: str, **labels: str) -> float:
        return h.metric(self.now, name, **labels) - h.metric(self.before, name, **labels)

    def share(self) -> dict[str, float]:
        """The share path's counters (acks by result, withheld records by
        reason) gained since the start, only those that moved."""
        out = {}
        for result in ("sent", "refused", "overflow"):
            out[f"acks.{result}"] = self.delta("antidote_share_acks_total", result=result)
        for reason in ("dlt", "transient", "breaker", "held", "unknown_topic", "not_loaded",
                       "bad_ranges"):
            out[f"withheld.{reason}"] = self.delta("antidote_share_withheld_records_total",
                                                   reason=reason)
        return {k: v for k, v in out.items() if v}

    def topic(self, topic: str) -> dict[str, float]:
        """Per-topic record counts gained since the start: judged, passed,
        diverted."""
        return {
            "validated": self.delta("antidote_records_validated_total", topic=topic),
            "passed": self.delta("antidote_records_passed_total", topic=topic),
            "diverted": self.delta("antidote_records_invalid_total", topic=topic,
                                   action="diverted"),
        }


def make_dlq(bootstrap: str) -> str:
    """A new topic a share group may name as its KIP-1191 DLQ."""
    from confluent_kafka.admin import AdminClient, NewTopic
    name = f"dlq.share-{uuid.uuid4().hex[:10]}"  # the broker's required DLQ prefix
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(
        name, 1, 1, config={"errors.deadletterqueue.group.enable": "true"})])[name].result(30)
    return name


def wait_dlq(read, want: int, timeout: float = 30, quiet: float = 3.0) -> list:
    """The broker writes its DLQ in the background: `read()` until it holds
    `want` records (then `quiet` s more for anything extra), or `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if len(got) >= want or time.monotonic() > deadline:
            break
        time.sleep(1)
    time.sleep(quiet)
    return read()


class VerifiableShare(h.Lines):
    """Kafka's VerifiableShareConsumer (kafka-tools) in the background; its
    stdout events (one JSON object a line) collected by a thread."""

    def __init__(self, classes: Path, bootstrap: str, topic: str, group: str, log: Path,
                 *args: str):
        cp = f"{h.kafka_classpath()}:{classes}"
        cmd = ["java", "-Xmx192m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
               "-Dlog4j2.level=WARN", "-cp", cp, "org.apache.kafka.tools.VerifiableShareConsumer",
               "--bootstrap-server", bootstrap, "--topic", topic, "--group-id", group,
               "--verbose", *args]
        super().__init__(cmd, log)

    def records(self) -> list[dict]:
        return [e for e in self.snapshot() if e.get("name") == "record_data"]

    def stop(self, timeout: float = 30) -> list[dict]:
        return super().stop(timeout)

    def stderr(self, n: int = 4000) -> str:
        return h.read_log(self.log, n)


def ack_proxy(workdir: Path, upstream: list[str], policies: list[Path], removed_ack: str,
              name: str, **kw):
    """A policy proxy with an admin listener and `share_groups.removed_ack`
    set, started and registered (conftest attaches its log to failures);
    `kw`: `share_groups` (more keys of that section) or PolicyProxy fields
    (`dead_letter`)."""
    return share_proxy(workdir, upstream, policies, name,
                       share_groups={"removed_ack": removed_ack, **kw.pop("share_groups", {})},
                       **kw)


def share_proxy(workdir: Path, upstream: list[str], policies: list[Path], name: str,
                share_groups: dict, **kw):
    """A policy proxy with an admin listener and the `share_groups` keys
    given, started and registered; `kw`: PolicyProxy fields (`dead_letter`)."""
    from dataclasses import dataclass

    import conftest
    import poison_support as ps

    section = "share_groups:\n" + "".join(f"  {k}: {v}\n" for k, v in share_groups.items())

    @dataclass
    class ShareProxy(ps.AdminPolicyProxy):
        def config_yaml(self) -> str:
            return super().config_yaml() + section

    proxy = ShareProxy(workdir, upstream=upstream, policies=policies, name=name, **kw)
    conftest._PROXIES.append(proxy)
    return proxy.start()
