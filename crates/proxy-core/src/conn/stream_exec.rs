//! The executor of the HTTP/2 codec's tasks. Each stream task ends when nothing has moved on
//! its stream for the listener's `stream_idle_timeout` (Envoy's stream idle timeout): neither
//! a wake of its own (response data, window) nor a frame of its request body going upstream
//! (read by the upstream connection's task, so marked on a clock the body moves). A client
//! that keeps a stream's window at zero, or stops sending its body half way, would otherwise
//! hold the stream, and the upstream request behind it, for as long as the connection lives.
//! Ending the task drops the stream: the codec resets it (CANCEL). A route's `idle_timeout`
//! replaces the listener's for its streams, from the poll that routed the request.
//!
//! The codec spawns other tasks through the same executor (the server-to-client half of an
//! HTTP/2 WebSocket, which the tunnel's own idle timeout bounds): only the task spawned right
//! after [`next_stream`] is a stream task.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::context::{ProgressClock, stream_idle};
use crate::sleep_pool::{PooledSleep, later_by};

/// The mark that makes the task the codec spawns next a stream task, moving `activity` as its
/// request body goes upstream. The codec spawns it at once, right after calling the service.
pub(super) struct StreamToken {
    activity: Option<ProgressClock>,
}

thread_local! {
    static NEXT_STREAM: Cell<Option<StreamToken>> = const { Cell::new(None) };
}

/// Called by the service for an HTTP/2 request, just before the codec spawns its stream task.
pub(super) fn next_stream(activity: Option<ProgressClock>) {
    NEXT_STREAM.set(Some(StreamToken { activity }));
}

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

impl StreamExec {
    /// `fut` as a stream task, if the service marked one just before ([`next_stream`]): it
    /// ends once nothing has moved for the stream idle timeout, resolving to `None` (to
    /// `fut`'s output when `fut` finished). Without the mark, `fut` comes back.
    pub(super) fn limit<F: Future>(&self, fut: F) -> Result<IdleLimit<F>, F> {
        match self.take_mark() {
            Some(mark) => Ok(self.limit_marked(|| fut, mark)),
            None => Err(fut),
        }
    }

    /// The mark [`next_stream`] left, if any: the task spawned next is a stream task. Taken
    /// apart from [`Self::limit_marked`] so that the task's future can be made where it will
    /// stay (in a pooled block) instead of being moved there.
    pub(super) fn take_mark(&self) -> Option<StreamToken> {
        NEXT_STREAM.take()
    }

    /// The future `make` returns, as the stream task `mark` marked. Made last, once the
    /// timer is there: the compiler then builds it where the limit is written, where a future
    /// made before a call would be copied there (about 170 instructions a stream).
    #[inline(always)]
    pub(super) fn limit_marked<F: Future>(
        &self,
        make: impl FnOnce() -> F,
        mark: StreamToken,
    ) -> IdleLimit<F> {
        let now = Instant::now();
        // Pooled: most streams end long before it, and a timer made per stream costs two
        // trips through the runtime's wheel. It may be due early (a spare): `poll` reads the
        // clock when it fires.
        let timer = PooledSleep::by(later_by(now, self.timeout));
        IdleLimit {
            inner: make(),
            timer,
            timeout: self.timeout,
            last: now,
            activity: mark.activity,
            expired: Rc::clone(&self.expired),
        }
    }
}

impl<F> hyper::rt::Executor<F> for StreamExec
where
    F: Future + 'static,
{
    fn execute(&self, fut: F) {
        match self.limit(fut) {
            Ok(limited) => {
                tokio::task::spawn_local(async move {
                    limited.await;
                });
            }
            // Another of the codec's tasks.
            Err(fut) => {
                tokio::task::spawn_local(async move {
                    fut.await;
                });
            }
        }
    }
}

pin_project! {
    /// `inner`, ended once neither a wake of its own nor `activity` has moved for `timeout`.
    pub(super) struct IdleLimit<F> {
        #[pin]
        inner: F,
        timer: PooledSleep,
        timeout: Duration,
        // When `inner` was last polled for a wake of its own.
        last: Instant,
        activity: Option<ProgressClock>,
        expired: Rc<stats::Counter>,
    }
}

