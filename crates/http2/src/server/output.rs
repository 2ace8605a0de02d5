//! The bytes a connection has to write: frames encoded in one buffer, with DATA payloads
//! queued beside it as they are (not copied), gathered into one vectored write.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

#[derive(Debug, Default)]
pub(super) struct Output {
    /// Filled frame bytes and payloads, in order, before `buf`.
    chunks: VecDeque<Bytes>,
    chunks_len: usize,
    /// Frames being encoded.
    buf: BytesMut,
}

impl Output {
    /// The buffer to encode frames into (after every chunk queued so far).
    pub(super) fn buf(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Queues a payload after the frames encoded so far.
    pub(super) fn payload(&mut self, payload: Bytes) {
        if payload.is_empty() {
            return;
        }
        if !self.buf.is_empty() {
            let head = self.buf.split().freeze();
            self.push(head);
        }
        self.push(payload);
    }

    fn push(&mut self, chunk: Bytes) {
        self.chunks_len += chunk.len();
        self.chunks.push_back(chunk);
    }

    pub(super) fn len(&self) -> usize {
        self.chunks_len + self.buf.len()
    }

    /// Fills `dst` with the bytes to write next; returns how many slices it filled.
    pub(super) fn slices<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        let rest = (!self.buf.is_empty()).then_some(&self.buf[..]);
        for chunk in self.chunks.iter().map(|c| &c[..]).chain(rest) {
            let Some(slot) = dst.get_mut(n) else { break };
            *slot = IoSlice::new(chunk);
            n += 1;
        }
        n
    }

    /// `n` bytes were written.
    pub(super) fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let take = n.min(front.len());
            front.advance(take);
            self.chunks_len -= take;
            n -= take;
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
        let take = n.min(self.buf.len());
        self.buf.advance(take);
        if self.len() == 0 {
            // Nothing held while idle.
            *self = Output::default();
        }
    }
}
