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

Faults, all started and undone by the test; each proves, before it is
undone, that it took effect (`Fault.proof`, read before the undo; a fault
whose proof fails raises `NoEffect` once undone):

- partition (`drop`: packets vanish, connections hang until a timeout;
  `reject`: TCP resets, connections fail at once): iptables rules in a
  chain of the first node's namespace, for the other node's address, both
  directions. Each fault rule follows a counting rule for the same
  packets (no target), both tagged with a comment; if the counting rules
  saw packets on the link during the fault, the fault rules' packet
  counters must be non-zero;
- loss: the same with `-m statistic --mode random --probability P`; its
  counters must be non-zero once the link carried enough packets that no
  drop at all has a chance under 1e-4;
- delay and reordering: the kernel has no `netem` qdisc, so packets of the
  link go to an NFQUEUE queue (no `--queue-bypass`: if the queue's reader
  is gone, the link is cut, never silently undelayed) that `nfq_delay.py`
  (run in the node's namespace) releases after `delay ± jitter` (packets
  overtake each other with a jitter). It prints `ready` only once the
  kernel acknowledged its bind; it is watched while the fault holds
  (`Fault.check`), and the number of packets it delayed (asked with
  SIGUSR1 before the undo) must be non-zero when the rule's counters are;
- a slow link: a `tbf` qdisc (rate limit) on the node's veth; its counters
  (`tc -s`) must show packets sent through it.

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
import math
import os
import re
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


class NoEffect(AssertionError):
    """A fault whose counters show it did nothing to traffic that was there."""


@dataclass
class Fault:
    """One fault in force: how to undo it, and how it proves it took effect.
    `proof()` (read before the undo) returns (ok, what it saw, how many
    packets the fault acted on, how many its link carried); `check()`
    (called while the fault holds) returns an error text or None."""
    what: str
    undo: Callable[[], None]
    healed: bool = False
    proof: Optional[Callable[[], tuple[bool, str, int, int]]] = None
    check: Callable[[], Optional[str]] = lambda: None
    counts: Optional[Callable[[], tuple[int, int]]] = None  # (link's packets, matched)
    seen: str = ""          # what the proof saw
    effective: Optional[bool] = None
    matched: int = -1       # packets the fault acted on (-1: no proof read)
    traffic: int = -1       # packets on the fault's link meanwhile (-1: no proof read)

    def heal(self) -> None:
        if self.healed:
            return
        self.healed = True
        error = None
        if self.proof is not None:
            try:
                self.effective, self.seen, self.matched, self.traffic = self.proof()
            except Exception as e:  # noqa: BLE001 - the undo must run anyway
                self.effective, self.seen = False, f"proof failed: {e!r}"
            if not self.effective:
                error = NoEffect(f"{self.what}: no effect: {self.seen}")
        self.undo()
        if error is not None:
            raise error


