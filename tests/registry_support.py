"""A real schema registry for the registry tests: Apicurio Registry 3.3.3
(scripts/setup.sh unpacks it into .tools/apicurio-registry-3.3.3 and writes
the path of a JDK 21+ to .tools/apicurio.java), run from its Quarkus jar with
in-memory storage, both ports on loopback. antidote and confluent-kafka's
serializers talk to its Confluent API, `/apis/ccompat/v7`.

The registry tests that are not about outages run against it and against
the stub (tests/registry_stub.py), which stays for what a real registry will
not do (hang, answer 500, lie): `parametrize_registry` marks a test for both.
One Apicurio per test module (per xdist worker), started the first time a
test asks for it; a machine without it skips those tests (setup.sh warns),
under CI=true they fail.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from dataclasses import dataclass
from typing import Optional

import pytest

import harness as h
import poison_support as ps

APICURIO_VERSION = "3.3.3"
APICURIO_HOME = Path(os.environ.get(
    "APICURIO_HOME", h.REPO / ".tools" / f"apicurio-registry-{APICURIO_VERSION}"))
APICURIO_JAVA_FILE = h.REPO / ".tools" / "apicurio.java"
START_TIMEOUT = 90.0

# The registries a test runs against (`registry` fixture, indirect).
BOTH = ["stub", "apicurio"]


def parametrize_registry(fn):
    """Run the test once against the stub and once against Apicurio."""
    return pytest.mark.parametrize("registry", BOTH, indirect=True)(fn)


def apicurio_java() -> Optional[str]:
    try:
        java = APICURIO_JAVA_FILE.read_text().strip()
    except OSError:
        return None
    return java if java and os.access(java, os.X_OK) else None


def apicurio_missing() -> Optional[str]:
    """Why Apicurio cannot run here, or None."""
    if not (APICURIO_HOME / "quarkus-run.jar").exists():
        return f"Apicurio Registry not found at {APICURIO_HOME}: run scripts/setup.sh"
    if apicurio_java() is None:
        return f"no JDK 21+ recorded in {APICURIO_JAVA_FILE}: run scripts/setup.sh"
    return None


class Apicurio:
    """One Apicurio Registry process on loopback (in-memory storage)."""

    kind = "apicurio"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = h.free_port()
        self.management_port = h.free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.started_in = 0.0

    @property
    def log(self) -> Path:
        return self.workdir / f"apicurio-{self.port}.log"

    @property
    def url(self) -> str:
        """The Confluent API's base URL (what `schema_registry.url` names)."""
        return f"http://{h.HOST}:{self.port}/apis/ccompat/v7"

    def start(self) -> "Apicurio":
        why = apicurio_missing()
        if why is not None:
            raise h.HarnessError(why)
        cmd = [apicurio_java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               f"-Dquarkus.http.host={h.HOST}", f"-Dquarkus.http.port={self.port}",
               f"-Dquarkus.management.host={h.HOST}",
               f"-Dquarkus.management.port={self.management_port}",
               "-jar", str(APICURIO_HOME / "quarkus-run.jar")]
        t0 = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir)
        ready = f"http://{h.HOST}:{self.management_port}/health/ready"
        deadline = t0 + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise h.HarnessError(f"Apicurio exited with code {self.proc.returncode} "
                                     f"before it was ready\n{h.read_log(self.log)}")
            try:
                with urllib.request.urlopen(ready, timeout=2) as r:
                    if r.status == 200:
                        self.started_in = time.monotonic() - t0
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise h.HarnessError(f"Apicurio not ready within {START_TIMEOUT}s\n{h.read_log(self.log)}")

    def stop(self) -> None:
        if self.proc is not None:
            h.stop_process(self.proc, timeout=10)
            self.proc = None

    def assert_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise h.HarnessError(f"Apicurio is not running\n{h.read_log(self.log)}")


def start_apicurio(workdir: Path) -> Apicurio:
    """For a module fixture: a started Apicurio, or the test skipped (failed
    under CI=true) when it is not installed."""
    why = apicurio_missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI=true: the registry tests must run against Apicurio)",
                        pytrace=False)
        pytest.skip(why)
    d = workdir / f"apicurio-{os.getpid()}-{h.free_port()}"
    d.mkdir(parents=True, exist_ok=True)
    return Apicurio(d).start()


def registry_kind(request) -> str:
    """The `registry` fixture's parameter: "stub" unless the test is
    parametrized with `parametrize_registry`."""
    kind = getattr(request, "param", "stub")
    if kind not in BOTH:
        raise ValueError(f"registry={kind!r}: use one of {BOTH}")
    return kind


def is_stub(registry) -> bool:
    return getattr(registry, "kind", "stub") == "stub"


# The fixtures a registry test module imports: one Apicurio per module
# (started on first use), and `registry`, the stub or Apicurio as the test's
# parameter says (the module defines `stub` itself: its options differ).
@pytest.fixture(scope="module")
def apicurio(workdir):
    a = start_apicurio(workdir)
    yield a
    a.stop()


@pytest.fixture
def registry(request):
    """The stub, or Apicurio for tests marked `parametrize_registry`."""
    return request.getfixturevalue(registry_kind(request))


@dataclass
class RegistryPolicyProxy(ps.PolicyProxy):
    """A policy proxy that reads schemas from `registry_url` (timeout
    `registry_timeout`; with `registry_user`, basic auth whose password is
    in SR_TEST_PASSWORD), with an admin listener on `admin_port`."""
    registry_url: str = ""
    admin_port: int = 0
    registry_timeout: str = "1s"
    registry_user: Optional[str] = None

    def config_yaml(self) -> str:
        auth = ""
        if self.registry_user:
            auth = (f"  basic_auth: {{ username: {self.registry_user}, "
                    "password_env: SR_TEST_PASSWORD }\n")
        return ps.PolicyProxy.config_yaml(self) + (
            "schema_registry:\n"
            f"  url: [\"{self.registry_url}\"]\n"
            + auth +
            f"  timeout: {self.registry_timeout}\n"
            "  cache_ttl: 1h\n"
            f"admin:\n  listen: {h.HOST}:{self.admin_port}\n")
