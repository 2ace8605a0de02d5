//! Accepting: each listener's accept loop on this worker, admission under the connection
//! limits, the hand-off to another worker under `exact` balancing, and the task that serves
//! an accepted connection.

use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::net::{TcpListener, TcpStream};

use super::balance::{ExactBalance, Handoff};
use super::listener::Listener;
use super::parking::ParkingLot;
use super::tracker::{ConnGuard, ConnTracker};
use crate::conn::{self, Parked};
use crate::context::{ConnCtx, ListenerCtx, SignalWatch, WorkerCtx};
use crate::listen::ConnPermit;

/// What serving an accepted connection on this worker needs.
pub(super) struct Accepted {
    pub(super) worker_id: usize,
    pub(super) worker: Rc<WorkerCtx>,
    pub(super) tracker: Rc<ConnTracker>,
    pub(super) balance: Arc<ExactBalance>,
    /// Where idle connections wait without a task; `None` if the worker could not make one.
    pub(super) lot: Option<Rc<ParkingLot>>,
}

impl Accepted {
    /// Serves a connection already admitted and counted in this worker's load, with the
    /// listener's state as it is now.
    pub(super) fn serve(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        listener: &Rc<Listener>,
        permit: ConnPermit,
    ) {
        let state = listener.state();
        let ctx = &state.ctx;
        tracing::debug!(worker = self.worker_id, listener = %ctx.name, %peer, "accepted connection");
        let closed = self.opened(ctx, permit);
        let local = stream.local_addr().unwrap_or(peer);
        let conn_ctx = Rc::new(ConnCtx::new(
            peer,
            local,
            Rc::clone(ctx),
            Rc::clone(&self.worker),
        ));
        let served = conn::Served {
            http: Rc::clone(&listener.http),
            settings: Rc::clone(&state.conn),
            chains: state.chains.clone(),
        };
        let drain = listener.drain.watch();
        let parking = self
            .lot
            .as_ref()
            .map(|lot| (Rc::clone(lot), Rc::clone(listener)));
        tokio::task::spawn_local(Served::new(
            conn::serve(stream, conn_ctx, served, drain),
            listener.close.watch(),
            closed,
            parking,
        ));
    }
}

impl Accepted {
    /// Counts a connection admitted on this worker (and already counted in its load) as
    /// open, until the returned guard is dropped.
    pub(super) fn opened(&self, ctx: &Rc<ListenerCtx>, permit: ConnPermit) -> Closed {
        ctx.stats.cx_total.inc();
        ctx.stats.cx_active.inc();
        self.worker.stats.cx_active.inc();
        Closed {
            worker: Rc::clone(&self.worker),
            ctx: Rc::clone(ctx),
            balance: Arc::clone(&self.balance),
            worker_id: self.worker_id,
            _permit: permit,
            _guard: ConnGuard::new(&self.tracker),
        }
    }
}

pin_project! {
    /// A connection's task: served until it ends, is parked, or its listener is removed and
    /// the drain time is up. A future of its own rather than an `async` block around
    /// `select!`, which would hold a second copy of everything it captures: this is what
    /// every connection between two requests keeps in memory.
    pub(super) struct Served<F> {
        #[pin]
        conn: F,
        close: SignalWatch,
        // After the connection: dropped after it.
        closed: Option<Closed>,
        parking: Option<(Rc<ParkingLot>, Rc<Listener>)>,
    }
}

impl<F> Served<F> {
    pub(super) fn new(
        conn: F,
        close: SignalWatch,
        closed: Closed,
        parking: Option<(Rc<ParkingLot>, Rc<Listener>)>,
    ) -> Self {
        Self {
            conn,
            close,
            closed: Some(closed),
            parking,
        }
    }
}

impl<F: Future<Output = Option<Parked>>> Future for Served<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if this.close.poll_raised(cx).is_ready() {
            return Poll::Ready(());
        }
        let Some(parked) = std::task::ready!(this.conn.poll(cx)) else {
            return Poll::Ready(());
        };
        // Idle: the socket waits in the lot, with the connection's accounting; this task
        // ends. (Without a lot it closes, as after an idle timeout.)
        if let (Some((lot, listener)), Some(closed)) = (this.parking.take(), this.closed.take()) {
            lot.park(parked, listener, closed);
        }
        Poll::Ready(())
    }
}

/// What a connection gives back when its task ends, however it ends (after the connection
/// itself, which is dropped first), or when the lot lets it go.
pub(super) struct Closed {
    worker: Rc<WorkerCtx>,
    ctx: Rc<ListenerCtx>,
    balance: Arc<ExactBalance>,
    worker_id: usize,
    _permit: ConnPermit,
    _guard: ConnGuard,
}

impl Drop for Closed {
    fn drop(&mut self) {
        self.worker.stats.cx_active.dec();
        self.ctx.stats.cx_active.dec();
        self.ctx.stats.cx_destroy.inc();
        self.balance.closed(self.worker_id);
    }
}

/// Accepts on `socket` until the listener drains (removed, or the process stops).
pub(super) async fn accept_loop(socket: TcpListener, listener: Rc<Listener>, at: Rc<Accepted>) {
    let mut drain = listener.drain.watch();
    // Connections accepted since the worker last served its other tasks.
    let mut in_a_row = 0u32;
    loop {
        if listener
            .state()
            .accept_per_event
            .is_some_and(|max| in_a_row >= max)
        {
            // `max_connections_to_accept_per_socket_event`: the connections still pending
            // wait for the worker's next turn, after the work already in.
            in_a_row = 0;
            tokio::task::yield_now().await;
        }
        let accepted = tokio::select! {
            accepted = socket.accept() => accepted,
            () = drain.raised() => return,
        };
        in_a_row += 1;
        let state = listener.state();
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(err) => {
                // EMFILE and friends: back off briefly instead of spinning on the error.
                tracing::warn!(worker = at.worker_id, listener = %state.ctx.name, error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if !state.ctx.bypass_overload && at.worker.overload.refusing_connections() {
            // As the limits below: closed at once, so the client tries another proxy.
            at.worker.stats.overload_cx_refused().inc();
            drop(stream);
            continue;
        }
        let Some(permit) = state.limits.try_admit() else {
            // Closed at once: the client learns now, not after a timeout.
            state.ctx.stats.cx_overflow.inc();
            drop(stream);
            continue;
        };
        let target = if state.exact {
            at.balance.assign(at.worker_id)
        } else {
            at.balance.opened(at.worker_id);
            at.worker_id
        };
        if target == at.worker_id {
            at.serve(stream, peer, &listener, permit);
            continue;
        }
        match stream.into_std() {
            Ok(stream) => {
                let handoff = Handoff {
                    stream,
                    peer,
                    listener: listener.id,
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
