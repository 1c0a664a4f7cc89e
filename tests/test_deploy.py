"""Deployment artefacts, tested as far as this machine allows (no Docker
engine, no Kubernetes cluster, no systemd as PID 1):

- configuration from the environment: `ANTIDOTE_CONFIG` and `${VAR}` in the
  config file, with a real broker and two real clients;
- the container image: the Dockerfile's ENTRYPOINT + CMD and ENV, run as
  they are against the debug binary, with the config and policies at the
  documented paths (remapped into a temp dir);
- Kubernetes: the kustomize output (`kubectl kustomize` when kubectl is
  installed), its probes, ports, hardening, and the config and policies its
  ConfigMaps carry, laid out as the kubelet lays out a ConfigMap volume
  (`..<timestamp>/` dir, `..data` symlink, one symlink per key); a policy
  change arrives as the kubelet delivers it, by swapping `..data`;
- systemd: `systemd-analyze verify` on the unit, and its ExecStartPre,
  ExecStart and ExecReload command lines run against the binary.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from clients import (Endpoint, Rec, ck_consume_assign, ck_create_topic, ck_produce,
                     kp_consume_assign)
from harness import (ANTIDOTE_BIN, BROKER_NODE_ID, HOST, REPO, free_port, free_port_base,
                     read_log, stop_process, wait_for_port)

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
UNIT = DEPLOY / "systemd" / "antidote.service"
DOCKERFILE = REPO / "Dockerfile"

# Valid while lat <= {max_lat}: the policy a reload test swaps in and out.
POLICY = """\
policies:
  - name: deploy-{topic}
    topics: ["{topic}"]
    value:
      format: json
    rules:
      - field: /lat
        min: -90
        max: {max_lat}
    on_invalid: divert
