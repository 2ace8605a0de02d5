//! A JWKS server for the JWT tests: the key set it holds, served over HTTP/1.1 on 127.0.0.1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A JWKS server: answers `GET` with the key set it holds while up; while down, closes each
/// connection without an answer.
pub struct JwksServer {
    pub addr: SocketAddr,
    body: Arc<Mutex<String>>,
    pub up: Arc<AtomicBool>,
    pub fetches: Arc<AtomicUsize>,
}

impl JwksServer {
    pub async fn start(body: String, up: bool) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = JwksServer {
            addr: listener.local_addr().unwrap(),
            body: Arc::new(Mutex::new(body)),
            up: Arc::new(AtomicBool::new(up)),
            fetches: Arc::new(AtomicUsize::new(0)),
        };
        let (body, up, fetches) = (
            Arc::clone(&server.body),
            Arc::clone(&server.up),
            Arc::clone(&server.fetches),
        );
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                if !up.load(Ordering::SeqCst) {
                    drop(stream);
                    continue;
                }
                let (body, fetches) = (Arc::clone(&body), Arc::clone(&fetches));
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    let text = body.lock().unwrap().clone();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(text)))
                                .unwrap(),
                        )
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        server
    }

    pub fn serve(&self, body: String) {
        *self.body.lock().unwrap() = body;
    }
}
