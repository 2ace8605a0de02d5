//! The main thread's side: binds every listener, starts the workers, and drains them.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use tokio::sync::watch;

use crate::access_log::LogSinks;
use crate::admin::{AdminServer, AdminState};
use crate::catalog::ProxyStats;
use crate::cluster::SharedCluster;
use crate::config::{Config, ConnectionBalance};
use crate::filters::SharedFilters;
use crate::listener::{
    ConnectionLimits, Limit, bind_per_worker, bind_shared, reuse_port_supported,
};
use crate::tls::{ServerTls, TlsListeners, UpstreamTls};
use crate::worker::{self, ExactBalance, WorkerSpec};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("listener `{listener}`: cannot listen on {address}: {source}")]
    Bind {
        listener: String,
        address: SocketAddr,
        source: io::Error,
    },
    #[error("admin server: cannot listen on {address}: {source}")]
    Admin {
        address: SocketAddr,
        source: io::Error,
    },
    #[error("access log: {source}")]
    AccessLog { source: io::Error },
    #[error("cannot start the cluster monitor thread: {source}")]
    Monitor { source: io::Error },
    #[error("{scope}: TLS: {source}")]
    Tls {
        scope: String,
        source: Box<crate::tls::TlsError>,
    },
    #[error("cannot start worker thread {worker}: {source}")]
    SpawnWorker { worker: usize, source: io::Error },
}

/// A running proxy: its workers and the addresses they listen on.
pub struct Server {
    workers: Vec<JoinHandle<()>>,
    drain: watch::Sender<bool>,
    addresses: Vec<(String, SocketAddr)>,
    admin: Option<AdminServer>,
    admin_state: Arc<AdminState>,
    tls_listeners: Arc<TlsListeners>,
}

