"""The checker of the network-fault runs (test_jepsen.py): a pure function
from a run's whole history to its anomalies. No I/O here; the test reads
the logs, the producers' and consumers' histories and the DLTs
(jepsen_support.build_history), and hands them over as plain values (so
the checker is tested on made-up histories too: test_jepsen.py's
`test_the_checker_finds_each_anomaly`).

What it checks, for every topic of the run:

- every record a producer sent has an outcome: acknowledged, refused (the
  error's name) or none within the producer's flush (`timeout`); a valid
  record refused (`valid-refused`: a door that refuses valid records with
  INVALID_RECORD, or any other final error) or left without an outcome
  (`valid-unacknowledged`) is lost to its producer;
- every acknowledged record is in the log, at the offset the
  acknowledgement named, with the producer's id (`acked-not-in-log`);
- no poison record produced through the door (the proxy) is in the log or
  acknowledged (`door-leak`), and the door refused each one it answered
  with INVALID_RECORD (`door-refusal-error`); no record is in the log twice
  (`duplicate-in-log`: the producers are idempotent);
- the records each group must read: every valid record in the log, but,
  under `ordering: per_key`, not the records of a key that come after its
  first poison record in the same partition (those are `blocked`); every
  group read each of them at least once (`lost`), read no poison and no
  blocked record (`leaked`), read at each position the record the log holds
  there (`wrong-record`) and nothing the log does not hold
  (`delivery-not-in-log`), and read each partition's records for the first
  time in offset order (`reordered`; per key under per_key follows);
- a group read a record a second time only if, between the two reads, the
  group had a rebalance, one of its members or proxies was killed, or a
  link of one of its members' hosts or proxies was faulted
  (`redelivered`; `History.excuses`);
- the DLT of each topic holds every poison record of the log (and, under
  per_key, every blocked one) exactly once, with the class it should have
  (`dlt-missing`, `dlt-duplicate`, `dlt-extra`, `dlt-class`), and with the
  bytes of the record it names: key, value, original headers and record id
  (`dlt-wrong-record`; class `redact` and rule `batch` keep no such bytes);
- after the faults healed, each group had read everything within the
  stated bound (`slow-recovery`), and no proxy held a partition past it
  (`held-after-heal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# (topic, partition, offset)
Pos = tuple[str, int, int]
Headers = tuple[tuple[str, Optional[bytes]], ...]


@dataclass(frozen=True)
class LogRec:
    topic: str
    partition: int
    offset: int
    key: Optional[bytes]
    rid: str           # the producer's record id ("?" if none)
    kind: str          # "valid" or a poison kind
    value: Optional[bytes] = None
    headers: Headers = ()


@dataclass(frozen=True)
class DltRec:
    topic: str         # x-original-topic
    partition: int
    offset: int
    klass: str         # x-error-class
    rule: str = ""     # x-error-rule
    key: Optional[bytes] = None
    value: Optional[bytes] = None
    headers: Headers = ()   # the original record's headers (the DLT's own x-* removed)
    rid: str = "?"     # the jx-id header the DLT record carries


@dataclass(frozen=True)
class Outcome:
    """What a producer learnt of one record it sent."""
    rid: str
    topic: str
    kind: str          # "valid" or a poison kind
    door: bool         # sent through a proxy (whose door judges it)
    result: str        # "ack", an error name (a refusal), or "timeout" (no answer)
    partition: int = -1
    offset: int = -1


@dataclass(frozen=True)
class Delivery:
    topic: str
    partition: int
    offset: int
    rid: str
    ms: int = 0        # wall clock of the delivery
    member: str = ""


# (from ms, to ms, what): a window in which a group may read a record again.
Excuse = tuple[int, int, str]


@dataclass
class History:
    log: list[LogRec]
    produced: list[Outcome]
    deliveries: dict[str, list[Delivery]]   # group -> its reads, in time order
    dlt: list[DltRec]
    per_key_topics: set[str]
    excuses: dict[str, list[Excuse]] = field(default_factory=dict)  # group -> windows
    recovery_s: dict[str, float] = field(default_factory=dict)   # group -> s after heal
    held_after_s: dict[str, float] = field(default_factory=dict)  # proxy -> s held after heal
    bound_s: float = 60.0
    # Slack around an excuse's window: clocks of a member's lines and the
    # player's differ by a little.
    excuse_slack_ms: int = 1000


@dataclass
class Anomaly:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def _sample(xs, n: int = 8) -> str:
    xs = sorted(xs, key=repr)
    return f"{xs[:n]}{' ...' if len(xs) > n else ''} ({len(xs)})"


def expected(h: History) -> tuple[dict[Pos, LogRec], dict[Pos, str]]:
    """(records every group must read, records that belong in a DLT with
    their class)."""
    must: dict[Pos, LogRec] = {}
    dlt: dict[Pos, str] = {}
    blocked_keys: set[tuple[str, int, Optional[bytes]]] = set()
    for r in sorted(h.log, key=lambda r: (r.topic, r.partition, r.offset)):
        pos = (r.topic, r.partition, r.offset)
        kk = (r.topic, r.partition, r.key)
        per_key = r.topic in h.per_key_topics and r.key is not None
        if per_key and kk in blocked_keys:
            dlt[pos] = "blocked"
        elif r.kind != "valid":
            dlt[pos] = "poison"
            if per_key:
                blocked_keys.add(kk)
        else:
            must[pos] = r
    return must, dlt


def _producers(h: History, by_pos: dict[Pos, LogRec]) -> list[Anomaly]:
    out: list[Anomaly] = []
    acked = [o for o in h.produced if o.result == "ack"]
    bad = [(o.rid, o.topic, o.partition, o.offset) for o in acked
           if (o.topic, o.partition, o.offset) not in by_pos
           or by_pos[(o.topic, o.partition, o.offset)].rid != o.rid]
    if bad:
        out.append(Anomaly("acked-not-in-log", _sample(bad)))
    refused = [(o.rid, o.result) for o in h.produced
               if o.kind == "valid" and o.result not in ("ack", "timeout")]
    if refused:
        out.append(Anomaly("valid-refused", _sample(refused)))
    unacked = [o.rid for o in h.produced if o.kind == "valid" and o.result == "timeout"]
    if unacked:
        out.append(Anomaly("valid-unacknowledged", _sample(unacked)))
    door_poison = [o for o in h.produced if o.door and o.kind != "valid"]
    door_rids = {o.rid for o in door_poison}
    leak = sorted({r.rid for r in h.log if r.rid in door_rids}
                  | {o.rid for o in door_poison if o.result == "ack"})
    if leak:
        out.append(Anomaly("door-leak", _sample(leak)))
    wrong = [(o.rid, o.result) for o in door_poison
             if o.result not in ("ack", "timeout", "INVALID_RECORD")]
    if wrong:
        out.append(Anomaly("door-refusal-error", _sample(wrong)))
    return out


def _excused(h: History, group: str, t1: int, t2: int) -> bool:
    s = h.excuse_slack_ms
    return any(a - s <= t2 and t1 <= b + s for a, b, _ in h.excuses.get(group, ()))


def _groups(h: History, by_pos: dict[Pos, LogRec], must: dict[Pos, LogRec],
            dlt_want: dict[Pos, str]) -> list[Anomaly]:
    out: list[Anomaly] = []
    for group, ds in sorted(h.deliveries.items()):
        got = {(d.topic, d.partition, d.offset) for d in ds}
        # Read is what was read at its position with the log's record id
        # there: a wrong record in its place leaves the right one lost.
        right = {(d.topic, d.partition, d.offset) for d in ds
                 if (d.topic, d.partition, d.offset) in must
                 and must[(d.topic, d.partition, d.offset)].rid == d.rid}
        missing = set(must) - right
        if missing:
            out.append(Anomaly("lost", f"group {group}: {_sample(missing)}"))
        leaked = got & set(dlt_want)
        if leaked:
            out.append(Anomaly("leaked", f"group {group}: {_sample(leaked)}"))
        wrong = [(d.topic, d.partition, d.offset, d.rid) for d in ds
                 if (d.topic, d.partition, d.offset) in by_pos
                 and by_pos[(d.topic, d.partition, d.offset)].rid != d.rid]
        if wrong:
            out.append(Anomaly("wrong-record", f"group {group}: {_sample(wrong)}"))
        phantom = got - set(by_pos)
        if phantom:
            out.append(Anomaly("delivery-not-in-log", f"group {group}: {_sample(phantom)}"))
        first: dict[tuple[str, int], list[int]] = {}
        first_ms: dict[Pos, Delivery] = {}
        again = []
        for d in ds:
            pos = (d.topic, d.partition, d.offset)
            if pos not in first_ms:
                first_ms[pos] = d
                first.setdefault((d.topic, d.partition), []).append(d.offset)
            elif not _excused(h, group, first_ms[pos].ms, d.ms):
                again.append((pos, first_ms[pos].member, first_ms[pos].ms, d.member, d.ms))
        back = [(tp, a, b) for tp, offs in first.items()
                for a, b in zip(offs, offs[1:]) if b < a]
        if back:
            out.append(Anomaly("reordered", f"group {group}: first read {_sample(back)}"))
        if again:
            out.append(Anomaly("redelivered", f"group {group}, with no rebalance, kill or "
                                              f"fault of its own between the reads "
                                              f"(pos, member, ms, member, ms): {_sample(again)}"))
    return out


def _dlts(h: History, by_pos: dict[Pos, LogRec], dlt_want: dict[Pos, str]) -> list[Anomaly]:
    out: list[Anomaly] = []
    counts: dict[Pos, list[DltRec]] = {}
    for d in h.dlt:
        counts.setdefault((d.topic, d.partition, d.offset), []).append(d)
    missing = set(dlt_want) - set(counts)
    if missing:
        out.append(Anomaly("dlt-missing", _sample(missing)))
    extra = set(counts) - set(dlt_want)
    if extra:
        out.append(Anomaly("dlt-extra", _sample(extra)))
    dup = [pos for pos, ds in counts.items() if len(ds) > 1]
    if dup:
        out.append(Anomaly("dlt-duplicate", _sample(dup)))
    klass = [(pos, ds[0].klass, dlt_want[pos]) for pos, ds in counts.items()
             if pos in dlt_want and ds[0].klass != dlt_want[pos]]
    if klass:
        out.append(Anomaly("dlt-class", _sample(klass)))
    wrong = []
    for pos, ds in counts.items():
        r = by_pos.get(pos)
        if r is None:
            continue
        for d in ds:
            if d.klass == "redact" or d.rule == "batch":
                continue
            diff = [what for what, a, b in (("id", d.rid, r.rid), ("key", d.key, r.key),
                                            ("value", d.value, r.value),
                                            ("headers", d.headers, r.headers)) if a != b]
            if diff:
                wrong.append((pos, r.rid, d.rid, "+".join(diff)))
    if wrong:
        out.append(Anomaly("dlt-wrong-record", f"(pos, log id, DLT id, differs in): "
                                               f"{_sample(wrong)}"))
    return out


def check(h: History) -> list[Anomaly]:
    by_pos = {(r.topic, r.partition, r.offset): r for r in h.log}
    out = _producers(h, by_pos)
    seen: dict[str, int] = {}
    for r in h.log:
        seen[r.rid] = seen.get(r.rid, 0) + 1
    dups = [rid for rid, n in seen.items() if n > 1 and rid != "?"]
    if dups:
        out.append(Anomaly("duplicate-in-log", _sample(dups)))
    must, dlt_want = expected(h)
    out += _groups(h, by_pos, must, dlt_want)
    out += _dlts(h, by_pos, dlt_want)
    slow = {g: s for g, s in h.recovery_s.items() if s > h.bound_s}
    if slow:
        out.append(Anomaly("slow-recovery", f"groups past the {h.bound_s:.0f} s bound: {slow}"))
    held = {p: s for p, s in h.held_after_s.items() if s > h.bound_s}
    if held:
        out.append(Anomaly("held-after-heal", f"proxies past the {h.bound_s:.0f} s bound: {held}"))
    return out


@dataclass(frozen=True)
class Minimums:
    """The least activity a run must show, or it proved little."""
    acks_per_producer: int = 100
    door_refusals_per_door: int = 3
    dlt_writes: int = 10
    blocked: int = 1


def activity(h: History) -> dict:
    must, dlt_want = expected(h)
    acks: dict[str, int] = {}
    refusals: dict[str, int] = {}
    for o in h.produced:
        tag = o.rid.rsplit("-", 1)[0]
        acks.setdefault(tag, 0)
        if o.result == "ack":
            acks[tag] += 1
        if o.door:
            refusals.setdefault(tag, 0)
            if o.kind != "valid" and o.result == "INVALID_RECORD":
                refusals[tag] += 1
    return {"acks": acks, "door_refusals": refusals, "dlt_writes": len(h.dlt),
            "blocked": sum(1 for k in dlt_want.values() if k == "blocked")}


def too_little(h: History, m: Minimums) -> list[Anomaly]:
    """A run under its minimums is an anomaly of its own (`too-little`)."""
    a = activity(h)
    short = [f"acks of {p}: {n} < {m.acks_per_producer}" for p, n in a["acks"].items()
             if n < m.acks_per_producer]
    short += [f"door refusals of {p}: {n} < {m.door_refusals_per_door}"
              for p, n in a["door_refusals"].items() if n < m.door_refusals_per_door]
    if not a["acks"]:
        short.append("no producer outcome at all")
    if a["dlt_writes"] < m.dlt_writes:
        short.append(f"DLT writes: {a['dlt_writes']} < {m.dlt_writes}")
    if a["blocked"] < m.blocked:
        short.append(f"blocked records: {a['blocked']} < {m.blocked}")
    return [Anomaly("too-little", "; ".join(short))] if short else []


def summary(h: History) -> dict:
    must, dlt_want = expected(h)
    return {"log": len(h.log), "produced": len(h.produced),
            "acked": sum(1 for o in h.produced if o.result == "ack"),
            "must_read": len(must), "dlt_want": len(dlt_want), "dlt": len(h.dlt),
            **activity(h),
            "deliveries": {g: len(ds) for g, ds in h.deliveries.items()},
            "excuses": {g: len(e) for g, e in h.excuses.items()},
            "recovery_s": {g: round(s, 1) for g, s in h.recovery_s.items()},
            "held_after_s": {p: round(s, 1) for p, s in h.held_after_s.items()}}
