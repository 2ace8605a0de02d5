//! A request body copied to a mirror as it goes to the real upstream: the original's frames
//! are queued for the copy's body, up to a byte limit. The original never waits for the copy:
//! a copy that falls behind by more than the limit, or whose original ends early, is given up
//! (its request fails), and one whose request has ended takes no more frames.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Frame, SizeHint};

use crate::error::BodyError;

/// Why a copy's body failed.
#[derive(Debug, thiserror::Error)]
#[error(
    "the mirrored body was given up: the copy fell behind the buffer limit or the original ended early"
)]
pub(crate) struct MirrorAbandoned;

/// What a queued frame costs besides its bytes (the frame and its slot), so that many small
/// frames count against the limit too.
const FRAME_COST: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Ended,
    Abandoned,
}

struct Queue {
    frames: VecDeque<Frame<Bytes>>,
    /// Data bytes queued, and [`FRAME_COST`] a frame.
    queued: usize,
    limit: usize,
    state: State,
    /// The copy's body, waiting for a frame.
    waker: Option<Waker>,
    /// The original's size, for the copy's framing (`content-length`).
    hint: SizeHint,
}

impl Queue {
    fn abandon(&mut self) {
        self.state = State::Abandoned;
        self.frames = VecDeque::new();
        self.queued = 0;
        self.wake();
    }

    fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }
}

/// The original's end of a copy.
pub(crate) struct FeedSender(Rc<RefCell<Queue>>);

/// The copy's end: its body's frames.
pub(crate) struct FeedReceiver(Rc<RefCell<Queue>>);

/// A queue for one copy of a body of `hint`'s size, holding at most `limit` bytes.
pub(crate) fn feed(limit: usize, hint: SizeHint) -> (FeedSender, FeedReceiver) {
    let queue = Rc::new(RefCell::new(Queue {
        frames: VecDeque::new(),
        queued: 0,
        limit,
        state: State::Open,
        waker: None,
        hint,
    }));
    (FeedSender(Rc::clone(&queue)), FeedReceiver(queue))
}

impl FeedSender {
    /// Queues a copy of `frame` (data or trailers), unless the copy is over.
    pub(crate) fn send(&self, frame: &Frame<Bytes>) {
        let mut queue = self.0.borrow_mut();
        if queue.state != State::Open {
            return;
        }
        if Rc::strong_count(&self.0) == 1 {
            // The copy's request is over: nothing reads the queue.
            queue.abandon();
            return;
        }
        let cost = frame.data_ref().map_or(0, Bytes::len) + FRAME_COST;
        if queue.queued + cost > queue.limit {
            queue.abandon();
            return;
        }
        let copy = if let Some(data) = frame.data_ref() {
            Frame::data(data.clone())
        } else if let Some(trailers) = frame.trailers_ref() {
            Frame::trailers(trailers.clone())
        } else {
            return;
        };
        queue.queued += cost;
        queue.frames.push_back(copy);
        queue.wake();
    }

    /// The original ended: the copy ends once it has read what is queued.
    pub(crate) fn end(&self) {
        let mut queue = self.0.borrow_mut();
        if queue.state == State::Open {
            queue.state = State::Ended;
            queue.wake();
        }
    }
}

impl Drop for FeedSender {
    fn drop(&mut self) {
        // The original went away before its end (aborted, or left unread).
        let mut queue = self.0.borrow_mut();
        if queue.state == State::Open {
            queue.abandon();
        }
    }
}

impl FeedReceiver {
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut queue = self.0.borrow_mut();
        if let Some(frame) = queue.frames.pop_front() {
            queue.queued -= frame.data_ref().map_or(0, Bytes::len) + FRAME_COST;
            return Poll::Ready(Some(Ok(frame)));
        }
        match queue.state {
            State::Ended => Poll::Ready(None),
            State::Abandoned => Poll::Ready(Some(Err(Box::new(MirrorAbandoned)))),
            State::Open => {
                queue.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        let queue = self.0.borrow();
        queue.state == State::Ended && queue.frames.is_empty()
    }

    pub(crate) fn size_hint(&self) -> SizeHint {
        self.0.borrow().hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll(rx: &mut FeedReceiver) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        rx.poll_frame(&mut Context::from_waker(Waker::noop()))
    }

    fn data(poll: Poll<Option<Result<Frame<Bytes>, BodyError>>>) -> Bytes {
        match poll {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap(),
            other => panic!("{:?}", other.map(|o| o.map(|r| r.is_ok()))),
        }
    }

    #[test]
    fn frames_pass_in_order_and_the_end_follows_them() {
        let (tx, mut rx) = feed(3 * FRAME_COST + 6, SizeHint::with_exact(6));
        assert!(poll(&mut rx).is_pending());
        tx.send(&Frame::data(Bytes::from_static(b"abc")));
        tx.send(&Frame::data(Bytes::from_static(b"def")));
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-sum", "1".parse().unwrap());
        tx.send(&Frame::trailers(trailers));
        tx.end();
        assert!(!rx.is_end_stream());
        assert_eq!(rx.size_hint().exact(), Some(6));
        assert_eq!(data(poll(&mut rx)), "abc");
        assert_eq!(data(poll(&mut rx)), "def");
        assert!(matches!(poll(&mut rx), Poll::Ready(Some(Ok(f))) if f.is_trailers()));
        assert!(rx.is_end_stream());
        assert!(matches!(poll(&mut rx), Poll::Ready(None)));
    }

    #[test]
    fn a_copy_that_falls_behind_the_limit_is_given_up() {
        let (tx, mut rx) = feed(FRAME_COST + 5, SizeHint::default());
        tx.send(&Frame::data(Bytes::from_static(b"abcd")));
        assert_eq!(data(poll(&mut rx)), "abcd");
        // Read: the room is back.
        tx.send(&Frame::data(Bytes::from_static(b"efgh")));
        // Not read: over the limit.
        tx.send(&Frame::data(Bytes::from_static(b"ij")));
        assert!(matches!(poll(&mut rx), Poll::Ready(Some(Err(_)))));
        // Nothing more is queued, and the end does not undo it.
        tx.send(&Frame::data(Bytes::from_static(b"k")));
        tx.end();
        assert!(matches!(poll(&mut rx), Poll::Ready(Some(Err(_)))));

        // Many small frames count too: ten fit in room for ten frames' cost, not eleven.
        let (tx, mut rx) = feed(10 * (FRAME_COST + 1), SizeHint::default());
        for _ in 0..10 {
            tx.send(&Frame::data(Bytes::from_static(b"x")));
        }
        assert_eq!(data(poll(&mut rx)), "x");
        tx.send(&Frame::data(Bytes::from_static(b"x")));
        tx.send(&Frame::data(Bytes::from_static(b"x")));
        let mut frames = 0;
        while let Poll::Ready(Some(Ok(_))) = poll(&mut rx) {
            frames += 1;
        }
        assert_eq!(frames, 0, "given up once over, what was queued goes");
    }

    #[test]
    fn an_original_gone_early_fails_the_copy_and_a_gone_copy_takes_nothing() {
        let (tx, mut rx) = feed(100, SizeHint::default());
        tx.send(&Frame::data(Bytes::from_static(b"abc")));
        drop(tx);
        // What came before is not delivered: the copy is incomplete either way.
        assert!(matches!(poll(&mut rx), Poll::Ready(Some(Err(_)))));

        let (tx, rx) = feed(100, SizeHint::default());
        drop(rx);
        tx.send(&Frame::data(Bytes::from_static(b"abc")));
        assert_eq!(tx.0.borrow().queued, 0);
    }
}
