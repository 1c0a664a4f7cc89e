"""A third, independent client: kafkajs (pure JavaScript) produces and reads back
through a consumer group. Skipped only when node or the kafkajs install is
missing, and never under CI=true (scripts/setup.sh then fails without it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).resolve().parent / "js"


# Skipped on a developer's machine without kafkajs; never under CI=true,
# where scripts/setup.sh must have installed it.
@pytest.mark.skipif(os.environ.get("CI") != "true"
                    and (shutil.which("node") is None
                         or not (JS / "node_modules" / "kafkajs").exists()),
                    reason="kafkajs not installed (scripts/setup.sh)")
def test_kafkajs_produce_and_group_consume_reads_same_records(endpoint, new_topic):
    topic = new_topic(1)
    n = 10
    out = subprocess.run(["node", "roundtrip.js", endpoint.bootstrap, topic, str(n)], cwd=JS,
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-4000:]
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert got == [{"partition": 0, "offset": i, "key": f"js-key-{i}", "value": f"js-value-{i}",
                    "h": f"{i}", "timestamp": 1700000000000 + i * 1000} for i in range(n)]
