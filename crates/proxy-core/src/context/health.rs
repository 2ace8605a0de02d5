//! Whether this proxy asks to be taken out of its load balancer: failed by the admin's
//! `POST /healthcheck/fail`, or draining. Read by the admin's `/ready` and by the
//! `health_check` filter on the workers; written by the admin and the drain.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Default)]
pub(crate) struct ServerHealth {
    /// Set by `POST /healthcheck/fail`, cleared by `POST /healthcheck/ok`.
    failed: AtomicBool,
    /// Set when the drain starts; never cleared.
    draining: AtomicBool,
}

impl ServerHealth {
    pub(crate) fn set_failed(&self, failed: bool) {
        self.failed.store(failed, Ordering::Relaxed);
    }

    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Health checks of this proxy are to fail: failed by the admin, or draining.
    pub(crate) fn failing(&self) -> bool {
        self.failed() || self.draining()
    }
}
