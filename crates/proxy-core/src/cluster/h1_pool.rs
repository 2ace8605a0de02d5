//! HTTP/1.1 to a host: a keep-alive pool of connections per host and worker, each carrying
//! one request at a time (h1_conn.rs). Idle connections close when the upstream closes them,
//! after the cluster's `idle_timeout`, or at its `max_connection_duration`.

use std::cell::{Cell, RefCell};
use std::pin::pin;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::Request;
use tokio::time::Instant;

use super::HostPool;
use super::connect::ConnectionSlot;
use super::h1_conn::{self, ExchangeError, H1Conn, H1Response};
use super::host::SendError;
use super::settings::Expiry;
use crate::context::RequestBody;
use crate::error::ProxyError;

/// Idle HTTP/1.1 connections kept per host per worker; more are closed when returned.
const MAX_IDLE_PER_HOST: usize = 1024;

/// One host's HTTP/1.1 connections on one worker.
#[derive(Default)]
pub(super) struct H1Pool {
    /// Connections with no request in flight, most recently used last. Boxed, as they are
    /// while in use: a connection moves between here and its responses without a copy.
    #[allow(clippy::vec_box)]
    idle: RefCell<Vec<Box<H1Conn>>>,
    /// Requests on this worker waiting for a connection to this host (`max_connections`).
    pub(super) waiters: Cell<u32>,
    /// Woken when a connection is put back while requests wait.
    pub(super) returned: tokio::sync::Notify,
    /// The waker of the task that closes idle connections as soon as their upstream closes
    /// them ([`watch_idle`]), once it has run.
    watcher: RefCell<Option<Waker>>,
    watching: Cell<bool>,
    /// When the watcher's timer next wakes it to close connections whose time is up.
    armed: Cell<Option<Instant>>,
}

impl H1Pool {
    /// Drops the idle connections whose upstream closed them or whose time is up, and
    /// registers `cx` to be woken when another upstream closes one. When the next
    /// connection's time is up.
    fn sweep(&self, cx: &mut Context<'_>, pool: &HostPool) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let failures = pool.health.health_failures();
        self.idle.borrow_mut().retain_mut(|conn| {
            if !conn.poll_open(cx) {
                return false;
            }
            if conn.failures_at_open != failures {
                // Drained: the host has failed since it was opened.
                return false;
            }
            match pool.settings.expiry(conn.opened, conn.idle_since) {
                Some((at, why)) if at <= now => {
                    pool.count_expiry(why);
                    false
                }
                Some((at, _)) => {
                    next = Some(next.map_or(at, |n| n.min(at)));
                    true
                }
                None => true,
            }
        });
        let mut watcher = self.watcher.borrow_mut();
        if !watcher.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *watcher = Some(cx.waker().clone());
        }
        self.armed.set(next);
        next
    }

    /// Closes the idle connections of a pool let go while others hold it.
    pub(super) fn close_idle_now(&self) {
        let idle = std::mem::take(&mut *self.idle.borrow_mut());
        drop(idle);
    }

    /// Closes the idle connections, for a pool being dropped: how many there were.
    pub(super) fn close_idle(&mut self) -> usize {
        let idle = std::mem::take(self.idle.get_mut());
        idle.len()
    }

    /// Registers a connection being put back with the watcher, so that its socket wakes the
    /// watcher if the upstream closes it: no task runs per request. `false` if it is closed
    /// already. The first put-back starts the watcher, whose first look covers what came
    /// before it ran.
    fn watch(&self, conn: &mut H1Conn, pool: &Rc<HostPool>) -> bool {
        match self.watcher.borrow().as_ref() {
            Some(watcher) => conn.poll_open(&mut Context::from_waker(watcher)),
            None => {
                if !self.watching.replace(true) {
                    tokio::task::spawn_local(watch_idle(Rc::downgrade(pool)));
                }
                conn.is_reusable()
            }
        }
    }
}

impl Drop for H1Pool {
    fn drop(&mut self) {
        // The watcher ends once it finds the pool gone.
        if let Some(watcher) = self.watcher.get_mut().take() {
            watcher.wake();
        }
    }
}

