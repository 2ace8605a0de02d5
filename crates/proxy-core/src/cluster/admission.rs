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
            self.stats.rq_pending_overflow.inc();
            self.settings.log_refused(Overflow::Requests);
            ProxyError::Overflow(Overflow::Requests)
        })
    }
}

impl HostPool {
    /// Waits in the cluster's pending queue until `reuse` finds a connection to this host on
    /// this worker (`Some`: an HTTP/1.1 one put back, an HTTP/2 one with room for a stream)
    /// or a connection slot is taken for this request (`None`).
    pub(super) async fn wait_pending<T>(
        &self,
        reuse: impl Fn(&Self) -> Option<T>,
    ) -> Result<Option<T>, ProxyError> {
        let breakers = &self.settings.shared.breakers;
        let Some(_pending) = Slot::try_take(&breakers.pending) else {
            self.stats.rq_pending_overflow.inc();
            self.settings.log_refused(Overflow::Pending);
            return Err(ProxyError::Overflow(Overflow::Pending));
        };
        self.stats.rq_pending_total.inc();
        self.stats.rq_pending_active.inc();
        let waiters = &self.h1.waiters;
        waiters.set(waiters.get() + 1);
        let started = Instant::now();
        let deadline = tokio::time::sleep(breakers.pending_timeout);
        tokio::pin!(deadline);
        let outcome = loop {
            // Registered before looking, so a wake-up between the look and the wait is kept.
            let returned = self.h1.returned.notified();
            let room = self.h2.room.notified();
            let freed = breakers.connection_freed.notified();
            tokio::pin!(returned, room, freed);
            returned.as_mut().enable();
            room.as_mut().enable();
            freed.as_mut().enable();
            if let Some(conn) = reuse(self) {
                break Ok(Some(conn));
            }
            if self.try_acquire_connection() {
                break Ok(None);
            }
            tokio::select! {
                () = &mut returned => {}
                () = &mut room => {}
                () = &mut freed => {}
                () = &mut deadline => {
                    self.stats.rq_pending_timeout.inc();
                    self.settings.log_refused(Overflow::PendingTimeout);
                    break Err(ProxyError::Overflow(Overflow::PendingTimeout));
                }
            }
        };
        waiters.set(waiters.get() - 1);
        self.stats.rq_pending_active.dec();
        self.stats
            .rq_pending_time
            .record_duration(started.elapsed());
        outcome
    }
}
