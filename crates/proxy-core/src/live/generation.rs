//! One config generation: a validated config and the process-wide state built for it, which
//! every worker turns into its own listeners and clusters. Generations share what did not
//! change (clusters, listening sockets, TLS, rate-limit buckets) with the one before.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use crate::access_log::LogSinks;
use crate::cluster::SharedCluster;
use crate::filters::SharedFilters;
use crate::listen::ConnectionLimits;
use crate::router::RouteTable;
use crate::tls::{ServerTls, TlsListeners};
use crate::trace::SharedTracer;
use config::Config;

pub(crate) struct Generation {
    /// 1 at start, one more per successful reload.
    pub(crate) number: u64,
    pub(crate) config: Arc<Config>,
    pub(crate) loaded_at: SystemTime,
    /// Per cluster, in config order.
    pub(crate) clusters: Arc<Vec<Arc<SharedCluster>>>,
    /// Per listener, in config order.
    pub(crate) listeners: Vec<SharedListener>,
    pub(crate) log_sinks: Arc<LogSinks>,
    pub(crate) tls: Arc<TlsListeners>,
    /// The span exporter, when `tracing` is configured; kept while it stays the same.
    pub(crate) tracer: Option<Arc<SharedTracer>>,
    /// `max_connections`, with its count: kept across generations while it stays the same,
    /// even through ones where no listener counts against it.
    pub(crate) process_limit: Option<Arc<crate::listen::Limit>>,
    progress: Progress,
}

/// What all workers share about one listener. The same listener (same address and balancing)
/// keeps its `id` and sockets from one generation to the next.
pub(crate) struct SharedListener {
    pub(crate) id: u64,
    pub(crate) sockets: Arc<BoundSockets>,
    /// HTTP/3's UDP sockets, when the listener serves it.
    pub(crate) quic: Option<Arc<crate::listen::QuicSockets>>,
    pub(crate) limits: ConnectionLimits,
    pub(crate) tls: Option<Arc<ServerTls>>,
    /// Built once per config version (kept while the routes stay the same).
    pub(crate) routes: Arc<RouteTable>,
    pub(crate) filters: Arc<SharedFilters>,
    /// A hash of what a connection is served with (everything but routes and filters):
    /// equal keys let a worker keep the connection-level context.
    pub(crate) conn_key: u64,
    /// Its filter chains, in config order: each served as a listener of its own on the same
    /// sockets (same id and limits), picked per connection by `selector`.
    pub(crate) chains: Vec<SharedListener>,
    pub(crate) selector: Option<Arc<crate::conn::ChainSelector>>,
}

/// A listener's bound sockets, one per worker, each taken by its worker when it starts
/// serving the listener; and a duplicate of each, to hand to a new binary in an upgrade.
/// Dropped with the last generation that has the listener.
pub(crate) struct BoundSockets {
    pub(crate) address: SocketAddr,
    /// Whether the sockets are one shared socket (`exact` balancing).
    pub(crate) shared: bool,
    per_worker: Mutex<Vec<Option<std::net::TcpListener>>>,
    /// Emptied when the listener is removed, so the sockets close as soon as the workers
    /// let go of theirs.
    handover: Mutex<Vec<std::net::TcpListener>>,
}

impl BoundSockets {
    pub(crate) fn new(sockets: Vec<std::net::TcpListener>, shared: bool) -> std::io::Result<Self> {
        let address = match sockets.first() {
            Some(socket) => socket.local_addr()?,
            None => return Err(std::io::Error::other("no socket bound")),
        };
        let handover = sockets
            .iter()
            .map(std::net::TcpListener::try_clone)
            .collect::<std::io::Result<_>>()?;
        Ok(Self {
            address,
            shared,
            per_worker: Mutex::new(sockets.into_iter().map(Some).collect()),
            handover: Mutex::new(handover),
        })
    }

    /// No TCP socket: a QUIC-only listener's, on `address`.
    pub(crate) fn none(address: SocketAddr) -> Self {
        Self {
            address,
            shared: false,
            per_worker: Mutex::new(Vec::new()),
            handover: Mutex::new(Vec::new()),
        }
    }

    /// Worker `worker`'s socket; `None` once taken.
    pub(crate) fn take(&self, worker: usize) -> Option<std::net::TcpListener> {
        self.per_worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(worker)?
            .take()
    }

    /// Duplicates of the sockets, for handing to a new binary.
    pub(crate) fn handover(&self) -> std::io::Result<Vec<std::net::TcpListener>> {
        self.handover
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(std::net::TcpListener::try_clone)
            .collect()
    }

    /// The listener is gone from the config: only the workers' sockets keep it open now.
    pub(crate) fn release(&self) {
        self.handover
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.per_worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// How far the workers are with a generation.
struct Progress {
    accepted_at: Instant,
    workers: usize,
    applied: watch::Sender<usize>,
    last_applied_at: Mutex<Option<Instant>>,
}

impl Generation {
    /// A hash of the effective config, as 16 hex digits: made when asked for (a dump, a
    /// reload's report), not with every change, as it reads the whole config.
    pub(crate) fn version(&self) -> ConfigVersion {
        ConfigVersion(Arc::clone(&self.config))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        number: u64,
        config: Arc<Config>,
        clusters: Arc<Vec<Arc<SharedCluster>>>,
        listeners: Vec<SharedListener>,
        log_sinks: Arc<LogSinks>,
        tls: Arc<TlsListeners>,
        tracer: Option<Arc<SharedTracer>>,
        workers: usize,
    ) -> Self {
        Self {
            number,
            config,
            loaded_at: SystemTime::now(),
            clusters,
            listeners,
            log_sinks,
            tls,
            tracer,
            process_limit: None,
            progress: Progress {
                accepted_at: Instant::now(),
                workers,
                applied: watch::Sender::new(0),
                last_applied_at: Mutex::new(None),
            },
        }
    }

    /// Propagation is measured from `at`: when the change came (a reload asked for, an xDS
    /// response received).
    pub(crate) fn accepted_at(&mut self, at: Instant) {
        self.progress.accepted_at = at;
    }

    /// A worker serves with this generation from now on.
    pub(crate) fn applied_by_worker(&self) {
        let now = Instant::now();
        {
            let mut last = self
                .progress
                .last_applied_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            *last = Some(last.map_or(now, |t| t.max(now)));
        }
        self.progress.applied.send_modify(|n| *n += 1);
    }

    /// Waits until every worker applied this generation, up to `limit`. Returns how many had
    /// and, when all had, the time from acceptance to the last one.
    pub(crate) async fn all_applied(&self, limit: Duration) -> (usize, Option<Duration>) {
        let p = &self.progress;
        let mut applied = p.applied.subscribe();
        let all = tokio::time::timeout(limit, applied.wait_for(|n| *n >= p.workers))
            .await
            .is_ok_and(|r| r.is_ok());
        let count = *applied.borrow();
        if !all {
            return (count, None);
        }
        let last = *p
            .last_applied_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (
            count,
            last.map(|t| t.saturating_duration_since(p.accepted_at)),
        )
    }
}

/// A config's version: a hash of it, as 16 hex digits, made when shown.
#[derive(Clone)]
pub struct ConfigVersion(Arc<Config>);

impl std::fmt::Display for ConfigVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", super::build::hash_of(&*self.0))
    }
}

impl std::fmt::Debug for ConfigVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
