//! One downstream connection's context, and the listener and worker facts a request needs.

use std::cell::{Cell, RefCell};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use http::HeaderValue;
use tokio::time::Instant;

use super::InFlight;
use crate::access_log::WorkerLog;
use crate::catalog::{ListenerStats, WorkerStats};

/// What a request needs to know about its listener, on one worker.
pub(crate) struct ListenerCtx {
    pub(crate) name: String,
    /// Whether the listener terminates TLS (`x-forwarded-proto`, the scheme authorization sees).
    pub(crate) tls: bool,
    /// `https` on TLS listeners, `http` otherwise, as header text.
    pub(crate) forwarded_proto: HeaderValue,
    /// Whether `x-forwarded-for` is appended to, and how many proxies in front are trusted.
    pub(crate) forwarded_trust: super::ForwardedTrust,
    /// Ways to find the client instead (`original_ip_detection`), in order.
    pub(crate) client_detection: Box<[config::listener::client_address::ClientDetection]>,
    /// Requests one client connection may carry; `None`: no limit.
    pub(crate) max_requests_per_connection: Option<u32>,
    /// How long one client connection may live; `None`: no limit.
    pub(crate) max_connection_duration: Option<std::time::Duration>,
    /// The request-head limit in bytes, when the codec's buffer is larger and so does not
    /// enforce it (HTTP/1.1 with a buffer limit above `max_request_headers_kb`).
    pub(crate) head_limit: Option<usize>,
    /// The overload manager's actions do not apply (`bypass_overload_manager`).
    pub(crate) bypass_overload: bool,
    pub(crate) stats: ListenerStats,
    pub(crate) access_log: Option<WorkerLog>,
    /// The filter chain's flags, for a chain's context; `None`: the listener's own.
    pub(crate) chain: Option<super::ChainSignals>,
}

impl ListenerCtx {
    /// When a connection opened at `opened` reaches `max_connection_duration`, if any.
    pub(crate) fn expires_at(&self, opened: Instant) -> Option<Instant> {
        self.max_connection_duration.map(|d| opened + d)
    }
}

/// What a request needs to know about its worker.
pub(crate) struct WorkerCtx {
    pub(crate) stats: WorkerStats,
    /// Set when the drain starts: responses then tell HTTP/1.1 clients to close.
    pub(crate) draining: Cell<bool>,
    /// The process's overload level, read on every connection and request.
    pub(crate) overload: std::sync::Arc<crate::overload::Overload>,
    /// Whether the process is failed by the admin or draining (the `health_check` filter).
    pub(crate) health: std::sync::Arc<super::ServerHealth>,
}

/// What a request on this connection needs to know about where it came from.
pub(crate) struct ConnCtx {
    /// The client: the connection's peer, or the one a PROXY protocol header named.
    pub(crate) peer: SocketAddr,
    /// The connection's own peer, whatever a PROXY protocol header says.
    pub(crate) socket_peer: SocketAddr,
    /// The proxy's address the client connected to.
    pub(crate) local: SocketAddr,
    /// The client's IP as header text, formatted once for `x-forwarded-for`.
    pub(crate) peer_ip: HeaderValue,
    pub(crate) listener: Rc<ListenerCtx>,
    pub(crate) worker: Rc<WorkerCtx>,
    /// Responses not yet fully written.
    pub(crate) in_flight: Cell<u32>,
    /// Requests received on this connection.
    pub(crate) requests: Cell<u32>,
    /// Set when the connection has served its `max_requests_per_connection`.
    pub(crate) retire: tokio::sync::Notify,
    /// Whether the overload manager has told this connection to go (HTTP/2: a GOAWAY).
    pub(crate) retiring: Cell<bool>,
    /// When the last response finished.
    pub(crate) last_active: Cell<Instant>,
    /// When the connection was accepted.
    pub(crate) opened: Instant,
    /// An upgrade the upstream accepted: once the codec has written the `101`, the connection
    /// becomes a byte relay to this.
    pub(crate) tunnel: RefCell<Option<Box<Tunnel>>>,
    /// The certificate the client presented (mutual TLS); `None` without one.
    pub(crate) client_cert: Option<Box<ClientCertificate>>,
    /// The server name the client asked for in its TLS handshake.
    pub(crate) server_name: Option<Box<str>>,
}

