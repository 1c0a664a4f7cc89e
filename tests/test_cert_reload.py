"""The listener's TLS certificate is reloaded without a restart: when its
files change (polled every second) and on SIGHUP. New handshakes get the new
certificate, connections opened before go on, and a replacement that does
not load (unreadable, key not matching) is refused while the old one stays.

Which certificate a handshake got is read from the client side: the SHA-256
of the peer certificate Python's `ssl` receives, compared with the files'."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import clients as c
from conftest import start_proxy
from harness import HOST, api_versions, read_log

# Every PEM file written is padded with newlines to this size, so that a
# replacement can keep its file's size (and, restored, its mtime): then
# only SIGHUP, not the file poll, can notice it.
PEM_SIZE = 8192


@dataclass
class Identity:
    cert: bytes
    key: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.cert.decode())).hexdigest()


@pytest.fixture(scope="module")
def identities(workdir) -> tuple[Path, list[Identity]]:
    """A test CA and three server certificates for localhost, each with its own key."""
    d = workdir / "reload-certs"
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=antidote-reload-test-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    out = []
    for i in range(3):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"s{i}.key", "-out", f"s{i}.csr",
            "-subj", f"/CN=localhost-{i}")
        run("x509", "-req", "-in", f"s{i}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"s{i}.pem", "-days", "2", "-extfile", "server.ext")
        out.append(Identity((d / f"s{i}.pem").read_bytes(), (d / f"s{i}.key").read_bytes()))
    return d / "ca.pem", out


def write_padded(path: Path, data: bytes, keep_stat: bool = False) -> None:
    """Replace `path` atomically (rename), padded to PEM_SIZE; with `keep_stat`
    its modification time is set back to the old one."""
    assert len(data) < PEM_SIZE
    old = path.stat() if keep_stat else None
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data + b"\n" * (PEM_SIZE - len(data)))
    os.replace(tmp, path)
    if old is not None:
        os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))


def install(files: tuple[Path, Path], ident: Identity, keep_stat: bool = False) -> None:
    write_padded(files[1], ident.key, keep_stat)
    write_padded(files[0], ident.cert, keep_stat)


def tls_connect(port: int, ca: Path) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(ca))
    raw = socket.create_connection((HOST, port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def served_sha256(port: int, ca: Path) -> str:
    """The certificate a new handshake gets (and the connection relays)."""
    with tls_connect(port, ca) as s:
        api_versions(s)
        der = s.getpeercert(binary_form=True)
    return hashlib.sha256(der).hexdigest()


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def reloading_proxy(workdir, broker, identities, request):
    ca, ids = identities
    d = workdir / f"live-{request.node.name}"
    d.mkdir()
    files = (d / "listener.pem", d / "listener.key")
    install(files, ids[0])
    p = start_proxy(workdir, name="antidote-reload", upstream=[broker.bootstrap],
                    listen_tls={"cert": files[0], "key": files[1]})
    yield p, files
    p.stop_and_check()


def test_changed_files_serve_new_handshakes_while_open_connections_go_on(
        reloading_proxy, identities, new_topic):
    p, files = reloading_proxy
    ca, ids = identities
    port = p.bootstrap_port
    assert served_sha256(port, ca) == ids[0].sha256
    before = tls_connect(port, ca)
    try:
        api_versions(before)
        assert hashlib.sha256(before.getpeercert(True)).hexdigest() == ids[0].sha256
        install(files, ids[1])
        wait_for(lambda: served_sha256(port, ca) == ids[1].sha256, 15,
                 "new handshakes to get the new certificate")
        # The connection opened before the swap is still served.
        assert api_versions(before)
        assert hashlib.sha256(before.getpeercert(True)).hexdigest() == ids[0].sha256
    finally:
        before.close()
    log = read_log(p.log)
    assert f"sha256={ids[1].sha256}" in log and "certificate files changed" in log, log[-3000:]
    # Real clients complete handshakes with the new certificate.
    ep = c.Endpoint(p.bootstrap, "proxy", ca=str(ca))
    topic = new_topic(1)
    recs = c.sample_records(4, tag="after-reload")
    c.ck_produce(ep, topic, recs)
    assert c.kp_consume_assign(ep, topic, [0], len(recs)) == recs


def test_sighup_reloads_a_certificate_the_file_poll_cannot_see(reloading_proxy, identities):
    p, files = reloading_proxy
    ca, ids = identities
    port = p.bootstrap_port
    install(files, ids[1], keep_stat=True)   # same size, same mtime: invisible to the poll
    time.sleep(2.5)                          # more than two poll intervals
    assert served_sha256(port, ca) == ids[0].sha256, "the poll saw a change it should not"
    os.kill(p.proc.pid, signal.SIGHUP)
    wait_for(lambda: served_sha256(port, ca) == ids[1].sha256, 10,
             "SIGHUP to load the new certificate")
    assert 'why="SIGHUP"' in read_log(p.log) or "why=SIGHUP" in read_log(p.log)
    p.assert_running()


def rejections(p) -> int:
    return read_log(p.log, limit=10**7).count("listener certificate reload rejected")


def test_a_broken_replacement_is_refused_and_the_old_certificate_stays(reloading_proxy,
                                                                        identities):
    p, files = reloading_proxy
    ca, ids = identities
    port = p.bootstrap_port
    # Not a certificate at all.
    n = rejections(p)
    write_padded(files[0], b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n"
                           b"-----END CERTIFICATE-----\n")
    wait_for(lambda: rejections(p) > n, 10, "the unreadable certificate to be rejected")
    assert served_sha256(port, ca) == ids[0].sha256
    # A valid certificate whose key is not the one in the key file.
    n = rejections(p)
    write_padded(files[0], ids[2].cert)
    wait_for(lambda: rejections(p) > n, 10, "the mismatched key to be rejected")
    assert served_sha256(port, ca) == ids[0].sha256
    log = read_log(p.log, limit=10**7)
    assert "the private key does not belong to the certificate" in log, log[-3000:]
    assert f"running_sha256={ids[0].sha256}" in log, log[-3000:]
    # The key file gone (a Secret mid-update, a bad path).
    n = rejections(p)
    files[1].unlink()
    wait_for(lambda: rejections(p) > n, 10, "the missing key file to be rejected")
    assert served_sha256(port, ca) == ids[0].sha256
    # Fixing the key file completes the pair: it is taken.
    write_padded(files[1], ids[2].key)
    wait_for(lambda: served_sha256(port, ca) == ids[2].sha256, 10,
             "the repaired pair to be loaded")
    p.assert_running()
