"""Measurement, not a test: TLS handshake + ApiVersions time with listen.sni
and without (200 each, twice), and how long a changed listener certificate
takes to reach new handshakes (6 swaps). Debug build, against tansu:

    .venv/bin/python -m pytest scripts/bench/sni_tls.py -q -s -p no:cacheprovider
"""
import sys, time, ssl, socket, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from conftest import workdir, broker, _PROXIES  # noqa
from test_sni import sni_certs, sni_proxy, SniAntidote, BOOTSTRAP_NAME  # noqa
from test_cert_reload import identities, reloading_proxy, install, served_sha256  # noqa
from harness import HOST, api_versions
from conftest import start_proxy


def handshakes(port, ca, name, n=200):
    ctx = ssl.create_default_context(cafile=str(ca))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with socket.create_connection((HOST, port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname=name) as s:
                api_versions(s)
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times) * 1e3, times[int(n * 0.95)] * 1e3


def test_measure(workdir, broker, sni_certs, sni_proxy, reloading_proxy, identities):
    plain = start_proxy(workdir, name="m-plain", upstream=[broker.bootstrap],
                        listen_tls={"cert": sni_certs.cert, "key": sni_certs.key})
    for _ in range(2):
        print("\nsni   p50/p95 ms", handshakes(sni_proxy.bootstrap_port, sni_certs.ca, BOOTSTRAP_NAME))
        print("nosni p50/p95 ms", handshakes(plain.bootstrap_port, sni_certs.ca, "x.kafka.test"))
    plain.stop_and_check()
    p, files = reloading_proxy
    ca, ids = identities
    lat = []
    for i in range(6):
        target = ids[(i + 1) % 2]
        t = time.perf_counter()
        install(files, target)
        while served_sha256(p.bootstrap_port, ca) != target.sha256:
            time.sleep(0.02)
        lat.append(time.perf_counter() - t)
    print("reload latency s", [round(x, 2) for x in lat])
