//! A raw connection to one of a cluster's hosts, for a `tcp_proxy` listener: the host picked
//! as a request's would be, within the cluster's `max_connections`, counted as an upstream
//! connection while it lives, and its connect outcome reported to outlier detection.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use balancer::Picked;
use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connect::OpenConn;
use super::health::TryOutcome;
use super::{Cluster, HostPool};
use crate::error::{Overflow, ProxyError};
use crate::tls::UpstreamIo;

/// An open connection to a host. The host's in-flight mark (least request counts it) and the
/// connection's count and `max_connections` slot are held until it is dropped.
pub(crate) struct TcpUpstream {
    pub(crate) io: UpstreamIo,
    pub(crate) addr: SocketAddr,
    _open: OpenConn,
    host: Rc<HostPool>,
    _picked: Picked,
    /// The host's failure count when connected.
    failures_at_open: u32,
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
        let host = Rc::clone(&self.host);
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
        let _claim = host.claim_pool_slot()?;
        let Some(slot) = host.try_connection_slot() else {
            self.stats.cx_overflow.inc();
            host.settings.log_refused(Overflow::Connections);
            return Err(ProxyError::Overflow(Overflow::Connections));
        };
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
