//! A `tcp_proxy` listener's connections (Envoy's `tcp_proxy` network filter): past the
//! listener's PROXY protocol and TLS, each goes to a host of the listener's cluster and its
//! bytes are relayed both ways, at most the listener's buffer limit held per direction. One
//! side's end is passed on as a half close; the relay ends when both sides are done, either
//! fails, nothing moves for the idle timeout, or the connection reaches its maximum age.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use config::RbacAction;
use config::listener::tcp_proxy::TcpHashPolicy;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::access_log::LogRecord;
use crate::catalog::TcpProxyStats;
use crate::cluster::Cluster;
use crate::context::ConnCtx;
use crate::error::{ProxyError, ResponseFlag};

/// A `tcp_proxy` listener's settings on one worker, for one config generation.
pub(crate) struct TcpProxyCtx {
    /// Index into the worker's clusters.
    pub(crate) cluster: usize,
    /// Clusters drawn by weight per connection, instead of `cluster`: (index, weight).
    pub(crate) weighted: Box<[(usize, u32)]>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_connect_attempts: u32,
    pub(crate) max_duration: Option<Duration>,
    pub(crate) hash_policy: Option<TcpHashPolicy>,
    /// Bytes held per direction.
    pub(crate) buffer: usize,
    /// Who may connect (the network `rbac` filter).
    rbac: Option<config::RbacConfig>,
    pub(crate) stats: TcpProxyStats,
}

impl TcpProxyCtx {
    pub(crate) fn new(
        config: &config::listener::tcp_proxy::TcpProxyConfig,
        buffer: u32,
        stats: TcpProxyStats,
    ) -> Self {
        Self {
            cluster: config.cluster,
            weighted: (config.weighted_clusters.iter())
                .map(|w| (w.cluster, w.weight))
                .collect(),
            idle_timeout: config.idle_timeout,
            max_connect_attempts: config.max_connect_attempts,
            max_duration: config.max_downstream_connection_duration,
            hash_policy: config.hash_policy,
            buffer: buffer as usize,
            rbac: config.rbac.clone(),
            stats,
        }
    }

    /// Whether the listener's rules let the connection on (shadow rules counted too).
    fn allows(&self, conn: &ConnCtx) -> bool {
        let Some(rbac) = &self.rbac else {
            return true;
        };
        if let Some(shadow) = &rbac.shadow_rules {
            match crate::filters::decide_connection(shadow, conn) {
                RbacAction::Deny => self.stats.rbac_shadow_denied.inc(),
                RbacAction::Allow | RbacAction::Log => self.stats.rbac_shadow_allowed.inc(),
            }
        }
        let Some(rules) = &rbac.rules else {
            return true;
        };
        if crate::filters::decide_connection(rules, conn) == RbacAction::Deny {
            self.stats.rbac_denied.inc();
            return false;
        }
        self.stats.rbac_allowed.inc();
        true
    }
}

impl TcpProxyCtx {
    /// The cluster of a new connection: `cluster`, or one of `weighted` drawn by weight.
    fn pick_cluster(&self) -> usize {
        let total: u64 = self.weighted.iter().map(|(_, w)| u64::from(*w)).sum();
        if total == 0 {
            return self.cluster;
        }
        let mut draw = crate::random::next_u64() % total;
        for (cluster, weight) in &self.weighted {
            if draw < u64::from(*weight) {
                return *cluster;
            }
            draw -= u64::from(*weight);
        }
        self.cluster
    }
}

