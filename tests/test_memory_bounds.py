"""Memory the configuration bounds, against hostile clients (issue 28).

Many connections each send a maximal request frame slowly, never finishing
it (a slow-loris on frames). Without a cap each connection buffers its
frame: connections x frame bytes. With `limits.max_queued_request_bytes`
(Kafka's queued.max.request.bytes, KIP-72) a frame larger than 64 KiB
waits, unread, until there is room, so the proxy's peak RSS grows by about
max(cap, one frame) + connections x 64 KiB, whatever the connections send.
The figures are reported (peak VmHWM)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

import fault_support as fs
import harness as h

CONNS = 40
FRAME = 20 << 20          # each connection claims a 20 MiB frame ...
SENT = FRAME - 1          # ... and sends all of it but its last byte
CAP = 32 << 20            # limits.max_queued_request_bytes


def _hwm_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _slow_frame(port: int, stop: threading.Event, sent: list[int]) -> None:
    """Send the length prefix and SENT bytes in 256 KiB writes, until done,
    refused or stopped; never the last byte."""
    s = socket.create_connection((h.HOST, port), timeout=2)
    s.settimeout(0.5)
    total = 0
    try:
        s.sendall(struct.pack(">i", FRAME))
        chunk = b"\x00" * (256 << 10)
        while total < SENT and not stop.is_set():
            try:
                total += s.send(chunk[: min(len(chunk), SENT - total)])
            except socket.timeout:
                continue  # the proxy is not reading this connection: it waits
            except OSError:
                break
        while not stop.is_set():
            time.sleep(0.05)
    finally:
        sent.append(total)
        s.close()


def test_many_connections_sending_maximal_frames_slowly_stay_under_the_request_queue(
        workdir, broker, request):
    proxy = fs.PolicyAntidote(workdir, upstream=[broker.bootstrap], name="memory-bounds",
                              limits={"max_queued_request_bytes": CAP})
    import conftest
    conftest._PROXIES.append(proxy)
    proxy.start()
    try:
        pid = proxy.proc.pid
        before = _hwm_kb(pid)
        stop = threading.Event()
        sent: list[int] = []
        threads = [threading.Thread(target=_slow_frame, args=(proxy.bootstrap_port, stop, sent),
                                    daemon=True) for _ in range(CONNS)]
        for t in threads:
            t.start()
        time.sleep(8)  # bounded: every sender has had time to send what it can
        peak = _hwm_kb(pid)
        stop.set()
        for t in threads:
            t.join(10)
        grew_mib = (peak - before) / 1024
        bound_mib = (max(CAP, FRAME) + CONNS * (64 << 10)) / (1 << 20)
        unbounded_mib = CONNS * FRAME / (1 << 20)
        print(f"peak VmHWM grew {grew_mib:.1f} MiB (before {before} KiB, peak {peak} KiB); "
              f"bound max(cap, frame) + conns x 64 KiB = {bound_mib:.1f} MiB; without the cap "
              f"{unbounded_mib:.0f} MiB; bytes accepted by the proxy's sockets: "
              f"{sum(sent) / (1 << 20):.0f} MiB")
        # Two frames may be held at once (one waits for the cap's room while the
        # other's bytes are buffered), plus allocator slack: the bound with a
        # margin, far under what the connections claimed.
        allowed_mib = bound_mib + FRAME / (1 << 20) + 24
        assert grew_mib < allowed_mib, grew_mib
        # The fault took effect: the connections pushed more bytes into the
        # proxy's sockets than the bound allows it to grow (135 MiB against
        # 78.5 when this was written), so a proxy that buffered what it was
        # sent would have failed the bound.
        assert sum(sent) / (1 << 20) > allowed_mib, "the senders got too little in to test the cap"
        assert proxy.proc.poll() is None, "the proxy is up"
        # And it still serves: a metadata request answers.
        from confluent_kafka.admin import AdminClient
        md = AdminClient({"bootstrap.servers": proxy.bootstrap}).list_topics(timeout=15)
        assert md.brokers
    finally:
        proxy.stop_and_check()
