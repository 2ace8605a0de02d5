//! A worker: one OS thread running a single-threaded tokio runtime. It accepts on its own
//! sockets and owns everything its connections touch (routes, upstream pools), so the request
//! path takes no locks and never wakes another thread.

mod balance;
mod cores;

use std::cell::Cell;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use http::HeaderValue;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use crate::access_log::{self, LogSinks, WorkerLog};
use crate::catalog::{ListenerStats, ProxyStats, WorkerStats};
use crate::cluster::{Cluster, SharedCluster};
use crate::config::Config;
use crate::conn::{self, ConnCtx};
use crate::http::ext_authz::ExtAuthzFilter;
use crate::listener::{ConnPermit, ConnectionLimits};
use crate::router::RouteTable;
use crate::tls::{Handshake, ServerTls};

pub(crate) use balance::ExactBalance;
use balance::Handoff;
pub use cores::usable_cores;

/// Per-worker view of the configuration.
pub(crate) struct WorkerCtx {
    pub(crate) clusters: Vec<Cluster>,
    pub(crate) stats: WorkerStats,
    /// Set when the drain starts: responses then tell HTTP/1.1 clients to close.
    pub(crate) draining: Cell<bool>,
}

/// Per-worker view of one listener.
pub(crate) struct ListenerCtx {
    pub(crate) name: String,
    /// Position in the config, which hand-offs between workers refer to.
    index: usize,
    exact: bool,
    pub(crate) max_requests_per_connection: Option<u32>,
    /// The request-head limit in bytes, when the codec's buffer is larger and so does not
    /// enforce it (HTTP/1.1 with a buffer limit above `max_request_headers_kb`).
    pub(crate) head_limit: Option<usize>,
    codecs: Rc<conn::Codecs>,
    limits: ConnectionLimits,
    pub(crate) stats: ListenerStats,
    pub(crate) access_log: Option<WorkerLog>,
    pub(crate) routes: RouteTable,
    pub(crate) forwarded_proto: HeaderValue,
    /// The TLS handshake, on a TLS listener.
    pub(crate) tls: Option<Handshake>,
    /// External authorization, if the listener has it.
    pub(crate) ext_authz: Option<ExtAuthzFilter>,
}

/// Counts this worker's open downstream connections, to know when a drain is complete.
#[derive(Default)]
struct ConnTracker {
    active: Cell<usize>,
    all_closed: Notify,
}

struct ConnGuard(Rc<ConnTracker>);

impl ConnGuard {
    fn new(tracker: &Rc<ConnTracker>) -> Self {
        tracker.active.set(tracker.active.get() + 1);
        ConnGuard(Rc::clone(tracker))
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let left = self.0.active.get() - 1;
        self.0.active.set(left);
        if left == 0 {
            self.0.all_closed.notify_waiters();
        }
    }
}

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
    /// Open connections per worker, for `exact` balancing; and this worker's hand-off queue.
    pub(crate) balance: Arc<ExactBalance>,
    pub(crate) handoff: tokio::sync::mpsc::UnboundedReceiver<Handoff>,
}

pub(crate) fn spawn(spec: WorkerSpec) -> io::Result<JoinHandle<()>> {
    let runtime = crate::exec::current_thread_runtime()?;
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
        balance,
        mut handoff,
    } = spec;
    let shard = stats.registry.shard(&[("worker", &id.to_string())]);
    let catalog = &stats.catalog;
    let worker = Rc::new(WorkerCtx {
        clusters: config
            .clusters
            .iter()
            .zip(clusters.iter())
            .map(|(c, shared)| Cluster::new(c, shared, catalog, &shard))
            .collect(),
        stats: catalog.worker(&shard),
        draining: Cell::new(false),
    });
    let tracker = Rc::new(ConnTracker::default());

    let mut accept_loops = Vec::new();
    let mut listeners: Vec<Rc<ListenerCtx>> = Vec::new();
    for (((listener, socket), limits), tls) in config
        .listeners
        .iter()
        .zip(sockets)
        .zip(limits.iter())
        .zip(tls.iter())
    {
        let socket = match TcpListener::from_std(socket) {
            Ok(s) => s,
            Err(err) => {
                tracing::error!(worker = id, listener = %listener.name, error = %err, "cannot register listener socket");
                continue;
            }
        };
        let access_log = listener.access_log.as_ref().and_then(|log| {
            let tx = log_sinks.sender(&log.target)?;
            Some(WorkerLog::new(
                log.format.clone(),
                tx,
                Arc::clone(&log_sinks.dropped),
            ))
        });
        let ctx = Rc::new(ListenerCtx {
            name: listener.name.clone(),
            index: listeners.len(),
            exact: listener.connection_balance == crate::config::ConnectionBalance::Exact,
            max_requests_per_connection: listener.http.max_requests_per_connection,
            head_limit: conn::Codecs::head_limit_to_check(listener),
            codecs: Rc::new(conn::Codecs::new(listener)),
            limits: limits.clone(),
            stats: catalog.listener(&shard, &listener.name),
            access_log,
            routes: RouteTable::new(listener.routes.clone()),
            forwarded_proto: HeaderValue::from_static(if tls.is_some() { "https" } else { "http" }),
            tls: tls.as_ref().map(|server| {
                Handshake::new(
                    Arc::clone(server),
                    catalog.tls(&shard, &listener.name),
                    listener.buffer_limit,
                )
            }),
            ext_authz: listener
                .ext_authz
                .as_ref()
                .map(|authz| ExtAuthzFilter::new(authz, catalog.authz(&shard, &listener.name))),
        });
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
    wait_for_connections(&tracker, config.drain_timeout).await;
    flusher.abort();
    flush_logs(&listeners);
    tracing::debug!(worker = id, "worker stopped");
}

