//! The xDS side of the integration tests: resources for the testbed management server, a
//! bootstrap naming it, and a steady client that counts what fails while the config moves.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::google::protobuf::Any;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use testbed::resources::{self, eds_cluster};
use testbed::xds::{any, type_url};
use testbed::{ManagementServer, NoopHandle, NoopUpstream};

use super::{Proxy, admin_request, eventually, get, send_h1};

/// A listener on 127.0.0.1 (any port) whose routes come from RDS under `routes`.
pub fn listener(name: &str, routes: &str) -> (String, Any) {
    let l = resources::listener(name, "127.0.0.1:0".parse().unwrap(), routes);
    (name.into(), any(&l))
}

/// `routes`: `(prefix, cluster)` to forward, or `(prefix, "")` for a direct 204.
pub fn route_config(name: &str, routes: &[(&str, &str)]) -> (String, Any) {
    let routes = routes
        .iter()
        .map(|(prefix, cluster)| match *cluster {
            "" => resources::direct(prefix, 204),
            cluster => resources::forward(prefix, cluster),
        })
        .collect();
    (name.into(), any(&resources::route_config(name, routes)))
}

pub fn assignment(name: &str, hosts: &[SocketAddr]) -> (String, Any) {
    (name.into(), any(&resources::assignment(name, hosts)))
}

pub fn named(cluster: Cluster) -> (String, Any) {
    (cluster.name.clone(), any(&cluster))
}

pub fn bootstrap(server: SocketAddr, protocol: &str) -> String {
    format!(
        "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1, cluster: edge }}\ndynamic_resources: {{ ads: {{ address: \"{server}\", protocol: {protocol} }} }}\n"
    )
}

pub fn config_dump(proxy: &Proxy) -> Value {
    let (status, body) = admin_request(proxy.admin.unwrap(), "GET", "/config_dump");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The bound address of the listener `name`, once it is in force.
pub async fn listener_address(proxy: &Proxy, name: &str) -> SocketAddr {
    let mut found = None;
    eventually(&format!("listener {name} in force"), async || {
        found = config_dump(proxy)["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .map(|l| l["bound_address"].as_str().unwrap().parse().unwrap());
        found.is_some()
    })
    .await;
    found.unwrap()
}

pub async fn answer(addr: SocketAddr, path: &str) -> (u16, String) {
    let response = send_h1(addr, get(path, &[])).await;
    let status = response.status().as_u16();
    let by = response
        .headers()
        .get("x-noop-served-by")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, by)
}

/// Requests on one kept-alive HTTP/1.1 connection every 5 ms until stopped; counts the
/// answers and the failures (anything but 200 from an upstream).
pub struct SteadyClient {
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl SteadyClient {
    pub async fn start(addr: SocketAddr) -> SteadyClient {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let (sent, failed, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let task = tokio::spawn({
            let (sent, failed, stop) = (sent.clone(), failed.clone(), stop.clone());
            async move {
                let mut failures = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let request = http::Request::get("/")
                        .header("host", "edge")
                        .body(Full::new(bytes::Bytes::new()))
                        .unwrap();
                    let outcome = match sender.send_request(request).await {
                        Ok(r)
                            if r.status() == 200
                                && r.headers().contains_key("x-noop-served-by") =>
                        {
                            Ok(())
                        }
                        // The body names the cause (the response flag's text).
                        Ok(r) => {
                            let status = r.status();
                            let body = r.into_body().collect().await.map(|b| b.to_bytes());
                            Err(format!("status {status}: {body:?}"))
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    sent.fetch_add(1, Ordering::Relaxed);
                    if let Err(failure) = outcome {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.push(failure);
                        if sender.ready().await.is_err() {
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                failures
            }
        });
        SteadyClient {
            sent,
            failed,
            stop,
            task,
        }
    }

    /// Returns once three more requests have been answered: called after each change, it
    /// makes sure traffic ran on both sides of it.
    pub async fn keeps_going(&self) {
        let from = self.sent.load(Ordering::Relaxed);
        eventually("three more steady requests", async || {
            self.sent.load(Ordering::Relaxed) >= from + 3
        })
        .await;
    }

    /// Stops once at least 50 requests were sent, and returns (requests sent, failures).
    pub async fn finish(self) -> (u64, Vec<String>) {
        let sent = Arc::clone(&self.sent);
        eventually("50 steady requests", async || {
            sent.load(Ordering::Relaxed) >= 50
        })
        .await;
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await.unwrap();
        assert_eq!(failures.len() as u64, self.failed.load(Ordering::Relaxed));
        (self.sent.load(Ordering::Relaxed), failures)
    }
}

/// The resources most tests start from: listener `web` (any port) routing `/` by RDS
/// (`web-routes`) to the EDS cluster `backend`, whose one endpoint is `host`.
pub fn serve_backend(server: &ManagementServer, host: SocketAddr) {
    server.set(
        type_url::CLUSTER,
        vec![named(eds_cluster("backend", cluster::LbPolicy::RoundRobin))],
    );
    server.set(type_url::ENDPOINT, vec![assignment("backend", &[host])]);
    server.set(type_url::LISTENER, vec![listener("web", "web-routes")]);
    server.set(
        type_url::ROUTE,
        vec![route_config("web-routes", &[("/", "backend")])],
    );
}

/// Two no-op upstreams on 127.0.0.1, each naming itself in `x-noop-served-by`.
pub async fn upstreams() -> (NoopHandle, NoopHandle) {
    let one = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let two = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (one, two)
}
