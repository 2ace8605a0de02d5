//! One external authorization check, client to sidecar and back, over loopback TCP and over a
//! Unix socket: the round trip an `ext_authz` listener adds at best. The sidecar (testbed's,
//! allowing at once) runs on its own runtime thread, as a sidecar process would; the client
//! sends one check at a time on its one HTTP/2 connection. benches/ext_authz/run.sh measures
//! what the proxy adds on top of this.

use std::time::Duration;

use authz_client::{AuthzClient, CheckInput, Endpoint};
use criterion::{Criterion, criterion_group, criterion_main};
use testbed::{AuthzRules, AuthzSidecar, SidecarAddr, SidecarMode};

fn check_round_trip(c: &mut Criterion) {
    let socket =
        std::env::temp_dir().join(format!("legate-authz-bench-{}.sock", std::process::id()));
    let tcp = AuthzSidecar::start_in_thread(
        SidecarAddr::Tcp(([127, 0, 0, 1], 0).into()),
        SidecarMode::Grpc,
        AuthzRules::default(),
    )
    .expect("sidecar on TCP");
    let unix = AuthzSidecar::start_in_thread(
        SidecarAddr::Unix(socket.clone()),
        SidecarMode::Grpc,
        AuthzRules::default(),
    )
    .expect("sidecar on a Unix socket");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut headers = http::HeaderMap::new();
    headers.insert("user-agent", http::HeaderValue::from_static("bench"));
    headers.insert("accept", http::HeaderValue::from_static("*/*"));
    let input = CheckInput {
        method: &http::Method::GET,
        path: "/",
        host: "127.0.0.1:21500",
        scheme: "http",
        version: http::Version::HTTP_11,
        headers: &headers,
        request_id: "0b8ab7c4-5b1c-4a8e-9f0e-2f1f2d9d7a11",
        source: "127.0.0.1:40000".parse().expect("addr"),
        destination: "127.0.0.1:21500".parse().expect("addr"),
        context_extensions: &[],
        allowed_headers: None,
        route_metadata: None,
        body: None,
        traceparent: None,
        tracestate: None,
    };
    let mut group = c.benchmark_group("authz/check_round_trip");
    for (name, endpoint) in [
        ("tcp", Endpoint::Tcp(tcp.local_addr().expect("tcp address"))),
        ("unix", Endpoint::Unix(socket.clone())),
    ] {
        let client = AuthzClient::grpc(endpoint, Duration::from_secs(1));
        // Connect once outside the measurement.
        runtime.block_on(client.check(&input)).expect("check");
        group.bench_function(name, |b| {
            b.iter(|| runtime.block_on(client.check(&input)).expect("check"))
        });
    }
    group.finish();
    tcp.shutdown();
    unix.shutdown();
}

criterion_group!(benches, check_round_trip);
criterion_main!(benches);
