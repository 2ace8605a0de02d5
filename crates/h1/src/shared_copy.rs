//! Small byte strings that must outlive the buffer they come from (the request and response
//! heads read by this crate, the proxy's request ids), copied one after the other into a
//! per-thread chunk and handed out as `Bytes` that share it.
//!
//! One allocation serves a whole chunk of copies, and a chunk whose copies are all gone is
//! reused in place: a worker relaying one request after another allocates nothing for them.
//! The price is that a piece kept long keeps its whole chunk alive, so the chunk is small and
//! large pieces get their own memory. A head that goes to an HTTP/2 peer through the h2 crate
//! is given memory of its own first ([`own_values`]): its HPACK table keeps the values it
//! indexes, shared, for as long as the connection lives. A request served for long (a
//! WebSocket, a long poll) keeps its chunk, as nginx's request keeps its 4 KiB pool.

use std::cell::RefCell;

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};

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

/// Gives `headers`' values memory of their own, one buffer for all of them (two allocations:
/// the buffer and its shared count), so that they no longer keep the chunks they were cut
/// from: for a head whose values may be kept long (an HTTP/2 peer's HPACK table may keep those
/// it indexes as long as the connection lives).
pub fn own_values(headers: &mut HeaderMap) {
    let total: usize = headers.values().map(HeaderValue::len).sum();
    if total == 0 {
        return;
    }
    let mut copy = BytesMut::with_capacity(total);
    for value in headers.values() {
        copy.extend_from_slice(value.as_bytes());
    }
    let copy = copy.freeze();
    let mut at = 0;
    for value in headers.values_mut() {
        let len = value.len();
        // The same bytes, already checked: this cannot fail.
        if let Ok(mut owned) = HeaderValue::from_maybe_shared(copy.slice(at..at + len)) {
            owned.set_sensitive(value.is_sensitive());
            *value = owned;
        }
        at += len;
    }
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
        let mut latest = 0;
        for _ in 0..CHUNK / 100 + 1 {
            latest = copy_shared(&[b'y'; 100]).as_ptr() as usize;
        }
        // A copy still alive keeps its chunk: the next copies went to a new one, and `held`
        // still reads the same.
        assert!(
            !(address..address + CHUNK).contains(&latest),
            "a chunk in use was reused"
        );
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
    fn owned_values_are_the_same_and_no_longer_in_the_chunk() {
        let mut headers = HeaderMap::new();
        let first = HeaderValue::from_maybe_shared(copy_shared(b"text/plain")).unwrap();
        headers.insert("content-type", first.clone());
        headers.append("via", HeaderValue::from_static("1.1 a"));
        let mut secret = HeaderValue::from_maybe_shared(copy_shared(b"Bearer x")).unwrap();
        secret.set_sensitive(true);
        headers.insert("authorization", secret);
        headers.append(
            "via",
            HeaderValue::from_maybe_shared(copy_shared(b"1.1 b")).unwrap(),
        );
        let before = headers.clone();
        own_values(&mut headers);
        assert_eq!(headers, before);
        assert!(headers["authorization"].is_sensitive());
        let chunk = first.as_bytes().as_ptr() as usize;
        for value in headers.values() {
            let at = value.as_bytes().as_ptr() as usize;
            assert!(
                !(chunk..chunk + CHUNK).contains(&at),
                "a value still in the chunk"
            );
        }
    }

    #[test]
    fn large_pieces_get_their_own_memory() {
        let large = vec![7u8; MAX_PIECE + 1];
        assert_eq!(&copy_shared(&large)[..], &large[..]);
    }
}
