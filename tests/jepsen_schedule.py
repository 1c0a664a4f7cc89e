"""Randomized fault schedules of the network-fault runs (test_jepsen.py):
made from a seed (the same seed, the same schedule), printed, and played
against the namespaced cluster, proxies and clients.

A schedule is a list of steps; each step starts at a time after the run's
start, applies one fault (a second one alongside in about a third of the
steps), holds them, and heals them. Every fault kind appears at least once
per schedule (their order shuffled), then more steps at random fill the
run's duration:

  partition-proxy-broker   one proxy cut off from one broker (drop | reject)
  partition-proxy-dlt      one proxy cut off from the broker that leads a
                           DLT's partition at that moment
  partition-client-proxy   one client host cut off from one proxy
  loss                     random packet loss between a proxy and a broker
                           or a client host and a proxy (5-30 %)
  delay                    the same pairs, 50-400 ms ± jitter, reordered
  slow                     one proxy or broker's sending rate limited (tbf)
  leader-move              a partition's leader moved (reassignment and a
                           preferred election), of a topic or a DLT
  kill-proxy               one proxy SIGKILLed, restarted after the hold
  kill-member              one group member SIGKILLed, restarted after the
                           hold: its partitions move to the member on the
                           other proxy once its session expires, and back

What a seed fixes is the schedule, not the interleaving: the same seed
replays the same faults at the same times against the same workload.

The player keeps, for the checker, each fault's window (wall-clock millis
from its apply to its heal) and the nodes or member it touched
(`Player.windows`), and what each fault's proof saw (`Player.proofs`); a
fault whose proof fails (netns_support.NoEffect: its rules matched nothing
on a link that carried traffic, its delay process delayed nothing or died)
is listed in `Player.ineffective` and ends the schedule. A kill step that
finds its proxy or member already exited is an error: that process
crashed by itself, and restarting it would hide the crash.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

import netns_support as ns

KINDS = ("partition-proxy-broker", "partition-proxy-dlt", "partition-client-proxy", "loss",
         "delay", "slow", "leader-move", "kill-proxy", "kill-member")
# May run alongside another fault of the same step.
SIDE_KINDS = ("partition-proxy-broker", "partition-proxy-dlt", "partition-client-proxy", "loss",
              "delay", "kill-member")
PROXIES = ("p1", "p2")
BROKERS = ("b1", "b2", "b3")
CLIENTS = ("c1", "c2")


@dataclass
class Step:
    at: float
    hold: float
    faults: list[dict]

    def __str__(self) -> str:
        return f"t={self.at:5.1f}s hold {self.hold:4.1f}s: " + " + ".join(
            describe(f) for f in self.faults)


def describe(f: dict) -> str:
    args = " ".join(f"{k}={v}" for k, v in f.items() if k != "kind")
    return f"{f['kind']}({args})"


def _pair(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.6:
        return rng.choice(PROXIES), rng.choice(BROKERS)
    return rng.choice(CLIENTS), rng.choice(PROXIES)


def make_fault(rng: random.Random, kind: str) -> dict:
    mode = rng.choice(("drop", "reject"))
    if kind == "partition-proxy-broker":
        return {"kind": kind, "a": rng.choice(PROXIES), "b": rng.choice(BROKERS), "mode": mode}
    if kind == "partition-proxy-dlt":
        return {"kind": kind, "a": rng.choice(PROXIES), "dlt": rng.randrange(2), "mode": mode}
    if kind == "partition-client-proxy":
        return {"kind": kind, "a": rng.choice(CLIENTS), "b": rng.choice(PROXIES), "mode": mode}
    if kind == "loss":
        a, b = _pair(rng)
        return {"kind": kind, "a": a, "b": b, "p": round(rng.uniform(0.05, 0.3), 2)}
    if kind == "delay":
        a, b = _pair(rng)
        d = rng.randrange(50, 400)
        return {"kind": kind, "a": a, "b": b, "ms": d, "jitter": rng.randrange(0, d // 2 + 1),
                "reorder": round(rng.uniform(0, 0.25), 2)}
    if kind == "slow":
        return {"kind": kind, "node": rng.choice(PROXIES + BROKERS),
                "kbit": rng.choice((2000, 4000, 8000))}
    if kind == "leader-move":
        return {"kind": kind, "topic": rng.randrange(4), "pick": rng.randrange(1 << 16)}
    if kind == "kill-proxy":
        return {"kind": kind, "proxy": rng.choice(PROXIES)}
    if kind == "kill-member":
        return {"kind": kind, "pick": rng.randrange(1 << 16)}
    raise ValueError(kind)


def make_schedule(seed: int, duration: float) -> list[Step]:
    rng = random.Random(seed)
    todo = list(KINDS)
    rng.shuffle(todo)
    steps, t = [], 8.0
    while todo or t < duration:
        kind = todo.pop() if todo else rng.choice(KINDS)
        faults = [make_fault(rng, kind)]
        if rng.random() < 0.35:
            faults.append(make_fault(rng, rng.choice(SIDE_KINDS)))
        hold = round(rng.uniform(3, 12), 1)
        steps.append(Step(round(t, 1), hold, faults))
        t += hold + rng.uniform(1, 3)
    return steps


@dataclass
class Player:
    """Plays a schedule in a thread of its own. `topics` are the run's
    topics then their DLTs: [plain, keyed, plain.dlt, keyed.dlt]."""
    net: ns.Net
    cluster: object
    proxies: dict
    topics: list[str]
    steps: list[Step]
    seed: int
    work: object = None  # jepsen_support.Workload: its members
    events: list[str] = field(default_factory=list)
    error: str = ""
    t0: float = 0.0
    windows: list[dict] = field(default_factory=list)
    # (kind, fault, proof held, packets acted on, packets on its link, what it saw)
    proofs: list[tuple[str, str, Optional[bool], int, int, str]] = field(default_factory=list)
    ineffective: list[str] = field(default_factory=list)
    killed_proxies: dict = field(default_factory=dict)

    def log(self, line: str) -> None:
        line = f"[jepsen {self.seed}] +{time.monotonic() - self.t0:6.1f}s {line}"
        self.events.append(line)
        print(line, flush=True)

    def apply(self, f: dict, touched: dict) -> list[ns.Fault]:
        """Apply fault `f`; note in `touched` the nodes (and member) it hits."""
        kind = f["kind"]
        touched["nodes"] = [f[k] for k in ("a", "b", "node", "proxy") if k in f]
        if kind in ("partition-proxy-broker", "partition-client-proxy"):
            return [self.net.partition(f["a"], f["b"], f["mode"])]
        if kind == "partition-proxy-dlt":
            dlt = self.topics[2 + f["dlt"]]
            leader = self.cluster.ctl(self.cluster.leaders, dlt, timeout=30)[0]
            self.log(f"  {dlt} is led by node {leader}")
            touched["nodes"].append(f"b{leader}")
            return [self.net.partition(f["a"], f"b{leader}", f["mode"])]
        if kind == "loss":
            return [self.net.loss(f["a"], f["b"], f["p"])]
        if kind == "delay":
            return [self.net.delay(f["a"], f["b"], f["ms"], f["jitter"], f["reorder"],
                                   seed=self.seed)]
        if kind == "slow":
            return [self.net.slow(f["node"], f["kbit"])]
        if kind == "leader-move":
            topic = self.topics[f["topic"]]
            parts = self.cluster.ctl(self.cluster.describe, topic, timeout=30)
            p = f["pick"] % len(parts)
            leader, replicas, _ = parts[p]
            others = [r for r in replicas if r != leader]
            to = others[f["pick"] % len(others)]
            self.log(f"  moving {topic}-{p} from node {leader} to {to}")
            self.cluster.ctl(self.cluster.move_leader, topic, p, to, 60, timeout=90)
            return []
        if kind == "kill-proxy":
            proxy = self.proxies[f["proxy"]]
            if proxy.proc is None or proxy.proc.poll() is not None:
                raise RuntimeError(f"proxy {f['proxy']} had exited by itself (code "
                                   f"{proxy.proc and proxy.proc.returncode}) before its kill "
                                   f"step: a crash, not restarted")
            proxy.kill()
            self.killed_proxies[f["proxy"]] = self.killed_proxies.get(f["proxy"], 0) + 1
            return [ns.Fault(f"restart {f['proxy']}", proxy.start)]
        if kind == "kill-member":
            members = self.work.members()
            name = members[f["pick"] % len(members)]
            self.log(f"  killing member {name}")
            touched["member"] = name
            self.work.kill_member(name)
            return [ns.Fault(f"restart {name}", lambda: self.work.restart_member(name))]
        raise ValueError(kind)

    def hold(self, stop: threading.Event, seconds: float, active: list[ns.Fault]) -> None:
        """Wait `seconds` (or until stopped), checking the faults in force."""
        end = time.monotonic() + seconds
        while not stop.wait(max(0.0, min(0.5, end - time.monotonic()))):
            for a in active:
                bad = a.check()
                if bad:
                    raise RuntimeError(f"{a.what}: {bad}")
            if time.monotonic() >= end:
                return

    def play(self, stop: threading.Event) -> None:
        self.t0 = time.monotonic()
        for step in self.steps:
            if stop.wait(max(0.0, self.t0 + step.at - time.monotonic())):
                return
            self.log(f"apply {step}")
            active: list[tuple[ns.Fault, dict]] = []
            touched_all: list[dict] = []
            try:
                for f in step.faults:
                    touched = {"what": describe(f), "kind": f["kind"],
                               "from_ms": int(time.time() * 1000)}
                    touched_all.append(touched)
                    active += [(a, touched) for a in self.apply(f, touched)]
                self.hold(stop, step.hold, [a for a, _ in active])
            except Exception:  # noqa: BLE001 - reported by the test, faults healed below
                self.error += traceback.format_exc()
                self.log(f"  error: {traceback.format_exc().splitlines()[-1]}")
            finally:
                for a, touched in active:
                    try:
                        a.heal()
                    except ns.NoEffect as e:
                        self.ineffective.append(f"{touched['what']}: {e}")
                    except Exception:  # noqa: BLE001
                        self.error += traceback.format_exc()
                    if a.proof is not None:
                        self.proofs.append((touched["kind"], a.what, a.effective, a.matched,
                                            a.traffic, a.seen))
                        self.log(f"  {a.what}: {a.seen}")
                now = int(time.time() * 1000)
                for touched in touched_all:
                    self.windows.append({**touched, "to_ms": now})
                self.log("  healed")
            if self.error or self.ineffective:
                return


# Kinds whose faults prove themselves with counters (netns_support.Fault.proof).
COUNTED = ("partition-proxy-broker", "partition-proxy-dlt", "partition-client-proxy", "loss",
           "delay", "slow")


def unexercised(windows: list[dict], proofs: list) -> list[str]:
    """Counted kinds played (Player.windows) whose faults all met an idle
    link: none carried a packet while it held, so none was shown to act.
    (A fault on a busy link that acted on nothing fails its own proof; a
    loss fault on a link too quiet for a drop to be sure is not held
    against its kind.)"""
    busy = {kind for kind, _what, _ok, matched, traffic, _seen in proofs
            if matched > 0 or traffic > 0}
    return sorted({w["kind"] for w in windows if w["kind"] in COUNTED} - busy)


def kinds_of(steps: list[Step]) -> list[str]:
    return sorted({f["kind"] for s in steps for f in s.faults})

