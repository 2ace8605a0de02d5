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
}

/// Install it with `#[global_allocator]` in the test binary.
pub struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialized thread-local Cell, which neither allocates nor re-enters the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count() {
    ALLOCATIONS.with(|c| c.set(c.get() + 1));
    ALL_THREADS.fetch_add(1, Ordering::Relaxed);
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
