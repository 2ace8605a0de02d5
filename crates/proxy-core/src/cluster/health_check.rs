//! Active health checks, run by the monitor thread: one task per host, checking every
//! `interval` (plus jitter; `unhealthy_interval` while the host fails, the edge intervals
//! right after it changes; the `no_traffic` intervals until the cluster has opened a
//! connection) on a new connection, with Envoy's verdicts. An HTTP check passes
//! on an expected status (any 2xx unless the cluster lists some) whose body holds the
//! `receive` blocks; a retriable status, a timeout or a failed connection counts towards
//! `unhealthy_threshold`, any other status makes the host unhealthy at once. A gRPC check
//! asks `grpc.health.v1.Health/Check` over HTTP/2 and passes on `SERVING`. A TCP check
//! connects, sends its bytes and passes once it has read every `receive` block. Events go to
//! the cluster's event log (`health_events.rs`) if it has one.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::SharedCluster;
use super::health_events::{EventLog, FailureType};
use crate::catalog::ClusterStats;
use crate::runtime::LocalExec;
use crate::tls::UpstreamTls;
use config::{HealthCheckConfig, UpstreamProtocol};

/// The most of an HTTP check's body read for `receive` (Envoy's `response_buffer_size`),
/// and of a TCP check's answer.
const RESPONSE_BUFFER: usize = 1024;

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Pass,
    /// Counted towards `unhealthy_threshold`.
    Fail(FailureType),
    /// Unhealthy at once: a status neither expected nor retriable.
    FailNow,
}

/// The host a check is about, and where it connects (another port, when the endpoint says).
pub(super) struct Target {
    pub(super) addr: SocketAddr,
    pub(super) connect: SocketAddr,
}

pub(super) async fn check_host(
    cluster: Arc<SharedCluster>,
    Target { addr, connect }: Target,
    config: HealthCheckConfig,
    stats: Rc<ClusterStats>,
    events: Option<Rc<EventLog>>,
) {
    let mut rng = Jitter::seeded(addr);
    let mut passing = true;
    let (mut successes, mut failures) = (0u32, 0u32);
    let mut first_check = true;
    // The host's own name, for TLS settings that send it (`auto_host_sni`).
    let host_name = cluster
        .hostname_of(addr)
        .and_then(|name| rustls::pki_types::ServerName::try_from(name).ok());
    // The first check soon after start, spread by the jitter.
    tokio::time::sleep(rng.up_to(config.jitter)).await;
    loop {
        stats.health_check_attempt.inc();
        let verdict = check_once(
            // A logical DNS host is checked where its connections go.
            cluster.connect_addr(connect),
            &cluster.name,
            &config,
            cluster.tls(cluster.transport_of(addr)),
            host_name.as_ref(),
            cluster.protocol,
        )
        .await;
        if verdict == Verdict::Pass {
            stats.health_check_success.inc();
            successes += 1;
            failures = 0;
            cluster.health.check_passed(&cluster.host_set, addr);
        } else {
            stats.health_check_failure.inc();
            failures += 1;
            successes = 0;
        }
        let down = verdict == Verdict::FailNow || failures >= config.unhealthy_threshold;
        let failure = match verdict {
            Verdict::Pass => None,
            Verdict::Fail(why) => Some(why),
            Verdict::FailNow => Some(FailureType::Active),
        };
        let changed = if passing && down {
            passing = false;
            tracing::warn!(cluster = %cluster.name, host = %addr, "host failed its health checks");
            cluster.health.set_passing(&cluster.host_set, addr, false);
            if let (Some(log), Some(why)) = (&events, failure) {
                log.ejected(addr, why);
            }
            true
        } else if !passing && successes >= config.healthy_threshold {
            passing = true;
            tracing::info!(cluster = %cluster.name, host = %addr, "host passes its health checks again");
            cluster.health.set_passing(&cluster.host_set, addr, true);
            if let Some(log) = &events {
                log.added(addr);
            }
            true
        } else {
            if let (Some(log), None) = (&events, failure) {
                log.passed(addr);
            }
            false
        };
        if let (Some(log), Some(why)) = (&events, failure) {
            log.failed(addr, why, first_check);
        }
        first_check = false;
        // Envoy's intervals: while a change is pending (a failure on a passing host, a pass
        // on a failing one, short of the threshold), the edge interval of this check's
        // verdict; otherwise the unhealthy interval after a failure, the interval after a
        // pass.
        let pending = !changed && passing == failure.is_some();
        let interval = if !cluster.had_traffic.load(Ordering::Relaxed) {
            // Until the cluster is used, a slower pace keeps its hosts' health roughly known.
            if passing && !pending {
                config.no_traffic_healthy_interval
            } else {
                config.no_traffic_interval
            }
        } else {
            match (failure.is_some(), pending) {
                (true, true) => config.unhealthy_edge_interval,
                (true, false) => config.unhealthy_interval,
                (false, true) => config.healthy_edge_interval,
                (false, false) => config.interval,
            }
        };
        tokio::time::sleep(interval + rng.up_to(config.jitter)).await;
    }
}