impl<F: Future> Future for IdleLimit<F> {
    /// What `inner` gave, if it finished (`None`: it stood still for the timeout).
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let now = Instant::now();
        // The timer is moved only when it fires, not on every wake: most streams end first.
        let by_timer = this.timer.sleep().is_elapsed();
        if by_timer {
            let last = match this.activity {
                Some(activity) => activity.get().max(*this.last),
                None => *this.last,
            };
            if now.duration_since(last) >= *this.timeout {
                this.expired.inc();
                return Poll::Ready(None);
            }
            this.timer.sleep().reset(later_by(last, *this.timeout));
        }
        stream_idle::clear_route_idle_timeout();
        let polled = this.inner.poll(cx);
        if let Some(timeout) = stream_idle::take_route_idle_timeout() {
            // Routed just now: the route's timeout counts from here.
            *this.timeout = timeout;
            this.timer.sleep().reset(later_by(now, timeout));
        }
        if let Poll::Ready(output) = polled {
            return Poll::Ready(Some(output));
        }
        if !by_timer {
            *this.last = now;
        }
        // Registers the task's waker with the timer (again, after a reset).
        let _ = this.timer.sleep().poll(cx);
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

    /// Starts a stream task that is never woken; its flag is set once the task is over.
    fn start_idle_stream(exec: &StreamExec) -> Rc<Cell<bool>> {
        let ended = Rc::new(Cell::new(false));
        let guard = Ended(Rc::clone(&ended));
        next_stream(None);
        exec.execute(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        ended
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_never_woken_ends_after_the_timeout() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let exec = exec();
                let ended = start_idle_stream(&exec);
                tokio::time::sleep(TIMEOUT - Duration::from_secs(1)).await;
                assert!(!ended.get(), "ended early");
                tokio::time::sleep(Duration::from_secs(2)).await;
                assert!(ended.get());
                assert_eq!(exec.expired.get(), 1);
            })
            .await;
    }

    #[test]
    fn a_stream_on_a_spare_timer_due_early_still_gets_its_whole_timeout() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        let local = tokio::task::LocalSet::new();
        crate::sleep_pool::spares_while(|| {
            local.block_on(&runtime, async {
                let exec = exec();
                // A stream done at once leaves its timer, due a timeout from now, to the next.
                next_stream(None);
                exec.execute(async {});
                tokio::time::sleep(TIMEOUT / 2).await;
                assert_eq!(crate::sleep_pool::spares_kept(), 1);
                let ended = start_idle_stream(&exec);
                assert_eq!(crate::sleep_pool::spares_kept(), 0, "the spare was taken");
                // Past the spare's deadline, short of this stream's.
                tokio::time::sleep(TIMEOUT - Duration::from_secs(1)).await;
                assert!(!ended.get(), "ended when the spare was due");
                tokio::time::sleep(Duration::from_secs(2)).await;
                assert!(ended.get());
                assert_eq!(exec.expired.get(), 1);
            })
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_moves_is_never_ended_however_long_it_runs() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let exec = exec();
                let finished = Rc::new(Cell::new(false));
                let done = Rc::clone(&finished);
                next_stream(None);
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

    #[tokio::test(start_paused = true)]
    async fn a_body_going_upstream_keeps_its_stream_and_other_tasks_are_left_alone() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let exec = exec();
                // A stream task never woken itself, whose body moves every 2/3 of the timeout.
                let activity = ProgressClock::new();
                let stream_ended = Rc::new(Cell::new(false));
                let guard = Ended(Rc::clone(&stream_ended));
                next_stream(Some(activity.clone()));
                exec.execute(async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                });
                // A task spawned without the mark (a WebSocket's send half), never woken.
                let other_ended = Rc::new(Cell::new(false));
                let guard = Ended(Rc::clone(&other_ended));
                exec.execute(async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                });
                for _ in 0..15 {
                    tokio::time::sleep(TIMEOUT * 2 / 3).await;
                    activity.set(Instant::now());
                }
                assert!(!stream_ended.get(), "a stream whose body moves was ended");
                // The body stops: the stream ends a timeout later; the other task never does.
                tokio::time::sleep(TIMEOUT + Duration::from_secs(1)).await;
                assert!(stream_ended.get());
                assert!(!other_ended.get());
                assert_eq!(exec.expired.get(), 1);
            })
            .await;
    }
}