"""


# ---------------------------------------------------------------------------
# Helpers: processes, the kubelet's ConfigMap layout, the manifests
# ---------------------------------------------------------------------------

def run_cli(argv: list[str], env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


class Proc:
    """antidote started from an exact argv; stderr to a log file."""

    def __init__(self, argv: list[str], env: dict, log: Path):
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.text().count(text) >= count:
                return
            assert self.proc.poll() is None, f"antidote exited\n{read_log(self.log)}"
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not logged {count}x in {timeout}s\n{read_log(self.log)}")

    def stop_and_check(self) -> None:
        already = self.proc.poll()
        code = stop_process(self.proc)
        assert already is None, f"antidote had exited with {already}\n{read_log(self.log)}"
        assert code == 0, f"antidote exited {code} on SIGTERM\n{read_log(self.log)}"


def base_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ANTIDOTE_CONFIG"}
    env.update(extra)
    return env


def http_get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_http(port: int, path: str, want: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        try:
            got = http_get(port, path)
            if got == want:
                return
        except OSError as e:
            got = e
        time.sleep(0.2)
    raise AssertionError(f"GET {path} on {port}: {got}, wanted {want}")


def kubelet_write(mount: Path, files: dict[str, str], stamp: str) -> None:
    """Lay out (or update) a ConfigMap volume as the kubelet's AtomicWriter
    does: the data goes into a new `..<stamp>` dir, a `..data_tmp` symlink to
    it is renamed over `..data` (the atomic step), each key is a symlink
    `key -> ..data/key`, and the previous timestamped dir is removed."""
    mount.mkdir(parents=True, exist_ok=True)
    old = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    ts = mount / f"..{stamp}"
    ts.mkdir()
    for key, text in files.items():
        (ts / key).write_text(text)
    tmp = mount / "..data_tmp"
    os.symlink(ts.name, tmp)
    os.rename(tmp, mount / "..data")
    for key in files:
        if not (mount / key).is_symlink():
            os.symlink(f"..data/{key}", mount / key)
    for entry in mount.iterdir():
        if entry.is_symlink() and entry.name not in files and not entry.name.startswith(".."):
            entry.unlink()
    if old is not None:
        shutil.rmtree(mount / old)


def render() -> list[dict]:
    """The manifests as `kubectl apply -k deploy/kubernetes` would send them.

    With kubectl: its built-in kustomize. Without: the subset of kustomize
    the kustomization uses (resources, configMapGenerator with files,
    namespace), names unhashed."""
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        return [d for d in yaml.safe_load_all(out) if d]
    k = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for r in k["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / r).read_text()) if d]
    for g in k["configMapGenerator"]:
        data = {Path(f).name: (K8S / f).read_text() for f in g["files"]}
        docs.append({"kind": "ConfigMap", "metadata": {"name": g["name"]}, "data": data})
    for d in docs:
        d["metadata"]["namespace"] = k["namespace"]
    return docs


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}s"
    return found[0]


def container(docs: list[dict]) -> dict:
    cs = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(cs) == 1
    return cs[0]


def container_env(docs: list[dict]) -> dict[str, str]:
    env = container(docs)["env"]
    assert all("value" in e for e in env), "every env value is literal (testable offline)"
    return {e["name"]: e["value"] for e in env}


def mounted_configmaps(docs: list[dict]) -> dict[str, dict[str, str]]:
    """mountPath -> the files the ConfigMap mounted there carries."""
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    volumes = {v["name"]: v["configMap"]["name"] for v in pod["volumes"]}
    out = {}
    for m in container(docs)["volumeMounts"]:
        name = volumes[m["name"]]
        assert name in maps, f"volume {m['name']} names ConfigMap {name}, which is not rendered"
        out[m["mountPath"]] = maps[name]
    return out


def config_text(docs: list[dict]) -> str:
    path = container_env(docs)["ANTIDOTE_CONFIG"]
    return mounted_configmaps(docs)[str(Path(path).parent)][Path(path).name]


def on_loopback(text: str, bootstrap: int, base: int, admin: int) -> str:
    """The deploy config with its listeners moved to free loopback ports (tests
    bind nothing else); every other line is as the ConfigMap carries it."""
    for old, new in [("bootstrap: 0.0.0.0:29092", f"bootstrap: {HOST}:{bootstrap}"),
                     ("broker_port_base: 29100", f"broker_port_base: {base}"),
                     ("listen: 0.0.0.0:9644", f"listen: {HOST}:{admin}")]:
        assert text.count(old) == 1, f"{old!r} not once in the deploy config"
        text = text.replace(old, new)
    return text


# What an operator sets differently here than in the manifests: the names
# clients resolve (no cluster DNS on this machine), one broker.
TEST_ENV = {"ANTIDOTE_ADVERTISED_HOST": HOST, "ANTIDOTE_DLT_REPLICATION_FACTOR": "1"}


def materialize(root: Path, mounts: dict[str, dict[str, str]], stamp: str) -> None:
    """Each ConfigMap at its mountPath, re-rooted under `root`."""
    for path, files in mounts.items():
        kubelet_write(root / path.lstrip("/"), files, stamp)


def dockerfile() -> dict:
    """The runtime stage's ENTRYPOINT, CMD (exec form), ENV, USER and EXPOSE,
    plus every FROM and RUN line."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out: dict = {"FROM": [], "RUN": [], "ENV": {}, "EXPOSE": []}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "FROM":
            out["FROM"].append(rest)
            out["ENV"], out["EXPOSE"] = {}, []     # only the last stage counts
        elif word in ("ENTRYPOINT", "CMD"):
            out[word] = yaml.safe_load(rest)       # a JSON array
        elif word == "ENV":
            k, _, v = rest.partition("=")
            out["ENV"][k] = v
        elif word in ("USER", "RUN"):
            out[word] = rest if word == "USER" else out["RUN"] + [rest]
        elif word == "EXPOSE":
            out["EXPOSE"] += rest.split()
    return out


def unit() -> dict[str, list[str]]:
    """Every `Key=value` of the unit file, values in file order."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def produce_and_read_through(proxy_bootstrap: str, broker, n: int = 3) -> None:
    """Records produced to the broker come back through the proxy, to
    librdkafka and kafka-python alike."""
    topic = f"deploy-{uuid.uuid4().hex[:8]}"
    direct = Endpoint(broker.bootstrap)
    ck_create_topic(direct, topic, 1)
    ck_produce(direct, topic, [Rec(0, -1, f"k{i}".encode(), f"v{i}".encode(), (), None)
                               for i in range(n)])
    ep = Endpoint(proxy_bootstrap, "proxy")
    for consume in (ck_consume_assign, kp_consume_assign):
        got = consume(ep, topic, [0], n, timeout=60)
        assert [r.value for r in got] == [f"v{i}".encode() for i in range(n)], consume.__name__


# ---------------------------------------------------------------------------
# Configuration from the environment
# ---------------------------------------------------------------------------

ENV_CONFIG = """\
listen:
  bootstrap: ${T_HOST:-127.0.0.1}:${T_PORT}   # host from a default, port from the environment
  broker_port_base: ${T_BASE}
