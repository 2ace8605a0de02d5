//! A raw connection to one of a cluster's hosts, for a `tcp_proxy` listener: the host picked
//! as a request's would be, within the cluster's `max_connections`, counted as an upstream
//! connection while it lives, and its connect outcome reported to outlier detection.

use std::net::{IpAddr, SocketAddr};
use std::pin::{Pin, pin};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Context, Poll};

use balancer::Picked;
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::connect::OpenConn;
use super::health::TryOutcome;
use super::preconnect::Ahead;
use super::{Cluster, HostPool};
use crate::error::{Overflow, ProxyError};
use crate::tls::UpstreamIo;

/// An open connection to a host. The host's in-flight mark (least request counts it) and the
/// connection's count and `max_connections` slot are held until it is dropped.
pub(crate) struct TcpUpstream {
    pub(crate) io: UpstreamIo,
    pub(crate) addr: SocketAddr,
    _open: OpenConn,
    host: Relaying,
    _picked: Picked,
    /// The host's failure count when connected.
    failures_at_open: u32,
}

/// A relay counted in its host's pool's requests in flight (what `preconnect` compares its
/// connections with) while it lives.
struct Relaying(Rc<HostPool>);

impl Relaying {
    fn new(pool: Rc<HostPool>) -> Self {
        pool.in_flight.set(pool.in_flight.get() + 1);
        Self(pool)
    }
}

impl Drop for Relaying {
    fn drop(&mut self) {
        (self.0.in_flight).set(self.0.in_flight.get().saturating_sub(1));
    }
}

impl std::ops::Deref for Relaying {
    type Target = Rc<HostPool>;

    fn deref(&self) -> &Rc<HostPool> {
        &self.0
    }
}

/// A connection opened ahead of the relay that will take it (`preconnect`). Bytes the host
/// sends meanwhile (a greeting) wait in the socket for that relay.
pub(super) struct ReadyRelay {
    io: UpstreamIo,
    open: OpenConn,
    failures_at_open: u32,
    opened: Instant,
}

impl ReadyRelay {
    pub(super) fn new(io: UpstreamIo, open: OpenConn, failures_at_open: u32) -> Self {
        Self {
            io,
            open,
            failures_at_open,
            opened: Instant::now(),
        }
    }

    /// Whether the host has closed it, seen without reading what it may have sent; `cx` is
    /// woken when that may have changed.
    fn poll_closed(&self, cx: &mut Context<'_>) -> bool {
        let tcp = match &self.io {
            tokio_util::either::Either::Left(tcp) => tcp,
            tokio_util::either::Either::Right(tls) => tls.get_ref().0,
        };
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        match tcp.poll_peek(cx, &mut buf) {
            Poll::Pending => false,
            Poll::Ready(Ok(n)) => n == 0,
            Poll::Ready(Err(_)) => true,
        }
    }

    /// When it is to close unused, if it has not gone already: `Err` with why it has (the
    /// host closed it, failed since it was opened, or its time is up, counted).
    fn check(
        &self,
        pool: &HostPool,
        cx: &mut Context<'_>,
        now: Instant,
    ) -> Result<Option<Instant>, ()> {
        if self.failures_at_open != pool.health.health_failures() || self.poll_closed(cx) {
            return Err(());
        }
        match pool.settings.expiry(self.opened, self.opened) {
            Some((at, why)) if at <= now => {
                pool.count_expiry(why);
                Err(())
            }
            expiry => Ok(expiry.map(|(at, _)| at)),
        }
    }
}

impl HostPool {
    /// Keeps a relay connection opened ahead for the next relay to this host, watched
    /// meanwhile so that it closes (giving back its slot) once the host closes it, its host
    /// fails or its `idle_timeout` passes.
    pub(super) fn keep_relay(self: &Rc<Self>, relay: ReadyRelay) {
        self.relays.borrow_mut().push_back(relay);
        match self.relay_watcher.borrow().as_ref() {
            Some(watcher) => watcher.wake_by_ref(),
            None => {
                if !self.relay_watching.replace(true) {
                    tokio::task::spawn_local(watch_relays(Rc::downgrade(self)));
                }
            }
        }
    }

    /// The oldest relay connection opened ahead that is still open, within its time and
    /// made since the host last failed.
    fn ready_relay(&self) -> Option<ReadyRelay> {
        let now = Instant::now();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        loop {
            let relay = self.relays.borrow_mut().pop_front()?;
            if relay.check(self, &mut cx, now).is_ok() {
                return Some(relay);
            }
        }
    }

