//! The main thread's side: binds every listener, starts the workers, and drains them.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{oneshot, watch};

use crate::admin::{AdminServer, AdminState};
use crate::catalog::ProxyStats;
use crate::live::binary_upgrade::Predecessor;
use crate::live::{BuildError, LiveConfig, ReloadError, ReloadReport, Sockets};
use crate::worker::{self, ExactBalance, WorkerSpec};
use config::Config;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("admin server: cannot listen on {address}: {source}")]
    Admin {
        address: SocketAddr,
        source: io::Error,
    },
    #[error("cannot start the cluster monitor thread: {source}")]
    Monitor { source: io::Error },
    #[error("cannot start the overload manager thread: {source}")]
    Overload { source: io::Error },
    #[error("cannot start the stats retirement thread: {source}")]
    StatsRetirement { source: io::Error },
    #[error("cannot start the xDS client thread: {source}")]
    Xds { source: io::Error },
    #[error("cannot start worker thread {worker}: {source}")]
    SpawnWorker { worker: usize, source: io::Error },
}

/// How a server starts besides its config.
#[derive(Default)]
pub struct StartOptions {
    /// The file the config came from: reloads read it again.
    config_file: Option<PathBuf>,
    /// Listening sockets handed over by the process this one upgrades.
    inherited: Sockets,
}

impl StartOptions {
    /// Reloads (`SIGHUP`, `POST /reload`, `watch: true`) read `path` again.
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_file = Some(path.into());
        self
    }

    /// Listeners on the addresses `predecessor` listens on take over its sockets instead of
    /// binding: connections keep being accepted throughout the upgrade.
    pub fn inherit_from(mut self, predecessor: &mut Predecessor) -> Self {
        self.inherited = predecessor.take_sockets();
        self
    }
}

/// A running proxy: its workers and the addresses they listen on.
pub struct Server {
    workers: Vec<JoinHandle<()>>,
    drain: watch::Sender<bool>,
    admin: Option<AdminServer>,
    admin_state: Arc<AdminState>,
    live: Arc<LiveConfig>,
    /// The stream to the management server, when the config names one.
    xds: Option<crate::live::xds::XdsClient>,
}

impl Server {
    /// Binds every listener (one socket per worker) and starts `workers` worker threads.
    /// Nothing is started if any address cannot be bound.
    pub fn start(config: Config, workers: usize) -> Result<Server, StartError> {
        Self::start_with(config, workers, StartOptions::default())
    }

