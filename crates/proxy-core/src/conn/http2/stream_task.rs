//! The tasks that run the streams of Legate's own HTTP/2 codec, reused from one stream to the
//! next. A task spawned per stream costs tokio a 128-byte aligned allocation (glibc 2.36's
//! `posix_memalign`: 584 instructions a call under callgrind, where tcache serves a small
//! `malloc` in a few dozen) and its free, about 1,000 instructions per request with the task's
//! bookkeeping; a stream instead runs on a task an earlier stream left idle, where the worker
//! has one, and a new task is spawned only when none is. [`spawn`] gives a handle whose
//! [`StreamTask::abort`] ends that stream's run, as tokio's `AbortHandle` ends a task.
//!
//! The streams a task runs share its waker: a wake-up left registered by a stream that has
//! ended (by a waker it gave away and that outlived it) polls the next one for nothing, which
//! futures allow. Its `IdleLimit` counts such a poll as activity, so it can put off that
//! stream's idle timeout once; the timers and channels a stream uses deregister when dropped.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};

use crate::box_pool::PooledBox;

/// Idle tasks kept per worker (each a few hundred bytes); a task finishing its stream when
/// as many are idle ends. A few busy HTTP/2 clients have a hundred streams in flight (the
/// callgrind bench's h2c load has 80, the peer bench's 64), and a task ended one moment would
/// be spawned again the next.
const IDLE_KEPT: usize = 128;

/// A stream's future, in a block from the worker's pool (a `Box<dyn Future>` would be a
/// `malloc` and a `free` per stream, as dear as what the reuse saves).
type Job = PooledBox<dyn Future<Output = ()>>;

/// What a task and the handles to its streams share.
struct Runner {
    /// The stream being run; `None` while idle.
    job: RefCell<Option<Job>>,
    /// Counts the streams given to the task, so that a handle ends only its own.
    generation: Cell<u64>,
    /// The stream is to be ended (a handle's [`StreamTask::abort`]).
    aborted: Cell<bool>,
    /// The task's waker, to wake it for a new stream or an abort.
    waker: RefCell<Option<Waker>>,
}

impl Runner {
    fn wake(&self) {
        if let Some(waker) = self.waker.borrow().as_ref() {
            waker.wake_by_ref();
        }
    }
}

thread_local! {
    static IDLE: RefCell<Vec<Rc<Runner>>> = const { RefCell::new(Vec::new()) };
}

/// A stream's run on a task, as tokio's `AbortHandle` is a task's.
pub(super) struct StreamTask {
    /// Weak: the task's stream may hold the handle (through its connection), and a task
    /// dropped with its worker must drop its stream.
    runner: Weak<Runner>,
    generation: u64,
}

impl StreamTask {
    /// Ends the stream's run: its future is dropped on its task's next turn (as
    /// `AbortHandle::abort` does), unless it has finished already.
    pub(super) fn abort(&self) {
        if let Some(runner) = self.runner.upgrade()
            && runner.generation.get() == self.generation
        {
            runner.aborted.set(true);
            runner.wake();
        }
    }
}

/// Runs `stream` on an idle task of this worker's, or on a new one.
pub(super) fn spawn<F: Future<Output = ()> + 'static>(stream: PooledBox<F>) -> StreamTask {
    let job: Job = stream.erased();
    let idle = IDLE
        .try_with(|idle| {
            let mut idle = idle.borrow_mut();
            // One whose task is gone (dropped with the `LocalSet` that ran it) is held by
            // this list alone: its stream would never run.
            while let Some(runner) = idle.pop() {
                if Rc::strong_count(&runner) > 1 {
                    return Some(runner);
                }
            }
            None
        })
        .ok()
        .flatten();
    let runner = match idle {
        Some(runner) => runner,
        None => {
            let runner = Rc::new(Runner {
                job: RefCell::new(None),
                generation: Cell::new(0),
                aborted: Cell::new(false),
                waker: RefCell::new(None),
            });
            tokio::task::spawn_local(run(Rc::clone(&runner)));
            runner
        }
    };
    let generation = runner.generation.get() + 1;
    runner.generation.set(generation);
    runner.aborted.set(false);
    *runner.job.borrow_mut() = Some(job);
    // A new task runs on its first turn; an idle one waits to be woken.
    runner.wake();
    StreamTask {
        runner: Rc::downgrade(&runner),
        generation,
    }
}

