//! A request body that the connection's task fills as the client's frames arrive (an HTTP/2
//! stream's, on Legate's own codec), read by the request path as a body. What it holds is
//! bounded by the stream's flow-control window, not here: the reader reports the bytes it
//! takes, and the connection gives the client that much window back, so a slow upstream
//! holds the client to the window.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;

use crate::error::BodyError;

/// A waker cell shared by a connection's task and the parts of its streams that wake it.
#[derive(Default)]
pub(crate) struct WakeCell(Cell<Option<Waker>>);

impl WakeCell {
    /// Registers the task to wake.
    pub(crate) fn register(&self, waker: &Waker) {
        let current = self.0.take();
        let next = match current {
            Some(current) if current.will_wake(waker) => current,
            _ => waker.clone(),
        };
        self.0.set(Some(next));
    }

    pub(crate) fn wake(&self) {
        if let Some(waker) = self.0.take() {
            waker.wake();
        }
    }
}

/// Why an inbox's body failed.
#[derive(Debug, thiserror::Error)]
#[error("the client's stream was reset before its body ended")]
pub(crate) struct StreamReset;

struct State {
    data: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    ended: bool,
    failed: bool,
    /// Bytes the reader took and the connection has not given back yet.
    taken: u32,
    reader: Option<Waker>,
    /// The reader let go of the body: what still comes is not wanted.
    dropped: bool,
}

/// The connection's side.
pub(crate) struct Inbox {
    state: Rc<RefCell<State>>,
}

/// The request path's side: the body's frames.
pub(crate) struct InboxReceiver {
    state: Rc<RefCell<State>>,
    /// The connection's task, woken when bytes are taken (to give window back).
    connection: Rc<WakeCell>,
    /// What is left of the `content-length` the request declared (the codec holds the
    /// body to it).
    left: Option<u64>,
}

/// An inbox for one body of `content_length`, if declared; `connection` is woken as the
/// reader takes bytes.
pub(crate) fn inbox(
    connection: Rc<WakeCell>,
    content_length: Option<u64>,
) -> (Inbox, InboxReceiver) {
    let state = Rc::new(RefCell::new(State {
        data: VecDeque::new(),
        trailers: None,
        ended: false,
        failed: false,
        taken: 0,
        reader: None,
        dropped: false,
    }));
    (
        Inbox {
            state: Rc::clone(&state),
        },
        InboxReceiver {
            state,
            connection,
            left: content_length,
        },
    )
}

impl Inbox {
    /// A frame's data; `end` when it ends the body. `false` once the reader has let go (the
    /// data is not kept: give its window back at once).
    pub(crate) fn push(&self, data: Bytes, end: bool) -> bool {
        let mut state = self.state.borrow_mut();
        if state.dropped {
            return false;
        }
        if !data.is_empty() {
            state.data.push_back(data);
        }
        state.ended |= end;
        wake(&mut state);
        true
    }

    /// The trailers, which end the body.
    pub(crate) fn trailers(&self, trailers: HeaderMap) {
        let mut state = self.state.borrow_mut();
        state.trailers = Some(trailers);
        state.ended = true;
        wake(&mut state);
    }

    /// The stream was reset: the body fails after what was already queued.
    pub(crate) fn fail(&self) {
        let mut state = self.state.borrow_mut();
        state.failed = true;
        wake(&mut state);
    }

    /// Whether the reader let go of the body (nothing more of it is wanted).
    pub(crate) fn is_dropped(&self) -> bool {
        self.state.borrow().dropped
    }

    /// The bytes taken since the last call, to give back as window.
    pub(crate) fn take_taken(&self) -> u32 {
        std::mem::take(&mut self.state.borrow_mut().taken)
    }
}

fn wake(state: &mut State) {
    if let Some(waker) = state.reader.take() {
        waker.wake();
    }
}

impl InboxReceiver {
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let mut state = self.state.borrow_mut();
        if let Some(data) = state.data.pop_front() {
            state.taken = state.taken.saturating_add(data.len() as u32);
            drop(state);
            if let Some(left) = &mut self.left {
                *left = left.saturating_sub(data.len() as u64);
            }
            self.connection.wake();
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(trailers) = state.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if state.ended {
            return Poll::Ready(None);
        }
        if state.failed {
            state.ended = true;
            return Poll::Ready(Some(Err(Box::new(StreamReset))));
        }
        state.reader = Some(cx.waker().clone());
        Poll::Pending
    }

    pub(crate) fn is_end_stream(&self) -> bool {
        let state = self.state.borrow();
        state.ended && state.data.is_empty() && state.trailers.is_none()
    }

    pub(crate) fn size_hint(&self) -> http_body::SizeHint {
        self.left.map_or_else(
            http_body::SizeHint::default,
            http_body::SizeHint::with_exact,
        )
    }
}

impl Drop for InboxReceiver {
    fn drop(&mut self) {
        let mut state = self.state.borrow_mut();
        state.dropped = true;
        // What was queued and never read goes back as window too.
        let unread: usize = state.data.drain(..).map(|d| d.len()).sum();
        state.taken = state.taken.saturating_add(unread as u32);
        drop(state);
        self.connection.wake();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use super::*;

    async fn next(receiver: &mut InboxReceiver) -> Option<Result<Frame<Bytes>, BodyError>> {
        std::future::poll_fn(|cx| receiver.poll_frame(cx)).await
    }

    #[tokio::test]
    async fn frames_in_order_then_the_end_and_the_bytes_taken() {
        let (inbox, mut body) = super::inbox(Rc::new(WakeCell::default()), None);
        assert!(inbox.push(Bytes::from_static(b"ab"), false));
        assert!(inbox.push(Bytes::from_static(b"cde"), false));
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        inbox.trailers(trailers);
        assert!(!body.is_end_stream());
        assert_eq!(
            next(&mut body).await.unwrap().unwrap().into_data().unwrap(),
            "ab"
        );
        assert_eq!(
            next(&mut body).await.unwrap().unwrap().into_data().unwrap(),
            "cde"
        );
        assert_eq!(inbox.take_taken(), 5);
        assert_eq!(inbox.take_taken(), 0);
        let frame = next(&mut body).await.unwrap().unwrap();
        assert_eq!(frame.into_trailers().unwrap()["grpc-status"], "0");
        assert!(body.is_end_stream());
        assert!(next(&mut body).await.is_none());
    }

    #[tokio::test]
    async fn a_reset_fails_the_body_and_a_dropped_reader_gives_all_back() {
        let (inbox, mut body) = super::inbox(Rc::new(WakeCell::default()), None);
        inbox.push(Bytes::from_static(b"ab"), false);
        inbox.fail();
        assert!(next(&mut body).await.unwrap().is_ok());
        assert!(next(&mut body).await.unwrap().is_err());
        assert!(next(&mut body).await.is_none());

        let (inbox, body) = super::inbox(Rc::new(WakeCell::default()), None);
        inbox.push(Bytes::from_static(b"abc"), false);
        drop(body);
        assert_eq!(inbox.take_taken(), 3);
        assert!(!inbox.push(Bytes::from_static(b"more"), false));
    }
}
