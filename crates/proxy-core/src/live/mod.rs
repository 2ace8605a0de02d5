//! Live configuration: the config in force as a [`Generation`], replaced while serving.
//!
//! A reload (`SIGHUP`, `POST /reload`, a watched file) reads and validates the file, builds
//! the next generation beside the current one (binding new listeners, loading TLS files),
//! and only then publishes it; on any error nothing changes. Each worker picks the new
//! generation up between two events of its loop and swaps its listeners' routes, filters and
//! clusters: requests in flight finish with what they started with, the next request on a
//! kept-alive connection uses the new routes. What did not change is shared, not rebuilt:
//! a cluster whose config is the same (endpoints aside) keeps its pools, health, ejections,
//! breakers and requests in flight; a listener on the same address keeps its sockets.
//!
//! ```text
//! mod.rs         LiveConfig: reload, publish, wait for the workers, report
//! generation.rs  one generation and how far the workers are with it
//! build.rs       the next generation from a config and the current one
//! sockets.rs     listening sockets: bound, or inherited in a binary upgrade
//! watch.rs       `watch: true`: reload when the file changes
//! xds.rs         resources from a management server, put in force beside the file's
//! binary_upgrade.rs  binary upgrade: hand the listening sockets to a new process
//! ```

pub(crate) mod binary_upgrade;
mod build;
mod generation;
mod sockets;
mod watch;
pub(crate) mod xds;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::watch as channel;

use crate::catalog::ProxyStats;
use crate::cluster::monitor::ClusterList;
#[cfg(feature = "fuzzing")]
pub(crate) use build::build_without_sockets;
use config::xds::Resources;
use config::{ClusterConfig, RawListener};
use config::{Config, ConfigError};
pub(crate) use generation::{Generation, SharedListener};
use serde::Serialize;
pub(crate) use sockets::{Inherited, Sockets};

/// How long a reload waits for every worker to apply it before answering.
const APPLY_LIMIT: Duration = Duration::from_secs(10);
/// How long a new config waits for the first DNS answer of each name among its endpoints
/// before it is put in force anyway (such hosts join when their answer comes).
const DNS_WAIT_LIMIT: Duration = Duration::from_secs(5);

/// Why a config could not be put in force (at start or in a reload).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("listener `{listener}`: cannot listen on {address}: {source}")]
    Bind {
        listener: String,
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("{scope}: TLS: {source}")]
    Tls {
        scope: String,
        source: Box<crate::tls::TlsError>,
    },
    #[error("access log: {source}")]
    AccessLog { source: std::io::Error },
    #[error("tracing: cannot start the span exporter: {source}")]
    Tracing { source: std::io::Error },
    #[error("cluster `{cluster}`: {source}")]
    Dns {
        cluster: String,
        source: crate::cluster::DnsError,
    },
    #[error("{key}: cannot change while running; restart, or upgrade the binary, to change it")]
    Fixed { key: &'static str },
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("this proxy was not started from a config file, so there is nothing to reload")]
    NoFile,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("the reload was interrupted: the process is stopping")]
    Interrupted,
}

/// What a successful reload did.
#[derive(Debug, Clone)]
pub struct ReloadReport {
    pub generation: u64,
    pub version: generation::ConfigVersion,
    pub workers: usize,
    /// Workers that applied it within the time a reload waits.
    pub applied: usize,
    /// From the new config accepted to the last worker applying it, when all did.
    pub propagation: Option<Duration>,
}

impl std::fmt::Display for ReloadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "generation {} (version {}) applied by {} of {} workers",
            self.generation, self.version, self.applied, self.workers
        )?;
        if let Some(p) = self.propagation {
            write!(f, " in {} us", p.as_micros())?;
        }
        Ok(())
    }
}