    /// As [`start`](Self::start), with a config file to reload from and sockets to inherit.
    pub fn start_with(
        config: Config,
        workers: usize,
        options: StartOptions,
    ) -> Result<Server, StartError> {
        let workers = workers.max(1);
        let admin_address = config.admin.as_ref().map(|a| a.address);
        let stats = ProxyStats::new();
        stats.record_the_metrics_facade();
        let live = LiveConfig::start(
            config,
            options.config_file,
            workers,
            &stats,
            options.inherited,
        )?;
        let overload = Arc::new(crate::overload::Overload::default());
        let admin_state = Arc::new(AdminState::new(
            Arc::clone(&live),
            Arc::clone(&overload),
            workers,
            Arc::clone(&stats),
        ));
        let admin = match admin_address {
            Some(address) => Some(
                AdminServer::start(address, Arc::clone(&admin_state))
                    .map_err(|source| StartError::Admin { address, source })?,
            ),
            None => None,
        };
        crate::memory::start_trimmer();
        let weak_live = Arc::downgrade(&live);
        let (balance, handoffs) = ExactBalance::new(workers);
        let weak_balance = Arc::downgrade(&balance);
        crate::overload::start(
            Arc::downgrade(&overload),
            move || Some(weak_live.upgrade()?.current().config.overload),
            move || weak_balance.upgrade().map_or(0, |b| b.open_connections()),
            crate::overload::OverloadGauges::new(&stats.catalog, &stats.process),
        )
        .map_err(|source| StartError::Overload { source })?;
        let weak_live = Arc::downgrade(&live);
        crate::stats_retirement::start(Arc::downgrade(&stats), move || {
            Some(weak_live.upgrade()?.current().config.stats.retire_after)
        })
        .map_err(|source| StartError::StatsRetirement { source })?;
        crate::cluster::monitor::start(live.subscribe_clusters(), Arc::clone(&stats))
            .map_err(|source| StartError::Monitor { source })?;
        // Clusters of DNS names start with their first answers, not with no hosts.
        live.wait_for_dns();

        let (drain, drain_rx) = watch::channel(false);
        let mut handles = Vec::with_capacity(workers);
        for (id, handoff) in handoffs.into_iter().enumerate() {
            let spec = WorkerSpec {
                id,
                generations: live.subscribe(),
                drain: drain_rx.clone(),
                stats: Arc::clone(&stats),
                balance: Arc::clone(&balance),
                handoff,
                overload: Arc::clone(&overload),
                health: Arc::clone(&admin_state.health),
            };
            match worker::spawn(spec) {
                Ok(handle) => handles.push(handle),
                Err(source) => {
                    let _ = drain.send(true);
                    return Err(StartError::SpawnWorker { worker: id, source });
                }
            }
        }
        // Started once the workers run: each update waits for them to apply it.
        let xds = match crate::live::xds::start(&live) {
            Ok(xds) => xds,
            Err(source) => {
                let _ = drain.send(true);
                return Err(StartError::Xds { source });
            }
        };
        Ok(Server {
            workers: handles,
            drain,
            admin,
            admin_state,
            live,
            xds,
        })
    }

    /// Reads the config file again and puts it in force (what `SIGHUP` and `POST /reload`
    /// do). On an error nothing changes.
    pub async fn reload(&self) -> Result<ReloadReport, ReloadError> {
        self.live.reload().await
    }

    /// Opens every access log file again by its path (`SIGUSR1`, `POST /reopen_logs`), after
    /// logrotate moved it: each path with what happened. A file that cannot be opened keeps
    /// being written where it was.
    pub fn reopen_logs(&self) -> Vec<(std::path::PathBuf, std::io::Result<()>)> {
        crate::access_log::reopen_and_report()
    }

    /// Reads every TLS listener's certificate, key and CA files again (`POST /reload_certs`):
    /// new handshakes use them, open connections keep theirs. A listener whose files fail to
    /// load keeps its current certificates; the error is logged and returned.
    pub fn reload_certificates(&self) -> Vec<(String, Result<(), crate::tls::TlsError>)> {
        self.live.current().tls.reload_all()
    }

    /// Answers a new binary of the proxy on the Unix socket `path`: it gets this process's
    /// listening sockets. The receiver fires when the new process serves and asked this one
    /// to drain (see [`Predecessor`]).
    pub fn listen_for_upgrades(&self, path: &Path) -> io::Result<oneshot::Receiver<()>> {
        crate::live::binary_upgrade::serve(path, Arc::downgrade(&self.live))
    }

    /// `(listener name, bound address)` for every listener of the config in force, with
    /// ephemeral ports resolved.
    pub fn addresses(&self) -> Vec<(String, SocketAddr)> {
        let generation = self.live.current();
        generation
            .config
            .listeners
            .iter()
            .zip(&generation.listeners)
            .map(|(l, shared)| (l.name.clone(), shared.sockets.address))
            .collect()
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
        self.admin_state.health.start_draining();
        // No config changes while draining.
        drop(self.xds);
        // The listening sockets close once the accept loops end: new connections are refused
        // (or, after an upgrade, taken by the new process, which has its own copies), not
        // queued for a process that will not accept them.
        for listener in &self.live.current().listeners {
            listener.sockets.release();
        }
        let _ = self.drain.send(true);
        for handle in self.workers {
            if handle.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
        // The workers handed over their last spans as they ended.
        if let Some(tracer) = &self.live.current().tracer {
            tracer.drain();
        }
        if let Some(admin) = self.admin {
            admin.stop();
        }
    }
}
