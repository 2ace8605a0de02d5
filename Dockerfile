# Build: docker build -t legate .
# Run:   docker run --rm -p 8080:8080 -p 9901:9901 legate
#        (then mount a config of your own over /etc/legate/legate.yaml; see configs/container.yaml
#        and, for Kubernetes, deploy/kubernetes.yaml)
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# Without the `demo` feature: the image carries no test servers.
RUN cargo build --release --locked --no-default-features --bin legate

FROM debian:bookworm-slim
# The system's roots, for clusters that speak TLS to their hosts. Not pinned: the roots should
# follow Debian's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home legate
COPY --from=build /src/target/release/legate /usr/local/bin/legate
COPY configs/container.yaml /etc/legate/legate.yaml
USER 10001
# The listener and the admin server (/ready, /stats/prometheus) of configs/container.yaml.
EXPOSE 8080 9901
# One JSON object a line, for log pipelines.
ENV LEGATE_LOG_FORMAT=json
# Ready while serving; 503 while draining on SIGTERM, after /healthcheck/fail, or overloaded.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s CMD ["/usr/local/bin/legate", "ready", "--admin", "127.0.0.1:9901"]
ENTRYPOINT ["/usr/local/bin/legate"]
CMD ["-c", "/etc/legate/legate.yaml"]