/// The outcome of the last reload attempt, for `/config_dump`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReloadStatus {
    pub(crate) last_attempt: Option<SystemTime>,
    /// The error of the last attempt, if it failed.
    pub(crate) last_error: Option<String>,
    pub(crate) successes: u64,
    pub(crate) failures: u64,
}

/// The config in force, and the way to replace it.
pub(crate) struct LiveConfig {
    source: Option<PathBuf>,
    workers: usize,
    stats: Arc<ProxyStats>,
    generations: channel::Sender<Arc<Generation>>,
    clusters: channel::Sender<ClusterList>,
    /// Held for a whole reload, so reloads run one at a time.
    reloads: tokio::sync::Mutex<Reloads>,
    status: Mutex<ReloadStatus>,
    /// The resources from the management server whose listeners and clusters are in force
    /// beside the file's: a reload of the file makes their sections again (the same
    /// resources make the same sections), so they are not kept twice.
    dynamic: Mutex<Arc<Resources>>,
    /// What the management server has sent, for `/config_dump`.
    xds: Mutex<Option<XdsStatus>>,
}

/// Resources from the management server and the sections made from them, as the file
/// would write them.
pub(crate) struct DynamicSections {
    pub(crate) resources: Arc<Resources>,
    pub(crate) listeners: Vec<RawListener>,
    /// Checked already: shared with the config in force while they stay the same.
    pub(crate) clusters: Vec<Arc<ClusterConfig>>,
}

/// The xDS client's state, for `/config_dump`.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct XdsStatus {
    pub(crate) connected: bool,
    /// Every resource held: listed (type, name, version and when it arrived) only when the
    /// status is shown, not on each of a fleet's changes.
    pub(crate) resources: HeldResources,
    /// Clusters waiting for their endpoints or secrets, listeners for their routes or secrets.
    pub(crate) warming_clusters: Vec<String>,
    pub(crate) warming_listeners: Vec<String>,
    /// The reason of the last NACK, and of which type.
    pub(crate) last_rejected: Option<String>,
}

/// The resources held, shown as a list of [`XdsResourceStatus`].
#[derive(Debug, Clone, Default)]
pub(crate) struct HeldResources(pub(crate) Arc<Resources>);

#[derive(Debug, Clone, Serialize)]
pub(crate) struct XdsResourceStatus<'a> {
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) name: &'a str,
    pub(crate) version: &'a str,
    pub(crate) last_updated_unix: u64,
}

impl Serialize for HeldResources {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        fn list<'a, T>(
            kind: &'static str,
            map: &'a config::xds::SharedMap<String, config::xds::Held<T>>,
        ) -> impl Iterator<Item = XdsResourceStatus<'a>> {
            map.iter().map(move |(name, held)| XdsResourceStatus {
                kind,
                name,
                version: &held.version,
                last_updated_unix: (held.updated.duration_since(SystemTime::UNIX_EPOCH))
                    .map_or(0, |d| d.as_secs()),
            })
        }
        let r = &*self.0;
        serializer.collect_seq(
            list("listener", &r.listeners)
                .chain(list("route_configuration", &r.routes))
                .chain(list("cluster", &r.clusters))
                .chain(list("cluster_load_assignment", &r.endpoints))
                .chain(list("secret", &r.secrets)),
        )
    }
}

struct Reloads {
    next_listener_id: u64,
    success: stats::Counter,
    failure: stats::Counter,
    propagation: stats::Histogram,
    generation: stats::Gauge,
}

