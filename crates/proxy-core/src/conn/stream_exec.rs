//! The executor of the HTTP/2 codec's stream tasks: each runs on the worker's thread, and ends
//! when nothing has moved on it for the listener's `stream_idle_timeout` (Envoy's stream idle
//! timeout). A client that keeps a stream's window at zero, or never finishes sending its
//! body, would otherwise hold the stream, and the upstream request behind it, for as long as
//! the connection lives. Ending the task drops the stream: the codec resets it (CANCEL).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

#[derive(Clone)]
pub(crate) struct StreamExec {
    timeout: Duration,
    expired: Rc<stats::Counter>,
}

impl StreamExec {
    pub(crate) fn new(timeout: Duration, expired: stats::Counter) -> Self {
        Self {
            timeout,
            expired: Rc::new(expired),
        }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(IdleLimit {
            inner: fut,
            timer: tokio::time::sleep(self.timeout),
            timeout: self.timeout,
            last: Instant::now(),
            expired: Rc::clone(&self.expired),
        });
    }
}

pin_project! {
    /// `inner`, ended once it has not been woken for `timeout`.
    struct IdleLimit<F> {
        #[pin]
        inner: F,
        #[pin]
        timer: Sleep,
        timeout: Duration,
        // When `inner` was last polled for a wake of its own.
        last: Instant,
        expired: Rc<stats::Counter>,
    }
}

impl<F: Future> Future for IdleLimit<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let now = Instant::now();
        // The timer is moved only when it fires, not on every wake: most streams end first.
        let by_timer = this.timer.is_elapsed();
        if by_timer {
            if now.duration_since(*this.last) >= *this.timeout {
                this.expired.inc();
                return Poll::Ready(());
            }
            let deadline = *this.last + *this.timeout;
            this.timer.as_mut().reset(deadline);
        }
        if this.inner.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        if !by_timer {
            *this.last = now;
        }
        // Registers the task's waker with the timer (again, after a reset).
        let _ = this.timer.poll(cx);
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use hyper::rt::Executor;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(300);

    fn exec() -> StreamExec {
        let registry = stats::Registry::new();
        let family = registry.counter("expired", "test", &[]);
        StreamExec::new(TIMEOUT, registry.shard(&[]).counter(family, &[]))
    }

    /// Sets its flag when dropped: the task is over.
    struct Ended(Rc<Cell<bool>>);

    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_never_woken_ends_after_the_timeout() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let exec = exec();
                let ended = Rc::new(Cell::new(false));
                let guard = Ended(Rc::clone(&ended));
                exec.execute(async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                });
                tokio::time::sleep(TIMEOUT - Duration::from_secs(1)).await;
                assert!(!ended.get(), "ended early");
                tokio::time::sleep(Duration::from_secs(2)).await;
                assert!(ended.get());
                assert_eq!(exec.expired.get(), 1);
            })
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_moves_is_never_ended_however_long_it_runs() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let exec = exec();
                let finished = Rc::new(Cell::new(false));
                let done = Rc::clone(&finished);
                exec.execute(async move {
                    // Woken every 2/3 of the timeout, for ten timeouts in all.
                    for _ in 0..15 {
                        tokio::time::sleep(TIMEOUT * 2 / 3).await;
                    }
                    done.set(true);
                });
                tokio::time::sleep(TIMEOUT * 11).await;
                assert!(finished.get(), "the stream was ended");
                assert_eq!(exec.expired.get(), 0);
            })
            .await;
    }
}
