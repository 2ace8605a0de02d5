//! Boxes for the futures a worker starts once per request and keeps apart from the
//! connection's own state (an HTTP/1.1 exchange, an HTTP/2 stream, a retry loop), from a
//! per-worker pool.
//!
//! An exchange's state is boxed so that a parked connection does not carry it, but a box per
//! request is a malloc and a free of a few KiB on every request. [`PooledBox`] takes its memory
//! from the worker's pool and gives it back when the future is dropped: a busy worker reuses a
//! few blocks, which stay in cache, and allocates nothing.

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

/// Free blocks kept per worker and per layout; more in use at once are freed when given back.
/// An HTTP/2 stream takes two (its handler's and its task's). A worker with a hundred
/// requests in flight (128 HTTP/1.1 clients, or 8 HTTP/2 clients of 10 streams) overflowed a
/// pool of 64 and went back to malloc and free for a block of 4 to 6 KiB on many requests:
/// blocks are kept only once that many were in use at once.
const KEPT: usize = 256;

/// Layouts pooled per worker: one per kind of future that uses the pool (an HTTP/1.1 exchange,
/// an HTTP/2 stream's task and its handler, a retry loop, a traced try, an HTTP/2 upstream
/// send), with room for more.
const LAYOUTS: usize = 12;

struct Pool {
    /// Free blocks, by layout.
    free: Vec<Blocks>,
}

/// The free blocks of one layout.
struct Blocks {
    layout: Layout,
    free: Vec<NonNull<u8>>,
    /// The fewest free blocks since the last release: that many went unused.
    low: usize,
}

impl Pool {
    fn take(&mut self, layout: Layout) -> Option<NonNull<u8>> {
        let blocks = self
            .free
            .iter_mut()
            .find(|blocks| blocks.layout == layout)?;
        let block = blocks.free.pop();
        blocks.low = blocks.low.min(blocks.free.len());
        block
    }

    /// Keeps `block`, or gives it back to the caller to free.
    fn give(&mut self, layout: Layout, block: NonNull<u8>) -> Option<NonNull<u8>> {
        let index = match self.free.iter().position(|blocks| blocks.layout == layout) {
            Some(index) => index,
            None if self.free.len() < LAYOUTS => {
                self.free.push(Blocks {
                    layout,
                    free: Vec::new(),
                    low: 0,
                });
                self.free.len() - 1
            }
            None => return Some(block),
        };
        let blocks = &mut self.free[index].free;
        if blocks.len() < KEPT {
            blocks.push(block);
            None
        } else {
            Some(block)
        }
    }
}

#[allow(unsafe_code)]
impl Drop for Pool {
    fn drop(&mut self) {
        for Blocks { layout, free, .. } in self.free.drain(..) {
            for block in free {
                // SAFETY: every block in the pool was allocated with the layout it is listed
                // under, and is not in use (it was given back).
                unsafe { alloc::dealloc(block.as_ptr(), layout) };
            }
        }
    }
}

/// Frees this thread's blocks that sat unused since the last call (the fewest free at once
/// since then), so that a burst's blocks do not stay after it: the worker calls it every
/// [`crate::buffer_pool::RELEASE_EVERY`]. A steady load keeps what it uses.
#[allow(unsafe_code)]
pub(crate) fn release_unused() {
    let _ = POOL.try_with(|pool| {
        for blocks in &mut pool.borrow_mut().free {
            let (unused, layout) = (blocks.low, blocks.layout);
            for block in blocks.free.drain(..unused) {
                // SAFETY: as in `Drop for Pool`: allocated with this layout, not in use.
                unsafe { alloc::dealloc(block.as_ptr(), layout) };
            }
            blocks.low = blocks.free.len();
        }
    });
}

thread_local! {
    static POOL: RefCell<Pool> = const { RefCell::new(Pool { free: Vec::new() }) };
}

/// A future in a block of memory from the worker's pool: a `Pin<Box<F>>` whose memory is
/// reused. `F` may be a `dyn Future` ([`PooledBox::erased`]), for a place that holds futures of
/// several types.
pub(crate) struct PooledBox<F: ?Sized> {
    future: NonNull<F>,
    /// It owns an `F` (for the drop check), and is neither `Send` nor `Sync`: the pool is the
    /// thread's.
    _owns: PhantomData<F>,
}

