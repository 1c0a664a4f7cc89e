"""SNI routing (`listen.sni`): every broker on the one bootstrap port, told
apart by the TLS server name of each connection.

The names (`bootstrap.kafka.test`, `broker-{node}.kafka.test`) must resolve to
127.0.0.1 without root: kafka-python runs in this process with
`socket.getaddrinfo` wrapped; librdkafka (confluent-kafka) runs in a
subprocess with an LD_PRELOAD shim, compiled here with `cc`, that answers
`getaddrinfo` for names ending in `.kafka.test` with 127.0.0.1. The proxy's
certificate is a wildcard for `*.kafka.test` from a test CA, and both
clients verify the name (librdkafka: `ssl.endpoint.identification.algorithm`
https, its default; kafka-python: `ssl_check_hostname`)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

import clients as c
from conftest import _PROXIES
from harness import (BROKER_NODE_ID, HOST, Antidote, free_port, read_log, roundtrip,
                     tcp_connections)

SUFFIX = ".kafka.test"
BOOTSTRAP_NAME = "bootstrap" + SUFFIX
BROKER_PATTERN = "broker-{node}" + SUFFIX
TESTS = Path(__file__).resolve().parent

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <strings.h>

/* Names ending in .kafka.test resolve to 127.0.0.1; everything else as usual. */
typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res) {
    static gai_fn real;
    if (!real) real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    const char *suffix = ".kafka.test";
    if (node) {
        size_t n = strlen(node), s = strlen(suffix);
        if (n > s && strcasecmp(node + n - s, suffix) == 0) node = "127.0.0.1";
    }
    return real(node, service, hints, res);
}
"""


@dataclass
class SniCerts:
    dir: Path

    @property
    def ca(self) -> Path: return self.dir / "ca.pem"
    @property
    def cert(self) -> Path: return self.dir / "wildcard.pem"
    @property
    def key(self) -> Path: return self.dir / "wildcard.key"


