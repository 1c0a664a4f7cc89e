"""Apache Kafka brokers with their own secured client listeners, for the
SASL and TLS tests (they replace the SASL-terminating relay and the TLS
terminator that stood in front of tansu, which has neither).

`SecureKafka` is a `harness.KafkaBroker` with a second client listener,
SECURE, of one of Kafka's protocols: SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256,
SCRAM-SHA-512), SSL (server certificate from `harness.make_certs`; with
`client_auth="required"`, mTLS) or SASL_SSL. PLAINTEXT stays the
controller's, the inter-broker and the test's own listener (creating users,
reading what landed). Its metadata answers on SECURE name SECURE's port, so
a proxy pointed at `secure_bootstrap` serves that listener.

SCRAM users are made and changed through the Admin API
(AlterUserScramCredentials, `set_scram`), as an operator does; PLAIN users
come from the listener's JAAS line (Kafka's own PlainLoginModule keeps them
there). Failed authentications are in the broker's log
(`failed_authentications`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import harness as h

PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass
class SecureKafka(h.KafkaBroker):
    protocol: str = "SASL_PLAINTEXT"        # SASL_PLAINTEXT | SSL | SASL_SSL
    secure_port: int = field(default_factory=h.free_port)
    plain_users: dict = field(default_factory=dict)   # PLAIN: user -> password
    certs: Optional[h.Certs] = None          # SSL, SASL_SSL
    client_auth: str = "none"                # SSL: none | required (mTLS)

    def __post_init__(self) -> None:
        props = {
            "listeners": (f"PLAINTEXT://127.0.0.1:{self.port},"
                          f"CONTROLLER://127.0.0.1:{self.controller_port},"
                          f"SECURE://127.0.0.1:{self.secure_port}"),
            "advertised.listeners": (f"PLAINTEXT://127.0.0.1:{self.port},"
                                     f"SECURE://127.0.0.1:{self.secure_port}"),
            "listener.security.protocol.map": (
                f"CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SECURE:{self.protocol}"),
        }
        if "SASL" in self.protocol:
            users = "".join(f' user_{u}="{p}"' for u, p in self.plain_users.items())
            props["sasl.enabled.mechanisms"] = ",".join(MECHANISMS)
            props["listener.name.secure.plain.sasl.jaas.config"] = \
                f"{PLAIN_LOGIN} required{users};"
            for m in ("scram-sha-256", "scram-sha-512"):
                props[f"listener.name.secure.{m}.sasl.jaas.config"] = f"{SCRAM_LOGIN} required;"
        if "SSL" in self.protocol:
            assert self.certs is not None, "SSL needs certificates"
            bundle = self.certs.dir / "server-bundle.pem"
            bundle.write_text(self.certs.server_key.read_text()
                              + self.certs.server_cert.read_text())
            props.update({
                "listener.name.secure.ssl.keystore.type": "PEM",
                "listener.name.secure.ssl.keystore.location": str(bundle),
                "listener.name.secure.ssl.truststore.type": "PEM",
                "listener.name.secure.ssl.truststore.location": str(self.certs.ca),
                "listener.name.secure.ssl.client.auth": self.client_auth,
            })
        self.extra_properties = {**props, **self.extra_properties}

    def log4j2(self) -> str:
        # Refused authentications are logged at INFO by the network layer.
        return h.KAFKA_LOG4J2 + ("logger.net.name = org.apache.kafka.common.network.Selector\n"
                                 "logger.net.level = INFO\n")

    @property
    def plaintext(self) -> str:
        """The unsecured listener: for the test's own admin and reads."""
        return f"{h.HOST}:{self.port}"

    @property
    def secure_bootstrap(self) -> str:
        return f"{h.HOST}:{self.secure_port}"

    def start(self, fresh: bool = False, timeout: float = 90) -> "SecureKafka":
        super().start(fresh=fresh, timeout=timeout)
        h.wait_for_port(self.secure_port, 10, self.proc, self.log, "kafka secure listener")
        return self

    def set_scram(self, user: str, password: str, mechanisms=("SCRAM-SHA-256",
                                                                  "SCRAM-SHA-512")) -> None:
        """Create or change `user`'s SCRAM credentials (AlterUserScramCredentials
        over the plaintext listener), then wait until the SECURE listener
        takes them (the broker applies them from its metadata log)."""
        from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism,
                                           UserScramCredentialUpsertion)
        admin = AdminClient({"bootstrap.servers": self.plaintext, "log_level": 0})
        kinds = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
                 "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
        for m in mechanisms:   # one mechanism of a user per request (DUPLICATE_RESOURCE)
            up = UserScramCredentialUpsertion(user, ScramCredentialInfo(kinds[m], 4096),
                                              password.encode())
            for f in admin.alter_user_scram_credentials([up]).values():
                f.result(30)
        for m in mechanisms:
            self.wait_authenticates(m, user, password)

    def wait_authenticates(self, mechanism: str, user: str, password: str,
                           timeout: float = 30) -> None:
        import confluent_kafka as ck
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            a = ck.admin.AdminClient({**self.client_conf(mechanism, user, password),
                                      "log_level": 0})
            try:
                a.list_topics(timeout=5)
                return
            except ck.KafkaException as e:
                last = e
                time.sleep(0.3)
        raise h.HarnessError(f"{user} never authenticated with {mechanism}: {last}")

    def client_conf(self, mechanism: Optional[str] = None, user: str = "",
                    password: str = "") -> dict:
        """librdkafka settings for the SECURE listener."""
        conf = {"bootstrap.servers": self.secure_bootstrap, "security.protocol": self.protocol}
        if mechanism:
            conf.update({"sasl.mechanism": mechanism, "sasl.username": user,
                         "sasl.password": password})
        if self.certs is not None and "SSL" in self.protocol:
            conf["ssl.ca.location"] = str(self.certs.ca)
            if self.client_auth == "required":
                conf["ssl.certificate.location"] = str(self.certs.client_cert)
                conf["ssl.key.location"] = str(self.certs.client_key)
        return conf

    def failed_authentications(self) -> list[str]:
        """The broker's own log lines of refused authentications."""
        return [line for line in h.read_log(self.log, limit=10**7).splitlines()
                if "Failed authentication" in line]