/// A task's life: each stream given to it run to its end (or abort), then back to the idle
/// tasks, until there are enough of them.
async fn run(runner: Rc<Runner>) {
    loop {
        poll_fn(|cx| {
            let aborted = runner.aborted.replace(false);
            let mut job = runner.job.borrow_mut();
            let ended = match job.as_mut() {
                // Idle: an abort is for a stream that has finished already.
                None => false,
                Some(_) if aborted => true,
                // The handles only set flags: nothing reaches the job while it is polled.
                Some(stream) => Pin::new(stream).poll(cx).is_ready(),
            };
            drop(job);
            if ended {
                // Dropped out of the borrow: its drop may wake or end other streams.
                let stream = runner.job.borrow_mut().take();
                drop(stream);
                return Poll::Ready(());
            }
            let mut waker = runner.waker.borrow_mut();
            if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        let kept = IDLE
            .try_with(|idle| {
                let mut idle = idle.borrow_mut();
                let keep = idle.len() < IDLE_KEPT;
                if keep {
                    idle.push(Rc::clone(&runner));
                }
                keep
            })
            .unwrap_or(false);
        if !kept {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// Sets its flag when dropped: the stream's future is gone.
    struct Ended(Rc<Cell<bool>>);

    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }

    fn idle() -> usize {
        IDLE.with(|idle| idle.borrow().len())
    }

    /// Lets the worker's other tasks run until `done` holds, a turn at a time.
    async fn until(done: impl Fn() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the condition never held");
    }

    #[tokio::test]
    async fn a_finished_stream_leaves_its_task_for_the_next() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let first_done = Rc::new(Cell::new(false));
                let done = Rc::clone(&first_done);
                let first = spawn(PooledBox::pin_with(|| async move { done.set(true) }));
                until(|| first_done.get() && idle() == 1).await;
                // An abort after the end is for nothing: the task stays idle, once.
                first.abort();
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                assert_eq!(idle(), 1);
                let second_done = Rc::new(Cell::new(false));
                let done = Rc::clone(&second_done);
                let second = spawn(PooledBox::pin_with(|| async move { done.set(true) }));
                assert_eq!(idle(), 0, "the idle task was not taken");
                assert!(
                    Weak::ptr_eq(&first.runner, &second.runner),
                    "a new task was spawned"
                );
                until(|| second_done.get() && idle() == 1).await;
                // An abort of the finished stream right before the next one is given out
                // does not end the next one.
                second.abort();
                let third_done = Rc::new(Cell::new(false));
                let done = Rc::clone(&third_done);
                let third = spawn(PooledBox::pin_with(|| async move { done.set(true) }));
                assert!(Weak::ptr_eq(&second.runner, &third.runner));
                until(|| third_done.get() && idle() == 1).await;
            })
            .await;
    }

    #[tokio::test]
    async fn a_task_dropped_with_its_local_set_is_not_given_a_stream() {
        let first = tokio::task::LocalSet::new();
        first
            .run_until(async {
                spawn(PooledBox::pin_with(|| async {}));
                until(|| idle() == 1).await;
            })
            .await;
        // Its task goes with the set; the list still holds it.
        drop(first);
        assert_eq!(idle(), 1);
        let second = tokio::task::LocalSet::new();
        second
            .run_until(async {
                let done = Rc::new(Cell::new(false));
                let set = Rc::clone(&done);
                spawn(PooledBox::pin_with(|| async move { set.set(true) }));
                until(|| done.get()).await;
                assert_eq!(idle(), 1, "the dead task is still listed");
            })
            .await;
    }

    #[tokio::test]
    async fn an_abort_drops_its_stream_and_a_stale_handle_ends_nothing() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let dropped = Rc::new(Cell::new(false));
                let guard = Ended(Rc::clone(&dropped));
                let first = spawn(PooledBox::pin_with(|| async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                }));
                // It runs (and waits) first, then is aborted.
                tokio::task::yield_now().await;
                assert!(!dropped.get());
                first.abort();
                until(|| dropped.get() && idle() == 1).await;
                // The same task takes the next stream; the first's handle no longer reaches it.
                let woken = Rc::new(Cell::new(0));
                let (polls, second_dropped) = (Rc::clone(&woken), Rc::new(Cell::new(false)));
                let guard = Ended(Rc::clone(&second_dropped));
                let second = spawn(PooledBox::pin_with(|| {
                    poll_fn(move |cx| {
                        let _ = &guard;
                        polls.set(polls.get() + 1);
                        cx.waker().wake_by_ref();
                        if polls.get() < 5 {
                            Poll::Pending
                        } else {
                            Poll::Ready(())
                        }
                    })
                }));
                assert!(Weak::ptr_eq(&first.runner, &second.runner));
                first.abort();
                until(|| second_dropped.get()).await;
                assert_eq!(woken.get(), 5, "the stale handle ended the next stream");
            })
            .await;
    }

    #[tokio::test]
    async fn tasks_past_the_idle_bound_end() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let open = Rc::new(Cell::new(IDLE_KEPT + 3));
                let gate = Rc::new(Cell::new(false));
                let handles: Vec<_> = (0..IDLE_KEPT + 3)
                    .map(|_| {
                        let (open, gate) = (Rc::clone(&open), Rc::clone(&gate));
                        spawn(PooledBox::pin_with(|| {
                            poll_fn(move |cx| {
                                if gate.get() {
                                    open.set(open.get() - 1);
                                    Poll::Ready(())
                                } else {
                                    cx.waker().wake_by_ref();
                                    Poll::Pending
                                }
                            })
                        }))
                    })
                    .collect();
                tokio::task::yield_now().await;
                gate.set(true);
                until(|| open.get() == 0).await;
                assert_eq!(idle(), IDLE_KEPT);
                // The three past the bound ended: their handles reach nothing.
                let gone = handles
                    .iter()
                    .filter(|h| h.runner.upgrade().is_none())
                    .count();
                assert_eq!(gone, 3);
            })
            .await;
    }
}
