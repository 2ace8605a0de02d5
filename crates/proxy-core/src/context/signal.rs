//! A one-way flag for the tasks of one worker: raised once (a listener drains, or its drain
//! time is up), seen by every connection waiting on it.
//!
//! Every connection polls its listener's drain and close flags each time its task wakes, a
//! few times a request. A `tokio::sync::watch` receiver takes a lock on every such poll; here a
//! poll is a `Cell` read and a waker comparison, and a waiter's waker is stored once, not
//! once a poll.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use slab::Slab;

/// The raising side, held by the listener.
#[derive(Clone, Default)]
pub(crate) struct Signal {
    inner: Rc<Inner>,
}

#[derive(Default)]
struct Inner {
    raised: Cell<bool>,
    waiters: RefCell<Slab<Waker>>,
}

/// One task's view of a [`Signal`].
pub(crate) struct SignalWatch {
    inner: Rc<Inner>,
    /// Where this watch's waker is kept while it waits.
    key: Option<usize>,
}

impl Signal {
    /// Raises the flag and wakes every task waiting on it; later watches see it at once.
    pub(crate) fn raise(&self) {
        if self.inner.raised.replace(true) {
            return;
        }
        // Taken out first: a woken task may drop its watch, which borrows the waiters.
        let waiters = std::mem::take(&mut *self.inner.waiters.borrow_mut());
        for (_, waker) in waiters {
            waker.wake();
        }
    }

    pub(crate) fn watch(&self) -> SignalWatch {
        SignalWatch {
            inner: Rc::clone(&self.inner),
            key: None,
        }
    }
}

impl SignalWatch {
    pub(crate) fn is_raised(&self) -> bool {
        self.inner.raised.get()
    }

    /// Ready once the flag is raised.
    pub(crate) fn poll_raised(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.inner.raised.get() {
            return Poll::Ready(());
        }
        let mut waiters = self.inner.waiters.borrow_mut();
        match self.key.and_then(|key| waiters.get_mut(key)) {
            Some(waker) => {
                if !waker.will_wake(cx.waker()) {
                    waker.clone_from(cx.waker());
                }
            }
            None => self.key = Some(waiters.insert(cx.waker().clone())),
        }
        Poll::Pending
    }

    /// Resolves once the flag is raised (at once if it already is).
    pub(crate) async fn raised(&mut self) {
        poll_fn(|cx| self.poll_raised(cx)).await;
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        if let Some(key) = self.key
            && !self.inner.raised.get()
        {
            self.inner.waiters.borrow_mut().try_remove(key);
        }
    }
}

/// A filter chain's own flags, kept across config generations while the chain is there:
/// `drain` raised when the chain is removed (or its listener drains), `close` when the drain
/// time after that is up. Its connections, parked ones included, watch these rather than
/// their listener's.
#[derive(Clone)]
pub(crate) struct ChainSignals {
    /// Tells one chain's signals from another's (the parking lot keys its watches by it).
    pub(crate) id: u64,
    pub(crate) drain: Signal,
    pub(crate) close: Signal,
}

impl ChainSignals {
    pub(crate) fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            drain: Signal::default(),
            close: Signal::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn raising_wakes_each_waiter_once_and_later_watches_see_it() {
        let signal = Signal::default();
        let counts: Vec<_> = (0..3)
            .map(|_| Arc::new(Count(AtomicUsize::new(0))))
            .collect();
        let mut watches: Vec<_> = (0..3).map(|_| signal.watch()).collect();
        for (watch, count) in watches.iter_mut().zip(&counts) {
            let waker = Waker::from(Arc::clone(count));
            let mut cx = Context::from_waker(&waker);
            // Polled twice with the same waker: stored once.
            assert!(watch.poll_raised(&mut cx).is_pending());
            assert!(watch.poll_raised(&mut cx).is_pending());
        }
        assert_eq!(signal.inner.waiters.borrow().len(), 3);
        // A watch dropped while waiting leaves no waker behind.
        drop(watches.pop());
        assert_eq!(signal.inner.waiters.borrow().len(), 2);
        signal.raise();
        let woken: Vec<_> = counts.iter().map(|c| c.0.load(Ordering::SeqCst)).collect();
        assert_eq!(woken, [1, 1, 0]);
        assert!(watches.iter().all(SignalWatch::is_raised));
        let mut late = signal.watch();
        let waker = Waker::from(Arc::clone(&counts[2]));
        assert!(
            late.poll_raised(&mut Context::from_waker(&waker))
                .is_ready()
        );
        // Raising again wakes nobody twice.
        signal.raise();
        assert_eq!(counts[0].0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_new_waker_replaces_the_stored_one() {
        let signal = Signal::default();
        let (a, b) = (
            Arc::new(Count(AtomicUsize::new(0))),
            Arc::new(Count(AtomicUsize::new(0))),
        );
        let mut watch = signal.watch();
        let wa = Waker::from(Arc::clone(&a));
        let wb = Waker::from(Arc::clone(&b));
        assert!(
            watch
                .poll_raised(&mut Context::from_waker(&wa))
                .is_pending()
        );
        assert!(
            watch
                .poll_raised(&mut Context::from_waker(&wb))
                .is_pending()
        );
        signal.raise();
        assert_eq!(a.0.load(Ordering::SeqCst), 0);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        let mut fut = pin!(watch.raised());
        let noop = Waker::noop();
        assert!(fut.as_mut().poll(&mut Context::from_waker(noop)).is_ready());
    }
}
