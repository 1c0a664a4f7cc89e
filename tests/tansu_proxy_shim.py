#!/usr/bin/env python3
"""A stand-in for the antidote binary built from `tansu proxy`, to check the
harness's proxy-path tests against a real pass-through proxy:

    ANTIDOTE_BIN=tests/tansu_proxy_shim.py .venv/bin/python -m pytest tests/

It accepts `run --config FILE`, reads listen.bootstrap, listen.broker_port_base
and upstream.bootstrap_servers[0] from the YAML, and runs two tansu proxies that
both advertise base+111 (tansu's node id): one on the bootstrap port, one on
base+111. No TLS, no policies. SIGTERM stops both and exits 0."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

TANSU = os.environ.get("TANSU_BIN", str(Path(__file__).resolve().parent.parent
                                         / ".tools" / "bin" / "tansu"))


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[1] != "run" or sys.argv[2] != "--config":
        print("usage: tansu_proxy_shim.py run --config FILE", file=sys.stderr)
        return 2
    text = Path(sys.argv[3]).read_text()
    if re.search(r"^\s+tls:", text, re.M):
        print("tansu_proxy_shim: TLS is not supported", file=sys.stderr)
        return 1
    host, port = re.search(r"bootstrap:\s*([\d.]+):(\d+)", text).groups()
    base = int(re.search(r"broker_port_base:\s*(\d+)", text).group(1))
    origin = re.search(r"bootstrap_servers:\s*\n\s*-\s*(\S+)", text).group(1)
    advertised = f"tcp://{host}:{base + 111}"
    procs = [subprocess.Popen([TANSU, "proxy", "--listener-url", f"tcp://{host}:{p}",
                               "--advertised-listener-url", advertised,
                               "--origin-url", f"tcp://{origin}"])
             for p in (port, base + 111)]

    def stop(_sig, _frame):
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(5)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:  # exit non-zero if either child dies on its own
        pid, status = os.wait()
        print(f"tansu proxy {pid} exited: {status}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