/// One check on a new connection, within the timeout.
async fn check_once(
    addr: SocketAddr,
    cluster: &str,
    config: &HealthCheckConfig,
    tls: Option<&UpstreamTls>,
    host_name: Option<&rustls::pki_types::ServerName<'static>>,
    protocol: UpstreamProtocol,
) -> Verdict {
    let name = host_name.filter(|_| tls.is_some_and(UpstreamTls::names_hosts));
    let attempt = async {
        if config.tcp {
            return tcp_check(addr, config).await;
        }
        let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
            return Verdict::Fail(FailureType::Network);
        };
        let Some(req) = check_request(config, cluster) else {
            return Verdict::Fail(FailureType::Network);
        };
        if config.grpc.is_some() {
            let answer = match tls {
                None => grpc_h2(stream, req, "http").await,
                Some(tls) => match tls.connect(addr, stream, name).await {
                    // An `auto` cluster's host may choose HTTP/1.1, which gRPC cannot use.
                    Ok(stream) if stream.get_ref().1.alpn_protocol() == Some(b"h2") => {
                        grpc_h2(stream, req, "https").await
                    }
                    Ok(_) | Err(_) => None,
                },
            };
            return answer.unwrap_or(Verdict::Fail(FailureType::Network));
        }
        let answer = match tls {
            // Cleartext HTTP/2 clusters speak it with prior knowledge.
            None if protocol == UpstreamProtocol::Http2 => send_h2(stream, req, "http").await,
            None => send_h1(stream, req).await,
            Some(tls) => match tls.connect(addr, stream, name).await {
                // ALPN `h2` on an HTTP/2 cluster: the check speaks HTTP/2 too.
                Ok(stream) if stream.get_ref().1.alpn_protocol() == Some(b"h2") => {
                    send_h2(stream, req, "https").await
                }
                Ok(stream) => send_h1(stream, req).await,
                Err(_) => None,
            },
        };
        let Some((status, body)) = answer else {
            return Verdict::Fail(FailureType::Network);
        };
        http_verdict(config, status.as_u16(), &body)
    };
    tokio::time::timeout(config.timeout, attempt)
        .await
        .unwrap_or(Verdict::Fail(FailureType::NetworkTimeout))
}