#[allow(unsafe_code)]
impl<F: Future> PooledBox<F> {
    /// The future `make` returns, in a block from the worker's pool. Made once its block is
    /// there: the compiler can then build it in the block, where a future passed in would be
    /// copied in whole (a future's size is that of its largest state, however little its
    /// first state holds: 340 instructions an HTTP/1.1 exchange).
    #[inline(always)]
    pub(crate) fn pin_with(make: impl FnOnce() -> F) -> Self {
        let layout = Layout::new::<F>();
        if layout.size() == 0 {
            let at = NonNull::<F>::dangling();
            // SAFETY: a dangling, aligned pointer is valid for a zero-sized write.
            unsafe { at.as_ptr().write(make()) };
            return Self {
                future: at,
                _owns: PhantomData,
            };
        }
        let block = POOL
            .try_with(|pool| pool.borrow_mut().take(layout))
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                // SAFETY: the layout's size is not zero.
                let block = unsafe { alloc::alloc(layout) };
                NonNull::new(block).unwrap_or_else(|| alloc::handle_alloc_error(layout))
            });
        let at = block.cast::<F>();
        // SAFETY: the block is unused, and sized and aligned for an `F`.
        unsafe { at.as_ptr().write(make()) };
        Self {
            future: at,
            _owns: PhantomData,
        }
    }

    /// The same box, its future's type erased: no allocation, unlike a `Box<dyn Future>`.
    pub(crate) fn erased(self) -> PooledBox<dyn Future<Output = F::Output>>
    where
        F: 'static,
    {
        let this = std::mem::ManuallyDrop::new(self);
        PooledBox {
            future: this.future,
            _owns: PhantomData,
        }
    }
}

// The future stays where it was written until it is dropped in place: moving the box moves
// only the pointer, as with `Pin<Box<F>>`.
impl<F: ?Sized> Unpin for PooledBox<F> {}

#[allow(unsafe_code)]
impl<F: Future + ?Sized> Future for PooledBox<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: the future is valid until the box is dropped and never moves (see `Unpin`
        // above); `&mut self` makes this the only reference to it.
        unsafe { Pin::new_unchecked(&mut *self.future.as_ptr()) }.poll(cx)
    }
}

