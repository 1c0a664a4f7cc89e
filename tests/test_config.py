"""The harness writes proxy configs by hand: `antidote check` must accept every
shape it writes, so a config schema change shows up here, not as a proxy that
silently fails to start in every other test."""

from __future__ import annotations

import subprocess

import pytest

import harness as h


@pytest.mark.parametrize("variant", ["plain", "listen_tls", "listen_mtls", "upstream_mtls"])
def test_harness_generated_config_passes_antidote_check(variant, workdir, certs):
    kw = {"plain": {},
          "listen_tls": {"listen_tls": {"cert": certs.server_cert, "key": certs.server_key}},
          "listen_mtls": {"listen_tls": {"cert": certs.server_cert, "key": certs.server_key,
                                         "client_ca": certs.ca}},
          "upstream_mtls": {"upstream_tls": {"ca": certs.ca, "cert": certs.client_cert,
                                             "key": certs.client_key}}}[variant]
    a = h.Antidote(workdir, upstream=["127.0.0.1:9092"], name=f"check-{variant}", **kw)
    a.config_path.write_text(a.config_yaml())
    assert h.ANTIDOTE_BIN.exists(), f"no antidote binary at {h.ANTIDOTE_BIN}"
    r = subprocess.run([str(h.ANTIDOTE_BIN), "check", "--config", str(a.config_path)],
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{a.config_yaml()}\n{r.stderr}"
