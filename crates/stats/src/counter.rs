//! [`Counter`]: a worker's handle on one counter series; `inc` is a load and a store.

use std::fmt;
use std::sync::Arc;

use crate::cell::{NotSync, Slot};

/// A monotonic count, written by the one thread that holds this handle.
///
/// Obtained once per (family, label values) from [`Shard::counter`](crate::Shard::counter),
/// typically when the worker starts or its config is swapped; recording then does no lookup,
/// no allocation and no atomic read-modify-write. The handle is `Send` but neither `Sync` nor
/// `Clone` (see the crate docs on the single-writer invariant): share it within the worker
/// through `Rc` or a plain reference.
///
/// Dropping the handle keeps the count in the registry; the next handle the same shard
/// creates for the same series continues from it, unless the series was retired meanwhile
/// ([`Registry::retire_unheld`](crate::Registry::retire_unheld)).
///
/// ```compile_fail
/// fn shared_across_threads<T: Sync>() {}
/// shared_across_threads::<stats::Counter>();
/// ```
pub struct Counter {
    slot: Arc<Slot>,
    _not_sync: NotSync,
}

impl Counter {
    pub(crate) fn new(slot: Arc<Slot>) -> Self {
        Self {
            slot,
            _not_sync: NotSync::default(),
        }
    }

    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.slot.add(1);
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.slot.add(n);
    }

    /// This handle's own count (not the series' total over shards: take a
    /// [`Snapshot`](crate::Snapshot) for that).
    pub fn get(&self) -> u64 {
        self.slot.get()
    }
}

impl fmt::Debug for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counter")
            .field("value", &self.get())
            .finish()
    }
}