/// The request of an HTTP or gRPC check, with the check's headers.
fn check_request(config: &HealthCheckConfig, cluster: &str) -> Option<Request<Full<Bytes>>> {
    let mut req = match &config.grpc {
        Some(grpc) => {
            // Envoy's default `:authority`: the cluster's name.
            let authority = grpc.authority.as_deref().unwrap_or(cluster);
            Request::builder()
                .method(http::Method::POST)
                .uri("/grpc.health.v1.Health/Check")
                .header(http::header::HOST, authority)
                .header(http::header::CONTENT_TYPE, "application/grpc")
                .header(http::header::TE, "trailers")
                .body(Full::new(grpc_check_request(&grpc.service_name)))
                .ok()?
        }
        None => {
            // Envoy's default `host`: the cluster's name.
            let host = config.host.clone().unwrap_or_else(|| cluster.to_owned());
            let body = Bytes::from(config.send.clone().unwrap_or_default());
            Request::builder()
                .method(config.method.clone().unwrap_or(http::Method::GET))
                .uri(config.path.as_str())
                .header(http::header::HOST, host)
                .header(http::header::USER_AGENT, "legate-health-check")
                .body(Full::new(body))
                .ok()?
        }
    };
    let headers = req.headers_mut();
    for name in &config.request_headers_to_remove {
        headers.remove(name);
    }
    for (name, value) in &config.request_headers_to_add {
        headers.insert(name.clone(), value.clone());
    }
    Some(req)
}

/// `grpc.health.v1.HealthCheckRequest { service }` in a gRPC frame.
fn grpc_check_request(service: &str) -> Bytes {
    let mut message = Vec::with_capacity(service.len() + 3);
    if !service.is_empty() {
        message.push(0x0a); // field 1, length-delimited
        let mut len = service.len();
        while len >= 0x80 {
            message.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        message.push(len as u8);
        message.extend_from_slice(service.as_bytes());
    }
    let mut frame = Vec::with_capacity(message.len() + 5);
    frame.push(0); // not compressed
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    Bytes::from(frame)
}

/// `HealthCheckResponse.status`, from a gRPC frame's message: 1 is `SERVING`.
fn grpc_serving(body: &[u8]) -> bool {
    let Some((&[compressed, a, b, c, d], message)) = body.split_first_chunk::<5>() else {
        return false;
    };
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if compressed != 0 || message.len() < len {
        return false;
    }
    // The message's fields: field 1 (varint) is the status; others are skipped.
    let mut rest = &message[..len];
    let mut status = 0u64;
    while let Some((&key, after)) = rest.split_first() {
        rest = after;
        match key & 0x07 {
            0 => {
                let mut value = 0u64;
                let mut shift = 0;
                loop {
                    let Some((&byte, after)) = rest.split_first() else {
                        return false;
                    };
                    rest = after;
                    if shift < 64 {
                        value |= u64::from(byte & 0x7f) << shift;
                    }
                    shift += 7;
                    if byte & 0x80 == 0 {
                        break;
                    }
                }
                if key >> 3 == 1 {
                    status = value;
                }
            }
            2 => {
                let Some((&n, after)) = rest.split_first() else {
                    return false;
                };
                if n >= 0x80 || after.len() < n as usize {
                    return false;
                }
                rest = &after[n as usize..];
            }
            _ => return false,
        }
    }
    status == 1
}

/// A gRPC check over HTTP/2: passes on status 200, `grpc-status: 0` and `SERVING`; any
/// other answer fails the host at once, as Envoy's.
async fn grpc_h2<T>(stream: T, req: Request<Full<Bytes>>, scheme: &str) -> Option<Verdict>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let response = h2_response(stream, req, scheme).await?;
    let (parts, mut body) = response.into_parts();
    let mut data = Vec::new();
    let mut grpc_status = parts.headers.get("grpc-status").cloned();
    while let Some(frame) = body.frame().await {
        let frame = frame.ok()?;
        match frame.into_data() {
            Ok(bytes) if data.len() < RESPONSE_BUFFER => data.extend_from_slice(&bytes),
            Ok(_) => return Some(Verdict::FailNow),
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    grpc_status = trailers.get("grpc-status").cloned().or(grpc_status);
                }
            }
        }
    }
    let ok = parts.status == http::StatusCode::OK
        && grpc_status.is_some_and(|s| s == "0")
        && grpc_serving(&data);
    // As Envoy: an answer that is not `SERVING` fails the host at once.
    Some(if ok { Verdict::Pass } else { Verdict::FailNow })
}

