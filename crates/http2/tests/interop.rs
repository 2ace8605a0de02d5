//! The server connection against the h2 crate's client, over real sockets on 127.0.0.1:
//! concurrent uploads and downloads larger than every window, echoed byte for byte.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

#[path = "../examples/echo_server.rs"]
mod echo_server;

use std::time::Duration;

use bytes::Bytes;
use http2::server::Config;
use tokio::net::{TcpListener, TcpStream};

/// Starts the example server on a free port with `config`; it serves until the test ends.
async fn server(config: Config) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let config = config.clone();
            tokio::spawn(echo_server::serve(socket, config));
        }
    });
    addr
}

async fn client(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let socket = TcpStream::connect(addr).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let (send, connection) = h2::client::handshake(socket).await.unwrap();
    tokio::spawn(connection);
    send
}

/// Sends `body` to `path` and reads the whole response.
async fn exchange(
    send: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    body: Bytes,
) -> (http::StatusCode, Bytes) {
    let request = http::Request::post(format!("http://localhost{path}"))
        .body(())
        .unwrap();
    let mut send = send.clone().ready().await.unwrap();
    let (response, mut upload) = send.send_request(request, body.is_empty()).unwrap();
    if !body.is_empty() {
        // Sent as the window allows.
        let mut rest = body;
        while !rest.is_empty() {
            upload.reserve_capacity(rest.len());
            let granted = std::future::poll_fn(|cx| upload.poll_capacity(cx))
                .await
                .expect("capacity")
                .unwrap();
            let chunk = rest.split_to(granted.min(rest.len()));
            upload.send_data(chunk, rest.is_empty()).unwrap();
        }
    }
    let response = response.await.unwrap();
    let status = response.status();
    let mut body = response.into_body();
    let mut received = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
        received.extend_from_slice(&chunk);
    }
    (status, Bytes::from(received))
}

#[tokio::test]
async fn concurrent_uploads_are_echoed_whole() {
    let addr = server(Config::default()).await;
    let send = client(addr).await;
    let sizes = [0usize, 1, 16_384, 65_535, 65_536, 200_000, 1_000_000];
    let mut tasks = Vec::new();
    for (i, size) in sizes.into_iter().enumerate() {
        let mut send = send.clone();
        tasks.push(tokio::spawn(async move {
            let body: Bytes = (0..size)
                .map(|b| ((b % 251) as u8).wrapping_add(i as u8))
                .collect();
            let (status, echoed) = exchange(&mut send, "/echo", body.clone()).await;
            assert_eq!(status, 200);
            if size == 0 {
                assert_eq!(echoed, "hello");
            } else {
                assert!(echoed == body, "{size} bytes came back altered");
            }
        }));
    }
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("all exchanges finish");
}

#[tokio::test]
async fn downloads_larger_than_every_window_and_the_output_bound() {
    // A small output bound: DATA waits for the socket as well as for windows.
    let addr = server(Config {
        max_output: 4096,
        initial_stream_window: 16_384,
        ..Config::default()
    })
    .await;
    let mut send = client(addr).await;
    let downloads = (0..4).map(|_| {
        let mut send = send.clone();
        async move { exchange(&mut send, "/bytes/3000000", Bytes::new()).await }
    });
    let all = futures_join(downloads.collect());
    let results = tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("all downloads finish");
    for (status, body) in results {
        assert_eq!(status, 200);
        assert_eq!(body.len(), 3_000_000);
        assert!(body.iter().all(|&b| b == b'x'));
    }
    // The connection is still good after them.
    let (status, body) = exchange(&mut send, "/", Bytes::new()).await;
    assert_eq!((status, &body[..]), (http::StatusCode::OK, &b"hello"[..]));
}

/// Runs futures side by side on this task, in order of their results.
async fn futures_join<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut tasks = Vec::new();
    for future in futures {
        tasks.push(Box::pin(future));
    }
    let mut results: Vec<Option<F::Output>> = tasks.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (task, result) in tasks.iter_mut().zip(results.iter_mut()) {
            if result.is_none() {
                match task.as_mut().poll(cx) {
                    std::task::Poll::Ready(output) => *result = Some(output),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    results.into_iter().flatten().collect()
}
