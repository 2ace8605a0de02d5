# Build: docker build -t legate .
# Run:   docker run --rm -p 8080:8080 -v $PWD/configs:/etc/legate legate -c /etc/legate/edge.yaml
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin legate

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home legate
COPY --from=build /src/target/release/legate /usr/local/bin/legate
USER legate
ENTRYPOINT ["/usr/local/bin/legate"]
CMD ["-c", "/etc/legate/legate.yaml"]