fn in_ranges(ranges: &[(u16, u16)], status: u16) -> bool {
    ranges
        .iter()
        .any(|&(start, end)| (start..end).contains(&status))
}

fn http_verdict(config: &HealthCheckConfig, status: u16, body: &[u8]) -> Verdict {
    let expected = if config.expected_statuses.is_empty() {
        (200..300).contains(&status)
    } else {
        in_ranges(&config.expected_statuses, status)
    };
    if !holds_in_order(body, &config.receive) {
        // A body without what was asked makes the host unhealthy at once, as Envoy.
        Verdict::FailNow
    } else if expected {
        Verdict::Pass
    } else if in_ranges(&config.retriable_statuses, status) {
        Verdict::Fail(FailureType::Active)
    } else {
        Verdict::FailNow
    }
}

/// Whether `blocks` are found in `data` in order, each after the one before (Envoy's
/// "fuzzy" payload match).
fn holds_in_order(data: &[u8], blocks: &[Vec<u8>]) -> bool {
    let mut rest = data;
    for block in blocks {
        if block.is_empty() {
            continue;
        }
        match rest
            .windows(block.len())
            .position(|w| w == block.as_slice())
        {
            Some(at) => rest = &rest[at + block.len()..],
            None => return false,
        }
    }
    true
}

async fn tcp_check(addr: SocketAddr, config: &HealthCheckConfig) -> Verdict {
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return Verdict::Fail(FailureType::Network);
    };
    if let Some(send) = &config.send
        && stream.write_all(send).await.is_err()
    {
        return Verdict::Fail(FailureType::Network);
    }
    let mut read = Vec::new();
    let mut chunk = [0u8; 512];
    while !holds_in_order(&read, &config.receive) {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return Verdict::Fail(FailureType::Network),
            Ok(n) => read.extend_from_slice(&chunk[..n]),
        }
        if read.len() > RESPONSE_BUFFER {
            return Verdict::Fail(FailureType::Active);
        }
    }
    Verdict::Pass
}

/// The status and the first bytes of the body.
async fn send_h1<T>(stream: T, req: Request<Full<Bytes>>) -> Option<(http::StatusCode, Vec<u8>)>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    let response = sender.send_request(req).await.ok()?;
    Some((response.status(), body_start(response.into_body()).await))
}

async fn send_h2<T>(
    stream: T,
    req: Request<Full<Bytes>>,
    scheme: &str,
) -> Option<(http::StatusCode, Vec<u8>)>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let response = h2_response(stream, req, scheme).await?;
    Some((response.status(), body_start(response.into_body()).await))
}

/// HTTP/2 wants the scheme and authority as pseudo-headers: the URI is made absolute.
async fn h2_response<T>(
    stream: T,
    mut req: Request<Full<Bytes>>,
    scheme: &str,
) -> Option<http::Response<hyper::body::Incoming>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let authority = req.headers_mut().remove(http::header::HOST)?;
    *req.uri_mut() = http::Uri::builder()
        .scheme(scheme)
        .authority(authority.to_str().ok()?)
        .path_and_query(req.uri().path_and_query()?.as_str())
        .build()
        .ok()?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(LocalExec, TokioIo::new(stream))
        .await
        .ok()?;
    tokio::task::spawn_local(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await.ok()
}

