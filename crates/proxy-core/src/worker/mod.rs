//! A worker: one OS thread running a single-threaded tokio runtime. It accepts on its own
//! sockets and owns everything its connections touch (routes, filters, upstream pools), so
//! the request path takes no locks and never wakes another thread.
//!
//! A worker follows the config's generations: each new one is applied between two events
//! of its loop (see [`apply`]), so a swap never races a request on this thread.
//!
//! ```text
//! mod.rs       the thread: apply generations, run until the drain, wait for connections
//! listener.rs  one listener on this worker across generations: its state, routes, drain
//! accept.rs    accept loops, connection limits, hand-offs, the connection's task
//! parking.rs   idle HTTP/1.1 connections held as their sockets alone, without a task
//! quic.rs      a listener's HTTP/3: its QUIC endpoint on this worker's UDP socket
//! balance.rs   `connection_balance: exact` across workers
//! tracker.rs   open connections, for the drain
//! ```

mod accept;
mod balance;
mod listener;
mod parking;
mod quic;
mod tracker;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::access_log;
use crate::catalog::ProxyStats;
use crate::cluster::{Cluster, SharedCluster};
use crate::context::WorkerCtx;
use crate::live::{Generation, SharedListener};
use crate::trace::WorkerTracer;
use accept::{Accepted, accept_loop};
pub(crate) use balance::ExactBalance;
use balance::Handoff;
use listener::{Listener, Parts};
use quic::QuicServing;
use tracker::ConnTracker;

/// What a worker thread is started with.
pub(crate) struct WorkerSpec {
    pub(crate) id: usize,
    /// The config in force, and every one after it.
    pub(crate) generations: watch::Receiver<Arc<Generation>>,
    pub(crate) drain: watch::Receiver<bool>,
    pub(crate) stats: Arc<ProxyStats>,
    /// Open connections per worker, for `exact` balancing; and this worker's hand-off queue.
    pub(crate) balance: Arc<ExactBalance>,
    pub(crate) handoff: tokio::sync::mpsc::UnboundedReceiver<Handoff>,
    pub(crate) overload: Arc<crate::overload::Overload>,
    pub(crate) health: Arc<crate::context::ServerHealth>,
}

pub(crate) fn spawn(spec: WorkerSpec) -> io::Result<JoinHandle<()>> {
    let runtime = crate::runtime::current_thread_runtime()?;
    std::thread::Builder::new()
        .name(format!("legate-worker-{}", spec.id))
        .spawn(move || {
            let local = tokio::task::LocalSet::new();
            crate::sleep_pool::spares_while(|| local.block_on(&runtime, run(spec)));
        })
}

/// The worker's side of the config in force.
struct Worker {
    id: usize,
    stats: Arc<ProxyStats>,
    shard: stats::Shard,
    accepted: Rc<Accepted>,
    /// In the generation's order.
    clusters: Rc<[Rc<Cluster>]>,
    /// The generation's list they were made for: a generation that kept the list whole
    /// keeps them, without a look at each.
    clusters_for: Option<Arc<Vec<Arc<SharedCluster>>>>,
    /// In the generation's order; shared with the hand-off and flush tasks.
    listeners: Rc<RefCell<Vec<Rc<Listener>>>>,
    /// Accept loops, by listener id.
    accept_loops: HashMap<u64, tokio::task::JoinHandle<()>>,
    /// HTTP/3 endpoints, by listener id.
    quic: HashMap<u64, QuicServing>,
    drain_timeout: std::time::Duration,
    /// Shared with the housekeeping task, which hands their spans to the exporter.
    tracers: Rc<RefCell<Tracers>>,
}

/// The worker's tracers: the generation's, and those of earlier generations that requests
/// still hold (a long stream, a tunnel), whose spans must not wait for the last of them.
#[derive(Default)]
struct Tracers {
    current: Option<Rc<WorkerTracer>>,
    retired: Vec<Rc<WorkerTracer>>,
}

