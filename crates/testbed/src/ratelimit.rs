//! A rate limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, as
//! envoyproxy/ratelimit serves it) that keeps its counts in memory: each domain and descriptor
//! may be hit `limit` times (a descriptor's `hits_addend` counts that many), then the answer is
//! OVER_LIMIT, with Envoy's per-descriptor statuses (a limit per minute, 60 s to its reset),
//! a response header `x-test-rls: counted`, a request header `x-rate-limited-by: testbed`, and
//! on refusals the body `slow down`. It records
//! what it was asked (the first 10,000 calls; a benchmark's millions are only counted). One
//! task per connection, on the runtime it starts on.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService as Service, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// One call as the service saw it: its domain, and each descriptor as `key=value` entries.
pub type RateLimitCall = (String, Vec<Vec<String>>);

/// The calls recorded at most.
const KEPT_CALLS: usize = 10_000;

struct Counting {
    limit: u32,
    counts: Mutex<HashMap<String, u32>>,
    asked: Arc<Mutex<Vec<RateLimitCall>>>,
    calls: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl Service for Counting {
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
        let mut over = false;
        let mut statuses = Vec::with_capacity(lists.len());
        {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            for (list, descriptor) in lists.iter().zip(&request.descriptors) {
                let hits = descriptor.hits_addend.as_ref().map_or(1, |h| h.value);
                let hits = u32::try_from(hits).unwrap_or(u32::MAX);
                let count = counts
                    .entry(format!("{}|{}", request.domain, list.join(",")))
                    .or_default();
                *count = count.saturating_add(hits);
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
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        if asked.len() < KEPT_CALLS {
            asked.push((request.domain, lists));
        }
        drop(asked);
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: vec![HeaderValue {
                key: "x-test-rls".into(),
                value: "counted".into(),
                ..Default::default()
            }],
            request_headers_to_add: vec![HeaderValue {
                key: "x-rate-limited-by".into(),
                value: "testbed".into(),
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

/// The service, serving on the runtime it was started on until the runtime ends.
pub struct RateLimitService {
    addr: SocketAddr,
    asked: Arc<Mutex<Vec<RateLimitCall>>>,
    calls: Arc<AtomicU64>,
}

impl RateLimitService {
    /// Binds `addr` (port 0 for any); `limit` hits per domain and descriptor.
    pub async fn start(addr: SocketAddr, limit: u32) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let asked = Arc::default();
        let calls = Arc::default();
        let service = RateLimitServiceServer::new(Counting {
            limit,
            counts: Mutex::default(),
            asked: Arc::clone(&asked),
            calls: Arc::clone(&calls),
        });
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(service.clone());
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, asked, calls })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many calls it has answered.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The calls so far, oldest first.
    pub fn asked(&self) -> Vec<RateLimitCall> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Forgets the calls so far (not the counts).
    pub fn forget_calls(&self) {
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
