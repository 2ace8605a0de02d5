//! New connections to a host: TCP and, for TLS clusters, the handshake, both within the
//! cluster's connect timeout; and the task that drives a connection while it is open.

use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::either::Either;

use super::{HostPool, SharedCluster};
use crate::catalog::ClusterStats;
use crate::error::ProxyError;
use crate::tls::UpstreamIo;

/// What a new TLS connection offers by ALPN.
#[derive(Clone, Copy)]
enum Offer {
    /// The cluster's protocols.
    Cluster,
    /// `http/1.1` alone.
    Http1,
    /// None.
    Nothing,
}

impl HostPool {
    /// A new connection to the host, with the TLS handshake done if the cluster uses TLS;
    /// both within the connect timeout.
    pub(super) async fn connect(&self) -> Result<UpstreamIo, ProxyError> {
        self.connect_offering(Offer::Cluster).await
    }

    /// A new connection that will speak HTTP/1.1: over TLS, only `http/1.1` is offered.
    pub(super) async fn connect_http1(&self) -> Result<UpstreamIo, ProxyError> {
        self.connect_offering(Offer::Http1).await
    }

    /// A new connection for relayed bytes (`tcp_proxy`): over TLS, no protocol is offered.
    pub(super) async fn connect_raw(&self) -> Result<UpstreamIo, ProxyError> {
        self.connect_offering(Offer::Nothing).await
    }

    async fn connect_offering(&self, offer: Offer) -> Result<UpstreamIo, ProxyError> {
        let addr = self.settings.shared.connect_addr(self.addr);
        let started = Instant::now();
        let timeout = self.settings.connect_timeout;
        let connected = tokio::time::timeout(timeout, async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|source| ProxyError::ConnectFailure { addr, source })?;
            // Requests and responses are written whole; Nagle would only add latency.
            let _ = stream.set_nodelay(true);
            if let Some(probes) = &self.settings.tcp_keepalive
                && let Err(error) = socket2::SockRef::from(&stream).set_tcp_keepalive(probes)
            {
                tracing::debug!(%addr, %error, "cannot set TCP keep-alive on an upstream connection");
            }
            let shared = &self.settings.shared;
            // By the host, not where it is reached now (a logical DNS host moves).
            let Some(tls) = shared.tls(shared.transport_of(self.addr)) else {
                return Ok(Either::Left(stream));
            };
            // The request's name (`auto_sni`), else the host's own (`auto_host_sni`).
            let host_name = self.host_sni.as_ref().filter(|_| tls.names_hosts());
            let name = self.sni.as_ref().or(host_name);
            let handshake = match offer {
                Offer::Cluster => tls.connect(addr, stream, name).await,
                Offer::Http1 => tls.connect_http1(addr, stream, name).await,
                Offer::Nothing => tls.connect_without_alpn(addr, stream, name).await,
            };
            match handshake {
                Ok(stream) => {
                    self.stats.ssl_handshake.inc();
                    Ok(Either::Right(Box::new(stream)))
                }
                Err(source) => {
                    self.stats.ssl_connection_error.inc();
                    Err(ProxyError::UpstreamTls { addr, source })
                }
            }
        })
        .await;
        match connected {
            Err(_) => {
                self.stats.cx_connect_timeout.inc();
                if let Some(endpoint) = &self.endpoint_stats {
                    endpoint.cx_connect_fail.inc();
                }
                Err(ProxyError::ConnectTimeout {
                    addr,
                    after: timeout,
                })
            }
            Ok(Err(error)) => {
                self.stats.cx_connect_fail.inc();
                if let Some(endpoint) = &self.endpoint_stats {
                    endpoint.cx_connect_fail.inc();
                }
                Err(error)
            }
            Ok(Ok(stream)) => {
                self.stats
                    .cx_connect_time
                    .record_duration(started.elapsed());
                Ok(stream)
            }
        }
    }

    /// Counts a new connection as open until the returned guard is dropped, which also gives
    /// back its `max_connections` slot.
    pub(super) fn open_connection(self: &Rc<Self>, slot: ConnectionSlot) -> OpenConn {
        self.stats.cx_total.inc();
        self.stats.cx_active.inc();
        let traffic = &self.settings.shared.had_traffic;
        if !traffic.load(Ordering::Relaxed) {
            traffic.store(true, Ordering::Relaxed);
        }
        self.host_stats.cx_active.inc();
        if let Some(endpoint) = &self.endpoint_stats {
            endpoint.cx_total.inc();
        }
        OpenConn {
            _slot: slot,
            pool: Rc::downgrade(self),
            stats: Rc::clone(&self.stats),
        }
    }

    /// Drives an upstream connection on this worker (HTTP/2, or one being upgraded), counting
    /// it while it is open.
    pub(super) fn spawn_connection(
        self: &Rc<Self>,
        slot: ConnectionSlot,
        conn: impl Future<Output = ()> + 'static,
    ) {
        let open = self.open_connection(slot);
        // The task keeps the pool, so that the host's count is kept to the connection's end.
        let pool = Rc::clone(self);
        tokio::task::spawn_local(async move {
            conn.await;
            drop(open);
            drop(pool);
        });
    }

    /// Before a new connection: a slot of the cluster's `max_connection_pools` for this pool,
    /// if it holds none (it has no connection). Past the limit the request is refused, as
    /// Envoy's "no healthy upstream" (503, `UH`), and counted in `upstream_cx_pool_overflow`.
    /// The guard gives the slot back if the pool still has no connection when it drops.
    pub(super) fn claim_pool_slot(self: &Rc<Self>) -> Result<PoolClaim, ProxyError> {
        if let Some(pools) = &self.settings.shared.breakers.pools
            && !self.holds_pool_slot.get()
        {
            if !pools.try_acquire() {
                self.stats.cx_pool_overflow.inc();
                return Err(ProxyError::NoHealthyUpstream);
            }
            self.holds_pool_slot.set(true);
        }
        self.pool_claims.set(self.pool_claims.get() + 1);
        Ok(PoolClaim(Rc::clone(self)))
    }

    /// Gives the pool's `max_connection_pools` slot back once it has no connection and no
    /// request is connecting on it.
    pub(super) fn release_pool_slot_if_idle(&self) {
        if self.conns_here.get() == 0
            && self.pool_claims.get() == 0
            && self.holds_pool_slot.replace(false)
            && let Some(pools) = &self.settings.shared.breakers.pools
        {
            pools.release();
        }
    }

    /// A `max_connections` slot, if the cluster (and the host, under
    /// `max_connections_per_host`) has one free.
    pub(super) fn try_connection_slot(self: &Rc<Self>) -> Option<ConnectionSlot> {
        // Lazily: a slot built and dropped on refusal would give back one never taken.
        self.try_acquire_connection()
            .then(|| self.taken_connection_slot())
    }

    /// Takes a connection from the host's limit, if it has one, and the cluster's. As Envoy,
    /// a worker with no connection to the host may open one past the host's limit: requests
    /// waiting here have no other connection to go on (connections are per worker).
    pub(super) fn try_acquire_connection(&self) -> bool {
        let shared = &self.settings.shared;
        let per_host = shared.breakers.max_connections_per_host;
        if let Some(max) = per_host {
            let open = &self.health.connections;
            if open.fetch_add(1, Ordering::Relaxed) >= max {
                if self.slots_here.get() > 0 {
                    open.fetch_sub(1, Ordering::Relaxed);
                    return false;
                }
                self.stats.cx_overflow.inc();
            }
        }
        if shared.breakers.connections.try_acquire() {
            return true;
        }
        if per_host.is_some() {
            self.health.connections.fetch_sub(1, Ordering::Relaxed);
        }
        false
    }

    /// A slot for a connection opened ahead of requests (`preconnect`): as
    /// [`try_connection_slot`](Self::try_connection_slot), without the exception for a worker
    /// with no connection to the host, which is for requests that would otherwise have none.
    pub(super) fn try_slot_ahead(self: &Rc<Self>) -> Option<ConnectionSlot> {
        let shared = &self.settings.shared;
        let per_host = shared.breakers.max_connections_per_host;
        if let Some(max) = per_host
            && self.health.connections.fetch_add(1, Ordering::Relaxed) >= max
        {
            self.health.connections.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        if shared.breakers.connections.try_acquire() {
            return Some(self.taken_connection_slot());
        }
        if per_host.is_some() {
            self.health.connections.fetch_sub(1, Ordering::Relaxed);
        }
        None
    }

    /// The slot [`HostPool::try_acquire_connection`] (or [`HostPool::wait_pending`]) took.
    pub(super) fn taken_connection_slot(self: &Rc<Self>) -> ConnectionSlot {
        let shared = &self.settings.shared;
        self.slots_here.set(self.slots_here.get() + 1);
        self.conns_here.set(self.conns_here.get() + 1);
        ConnectionSlot {
            cluster: Arc::clone(shared),
            host: shared
                .breakers
                .max_connections_per_host
                .map(|_| Arc::clone(&self.health)),
            pool: Rc::downgrade(self),
        }
    }
}

