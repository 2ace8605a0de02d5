//! One upstream host as one worker sees it: its connections (an HTTP/1.1 pool or an HTTP/2
//! connection), its stats, and the send of one try with its outcome reported to outlier
//! detection. Nothing here is `Send`: each worker owns its hosts.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use balancer::Picked;
use http::{Request, Response};

use super::SharedCluster;
use super::body::{UpstreamBody, UpstreamRequest};
use super::breaker::Slot;
use super::h1_pool::H1Pool;
use super::h2_conn::H2Conns;
use super::health::{Counters, Ejection, TryOutcome};
use super::settings::UpstreamSettings;
use crate::box_pool::PooledBox;
use crate::catalog::{ClusterStats, EndpointStats, HostStats};
use crate::context::RequestBody;
use crate::error::ProxyError;
use config::UpstreamProtocol;

pub(crate) struct HostPool {
    /// The host's failure counts, shared with every worker for outlier detection.
    pub(super) health: Arc<Counters>,
    pub(super) stats: Rc<ClusterStats>,
    pub(super) host_stats: Rc<HostStats>,
    /// With `per_endpoint_stats`: the host's own counts.
    pub(super) endpoint_stats: Option<Rc<EndpointStats>>,
    /// The name its TLS connections send and verify instead of the cluster's: the pool is the
    /// host's for one request host (`auto_sni`).
    pub(super) sni: Option<rustls::pki_types::ServerName<'static>>,
    /// With `auto_sni`: the host's pools for the names requests asked for, made as they come.
    by_sni: std::cell::RefCell<Vec<Rc<HostPool>>>,
    /// The host's name, for routes with `auto_host_rewrite`.
    hostname: Option<http::HeaderValue>,
    /// The same as TLS sends it, for TLS settings with `auto_host_sni`.
    pub(super) host_sni: Option<rustls::pki_types::ServerName<'static>>,
    /// Connection slots this worker holds for the host (connections open or being opened),
    /// shared by the host's pools for each name (`auto_sni`).
    pub(super) slots_here: Rc<Cell<u32>>,
    /// Requests of this pool in flight (sent, or waiting for a connection).
    pub(super) in_flight: Cell<u32>,
    /// This pool's connections, open or being opened, and whether it holds one of the
    /// cluster's `max_connection_pools` (while it has any).
    pub(super) conns_here: Cell<u32>,
    pub(super) holds_pool_slot: Cell<bool>,
    /// Requests connecting on this pool's claim on its slot ([`PoolClaim`]).
    pub(super) pool_claims: Cell<u32>,
    /// HTTP/2 connections being opened (preconnect.rs counts their streams as capacity).
    pub(super) opening: Cell<u32>,
    /// Relay connections opened ahead (`preconnect`), oldest first, and the waker of the task
    /// that closes them when their host does (tcp.rs), while it runs.
    pub(super) relays: std::cell::RefCell<std::collections::VecDeque<super::tcp::ReadyRelay>>,
    pub(super) relay_watcher: std::cell::RefCell<Option<std::task::Waker>>,
    pub(super) relay_watching: Cell<bool>,
    pub(super) addr: SocketAddr,
    /// `addr` as text, for log lines.
    addr_text: http::HeaderValue,
    pub(super) settings: Rc<UpstreamSettings>,
    pub(super) h1: H1Pool,
    pub(super) h2: H2Conns,
    /// For an `auto` cluster, what the host chose by ALPN on the last connection that asked;
    /// `None` until then. Shared by the host's pools for each name.
    pub(super) learned: Rc<Cell<Option<UpstreamProtocol>>>,
}