/// Closes a host's idle connections on this worker as soon as the upstream closes them,
/// their time is up or the host fails (a drain), so that they give back their `max_connections` slots at once (as a task
/// per connection would, without one): one task per host and worker, woken by any idle
/// connection's socket and by a timer for the next to expire. Ends with the pool.
async fn watch_idle(pool: Weak<HostPool>) {
    let mut timer = pin!(tokio::time::sleep_until(Instant::now()));
    // A host's failure drains its idle connections at once, as Envoy does.
    let Some(host) = pool.upgrade().map(|p| Arc::clone(&p.health)) else {
        return;
    };
    let mut failed = pin!(host.failed.notified());
    std::future::poll_fn(|cx| {
        loop {
            let Some(pool) = pool.upgrade() else {
                return Poll::Ready(());
            };
            while failed.as_mut().poll(cx).is_ready() {
                failed.set(host.failed.notified());
            }
            let Some(next) = pool.h1.sweep(cx, &pool) else {
                return Poll::Pending;
            };
            timer.as_mut().reset(next);
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    })
    .await;
}

impl HostPool {
    /// Sends `req` on a pooled or new connection. The request is taken once its head is
    /// written; until then it stays in `req`, whole, and an error says so (`unsent`).
    pub(super) async fn send_h1(
        self: &Rc<Self>,
        req: &mut Request<RequestBody>,
    ) -> Result<(http::response::Parts, H1Response), SendError> {
        // A pooled connection may have been closed by the upstream while idle. If the
        // request's head could not be written, it is sent on a fresh connection instead. A
        // fresh connection that fails is reported, so a dead host cannot loop us.
        loop {
            let (conn, fresh) = match self.idle_h1() {
                Some(conn) => {
                    self.preconnect(super::preconnect::Ahead::Http1);
                    (conn, false)
                }
                // Boxed: connecting is rare, and its state would otherwise enlarge every
                // request's future.
                None => match Box::pin(self.connect_h1_within_limit()).await {
                    Ok(conn) => conn,
                    Err(error) => return Err(SendError::unsent(error)),
                },
            };
            match h1_conn::exchange(conn, req, self).await {
                Ok(response) => {
                    // The head is written: its map goes back to the worker's pool.
                    h1::recycle_header_map(std::mem::take(req.headers_mut()));
                    return Ok(response);
                }
                Err(ExchangeError::Unsent(_)) if !fresh => {}
                Err(error) => {
                    return Err(SendError {
                        unsent: matches!(error, ExchangeError::Unsent(_)),
                        error: error.into_proxy_error(self),
                    });
                }
            }
        }
    }

    /// A connection for a request that found none idle: a new one if `max_connections`
    /// allows, else (bounded by `max_pending_requests` and `pending_timeout`) one put back
    /// on this worker or a slot freed anywhere. `(conn, fresh)`.
    async fn connect_h1_within_limit(self: &Rc<Self>) -> Result<(Box<H1Conn>, bool), ProxyError> {
        let _claim = self.claim_pool_slot()?;
        let slot = match self.try_connection_slot() {
            Some(slot) => slot,
            None => {
                self.stats.cx_overflow.inc();
                match (self.wait_pending(&self.h1.returned, Some(&self.h1.waiters), |pool| {
                    pool.idle_h1()
                }))
                .await?
                {
                    Some(conn) => return Ok((conn, false)),
                    // `None`: a connection slot is ours.
                    None => self.taken_connection_slot(),
                }
            }
        };
        let _pending = self.pending();
        self.preconnect(super::preconnect::Ahead::Http1);
        Ok((self.connect_h1(slot).await?, true))
    }

    /// The most recently used idle connection that is still open and within its time.
    pub(super) fn idle_h1(&self) -> Option<Box<H1Conn>> {
        loop {
            let mut conn = self.h1.idle.borrow_mut().pop()?;
            if let Some((at, why)) = self.settings.expiry(conn.opened, conn.idle_since)
                && at <= Instant::now()
            {
                self.count_expiry(why);
                continue;
            }
            if conn.failures_at_open != self.health.health_failures() {
                // Drained: the host has failed since it was opened.
                continue;
            }
            if conn.is_reusable() {
                return Some(conn);
            }
        }
    }

    pub(super) fn count_expiry(&self, why: Expiry) {
        match why {
            Expiry::Idle => self.stats.cx_idle_timeout.inc(),
            Expiry::MaxDuration => self.stats.cx_max_duration_reached.inc(),
        }
    }

    /// Connects on a connection slot the caller took: the connection holds it while open, and
    /// a failure gives it back.
    pub(super) async fn connect_h1(
        self: &Rc<Self>,
        slot: ConnectionSlot,
    ) -> Result<Box<H1Conn>, ProxyError> {
        // Taken before connecting: a failure while it connects drains it too.
        let failures = self.health.health_failures();
        let stream = self.connect_http1().await?;
        Ok(H1Conn::new(stream, self.open_connection(slot), failures))
    }

    pub(super) fn put_back(self: &Rc<Self>, mut conn: Box<H1Conn>) {
        if self
            .settings
            .max_requests
            .is_some_and(|max| conn.uses >= max)
        {
            // Retired: dropping it closes the connection.
            self.stats.cx_max_requests.inc();
            return;
        }
        if conn.failures_at_open != self.health.health_failures() {
            // The host failed while this was busy: Envoy drains its pools, so it closes.
            return;
        }
        if self.h1.waiters.get() == 0 && self.settings.shared.breakers.pending.active() > 0 {
            // Requests wait for a connection slot elsewhere (another worker or host) and none
            // here: closing this idle connection frees its slot for them.
            return;
        }
        let now = Instant::now();
        conn.idle_since = now;
        let expiry = self.settings.expiry(conn.opened, now);
        if let Some((at, why)) = expiry
            && at <= now
        {
            self.count_expiry(why);
            return;
        }
        // Full, or closed by the upstream already: dropped.
        if self.h1.idle.borrow().len() >= MAX_IDLE_PER_HOST || !self.h1.watch(&mut conn, self) {
            return;
        }
        self.h1.idle.borrow_mut().push(conn);
        // The watcher's timer is set for the earliest expiry it knows of; one that comes
        // sooner (an old connection's maximum duration) wakes it to set it again.
        if let Some((at, _)) = expiry
            && self.h1.armed.get().is_none_or(|armed| at < armed)
            && let Some(watcher) = self.h1.watcher.borrow().as_ref()
        {
            self.h1.armed.set(Some(at));
            watcher.wake_by_ref();
        }
        if self.h1.waiters.get() > 0 {
            self.h1.returned.notify_one();
        }
    }
}