impl Tracers {
    /// `tracer` serves from now on; the one before keeps being flushed while held.
    fn replace(&mut self, tracer: Option<Rc<WorkerTracer>>) {
        let old = std::mem::replace(&mut self.current, tracer);
        if let Some(old) = old
            && !self.current.as_ref().is_some_and(|t| Rc::ptr_eq(t, &old))
        {
            old.flush();
            self.retired.push(old);
        }
    }

    /// Hands every tracer's batch to the exporter; a retired one no request holds goes.
    fn flush(&mut self) {
        for tracer in self.current.iter().chain(&self.retired) {
            tracer.flush();
        }
        self.retired.retain(|t| Rc::strong_count(t) > 1);
    }
}

impl Worker {
    /// Serves with `generation` from now on: clusters the generation kept keep this worker's
    /// pools; kept listeners take the new routes and settings; new listeners start accepting
    /// on their socket; removed ones drain.
    async fn apply(&mut self, generation: &Generation) {
        self.follow_clusters(generation);
        let catalog = &self.stats.catalog;
        let config = &generation.config;
        let tracer = match &generation.tracer {
            None => None,
            Some(shared) => match &self.tracers.borrow().current {
                Some(kept) if kept.serves(shared) => Some(Rc::clone(kept)),
                _ => Some(Rc::new(WorkerTracer::new(
                    Arc::clone(shared),
                    &self.stats,
                    &self.shard,
                ))),
            },
        };
        self.tracers.borrow_mut().replace(tracer.clone());
        let replaced = RefCell::new(Vec::new());
        let parts = Parts {
            catalog,
            shard: &self.shard,
            log_sinks: &generation.log_sinks,
            clusters: &self.clusters,
            park_idle: self.accepted.lot.is_some(),
            tracer: tracer.as_ref(),
            drain_timeout: config.drain_timeout,
            replaced: &replaced,
        };
        let current = self.listeners.borrow().clone();
        let mut next = Vec::with_capacity(generation.listeners.len());
        for (config, shared) in config.listeners.iter().zip(&generation.listeners) {
            if let Some(kept) = current.iter().find(|l| l.id == shared.id) {
                kept.update(config, shared, &parts);
                next.push(Rc::clone(kept));
                continue;
            }
            if !config.serves_tcp() {
                // QUIC alone: served by `serve_quic` below, no accept loop.
                next.push(Rc::new(Listener::new(config, shared, &parts)));
                continue;
            }
            let Some(socket) = shared.sockets.take(self.id) else {
                tracing::error!(worker = self.id, listener = %config.name, "no socket for this worker");
                continue;
            };
            let socket = match TcpListener::from_std(socket) {
                Ok(s) => s,
                Err(err) => {
                    tracing::error!(worker = self.id, listener = %config.name, error = %err, "cannot register listener socket");
                    continue;
                }
            };
            let listener = Rc::new(Listener::new(config, shared, &parts));
            let task = tokio::task::spawn_local(accept_loop(
                socket,
                Rc::clone(&listener),
                Rc::clone(&self.accepted),
            ));
            self.accept_loops.insert(listener.id, task);
            next.push(listener);
        }
        self.drain_timeout = config.drain_timeout;
        self.serve_quic(&generation.listeners, &next);
        *self.listeners.borrow_mut() = next.clone();
        for removed in current.iter().filter(|l| next.iter().all(|n| n.id != l.id)) {
            tracing::info!(worker = self.id, listener = %removed.state().ctx.name, "listener removed: draining its connections");
            removed.remove(self.drain_timeout);
            // The accept loop ends on the drain and closes the socket: done before this
            // worker reports the generation applied, so a removed address refuses at once.
            if let Some(task) = self.accept_loops.remove(&removed.id) {
                let _ = task.await;
            }
        }
        self.accepted
            .worker
            .stats
            .config_generation
            .set(generation.number as i64);
        generation.applied_by_worker();
        // The contexts replaced go now that the change is reported. Where this worker held
        // one last, its route table (often the old one's last holder) is freed by the
        // retiring thread, not between this worker's requests.
        for ctx in replaced.into_inner() {
            if let Ok(ctx) = Rc::try_unwrap(ctx) {
                crate::retire::retire(ctx.routes);
            }
        }
    }
}

