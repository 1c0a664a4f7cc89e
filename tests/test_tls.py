"""TLS on both sides of the proxy, against Apache Kafka's own SSL listener
(`secure_kafka.SecureKafka`: server certificate from `harness.make_certs`,
`ssl.client.auth=required` for mTLS). This replaced a TLS terminator in
front of tansu, which cannot serve TLS.

direct path: the client speaks TLS to Kafka (validates certs and settings);
proxy path:  the client speaks TLS to antidote (listen.tls), or antidote speaks
             TLS to Kafka (upstream.tls)."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

import clients as c
from conftest import start_proxy
from harness import read_log
from secure_kafka import SecureKafka

CLIENTS = ["librdkafka", "kafka-python"]


@pytest.fixture(scope="module")
def tls_broker(workdir, certs):
    """Kafka with an SSL client listener (server auth only)."""
    b = SecureKafka(workdir, protocol="SSL", certs=certs).start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def mtls_broker(workdir, certs):
    """Kafka with an SSL client listener that requires a client certificate."""
    b = SecureKafka(workdir, protocol="SSL", certs=certs, client_auth="required").start()
    yield b
    b.stop()


@pytest.fixture
def proxy_factory(workdir):
    """Start antidote with a given config; at teardown it must exit 0 on SIGTERM."""
    started = []

    def make(**kw):
        try:
            p = start_proxy(workdir, name="antidote-tls", **kw)
        except AssertionError as e:
            pytest.fail(f"antidote did not start: {e}", pytrace=False)
        started.append(p)
        return p
    yield make
    for p in started:
        p.stop_and_check()


def roundtrip_both_ways(kind: str, ep: c.Endpoint, topic: str) -> None:
    recs = c.sample_records(8, tag=kind)
    if kind == "librdkafka":
        c.ck_produce(ep, topic, recs)
        assert c.ck_consume_assign(ep, topic, [0], len(recs)) == recs
    else:
        c.kp_produce(ep, topic, recs)
        assert c.kp_consume_assign(ep, topic, [0], len(recs)) == recs


def ssl_ep(kafka, certs, mutual: bool) -> c.Endpoint:
    """Direct TLS access to Kafka's SSL listener."""
    extra = {"cert": str(certs.client_cert), "key": str(certs.client_key)} if mutual else {}
    return c.Endpoint(kafka.secure_bootstrap, "direct", ca=str(certs.ca), **extra)


@pytest.mark.parametrize("kind", CLIENTS)
def test_client_tls_with_ca_produces_and_consumes(kind, path, broker, tls_broker, certs,
                                                  proxy_factory, new_topic):
    if path == "direct":
        ep = ssl_ep(tls_broker, certs, False)
        topic = f"tls-{kind}-{id(ep)}"
        c.ck_create_topic(ep, topic, 1)
    else:
        p = proxy_factory(upstream=[broker.bootstrap],
                          listen_tls={"cert": certs.server_cert, "key": certs.server_key})
        ep = c.Endpoint(p.bootstrap, path, ca=str(certs.ca))
        topic = new_topic(1)
    roundtrip_both_ways(kind, ep, topic)


def rejected(ep: c.Endpoint) -> bool:
    """True if a librdkafka client cannot get Metadata within 8 s (any cause:
    for the relayed-connection case, where the broker hangs up on the proxy)."""
    try:
        AdminClient(ep.ck(log_level=0)).list_topics(timeout=8)
    except KafkaException:
        return True
    return False


# What a TLS 1.3 client sees when the server requires a certificate it did
# not send: the server's alert (116, certificate_required) or, before TLS 1.3,
# a handshake failure alert. A timeout or a plain hang-up is not this.
HANDSHAKE_REFUSED = ("certificate required", "CERTIFICATE_REQUIRED", "handshake failure",
                     "HANDSHAKE_FAILURE")


class _Keep(logging.Handler):
    """Collects the text of every log record (with its exception) it gets."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]!r}"
        self.lines.append(text)


def ck_tls_refusal(ep: c.Endpoint, timeout: float = 8) -> list[str]:
    """librdkafka's own log lines while it tries to get Metadata: it logs
    the SSL error with the alert's text; the logs queue until poll()."""
    keep = _Keep()
    log = logging.getLogger(f"ck-tls-{time.monotonic_ns()}")
    log.propagate = False
    log.addHandler(keep)
    admin = AdminClient(ep.ck(log_level=7, debug="security,broker", logger=log))
    try:
        admin.list_topics(timeout=timeout)
        keep.lines.append("SERVED: Metadata answered")
    except KafkaException as e:
        keep.lines.append(f"list_topics: {e}")
    for _ in range(4):
        admin.poll(0.25)
    return keep.lines