    /// Drops the relay connections opened ahead that have gone (see [`ReadyRelay::check`]),
    /// `cx` woken by the others' sockets: when the next one's time is up, if any.
    fn sweep_relays(&self, cx: &mut Context<'_>) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        self.relays
            .borrow_mut()
            .retain(|relay| match relay.check(self, cx, now) {
                Ok(at) => {
                    next = match (next, at) {
                        (Some(n), Some(a)) => Some(n.min(a)),
                        (n, a) => n.or(a),
                    };
                    true
                }
                Err(()) => false,
            });
        next
    }

    /// Wakes the relay watcher to look again (the pool is going, or let its relays go).
    pub(super) fn wake_relay_watcher(&self) {
        if let Some(watcher) = self.relay_watcher.borrow_mut().take() {
            watcher.wake();
        }
    }
}

/// Watches a pool's relay connections opened ahead while it has any: one task per host and
/// worker, woken by their sockets, a timer for the next to expire, and the host's failures.
/// Ends once none is left (the next kept starts another) or the pool has gone.
async fn watch_relays(pool: Weak<HostPool>) {
    let Some(host) = pool.upgrade().map(|p| Arc::clone(&p.health)) else {
        return;
    };
    let mut failed = pin!(host.failed.notified());
    let mut timer = pin!(tokio::time::sleep_until(Instant::now()));
    std::future::poll_fn(|cx| {
        loop {
            let Some(pool) = pool.upgrade() else {
                return Poll::Ready(());
            };
            while failed.as_mut().poll(cx).is_ready() {
                failed.set(host.failed.notified());
            }
            let next = pool.sweep_relays(cx);
            if pool.relays.borrow().is_empty() {
                *pool.relay_watcher.borrow_mut() = None;
                pool.relay_watching.set(false);
                return Poll::Ready(());
            }
            let mut watcher = pool.relay_watcher.borrow_mut();
            if !watcher.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *watcher = Some(cx.waker().clone());
            }
            drop(watcher);
            let Some(next) = next else {
                return Poll::Pending;
            };
            timer.as_mut().reset(next);
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    })
    .await;
}

impl TcpUpstream {
    /// The host's address as text, for an access log line.
    pub(crate) fn addr_text(&self) -> &http::HeaderValue {
        self.host.addr_text()
    }

    /// Resolves once the host has failed its health checks or been ejected since the
    /// connection was made, where the cluster says to close connections then
    /// (`close_connections_on_host_health_failure`); never otherwise.
    pub(crate) fn host_failed(&self) -> impl Future<Output = ()> + 'static {
        let host = Rc::clone(&self.host.0);
        let at_open = self.failures_at_open;
        async move {
            if !host.settings.close_on_host_failure {
                return std::future::pending().await;
            }
            loop {
                // Registered before looking, so a failure between the look and the wait is
                // kept.
                let failed = host.health.failed.notified();
                tokio::pin!(failed);
                failed.as_mut().enable();
                if host.health.health_failures() != at_open {
                    return;
                }
                failed.await;
            }
        }
    }
}

// A terminated CONNECT's tunnel holds the connection whole, its slot and counts with it.
impl AsyncRead for TcpUpstream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for TcpUpstream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Cluster {
    /// Picks a host for `client` (hashed by the relay's `hash`, else by the cluster's
    /// `hash_key` read from `headers`, a CONNECT's or none, where its policy hashes) and
    /// connects to it.
    pub(crate) async fn connect_tcp(
        &self,
        headers: &HeaderMap,
        client: IpAddr,
        hash: Option<u64>,
    ) -> Result<TcpUpstream, ProxyError> {
        let key = self.request_key(headers, client, hash);
        let (host, picked) = self.pick(key).ok_or(ProxyError::NoHealthyUpstream)?;
        self.preconnect_predictive(|_| Some(Ahead::Relay));
        let host = Relaying::new(host);
        if let Some(ready) = host.ready_relay() {
            host.preconnect(Ahead::Relay);
            return Ok(TcpUpstream {
                io: ready.io,
                addr: host.addr,
                _open: ready.open,
                host,
                _picked: picked,
                failures_at_open: ready.failures_at_open,
            });
        }
        let _claim = host.claim_pool_slot()?;
        let Some(slot) = host.try_connection_slot() else {
            self.stats().cx_overflow.inc();
            host.settings.log_refused(Overflow::Connections);
            return Err(ProxyError::Overflow(Overflow::Connections));
        };
        host.preconnect(Ahead::Relay);
        let failures_at_open = host.health.health_failures();
        match host.connect_raw().await {
            Ok(io) => {
                host.report(TryOutcome::Status(200));
                let open = host.open_connection(slot);
                Ok(TcpUpstream {
                    io,
                    addr: host.addr,
                    _open: open,
                    host,
                    _picked: picked,
                    failures_at_open,
                })
            }
            Err(error) => {
                host.report(TryOutcome::NoResponse);
                Err(error)
            }
        }
    }
}