impl Worker {
    /// This worker's clusters for `generation`: kept ones keep their pools, new ones start,
    /// and a list the generation kept whole is kept as it is.
    fn follow_clusters(&mut self, generation: &Generation) {
        let catalog = &self.stats.catalog;
        let config = &generation.config;
        // The local cluster, which clusters route by zone from.
        let local = config.local_cluster.as_ref().and_then(|local| {
            let i = config.clusters.iter().position(|c| c.name == local.name)?;
            Some((generation.clusters.get(i)?, local.locality.as_str()))
        });
        if (self.clusters_for.as_ref()).is_some_and(|l| Arc::ptr_eq(l, &generation.clusters)) {
            // The same clusters: only the file's choice of the local one may have changed.
            for kept in self.clusters.iter() {
                if !kept.has_local(local) {
                    kept.set_local(local);
                }
            }
            return;
        }
        let mut old: HashMap<*const SharedCluster, Rc<Cluster>> = self
            .clusters
            .iter()
            .map(|c| (Arc::as_ptr(c.shared()), Rc::clone(c)))
            .collect();
        // A changed cluster's stats continue where its previous version's left off, even
        // before its first request here: otherwise they would be retired as removed.
        let mut by_name: HashMap<&str, Rc<Cluster>> = self
            .clusters
            .iter()
            .map(|c| (c.shared().name.as_str(), Rc::clone(c)))
            .collect();
        self.clusters = config
            .clusters
            .iter()
            .zip(generation.clusters.iter())
            .map(|(c, shared)| match old.remove(&Arc::as_ptr(shared)) {
                Some(kept) => {
                    if !kept.has_local(local) {
                        kept.set_local(local);
                    }
                    kept.sync_pools();
                    kept
                }
                None => {
                    let cluster = Cluster::new(c, shared, local, catalog, &self.shard);
                    if let Some(previous) = by_name.remove(c.name.as_str()) {
                        cluster.continue_stats(&previous);
                    }
                    Rc::new(cluster)
                }
            })
            .collect();
        self.clusters_for = Some(Arc::clone(&generation.clusters));
    }

    /// Starts, keeps or stops each listener's HTTP/3 as the generation says: kept while its
    /// UDP sockets are the same.
    fn serve_quic(&mut self, shared: &[SharedListener], listeners: &[Rc<Listener>]) {
        let mut before = std::mem::take(&mut self.quic);
        for listener in listeners {
            let wanted =
                (shared.iter().find(|s| s.id == listener.id)).and_then(|s| s.quic.as_ref());
            match (before.remove(&listener.id), wanted) {
                (Some(serving), Some(sockets)) if Arc::ptr_eq(&serving.sockets, sockets) => {
                    self.quic.insert(listener.id, serving);
                }
                (old, wanted) => {
                    if let Some(old) = old {
                        old.stop(self.drain_timeout);
                    }
                    if let Some(sockets) = wanted
                        && let Some(serving) =
                            QuicServing::start(sockets, self.id, listener, &self.accepted)
                    {
                        self.quic.insert(listener.id, serving);
                    }
                }
            }
        }
        // Removed listeners: their drain has stopped their HTTP/3 already.
        for (_, serving) in before {
            serving.stop(self.drain_timeout);
        }
    }
}