_rule_ids = itertools.count(1)
LOSS_NONE_CHANCE = 1e-4   # a loss fault's counters must be non-zero once no drop is this unlikely


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

    def counters(self, node: str) -> dict[str, int]:
        """Packets matched by each of the test's rules in `node`, by comment."""
        out: dict[str, int] = {}
        for chain in ("JX-OUT", "JX-IN"):
            r = self.exec(node, iptables_bin(), "-w", "-L", chain, "-v", "-x", "-n")
            for line in r.stdout.splitlines():
                m = re.match(r"\s*(\d+)\s+\d+\s.*/\* (jx\S+) \*/", line)
                if m:
                    out[m.group(2)] = int(m.group(1))
        return out

    def _rules(self, node: str, peer: str, target: list[str], what: str,
               target_in: Optional[list[str]] = None, min_traffic: int = 1) -> Fault:
        """A rule for packets to `peer` and one for packets from it (the
        same target unless `target_in` is given), in `node`'s namespace,
        each after a rule that only counts the link's packets. Its proof:
        once the counting rules saw `min_traffic` packets, the fault's rules
        must have matched some."""
        paddr, n = self.addr(peer), next(_rule_ids)
        specs = []
        for chain, flag, t in (("JX-OUT", "-d", target), ("JX-IN", "-s", target_in or target)):
            d = chain[3:].lower()
            specs += [(chain, flag, paddr, ["-m", "comment", "--comment", f"jx{n}c{d}"]),
                      (chain, flag, paddr, ["-m", "comment", "--comment", f"jx{n}f{d}", *t])]
        for chain, flag, a, t in specs:
            self.iptables(node, "-A", chain, flag, a, *t)

        def undo() -> None:
            for chain, flag, a, t in specs:
                self.exec(node, iptables_bin(), "-w", "-D", chain, flag, a, *t, check=False)

        def counts() -> tuple[int, int]:
            c = self.counters(node)
            return (c.get(f"jx{n}cout", 0) + c.get(f"jx{n}cin", 0),
                    c.get(f"jx{n}fout", 0) + c.get(f"jx{n}fin", 0))

        def proof() -> tuple[bool, str, int, int]:
            traffic, hits = counts()
            return (hits > 0 or traffic < min_traffic,
                    f"{traffic} packets on the link, {hits} matched the fault's rules", hits,
                    traffic)

        f = Fault(what, undo, proof=proof, counts=counts)
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
        enough = math.ceil(math.log(LOSS_NONE_CHANCE) / math.log(1 - probability))
        return self._rules(a, b, ["-m", "statistic", "--mode", "random", "--probability",
                                  f"{probability:.3f}", "-j", "DROP"],
                           f"loss {a}|{b} {probability:.0%}", min_traffic=enough)

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
                if proc.poll() is None:
                    proc.kill()
                raise RuntimeError(f"nfq_delay.py did not bind queue {queue}:\n"
                                   f"{log.read_text()}")
            time.sleep(0.02)
        # No --queue-bypass: with its reader gone the queue drops the link's
        # packets (and check() says so), rather than let them pass undelayed.
        rules = self._rules(a, b, ["-j", "NFQUEUE", "--queue-num", str(queue)], "")
        self.faults.remove(rules)

        def delayed() -> int:
            """The count nfq_delay.py gives on SIGUSR1."""
            before = log.read_text().count("count ")
            proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                lines = [ln for ln in log.read_text().splitlines() if ln.startswith("count ")]
                if len(lines) > before:
                    return int(lines[-1].split()[1])
                time.sleep(0.02)
            raise RuntimeError(f"nfq_delay.py gave no count:\n{log.read_text()[-2000:]}")

        def check() -> Optional[str]:
            if proc.poll() is not None:
                return (f"nfq_delay.py (queue {queue}) exited with {proc.returncode}:\n"
                        f"{log.read_text()[-2000:]}")
            return None

        def proof() -> tuple[bool, str, int, int]:
            dead = check()
            if dead:
                return False, dead, 0, 0
            traffic, hits = rules.counts()
            n = delayed()
            return (traffic == 0 or (hits > 0 and n > 0),
                    f"{traffic} packets on the link, {hits} queued, {n} delayed by "
                    f"nfq_delay.py", min(hits, n), traffic)

        def undo() -> None:
            rules.undo()
            rules.healed = True
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
            out.close()

        f = Fault(f"delay {a}|{b} {delay_ms:.0f}±{jitter_ms:.0f} ms", undo, proof=proof,
                  check=check)
        self.faults.append(f)
        return f

    def slow(self, node: str, rate_kbit: int) -> Fault:
        """Everything `node` sends limited to `rate_kbit` (tbf on its veth)."""
        self.exec(node, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                  f"{rate_kbit}kbit", "burst", f"{MTU * 2}", "latency", "500ms")

        def undo() -> None:
            self.exec(node, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)

        def proof() -> tuple[bool, str, int, int]:
            text = self.exec(node, "tc", "-s", "qdisc", "show", "dev", "eth0").stdout
            m = re.search(r"tbf .*?Sent (\d+) bytes (\d+) pkt \(dropped (\d+), "
                          r"overlimits (\d+)", text, re.S)
            if not m:
                return False, f"no tbf qdisc on {node}'s eth0: {text.strip()}", 0, 0
            n = int(m.group(2))
            return n > 0, f"{n} packets sent through tbf, {m.group(4)} over its rate", n, n

        f = Fault(f"slow {node} {rate_kbit} kbit/s", undo, proof=proof)
        self.faults.append(f)
        return f

    def heal_all(self) -> list[str]:
        """Undo every fault still in force; what their proofs said if one
        had no effect (after a failure, the rest are undone all the same)."""
        errors = []
        for f in self.faults:
            try:
                f.heal()
            except NoEffect as e:
                errors.append(str(e))
        self.faults.clear()
        return errors
