//! Failing origins: a hyper client must get an error, never a response.

#[cfg(test)] // lets the helpers unwrap, like the tests themselves
mod support;

use std::time::{Duration, Instant};

use testbed::{FailingOrigin, FailureMode};

use support::*;

#[cfg(test)]
async fn request_fails(mode: FailureMode) {
    let origin = FailingOrigin::bind(localhost(), mode).await.unwrap();
    let mut client = h1(origin.local_addr()).await;
    let res = tokio::time::timeout(LIMIT, client.send_request(get("/").body(empty()).unwrap()))
        .await
        .expect("the origin answers or closes in time");
    assert!(res.is_err(), "{mode:?} produced a response: {res:?}");
    assert_eq!(origin.connections(), 1);
    assert_eq!(origin.requests(), 1);
    origin.shutdown();
}

#[tokio::test]
async fn close_without_response() {
    request_fails(FailureMode::CloseWithoutResponse).await;
}

#[tokio::test]
async fn garbage_response() {
    request_fails(FailureMode::GarbageResponse).await;
}

#[tokio::test]
async fn garbage_is_what_it_says() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let origin = FailingOrigin::bind(localhost(), FailureMode::GarbageResponse)
        .await
        .unwrap();
    let mut tcp = tokio::net::TcpStream::connect(origin.local_addr())
        .await
        .unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(LIMIT, tcp.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"garbage\r\n\r\n");
    origin.shutdown();
}

#[tokio::test]
async fn never_respond_holds_until_shutdown() {
    let origin = FailingOrigin::bind(localhost(), FailureMode::NeverRespond)
        .await
        .unwrap();
    let mut client = h1(origin.local_addr()).await;
    let mut pending = Box::pin(client.send_request(get("/").body(empty()).unwrap()));
    // Held, not answered: waiting for the request to arrive drives the client meanwhile.
    let deadline = Instant::now() + Duration::from_secs(20);
    while origin.requests() < 1 {
        assert!(Instant::now() < deadline, "the request never arrived");
        let waited = tokio::time::timeout(Duration::from_millis(10), &mut pending).await;
        assert!(waited.is_err(), "no answer expected: {waited:?}");
    }
    assert_eq!(origin.requests(), 1);

    let start = Instant::now();
    origin.shutdown();
    let res = tokio::time::timeout(LIMIT, pending)
        .await
        .expect("shutdown closes held connections");
    assert!(res.is_err());
    assert!(start.elapsed() < LIMIT);
}

#[tokio::test]
async fn h2_clients_fail_too() {
    for mode in [
        FailureMode::CloseWithoutResponse,
        FailureMode::GarbageResponse,
    ] {
        let origin = FailingOrigin::bind(localhost(), mode).await.unwrap();
        let tcp = tokio::net::TcpStream::connect(origin.local_addr())
            .await
            .unwrap();
        let attempt = async {
            let (mut client, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                hyper_util::rt::TokioIo::new(tcp),
            )
            .await?;
            tokio::spawn(conn);
            client
                .send_request(get("http://origin/").body(empty()).unwrap())
                .await
        };
        let res = tokio::time::timeout(LIMIT, attempt).await.unwrap();
        assert!(res.is_err(), "{mode:?}");
        origin.shutdown();
    }
}
