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
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from dataclasses import dataclass, field

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

    def log(self, line: str) -> None:
        line = f"[jepsen {self.seed}] +{time.monotonic() - self.t0:6.1f}s {line}"
        self.events.append(line)
        print(line, flush=True)

    def apply(self, f: dict) -> list[ns.Fault]:
        kind = f["kind"]
        if kind in ("partition-proxy-broker", "partition-client-proxy"):
            return [self.net.partition(f["a"], f["b"], f["mode"])]
        if kind == "partition-proxy-dlt":
            dlt = self.topics[2 + f["dlt"]]
            leader = self.cluster.ctl(self.cluster.leaders, dlt, timeout=30)[0]
            self.log(f"  {dlt} is led by node {leader}")
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
            proxy.kill()
            return [ns.Fault(f"restart {f['proxy']}", proxy.start)]
        if kind == "kill-member":
            members = self.work.members()
            name = members[f["pick"] % len(members)]
            self.log(f"  killing member {name}")
            self.work.kill_member(name)
            return [ns.Fault(f"restart {name}", lambda: self.work.restart_member(name))]
        raise ValueError(kind)

    def play(self, stop: threading.Event) -> None:
        self.t0 = time.monotonic()
        for step in self.steps:
            if stop.wait(max(0.0, self.t0 + step.at - time.monotonic())):
                return
            self.log(f"apply {step}")
            active: list[ns.Fault] = []
            try:
                for f in step.faults:
                    active += self.apply(f)
                stop.wait(step.hold)
            except Exception:  # noqa: BLE001 - reported by the test, faults healed below
                self.error += traceback.format_exc()
                self.log(f"  error: {traceback.format_exc().splitlines()[-1]}")
            finally:
                for a in active:
                    try:
                        a.heal()
                    except Exception:  # noqa: BLE001
                        self.error += traceback.format_exc()
                self.log("  healed")
            if self.error:
                return


def kinds_of(steps: list[Step]) -> list[str]:
    return sorted({f["kind"] for s in steps for f in s.faults})

