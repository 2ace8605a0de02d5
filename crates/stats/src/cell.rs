//! The single-writer cell: an `AtomicU64` that exactly one thread writes and any thread reads.
//!
//! Every recorded value lives in such a cell. Its writer updates it with `load(Relaxed)` then
//! `store(Relaxed)`: no read-modify-write instruction, so no `lock` prefix on x86 and no
//! exclusive-monitor loop on ARM. It costs what a `Cell<u64>` costs, yet the scraper may load
//! it from another thread at any time without a lock.
//!
//! **Invariant: one writer per cell.** Two writers doing load + store could lose each other's
//! updates (never memory safety, only counts). The types uphold it:
//!
//! - each handle ([`Counter`](crate::Counter), [`Gauge`](crate::Gauge),
//!   [`Histogram`](crate::Histogram)) owns its cells alone: the registry hands a cell to at most
//!   one live handle, and gives a second handle for the same series a cell of its own;
//! - a handle is `Send` (build it anywhere, move it to its worker) but neither `Clone` nor
//!   `Sync`, so its `&self` methods can only run on the one thread that holds it. Sharing one
//!   across threads takes a `Mutex`, whose lock orders the writes.
//!
//! [`SharedGauge`](crate::SharedGauge) is the one exception: several parties update it, so it
//! pays for `fetch_add`.
//!
//! Cells are padded to 128 bytes (two cache lines, as the adjacent-line prefetcher pairs them):
//! two workers' cells never share a line, so recording never bounces a line between cores.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Makes a handle `!Sync` while leaving it `Send`: `std::cell::Cell<()>` is exactly that.
pub(crate) type NotSync = PhantomData<std::cell::Cell<()>>;

/// One `u64` on cache lines of its own. Counters store their count; gauges store the bits of
/// an `i64`.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct Slot {
    value: AtomicU64,
}

impl Slot {
    /// Single-writer add: only the cell's one writer may call this.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        // Relaxed: readers only need a recent value at scrape; this thread is the only writer,
        // so its own load always sees its own last store.
        self.value
            .store(self.value.load(Relaxed).wrapping_add(n), Relaxed);
    }

    /// Single-writer store.
    #[inline]
    pub(crate) fn set(&self, v: u64) {
        self.value.store(v, Relaxed);
    }

    /// Multi-writer add, for [`SharedGauge`](crate::SharedGauge) only.
    #[inline]
    pub(crate) fn fetch_add(&self, n: u64) {
        self.value.fetch_add(n, Relaxed);
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.value.load(Relaxed)
    }
}