def kp_tls_refusal(ep: c.Endpoint, timeout: float = 8) -> list[str]:
    """kafka-python's log lines (logger "kafka") while its bootstrap fails."""
    import kafka as kp
    keep = _Keep()
    log = logging.getLogger("kafka")
    old_level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(keep)
    try:
        consumer = kp.KafkaConsumer(**ep.kp(request_timeout_ms=int(timeout * 1000)))
        consumer.close()
        keep.lines.append("SERVED: bootstrap succeeded")
    except Exception as e:  # NoBrokersAvailable: the cause is in the log
        keep.lines.append(f"bootstrap: {e!r}")
    finally:
        log.removeHandler(keep)
        log.setLevel(old_level)
    return keep.lines


def assert_handshake_refused(kind: str, ep: c.Endpoint) -> None:
    errors = ck_tls_refusal(ep) if kind == "librdkafka" else kp_tls_refusal(ep)
    assert any(any(m in e for m in HANDSHAKE_REFUSED) for e in errors), \
        f"{kind} without a certificate was not refused by the handshake: {errors[-40:]}"


@pytest.mark.parametrize("kind", CLIENTS)
def test_client_mtls_accepts_signed_client_cert_and_rejects_none(kind, path, broker, mtls_broker,
                                                                 certs, proxy_factory, new_topic):
    if path == "direct":
        bootstrap = mtls_broker.secure_bootstrap
        topic = f"mtls-{kind}-{path}"
        c.ck_create_topic(ssl_ep(mtls_broker, certs, True), topic, 1)
    else:
        p = proxy_factory(upstream=[broker.bootstrap],
                          listen_tls={"cert": certs.server_cert, "key": certs.server_key,
                                      "client_ca": certs.ca})
        bootstrap = p.bootstrap
        topic = new_topic(1)
    with_cert = c.Endpoint(bootstrap, path, ca=str(certs.ca), cert=str(certs.client_cert),
                           key=str(certs.client_key))
    roundtrip_both_ways(kind, with_cert, topic)
    no_cert = c.Endpoint(bootstrap, path, ca=str(certs.ca))
    if path == "direct":
        # Kafka refuses a certificate-less client: the test's own check.
        assert rejected(no_cert), "a client without a certificate was served"
        return
    # antidote (rustls) refuses in the handshake: the client gets TLS alert
    # 116, certificate_required, and the proxy logs why. A proxy that hung
    # such clients up, or let them time out, fails here.
    assert_handshake_refused(kind, no_cert)
    assert "TLS handshake with client failed error=peer sent no certificates" in read_log(p.log)


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_upstream_tls_to_broker_is_transparent_to_plaintext_client(kind, mutual, path, certs,
                                                                   tls_broker, mtls_broker,
                                                                   proxy_factory):
    kafka = mtls_broker if mutual else tls_broker
    topic = f"up-{kind}-{'m' if mutual else ''}tls-{path}"
    direct_ep = ssl_ep(kafka, certs, mutual)
    c.ck_create_topic(direct_ep, topic, 1)
    client_cert = {"cert": str(certs.client_cert), "key": str(certs.client_key)} if mutual else {}
    if path == "direct":
        # The client itself speaks TLS to Kafka: validates the upstream side.
        ep = direct_ep
    else:
        # Relayed connections present the proxy's certificate only when asked.
        relay = {"relay_client_cert": "true"} if mutual else {}
        p = proxy_factory(upstream=[kafka.secure_bootstrap],
                          upstream_tls={"ca": certs.ca, **client_cert, **relay})
        ep = c.Endpoint(p.bootstrap, path)
    roundtrip_both_ways(kind, ep, topic)


def test_relayed_client_connections_present_no_client_certificate_by_default(
        certs, mtls_broker, proxy_factory):
    """With a client certificate configured for the proxy's own connections,
    the proxy still fetches metadata from an mTLS-only broker, but a client's
    relayed connection presents no certificate and is refused there: clients
    never inherit the proxy's principal."""
    p = proxy_factory(upstream=[mtls_broker.secure_bootstrap],
                      upstream_tls={"ca": certs.ca, "cert": str(certs.client_cert),
                                    "key": str(certs.client_key)})
    deadline = time.monotonic() + 15
    while "upstream metadata fetched; ready" not in read_log(p.log):
        assert time.monotonic() < deadline, "the proxy's own connection was refused"
        time.sleep(0.1)
    assert rejected(c.Endpoint(p.bootstrap, "proxy")), \
        "a relayed client connection reached the mTLS broker with the proxy's certificate"
    # TLS 1.3: the broker refuses the certificate-less client after the
    # handshake, so the proxy sees the broker hang up.
    log = read_log(p.log)
    assert "cannot reach upstream" in log or "error=broker: i/o" in log, log[-2000:]