impl LiveConfig {
    /// Builds the first generation. `source` is the file reloads read again.
    pub(crate) fn start(
        config: Config,
        source: Option<PathBuf>,
        workers: usize,
        stats: &Arc<ProxyStats>,
        mut sockets: Sockets,
    ) -> Result<Arc<LiveConfig>, BuildError> {
        let mut next_listener_id = 0;
        let (generation, commit) = build::build(
            config,
            None,
            build::BuildCtx {
                workers,
                stats,
                number: 1,
                next_listener_id: &mut next_listener_id,
                sockets: &mut sockets,
            },
        )?;
        sockets.close_unused();
        commit.run(&generation);
        let shard = &stats.process;
        let catalog = &stats.catalog;
        let reloads = Reloads {
            next_listener_id,
            success: shard.counter(catalog.config_reload, &["success"]),
            failure: shard.counter(catalog.config_reload, &["failure"]),
            propagation: shard.histogram(catalog.config_propagation, &[]),
            generation: shard.gauge(catalog.config_generation, &[]),
        };
        reloads.generation.set(1);
        let clusters = channel::Sender::new(Arc::clone(&generation.clusters));
        let live = Arc::new(LiveConfig {
            source,
            workers,
            stats: Arc::clone(stats),
            generations: channel::Sender::new(Arc::new(generation)),
            clusters,
            reloads: tokio::sync::Mutex::new(reloads),
            status: Mutex::new(ReloadStatus::default()),
            dynamic: Mutex::new(Arc::default()),
            xds: Mutex::new(None),
        });
        if let Err(error) = watch::start(&live) {
            tracing::warn!(%error, "cannot start the config file watcher; `watch: true` has no effect");
        }
        Ok(live)
    }

    /// Blocks until every name among the endpoints in force has had its first lookup, for
    /// at most [`DNS_WAIT_LIMIT`] (the monitor thread resolves them).
    pub(crate) fn wait_for_dns(&self) {
        let clusters = Arc::clone(&self.clusters.borrow());
        wait_for_dns(&clusters);
    }

    /// The generation in force.
    pub(crate) fn current(&self) -> Arc<Generation> {
        Arc::clone(&self.generations.borrow())
    }

    /// Every new generation, for a worker.
    pub(crate) fn subscribe(&self) -> channel::Receiver<Arc<Generation>> {
        self.generations.subscribe()
    }

    /// Every new cluster list, for the monitor thread.
    pub(crate) fn subscribe_clusters(&self) -> channel::Receiver<ClusterList> {
        self.clusters.subscribe()
    }

    pub(crate) fn source(&self) -> Option<&std::path::Path> {
        self.source.as_deref()
    }

