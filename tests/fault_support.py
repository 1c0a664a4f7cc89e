"""Helpers for the fault-injection tests (test_faults.py): proxies with a
policy and a dead-letter cluster, process memory, raw Fetch traffic, a
"black hole" TCP listener and bounded garbage/connection floods.

Loopback only; every loop here is bounded in count and in time."""

from __future__ import annotations

import os
import random
import resource
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import harness as h


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------

def rss_kb(pid: int) -> int:
    """VmRSS of `pid` in KiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def nofile_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) 'Max open files' of a running process, from /proc/PID/limits."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-file limit for pid {pid}")


def raise_nofile(want: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards `want` (children started
    afterwards inherit it); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class RssSampler:
    """Samples a process's VmRSS every `interval` s in a thread; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid, self.interval = pid, interval
        self.peak_kb = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_kb = max(self.peak_kb, rss_kb(self.pid))
                self.samples += 1
            except (FileNotFoundError, ProcessLookupError):
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def kill_hard(proc) -> None:
    """SIGKILL (a crash, not a shutdown) and reap."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def wait_port_closed(port: int, timeout: float) -> None:
    """Until nothing listens on 127.0.0.1:port (so it can be bound again)."""
    def free() -> bool:
        # SO_REUSEADDR, as brokers bind: TIME_WAIT leftovers of the old
        # process's connections do not count, only a listener does.
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((h.HOST, port))
                s.listen(1)
            except OSError:
                return False
            return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if free():
            return
        time.sleep(0.05)
    raise AssertionError(f"port {port} still bound after {timeout}s")


def restart_tansu_on_same_port(t: h.Tansu, timeout: float = 15) -> h.Tansu:
    """Start `t` again on its port once the old process has released it. The
    broker is in memory: it comes back empty."""
    wait_port_closed(t.port, timeout)
    return t.start()


# ---------------------------------------------------------------------------
# A proxy with policies and a dead-letter section
# ---------------------------------------------------------------------------

JSON_POLICY = """\
policies:
  - name: faults-json
    topics: [{topics}]
    value:
      format: json
      max_bytes: 65536
    on_invalid: divert
    dead_letter:
      topic: "{{topic}}.dlt"
"""


BYTES_POLICY = """\
policies:
  - name: faults-bytes
    topics: [{topics}]
    value:
      format: bytes
      max_bytes: 65536
    on_invalid: divert
"""


def write_bytes_policy(d: Path, topics: list[str]) -> Path:
    """A policy that passes every record under 64 KiB: Fetch responses of
    `topics` go through the interception path without changing."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "faults-bytes-policy.yaml"
    path.write_text(BYTES_POLICY.format(topics=", ".join(f'"{t}"' for t in topics)))
    return path


def write_json_policy(d: Path, topics: list[str]) -> Path:
    """A policy file: values of `topics` must be strict JSON, else divert to
    "<topic>.dlt"."""
    d.mkdir(parents=True, exist_ok=True)
    path = d / "faults-policy.yaml"
    path.write_text(JSON_POLICY.format(topics=", ".join(f'"{t}"' for t in topics)))
    return path


@dataclass
class PolicyAntidote(h.Antidote):
    """The harness's Antidote, plus policy paths and `dead_letter` / `limits`
    sections (plain scalars / lists only)."""
    policy_paths: list[str] = field(default_factory=list)
    dead_letter: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)

    def config_yaml(self) -> str:
        base = super().config_yaml()
        assert base.endswith("policies: []\n"), "harness config layout changed"
        lines = [base[:-len("policies: []\n")].rstrip("\n")]
        if self.policy_paths:
            lines.append("policies:")
            lines += [f"  - {p}" for p in self.policy_paths]
        else:
            lines.append("policies: []")
        for section, values in (("dead_letter", self.dead_letter), ("limits", self.limits)):
            if not values:
                continue
            lines.append(f"{section}:")
            for k, v in values.items():
                if isinstance(v, list):
                    lines.append(f"  {k}:")
                    lines += [f"    - {x}" for x in v]
                else:
                    lines.append(f"  {k}: {v}")
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# A TCP listener that accepts and never answers
# ---------------------------------------------------------------------------

class BlackHole:
    """Listens on 127.0.0.1:port, accepts every connection, reads and discards
    what arrives, never writes. `stop()` closes the listener and every
    accepted connection so that the port can be reused."""

    def __init__(self, port: int):
        self.port = port
        self.accepted = 0
        self.bytes_in = 0
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._srv = socket.socket()
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind((h.HOST, port))
        self._srv.listen(64)
        self._srv.settimeout(0.1)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import select
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
                conn.setblocking(False)
                with self._lock:
                    self._conns.append(conn)
                    self.accepted += 1
            except (socket.timeout, BlockingIOError):
                pass
            except OSError:
                return
            with self._lock:
                conns = list(self._conns)
            if conns:
                readable, _, _ = select.select(conns, [], [], 0)
                for s in readable:
                    try:
                        data = s.recv(65536)
                        self.bytes_in += len(data)
                    except OSError:
                        data = b""
                    if not data:
                        with self._lock:
                            self._conns.remove(s)
                        s.close()

    def start(self) -> "BlackHole":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for s in self._conns:
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass
            self._conns.clear()
        self._srv.close()


