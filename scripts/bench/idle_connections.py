#!/usr/bin/env python3
"""Proxy memory with many idle client connections (issue 9: "RSS with 10,000
idle connections").

Starts tansu and antidote on loopback (the test harness, so the binary is
ANTIDOTE_BIN or target/debug/antidote), opens N TCP connections to the
proxy's bootstrap listener and leaves them idle, then has each send one
ApiVersions request and idle again. Prints the proxy's RSS (VmRSS from
/proc) before, after connecting, after the request, and after closing,
with bytes per connection. Everything is bounded by --timeout; processes
are stopped at the end.

Each client connection costs the proxy two descriptors (it dials the broker
at once), so N needs a descriptor limit of about 2N + 100: the script raises
its soft limit to the hard limit (children inherit it) and, if N still does
not fit, lowers N and says so.

  .venv/bin/python scripts/bench/idle_connections.py [--connections 10000]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
import harness as h  # noqa: E402

APIVERSIONS_V0 = h.request_frame(18, 0, 7, b"", client_id="idle")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle(pid: int, want_fds: int, deadline: float, quiet: float = 2.0) -> None:
    """Wait until the proxy holds `want_fds` descriptors (or the deadline),
    then `quiet` seconds more so its allocator settles."""
    give_up = min(deadline, time.monotonic() + 30)
    while fds(pid) < want_fds and time.monotonic() < give_up:
        time.sleep(0.2)
    time.sleep(min(quiet, max(0.0, deadline - time.monotonic())))


def open_connections(port: int, n: int, deadline: float, pid: int,
                     base_fds: int) -> list[socket.socket]:
    """n non-blocking connects in waves of 250; fails if any does not complete.
    After each wave, waits until the proxy has dialed the broker for every
    connection so far (two descriptors each): a burst larger than the
    broker's listen backlog would otherwise sit in SYN retries for tens of
    seconds and the "idle" figure would miss half the connections."""
    socks: list[socket.socket] = []
    sel = selectors.DefaultSelector()
    while len(socks) < n:
        settle(pid, base_fds + 2 * len(socks), deadline, quiet=0.0)
        wave = []
        for _ in range(min(250, n - len(socks))):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((h.HOST, port))
            sel.register(s, selectors.EVENT_WRITE)
            wave.append(s)
        pending = len(wave)
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(socks)} of {n} connections after the deadline")
            for key, _ in sel.select(timeout=1.0):
                s = key.fileobj
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, f"connect failed after {len(socks)} connections")
                sel.unregister(s)
                pending -= 1
        socks += wave
    sel.close()
    return socks


def one_request_each(socks: list[socket.socket], deadline: float) -> int:
    """Send ApiVersions v0 on every connection and read each whole response."""
    sel = selectors.DefaultSelector()
    need: dict[socket.socket, bytearray] = {}
    for s in socks:
        s.sendall(APIVERSIONS_V0)      # 27 bytes: fits any socket buffer
        sel.register(s, selectors.EVENT_READ)
        need[s] = bytearray()
    done = 0
    while done < len(socks):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{done} of {len(socks)} ApiVersions answered by the deadline")
        for key, _ in sel.select(timeout=1.0):
            s, buf = key.fileobj, need[key.fileobj]
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("proxy closed an idle connection")
            buf += chunk
            if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
                sel.unregister(s)
                done += 1
    sel.close()
    return done


def fit_connections(want: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fit = (hard - 100) // 2
    if want > fit:
        print(f"# descriptor hard limit {hard} fits {fit} proxied connections (2 fds each),"
              f" not {want}: measuring {fit}", file=sys.stderr)
        return fit
    return want


def measure(n: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    work = Path(tempfile.mkdtemp(prefix="idle-conns-"))
    broker = h.Tansu(work).start()
    proxy = None
    socks: list[socket.socket] = []
    try:
        proxy = h.Antidote(work, upstream=[broker.bootstrap], name="antidote-idle").start()
        pid = proxy.proc.pid
        with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=10) as s:
            h.api_versions(s)          # warm-up: metadata, first connection paths
        settle(pid, 0, deadline)       # the warm-up's two descriptors close
        base_fds = fds(pid)
        r = {"connections": n, "rss_kib_before": rss_kib(pid), "fds_before": base_fds}
        t0 = time.monotonic()
        socks = open_connections(proxy.bootstrap_port, n, deadline, pid, base_fds)
        r["connect_seconds"] = round(time.monotonic() - t0, 2)
        settle(pid, base_fds + 2 * n, deadline)
        r.update(rss_kib_idle=rss_kib(pid), fds_idle=fds(pid))
        r["answered"] = one_request_each(socks, deadline)
        settle(pid, 0, deadline)
        r.update(rss_kib_after_request=rss_kib(pid), fds_after_request=fds(pid))
        with socket.create_connection((h.HOST, proxy.bootstrap_port), timeout=10) as s:
            r["fresh_connection_served"] = bool(h.api_versions(s))
        for s in socks:
            s.close()
        socks = []
        settle(pid, 0, deadline, quiet=3.0)
        r.update(rss_kib_after_close=rss_kib(pid), fds_after_close=fds(pid))
        for k in ("idle", "after_request"):
            r[f"bytes_per_connection_{k}"] = round(
                (r[f"rss_kib_{k}"] - r["rss_kib_before"]) * 1024 / n)
        proxy.assert_running()
        return r
    finally:
        for s in socks:
            s.close()
        if proxy is not None:
            proxy.stop_and_check()
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--timeout", type=float, default=180.0)
    a = ap.parse_args()
    n = fit_connections(a.connections)
    r = measure(n, a.timeout)
    mib = lambda k: r[k] / 1024  # noqa: E731
    print(f"antidote {h.ANTIDOTE_BIN}")
    print(f"{n} idle connections to the bootstrap listener (connected in {r['connect_seconds']} s)")
    print(f"  RSS before            {mib('rss_kib_before'):8.1f} MiB  fds {r['fds_before']}")
    print(f"  RSS idle              {mib('rss_kib_idle'):8.1f} MiB  fds {r['fds_idle']}"
          f"  -> {r['bytes_per_connection_idle']} B per connection")
    print(f"  RSS after 1 request   {mib('rss_kib_after_request'):8.1f} MiB  fds "
          f"{r['fds_after_request']}  -> {r['bytes_per_connection_after_request']} B per connection"
          f" ({r['answered']} answered)")
    print(f"  RSS after close       {mib('rss_kib_after_close'):8.1f} MiB  fds {r['fds_after_close']}")
    print(f"  fresh connection served while loaded: {r['fresh_connection_served']}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
