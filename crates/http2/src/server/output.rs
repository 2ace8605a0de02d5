//! The bytes a connection has to write: frames encoded in one buffer, with DATA payloads
//! queued beside it as they are (not copied), gathered into one vectored write.
//!
//! The buffer is cut into runs by the payloads between them without being split (a split
//! buffer is shared, which costs an allocation). The buffer and the queue of pieces come from
//! per-thread spares while there is something to write: an idle connection holds neither, and
//! a busy one does not allocate them per write.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

use crate::spares::{self, Spares};

#[derive(Debug, Default)]
pub(super) struct Output {
    /// What comes before `buf`'s bytes not yet in a run, in order.
    pieces: VecDeque<Piece>,
    /// The payloads' bytes in `pieces`.
    payload_len: usize,
    /// The frames' bytes in `pieces`' runs.
    runs_len: usize,
    /// Frames encoded, not yet written.
    buf: BytesMut,
}

#[derive(Debug)]
enum Piece {
    /// The next bytes of `buf`.
    Run(usize),
    Payload(Bytes),
}

impl Output {
    /// The buffer to encode frames into (after every payload queued so far).
    pub(super) fn buf(&mut self) -> &mut BytesMut {
        if self.buf.capacity() == 0 {
            self.buf = spare::take();
        }
        &mut self.buf
    }

    /// Queues a payload after the frames encoded so far.
    pub(super) fn payload(&mut self, payload: Bytes) {
        if payload.is_empty() {
            return;
        }
        if self.pieces.capacity() == 0
            && let Some(pieces) = spares::take(&spare::PIECES)
        {
            self.pieces = pieces;
        }
        let unqueued = self.buf.len() - self.runs_len;
        if unqueued > 0 {
            self.pieces.push_back(Piece::Run(unqueued));
            self.runs_len += unqueued;
        }
        self.payload_len += payload.len();
        self.pieces.push_back(Piece::Payload(payload));
    }

    pub(super) fn len(&self) -> usize {
        self.payload_len + self.buf.len()
    }

    /// Fills `dst` with the bytes to write next; returns how many slices it filled.
    pub(super) fn slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let mut at = 0;
        let pieces = self.pieces.iter().map(|piece| match piece {
            Piece::Run(len) => {
                at += len;
                &self.buf[at - len..at]
            }
            Piece::Payload(payload) => &payload[..],
        });
        let mut slots = dst.iter_mut();
        for piece in pieces {
            let Some(slot) = slots.next() else {
                return n;
            };
            *slot = IoSlice::new(piece);
            n += 1;
        }
        if at < self.buf.len()
            && let Some(slot) = slots.next()
        {
            *slot = IoSlice::new(&self.buf[at..]);
            n += 1;
        }
        n
    }

    /// `n` bytes were written.
    pub(super) fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.pieces.front_mut() else {
                break;
            };
            let left = match front {
                Piece::Run(len) => {
                    let take = n.min(*len);
                    self.buf.advance(take);
                    self.runs_len -= take;
                    *len -= take;
                    n -= take;
                    *len
                }
                Piece::Payload(payload) => {
                    let take = n.min(payload.len());
                    payload.advance(take);
                    self.payload_len -= take;
                    n -= take;
                    payload.len()
                }
            };
            if left == 0 {
                self.pieces.pop_front();
            }
        }
        let take = n.min(self.buf.len() - self.runs_len);
        self.buf.advance(take);
        if self.len() == 0 {
            // Nothing held while idle: the buffer and the queue go back to the thread's
            // spares.
            spare::give(std::mem::take(&mut self.buf));
            self.give_pieces();
            *self = Output::default();
        }
    }

    fn give_pieces(&mut self) {
        let mut pieces = std::mem::take(&mut self.pieces);
        if (1..=spare::MAX_PIECES).contains(&pieces.capacity()) {
            pieces.clear();
            spares::give(&spare::PIECES, pieces, spare::KEPT);
        }
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if self.buf.capacity() > 0 {
            spare::give(std::mem::take(&mut self.buf));
        }
        self.give_pieces();
    }
}

/// Output buffers and queues not in use, per thread.
mod spare {
    use super::*;

