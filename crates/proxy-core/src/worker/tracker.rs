//! This worker's open downstream connections, counted so the drain knows when it is done.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Default)]
pub(super) struct ConnTracker {
    active: Cell<usize>,
    all_closed: Notify,
}

/// One open connection, counted until dropped.
pub(super) struct ConnGuard(Rc<ConnTracker>);

impl ConnGuard {
    pub(super) fn new(tracker: &Rc<ConnTracker>) -> Self {
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

impl ConnTracker {
    /// Waits until every connection has closed, or `limit` has passed.
    pub(super) async fn wait_for_all_closed(&self, limit: Duration) {
        let all_closed = async {
            loop {
                let notified = self.all_closed.notified();
                if self.active.get() == 0 {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(limit, all_closed).await.is_err() {
            tracing::warn!(
                open = self.active.get(),
                "drain timeout reached; closing the remaining connections"
            );
        }
    }
}