upstream:
  bootstrap_servers: [${T_UPSTREAM}]
policies: []   # ${NOT_SET_IN_A_COMMENT}
"""


def test_antidote_config_and_env_variables_serve_real_clients(workdir, broker):
    """`antidote run` with no --config: the path comes from ANTIDOTE_CONFIG,
    the listener port, the port base and the upstream from `${VAR}`."""
    cfg = workdir / f"env-{uuid.uuid4().hex[:8]}.yaml"
    cfg.write_text(ENV_CONFIG)
    port, base = free_port(), free_port_base()
    env = base_env(ANTIDOTE_CONFIG=str(cfg), T_PORT=str(port), T_BASE=str(base),
                   T_UPSTREAM=broker.bootstrap)
    p = Proc([str(ANTIDOTE_BIN), "run"], env, workdir / f"{cfg.stem}.log")
    try:
        wait_for_port(port, 15, p.proc, p.log, "antidote (ANTIDOTE_CONFIG)")
        produce_and_read_through(f"{HOST}:{port}", broker)
        # The broker is served at base + node id: the substituted number is a number.
        wait_for_port(base + BROKER_NODE_ID, 5, p.proc, p.log, "broker listener")
    finally:
        p.stop_and_check()


def test_a_config_flag_wins_over_antidote_config(workdir):
    good = workdir / "flag-good.yaml"
    good.write_text(ENV_CONFIG.replace("${T_PORT}", "1").replace("${T_BASE}", "2")
                    .replace("${T_UPSTREAM}", "127.0.0.1:9092"))
    bad = workdir / "flag-bad.yaml"
    bad.write_text("listen: [\n")
    env = base_env(ANTIDOTE_CONFIG=str(bad))
    r = run_cli([str(ANTIDOTE_BIN), "check", "--config", str(good)], env)
    assert r.returncode == 0, r.stderr
    r = run_cli([str(ANTIDOTE_BIN), "check"], env)
    assert r.returncode != 0 and f"{bad}:" in r.stderr, r.stderr
    r = run_cli([str(ANTIDOTE_BIN), "check"], base_env())
    assert r.returncode != 0 and "--config" in r.stderr, r.stderr
    for cmd in ("run", "check"):
        r = run_cli([str(ANTIDOTE_BIN), cmd, "--help"], base_env())
        assert "[env: ANTIDOTE_CONFIG=]" in r.stdout, r.stdout


def test_an_unset_variable_stops_the_start_with_file_line_and_column(workdir):
    cfg = workdir / "env-unset.yaml"
    cfg.write_text(ENV_CONFIG)
    env = base_env(ANTIDOTE_CONFIG=str(cfg), T_PORT="1", T_UPSTREAM="127.0.0.1:9092")
    r = run_cli([str(ANTIDOTE_BIN), "run"], env, timeout=30)
    assert r.returncode != 0
    assert f"{cfg}:3:21: environment variable T_BASE is not set" in r.stderr, r.stderr
    # An unterminated `${` names its own position, and `$$` is a literal `$`.
    cfg.write_text("listen:\n  bootstrap: 127.0.0.1:${T_PORT\n")
    r = run_cli([str(ANTIDOTE_BIN), "check"], env)
    assert f"{cfg}:2:24: unterminated" in r.stderr, r.stderr


@pytest.mark.parametrize("value", [
    "9092\nadmin:\n  listen: 127.0.0.1:1",         # a newline would add a top-level key
    "127.0.0.1:9092, 10.0.0.1:9092",               # a flow separator: a second server
    "x: y",                                         # a nested mapping
])
def test_a_value_that_would_change_the_yaml_shape_is_refused(workdir, value):
    cfg = workdir / "env-inject.yaml"
    cfg.write_text(ENV_CONFIG)
    env = base_env(ANTIDOTE_CONFIG=str(cfg), T_PORT="1", T_BASE="2", T_UPSTREAM=value)
    r = run_cli([str(ANTIDOTE_BIN), "check"], env)
    assert r.returncode != 0
    assert f"{cfg}:5:23: the value of T_UPSTREAM contains" in r.stderr, r.stderr
    # The same variable with an ordinary value is fine: the refusal is the value's.
    env["T_UPSTREAM"] = "kafka-0.kafka.svc:9092"
    assert run_cli([str(ANTIDOTE_BIN), "check"], env).returncode == 0


# ---------------------------------------------------------------------------
# Container image
# ---------------------------------------------------------------------------

def test_dockerfile_builds_a_stripped_binary_and_runs_it_as_non_root():
    d = dockerfile()
    assert len(d["FROM"]) == 2, "multi-stage"
    assert d["FROM"][-1].startswith(("gcr.io/distroless/", "scratch")), d["FROM"]
    assert d["USER"] not in ("", "0", "root") and not d["USER"].startswith("0:"), d["USER"]
    build = " ".join(d["RUN"])
    assert "cargo build --profile dist --locked" in build
    cargo = (REPO / "Cargo.toml").read_text()
    dist = cargo.split("[profile.dist]", 1)[1].split("\n[", 1)[0]
    assert "strip = true" in dist and "debug = 0" in dist, dist
    assert d["ENTRYPOINT"] == ["/antidote"]
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "target/" in ignored and ".venv/" in ignored


# What gcr.io/distroless/cc-debian12 ships: glibc (libc, libm, libdl, librt,
# libpthread, the loader) and libgcc_s; no OpenSSL, no libstdc++ guarantees.
DISTROLESS_CC = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
                 "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libgcc_s.so.1"}


@pytest.mark.skipif(not shutil.which("readelf"), reason="readelf (binutils) not installed")
def test_the_binary_needs_only_libraries_the_runtime_image_has():
    assert "distroless/cc-" in dockerfile()["FROM"][-1], "the set below is distroless cc's"
    out = subprocess.run(["readelf", "-d", str(ANTIDOTE_BIN)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))
    assert needed and needed <= DISTROLESS_CC, needed - DISTROLESS_CC


def test_the_image_command_line_serves_clients_and_probes(workdir, broker):
    """ENTRYPOINT + CMD exactly as the image runs them, ENV as it sets it,
    the Kubernetes ConfigMaps at the paths the image documents (under a temp
    root instead of /), the broker from KAFKA_BOOTSTRAP."""
    d = dockerfile()
    docs = render()
    root = workdir / f"image-root-{uuid.uuid4().hex[:8]}"
    port, base, admin = free_port(), free_port_base(), free_port()
    mounts = mounted_configmaps(docs)
    cfg_path = d["ENV"]["ANTIDOTE_CONFIG"]
    cfg_dir, cfg_name = str(Path(cfg_path).parent), Path(cfg_path).name
    assert cfg_dir in mounts, f"the image's ANTIDOTE_CONFIG ({cfg_path}) is where Kubernetes mounts it"
    mounts[cfg_dir] = {**mounts[cfg_dir],
                       cfg_name: on_loopback(mounts[cfg_dir][cfg_name], port, base, admin)}
    materialize(root, mounts, "2026_11_30_00_00_00.000000001")
    # The image exposes the ports the config listens on.
    expose = set(d["EXPOSE"])
    assert {"29092", "9644"} <= expose and "29100-29102" in expose, expose
    argv = [str(ANTIDOTE_BIN) if a == "/antidote" else a for a in d["ENTRYPOINT"]] + d["CMD"]
    env = base_env(ANTIDOTE_CONFIG=str(root) + cfg_path, **{
        k: v for k, v in container_env(docs).items() if k != "ANTIDOTE_CONFIG"})
    env.update(TEST_ENV)
    env["KAFKA_BOOTSTRAP"] = broker.bootstrap
    p = Proc(argv, env, workdir / f"{root.name}.log")
    try:
        wait_for_port(port, 15, p.proc, p.log, "antidote (image command line)")
        probes = container(docs)
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            wait_http(admin, probes[probe]["httpGet"]["path"], 200)
        assert http_get(admin, "/metrics") == 200
        assert http_get(admin, "/no-such-endpoint") == 404, "probes are checked against real paths"
        produce_and_read_through(f"{HOST}:{port}", broker)
        assert '"level":"INFO"' in p.text(), "CMD asks for JSON logs"
    finally:
        p.stop_and_check()


# ---------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------

def test_manifests_run_three_hardened_replicas_with_probes_on_the_admin_port():
    docs = render()
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 3
    pod = dep["spec"]["template"]
    c = container(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    cfg = yaml.safe_load(config_text(docs))
    admin_port = int(cfg["admin"]["listen"].rsplit(":", 1)[1])
    assert ports["admin"] == admin_port
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/path"] == "/metrics"
    assert int(ann["prometheus.io/port"]) == admin_port
    sc, psc = c["securityContext"], pod["spec"]["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"]
    # The budget the config gives decoding fits under the memory limit.
    limit = c["resources"]["limits"]["memory"]
    assert limit.endswith("Mi") and cfg["limits"]["decode_budget"] < int(limit[:-2]) * 2**20 / 2
    grace = int(cfg["limits"]["shutdown_grace"].rstrip("s"))
    assert grace < pod["spec"]["terminationGracePeriodSeconds"]
    pdb = one(docs, "PodDisruptionBudget")
    labels = pod["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    assert one(docs, "Deployment")["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_service_ports_are_the_ports_the_config_listens_on():
    docs = render()
    cfg = yaml.safe_load(config_text(docs))
    bootstrap = int(cfg["listen"]["bootstrap"].rsplit(":", 1)[1])
    base = cfg["listen"]["broker_port_base"]
    container_ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    svc = one(docs, "Service")
    assert svc["spec"]["selector"].items() <= \
        one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    seen = {}
    for p in svc["spec"]["ports"]:
        target = container_ports[p["targetPort"]]
        assert p["port"] == target, p
        seen[p["name"]] = target
    assert seen.pop("bootstrap") == bootstrap
    assert seen, "at least one broker port"
    for name, port in seen.items():
        node = int(name.removeprefix("broker-"))
        assert port == base + node, f"{name} is served at {base}+{node}"
    assert "admin" not in seen, "the admin port stays inside the cluster network policy's reach"


def test_antidote_check_accepts_the_config_and_policies_the_configmaps_carry(workdir):
    """The ConfigMaps laid out as the kubelet does (symlinks and `..data`),
    the Deployment's environment, `antidote check` as the image would run it."""
    docs = render()
    root = workdir / f"k8s-check-{uuid.uuid4().hex[:8]}"
    materialize(root, mounted_configmaps(docs), "2026_11_30_00_00_00.000000001")
    env = base_env(**container_env(docs))
    env["ANTIDOTE_CONFIG"] = str(root) + env["ANTIDOTE_CONFIG"]
    r = run_cli([str(ANTIDOTE_BIN), "check"], env)
    assert r.returncode == 0, r.stdout + r.stderr
    # The check really reads that policy folder: break the policy and it says so.
    pol = root / "etc/antidote/policies"
    text = (pol / "geofence.yaml").read_text().replace("on_invalid: divert", "on_invalid: explode")
    kubelet_write(pol, {**{f.name: f.read_text() for f in pol.iterdir() if not f.name.startswith("..")},
                        "geofence.yaml": text}, "2026_11_30_00_00_01.000000001")
    r = run_cli([str(ANTIDOTE_BIN), "check"], env)
    assert r.returncode != 0 and "/policies/geofence.yaml:26:17: policies[0].on_invalid" in r.stderr, \
        r.stderr


