#!/usr/bin/env python3
"""One Apache Kafka broker for the benchmarks, started the way the test
suite starts its own (tests/harness.py: KafkaBroker, the suite's version,
AppCDS), on a given port, until SIGTERM.

    kafka_broker.py PORT WORKDIR [HEAP]

Prints one line, `{"port": P, "pid": JAVA_PID}`, once the broker has
started (the pid is the broker's JVM, for its CPU time), then waits."""
import json
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import harness as h  # noqa: E402


def main() -> None:
    port, work = int(sys.argv[1]), Path(sys.argv[2])
    heap = sys.argv[3] if len(sys.argv) > 3 else "1g"
    work.mkdir(parents=True, exist_ok=True)
    jvm = [f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:-UsePerfData",
           "-Djava.awt.headless=true"]
    if h.KAFKA_CDS.exists():
        jvm += [f"-XX:SharedArchiveFile={h.KAFKA_CDS}", "-Xlog:cds=off", "-Xlog:class+path=off"]
    b = h.KafkaBroker(work, port=port, jvm=jvm).start(timeout=120)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(json.dumps({"port": b.port, "pid": b.proc.pid, "version": h.KAFKA_VERSION}), flush=True)
    try:
        while not stop.wait(0.5):
            if b.proc.poll() is not None:
                sys.exit(f"kafka exited with {b.proc.returncode}\n{h.read_log(b.log)}")
    finally:
        b.stop()


if __name__ == "__main__":
    main()
