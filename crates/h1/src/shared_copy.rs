//! Small byte strings that must outlive the buffer they come from (the request and response
//! heads read by this crate, the proxy's request ids), copied one after the other into a
//! per-thread chunk and handed out as `Bytes` that share it.
//!
//! One allocation serves a whole chunk of copies, and a chunk whose copies are all gone is
//! reused in place: a worker relaying one request after another allocates nothing for them.
//! The price is that a copy kept long (a header value in an HTTP/2 peer's HPACK table, say)
//! keeps its whole chunk alive, so the chunk is small and large pieces get their own memory.

use std::cell::RefCell;

use bytes::{Buf, Bytes, BytesMut};

/// A chunk's size.
const CHUNK: usize = 4096;

/// Pieces larger than this are copied on their own: a chunk takes at least four pieces.
const MAX_PIECE: usize = CHUNK / 4;

thread_local! {
    static CHUNK_IN_USE: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `bytes`, copied into this thread's chunk.
pub fn copy_shared(bytes: &[u8]) -> Bytes {
    if bytes.len() > MAX_PIECE {
        return Bytes::copy_from_slice(bytes);
    }
    CHUNK_IN_USE.with_borrow_mut(|chunk| {
        // Reclaimed in place when nothing cut from the chunk is alive any more; a new chunk
        // otherwise (the old one is freed with its last copy).
        if chunk.capacity() < bytes.len() && !chunk.try_reclaim(CHUNK) {
            *chunk = BytesMut::with_capacity(CHUNK);
        }
        chunk.extend_from_slice(bytes);
        chunk.split().freeze()
    })
}

/// The first `n` bytes of `buf` (a read buffer), taken out of it: a small piece of a body is
/// copied into the chunk, so that the buffer stays its connection's alone and is refilled in
/// place; a large one is split off without a copy (the buffer is then replaced when it is
/// refilled, once for many bytes).
pub(crate) fn take_front(buf: &mut BytesMut, n: usize) -> Bytes {
    if n <= MAX_PIECE {
        let piece = copy_shared(&buf[..n]);
        buf.advance(n);
        piece
    } else {
        buf.split_to(n).freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_whole_and_independent_across_chunks() {
        let pieces: Vec<Vec<u8>> = (0..200u32)
            .map(|i| (0..(i % 300) as u8).map(|b| b ^ i as u8).collect())
            .collect();
        let copies: Vec<Bytes> = pieces.iter().map(|p| copy_shared(p)).collect();
        for (piece, copy) in pieces.iter().zip(&copies) {
            assert_eq!(&copy[..], &piece[..]);
        }
    }

    #[test]
    fn a_chunk_whose_copies_are_gone_is_reused() {
        let first = copy_shared(b"first");
        let address = first.as_ptr() as usize;
        drop(first);
        // Fill the chunk up; each copy is dropped before the next, as a worker's heads are.
        let mut last = 0;
        for _ in 0..CHUNK / 100 + 1 {
            last = copy_shared(&[b'x'; 100]).as_ptr() as usize;
        }
        // The chunk was exhausted, then reclaimed: the latest copy is at its start again.
        assert!(
            last >= address && last < address + CHUNK,
            "a new chunk was allocated"
        );
        let held = copy_shared(b"held");
        for _ in 0..CHUNK / 100 + 1 {
            drop(copy_shared(&[b'y'; 100]));
        }
        // A copy still alive keeps its chunk: the next copies went to a new one, and `held`
        // still reads the same.
        assert_eq!(&held[..], b"held");
    }

    #[test]
    fn a_piece_taken_from_a_buffer_leaves_the_rest() {
        for n in [0, 5, MAX_PIECE, MAX_PIECE + 1, 3000] {
            let data: Vec<u8> = (0..4000u32).map(|i| i as u8).collect();
            let mut buf = BytesMut::from(&data[..]);
            let piece = take_front(&mut buf, n);
            assert_eq!(&piece[..], &data[..n]);
            assert_eq!(&buf[..], &data[n..]);
        }
    }

    #[test]
    fn large_pieces_get_their_own_memory() {
        let large = vec![7u8; MAX_PIECE + 1];
        assert_eq!(&copy_shared(&large)[..], &large[..]);
    }
}