def test_a_configmap_symlink_swap_reloads_the_policies(workdir, broker):
    """A policy updated the way the kubelet updates a mounted ConfigMap
    (`..data` renamed to a new timestamped dir, the key's own symlink
    untouched) is picked up by the running proxy without a signal."""
    docs = render()
    topic = f"deploy-swap-{uuid.uuid4().hex[:8]}"
    direct = Endpoint(broker.bootstrap)
    ck_create_topic(direct, topic, 1)
    root = workdir / f"k8s-swap-{uuid.uuid4().hex[:8]}"
    port, base, admin = free_port(), free_port_base(), free_port()
    mounts = mounted_configmaps(docs)
    env = base_env(**container_env(docs))
    cfg_path = env["ANTIDOTE_CONFIG"]
    cfg_dir, cfg_name = str(Path(cfg_path).parent), Path(cfg_path).name
    mounts[cfg_dir] = {cfg_name: on_loopback(mounts[cfg_dir][cfg_name], port, base, admin)}
    pol_dir = "/etc/antidote/policies"
    policies = {**mounts.pop(pol_dir), "swap.yaml": POLICY.format(topic=topic, max_lat=90)}
    materialize(root, mounts, "2026_11_30_00_00_00.000000001")
    pol = root / pol_dir.lstrip("/")
    kubelet_write(pol, policies, "2026_11_30_00_00_00.000000001")
    env.update(TEST_ENV, ANTIDOTE_CONFIG=str(root) + cfg_path, KAFKA_BOOTSTRAP=broker.bootstrap)
    p = Proc([str(ANTIDOTE_BIN), "run"], env, workdir / f"{root.name}.log")
    try:
        wait_for_port(port, 15, p.proc, p.log, "antidote (ConfigMap layout)")
        ep = Endpoint(f"{HOST}:{port}", "proxy")
        ck_produce(direct, topic, [Rec(0, -1, b"old", b'{"lat": 95}', (), None),
                                   Rec(0, -1, b"ok", b'{"lat": 10}', (), None)])
        got = ck_consume_assign(ep, topic, [0], 1, timeout=60)
        assert [r.key for r in got] == [b"ok"], "lat 95 is poison under the first policy"
        time.sleep(1.5)  # past the next poll, so a swap cannot hide inside one second
        kubelet_write(pol, {**policies, "swap.yaml": POLICY.format(topic=topic, max_lat=100)},
                      "2026_11_30_00_01_00.000000001")
        assert (pol / "swap.yaml").is_symlink() and os.readlink(pol / "swap.yaml") == "..data/swap.yaml"
        p.wait_for_log("policies reloaded")
        ck_produce(direct, topic, [Rec(0, -1, b"new", b'{"lat": 95}', (), None)])
        got = ck_consume_assign(ep, topic, [0], 2, timeout=60)
        # The new policy passes lat 95; the first record stays diverted (ledger).
        assert [r.key for r in got] == [b"ok", b"new"], got
    finally:
        p.stop_and_check()