impl Server {
    /// Binds every listener (one socket per worker) and starts `workers` worker threads.
    /// Nothing is started if any address cannot be bound.
    pub fn start(config: Config, workers: usize) -> Result<Server, StartError> {
        let workers = workers.max(1);
        let mut config = config;
        // Without SO_REUSEPORT, every listener falls back to one shared socket.
        if !reuse_port_supported() {
            tracing::warn!(
                "SO_REUSEPORT is not available here: every listener uses `connection_balance: exact`"
            );
            for listener in &mut config.listeners {
                listener.connection_balance = ConnectionBalance::Exact;
            }
        }
        let config = Arc::new(config);
        // sockets[worker][listener]
        let mut sockets: Vec<Vec<std::net::TcpListener>> =
            (0..workers).map(|_| Vec::new()).collect();
        let mut addresses = Vec::with_capacity(config.listeners.len());
        for listener in &config.listeners {
            let bind_error = |source| StartError::Bind {
                listener: listener.name.clone(),
                address: listener.address,
                source,
            };
            let bound = match listener.connection_balance {
                ConnectionBalance::ReusePort => {
                    bind_per_worker(listener.address, workers).map_err(bind_error)?
                }
                // One accept queue, shared: every worker accepts from the same socket and
                // hands each connection to the least-loaded worker.
                ConnectionBalance::Exact => {
                    bind_shared(listener.address, workers).map_err(bind_error)?
                }
            };
            let actual = bound[0].local_addr().unwrap_or(listener.address);
            addresses.push((listener.name.clone(), actual));
            for (worker, socket) in bound.into_iter().enumerate() {
                sockets[worker].push(socket);
            }
        }

        let log_sinks = Arc::new(
            LogSinks::open(
                config
                    .listeners
                    .iter()
                    .filter_map(|l| l.access_log.as_ref().map(|a| a.target.clone())),
            )
            .map_err(|source| StartError::AccessLog { source })?,
        );
        let stats = ProxyStats::new();
        let mut clusters = Vec::with_capacity(config.clusters.len());
        for cluster in &config.clusters {
            let tls = cluster
                .tls
                .as_ref()
                .map(|tls| UpstreamTls::new(tls, cluster.protocol.alpn()))
                .transpose()
                .map_err(|source| StartError::Tls {
                    scope: format!("cluster `{}`", cluster.name),
                    source: Box::new(source),
                })?;
            clusters.push(Arc::new(SharedCluster::new(cluster, workers, &stats, tls)));
        }
        let clusters = Arc::new(clusters);
        let mut listener_tls = Vec::with_capacity(config.listeners.len());
        for listener in &config.listeners {
            let tls = listener
                .tls
                .as_ref()
                .map(|tls| ServerTls::new(&listener.name, tls).map(Arc::new))
                .transpose()
                .map_err(|source| StartError::Tls {
                    scope: format!("listener `{}`", listener.name),
                    source: Box::new(source),
                })?;
            listener_tls.push(tls);
        }
        let tls_listeners = {
            let shard = stats.registry.shard(&[]);
            let (servers, counters) = config
                .listeners
                .iter()
                .zip(&listener_tls)
                .filter_map(|(l, tls)| {
                    let counters = stats.catalog.certificate_reloads(&shard, &l.name);
                    tls.as_ref().map(|tls| (Arc::clone(tls), counters))
                })
                .unzip();
            Arc::new(TlsListeners::new(servers, counters))
        };
        let listener_tls = Arc::new(listener_tls);
        let shared_filters = Arc::new(
            config
                .listeners
                .iter()
                .map(SharedFilters::new)
                .collect::<Vec<_>>(),
        );
        let process_limit = config.max_connections.map(Limit::new);
        let limits = Arc::new(
            config
                .listeners
                .iter()
                .map(|l| ConnectionLimits {
                    process: process_limit.clone(),
                    listener: l.connection_limit.map(Limit::new),
                })
                .collect::<Vec<_>>(),
        );
        let admin_state = Arc::new(AdminState::new(
            Arc::clone(&config),
            workers,
            Arc::clone(&stats),
            Arc::clone(&clusters),
            Arc::clone(&tls_listeners),
        ));
        let admin = match config.admin {
            Some(address) => Some(
                AdminServer::start(address, Arc::clone(&admin_state))
                    .map_err(|source| StartError::Admin { address, source })?,
            ),
            None => None,
        };
        crate::memory::start_trimmer();
        crate::cluster::monitor::start(
            Arc::clone(&clusters),
            config.clusters.clone(),
            Arc::clone(&stats),
        )
        .map_err(|source| StartError::Monitor { source })?;

        let (balance, handoffs) = ExactBalance::new(workers);
        let mut handoffs = handoffs.into_iter();
        let (drain, drain_rx) = watch::channel(false);
        let mut handles = Vec::with_capacity(workers);
        for (id, sockets) in sockets.into_iter().enumerate() {
            let spec = WorkerSpec {
                id,
                config: Arc::clone(&config),
                sockets,
                drain: drain_rx.clone(),
                stats: Arc::clone(&stats),
                log_sinks: Arc::clone(&log_sinks),
                clusters: Arc::clone(&clusters),
                limits: Arc::clone(&limits),
                tls: Arc::clone(&listener_tls),
                filters: Arc::clone(&shared_filters),
                balance: Arc::clone(&balance),
                handoff: handoffs.next().expect("one hand-off queue per worker"),
            };
            match worker::spawn(spec) {
                Ok(handle) => handles.push(handle),
                Err(source) => {
                    let _ = drain.send(true);
                    return Err(StartError::SpawnWorker { worker: id, source });
                }
            }
        }
        Ok(Server {
            workers: handles,
            drain,
            addresses,
            admin,
            admin_state,
            tls_listeners,
        })
    }

    /// Reads every TLS listener's certificate, key and CA files again (what `SIGHUP` and
    /// `POST /reload_certs` do): new handshakes use them, open connections keep theirs. A
    /// listener whose files fail to load keeps its current certificates; the error is logged
    /// and returned.
    pub fn reload_certificates(&self) -> Vec<(String, Result<(), crate::tls::TlsError>)> {
        self.tls_listeners.reload_all()
    }

    /// `(listener name, bound address)` for every listener, with ephemeral ports resolved.
    pub fn addresses(&self) -> &[(String, SocketAddr)] {
        &self.addresses
    }

    /// The admin server's bound address, if it runs.
    pub fn admin_address(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.address)
    }

    /// The number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Stops accepting, lets in-flight requests finish (up to the drain timeout), and waits
    /// for every worker to exit. Blocks the calling thread.
    pub fn drain_and_join(self) {
        self.admin_state.draining.store(true, Ordering::Relaxed);
        let _ = self.drain.send(true);
        for handle in self.workers {
            if handle.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
        if let Some(admin) = self.admin {
            admin.stop();
        }
    }
}