/// Up to [`RESPONSE_BUFFER`] bytes of a body (what a failed read left, if it fails).
async fn body_start(mut body: hyper::body::Incoming) -> Vec<u8> {
    let mut start = Vec::new();
    while start.len() < RESPONSE_BUFFER {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    start.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    start.truncate(RESPONSE_BUFFER);
    start
}

/// xorshift64: enough to keep checks of many hosts from lining up.
struct Jitter(u64);

impl Jitter {
    fn seeded(addr: SocketAddr) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
        Jitter((u64::from(addr.port()) << 32 | nanos) | 1)
    }

    fn up_to(&mut self, max: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let max_us = max.as_micros() as u64;
        if max_us == 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(self.0 % (max_us + 1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_bound() {
        let mut j = Jitter::seeded("127.0.0.1:80".parse().unwrap());
        for _ in 0..1000 {
            assert!(j.up_to(Duration::from_millis(100)) <= Duration::from_millis(100));
        }
        assert_eq!(j.up_to(Duration::ZERO), Duration::ZERO);
    }

    fn http(
        expected: &[(u16, u16)],
        retriable: &[(u16, u16)],
        receive: &[&[u8]],
    ) -> HealthCheckConfig {
        HealthCheckConfig {
            path: "/healthz".into(),
            host: None,
            method: None,
            expected_statuses: expected.to_vec(),
            retriable_statuses: retriable.to_vec(),
            tcp: false,
            send: None,
            receive: receive.iter().map(|b| b.to_vec()).collect(),
            interval: Duration::from_secs(1),
            jitter: Duration::ZERO,
            timeout: Duration::from_secs(1),
            healthy_threshold: 1,
            unhealthy_threshold: 3,
            grpc: None,
            request_headers_to_add: Vec::new(),
            request_headers_to_remove: Vec::new(),
            unhealthy_interval: Duration::from_secs(1),
            unhealthy_edge_interval: Duration::from_secs(1),
            healthy_edge_interval: Duration::from_secs(1),
            no_traffic_interval: Duration::from_secs(1),
            no_traffic_healthy_interval: Duration::from_secs(1),
            event_log_path: None,
            always_log_health_check_failures: false,
            always_log_health_check_success: false,
        }
    }

    #[test]
    fn verdicts_follow_envoys_statuses() {
        let any_2xx = http(&[], &[], &[]);
        assert_eq!(http_verdict(&any_2xx, 204, b""), Verdict::Pass);
        assert_eq!(http_verdict(&any_2xx, 503, b""), Verdict::FailNow);
        let listed = http(&[(200, 201), (300, 301)], &[(503, 504)], &[]);
        assert_eq!(http_verdict(&listed, 300, b""), Verdict::Pass);
        assert_eq!(http_verdict(&listed, 204, b""), Verdict::FailNow);
        assert_eq!(
            http_verdict(&listed, 503, b""),
            Verdict::Fail(FailureType::Active),
            "retriable"
        );
        let body = http(&[(200, 201)], &[], &[b"ok", b"ready"]);
        assert_eq!(http_verdict(&body, 200, b"ok, all ready"), Verdict::Pass);
        assert_eq!(
            http_verdict(&body, 200, b"ready, ok"),
            Verdict::FailNow,
            "out of order"
        );
    }

    #[test]
    fn grpc_frames_are_written_and_read_as_grpc_health_v1_has_them() {
        assert_eq!(&grpc_check_request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(
            &grpc_check_request("svc")[..],
            &[0, 0, 0, 0, 5, 0x0a, 3, b's', b'v', b'c']
        );
        assert!(grpc_serving(&[0, 0, 0, 0, 2, 0x08, 1]));
        assert!(!grpc_serving(&[0, 0, 0, 0, 2, 0x08, 2]), "NOT_SERVING");
        assert!(!grpc_serving(&[0, 0, 0, 0, 0]), "UNKNOWN");
        assert!(!grpc_serving(&[0, 0, 0, 0, 2, 0x08]), "cut short");
        assert!(!grpc_serving(&[1, 0, 0, 0, 2, 0x08, 1]), "compressed");
    }

    #[test]
    fn blocks_are_found_in_order_not_necessarily_adjacent() {
        assert!(holds_in_order(b"pong", &[]));
        assert!(holds_in_order(
            b"xxpoyyng",
            &[b"po".to_vec(), b"ng".to_vec()]
        ));
        assert!(!holds_in_order(b"ngpo", &[b"po".to_vec(), b"ng".to_vec()]));
    }
}