fn flush_logs(listeners: &[Rc<ListenerCtx>]) {
    for listener in listeners {
        if let Some(log) = &listener.access_log {
            log.flush();
        }
    }
}

async fn wait_for_connections(tracker: &ConnTracker, limit: Duration) {
    let all_closed = async {
        loop {
            let notified = tracker.all_closed.notified();
            if tracker.active.get() == 0 {
                return;
            }
            notified.await;
        }
    };
    if tokio::time::timeout(limit, all_closed).await.is_err() {
        tracing::warn!(
            open = tracker.active.get(),
            "drain timeout reached; closing the remaining connections"
        );
    }
}

/// What serving an accepted connection on this worker needs.
struct Accepted {
    worker_id: usize,
    worker: Rc<WorkerCtx>,
    tracker: Rc<ConnTracker>,
    balance: Arc<ExactBalance>,
    drain: watch::Receiver<bool>,
}

impl Accepted {
    /// Serves a connection already admitted and counted in this worker's load.
    fn serve(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        ctx: &Rc<ListenerCtx>,
        permit: ConnPermit,
    ) {
        tracing::debug!(worker = self.worker_id, listener = %ctx.name, %peer, "accepted connection");
        let guard = ConnGuard::new(&self.tracker);
        ctx.stats.cx_total.inc();
        ctx.stats.cx_active.inc();
        self.worker.stats.cx_active.inc();
        let local = stream.local_addr().unwrap_or(peer);
        let conn_ctx = Rc::new(ConnCtx::new(
            peer,
            local,
            Rc::clone(ctx),
            Rc::clone(&self.worker),
        ));
        let codecs = Rc::clone(&ctx.codecs);
        let drain = self.drain.clone();
        let listener = Rc::clone(ctx);
        let worker = Rc::clone(&self.worker);
        let balance = Arc::clone(&self.balance);
        let worker_id = self.worker_id;
        tokio::task::spawn_local(async move {
            conn::serve(stream, conn_ctx, codecs, drain).await;
            worker.stats.cx_active.dec();
            listener.stats.cx_active.dec();
            listener.stats.cx_destroy.inc();
            balance.closed(worker_id);
            drop(permit);
            drop(guard);
        });
    }
}

async fn accept_loop(socket: TcpListener, ctx: Rc<ListenerCtx>, mut at: Accepted) {
    loop {
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            _ = at.drain.wait_for(|draining| *draining) => return,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                // EMFILE and friends: back off briefly instead of spinning on the error.
                tracing::warn!(worker = at.worker_id, listener = %ctx.name, error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(permit) = ctx.limits.try_admit() else {
            // Closed at once: the client learns now, not after a timeout.
            ctx.stats.cx_overflow.inc();
            drop(stream);
            continue;
        };
        let target = if ctx.exact {
            at.balance.assign(at.worker_id)
        } else {
            at.balance.opened(at.worker_id);
            at.worker_id
        };
        if target == at.worker_id {
            at.serve(stream, peer, &ctx, permit);
            continue;
        }
        match stream.into_std() {
            Ok(stream) => {
                let handoff = Handoff {
                    stream,
                    peer,
                    listener: ctx.index,
                    permit,
                };
                if !at.balance.hand_off(target, handoff) {
                    tracing::debug!(worker = target, "hand-off to a stopped worker dropped");
                }
            }
            Err(err) => {
                at.balance.closed(target);
                tracing::warn!(error = %err, "cannot hand a connection to another worker");
            }
        }
    }
}
