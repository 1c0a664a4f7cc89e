"""Packet delay and reordering without netem: an NFQUEUE listener.

The kernel of the test machine has no `netem` qdisc (nor prio, sfq,
fq_codel), so `tc qdisc add ... netem delay` is not available. This program
does what netem's delay does, in user space: iptables sends the packets of
one link to an NFQUEUE queue (`-j NFQUEUE --queue-num N`, no bypass: while
nobody reads the queue its packets are dropped, never passed undelayed),
this process receives each packet's id (metadata only, never the payload),
and issues the ACCEPT verdict once the packet's own delay has passed. Each
packet gets `delay ± jitter` (uniform); with a jitter, packets overtake each
other (reordering, as netem's jitter does), and `--reorder P` lets a share
P of packets through at once, ahead of the delayed ones (netem's `reorder`).
The kernel holds the packets meanwhile; verdicts may be issued in any order.

It speaks nfnetlink_queue over a raw netlink socket (no library): config
messages bind the queue (copy mode META, queue length 65536), each asking
for the kernel's acknowledgement (NLM_F_ACK), which is read before `ready`
is printed: a bind the kernel refused (another reader on the queue: EBUSY;
no nfnetlink_queue) ends the program with the error instead. Each packet
message carries a `nfqnl_msg_packet_hdr` whose id the verdict names.

Run it inside the namespace whose iptables rules feed the queue:

    ip netns exec NS python nfq_delay.py --queue 7 --delay-ms 150 --jitter-ms 100 --seed 3

It prints "ready" once the kernel acknowledged the bind. On SIGUSR1 it
prints "count N", the packets it has received so far. On SIGTERM it accepts
every packet it holds, unbinds and exits 0 (its rule must be gone by then).
The number of packets delayed is printed on exit.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_UNBIND = 1, 2
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
AF_INET = 2


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, seq: int, flags: int = 0) -> bytes:
    nfgen = struct.pack("=BBH", AF_INET, 0, socket.htons(queue))
    body = nfgen + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type,
                       NLM_F_REQUEST | flags, seq, 0) + body


def _attrs(buf: bytes, pos: int, end: int):
    while pos + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, pos)
        if length < 4:
            return
        yield kind & 0x7FFF, buf[pos + 4:pos + length]
        pos += (length + 3) & ~3


class Queue:
    def __init__(self, num: int):
        self.num = num
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))

    def send(self, msg_type: int, attrs: bytes, flags: int = 0) -> int:
        self.seq += 1
        self.sock.send(_message(msg_type, self.num, attrs, self.seq, flags))
        return self.seq

    def acked(self, seq: int, what: str, timeout: float = 5.0) -> None:
        """Wait for the kernel's answer to message `seq`: an NLMSG_ERROR
        whose error is 0 (an acknowledgement), or raise its error."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError(f"no answer from the kernel to {what}")
            buf, pos = self.sock.recv(1 << 16), 0
            while pos + 16 <= len(buf):
                length, msg_type, _flags, mseq, _pid = struct.unpack_from("=IHHII", buf, pos)
                if length < 16:
                    break
                if msg_type == NLMSG_ERROR and mseq == seq:
                    (err,) = struct.unpack_from("=i", buf, pos + 16)
                    if err != 0:
                        raise OSError(-err, f"{what} (queue {self.num}): {os.strerror(-err)}")
                    return
                pos += (length + 3) & ~3

    def bind(self) -> None:
        for what, attr in (
                ("bind", _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, AF_INET))),
                ("copy mode", _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))),
                ("queue length", _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", 65536)))):
            self.acked(self.send(NFQNL_MSG_CONFIG, attr, NLM_F_ACK), what)

    def unbind(self) -> None:
        self.send(NFQNL_MSG_CONFIG, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND,
                                                                    AF_INET)))

    def accept(self, packet_id: int) -> None:
        self.send(NFQNL_MSG_VERDICT, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT,
                                                                         packet_id)))

    def packet_ids(self) -> list[int]:
        """The ids of the packets in one read (netlink errors raise)."""
        buf = self.sock.recv(1 << 20)
        ids, pos = [], 0
        while pos + 16 <= len(buf):
            length, msg_type, _flags, _seq, _pid = struct.unpack_from("=IHHII", buf, pos)
            if length < 16:
                break
            if msg_type == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", buf, pos + 16)
                if err != 0:
                    raise OSError(-err, f"nfnetlink_queue: {os.strerror(-err)}")
            elif msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                for kind, payload in _attrs(buf, pos + 20, pos + length):
                    if kind == NFQA_PACKET_HDR:
                        ids.append(struct.unpack_from("!I", payload)[0])
            pos += (length + 3) & ~3
        return ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queue", type=int, required=True)
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--reorder", type=float, default=0.0,
                    help="share of packets let through at once, ahead of delayed ones")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    q = Queue(args.queue)
    try:
        q.bind()
    except OSError as e:
        print(f"bind failed: {e}", flush=True)
        return 2
    stop, asked = [], []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    held: list[tuple[float, int, int]] = []  # (release time, arrival number, packet id)
    arrivals = 0
    print("ready", flush=True)
    while not stop:
        if asked:
            asked.clear()
            print(f"count {arrivals}", flush=True)
        now = time.monotonic()
        while held and held[0][0] <= now:
            q.accept(heapq.heappop(held)[2])
        wait = max(0.0, min(0.05, held[0][0] - now)) if held else 0.05
        try:
            readable, _, _ = select.select([q.sock], [], [], wait)
        except InterruptedError:
            continue
        if not readable:
            continue
        now = time.monotonic()
        for pid in q.packet_ids():
            arrivals += 1
            if args.reorder and rng.random() < args.reorder:
                q.accept(pid)
                continue
            delay = args.delay_ms + rng.uniform(-args.jitter_ms, args.jitter_ms)
            heapq.heappush(held, (now + max(0.0, delay) / 1000, arrivals, pid))
    for _, _, pid in held:
        q.accept(pid)
    q.unbind()
    print(f"delayed {arrivals} packets", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