# ---------------------------------------------------------------------------
# Raw protocol traffic
# ---------------------------------------------------------------------------

def fetch_request(topic: str, correlation_id: int, max_bytes: int, partition: int = 0,
                  offset: int = 0) -> bytes:
    """A size-prefixed Fetch v11 request for one partition."""
    return h.request_frame(1, 11, correlation_id,
                           h.fetch_v11_body(topic, partition, offset, max_bytes=max_bytes))


def api_versions_request(correlation_id: int = 1) -> bytes:
    return h.request_frame(18, 0, correlation_id, b"")


def api_versions_ok(port: int, timeout: float = 5) -> bool:
    with socket.create_connection((h.HOST, port), timeout=timeout) as s:
        s.settimeout(timeout)
        return 0 in h.api_versions(s)


def established_to(pid: int, port: int) -> int:
    """How many ESTABLISHED TCP connections `pid` holds to 127.0.0.1:port."""
    return sum(1 for c in h.tcp_connections(pid)
               if c.state == "ESTABLISHED" and c.remote[1] == port)


def garbage_payload(rng: random.Random) -> bytes:
    """One garbage frame: random bytes, an oversize or negative length prefix,
    or a well-sized frame with a nonsense header."""
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(8, 512))
    if kind == 1:
        return struct.pack(">i", rng.randrange(200 << 20, 0x7FFFFFFF)) + rng.randbytes(64)
    if kind == 2:
        return struct.pack(">i", -rng.randrange(1, 1 << 30)) + rng.randbytes(16)
    body = struct.pack(">hhi", rng.randrange(0x4000, 0x7FFF), rng.randrange(0, 0x7FFF), 1)
    body += rng.randbytes(rng.randrange(0, 200))
    return struct.pack(">i", len(body)) + body


class GarbageFlood:
    """`conns` threads, each repeatedly: connect to the proxy, send a garbage
    frame, wait (at most `linger` s) for the proxy to close, close, pause
    `pause` s. Stops by itself after `duration` s or `max_rounds` rounds per
    thread; `stop()` ends it early."""

    def __init__(self, port: int, conns: int = 50, duration: float = 30.0,
                 max_rounds: int = 100_000, linger: float = 0.2, pause: float = 0.0,
                 seed: int = 1):
        self.port, self.conns, self.duration = port, conns, duration
        self.max_rounds, self.linger, self.pause, self.seed = max_rounds, linger, pause, seed
        self.sent = 0
        self.closed_by_proxy = 0
        self.connect_errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                         for i in range(conns)]

    def _run(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        deadline = time.monotonic() + self.duration
        for _ in range(self.max_rounds):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            try:
                with socket.create_connection((h.HOST, self.port), timeout=2) as s:
                    s.sendall(garbage_payload(rng))
                    s.settimeout(self.linger)
                    closed = False
                    try:
                        closed = s.recv(4096) == b""
                    except socket.timeout:
                        pass
                    except OSError:
                        closed = True
                    with self._lock:
                        self.sent += 1
                        self.closed_by_proxy += closed
            except OSError:
                with self._lock:
                    self.connect_errors += 1
                self._stop.wait(0.05)
            if self.pause:
                self._stop.wait(self.pause)

    def start(self) -> "GarbageFlood":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def __enter__(self) -> "GarbageFlood":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------
# The garbage flood in its own process (own GIL, own CPU accounting)
# ---------------------------------------------------------------------------

def flood_process(port: int, conns: int, duration: float, pause: float):
    """Start a GarbageFlood in a child Python process. It stops by itself after
    `duration` s, or on SIGTERM; its stats are printed as JSON on stdout."""
    import subprocess
    import sys
    code = ("import sys, json, signal, threading; sys.path.insert(0, %r); "
            "import fault_support as fs; "
            "f = fs.GarbageFlood(%d, conns=%d, duration=%f, pause=%f); "
            "signal.signal(signal.SIGTERM, lambda *a: f._stop.set()); "
            "f.start(); [t.join() for t in f._threads]; "
            "print(json.dumps(dict(sent=f.sent, closed_by_proxy=f.closed_by_proxy, "
            "connect_errors=f.connect_errors)))"
            % (str(Path(__file__).parent), port, conns, duration, pause))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


_SINK_CODE = """
import selectors, socket
ls = socket.create_server((%r, 0), backlog=512)
ls.setblocking(False)
print(ls.getsockname()[1], flush=True)
sel = selectors.DefaultSelector()
sel.register(ls, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if s is ls:
            try:
                conn, _ = ls.accept()
            except OSError:
                continue
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
        else:
            sel.unregister(s)
            try:
                s.recv(65536)
            except OSError:
                pass
            s.close()
"""


def sink_process():
    """A child Python process listening on a loopback port: it accepts every
    connection, reads once and closes, the least any server can do with a
    garbage frame. Flooding it costs the flood generator what flooding the
    proxy costs it, so a consumer's rate while it is flooded is the control
    for its rate while the proxy is flooded. Returns (process, port); stop it
    with `proc.kill()`."""
    import subprocess
    import sys
    code = _SINK_CODE % h.HOST
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, port


def stop_flood(proc, timeout: float = 15) -> dict:
    import json
    import signal
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"flood process failed ({proc.returncode}): {err[-2000:]}"
    return json.loads(out.strip().splitlines()[-1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` in seconds, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
