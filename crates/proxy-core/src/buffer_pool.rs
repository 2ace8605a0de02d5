//! A worker's HTTP/1.1 buffers: read buffers for client and upstream connections alike, and
//! the buffer a response is gathered in while it is written. A connection
//! holds one only while it reads a message or has unread bytes (a pipelined request, a body
//! being read); between messages it gives it back. So an idle connection holds no buffer, and a busy worker cycles a few
//! buffers that stay in cache instead of freeing and allocating one per request.
//!
//! It also keeps idle memory low. Freed, these page-sized buffers would leave holes between
//! the connections' small long-lived allocations. A hole smaller than two pages spans no
//! whole page the allocator could give back to the system. Measured: ~5 KB resident per idle
//! connection when each connection freed its own buffer.

use std::cell::RefCell;

use bytes::BytesMut;

/// A buffer's size: what the first read of a request asks room for (most heads fit).
pub(crate) const BUFFER: usize = 4096;

/// Buffers kept per worker: 1 MiB at most. More in use at once are freed when given back.
const MAX_POOLED: usize = 256;

/// A buffer that grew past this (a large head, a body read) is freed rather than kept.
const MAX_POOLED_CAPACITY: usize = 2 * BUFFER;

/// How often buffers that sat unused are freed ([`release_unused`]).
pub(crate) const RELEASE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

struct Pool {
    buffers: Vec<BytesMut>,
    /// The fewest buffers the pool held since the last release: that many went unused.
    low: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = const {
        RefCell::new(Pool {
            buffers: Vec::new(),
            low: 0,
        })
    };
}

/// An empty buffer with room for at least [`BUFFER`] bytes.
pub(crate) fn take() -> BytesMut {
    POOL.with_borrow_mut(|pool| {
        let buffer = pool.buffers.pop();
        pool.low = pool.low.min(pool.buffers.len());
        buffer
    })
    .unwrap_or_else(|| BytesMut::with_capacity(BUFFER))
}

/// Frees the buffers none of this worker's connections took since the last call: a worker
/// that went quiet after a burst keeps no megabyte of buffers for nothing, and one in steady
/// use keeps what it uses. Called every [`RELEASE_EVERY`].
pub(crate) fn release_unused() {
    let freed = POOL.with_borrow_mut(|pool| {
        let unused = pool.low;
        let keep = pool.buffers.len() - unused;
        let freed: Vec<BytesMut> = pool.buffers.drain(..unused).collect();
        debug_assert_eq!(pool.buffers.len(), keep);
        pool.low = pool.buffers.len();
        freed
    });
    for _ in &freed {
        crate::memory::codec_released();
    }
    // Freed outside the pool's borrow.
    drop(freed);
}

/// Takes a connection's buffer back, dropping what it holds. One still shared with a request
/// that outlived its exchange, or grown large, is freed instead.
pub(crate) fn give(mut buf: BytesMut) {
    if buf.capacity() == 0 {
        return;
    }
    buf.clear();
    if buf.try_reclaim(BUFFER) && buf.capacity() <= MAX_POOLED_CAPACITY {
        // `try_with`: a buffer can be given back from a drop while the thread exits, after
        // its pool is gone; it is freed then.
        let kept = POOL.try_with(|pool| {
            let mut pool = pool.borrow_mut();
            if pool.buffers.len() < MAX_POOLED {
                pool.buffers.push(std::mem::take(&mut buf));
                true
            } else {
                false
            }
        });
        if kept == Ok(true) {
            return;
        }
    }
    crate::memory::codec_released();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_is_taken_again_empty_with_its_room() {
        let mut buf = take();
        assert!(buf.capacity() >= BUFFER);
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n\r\nleftover");
        // The head goes its own way, as the codec splits it off.
        let head = buf.split_to(18).freeze();
        let address = buf.as_ptr();
        drop(head);
        give(buf);
        let again = take();
        assert!(again.is_empty());
        assert!(again.capacity() >= BUFFER);
        // The same allocation, reclaimed from its start.
        assert_eq!(again.as_ptr(), address.wrapping_sub(18));
        give(again);
    }

    #[test]
    fn shared_or_grown_buffers_are_not_kept() {
        POOL.with_borrow_mut(|pool| pool.buffers.clear());
        let mut shared = take();
        shared.extend_from_slice(&[b'x'; BUFFER]);
        let head = shared.split_to(BUFFER - 10).freeze();
        give(shared);
        assert_eq!(
            POOL.with_borrow(|pool| pool.buffers.len()),
            0,
            "its start is still in use"
        );
        drop(head);

        let mut grown = take();
        grown.reserve(4 * BUFFER);
        give(grown);
        assert_eq!(POOL.with_borrow(|pool| pool.buffers.len()), 0);

        for _ in 0..MAX_POOLED + 10 {
            give(BytesMut::with_capacity(BUFFER));
        }
        assert_eq!(POOL.with_borrow(|pool| pool.buffers.len()), MAX_POOLED);
    }

    #[test]
    fn buffers_unused_for_a_round_are_freed() {
        let len = || POOL.with_borrow(|pool| pool.buffers.len());
        POOL.with_borrow_mut(|pool| pool.buffers.clear());
        release_unused();
        for _ in 0..10 {
            give(BytesMut::with_capacity(BUFFER));
        }
        // Given during the round: not yet unused for a whole one.
        release_unused();
        assert_eq!(len(), 10);
        // Up to 3 in use at once during the round: 7 never left the pool.
        let taken: Vec<BytesMut> = (0..3).map(|_| take()).collect();
        taken.into_iter().for_each(give);
        release_unused();
        assert_eq!(len(), 3);
        // A round without any use frees the rest.
        release_unused();
        assert_eq!(len(), 0);
    }
}
