//! Admission to a cluster's hosts under its circuit breakers: the `max_requests` slot a try
//! holds, and the pending queue a request waits in when `max_connections` is reached.

use tokio::time::Instant;

use super::breaker::Slot;
use super::{Cluster, HostPool};
use crate::error::{Overflow, ProxyError};

impl Cluster {
    /// Takes a `max_requests` slot for one try, before any work is spent on the request; a
    /// full breaker refuses it here (counted, and logged at most once a second).
    pub(crate) fn request_slot(&self) -> Result<Slot<'_>, ProxyError> {
        Slot::try_take(&self.settings.shared.breakers.requests).ok_or_else(|| {
            self.stats().rq_pending_overflow.inc();
            self.settings.log_refused(Overflow::Requests);
            ProxyError::Overflow(Overflow::Requests)
        })
    }
}

impl HostPool {
    /// Waits in the cluster's pending queue until `reuse` finds a connection to this host on
    /// this worker (`Some`: an HTTP/1.1 one put back, an HTTP/2 one with room for a stream;
    /// `returned` is woken when one may be there) or a connection slot is taken for this
    /// request (`None`). `waiters`, where given, counts it meanwhile (HTTP/1.1's put-back
    /// reads it).
    pub(super) async fn wait_pending<T>(
        &self,
        returned: &tokio::sync::Notify,
        waiters: Option<&std::cell::Cell<u32>>,
        reuse: impl Fn(&Self) -> Option<T>,
    ) -> Result<Option<T>, ProxyError> {
        let breakers = &self.settings.shared.breakers;
        let Some(_pending) = Slot::try_take(&breakers.pending) else {
            self.stats().rq_pending_overflow.inc();
            self.settings.log_refused(Overflow::Pending);
            return Err(ProxyError::Overflow(Overflow::Pending));
        };
        self.stats.rq_pending_total.inc();
        // Counted out however the wait ends, a request dropped by its route's timeout too.
        let _waiting = Waiting::new(self, waiters);
        let deadline = tokio::time::sleep(breakers.pending_timeout);
        tokio::pin!(deadline);
        loop {
            // Registered before looking, so a wake-up between the look and the wait is kept.
            let returned = returned.notified();
            let freed = breakers.connection_freed.notified();
            tokio::pin!(returned, freed);
            returned.as_mut().enable();
            freed.as_mut().enable();
            if let Some(conn) = reuse(self) {
                return Ok(Some(conn));
            }
            if self.try_acquire_connection() {
                return Ok(None);
            }
            tokio::select! {
                () = &mut returned => {}
                () = &mut freed => {}
                () = &mut deadline => {
                    self.stats.rq_pending_timeout.inc();
                    self.settings.log_refused(Overflow::PendingTimeout);
                    return Err(ProxyError::Overflow(Overflow::PendingTimeout));
                }
            }
        }
    }

    /// Counts a request in `upstream_rq_pending_active` until the guard is dropped.
    pub(super) fn pending(&self) -> Pending<'_> {
        self.stats.rq_pending_active.inc();
        Pending(self)
    }
}

/// A request counted in `upstream_rq_pending_active` (connecting, or waiting to).
pub(super) struct Pending<'a>(&'a HostPool);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.stats.rq_pending_active.dec();
    }
}

/// A request in the pending queue: counted as pending (and in `waiters`, where given), and
/// timed, until dropped.
struct Waiting<'a> {
    _pending: Pending<'a>,
    waiters: Option<&'a std::cell::Cell<u32>>,
    started: Instant,
}

impl<'a> Waiting<'a> {
    fn new(pool: &'a HostPool, waiters: Option<&'a std::cell::Cell<u32>>) -> Self {
        if let Some(waiters) = waiters {
            waiters.set(waiters.get() + 1);
        }
        Self {
            _pending: pool.pending(),
            waiters,
            started: Instant::now(),
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(waiters) = self.waiters {
            waiters.set(waiters.get() - 1);
        }
        let pool = self._pending.0;
        (pool.stats.rq_pending_time).record_duration(self.started.elapsed());
    }
}
