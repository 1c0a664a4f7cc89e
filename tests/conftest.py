"""pytest fixtures: a broker (Apache Kafka; tansu with ANTIDOTE_TEST_BROKER=tansu),
the antidote proxy in front of it, and the `endpoint` every transparency test
runs against, once per path:

  direct: the client talks to the broker itself (validates the test);
  proxy:  the client is given only antidote's bootstrap address.

While antidote cannot start, every proxy-path test errors at setup with the
proxy's own log in the message: it never skips.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from clients import Endpoint, ck_create_topic
from harness import (Antidote, Certs, HarnessError, Tansu, make_certs, new_broker,
                     port_claims_dir, read_log)

PATHS = ["direct", "proxy"]


def pytest_configure(config):
    """In the controller (or a run without xdist): fix the run's id before
    xdist hands it to the workers, so the port claims directory they share
    is known here and removed at the end."""
    if hasattr(config, "workerinput"):
        return
    run_id = getattr(config.option, "testrunuid", None) or uuid.uuid4().hex
    if hasattr(config.option, "testrunuid"):
        config.option.testrunuid = run_id
    os.environ["PYTEST_XDIST_TESTRUNUID"] = run_id


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        shutil.rmtree(port_claims_dir(), ignore_errors=True)

# Every antidote started by a fixture, so its log can be attached to failures.
_PROXIES: list[Antidote] = []


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("antidote-it")


@pytest.fixture(scope="session")
def broker(workdir):
    """One broker per worker for the session; tests use unique topic and group
    names. Apache Kafka (KRaft, harness.KafkaBroker) unless
    ANTIDOTE_TEST_BROKER=tansu, which runs an in-memory tansu instead."""
    t = new_broker(workdir).start()
    yield t
    t.stop()


@pytest.fixture(scope="session")
def tansu_broker(workdir):
    """An in-memory tansu for the few tests that run on tansu even when the
    suite's broker is Kafka; each says why. Started only if asked for."""
    t = Tansu(workdir).start()
    yield t
    t.stop()


def start_proxy(workdir: Path, **kw) -> Antidote:
    p = Antidote(workdir, **kw)
    _PROXIES.append(p)
    return p.start()


@pytest.fixture(scope="session")
def _session_proxy(workdir, broker):
    """Start antidote once; keep the error instead of raising so each proxy-path
    test reports it (a session fixture that raises is reported only once)."""
    try:
        proxy = start_proxy(workdir, upstream=[broker.bootstrap])
    except HarnessError as e:
        yield e
        return
    yield proxy
    proxy.stop_and_check()


@pytest.fixture
def proxy(_session_proxy) -> Antidote:
    if isinstance(_session_proxy, Exception):
        pytest.fail(f"antidote did not start: {_session_proxy}", pytrace=False)
    _session_proxy.assert_running()
    yield _session_proxy
    _session_proxy.assert_running()  # a test must not have crashed the proxy


@pytest.fixture(params=PATHS)
def path(request) -> str:
    return request.param


@pytest.fixture
def endpoint(request, path, broker) -> Endpoint:
    """Where the client under test connects, for the current `path`."""
    if path == "direct":
        return Endpoint(broker.bootstrap, "direct")
    p = request.getfixturevalue("proxy")
    return Endpoint(p.bootstrap, "proxy")


@pytest.fixture
def broker_endpoint(broker) -> Endpoint:
    """The broker itself, for setup and cross-checks that must not depend on the proxy."""
    return Endpoint(broker.bootstrap, "direct")


@pytest.fixture
def new_topic(request, broker_endpoint):
    """Factory: create a uniquely named topic directly on the broker."""
    def make(partitions: int = 1) -> str:
        name = f"{request.node.originalname}-{uuid.uuid4().hex[:8]}"
        name = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name)
        ck_create_topic(broker_endpoint, name, partitions)
        return name
    return make


@pytest.fixture(scope="session")
def certs(workdir) -> Certs:
    return make_certs(workdir / "certs")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the stderr of every proxy started so far."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for p in _PROXIES:
            log = read_log(p.log, limit=8000)
            if log:
                rep.sections.append((f"antidote {p.bootstrap}", log))
