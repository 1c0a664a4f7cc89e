# syntax=docker/dockerfile:1
# antidote container image: a stripped release binary on distroless (glibc,
# no shell, no package manager), running as the non-root user 65532.
#
#   docker build -t antidote:dev .
#   docker run --rm -v $PWD/deploy/kubernetes/config:/etc/antidote/config:ro \
#     -v $PWD/deploy/kubernetes/policies:/etc/antidote/policies:ro \
#     -e KAFKA_BOOTSTRAP=kafka:9092 -e ANTIDOTE_ADVERTISED_HOST=localhost \
#     -p 29092:29092 -p 29100-29102:29100-29102 -p 9644:9644 antidote:dev
#
# Mounted paths (read-only is enough; the proxy writes no files):
#   /etc/antidote/config/config.yaml   the config (ANTIDOTE_CONFIG points here)
#   /etc/antidote/policies/            policy and schema files (hot-reloaded)
# tests/test_deploy.py runs this file's ENTRYPOINT + CMD with that layout.

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-slim-bookworm AS builder
WORKDIR /build
COPY . .
# The dist profile (Cargo.toml) is release without debug info, stripped.
# Cache mounts keep the registry and build tree between builds; the binary
# is copied out of the cached target dir in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/build/target \
    cargo build --profile dist --locked --bin antidote \
    && cp target/dist/antidote /antidote

# cc: glibc and libgcc, which the binary links (bookworm on both sides).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /antidote /antidote
ENV ANTIDOTE_CONFIG=/etc/antidote/config/config.yaml
USER 65532:65532
# 29092 bootstrap, 29100+N broker with node id N (three brokers here), 9644 admin.
EXPOSE 29092 29100-29102 9644
ENTRYPOINT ["/antidote"]
CMD ["run", "--log-format", "json"]
