//! Runs hyper's background tasks (HTTP/2 streams, connection drivers) on the current worker.

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
