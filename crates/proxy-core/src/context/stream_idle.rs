//! A route's idle timeout for the HTTP/2 stream it serves: set by the handler once routed,
//! while the stream's task is being polled, and taken by that task's idle limit
//! (conn/stream_exec.rs) right after the poll. A thread-local: the handler runs inside the
//! stream's task on the same worker, and nothing is allocated per stream.

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    static ROUTE_IDLE_TIMEOUT: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// The stream being polled now ends after `timeout` with nothing moving, instead of after
/// the listener's `stream_idle_timeout`. For HTTP/2 requests only.
pub(crate) fn set_route_idle_timeout(timeout: Duration) {
    ROUTE_IDLE_TIMEOUT.set(Some(timeout));
}

/// Clears what a poll before (of another task) may have left.
pub(crate) fn clear_route_idle_timeout() {
    ROUTE_IDLE_TIMEOUT.set(None);
}

/// What the poll just made set, if anything.
pub(crate) fn take_route_idle_timeout() -> Option<Duration> {
    ROUTE_IDLE_TIMEOUT.take()
}