/// A client's certificate, for its requests' `x-forwarded-client-cert` and the identity
/// RBAC rules ask for.
pub(crate) struct ClientCertificate {
    /// Its leaf.
    pub(crate) leaf: rustls::pki_types::CertificateDer<'static>,
    /// The leaf's names, read when first asked for.
    pub(crate) names: std::cell::OnceCell<config::tls::facts::CertificateNames>,
    /// As the client sent it, leaf first (only where the listener writes an element).
    pub(crate) chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// The proxy's own leaf served on the connection (its URI name is `By`).
    pub(crate) local: Option<rustls::pki_types::CertificateDer<'static>>,
    /// The header element last made of them, with the details it says: made on the first
    /// request that writes one, again only if a reload asks for other details.
    pub(crate) element: RefCell<
        Option<(
            config::listener::client_cert::ClientCertDetails,
            HeaderValue,
        )>,
    >,
}

impl ClientCertificate {
    /// The leaf's URI and DNS names and subject; none where it cannot be read.
    pub(crate) fn names(&self) -> &config::tls::facts::CertificateNames {
        self.names
            .get_or_init(|| config::tls::facts::certificate_names(&self.leaf).unwrap_or_default())
    }
}

/// The upstream side of an upgraded connection, and the request it came from (counted in
/// flight, and logged, until the relay ends).
pub(crate) struct Tunnel {
    pub(crate) upstream: Box<dyn TunnelIo>,
    pub(crate) in_flight: InFlight,
}

/// What a tunnel's upstream side is: an upgraded HTTP/1.1 connection, or a TCP connection a
/// terminated CONNECT opened.
pub(crate) trait TunnelIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> TunnelIo for T {}

impl ConnCtx {
    pub(crate) fn new(
        peer: SocketAddr,
        local: SocketAddr,
        listener: Rc<ListenerCtx>,
        worker: Rc<WorkerCtx>,
    ) -> Self {
        Self {
            peer,
            socket_peer: peer,
            local,
            peer_ip: ip_header_value(peer.ip()),
            listener,
            worker,
            in_flight: Cell::new(0),
            requests: Cell::new(0),
            retire: tokio::sync::Notify::new(),
            retiring: Cell::new(false),
            last_active: Cell::new(Instant::now()),
            opened: Instant::now(),
            tunnel: RefCell::new(None),
            client_cert: None,
            server_name: None,
        }
    }

    /// The client a PROXY protocol header named, and the address it connected to, in place
    /// of the connection's own.
    pub(crate) fn set_addresses(&mut self, peer: SocketAddr, local: SocketAddr) {
        self.peer = peer;
        self.peer_ip = ip_header_value(peer.ip());
        self.local = local;
    }

    /// When the connection reaches its `max_connection_duration`, if it has one.
    pub(crate) fn expires_at(&self) -> Option<Instant> {
        self.listener.expires_at(self.opened)
    }

    /// Whether the connection has reached its `max_connection_duration`.
    pub(crate) fn expired(&self) -> bool {
        self.expires_at().is_some_and(|at| at <= Instant::now())
    }
}

/// A parked connection's context, as its own fields: the context's allocation goes with the
/// task's, so that all a parked connection keeps is its place in the worker's lot.
pub(crate) struct ParkedCtx {
    peer: SocketAddr,
    local: SocketAddr,
    listener: Rc<ListenerCtx>,
    worker: Rc<WorkerCtx>,
    requests: u32,
    last_active: Instant,
    opened: Instant,
}

impl ConnCtx {
    /// The context's fields for parking, if nothing else holds it (else the context back).
    /// Only an idle cleartext HTTP/1.1 connection is parked: nothing is in flight, no tunnel
    /// is open, nothing waits on `retire`, and there is no client certificate.
    pub(crate) fn park(this: Rc<ConnCtx>) -> Result<ParkedCtx, Rc<ConnCtx>> {
        let ctx = Rc::try_unwrap(this)?;
        Ok(ParkedCtx {
            peer: ctx.peer,
            local: ctx.local,
            listener: ctx.listener,
            worker: ctx.worker,
            requests: ctx.requests.get(),
            last_active: ctx.last_active.get(),
            opened: ctx.opened,
        })
    }
}

impl ParkedCtx {
    /// The context again, for the connection's next request. Active now: its client has just
    /// sent (that is why it is resumed), so its idle time starts again from here.
    pub(crate) fn resume(self) -> Rc<ConnCtx> {
        let mut ctx = ConnCtx::new(self.peer, self.local, self.listener, self.worker);
        ctx.requests.set(self.requests);
        ctx.opened = self.opened;
        Rc::new(ctx)
    }

    pub(crate) fn listener(&self) -> &ListenerCtx {
        &self.listener
    }

    pub(crate) fn last_active(&self) -> Instant {
        self.last_active
    }

    pub(crate) fn expires_at(&self) -> Option<Instant> {
        self.listener.expires_at(self.opened)
    }
}

/// Waits for `at`, or forever without one.
pub(crate) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// An address as header text, e.g. for `x-forwarded-for`.
fn ip_header_value(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip.to_string()).expect("an IP address is valid header text")
}