/// Relays `io` to a host of the cluster until the relay ends; closes it at once when no host
/// can be reached. Each connection is one line of the listener's access log, written however
/// the relay ends (closed by a drain or a shutdown too).
pub(crate) async fn serve(
    mut io: impl AsyncRead + AsyncWrite + Unpin,
    conn: Rc<ConnCtx>,
    tcp: &TcpProxyCtx,
    clusters: &[Rc<Cluster>],
) {
    let started = Instant::now();
    let mut log = ConnLog::new(conn);
    let conn = Rc::clone(&log.conn);
    // Decided before any upstream is connected: a denied client gets nothing (Envoy's
    // network filter decides on the first byte, after its proxy has connected).
    if !tcp.allows(&conn) {
        tracing::debug!(peer = %conn.peer, "tcp_proxy: connection denied by rbac");
        let _ = io.shutdown().await;
        return;
    }
    let upstream = match connect(tcp, clusters, &conn).await {
        Ok(upstream) => upstream,
        Err(flag) => {
            tcp.stats.cx_no_upstream.inc();
            let _ = io.shutdown().await;
            log.record.flag = Some(flag);
            return;
        }
    };
    tcp.stats.cx_total.inc();
    log.record.upstream = Some(upstream.addr_text().clone());
    let activity = Cell::new(Instant::now());
    let (down_read, down_write) = tokio::io::split(io);
    let host_failed = upstream.host_failed();
    let (up_read, up_write) = tokio::io::split(upstream.io);
    let (received, sent) = (&log.received, &log.sent);
    let to_upstream = crate::relay::pipe(down_read, up_write, tcp.buffer, &activity, |n| {
        tcp.stats.rx_bytes.add(n as u64);
        received.set(received.get() + n as u64);
    });
    let to_client = crate::relay::pipe(up_read, down_write, tcp.buffer, &activity, |n| {
        tcp.stats.tx_bytes.add(n as u64);
        sent.set(sent.get() + n as u64);
    });
    let idle = async {
        match tcp.idle_timeout {
            Some(timeout) => crate::runtime::idle_for(timeout, &activity).await,
            None => std::future::pending().await,
        }
    };
    let aged = async {
        match tcp.max_duration {
            Some(limit) => tokio::time::sleep_until(started + limit).await,
            None => std::future::pending().await,
        }
    };
    let flag = tokio::select! {
        result = async { tokio::try_join!(to_upstream, to_client) } => {
            if let Err(error) = result {
                tracing::debug!(peer = %conn.peer, upstream = %upstream.addr, %error, "relay ended with an error");
            }
            None
        }
        () = idle => {
            tcp.stats.idle_timeout.inc();
            None
        }
        () = aged => {
            tcp.stats.max_duration_reached.inc();
            Some(ResponseFlag::DurationTimeout)
        }
        () = host_failed => {
            tracing::debug!(peer = %conn.peer, upstream = %upstream.addr, "host failed: relay closed");
            None
        }
    };
    log.record.flag = flag;
}

/// A relayed connection's access log line, written when it is dropped: at the relay's end,
/// or when the relay is dropped from outside (its chain or listener closed, a shutdown).
struct ConnLog {
    conn: Rc<ConnCtx>,
    record: LogRecord,
    received: Cell<u64>,
    sent: Cell<u64>,
}

impl ConnLog {
    fn new(conn: Rc<ConnCtx>) -> Self {
        Self {
            record: LogRecord {
                peer: Some(conn.peer),
                ..LogRecord::default()
            },
            conn,
            received: Cell::new(0),
            sent: Cell::new(0),
        }
    }
}

impl Drop for ConnLog {
    fn drop(&mut self) {
        let Some(log) = &self.conn.listener.access_log else {
            return;
        };
        self.record.bytes_received = self.received.get();
        self.record.bytes_sent = self.sent.get();
        // The connection's whole life, from its accept, as Envoy's `%DURATION%` of a TCP
        // connection.
        let duration = self.conn.opened.elapsed();
        let wall_start = SystemTime::now()
            .checked_sub(duration)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        log.record(&self.record, wall_start, duration);
    }
}

/// A connection to a host, trying up to `max_connect_attempts` hosts; else why there is none.
async fn connect(
    tcp: &TcpProxyCtx,
    clusters: &[Rc<Cluster>],
    conn: &ConnCtx,
) -> Result<crate::cluster::TcpUpstream, ResponseFlag> {
    // Validated against the config's clusters, which are the worker's, in the same order.
    let cluster = (clusters.get(tcp.pick_cluster())).ok_or(ResponseFlag::NoHealthyUpstream)?;
    let client = conn.peer.ip();
    let hash = tcp.hash_policy.map(|policy| match policy {
        TcpHashPolicy::SourceIp => crate::cluster::ip_hash(client),
    });
    for _ in 0..tcp.max_connect_attempts {
        match cluster
            .connect_tcp(&http::HeaderMap::new(), client, hash)
            .await
        {
            Ok(upstream) => return Ok(upstream),
            // No host, or the cluster at its limit: another attempt would find the same.
            Err(error @ (ProxyError::NoHealthyUpstream | ProxyError::Overflow(_))) => {
                tracing::debug!(peer = %conn.peer, %error, "tcp_proxy: no upstream");
                return Err(match error {
                    ProxyError::Overflow(_) => ResponseFlag::UpstreamOverflow,
                    _ => ResponseFlag::NoHealthyUpstream,
                });
            }
            Err(error) => {
                tracing::debug!(peer = %conn.peer, %error, "tcp_proxy: connect attempt failed");
            }
        }
    }
    Err(ResponseFlag::UpstreamConnectFailure)
}
