//! Tiny hyper clients for the testbed's own tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;

pub type ReqBody = BoxBody<Bytes, hyper::Error>;

/// Every test is bounded by this, so a hang fails instead of stalling CI.
pub const LIMIT: Duration = Duration::from_secs(20);

pub fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub fn empty() -> ReqBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

pub fn full(bytes: impl Into<Bytes>) -> ReqBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

pub fn get(uri: &str) -> http::request::Builder {
    Request::get(uri)
}

pub async fn h1(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<ReqBody> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

pub async fn h2(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<ReqBody> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// One request over a fresh HTTP/1.1 connection.
pub async fn send(addr: SocketAddr, req: Request<ReqBody>) -> Response<Incoming> {
    let mut client = h1(addr).await;
    tokio::time::timeout(LIMIT, client.send_request(req))
        .await
        .expect("response in time")
        .unwrap()
}

/// Reads a body frame by frame, returning its length and hex SHA-256.
pub async fn digest(body: Incoming) -> (u64, String) {
    let mut body = body;
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            len += data.len() as u64;
            hasher.update(&data);
        }
    }
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (len, hex)
}

pub async fn text(body: Incoming) -> String {
    let bytes = body.collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

pub fn header<'a>(res: &'a Response<Incoming>, name: &str) -> Option<&'a str> {
    res.headers().get(name).map(|v| v.to_str().unwrap())
}
