//! Timers for the deadlines a worker sets on every request (a route's timeout, an HTTP/2
//! stream's idle timeout), from a per-worker pool.
//!
//! A `tokio::time::Sleep` made for each request goes through the runtime's timer wheel twice:
//! once when first polled (registered, under the driver's lock) and once when dropped
//! (removed), about 450 instructions a timer under callgrind (h2c, clock reads included).
//! Requests end long before their deadlines, so the wheel mostly hears of deadlines that never
//! come. A timer here goes back to the worker's pool still registered, and the next request
//! takes it as it is when it is due no later than the new deadline: it may then fire early,
//! and its user checks the clock and moves it, once a timeout and not once a request. One due
//! later is moved earlier.
//!
//! Timers belong to the runtime they were made in, so only a thread that says so keeps any
//! ([`spares_while`]: a worker, for its runtime's whole life). Elsewhere each timer is made
//! and dropped as before.
//!
//! A timer in the pool keeps the waker its last user left, and may wake that task once for
//! nothing when it fires there: futures allow that.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

/// Spare timers kept per worker: a few for each request in flight (an HTTP/2 stream has two),
/// each about 100 bytes. More given back at once are dropped.
const KEPT: usize = 256;

thread_local! {
    /// `None` on a thread that keeps no spares.
    static SPARES: RefCell<Option<Vec<Pin<Box<Sleep>>>>> = const { RefCell::new(None) };
}

/// Runs `run` with a pool of spare timers on this thread, dropped when it returns, before the
/// runtime they are registered with (whose whole life `run` must hold).
pub(crate) fn spares_while<R>(run: impl FnOnce() -> R) -> R {
    /// Drops the spares even if `run` panics.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            let spares = SPARES.try_with(|spares| spares.borrow_mut().take());
            drop(spares);
        }
    }
    SPARES.set(Some(Vec::new()));
    let _clear = Clear;
    run()
}

/// How many spares this thread keeps.
#[cfg(test)]
pub(crate) fn spares_kept() -> usize {
    SPARES.with(|spares| spares.borrow().as_ref().map_or(0, Vec::len))
}

/// A timer due no later than the deadline it was taken for: a spare as it was, or one moved
/// or made for that deadline. Its user reads the clock when it fires.
pub(crate) struct PooledSleep {
    /// Always there; taken out only when it is dropped, to go back to the pool.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl PooledSleep {
    /// A timer due by `at`.
    pub(crate) fn by(at: Instant) -> Self {
        let spare = SPARES
            .try_with(|spares| spares.borrow_mut().as_mut().and_then(Vec::pop))
            .ok()
            .flatten();
        let sleep = match spare {
            Some(mut sleep) => {
                if sleep.deadline() > at {
                    sleep.as_mut().reset(at);
                }
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(at)),
        };
        Self { sleep: Some(sleep) }
    }

    /// The timer, to poll, reset or read.
    pub(crate) fn sleep(&mut self) -> Pin<&mut Sleep> {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut(),
            None => unreachable!("a pooled timer is taken out only when dropped"),
        }
    }
}

impl Drop for PooledSleep {
    fn drop(&mut self) {
        let Some(sleep) = self.sleep.take() else {
            return;
        };
        // Dropped here, outside the pool's borrow, when the pool is full or there is none.
        let _dropped = SPARES.try_with(move |spares| match spares.borrow_mut().as_mut() {
            Some(kept) if kept.len() < KEPT => {
                kept.push(sleep);
                None
            }
            _ => Some(sleep),
        });
    }
}

/// Resolves at `at`, as `tokio::time::sleep_until`, on a pooled timer.
pub(crate) struct Deadline {
    timer: PooledSleep,
    at: Instant,
}

impl Deadline {
    pub(crate) fn at(at: Instant) -> Self {
        Self {
            timer: PooledSleep::by(at),
            at,
        }
    }

    /// `timeout` from now: far off, but due, when that overflows the clock.
    pub(crate) fn after(timeout: Duration) -> Self {
        Self::at(later_by(Instant::now(), timeout))
    }

    /// When it is due.
    pub(crate) fn when(&self) -> Instant {
        self.at
    }
}

impl Future for Deadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut sleep = this.timer.sleep();
        loop {
            ready!(sleep.as_mut().poll(cx));
            if sleep.deadline() >= this.at || Instant::now() >= this.at {
                return Poll::Ready(());
            }
            // A spare due before this deadline: moved to it, and polled to register.
            sleep.as_mut().reset(this.at);
        }
    }
}

/// `from + by`, or about 30 years on where that overflows the clock (as tokio's far future).
pub(crate) fn later_by(from: Instant, by: Duration) -> Instant {
    from.checked_add(by)
        .unwrap_or_else(|| from + Duration::from_secs(86_400 * 365 * 30))
}

/// The deadline passed before the future finished.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TimedOut;

pin_project! {
    /// `inner`, given up at its deadline: `tokio::time::timeout` on a pooled timer.
    pub(crate) struct Timeout<F> {
        #[pin]
        inner: F,
        deadline: Deadline,
    }
}

