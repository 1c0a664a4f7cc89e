"""A private network for one test: network namespaces, a bridge, and faults
between any two of its nodes (test_jepsen.py).

Each node (a broker, a proxy instance, a client host, the test's own
control host) gets a network namespace of its own, named after the test
(`adj<pid>x<n>-<node>`), joined by a veth pair to a bridge in one more
namespace (the hub). Every address is a loopback address (127.42.0.N/24 on
the node's veth, `route_localnet=1` so that the kernel routes 127/8 off the
`lo` device; `lo` keeps 127.0.0.1/32 only, or 127.0.0.0/8 would stay a
local route and swallow the other nodes' addresses). Nothing is added to
the machine's own namespace: the veth pairs are made with one end in the
hub and the other in the node, and every address lives inside the test's
namespaces. `destroy()` kills the processes the test started in them and
deletes the namespaces (and with them the veths, the bridge and every
rule); namespaces left by a test process that died are deleted at the next
start.

Faults, all started and undone by the test:

- partition (`drop`: packets vanish, connections hang until a timeout;
  `reject`: TCP resets, connections fail at once): iptables rules in a
  chain of the first node's namespace, for the other node's address, both
  directions;
- loss: the same with `-m statistic --mode random --probability P`;
- delay and reordering: the kernel has no `netem` qdisc, so packets of the
  link go to an NFQUEUE queue that `nfq_delay.py` (run in the node's
  namespace) releases after `delay ± jitter` (packets overtake each other
  with a jitter);
- a slow link: a `tbf` qdisc (rate limit) on the node's veth.

Processes are put into a namespace by starting them from a thread that has
entered it (`setns(2)` on that thread only; a child process inherits its
parent thread's namespace), so the harness's own start-and-wait code
(`harness.KafkaBroker.start`, ...) runs unchanged inside a namespace, its
readiness checks included. The same holds for a client library: a
librdkafka handle made in that thread keeps its threads, and so its
sockets, in the namespace.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

SUBNET = "127.42.0"
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
PREFIX = "adj"
MTU = 65000  # fewer packets per Fetch response: less work for nfq_delay.py
HERE = Path(__file__).resolve().parent

_libc = ctypes.CDLL(None, use_errno=True)
_counter = itertools.count()


def iptables_bin() -> Optional[str]:
    """iptables-legacy where installed (the kernel's ip_tables, which has the
    statistic and NFQUEUE targets the faults use), else iptables."""
    return shutil.which("iptables-legacy") or shutil.which("iptables")


def unavailable() -> Optional[str]:
    """Why this machine cannot run namespaced tests, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    if iptables_bin() is None:
        return "iptables is not installed (scripts/setup.sh installs it under CI=true)"
    probe = f"{PREFIX}probe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot make a network namespace: {r.stderr.strip()}"
    try:
        r = subprocess.run(["ip", "netns", "exec", probe, iptables_bin(), "-w", "-L", "-n"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return f"iptables does not work in a namespace: {r.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if not Path("/proc/net/netfilter/nfnetlink_queue").exists():
        return "the kernel has no nfnetlink_queue (NFQUEUE), which the delay fault needs"
    return None


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def remove_stale() -> None:
    """Delete namespaces of this harness whose test process is gone."""
    if not NETNS_DIR.is_dir():
        return
    for p in NETNS_DIR.iterdir():
        name = p.name
        if not name.startswith(PREFIX) or "x" not in name:
            continue
        try:
            pid = int(name[len(PREFIX):name.index("x")])
        except ValueError:
            continue
        if not Path(f"/proc/{pid}").exists():
            _sh("ip", "netns", "del", name, check=False)


def enter(ns: str) -> None:
    """Move the calling thread (only) into namespace `ns`."""
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({ns}): {os.strerror(err)}")
    finally:
        os.close(fd)


def run_in(ns: str, fn: Callable[..., T], *args, timeout: Optional[float] = None, **kw) -> T:
    """fn(*args, **kw) on a new thread inside namespace `ns`; its result or
    its exception. Sockets, threads and processes it makes stay in `ns`."""
    out: dict = {}

    def go() -> None:
        try:
            enter(ns)
            out["value"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            out["error"] = e

    t = threading.Thread(target=go, daemon=True, name=f"netns-{ns}")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', fn)} in {ns} still running after {timeout}s")
    if "error" in out:
        raise out["error"]
    return out["value"]


@dataclass
class Fault:
    """One fault in force: how to undo it."""
    what: str
    undo: Callable[[], None]
    healed: bool = False

    def heal(self) -> None:
        if not self.healed:
            self.healed = True
            self.undo()


@dataclass
class Net:
    """The test's namespaces (see the module docstring). `nodes` maps a node
    name to the last octet of its address."""
    nodes: dict[str, int]
    workdir: Path
    name: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}x{next(_counter)}")
    procs: list[subprocess.Popen] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    _queues: itertools.count = field(default_factory=lambda: itertools.count(1))

    # --- names and addresses ---------------------------------------------

    def ns(self, node: str) -> str:
        return f"{self.name}-{node}"

    @property
    def hub(self) -> str:
        return f"{self.name}-hub"

    def addr(self, node: str) -> str:
        return f"{SUBNET}.{self.nodes[node]}"

    # --- life cycle --------------------------------------------------------

    def create(self) -> "Net":
        remove_stale()
        try:
            _sh("ip", "netns", "add", self.hub)
            _sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", self.hub, "link", "set", "br0", "mtu", str(MTU), "up")
            for node, octet in self.nodes.items():
                ns, veth = self.ns(node), f"v{octet}"
                _sh("ip", "netns", "add", ns)
                _sh("ip", "-n", self.hub, "link", "add", veth, "mtu", str(MTU), "type", "veth",
                    "peer", "name", "eth0", "mtu", str(MTU), "netns", ns)
                _sh("ip", "-n", self.hub, "link", "set", veth, "master", "br0", "up")
                _sh("ip", "netns", "exec", ns, "sysctl", "-qw",
                    "net.ipv4.conf.all.route_localnet=1", "net.ipv4.conf.eth0.route_localnet=1",
                    "net.ipv4.conf.default.route_localnet=1")
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _sh("ip", "-n", ns, "addr", "del", "127.0.0.1/8", "dev", "lo")
                _sh("ip", "-n", ns, "addr", "add", "127.0.0.1/32", "dev", "lo")
                _sh("ip", "-n", ns, "addr", "add", f"{self.addr(node)}/24", "dev", "eth0")
                _sh("ip", "-n", ns, "link", "set", "eth0", "up")
                # One chain per direction for the test's rules, so that healing
                # everything is one flush.
                for chain, hook in (("JX-IN", "INPUT"), ("JX-OUT", "OUTPUT")):
                    self.iptables(node, "-N", chain)
                    self.iptables(node, "-A", hook, "-j", chain)
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        for f in self.faults:
            try:
                f.heal()
            except Exception:  # noqa: BLE001 - the namespaces go anyway
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for node in self.nodes:
            _sh("ip", "netns", "del", self.ns(node), check=False)
        _sh("ip", "netns", "del", self.hub, check=False)

    # --- running things inside -----------------------------------------------

    def run_in(self, node: str, fn: Callable[..., T], *args, timeout: Optional[float] = None,
               **kw) -> T:
        return run_in(self.ns(node), fn, *args, timeout=timeout, **kw)

    def popen(self, node: str, cmd: list[str], **kw) -> subprocess.Popen:
        """Start `cmd` inside `node`'s namespace; destroy() kills it."""
        p = self.run_in(node, subprocess.Popen, cmd, **kw)
        self.procs.append(p)
        return p

    def exec(self, node: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return _sh("ip", "netns", "exec", self.ns(node), *cmd, check=check)

    def iptables(self, node: str, *args: str) -> None:
        self.exec(node, iptables_bin(), "-w", *args)

    # --- faults ----------------------------------------------------------------

    def _rules(self, node: str, peer: str, target: list[str], what: str,
               target_in: Optional[list[str]] = None) -> Fault:
        """A rule for packets to `peer` and one for packets from it (the
        same target unless `target_in` is given), in `node`'s namespace."""
        paddr = self.addr(peer)
        specs = [("JX-OUT", "-d", paddr, target), ("JX-IN", "-s", paddr, target_in or target)]
        for chain, flag, a, t in specs:
            self.iptables(node, "-A", chain, flag, a, *t)

        def undo() -> None:
            for chain, flag, a, t in specs:
                self.exec(node, iptables_bin(), "-w", "-D", chain, flag, a, *t, check=False)

        f = Fault(what, undo)
        self.faults.append(f)
        return f

    def partition(self, a: str, b: str, mode: str = "drop") -> Fault:
        """No packet between a and b (rules in a's namespace). `drop`:
        silently; `reject`: TCP resets, so both ends learn at once."""
        if mode == "drop":
            return self._rules(a, b, ["-j", "DROP"], f"partition {a}|{b} (drop)")
        if mode == "reject":
            # A reset the OUTPUT rule answers a's own packet with comes back
            # in from b's address: it must pass the INPUT rule.
            reject = ["-j", "REJECT", "--reject-with", "tcp-reset"]
            return self._rules(a, b, ["-p", "tcp", *reject], f"partition {a}|{b} (reject)",
                               target_in=["-p", "tcp", "!", "--tcp-flags", "RST", "RST",
                                          *reject])
        raise ValueError(mode)

    def loss(self, a: str, b: str, probability: float) -> Fault:
        """Each packet between a and b dropped with `probability`."""
        return self._rules(a, b, ["-m", "statistic", "--mode", "random", "--probability",
                                  f"{probability:.3f}", "-j", "DROP"],
                           f"loss {a}|{b} {probability:.0%}")

    def delay(self, a: str, b: str, delay_ms: float, jitter_ms: float = 0.0,
              reorder: float = 0.0, seed: int = 0) -> Fault:
        """Packets between a and b held `delay_ms ± jitter_ms` (nfq_delay.py
        in a's namespace)."""
        queue = next(self._queues)
        log = self.workdir / f"nfq-{self.ns(a)}-{queue}.log"
        out = open(log, "w")
        proc = self.popen(a, [sys.executable, str(HERE / "nfq_delay.py"), "--queue", str(queue),
                              "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms),
                              "--reorder", str(reorder), "--seed", str(seed)],
                          stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while "ready" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nfq_delay.py did not start:\n{log.read_text()}")
            time.sleep(0.02)
        rules = self._rules(a, b, ["-j", "NFQUEUE", "--queue-num", str(queue),
                                   "--queue-bypass"], "")
        self.faults.remove(rules)

        def undo() -> None:
            rules.heal()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            out.close()

        f = Fault(f"delay {a}|{b} {delay_ms:.0f}±{jitter_ms:.0f} ms", undo)
        self.faults.append(f)
        return f

    def slow(self, node: str, rate_kbit: int) -> Fault:
        """Everything `node` sends limited to `rate_kbit` (tbf on its veth)."""
        self.exec(node, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                  f"{rate_kbit}kbit", "burst", f"{MTU * 2}", "latency", "500ms")

        def undo() -> None:
            self.exec(node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

        f = Fault(f"slow {node} {rate_kbit} kbit/s", undo)
        self.faults.append(f)
        return f

    def heal_all(self) -> None:
        for f in self.faults:
            f.heal()
        self.faults.clear()
