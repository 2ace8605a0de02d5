//! The parking lot: this worker's idle HTTP/1.1 connections, held as their sockets alone.
//!
//! A keep-alive connection idle for a second hands its socket back ([`conn::Parked`]) and its
//! task ends: no task, no buffer, no registration with the runtime. The lot registers the
//! socket with an epoll set of its own (mio's), whose one descriptor the runtime watches, so
//! ten thousand idle connections cost the runtime one registration. When a client sends
//! again, its socket goes back to the runtime under a new task that reads the request at once;
//! when it stays quiet past its idle timeout or maximum duration, or its listener drains, the
//! lot closes it. What a parked connection keeps here is its context and its place in the
//! worker's accounting (the connection limits, the drain's count of open connections).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::poll_fn;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::task::{Poll, Waker};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll as Epoll, Registry, Token};
use slab::Slab;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::accept::{Closed, Served};
use super::listener::Listener;
use crate::conn::{self, Parked};
use crate::context::SignalWatch;

/// Events taken from the epoll set per look.
const EVENTS: usize = 256;

/// A worker's parked connections.
pub(super) struct ParkingLot {
    registry: Registry,
    state: RefCell<Lot>,
}

struct Lot {
    parked: Slab<Car>,
    /// When each parked connection is due to close, soonest first; entries of connections
    /// that have left are skipped (their generation no longer matches).
    deadlines: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    /// Deadline entries left behind by connections that went: the heap is rebuilt when they
    /// outnumber the parked ones, so a busy lot does not grow it without bound.
    stale: usize,
    generation: u32,
    /// One watch per listener, and per filter chain, with connections here: its drain
    /// closes them.
    drains: Vec<(Drains, SignalWatch)>,
    /// Set when a sooner deadline or a new listener arrived, for the lot's task to see.
    kicked: bool,
    waker: Option<Waker>,
}

/// Whose drain a watch of the lot is: a listener's (by its id) or a chain's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drains {
    Listener(u64),
    Chain(u64),
}

/// One parked connection.
struct Car {
    conn: Parked,
    generation: u32,
    listener: Rc<Listener>,
    closed: Closed,
}

impl ParkingLot {
    /// A lot and the task that runs it (to be spawned on the worker).
    pub(super) fn new() -> io::Result<(Rc<ParkingLot>, impl Future<Output = ()>)> {
        let epoll = Epoll::new()?;
        let registry = epoll.registry().try_clone()?;
        let lot = Rc::new(ParkingLot {
            registry,
            state: RefCell::new(Lot {
                parked: Slab::new(),
                deadlines: BinaryHeap::new(),
                stale: 0,
                generation: 0,
                drains: Vec::new(),
                kicked: false,
                waker: None,
            }),
        });
        let epoll = watch_epoll(epoll)?;
        Ok((Rc::clone(&lot), run(lot, epoll)))
    }

    /// Parks `conn`: held here, with its listener and accounting, until its client sends
    /// again, it is due to close, or the listener drains.
    pub(super) fn park(&self, conn: Parked, listener: Rc<Listener>, closed: Closed) {
        let mut lot = self.state.borrow_mut();
        let key = lot.parked.vacant_key();
        let fd = conn.socket.as_raw_fd();
        if let Err(err) = self
            .registry
            .register(&mut SourceFd(&fd), Token(key), Interest::READABLE)
        {
            // Nothing to wait on it with: closed, as after an idle timeout.
            tracing::debug!(error = %err, "cannot park a connection; closed");
            return;
        }
        lot.generation = lot.generation.wrapping_add(1);
        let generation = lot.generation;
        let sooner = lot
            .deadlines
            .peek()
            .is_none_or(|Reverse((at, _, _))| conn.close_at < *at);
        lot.deadlines
            .push(Reverse((conn.close_at, key, generation)));
        let mut new_listener = false;
        let mut watch = |whose: Drains, signal: &crate::context::Signal| {
            if !lot.drains.iter().any(|(w, _)| *w == whose) {
                lot.drains.push((whose, signal.watch()));
                new_listener = true;
            }
        };
        watch(Drains::Listener(listener.id), &listener.drain);
        if let Some(chain) = &conn.ctx.listener().chain {
            watch(Drains::Chain(chain.id), &chain.drain);
        }
        conn.ctx.listener().stats.cx_parked.inc();
        lot.parked.insert(Car {
            conn,
            generation,
            listener,
            closed,
        });
        if sooner || new_listener {
            lot.kicked = true;
            if let Some(waker) = lot.waker.take() {
                waker.wake();
            }
        }
        drop(lot);
        // Its task's memory is free now: counted toward returning it to the system.
        crate::memory::codec_released();
    }

    /// Takes the car at `key` out of the lot and out of the epoll set. `due`: its deadline's
    /// entry has been taken already.
    fn leave(&self, key: usize, due: bool) -> Option<Car> {
        let mut lot = self.state.borrow_mut();
        let car = lot.parked.try_remove(key)?;
        if !due {
            lot.stale += 1;
        }
        if lot.stale > lot.parked.len() + 64 {
            let live: Vec<_> = lot
                .parked
                .iter()
                .map(|(key, car)| Reverse((car.conn.close_at, key, car.generation)))
                .collect();
            lot.deadlines = BinaryHeap::from(live);
            lot.stale = 0;
        }
        drop(lot);
        let _ = self
            .registry
            .deregister(&mut SourceFd(&car.conn.socket.as_raw_fd()));
        car.conn.ctx.listener().stats.cx_parked.dec();
        Some(car)
    }

