"""A client given only antidote's bootstrap address must never open a TCP
connection to the broker's own port: every address in Metadata,
FindCoordinator, etc. must have been rewritten to the proxy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import ConnectionWatcher, tcp_connections

HERE = Path(__file__).resolve().parent
CLIENTS = ["librdkafka", "kafka-python"]


def run_probe(kind: str, bootstrap: str, topic: str) -> set[int]:
    """Run client_probe.py and return every remote port it was seen connected to,
    sampled every 20 ms while it ran and once more at the end."""
    proc = subprocess.Popen([sys.executable, str(HERE / "client_probe.py"), kind, bootstrap, topic],
                            cwd=HERE, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        with ConnectionWatcher(proc.pid) as w:
            line = proc.stdout.readline()  # bounded by the probe's own timeouts
            if line.strip() == "DONE":
                w.remote_ports |= {cn.remote[1] for cn in tcp_connections(proc.pid)
                                   if cn.state != "LISTEN"}
        proc.stdin.close()
        rc = proc.wait(timeout=200)
        assert line.strip() == "DONE" and rc == 0, \
            f"client probe failed (rc={rc}):\n{proc.stderr.read()[-5000:]}"
        return w.remote_ports
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.mark.parametrize("kind", CLIENTS)
def test_direct_client_is_seen_connected_to_broker_port(kind, broker, new_topic):
    """Validates the socket listing: a direct client must show the broker's port."""
    ports = run_probe(kind, broker.bootstrap, new_topic(1))
    assert broker.port in ports


@pytest.mark.parametrize("kind", CLIENTS)
def test_proxied_client_connects_only_to_proxy_ports(kind, proxy, broker, new_topic):
    ports = run_probe(kind, proxy.bootstrap, new_topic(1))
    assert broker.port not in ports, f"client connected to the broker itself: {ports}"
    assert ports <= {proxy.bootstrap_port, proxy.broker_port()}, f"unexpected peers: {ports}"
    # Metadata names the broker's node N at base+N, so real traffic must have gone there.
    assert proxy.broker_port() in ports, f"never used the per-broker port: {ports}"
