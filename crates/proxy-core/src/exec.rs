//! Runtimes and executors: the single-threaded runtime every proxy thread runs, and the
//! executor that keeps hyper's background tasks (HTTP/2 streams, connection drivers) on the
//! current worker.

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