    /// A client sent again: its connection gets a task and reads at once.
    fn resume(self: &Rc<Self>, key: usize) {
        let Some(car) = self.leave(key, false) else {
            return;
        };
        let Car {
            conn,
            listener,
            closed,
            ..
        } = car;
        let Parked {
            socket,
            ctx,
            http,
            settings,
            ..
        } = conn;
        let stream = match TcpStream::from_std(socket) {
            Ok(stream) => stream,
            Err(err) => {
                tracing::debug!(error = %err, "cannot resume a parked connection; closed");
                return;
            }
        };
        // A chain's connection goes by its chain's flags (raised with the listener's too).
        let (drain, close) = match &ctx.listener().chain {
            Some(chain) => (chain.drain.watch(), chain.close.watch()),
            None => (listener.drain.watch(), listener.close.watch()),
        };
        tokio::task::spawn_local(Served::new(
            conn::resume(stream, ctx, http, settings, drain),
            close,
            closed,
            Some((Rc::clone(self), listener)),
        ));
    }

    /// Closes the connections due by `now`; the time of the next due one.
    fn close_due(&self, now: Instant) -> Option<Instant> {
        loop {
            let (at, key, generation) = {
                let lot = self.state.borrow();
                let Reverse(next) = *lot.deadlines.peek()?;
                next
            };
            if at > now {
                return Some(at);
            }
            let mut lot = self.state.borrow_mut();
            lot.deadlines.pop();
            let current = lot
                .parked
                .get(key)
                .is_some_and(|c| c.generation == generation);
            if !current {
                lot.stale = lot.stale.saturating_sub(1);
                continue;
            }
            drop(lot);
            let Some(car) = self.leave(key, true) else {
                continue;
            };
            // Counted as the task would have counted it (idle timeout, maximum duration); a
            // deadline moved later by a clock check parks it again.
            match car.conn.deadline() {
                None => drop(car),
                Some(later) => {
                    let Car {
                        mut conn,
                        listener,
                        closed,
                        ..
                    } = car;
                    conn.close_at = later;
                    self.park(conn, listener, closed);
                }
            }
        }
    }

    /// Closes every parked connection (the worker stops: idle connections have nothing to
    /// finish).
    pub(super) fn close_all(&self) {
        let keys: Vec<usize> = self
            .state
            .borrow()
            .parked
            .iter()
            .map(|(key, _)| key)
            .collect();
        for key in keys {
            drop(self.leave(key, false));
        }
    }

    /// Closes the connections of listeners and chains that drain (removed, or the worker
    /// stops).
    fn poll_drains(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let drained: Vec<Drains> = {
            let mut lot = self.state.borrow_mut();
            let mut drained = Vec::new();
            lot.drains.retain_mut(|(id, watch)| {
                let raised = watch.poll_raised(cx).is_ready();
                if raised {
                    drained.push(*id);
                }
                !raised
            });
            drained
        };
        if drained.is_empty() {
            return Poll::Pending;
        }
        let keys: Vec<usize> = self
            .state
            .borrow()
            .parked
            .iter()
            .filter(|(_, car)| {
                drained.contains(&Drains::Listener(car.listener.id))
                    || (car.conn.ctx.listener().chain.as_ref())
                        .is_some_and(|c| drained.contains(&Drains::Chain(c.id)))
            })
            .map(|(key, _)| key)
            .collect();
        for key in keys {
            drop(self.leave(key, false));
        }
        Poll::Ready(())
    }
}

/// The epoll set's descriptor, registered with the runtime.
#[allow(unsafe_code)] // tokio's registration of a raw descriptor has no safe form any more
fn watch_epoll(epoll: Epoll) -> io::Result<AsyncFd<Epoll>> {
    // SAFETY: the descriptor is the epoll set's own, opened by `Epoll::new` and closed only
    // when the `Epoll` is dropped, which the `AsyncFd` owns: it stays open and the same for
    // the `AsyncFd`'s whole life.
    unsafe { AsyncFd::register_with_interest(epoll, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// The lot's task: resumes connections whose client sent, closes those due, and those of
/// draining listeners. Ends with the worker; the connections left are closed then.
async fn run(lot: Rc<ParkingLot>, mut epoll: AsyncFd<Epoll>) {
    let mut events = Events::with_capacity(EVENTS);
    let timer = tokio::time::sleep_until(Instant::now());
    tokio::pin!(timer);
    let mut next_due = None;
    loop {
        tokio::select! {
            ready = epoll.readable_mut() => {
                let Ok(mut guard) = ready else {
                    tracing::error!("the parking lot's epoll set failed; parked connections wait for their timeout");
                    std::future::pending::<()>().await;
                    return;
                };
                let polled = guard.try_io(|epoll| {
                    epoll.get_mut().poll(&mut events, Some(std::time::Duration::ZERO))?;
                    if events.is_empty() {
                        Err(io::ErrorKind::WouldBlock.into())
                    } else {
                        Ok(())
                    }
                });
                if let Ok(Ok(())) = polled {
                    for event in &events {
                        lot.resume(event.token().0);
                    }
                }
            }
            () = &mut timer, if next_due.is_some() => {}
            () = poll_fn(|cx| lot.poll_drains(cx)) => {}
            () = poll_fn(|cx| {
                // Kicked by `park`: a sooner deadline, or a new listener's drain to watch.
                let mut state = lot.state.borrow_mut();
                if std::mem::take(&mut state.kicked) {
                    return Poll::Ready(());
                }
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }) => {}
        }
        next_due = lot.close_due(Instant::now());
        if let Some(at) = next_due {
            timer.as_mut().reset(at);
        }
    }
}