    pub(crate) fn status(&self) -> ReloadStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the config file again and puts it in force. The reload runs to its end even if
    /// the caller stops waiting (an admin client that hangs up): once shared state starts
    /// changing, the new generation must be published.
    pub(crate) async fn reload(self: &Arc<Self>) -> Result<ReloadReport, ReloadError> {
        let live = Arc::clone(self);
        match tokio::spawn(async move { live.reload_now().await }).await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => Err(ReloadError::Interrupted),
        }
    }

    async fn reload_now(&self) -> Result<ReloadReport, ReloadError> {
        let asked = std::time::Instant::now();
        let mut reloads = self.reloads.lock().await;
        let loaded = match &self.source {
            Some(path) => Config::load(path)
                .and_then(|config| {
                    let dynamic = self.dynamic();
                    let sections = Resources::clone(&dynamic).sections()?;
                    config::xds::compose(config.origin(), sections.listeners, sections.clusters)
                })
                .map_err(ReloadError::from),
            None => Err(ReloadError::NoFile),
        };
        let result = match loaded {
            Ok(config) => self.put_in_force(&mut reloads, config, asked).await,
            Err(error) => Err(error),
        };
        self.record(&reloads, &result);
        result
    }

    fn dynamic(&self) -> Arc<Resources> {
        Arc::clone(&self.dynamic.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Puts the file's config in force with `dynamic` (from the management server) beside
    /// it, replacing what came from there before. On an error nothing changes.
    /// `arrived`: when the update came, the start of the propagation recorded.
    pub(crate) async fn put_dynamic(
        &self,
        dynamic: DynamicSections,
        arrived: std::time::Instant,
    ) -> Result<ReloadReport, ReloadError> {
        let mut reloads = self.reloads.lock().await;
        let origin = Arc::clone(self.current().config.origin());
        let config = config::xds::compose(&origin, dynamic.listeners, dynamic.clusters)?;
        let report = self.put_in_force(&mut reloads, config, arrived).await?;
        *self.dynamic.lock().unwrap_or_else(PoisonError::into_inner) = dynamic.resources;
        Ok(report)
    }

    pub(crate) fn set_xds_status(&self, status: XdsStatus) {
        *self.xds.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
    }

    /// Whether the stream to the management server is up, in the status published.
    pub(crate) fn set_xds_connected(&self, up: bool) {
        let mut status = self.xds.lock().unwrap_or_else(PoisonError::into_inner);
        status.get_or_insert_with(XdsStatus::default).connected = up;
    }

    pub(crate) fn xds_status(&self) -> Option<XdsStatus> {
        self.xds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn stats(&self) -> &Arc<ProxyStats> {
        &self.stats
    }

    /// `arrived`: when the change came (a reload asked for, an xDS response received); the
    /// propagation recorded runs from it to the last worker serving with the new config.
    async fn put_in_force(
        &self,
        reloads: &mut Reloads,
        config: Config,
        arrived: std::time::Instant,
    ) -> Result<ReloadReport, ReloadError> {
        let previous = self.current();
        let mut sockets = Sockets::default();
        let (generation, commit) = build::build(
            config,
            Some(&previous),
            build::BuildCtx {
                workers: self.workers,
                stats: &self.stats,
                number: previous.number + 1,
                next_listener_id: &mut reloads.next_listener_id,
                sockets: &mut sockets,
            },
        )?;
        drop(previous);
        commit.run(&generation);
        // The monitor starts resolving new names; routes to their clusters wait for answers.
        // A list kept whole is not sent again: nothing in it changed.
        self.clusters.send_if_modified(|list| {
            let changed = !Arc::ptr_eq(list, &generation.clusters);
            if changed {
                *list = Arc::clone(&generation.clusters);
            }
            changed
        });
        if generation.clusters.iter().any(|c| c.dns.is_some()) {
            let clusters = Arc::clone(&generation.clusters);
            let _ = tokio::task::spawn_blocking(move || wait_for_dns(&clusters)).await;
        }
        let mut generation = generation;
        generation.accepted_at(arrived);
        let generation = Arc::new(generation);
        self.generations.send_replace(Arc::clone(&generation));
        reloads.generation.set(generation.number as i64);
        let (applied, propagation) = generation.all_applied(APPLY_LIMIT).await;
        if let Some(p) = propagation {
            reloads.propagation.record_duration(p);
        }
        let report = ReloadReport {
            generation: generation.number,
            version: generation.version(),
            workers: self.workers,
            applied,
            propagation,
        };
        if applied < self.workers {
            tracing::warn!(%report, "a worker has not applied the new config yet");
        }
        Ok(report)
    }

    fn record(&self, reloads: &Reloads, result: &Result<ReloadReport, ReloadError>) {
        let mut status = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        status.last_attempt = Some(SystemTime::now());
        match result {
            Ok(report) => {
                reloads.success.inc();
                status.successes += 1;
                status.last_error = None;
                tracing::info!(%report, "config reloaded");
            }
            Err(error) => {
                reloads.failure.inc();
                status.failures += 1;
                status.last_error = Some(error.to_string());
                tracing::error!(%error, "config reload failed; the config in force stays");
            }
        }
    }
}

fn wait_for_dns(clusters: &ClusterList) {
    let deadline = std::time::Instant::now() + DNS_WAIT_LIMIT;
    for cluster in clusters.iter().filter(|c| c.dns.is_some()) {
        if !cluster.wait_for_answers(deadline) {
            tracing::warn!(
                cluster = %cluster.name,
                "no DNS answer yet for some endpoint names; their hosts join when it comes"
            );
        }
    }
}