@pytest.fixture(scope="module")
def sni_certs(workdir) -> SniCerts:
    """A test CA and a certificate for `*.kafka.test` signed by it (openssl CLI)."""
    d = workdir / "sni-certs"
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=antidote-sni-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (d / "wildcard.ext").write_text(
        f"subjectAltName=DNS:*{SUFFIX}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "wildcard.key", "-out",
        "wildcard.csr", "-subj", f"/CN=*{SUFFIX}")
    run("x509", "-req", "-in", "wildcard.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "wildcard.pem", "-days", "2", "-extfile", "wildcard.ext")
    return SniCerts(d)


@dataclass
class SniAntidote(Antidote):
    """antidote with `listen.sni` (no broker_port_base, no advertised_host) and
    an admin listener, so the test can read which targets connections took."""
    admin_port: int = 0

    def config_yaml(self) -> str:
        assert self.listen_tls, "sni needs tls"
        lines = ["listen:", f"  bootstrap: {HOST}:{self.bootstrap_port}", "  tls:"]
        lines += [f"    {k}: {v}" for k, v in self.listen_tls.items()]
        lines += ["  sni:", f"    bootstrap: {BOOTSTRAP_NAME}",
                  f"    broker: \"{BROKER_PATTERN}\"",
                  "upstream:", "  bootstrap_servers:"]
        lines += [f"    - {u}" for u in self.upstream]
        lines += ["policies: []", "admin:", f"  listen: {HOST}:{self.admin_port}"]
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def sni_proxy(workdir, broker, sni_certs):
    p = SniAntidote(workdir, upstream=[broker.bootstrap], name="antidote-sni",
                    listen_tls={"cert": sni_certs.cert, "key": sni_certs.key},
                    admin_port=free_port())
    _PROXIES.append(p)
    p.start()
    yield p
    p.stop_and_check()


@pytest.fixture(scope="module")
def resolver_shim(workdir) -> Path:
    src = workdir / "kafka_test_resolver.c"
    lib = workdir / "kafka_test_resolver.so"
    src.write_text(SHIM_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"],
                   check=True, capture_output=True)
    return lib


@pytest.fixture
def kafka_test_names(monkeypatch):
    """`*.kafka.test` resolves to 127.0.0.1 in this process (kafka-python)."""
    real = socket.getaddrinfo

    def fake(host, *args, **kw):
        if isinstance(host, str) and host.lower().endswith(SUFFIX):
            host = HOST
        return real(host, *args, **kw)
    monkeypatch.setattr(socket, "getaddrinfo", fake)


def sni_endpoint(proxy: SniAntidote, certs: SniCerts) -> c.Endpoint:
    return c.Endpoint(f"{BOOTSTRAP_NAME}:{proxy.bootstrap_port}", "proxy", ca=str(certs.ca))


def accepted_by_listener(proxy: SniAntidote) -> dict[str, float]:
    """`antidote_connections_accepted_total` by listener label."""
    url = f"http://{HOST}:{proxy.admin_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("antidote_connections_accepted_total{"):
            label = line.split('listener="', 1)[1].split('"', 1)[0]
            out[label] = float(line.rsplit(" ", 1)[1])
    return out


def listening_ports(proxy: SniAntidote) -> set[int]:
    assert proxy.proc is not None
    return {conn.local[1] for conn in tcp_connections(proxy.proc.pid) if conn.state == "LISTEN"}


RDKAFKA_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[4])
import clients as c
from confluent_kafka.admin import AdminClient
ep = c.Endpoint(sys.argv[1], "proxy", ca=sys.argv[2])
topic = sys.argv[3]
recs = c.sample_records(8, tag="sni-rdkafka")
c.ck_produce(ep, topic, recs)
got = c.ck_consume_assign(ep, topic, [0], len(recs))
md = AdminClient(ep.ck()).list_topics(timeout=15)
print(json.dumps({"same": got == recs, "read": len(got),
                  "brokers": {str(k): [b.host, b.port] for k, b in md.brokers.items()}}))
"""


def test_librdkafka_produces_and_consumes_through_sni_names(sni_proxy, sni_certs, resolver_shim,
                                                           new_topic, workdir):
    topic = new_topic(1)
    before = accepted_by_listener(sni_proxy).get(f"broker-{BROKER_NODE_ID}", 0)
    script = workdir / "sni_rdkafka.py"
    script.write_text(RDKAFKA_SCRIPT)
    env = {**os.environ, "LD_PRELOAD": str(resolver_shim)}
    ep = sni_endpoint(sni_proxy, sni_certs)
    out = subprocess.run([sys.executable, str(script), ep.bootstrap, str(sni_certs.ca), topic,
                          str(TESTS)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["same"], result
    assert result["brokers"] == {str(BROKER_NODE_ID): [f"broker-{BROKER_NODE_ID}{SUFFIX}",
                                                      sni_proxy.bootstrap_port]}, result
    after = accepted_by_listener(sni_proxy).get(f"broker-{BROKER_NODE_ID}", 0)
    assert after > before, "no connection was routed to the broker by its server name"
    assert listening_ports(sni_proxy) == {sni_proxy.bootstrap_port, sni_proxy.admin_port}
    assert "serving broker" not in read_log(sni_proxy.log)


def test_kafka_python_produces_and_consumes_through_sni_names(sni_proxy, sni_certs, new_topic,
                                                             kafka_test_names):
    import kafka as kp
    topic = new_topic(1)
    before = accepted_by_listener(sni_proxy).get(f"broker-{BROKER_NODE_ID}", 0)
    ep = sni_endpoint(sni_proxy, sni_certs)
    recs = c.sample_records(8, tag="sni-kp")
    c.kp_produce(ep, topic, recs)
    assert c.kp_consume_assign(ep, topic, [0], len(recs)) == recs
    consumer = kp.KafkaConsumer(**ep.kp())
    try:
        consumer.topics()
        brokers = {(b.node_id, b.host, b.port) for b in consumer._client.cluster.brokers()}
    finally:
        consumer.close()
    assert brokers == {(BROKER_NODE_ID, f"broker-{BROKER_NODE_ID}{SUFFIX}",
                        sni_proxy.bootstrap_port)}
    assert accepted_by_listener(sni_proxy).get(f"broker-{BROKER_NODE_ID}", 0) > before


def tls_attempt(port: int, server_name: str | None, ca: Path) -> str:
    """Open a TLS connection with this SNI (none if None) and send ApiVersions;
    returns "served" or the error that ended it."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False   # the name is what is under test, not the check
    try:
        with socket.create_connection((HOST, port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=server_name) as s:
                roundtrip(s, 18, 0, 1, b"")
                return "served"
    except (OSError, ConnectionError) as e:
        return f"{type(e).__name__}: {e}"


def test_unknown_or_missing_server_name_is_refused_and_the_proxy_keeps_serving(
        sni_proxy, sni_certs, new_topic, kafka_test_names):
    port = sni_proxy.bootstrap_port
    # The bootstrap name is served; the control for the refusals below.
    assert tls_attempt(port, BOOTSTRAP_NAME, sni_certs.ca) == "served"
    log_before = read_log(sni_proxy.log, limit=10**7).count("TLS server name not served")
    for name in ["unknown.kafka.test", "broker-007.kafka.test", "broker-1.other.test", None,
                 "unknown.kafka.test"]:
        result = tls_attempt(port, name, sni_certs.ca)
        assert result != "served", f"server name {name!r} was served"
    time.sleep(0.5)
    log = read_log(sni_proxy.log, limit=10**7)
    # Five refusals within the log interval: one warning (a scan cannot flood the log).
    assert log_before == 0 and log.count("TLS server name not served") == 1, log[-3000:]
    assert 'server_name=Some("unknown.kafka.test")' in log, log[-3000:]
    sni_proxy.assert_running()
    # Still serving real clients.
    assert tls_attempt(port, f"broker-{BROKER_NODE_ID}{SUFFIX}", sni_certs.ca) == "served"
    topic = new_topic(1)
    ep = sni_endpoint(sni_proxy, sni_certs)
    recs = c.sample_records(3, tag="sni-after-refusals")
    c.kp_produce(ep, topic, recs)
    assert c.kp_consume_assign(ep, topic, [0], len(recs)) == recs


def test_sni_config_errors_name_file_line_and_column(workdir, sni_certs):
    """`antidote check` on a pattern without {node} and on sni without tls."""
    from harness import ANTIDOTE_BIN
    base = (f"listen:\n  bootstrap: {HOST}:29092\n"
            f"  tls: {{ cert: {sni_certs.cert}, key: {sni_certs.key} }}\n"
            f"  sni:\n    bootstrap: {BOOTSTRAP_NAME}\n    broker: \"{BROKER_PATTERN}\"\n"
            "upstream:\n  bootstrap_servers: [127.0.0.1:9092]\n")
    cases = [
        (base, None),
        (base.replace("broker-{node}", "broker"), ":6:13: listen.sni.broker:"),
        (base.replace(f"  tls: {{ cert: {sni_certs.cert}, key: {sni_certs.key} }}\n", ""),
         ":2:3: listen: `sni` requires `tls`"),
    ]
    for i, (text, error) in enumerate(cases):
        cfg = workdir / f"sni-check-{i}.yaml"
        cfg.write_text(text)
        out = subprocess.run([str(ANTIDOTE_BIN), "check", "--config", str(cfg)],
                             capture_output=True, text=True, timeout=30)
        if error is None:
            assert out.returncode == 0, out.stderr
        else:
            assert out.returncode != 0
            assert f"{cfg}{error}" in out.stderr + out.stdout, out.stderr


def test_the_readme_sni_example_passes_check(workdir, sni_certs):
    """The config shown in docs/configuration.md's "SNI routing" section,
    with this test's certificate files, is accepted by `antidote check`."""
    from harness import ANTIDOTE_BIN, REPO
    readme = (REPO / "docs" / "configuration.md").read_text()
    section = readme.split("## SNI routing", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert "sni:" in example and "{node}" in example
    example = (example.replace("certs/wildcard.pem", str(sni_certs.cert))
               .replace("certs/wildcard.key", str(sni_certs.key)))
    cfg = workdir / "readme-sni.yaml"
    cfg.write_text(example)
    out = subprocess.run([str(ANTIDOTE_BIN), "check", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr + out.stdout
