//! Per-thread spares of what a connection holds only while it has something to do: its
//! output buffer and its queues. An idle connection holds none of them, and a busy one does
//! not allocate them anew (and grow them again) for each burst of requests. The codec's
//! connection keeps its queues and output here; the proxy keeps its map of a connection's
//! streams the same way.
//!
//! ```
//! use http2::spares::{self, Spares};
//!
//! thread_local! {
//!     static BUFFERS: Spares<Vec<u8>> = const { Spares::new() };
//! }
//!
//! let mut buffer = spares::take(&BUFFERS).unwrap_or_else(|| Vec::with_capacity(4096));
//! buffer.extend_from_slice(b"busy");
//! // Done with it: emptied, and kept for the next taker (up to 8 per thread).
//! buffer.clear();
//! spares::give(&BUFFERS, buffer, 8);
//! assert_eq!(spares::take(&BUFFERS).map(|b| b.capacity()), Some(4096));
//! ```

use std::cell::RefCell;
use std::thread::LocalKey;

/// A thread's spares of one kind, emptied by those who gave them.
pub struct Spares<T>(RefCell<Vec<T>>);

impl<T> Default for Spares<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Spares<T> {
    pub const fn new() -> Self {
        Self(RefCell::new(Vec::new()))
    }
}

/// A spare, if the thread has one.
pub fn take<T: 'static>(spares: &'static LocalKey<Spares<T>>) -> Option<T> {
    spares
        .try_with(|spares| spares.0.borrow_mut().pop())
        .ok()
        .flatten()
}

/// Keeps `spare` for the next taker while the thread has fewer than `kept`; frees it
/// otherwise.
pub fn give<T: 'static>(spares: &'static LocalKey<Spares<T>>, spare: T, kept: usize) {
    // At thread exit the spares may be gone: the spare is freed then.
    let mut spare = Some(spare);
    let _ = spares.try_with(|spares| {
        let mut spares = spares.0.borrow_mut();
        if spares.len() < kept {
            spares.extend(spare.take());
        }
    });
    // Freed outside the borrow.
    drop(spare);
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static KEPT: Spares<Vec<u8>> = const { Spares::new() };
    }

    #[test]
    fn spares_are_kept_up_to_the_bound_and_taken_back() {
        assert_eq!(take(&KEPT), None);
        for n in 1..=3 {
            give(&KEPT, Vec::with_capacity(n * 8), 2);
        }
        // The third was freed; the last kept comes back first.
        assert_eq!(take(&KEPT).map(|v| v.capacity()), Some(16));
        assert_eq!(take(&KEPT).map(|v| v.capacity()), Some(8));
        assert_eq!(take(&KEPT), None);
    }
}