#[allow(unsafe_code)]
impl<F: ?Sized> Drop for PooledBox<F> {
    fn drop(&mut self) {
        // The layout it was made with, read before the future is dropped (from its type's
        // vtable when erased).
        // SAFETY: the future is valid until dropped just below.
        let layout = Layout::for_value(unsafe { self.future.as_ref() });
        // SAFETY: the future was written in `pin_with` and is dropped only here, once.
        unsafe { std::ptr::drop_in_place(self.future.as_ptr()) };
        if layout.size() == 0 {
            return;
        }
        let block = self.future.cast::<u8>();
        // At thread exit the pool may be gone already: the block is freed then.
        let refused = POOL
            .try_with(|pool| pool.borrow_mut().give(layout, block))
            .unwrap_or(Some(block));
        if let Some(block) = refused {
            // SAFETY: allocated in `pin` with this layout, and no longer in use.
            unsafe { alloc::dealloc(block.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::task::Waker;

    use super::*;

    fn poll_once<F: Future>(future: &mut PooledBox<F>) -> Poll<F::Output> {
        Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn a_future_runs_to_its_end_and_its_block_is_reused() {
        let state = [7u8; 300];
        let mut first =
            PooledBox::pin_with(|| async move { state.iter().map(|&b| u32::from(b)).sum() });
        let address = first.future.as_ptr() as usize;
        assert_eq!(poll_once(&mut first), Poll::Ready(2100u32));
        drop(first);
        let state = [1u8; 300];
        let mut second =
            PooledBox::pin_with(|| async move { state.iter().map(|&b| u32::from(b)).sum() });
        assert_eq!(
            second.future.as_ptr() as usize,
            address,
            "the block was not reused"
        );
        assert_eq!(poll_once(&mut second), Poll::Ready(300u32));
    }

    #[test]
    fn a_future_dropped_while_waiting_drops_what_it_holds() {
        let held = Rc::new(Cell::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let counted = Rc::clone(&held);
        let mut waiting = PooledBox::pin_with(|| async move {
            let _ = rx.await;
            counted.set(1);
        });
        assert_eq!(poll_once(&mut waiting), Poll::Pending);
        assert_eq!(Rc::strong_count(&held), 2);
        drop(waiting);
        assert_eq!(
            Rc::strong_count(&held),
            1,
            "the future's state was not dropped"
        );
        assert_eq!(held.get(), 0);
        drop(tx);
    }

    #[test]
    fn an_erased_future_runs_drops_and_gives_its_block_back() {
        let held = Rc::new(Cell::new(0));
        let counted = Rc::clone(&held);
        let state = [3u8; 200];
        let make = move || async move {
            counted.set(1);
            state.iter().map(|&b| u32::from(b)).sum::<u32>()
        };
        let typed = PooledBox::pin_with(make.clone());
        let address = typed.future.as_ptr() as usize;
        let mut erased: PooledBox<dyn Future<Output = u32>> = typed.erased();
        assert_eq!(
            Pin::new(&mut erased).poll(&mut Context::from_waker(Waker::noop())),
            Poll::Ready(600)
        );
        assert_eq!(held.get(), 1);
        drop(erased);
        assert_eq!(Rc::strong_count(&held), 2, "the closure's copy is left");
        // Given back under its own layout: the same type's next box takes it.
        let again = PooledBox::pin_with(make);
        assert_eq!(
            again.future.as_ptr() as usize,
            address,
            "the block was not reused"
        );
    }

    #[test]
    fn blocks_beyond_the_pool_are_freed_and_layouts_are_kept_apart() {
        let futures: Vec<_> = (0..KEPT as u64 + 10)
            .map(|i| PooledBox::pin_with(|| std::future::ready(i)))
            .collect();
        drop(futures);
        let kept = POOL.with_borrow(|pool| {
            pool.free
                .iter()
                .find(|blocks| blocks.layout == Layout::new::<std::future::Ready<u64>>())
                .map_or(0, |blocks| blocks.free.len())
        });
        assert_eq!(kept, KEPT);
        // Another layout gets a block of its own, not one of those.
        let pooled: Vec<usize> = POOL.with_borrow(|pool| {
            pool.free
                .iter()
                .flat_map(|blocks| blocks.free.iter().map(|b| b.as_ptr() as usize))
                .collect()
        });
        let mut other = PooledBox::pin_with(|| std::future::ready(1u8));
        assert!(!pooled.contains(&(other.future.as_ptr() as usize)));
        assert_eq!(poll_once(&mut other), Poll::Ready(1u8));
        let still_kept = POOL.with_borrow(|pool| {
            pool.free
                .iter()
                .find(|blocks| blocks.layout == Layout::new::<std::future::Ready<u64>>())
                .map_or(0, |blocks| blocks.free.len())
        });
        assert_eq!(still_kept, KEPT);
    }

    #[test]
    fn blocks_unused_for_a_round_are_freed() {
        let kept = || {
            POOL.with_borrow(|pool| {
                pool.free
                    .iter()
                    .find(|blocks| blocks.layout == Layout::new::<std::future::Ready<u16>>())
                    .map_or(0, |blocks| blocks.free.len())
            })
        };
        // `n` futures in their boxes at once, then dropped.
        let use_at_once = |n: u16| {
            let futures: Vec<_> = (0..n)
                .map(|i| PooledBox::pin_with(|| std::future::ready(i)))
                .collect();
            drop(futures);
        };
        use_at_once(10);
        // Given back during the round: not yet unused for a whole one.
        release_unused();
        assert_eq!(kept(), 10);
        // Up to 3 in use at once during the next round: 7 never left the pool.
        use_at_once(3);
        release_unused();
        assert_eq!(kept(), 3);
        // A round without any use frees the rest.
        release_unused();
        assert_eq!(kept(), 0);
    }
}
