//! Rate limit services for tests: a small one written here (`envoy.service.ratelimit.v3` over
//! tonic) that keeps a count per domain and descriptor, and the real envoyproxy/ratelimit
//! service on Redis when both are installed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// What the test service was asked: each call's domain and descriptors as `key=value` lists.
pub type Asked = Arc<Mutex<Vec<(String, Vec<Vec<String>>)>>>;

struct Counting {
    limit: u32,
    counts: Mutex<HashMap<String, u32>>,
    asked: Asked,
}

#[tonic::async_trait]
impl RateLimitService for Counting {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request.into_inner();
        let lists: Vec<Vec<String>> = (request.descriptors.iter())
            .map(|d| {
                (d.entries.iter())
                    .map(|e| format!("{}={}", e.key, e.value))
                    .collect()
            })
            .collect();
        self.asked
            .lock()
            .unwrap()
            .push((request.domain.clone(), lists.clone()));
        let mut over = false;
        let mut statuses = Vec::new();
        let mut counts = self.counts.lock().unwrap();
        for (list, descriptor) in lists.iter().zip(&request.descriptors) {
            let hits = descriptor
                .hits_addend
                .as_ref()
                .map_or(1, |h| h.value as u32);
            let count = counts
                .entry(format!("{}|{}", request.domain, list.join(",")))
                .or_default();
            *count += hits;
            let within = *count <= self.limit;
            over |= !within;
            statuses.push(DescriptorStatus {
                code: if within { Code::Ok } else { Code::OverLimit } as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: self.limit,
                    unit: Unit::Minute as i32,
                }),
                limit_remaining: self.limit.saturating_sub(*count),
                duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                ..Default::default()
            });
        }
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: vec![HeaderValue {
                key: "x-test-rls".into(),
                value: "counted".into(),
                ..Default::default()
            }],
            raw_body: if over {
                b"slow down".to_vec()
            } else {
                Vec::new()
            },
            ..Default::default()
        }))
    }
}

/// The test service on 127.0.0.1: `limit` hits per domain and descriptor, then OVER_LIMIT.
pub async fn counting_service(limit: u32) -> (SocketAddr, Asked) {
    let asked = Asked::default();
    let service = RateLimitServiceServer::new(Counting {
        limit,
        counts: Mutex::default(),
        asked: asked.clone(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper_util::service::TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
            });
        }
    });
    (addr, asked)
}

/// envoyproxy/ratelimit and its Redis, ended (by their PIDs) when dropped.
pub struct RealService {
    pub grpc: SocketAddr,
    children: Vec<Child>,
    _dir: super::ScratchDir,
}

impl Drop for RealService {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free port on 127.0.0.1 for a program that binds it itself (taken back at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn on_path(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// The real service with `config` (its YAML, for domain `domain`), on a Redis of its own
/// (a Unix socket); `Err` says what is missing: the test then says so and stops.
pub fn real_service(config: &str) -> Result<RealService, String> {
    let ratelimit = std::env::var_os("RATELIMIT_BIN")
        .map(std::path::PathBuf::from)
        .or_else(|| on_path("ratelimit"))
        .filter(|p| p.is_file())
        .ok_or("envoyproxy/ratelimit is not installed (RATELIMIT_BIN or `ratelimit` on PATH; .ci/run builds it)")?;
    let redis = on_path("redis-server").ok_or("redis-server is not installed")?;
    let dir = super::ScratchDir::new();
    let socket = dir.0.join("redis.sock");
    let mut children = Vec::new();
    children.push(
        Command::new(redis)
            .args([
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocket",
            ])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if Instant::now() > deadline {
            return Err("redis-server did not open its socket".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let config_dir = dir.0.join("runtime/ratelimit/config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("config.yaml"), config).unwrap();
    let grpc_port = free_port();
    let log = std::fs::File::create(dir.0.join("ratelimit.log")).unwrap();
    children.push(
        Command::new(ratelimit)
            .env("USE_STATSD", "false")
            .env("USE_PROMETHEUS", "false")
            .env("LOG_LEVEL", "warn")
            .env("REDIS_SOCKET_TYPE", "unix")
            .env("REDIS_URL", &socket)
            .env("RUNTIME_ROOT", dir.0.join("runtime"))
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("RUNTIME_WATCH_ROOT", "false")
            .env("HOST", "127.0.0.1")
            .env("PORT", free_port().to_string())
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", grpc_port.to_string())
            .env("DEBUG_HOST", "127.0.0.1")
            .env("DEBUG_PORT", free_port().to_string())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start ratelimit: {e}"))?,
    );
    let grpc: SocketAddr = ([127, 0, 0, 1], grpc_port).into();
    let mut service = RealService {
        grpc,
        children,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(grpc).is_err() {
        if Instant::now() > deadline || service.children[1].try_wait().ok().flatten().is_some() {
            let log =
                std::fs::read_to_string(service._dir.0.join("ratelimit.log")).unwrap_or_default();
            return Err(format!("ratelimit did not come up: {log}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(service)
}
