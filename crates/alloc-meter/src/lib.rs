//! A counting global allocator, for the tests that hold a path to a number of allocations
//! (the balancer's picks, the filter chain, the HTTP/1.1 codec's heads, a whole proxied
//! request). It forwards every call to the system allocator and counts allocations per thread,
//! so tests running on other threads do not disturb the count, and in all threads together, for
//! a path that runs on threads the test does not own (a proxy's worker).
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: alloc_meter::Counting = alloc_meter::Counting;
//!
//! fn main() {
//!     let none: Vec<u8> = Vec::new();
//!     assert_eq!(alloc_meter::allocations_during(|| drop(std::hint::black_box(none))), 0);
//!     assert!(alloc_meter::allocations_during(|| drop(std::hint::black_box(vec![1u8; 8]))) > 0);
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static ALL_THREADS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    /// Bytes this thread allocated minus those it freed (wrapping: a thread may free what
    /// another allocated).
    static NET_BYTES: Cell<u64> = const { Cell::new(0) };
}

/// Install it with `#[global_allocator]` in the test binary.
pub struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialized thread-local Cell, which neither allocates nor re-enters the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        grow(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrink(layout.size());
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        shrink(layout.size());
        grow(new_size);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count() {
    ALLOCATIONS.with(|c| c.set(c.get() + 1));
    ALL_THREADS.fetch_add(1, Ordering::Relaxed);
}

fn grow(bytes: usize) {
    NET_BYTES.with(|c| c.set(c.get().wrapping_add(bytes as u64)));
}

fn shrink(bytes: usize) {
    NET_BYTES.with(|c| c.set(c.get().wrapping_sub(bytes as u64)));
}

/// Bytes this thread allocated while running `f` and had not freed by its end (negative: it
/// freed more than it allocated). Exact when `f` allocates and frees on this thread only.
pub fn bytes_kept_during(f: impl FnOnce()) -> i64 {
    let before = NET_BYTES.with(Cell::get);
    f();
    NET_BYTES.with(Cell::get).wrapping_sub(before) as i64
}

/// Allocations (and reallocations) made by this thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Allocations this thread made while running `f`.
pub fn allocations_during(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

/// Allocations (and reallocations) made by all threads of the process so far.
pub fn allocations_all_threads() -> u64 {
    ALL_THREADS.load(Ordering::Relaxed)
}
