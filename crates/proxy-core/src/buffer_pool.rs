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

thread_local! {
    static POOL: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for at least [`BUFFER`] bytes.
pub(crate) fn take() -> BytesMut {
    POOL.with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| BytesMut::with_capacity(BUFFER))
}

/// Takes a connection's buffer back, dropping what it holds. One still shared with a request
/// that outlived its exchange, or grown large, is freed instead.
pub(crate) fn give(mut buf: BytesMut) {
    if buf.capacity() == 0 {
        return;
    }
    buf.clear();
    if buf.try_reclaim(BUFFER) && buf.capacity() <= MAX_POOLED_CAPACITY {
        let refused = POOL.with_borrow_mut(|pool| {
            if pool.len() < MAX_POOLED {
                pool.push(buf);
                None
            } else {
                Some(buf)
            }
        });
        if refused.is_none() {
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
        POOL.with_borrow_mut(Vec::clear);
        let mut shared = take();
        shared.extend_from_slice(&[b'x'; BUFFER]);
        let head = shared.split_to(BUFFER - 10).freeze();
        give(shared);
        assert_eq!(POOL.with_borrow(Vec::len), 0, "its start is still in use");
        drop(head);

        let mut grown = take();
        grown.reserve(4 * BUFFER);
        give(grown);
        assert_eq!(POOL.with_borrow(Vec::len), 0);

        for _ in 0..MAX_POOLED + 10 {
            give(BytesMut::with_capacity(BUFFER));
        }
        assert_eq!(POOL.with_borrow(Vec::len), MAX_POOLED);
    }
}
