//! Gauges: [`Gauge`], a worker's single-writer handle, and [`SharedGauge`], for the rare value
//! that several threads move.
//!
//! A gauge series' value is the sum of its cells over all shards (e.g. open connections: each
//! worker counts its own, the total is their sum).

use std::fmt;
use std::sync::Arc;

use crate::cell::{NotSync, Slot};

/// A value that goes up and down, written by the one thread that holds this handle.
///
/// Same rules as [`Counter`](crate::Counter): obtained once from
/// [`Shard::gauge`](crate::Shard::gauge), `Send` but neither `Sync` nor `Clone`, and the value
/// outlives the handle.
///
/// ```compile_fail
/// fn shared_across_threads<T: Sync>() {}
/// shared_across_threads::<stats::Gauge>();
/// ```
pub struct Gauge {
    slot: Arc<Slot>,
    _not_sync: NotSync,
}

impl Gauge {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        Self {
            slot,
            _not_sync: NotSync::default(),
        }
    }

    /// Sets this handle's value.
    #[inline]
    pub fn set(&self, v: i64) {
        self.slot.set(v as u64);
    }

    /// Adds `delta` (which may be negative).
    #[inline]
    pub fn add(&self, delta: i64) {
        // Two's complement: adding the bits of a negative i64 subtracts.
        self.slot.add(delta as u64);
    }

    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Subtracts one.
    #[inline]
    pub fn dec(&self) {
        self.add(-1);
    }

    /// This handle's own value (not the series' total over shards).
    pub fn get(&self) -> i64 {
        self.slot.get() as i64
    }
}

impl fmt::Debug for Gauge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gauge").field("value", &self.get()).finish()
    }
}

/// A gauge that several threads update: `Clone + Send + Sync`, each update one `fetch_add`.
///
/// For values no single worker owns, such as a count the main thread and the workers both
/// move. Every [`Shard::shared_gauge`](crate::Shard::shared_gauge) call for the same series on
/// the same shard returns the same cell.
#[derive(Clone)]
pub struct SharedGauge {
    slot: Arc<Slot>,
}

impl SharedGauge {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        Self { slot }
    }

    /// Sets the value (a plain store: racing `set`s keep one of the values).
    pub fn set(&self, v: i64) {
        self.slot.set(v as u64);
    }

    /// Adds `delta` (which may be negative) atomically.
    pub fn add(&self, delta: i64) {
        self.slot.fetch_add(delta as u64);
    }

    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// Subtracts one.
    pub fn dec(&self) {
        self.add(-1);
    }

    /// The current value of this cell.
    pub fn get(&self) -> i64 {
        self.slot.get() as i64
    }
}

impl fmt::Debug for SharedGauge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedGauge")
            .field("value", &self.get())
            .finish()
    }
}