impl HostPool {
    pub(super) fn new(
        stats: Rc<ClusterStats>,
        host_stats: Rc<HostStats>,
        endpoint_stats: Option<Rc<EndpointStats>>,
        addr: SocketAddr,
        settings: Rc<UpstreamSettings>,
    ) -> Self {
        let name = settings.shared.hostname_of(addr);
        let host_sni = (name.clone()).and_then(|n| rustls::pki_types::ServerName::try_from(n).ok());
        let hostname = name.and_then(|name| http::HeaderValue::from_str(&name).ok());
        Self {
            health: settings.shared.health.counters(addr),
            stats,
            host_stats,
            endpoint_stats,
            sni: None,
            by_sni: std::cell::RefCell::new(Vec::new()),
            hostname,
            host_sni,
            slots_here: Rc::new(Cell::new(0)),
            in_flight: Cell::new(0),
            conns_here: Cell::new(0),
            holds_pool_slot: Cell::new(false),
            pool_claims: Cell::new(0),
            opening: Cell::new(0),
            relays: Default::default(),
            relay_watcher: Default::default(),
            relay_watching: Cell::new(false),
            addr_text: http::HeaderValue::from_str(&addr.to_string())
                .expect("a socket address is valid header text"),
            addr,
            settings,
            h1: H1Pool::default(),
            h2: H2Conns::default(),
            learned: Rc::new(Cell::new(None)),
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The pool of this host for `req`'s name, with `auto_sni` over TLS: connections named for
    /// one host are not reused for another. This pool itself without `auto_sni`, in plain
    /// text, or when the request names no DNS name. At most [`MAX_SNI_POOLS`] names are kept
    /// per host and worker (a client may name any host): past that, the least recently used
    /// with no request in flight is closed, and with none such the request is refused
    /// (`max_connections`, counted in `upstream_cx_overflow`).
    pub(crate) fn for_request<B>(
        self: &Rc<Self>,
        req: &Request<B>,
    ) -> Result<Rc<HostPool>, ProxyError> {
        let Some(header) = &self.settings.auto_sni else {
            return Ok(Rc::clone(self));
        };
        // A named pool is one of the host's; requests reach it through the host's own.
        if self.sni.is_some() || !self.tls() {
            return Ok(Rc::clone(self));
        }
        let Some(host) = sni_host(req, header.as_ref()) else {
            return Ok(Rc::clone(self));
        };
        let mut pools = self.by_sni.borrow_mut();
        // Kept in the order of their last use, the least recent first. Found by the name as
        // written: a kept name costs no allocation.
        let named = |p: &Rc<HostPool>| match &p.sni {
            Some(rustls::pki_types::ServerName::DnsName(dns)) => {
                dns.as_ref().eq_ignore_ascii_case(host)
            }
            _ => false,
        };
        if let Some(i) = pools.iter().position(named) {
            let pool = pools.remove(i);
            pools.push(Rc::clone(&pool));
            return Ok(pool);
        }
        // An address is no name to send (as Envoy, the cluster's stays).
        let name = match rustls::pki_types::ServerName::try_from(host.to_ascii_lowercase()) {
            Ok(name @ rustls::pki_types::ServerName::DnsName(_)) => name,
            _ => return Ok(Rc::clone(self)),
        };
        if pools.len() >= MAX_SNI_POOLS {
            // The least recently used name with no request in flight is let go.
            match pools.iter().position(|p| p.in_flight.get() == 0) {
                Some(i) => pools.remove(i).close(),
                None => {
                    self.stats.cx_overflow.inc();
                    return Err(ProxyError::Overflow(crate::error::Overflow::Connections));
                }
            }
        }
        let pool = Rc::new(Self {
            health: Arc::clone(&self.health),
            stats: Rc::clone(&self.stats),
            host_stats: Rc::clone(&self.host_stats),
            endpoint_stats: self.endpoint_stats.clone(),
            sni: Some(name),
            by_sni: std::cell::RefCell::new(Vec::new()),
            hostname: self.hostname.clone(),
            host_sni: self.host_sni.clone(),
            slots_here: Rc::clone(&self.slots_here),
            in_flight: Cell::new(0),
            conns_here: Cell::new(0),
            holds_pool_slot: Cell::new(false),
            pool_claims: Cell::new(0),
            opening: Cell::new(0),
            relays: Default::default(),
            relay_watcher: Default::default(),
            relay_watching: Cell::new(false),
            addr_text: self.addr_text.clone(),
            addr: self.addr,
            settings: Rc::clone(&self.settings),
            h1: H1Pool::default(),
            h2: H2Conns::default(),
            learned: Rc::clone(&self.learned),
        });
        pools.push(Rc::clone(&pool));
        Ok(pool)
    }

    /// Closes a pool let go: its idle HTTP/1.1 connections now (each counts itself out as
    /// it drops, the pool still being there), its HTTP/2 connections once their streams are
    /// done (they take no new one).
    fn close(&self) {
        self.h1.close_idle_now();
        drop(std::mem::take(&mut *self.relays.borrow_mut()));
        self.wake_relay_watcher();
        self.h2.retire_all();
    }

    /// The host's name (its endpoint's `hostname`, or the DNS name it came from), for
    /// routes with `auto_host_rewrite`.
    pub(crate) fn hostname(&self) -> Option<&http::HeaderValue> {
        self.hostname.as_ref()
    }

    pub(crate) fn addr_text(&self) -> &http::HeaderValue {
        &self.addr_text
    }

    /// The protocol a request that came in as `version` is written for to this host: the
    /// cluster's, for an `auto` cluster the host's choice (HTTP/2 until it has made one), for
    /// a `downstream` one the client's.
    pub(crate) fn protocol_for(&self, version: http::Version) -> UpstreamProtocol {
        match self.settings.protocol {
            UpstreamProtocol::Auto => self.learned.get().unwrap_or(UpstreamProtocol::Http2),
            UpstreamProtocol::Downstream => downstream_protocol(version),
            protocol => protocol,
        }
    }

    /// For an `auto` cluster: the host's choice, connecting to learn it if it has made none.
    async fn learn_protocol(self: &Rc<Self>) -> Result<UpstreamProtocol, ProxyError> {
        if let Some(protocol) = self.learned.get() {
            return Ok(protocol);
        }
        // An HTTP/2 connection is kept for the requests to come; a host that chose HTTP/1.1
        // is noted as such (its connection dropped).
        let connected = self.h2_conn().await;
        match (self.learned.get(), connected) {
            (Some(protocol), _) => Ok(protocol),
            (None, Ok(_)) => Ok(UpstreamProtocol::Http2),
            (None, Err(error)) => Err(error),
        }
    }

    /// Whether the host is reached over TLS (by its transport as of now).
    pub(crate) fn tls(&self) -> bool {
        let shared = &self.settings.shared;
        shared.tls(shared.transport_of(self.addr)).is_some()
    }

    pub(crate) fn stats(&self) -> &ClusterStats {
        &self.stats
    }

    /// Counts a request that hit its route timeout on this host: for outlier detection a
    /// try without a response, as Envoy counts a timeout (a gateway failure, or a local-origin
    /// one when those are split out).
    pub(crate) fn count_timeout(&self) {
        self.stats.rq_timeout.inc();
        self.report(TryOutcome::NoResponse);
        if let Some(endpoint) = &self.endpoint_stats {
            endpoint.rq_timeout.inc();
            endpoint.rq_error.inc();
        }
    }

    pub(crate) fn shared(&self) -> &Arc<SharedCluster> {
        &self.settings.shared
    }

    /// The cluster's `per_connection_buffer_limit_bytes`.
    pub(crate) fn buffer_limit(&self) -> usize {
        self.settings.buffer_limit
    }

    /// Sends `req` and waits for the response head. The response body streams on; for
    /// HTTP/1.1 the connection returns to the pool when that body has been read to its end.
    /// The request is taken from `req` as it is sent: one refused or failed before any of it
    /// was sent is still there, whole, and the error says so (`unsent`). By reference, so that
    /// the request is not kept again in each level of the send's future.
    /// `admitted` is the slot [`HostPool::admit`] took; it is held until the response is done.
    pub(crate) async fn send(
        self: &Rc<Self>,
        req: &mut Request<RequestBody>,
        picked: Picked,
        admitted: Slot<'_>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        if self.settings.auto_sni.is_some() {
            let named = match self.for_request(req) {
                Ok(named) => named,
                // The slot and the pick are given back as they drop.
                Err(error) => return Err(SendError::unsent(error)),
            };
            if !Rc::ptr_eq(&named, self) {
                // Boxed: once per request of an `auto_sni` cluster only.
                return Box::pin(named.send(req, picked, admitted)).await;
            }
        }
        // The request guard, which outlives this borrow, gives the slot back instead.
        admitted.hand_over();
        let request = UpstreamRequest::start(self, picked);
        let protocol = match self.settings.protocol {
            UpstreamProtocol::Auto => match self.learned.get() {
                Some(protocol) => Ok(protocol),
                // Boxed: learning is once per host and worker, not in every request's future.
                None => Box::pin(self.learn_protocol()).await,
            }
            .inspect(|&protocol| {
                // Written for another host of the cluster (a retry), or before this one chose.
                super::request_form::fit_to_protocol(req, protocol, self.tls());
            }),
            // Written for the client's protocol already (rewrite.rs).
            UpstreamProtocol::Downstream => Ok(downstream_protocol(req.version())),
            protocol => Ok(protocol),
        };
        let sent = match protocol {
            Err(error) => Err(SendError::unsent(error)),
            Ok(UpstreamProtocol::Http1) => self
                .send_h1(req)
                .await
                .map(|(head, body)| (head, UpstreamBody::http1(body, request))),
            // From the worker's pool of boxes: the HTTP/2 send's state is twice the HTTP/1.1
            // one's, and every request's future (each level of it) would carry it.
            Ok(UpstreamProtocol::Http2 | UpstreamProtocol::Auto | UpstreamProtocol::Downstream) => {
                PooledBox::pin_with(|| self.send_h2(req))
                    .await
                    .map(|(head, body, connection)| {
                        (head, UpstreamBody::hyper(body, request.on_h2(connection)))
                    })
            }
        };
        let outcome = match &sent {
            Ok((head, _)) => Some(TryOutcome::Status(head.status.as_u16())),
            Err(SendError { error, .. }) => self.outcome_of(error),
        };
        if let Some(outcome) = outcome {
            self.report(outcome);
            if let Some(endpoint) = &self.endpoint_stats {
                match outcome {
                    TryOutcome::Status(status) if status < 500 => endpoint.rq_success.inc(),
                    _ => endpoint.rq_error.inc(),
                }
            }
        }
        let (head, body) = sent?;
        self.stats.response(head.status);
        Ok(Response::from_parts(head, body))
    }

    /// What a try that failed with `error` tells outlier detection of the host; `None`:
    /// nothing.
    pub(super) fn outcome_of(&self, error: &ProxyError) -> Option<TryOutcome> {
        match error {
            // Not the host's doing: a breaker or `max_connection_pools` refused, or the client
            // went away.
            ProxyError::Overflow(_)
            | ProxyError::NoHealthyUpstream
            | ProxyError::ClientAborted { .. } => None,
            // The name was the client's to choose (`auto_sni`): a certificate not valid for
            // it says nothing of the host.
            ProxyError::UpstreamTls { .. } if self.sni.is_some() => None,
            _ => Some(TryOutcome::NoResponse),
        }
    }

    /// Counts a try's outcome for outlier detection.
    pub(super) fn report(&self, outcome: TryOutcome) {
        let shared = &self.settings.shared;
        match shared
            .health
            .report(&shared.host_set, &self.health, self.addr, outcome)
        {
            Ejection::None => {}
            Ejection::Ejected => self.stats.outlier_detection_ejections_enforced_total.inc(),
            Ejection::Overflow => self.stats.outlier_detection_ejections_overflow.inc(),
        }
    }
}

impl Drop for HostPool {
    fn drop(&mut self) {
        // Its idle connections close with it, and cannot reach it any more to count
        // themselves out (connect.rs `OpenConn`).
        let relays = std::mem::take(self.relays.get_mut()).len();
        if let Some(watcher) = self.relay_watcher.get_mut().take() {
            // It ends once it finds the pool gone.
            watcher.wake();
        }
        for _ in 0..self.h1.close_idle() + relays {
            self.host_stats.cx_active.dec();
        }
        // Its connections cannot reach it any more to give its pool slot back.
        if self.holds_pool_slot.get()
            && let Some(pools) = &self.settings.shared.breakers.pools
        {
            pools.release();
        }
    }
}

/// Names kept per host and worker with `auto_sni`.
pub(crate) const MAX_SNI_POOLS: usize = 32;

/// The host `auto_sni` sends for `req`: `header`'s value when given and not empty, else the
/// request's host, without its port (and an IPv6 address's brackets).
fn sni_host<'r, B>(req: &'r Request<B>, header: Option<&http::HeaderName>) -> Option<&'r str> {
    let value = header
        .and_then(|h| req.headers().get(h))
        .filter(|v| !v.is_empty())
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .or_else(|| (req.headers().get(http::header::HOST)).and_then(|v| v.to_str().ok()))?;
    let host = match value.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(bracketed),
        None => match value.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => value,
        },
    };
    Some(host).filter(|h| !h.is_empty())
}