# ---------------------------------------------------------------------------
# systemd
# ---------------------------------------------------------------------------

def test_systemd_unit_is_hardened_and_reloads_with_sighup():
    u = unit()
    assert u["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    for key, want in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                      ("PrivateTmp", "yes"), ("DynamicUser", "yes"), ("ProtectHome", "yes"),
                      ("ReadOnlyPaths", "/etc/antidote"), ("CapabilityBoundingSet", "")]:
        assert u[key] == [want], key
    assert int(u["LimitNOFILE"][0]) >= 2 * 10_000 + 128, "room for limits.max_connections"


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze not installed")
def test_systemd_analyze_verifies_the_unit(workdir):
    # verify also checks that ExecStart's binary exists: point it at ours.
    copy = workdir / "antidote.service"
    copy.write_text(UNIT.read_text().replace("/usr/local/bin/antidote", str(ANTIDOTE_BIN.resolve())))
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


def test_systemd_command_lines_check_run_and_reload_the_proxy(workdir, broker):
    """ExecStartPre, ExecStart and ExecReload as systemd would run them, with
    the unit's Environment (the config path remapped into a temp dir)."""
    u = unit()
    env = base_env()
    for assignment in u["Environment"]:
        k, _, v = assignment.partition("=")
        env[k] = v
    etc = workdir / f"systemd-etc-{uuid.uuid4().hex[:8]}"
    (etc / "policies").mkdir(parents=True)
    port, base = free_port(), free_port_base()
    cfg = Path(str(etc) + env["ANTIDOTE_CONFIG"].removeprefix("/etc/antidote"))
    cfg.write_text(f"listen:\n  bootstrap: {HOST}:{port}\n  broker_port_base: {base}\n"
                   f"upstream:\n  bootstrap_servers: [{broker.bootstrap}]\npolicies: [policies/]\n")
    (etc / "policies" / "p.yaml").write_text(POLICY.format(topic="systemd-test", max_lat=90))
    env["ANTIDOTE_CONFIG"] = str(cfg)

    def argv(line: str) -> list[str]:
        words = shlex.split(line)
        assert words[0] == "/usr/local/bin/antidote"
        return [str(ANTIDOTE_BIN)] + words[1:]

    r = run_cli(argv(u["ExecStartPre"][0]), env)
    assert r.returncode == 0, r.stderr
    p = Proc(argv(u["ExecStart"][0]), env, workdir / f"{etc.name}.log")
    try:
        wait_for_port(port, 15, p.proc, p.log, "antidote (systemd ExecStart)")
        reload = shlex.split(u["ExecReload"][0].replace("$MAINPID", str(p.proc.pid)))
        subprocess.run(reload, check=True, timeout=10)
        p.wait_for_log("policies reloaded")
        assert "SIGHUP" in p.text()
    finally:
        p.stop_and_check()
