"""The checker of the network-fault runs (test_jepsen.py): a pure function
from a run's whole history to its anomalies. No I/O here; the test reads
the logs, the producers' and consumers' histories and the DLTs, and hands
them over as plain values (so the checker is tested on made-up histories
too: test_jepsen.py's `test_the_checker_finds_each_anomaly`).

What it checks, for every topic of the run:

- every record a producer had acknowledged is in the log, at the offset
  the acknowledgement named, with the producer's id (`acked-not-in-log`);
- no poison record produced through the door (the proxy) is in the log
  (`door-leak`); no record is in the log twice (`duplicate-in-log`: the
  producers are idempotent);
- the records each group must read: every valid record in the log, but,
  under `ordering: per_key`, not the records of a key that come after its
  first poison record in the same partition (those are `blocked`); every
  group read each of them at least once (`lost`), read no poison and no
  blocked record (`leaked`), and read each partition's records for the
  first time in offset order (`reordered`; per key under per_key follows);
- the DLT of each topic holds every poison record of the log (and, under
  per_key, every blocked one) exactly once, with the class it should have
  (`dlt-missing`, `dlt-duplicate`, `dlt-extra`, `dlt-class`);
- after the faults healed, each group had read everything within the
  stated bound (`slow-recovery`), and no proxy held a partition past it
  (`held-after-heal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# (topic, partition, offset)
Pos = tuple[str, int, int]


@dataclass(frozen=True)
class LogRec:
    topic: str
    partition: int
    offset: int
    key: Optional[bytes]
    rid: str           # the producer's record id ("?" if none)
    kind: str          # "valid" or a poison kind


@dataclass(frozen=True)
class DltRec:
    topic: str         # x-original-topic
    partition: int
    offset: int
    klass: str         # x-error-class


@dataclass
class History:
    log: list[LogRec]
    acks: list[tuple[str, str, int, int]]            # (rid, topic, partition, offset)
    door_producers: set[str]                          # rid prefixes ("tag-") of door producers
    deliveries: dict[str, list[tuple[str, int, int, str]]]   # group -> (topic, p, offset, rid)
    dlt: list[DltRec]
    per_key_topics: set[str]
    recovery_s: dict[str, float] = field(default_factory=dict)   # group -> s after heal
    held_after_s: dict[str, float] = field(default_factory=dict)  # proxy -> s held after heal
    bound_s: float = 60.0


@dataclass
class Anomaly:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def _sample(xs, n: int = 8) -> str:
    xs = sorted(xs)
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


def check(h: History) -> list[Anomaly]:
    out: list[Anomaly] = []
    by_pos = {(r.topic, r.partition, r.offset): r for r in h.log}

    bad = [(rid, pos) for rid, *pos in h.acks
           if tuple(pos) not in by_pos or by_pos[tuple(pos)].rid != rid]
    if bad:
        out.append(Anomaly("acked-not-in-log", _sample(bad)))
    door = [r.rid for r in h.log if r.kind != "valid"
            and any(r.rid.startswith(p) for p in h.door_producers)]
    if door:
        out.append(Anomaly("door-leak", _sample(door)))
    seen: dict[str, int] = {}
    for r in h.log:
        seen[r.rid] = seen.get(r.rid, 0) + 1
    dups = [rid for rid, n in seen.items() if n > 1 and rid != "?"]
    if dups:
        out.append(Anomaly("duplicate-in-log", _sample(dups)))

    must, dlt_want = expected(h)
    for group, ds in sorted(h.deliveries.items()):
        got = {(t, p, o) for t, p, o, _ in ds}
        missing = set(must) - got
        if missing:
            out.append(Anomaly("lost", f"group {group}: {_sample(missing)}"))
        leaked = got & set(dlt_want)
        if leaked:
            out.append(Anomaly("leaked", f"group {group}: {_sample(leaked)}"))
        wrong = [(t, p, o, rid) for t, p, o, rid in ds
                 if (t, p, o) in by_pos and by_pos[(t, p, o)].rid != rid]
        if wrong:
            out.append(Anomaly("wrong-record", f"group {group}: {_sample(wrong)}"))
        first: dict[tuple[str, int], list[int]] = {}
        done: set[Pos] = set()
        for t, p, o, _ in ds:
            if (t, p, o) not in done:
                done.add((t, p, o))
                first.setdefault((t, p), []).append(o)
        back = [(tp, a, b) for tp, offs in first.items()
                for a, b in zip(offs, offs[1:]) if b < a]
        if back:
            out.append(Anomaly("reordered", f"group {group}: first read {_sample(back)}"))

    counts: dict[Pos, list[str]] = {}
    for d in h.dlt:
        counts.setdefault((d.topic, d.partition, d.offset), []).append(d.klass)
    missing = set(dlt_want) - set(counts)
    if missing:
        out.append(Anomaly("dlt-missing", _sample(missing)))
    extra = set(counts) - set(dlt_want)
    if extra:
        out.append(Anomaly("dlt-extra", _sample(extra)))
    dup = [pos for pos, ks in counts.items() if len(ks) > 1]
    if dup:
        out.append(Anomaly("dlt-duplicate", _sample(dup)))
    klass = [(pos, ks[0], dlt_want[pos]) for pos, ks in counts.items()
             if pos in dlt_want and ks[0] != dlt_want[pos]]
    if klass:
        out.append(Anomaly("dlt-class", _sample(klass)))

    slow = {g: s for g, s in h.recovery_s.items() if s > h.bound_s}
    if slow:
        out.append(Anomaly("slow-recovery", f"groups past the {h.bound_s:.0f} s bound: {slow}"))
    held = {p: s for p, s in h.held_after_s.items() if s > h.bound_s}
    if held:
        out.append(Anomaly("held-after-heal", f"proxies past the {h.bound_s:.0f} s bound: {held}"))
    return out


def summary(h: History) -> dict:
    must, dlt_want = expected(h)
    return {"log": len(h.log), "acked": len(h.acks), "must_read": len(must),
            "dlt_want": len(dlt_want), "dlt": len(h.dlt),
            "blocked": sum(1 for k in dlt_want.values() if k == "blocked"),
            "deliveries": {g: len(ds) for g, ds in h.deliveries.items()},
            "recovery_s": {g: round(s, 1) for g, s in h.recovery_s.items()}}