/// A `downstream` cluster's protocol for a request that came in as `version`.
fn downstream_protocol(version: http::Version) -> UpstreamProtocol {
    if version >= http::Version::HTTP_2 {
        UpstreamProtocol::Http2
    } else {
        UpstreamProtocol::Http1
    }
}

/// Why a request got no response, and whether none of it was sent (so that it can be tried
/// again as it is).
pub(crate) struct SendError {
    pub(crate) error: ProxyError,
    /// Nothing of the request went: it is still whole where the send took it from.
    pub(crate) unsent: bool,
}

impl SendError {
    pub(super) fn unsent(error: ProxyError) -> Self {
        Self {
            error,
            unsent: true,
        }
    }

    pub(super) fn sent(error: ProxyError) -> Self {
        Self {
            error,
            unsent: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sni_host;

    fn host_of(host: &str, header: Option<(&str, &str)>) -> Option<String> {
        let mut req = http::Request::get("/").header(http::header::HOST, host);
        if let Some((name, value)) = header {
            req = req.header(name, value);
        }
        let req = req.body(()).unwrap();
        let name = http::HeaderName::from_static("x-sni");
        sni_host(&req, Some(&name)).map(str::to_owned)
    }

    #[test]
    fn the_name_is_the_host_without_its_port_or_the_header_s_value() {
        assert_eq!(
            host_of("a.internal:8443", None).as_deref(),
            Some("a.internal")
        );
        assert_eq!(host_of("a.internal", None).as_deref(), Some("a.internal"));
        assert_eq!(host_of("[::1]:80", None).as_deref(), Some("::1"));
        assert_eq!(
            host_of("a.internal", Some(("x-sni", "b.internal"))).as_deref(),
            Some("b.internal")
        );
        // An empty header's value does not count.
        assert_eq!(
            host_of("a.internal", Some(("x-sni", ""))).as_deref(),
            Some("a.internal")
        );
        assert_eq!(host_of(":80", None), None);
    }
}
