//! HTTP/2 to the hosts with a cluster's own flow-control windows (Envoy's cluster
//! `http2_protocol_options`, which Envoy Gateway sends with every HTTP/2 backend), as a host
//! sees them in the proxy's connection preface.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use common::*;

const LIMIT: Duration = Duration::from_secs(20);

/// Accepts the proxy's connection and reads its preface: the SETTINGS_INITIAL_WINDOW_SIZE it
/// announces (65535 if it gives none) and the connection window its first WINDOW_UPDATE
/// opens (65535 + the increment; 65535 when none comes before its first HEADERS).
async fn client_windows(listener: TcpListener) -> (u32, u32) {
    let (mut stream, _) = listener.accept().await.unwrap();
    let read = async {
        let mut magic = [0u8; 24];
        stream.read_exact(&mut magic).await.unwrap();
        assert_eq!(&magic, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        let (mut stream_window, mut connection_window) = (65_535, 65_535);
        loop {
            let mut head = [0u8; 9];
            stream.read_exact(&mut head).await.unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (kind, flags) = (head[3], head[4]);
            let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            let mut payload = vec![0u8; len];
            stream.read_exact(&mut payload).await.unwrap();
            match kind {
                4 if flags & 1 == 0 => {
                    for setting in payload.chunks_exact(6) {
                        if u16::from_be_bytes([setting[0], setting[1]]) == 4 {
                            stream_window = u32::from_be_bytes([
                                setting[2], setting[3], setting[4], setting[5],
                            ]);
                        }
                    }
                }
                8 if stream_id == 0 => {
                    let increment =
                        u32::from_be_bytes([payload[0] & 0x7f, payload[1], payload[2], payload[3]]);
                    connection_window = 65_535 + increment;
                }
                // The request's HEADERS: the preface is over.
                1 => return (stream_window, connection_window),
                _ => {}
            }
        }
    };
    tokio::time::timeout(LIMIT, read)
        .await
        .expect("the proxy's preface and request")
}

fn config(upstream: SocketAddr, windows: &str) -> String {
    format!(
        r#"
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: / }}
        cluster: backend
        timeout: 1s
clusters:
  - name: backend
    endpoints: ["{upstream}"]
    protocol: http2
{windows}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_windows_are_what_its_hosts_are_offered() {
    for (windows, expected) in [
        // Envoy Gateway's: 64 KiB per stream, 1 MiB for the connection.
        (
            "    initial_stream_window_size: 65536\n    initial_connection_window_size: 1048576",
            (65_536, 1_048_576),
        ),
        // None given: the 32 KiB buffer limit per stream, HTTP/2's 64 KiB for the connection.
        ("", (32_768, 65_535)),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let proxy = Proxy::start(&config(upstream, windows), 1);
        let request = tokio::spawn(try_send_h1(proxy.addr(), get("/", &[])));
        assert_eq!(client_windows(listener).await, expected, "{windows:?}");
        // The host went away without answering: the request ends (502 or 503), not hangs.
        let answer = tokio::time::timeout(LIMIT, request).await.unwrap().unwrap();
        assert!(answer.is_ok_and(|r| r.status().is_server_error()));
    }
}
