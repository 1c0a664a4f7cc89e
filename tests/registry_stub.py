"""A small schema registry speaking the Confluent REST API, for tests only.

No registry server can be installed on the test machines (Karapace is not
packaged; the Java registries need Maven Central), so this stub stands in.
It serves what confluent-kafka's `confluent_kafka.schema_registry`
serializers and antidote use: registering and looking up schemas under
subjects (with references), schemas by id, the subjects and versions of an
id, soft-deleted versions (`DELETE /subjects/{s}/versions/{v}`: left out of
every listing and lookup unless `?deleted=true`, the schema still served by
id, as Confluent's registry does), compatibility config, 404s with Confluent error codes, basic auth; and
fault injection (`mode`): "ok", "down" (connections are closed without an
answer), "500", or "slow" (answers after `slow_s` seconds).

Schemas are stored as sent: Protobuf as the base64 FileDescriptorProto the
Python serializer registers (a real Confluent registry stores .proto text;
antidote reads both). One global id per distinct (type, schema, references,
metadata, ruleSet), as in Confluent's registry; a schema's `metadata` and
data-contract `ruleSet` are served with it (by id, by subject and version,
and by lookup), as Confluent Schema Registry 7.4+ serves them.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class Registry:
    def __init__(self, auth: tuple[str, str] | None = None,
                 tls: tuple[str, str] | None = None):
        """`tls`: (certificate, key) files to serve https instead of http."""
        self.auth = auth
        self.tls = tls
        self.mode = "ok"
        self.slow_s = 3.0
        self.lock = threading.Lock()
        self.schemas: dict[int, dict] = {}          # id -> {schema, schemaType, references}
        self.by_key: dict[str, int] = {}
        self.subjects: dict[str, list[int]] = {}    # subject -> [id per version]
        self.deleted: set[tuple[str, int]] = set()  # soft-deleted (subject, version)
        self.next_id = 1
        self.requests: list[tuple[str, str]] = []   # (method, path)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "Registry":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def id_requests(self, schema_id: int) -> int:
        with self.lock:
            return sum(1 for m, p in self.requests if m == "GET" and p == f"/schemas/ids/{schema_id}")

    # -- the registry's state ------------------------------------------------

    def register(self, subject: str, body: dict) -> int:
        schema_type = body.get("schemaType", "AVRO") or "AVRO"
        refs = body.get("references") or []
        # Confluent Schema Registry 7.4+: metadata and the data-contract
        # ruleSet are part of what is registered; the same text with other
        # rules is another schema, with its own id.
        metadata, rule_set = body.get("metadata"), body.get("ruleSet")
        key = json.dumps([schema_type, body["schema"], refs, metadata, rule_set], sort_keys=True)
        with self.lock:
            sid = self.by_key.get(key)
            if sid is None:
                sid = self.next_id
                self.next_id += 1
                self.by_key[key] = sid
                self.schemas[sid] = {"schema": body["schema"], "schemaType": schema_type,
                                     "references": refs, "metadata": metadata,
                                     "ruleSet": rule_set}
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid

    def live_versions(self, subject: str, deleted: bool = False) -> list[int]:
        """The version numbers of `subject`, soft-deleted ones only if asked."""
        return [n for n in range(1, len(self.subjects.get(subject, [])) + 1)
                if deleted or (subject, n) not in self.deleted]

    def version_of(self, subject: str, version: str, deleted: bool = False):
        live = self.live_versions(subject, deleted)
        if not live:
            return None, 40401
        versions = self.subjects[subject]
        if version in ("latest", "-1"):
            n = live[-1]
        else:
            try:
                n = int(version)
            except ValueError:
                return None, 40402
        if n not in live:
            return None, 40402
        sid = versions[n - 1]
        return self._entry(sid, subject, n), None

    def _entry(self, sid: int, subject: str, version: int) -> dict:
        s = self.schemas[sid]
        out = {"subject": subject, "version": version, "id": sid, "schema": s["schema"],
               "references": s["references"]}
        if s["schemaType"] != "AVRO":
            out["schemaType"] = s["schemaType"]
        return with_rules(out, s)


def with_rules(out: dict, s: dict) -> dict:
    """`out` with the schema's `metadata` and `ruleSet`, as Confluent's API
    returns them (absent when the schema was registered without)."""
    for k in ("metadata", "ruleSet"):
        if s.get(k) is not None:
            out[k] = s[k]
    return out


def _handler(reg: Registry):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep pytest output clean
            pass

        def _send(self, status: int, obj) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, code: int, msg: str) -> None:
            self._send(status, {"error_code": code, "message": msg})

        def _gate(self) -> bool:
            """Fault injection and auth; False when the request is answered."""
            mode = reg.mode
            if mode == "down":
                self.close_connection = True
                try:
                    self.connection.shutdown(2)
                except OSError:
                    pass
                return False
            if mode == "slow":
                time.sleep(reg.slow_s)
            if mode == "500":
                self._error(500, 50001, "injected failure")
                return False
            if reg.auth:
                want = "Basic " + base64.b64encode(f"{reg.auth[0]}:{reg.auth[1]}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    self._error(401, 40101, "Unauthorized")
                    return False
            return True

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self):
            url = urlparse(self.path)
            path = url.path
            with reg.lock:
                reg.requests.append(("GET", path))
            if not self._gate():
                return
            with reg.lock:
                self._get(path, "deleted=true" in url.query)

        def do_DELETE(self):
            path = urlparse(self.path).path
            with reg.lock:
                reg.requests.append(("DELETE", path))
            if not self._gate():
                return
            with reg.lock:
                if m := re.fullmatch(r"/subjects/([^/]+)/versions/([^/]+)", path):
                    subject = unquote(m[1])
                    entry, code = reg.version_of(subject, m[2])
                    if entry is None:
                        return self._error(404, code, "Subject or version not found")
                    reg.deleted.add((subject, entry["version"]))
                    return self._send(200, entry["version"])
            return self._error(404, 404, f"stub: no route for DELETE {path}")

        def _get(self, path: str, deleted: bool = False) -> None:
            if m := re.fullmatch(r"/schemas/ids/(\d+)", path):
                s = reg.schemas.get(int(m[1]))
                if s is None:
                    return self._error(404, 40403, "Schema not found")
                out = {"schema": s["schema"], "references": s["references"]}
                if s["schemaType"] != "AVRO":
                    out["schemaType"] = s["schemaType"]
                return self._send(200, with_rules(out, s))
            if m := re.fullmatch(r"/schemas/ids/(\d+)/versions", path):
                sid = int(m[1])
                if sid not in reg.schemas:
                    return self._error(404, 40403, "Schema not found")
                return self._send(200, [{"subject": s, "version": n}
                                        for s, v in reg.subjects.items()
                                        for n in reg.live_versions(s, deleted) if v[n - 1] == sid])
            if path == "/subjects":
                return self._send(200, sorted(s for s in reg.subjects
                                              if reg.live_versions(s, deleted)))
            if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                live = reg.live_versions(unquote(m[1]), deleted)
                if not live:
                    return self._error(404, 40401, "Subject not found")
                return self._send(200, live)
            if m := re.fullmatch(r"/subjects/([^/]+)/versions/([^/]+)", path):
                entry, code = reg.version_of(unquote(m[1]), m[2], deleted)
                if entry is None:
                    return self._error(404, code, "Subject or version not found")
                return self._send(200, entry)
            if re.fullmatch(r"/config(/[^/]+)?", path):
                return self._send(200, {"compatibilityLevel": "NONE"})
            return self._error(404, 404, f"stub: no route for GET {path}")

        def do_POST(self):
            path = urlparse(self.path).path
            with reg.lock:
                reg.requests.append(("POST", path))
            if not self._gate():
                return
            body = self._body()
            if m := re.fullmatch(r"/subjects/([^/]+)/versions", path):
                sid = reg.register(unquote(m[1]), body)
                return self._send(200, {"id": sid})
            if m := re.fullmatch(r"/subjects/([^/]+)", path):
                subject = unquote(m[1])
                with reg.lock:
                    for n, sid in enumerate(reg.subjects.get(subject, []), start=1):
                        s = reg.schemas[sid]
                        if s["schema"] == body.get("schema") and \
                                body.get("ruleSet") in (None, s.get("ruleSet")):
                            return self._send(200, reg._entry(sid, subject, n))
                return self._error(404, 40403, "Schema not found")
            return self._error(404, 404, f"stub: no route for POST {path}")

    return Handler
