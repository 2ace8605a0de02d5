//! A worker: one OS thread running a single-threaded tokio runtime. It accepts on its own
//! sockets and owns everything its connections touch (routes, filters, upstream pools), so
//! the request path takes no locks and never wakes another thread.
//!
//! ```text
//! mod.rs       the thread: build the listeners, run until the drain, wait for connections
//! listener.rs  one listener on this worker: its contexts, built from config
//! accept.rs    accept loops, connection limits, hand-offs, the connection's task
//! balance.rs   `connection_balance: exact` across workers
//! tracker.rs   open connections, for the drain
//! ```

mod accept;
mod balance;
mod listener;
mod tracker;

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::access_log::{self, LogSinks};
use crate::catalog::ProxyStats;
use crate::cluster::{Cluster, SharedCluster};
use crate::config::Config;
use crate::context::WorkerCtx;
use crate::filters::SharedFilters;
use crate::listener::ConnectionLimits;
use crate::tls::ServerTls;
use accept::{Accepted, accept_loop};
pub(crate) use balance::ExactBalance;
use balance::Handoff;
use listener::{Listener, Parts};
use tracker::ConnTracker;

/// What a worker thread is started with.
pub(crate) struct WorkerSpec {
    pub(crate) id: usize,
    pub(crate) config: Arc<Config>,
    /// One bound socket per listener, in config order.
    pub(crate) sockets: Vec<std::net::TcpListener>,
    pub(crate) drain: watch::Receiver<bool>,
    pub(crate) stats: Arc<ProxyStats>,
    pub(crate) log_sinks: Arc<LogSinks>,
    /// Per cluster, in config order: hosts and breakers every worker shares.
    pub(crate) clusters: Arc<Vec<Arc<SharedCluster>>>,
    /// Per listener, in config order: the connection limits all workers share.
    pub(crate) limits: Arc<Vec<ConnectionLimits>>,
    /// Per listener, in config order: its TLS, if it terminates TLS.
    pub(crate) tls: Arc<Vec<Option<Arc<ServerTls>>>>,
    /// Per listener, in config order: filter state all workers share (rate limit buckets).
    pub(crate) filters: Arc<Vec<SharedFilters>>,
    /// Open connections per worker, for `exact` balancing; and this worker's hand-off queue.
    pub(crate) balance: Arc<ExactBalance>,
    pub(crate) handoff: tokio::sync::mpsc::UnboundedReceiver<Handoff>,
}

pub(crate) fn spawn(spec: WorkerSpec) -> io::Result<JoinHandle<()>> {
    let runtime = crate::runtime::current_thread_runtime()?;
    std::thread::Builder::new()
        .name(format!("legate-worker-{}", spec.id))
        .spawn(move || {
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, run(spec));
        })
}

async fn run(spec: WorkerSpec) {
    let WorkerSpec {
        id,
        config,
        sockets,
        drain,
        stats,
        log_sinks,
        clusters,
        limits,
        tls,
        filters,
        balance,
        mut handoff,
    } = spec;
    let shard = stats.registry.shard(&[("worker", &id.to_string())]);
    let catalog = &stats.catalog;
    let worker = Rc::new(WorkerCtx {
        stats: catalog.worker(&shard),
        draining: Cell::new(false),
    });
    let worker_clusters: Rc<[Cluster]> = config
        .clusters
        .iter()
        .zip(clusters.iter())
        .map(|(c, shared)| Cluster::new(c, shared, catalog, &shard))
        .collect();
    let parts = Parts {
        catalog,
        shard: &shard,
        log_sinks: &log_sinks,
        clusters: &worker_clusters,
    };
    let tracker = Rc::new(ConnTracker::default());

    let mut accept_loops = Vec::new();
    let mut listeners: Vec<Rc<Listener>> = Vec::new();
    for ((((listener, socket), limits), tls), filters) in config
        .listeners
        .iter()
        .zip(sockets)
        .zip(limits.iter())
        .zip(tls.iter())
        .zip(filters.iter())
    {
        let socket = match TcpListener::from_std(socket) {
            Ok(s) => s,
            Err(err) => {
                tracing::error!(worker = id, listener = %listener.name, error = %err, "cannot register listener socket");
                continue;
            }
        };
        let ctx = Rc::new(Listener::new(
            listeners.len(),
            listener,
            limits,
            tls.as_ref(),
            filters,
            &parts,
        ));
        listeners.push(Rc::clone(&ctx));
        accept_loops.push(tokio::task::spawn_local(accept_loop(
            socket,
            ctx,
            Accepted {
                worker_id: id,
                worker: Rc::clone(&worker),
                tracker: Rc::clone(&tracker),
                balance: Arc::clone(&balance),
                drain: drain.clone(),
            },
        )));
    }
    // Connections other workers accepted for this one (`exact` balancing).
    let receiver = {
        let listeners = listeners.clone();
        let to = Accepted {
            worker_id: id,
            worker: Rc::clone(&worker),
            tracker: Rc::clone(&tracker),
            balance: Arc::clone(&balance),
            drain: drain.clone(),
        };
        tokio::task::spawn_local(async move {
            while let Some(h) = handoff.recv().await {
                match (listeners.get(h.listener), TcpStream::from_std(h.stream)) {
                    (Some(ctx), Ok(stream)) => to.serve(stream, h.peer, ctx, h.permit),
                    _ => to.balance.closed(to.worker_id),
                }
            }
        })
    };
    // Buffered access log lines reach their writer at least this often.
    let flusher = {
        let listeners = listeners.clone();
        tokio::task::spawn_local(async move {
            let mut tick = tokio::time::interval(access_log::FLUSH_EVERY);
            loop {
                tick.tick().await;
                flush_logs(&listeners);
            }
        })
    };

    let mut drain_rx = drain.clone();
    let _ = drain_rx.wait_for(|draining| *draining).await;
    worker.draining.set(true);
    // Accept loops end on the same signal and close their sockets.
    for task in accept_loops {
        let _ = task.await;
    }
    receiver.abort();
    tracker.wait_for_all_closed(config.drain_timeout).await;
    flusher.abort();
    flush_logs(&listeners);
    tracing::debug!(worker = id, "worker stopped");
}

fn flush_logs(listeners: &[Rc<Listener>]) {
    for listener in listeners {
        if let Some(log) = &listener.ctx.access_log {
            log.flush();
        }
    }
}