/// `inner`, given up once `timeout` has passed from now.
pub(crate) fn timeout<F: Future>(timeout: Duration, inner: F) -> Timeout<F> {
    Timeout {
        inner,
        deadline: Deadline::after(timeout),
    }
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, TimedOut>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let had_budget = tokio::task::coop::has_budget_remaining();
        if let Poll::Ready(output) = this.inner.poll(cx) {
            return Poll::Ready(Ok(output));
        }
        if had_budget && !tokio::task::coop::has_budget_remaining() {
            // `inner` used up the task's budget (and so woke the task again): the timer, which
            // spends budget too, would say pending, and a future that always does that would
            // never time out. The clock says instead, as tokio's `Timeout` does.
            return if Instant::now() >= this.deadline.when() {
                Poll::Ready(Err(TimedOut))
            } else {
                Poll::Pending
            };
        }
        Pin::new(this.deadline).poll(cx).map(|()| Err(TimedOut))
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    /// A paused clock's runtime, run with spares as a worker runs.
    fn on_worker<F: Future>(test: F) -> F::Output {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime");
        spares_while(|| runtime.block_on(test))
    }

    /// Polls `deadline` once, as a request's first poll does: its timer registers.
    async fn registered(mut deadline: Deadline) -> Deadline {
        let polled = poll_fn(|cx| Poll::Ready(Pin::new(&mut deadline).poll(cx))).await;
        assert!(polled.is_pending());
        deadline
    }

    #[test]
    fn a_spare_due_earlier_is_taken_as_it_is_and_the_deadline_still_comes_on_time() {
        on_worker(async {
            let start = Instant::now();
            drop(registered(Deadline::after(10 * SECOND)).await);
            assert_eq!(spares_kept(), 1);
            tokio::time::advance(4 * SECOND).await;
            let mut second = Deadline::after(10 * SECOND);
            assert_eq!(spares_kept(), 0);
            assert_eq!(
                second.timer.sleep().deadline(),
                start + 10 * SECOND,
                "not moved"
            );
            (&mut second).await;
            // The spare fired at 10 s; the deadline waited on to 14.
            assert_eq!(Instant::now(), start + 14 * SECOND);
        });
    }

    #[test]
    fn a_spare_due_later_is_moved_earlier() {
        on_worker(async {
            let start = Instant::now();
            drop(registered(Deadline::after(10 * SECOND)).await);
            let mut shorter = Deadline::after(SECOND);
            assert_eq!(shorter.timer.sleep().deadline(), start + SECOND);
            (&mut shorter).await;
            assert_eq!(Instant::now(), start + SECOND);
        });
    }

    #[test]
    fn a_spare_that_fired_in_the_pool_is_moved_to_its_new_deadline() {
        on_worker(async {
            let start = Instant::now();
            drop(registered(Deadline::after(SECOND)).await);
            tokio::time::advance(5 * SECOND).await;
            let deadline = Deadline::after(2 * SECOND);
            deadline.await;
            assert_eq!(Instant::now(), start + 7 * SECOND);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_thread_without_spares_keeps_none() {
        drop(registered(Deadline::after(SECOND)).await);
        assert!(SPARES.with(|spares| spares.borrow().is_none()));
    }

    #[test]
    fn the_pool_keeps_a_bounded_number_and_none_after_the_worker() {
        on_worker(async {
            let many: Vec<_> = (0..KEPT + 10).map(|_| Deadline::after(SECOND)).collect();
            drop(many);
            assert_eq!(spares_kept(), KEPT);
        });
        assert!(SPARES.with(|spares| spares.borrow().is_none()));
    }

    #[test]
    fn a_timeout_gives_the_output_before_its_deadline_and_gives_up_at_it() {
        on_worker(async {
            let start = Instant::now();
            assert_eq!(timeout(SECOND, async { 7 }).await, Ok(7));
            let slow = tokio::time::sleep(3 * SECOND);
            // On the first one's timer, due at 1 s: it did not end this one early.
            assert_eq!(timeout(2 * SECOND, slow).await, Err(TimedOut));
            assert_eq!(Instant::now(), start + 2 * SECOND);
            // On the same timer, fired already.
            let late = timeout(5 * SECOND, tokio::time::sleep(4 * SECOND)).await;
            assert_eq!(late, Ok(()));
            assert_eq!(Instant::now(), start + 6 * SECOND);
        });
    }

    #[test]
    fn a_timeout_comes_even_when_its_future_spends_the_whole_budget() {
        on_worker(async {
            let start = Instant::now();
            // Always ready to make progress, so always out of budget when it yields.
            let busy = async {
                loop {
                    tokio::task::consume_budget().await;
                }
            };
            let spent = timeout(SECOND, busy);
            tokio::pin!(spent);
            let ticker = async {
                // The paused clock moves only when the runtime idles, which it never does
                // here: moved by hand, 100 ms a turn, for up to 10 s.
                for _ in 0..100 {
                    tokio::time::advance(Duration::from_millis(100)).await;
                }
            };
            let ended = tokio::select! {
                biased;
                ended = &mut spent => ended,
                () = ticker => panic!("the timeout never came"),
            };
            assert_eq!(ended, Err(TimedOut));
            assert!(Instant::now() >= start + SECOND);
        });
    }

    #[test]
    fn a_deadline_past_the_clocks_end_is_far_off() {
        on_worker(async {
            let now = Instant::now();
            assert!(later_by(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
            assert_eq!(later_by(now, SECOND), now + SECOND);
        });
    }
}