    /// A connection's output is written within a poll or two of being made: a few spares
    /// serve many connections.
    pub(super) const KEPT: usize = 16;
    /// A buffer too small to hold a few responses' frames is not worth keeping.
    const MIN_KEPT: usize = 256;
    /// A buffer grown past this (a large head, many frames at once) is freed, not kept.
    const MAX_KEPT: usize = 16 * 1024;
    /// A queue grown past this many pieces (a burst of many small DATA frames) is freed.
    pub(super) const MAX_PIECES: usize = 64;

    thread_local! {
        static BUFFERS: Spares<BytesMut> = const { Spares::new() };
        pub(super) static PIECES: Spares<VecDeque<Piece>> = const { Spares::new() };
    }

    /// A spare, or a new buffer just large enough to be kept: a burst of new connections,
    /// each holding one until its SETTINGS are written, takes little more than it writes.
    pub(super) fn take() -> BytesMut {
        spares::take(&BUFFERS).unwrap_or_else(|| BytesMut::with_capacity(MIN_KEPT))
    }

    pub(super) fn give(mut buf: BytesMut) {
        buf.clear();
        // A written buffer is advanced to its end: the room before the cursor is taken back
        // (asking for more than the room after it makes it look there).
        let _ = buf.try_reclaim(buf.capacity() + 1);
        if (MIN_KEPT..=MAX_KEPT).contains(&buf.capacity()) {
            spares::give(&BUFFERS, buf, KEPT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gathered(output: &Output) -> Vec<u8> {
        let mut slices = [IoSlice::new(&[]); 16];
        let n = output.slices(&mut slices);
        slices[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    #[test]
    fn frames_and_payloads_are_written_in_the_order_queued() {
        let mut output = Output::default();
        output.buf().extend_from_slice(b"head1");
        output.payload(Bytes::from_static(b"body1"));
        output.buf().extend_from_slice(b"head2");
        output.payload(Bytes::from_static(b"body2"));
        output.buf().extend_from_slice(b"tail");
        assert_eq!(output.len(), 24);
        assert_eq!(gathered(&output), b"head1body1head2body2tail");
        // Written in parts, cutting runs and payloads in their middle.
        output.advance(3);
        assert_eq!(gathered(&output), b"d1body1head2body2tail");
        output.advance(9);
        assert_eq!(gathered(&output), b"ad2body2tail");
        output.advance(10);
        assert_eq!(gathered(&output), b"il");
        assert_eq!(output.len(), 2);
        // More frames after what is left of the last run.
        output.buf().extend_from_slice(b"!");
        assert_eq!(gathered(&output), b"il!");
        output.advance(3);
        assert_eq!(output.len(), 0);
        assert_eq!(output.buf.capacity(), 0, "a written output holds no buffer");
    }

    #[test]
    fn the_slices_stop_at_the_room_given() {
        let mut output = Output::default();
        for _ in 0..3 {
            output.buf().extend_from_slice(b"h");
            output.payload(Bytes::from_static(b"p"));
        }
        let mut slices = [IoSlice::new(&[]); 4];
        assert_eq!(output.slices(&mut slices), 4);
        let first: Vec<u8> = slices.iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(first, b"hphp");
    }

    #[test]
    fn a_written_buffer_is_reused_by_the_next_output() {
        let mut first = Output::default();
        first.buf().extend_from_slice(&[1; 1000]);
        let at = first.buf.as_ptr();
        first.advance(1000);
        let mut second = Output::default();
        second.buf().extend_from_slice(&[2; 10]);
        assert_eq!(second.buf.as_ptr(), at, "the spare buffer was not reused");
        assert_eq!(gathered(&second), [2; 10]);
    }

    #[test]
    fn a_written_queue_is_reused_by_the_next_output_and_none_is_held_idle() {
        let mut first = Output::default();
        first.buf().extend_from_slice(b"head");
        first.payload(Bytes::from_static(b"body"));
        let at = first.pieces.as_slices().0.as_ptr();
        first.advance(8);
        assert_eq!(first.pieces.capacity(), 0, "an idle output holds a queue");
        let mut second = Output::default();
        second.buf().extend_from_slice(b"h");
        second.payload(Bytes::from_static(b"p"));
        assert_eq!(
            second.pieces.as_slices().0.as_ptr(),
            at,
            "the spare queue was not reused"
        );
        assert_eq!(gathered(&second), b"hp");
    }
}