async fn run(spec: WorkerSpec) {
    let WorkerSpec {
        id,
        mut generations,
        drain,
        stats,
        balance,
        mut handoff,
        overload,
        health,
    } = spec;
    let shard = stats.registry.shard(&[("worker", &id.to_string())]);
    let worker_ctx = Rc::new(WorkerCtx {
        stats: stats.catalog.worker(&shard),
        draining: Cell::new(false),
        overload,
        health,
    });
    let tracker = Rc::new(ConnTracker::default());
    let lot = match parking::ParkingLot::new() {
        Ok((lot, task)) => Some((lot, tokio::task::spawn_local(task))),
        Err(err) => {
            // Idle connections then keep their task, as they did before the lot.
            tracing::warn!(worker = id, error = %err, "no parking lot for idle connections");
            None
        }
    };
    let mut worker = Worker {
        id,
        stats: Arc::clone(&stats),
        shard,
        accepted: Rc::new(Accepted {
            worker_id: id,
            worker: Rc::clone(&worker_ctx),
            tracker: Rc::clone(&tracker),
            balance,
            lot: lot.as_ref().map(|(lot, _)| Rc::clone(lot)),
        }),
        clusters: Rc::new([]),
        clusters_for: None,
        listeners: Rc::default(),
        accept_loops: HashMap::new(),
        quic: HashMap::new(),
        drain_timeout: config::DEFAULT_DRAIN_TIMEOUT,
        tracers: Rc::default(),
    };
    let first = Arc::clone(&generations.borrow_and_update());
    worker.apply(&first).await;
    drop(first);

    // Connections other workers accepted for this one (`exact` balancing).
    let receiver = {
        let listeners = Rc::clone(&worker.listeners);
        let to = Rc::clone(&worker.accepted);
        tokio::task::spawn_local(async move {
            while let Some(h) = handoff.recv().await {
                let listener = listeners
                    .borrow()
                    .iter()
                    .find(|l| l.id == h.listener)
                    .cloned();
                match (listener, TcpStream::from_std(h.stream)) {
                    (Some(listener), Ok(stream)) => to.serve(stream, h.peer, &listener, h.permit),
                    _ => to.balance.closed(to.worker_id),
                }
            }
        })
    };
    // Buffered access log lines reach their writer at least this often; hosts removed from
    // a cluster (a reload, DNS) leave this worker's pools at least this often too, and
    // buffers, futures' blocks and header maps unused for a second are freed.
    let housekeeping = {
        let listeners = Rc::clone(&worker.listeners);
        let clusters = Rc::new(RefCell::new(Rc::clone(&worker.clusters)));
        let kept = Rc::clone(&clusters);
        let tracers = Rc::clone(&worker.tracers);
        let task = tokio::task::spawn_local(async move {
            let mut tick = tokio::time::interval(access_log::FLUSH_EVERY);
            let mut released = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                flush_logs(&listeners.borrow());
                tracers.borrow_mut().flush();
                for cluster in kept.borrow().iter() {
                    cluster.sync_pools();
                }
                if released.elapsed() >= crate::buffer_pool::RELEASE_EVERY {
                    crate::buffer_pool::release_unused();
                    crate::box_pool::release_unused();
                    h1::release_unused_header_maps();
                    released = tokio::time::Instant::now();
                }
            }
        });
        (task, clusters)
    };

    let mut drain_rx = drain.clone();
    loop {
        tokio::select! {
            _ = drain_rx.wait_for(|draining| *draining) => break,
            changed = generations.changed() => {
                if changed.is_err() {
                    break; // the server is gone
                }
                let generation = Arc::clone(&generations.borrow_and_update());
                worker.apply(&generation).await;
                *housekeeping.1.borrow_mut() = Rc::clone(&worker.clusters);
            }
        }
    }
    worker_ctx.draining.set(true);
    let listeners = worker.listeners.borrow().clone();
    for listener in &listeners {
        listener.start_drain();
    }
    // Accept loops end on the drain and close their sockets.
    for (_, task) in worker.accept_loops.drain() {
        let _ = task.await;
    }
    receiver.abort();
    // Parked connections are idle: closed now, not after the drain time.
    if let Some((lot, task)) = lot {
        lot.close_all();
        task.abort();
    }
    tracker.wait_for_all_closed(worker.drain_timeout).await;
    housekeeping.0.abort();
    flush_logs(&listeners);
    worker.tracers.borrow_mut().flush();
    tracing::debug!(worker = id, "worker stopped");
}

fn flush_logs(listeners: &[Rc<Listener>]) {
    for listener in listeners {
        listener.flush_logs();
    }
}
