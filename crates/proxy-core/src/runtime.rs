//! Runtimes and executors: the single-threaded runtime every proxy thread runs, the executor
//! that keeps hyper's background tasks (HTTP/2 streams, connection drivers) on the current
//! worker, and the timer of idle relays. How many cores there are is `config::machine`.

use std::future::Future;

/// A hyper executor that spawns onto the worker's `LocalSet`, so request futures need not be
/// `Send` and never leave the worker thread.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LocalExec;

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// A single-threaded tokio runtime with I/O and timers, as workers and the admin server use.
/// Built on the starting thread so that a failure is returned, not lost in a new thread.
pub(crate) fn current_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Resolves once `last_activity` has stood still for `timeout`: the idle timeout of a relay,
/// and a request's timeout, which (as in Envoy) runs from the end of its body, so a large
/// upload that keeps moving is not cut off and one that stalls for the timeout is.
pub(crate) async fn idle_for(
    timeout: std::time::Duration,
    last_activity: &std::cell::Cell<tokio::time::Instant>,
) {
    let due = || crate::sleep_pool::later_by(last_activity.get(), timeout);
    let mut timer = crate::sleep_pool::PooledSleep::by(due());
    loop {
        timer.sleep().await;
        let due = due();
        if due <= tokio::time::Instant::now() {
            return;
        }
        timer.sleep().reset(due);
    }
}