/// A pool's claim on its `max_connection_pools` slot while it connects (see
/// [`HostPool::claim_pool_slot`]).
pub(super) struct PoolClaim(Rc<HostPool>);

impl Drop for PoolClaim {
    fn drop(&mut self) {
        let pool = &self.0;
        pool.pool_claims
            .set(pool.pool_claims.get().saturating_sub(1));
        pool.release_pool_slot_if_idle();
    }
}

/// One `max_connections` slot (and one of the host's, under `max_connections_per_host`),
/// held from a connect attempt until the connection closes, and given back when dropped
/// however that ends: a failed connect or handshake, a timeout, a client that went away while
/// the request waited.
pub(super) struct ConnectionSlot {
    cluster: Arc<SharedCluster>,
    host: Option<Arc<super::health::Counters>>,
    /// The worker's pool for the host, which counts the slots it holds.
    pool: Weak<HostPool>,
}

/// An open connection, counted in the cluster's and the host's `cx_active` until dropped.
/// It refers to its host's pool weakly: an idle connection is owned by that pool, and a strong
/// reference would keep a removed host's pool, and its connections, alive for ever.
pub(super) struct OpenConn {
    _slot: ConnectionSlot,
    pool: Weak<HostPool>,
    stats: Rc<ClusterStats>,
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.stats.cx_active.dec();
        // A pool being dropped counts its idle connections out itself (HostPool's Drop).
        if let Some(pool) = self.pool.upgrade() {
            pool.host_stats.cx_active.dec();
        }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.slots_here.set(pool.slots_here.get().saturating_sub(1));
            pool.conns_here.set(pool.conns_here.get().saturating_sub(1));
            pool.release_pool_slot_if_idle();
        }
        if let Some(host) = &self.host {
            host.connections.fetch_sub(1, Ordering::Relaxed);
        }
        self.cluster.breakers.connection_closed();
    }
}
