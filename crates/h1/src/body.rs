//! A connection's read side, shared by the connection (heads) and the request body being
//! served (which reads the socket only when its consumer asks for more).

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::chunked::{Chunk, ChunkedDecoder};
use crate::{BodyError, BodyLength};

/// A connection the codec reads and writes.
pub trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin + ?Sized> Io for T {}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// A connection's input: what has been read and not yet used, and the state of the current
/// request's body. Requests take turns: a body reads only while its exchange is the current
/// one (its *generation*).
pub struct Input<IO: ?Sized> {
    /// Bytes read and not yet used: the rest of a head, a body, the next pipelined request.
    pub buf: BytesMut,
    body: BodyState,
    generation: u64,
    /// What is left to write of an interim `100 Continue`, which an `Expect: 100-continue`
    /// client waits for before it sends its body. Written when the body is first read.
    continue_left: usize,
    /// How much a body read asks for at a time: the buffer limit.
    read_size: usize,
    max_trailers: usize,
    pub io: IO,
}

enum BodyState {
    Done,
    Length(u64),
    Chunked(ChunkedDecoder),
    /// The body cannot be read on: the client went away or broke the framing.
    Failed,
}

/// What decoding the buffered input found.
enum Step {
    Frame(Frame<Bytes>),
    NeedMore,
    Finished,
}

impl<IO: Io> Input<IO> {
    /// `read_size`: the most a body read asks for at once. `max_trailers`: the largest
    /// trailer section taken.
    pub fn new(io: IO, read_size: usize, max_trailers: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            body: BodyState::Done,
            generation: 0,
            continue_left: 0,
            read_size,
            max_trailers,
            io,
        }
    }

    /// The socket and what was read beyond the last request (for an upgraded connection).
    pub fn into_parts(self) -> (IO, BytesMut) {
        (self.io, self.buf)
    }
}

impl<IO: Io + ?Sized> Input<IO> {
    /// Starts the body of the next request; its generation, for its [`IncomingBody`].
    pub fn start_body(&mut self, length: BodyLength, expect_continue: bool) -> u64 {
        self.generation += 1;
        self.body = match length {
            BodyLength::Empty => BodyState::Done,
            BodyLength::Length(n) => BodyState::Length(n),
            BodyLength::Chunked => BodyState::Chunked(ChunkedDecoder::new(self.max_trailers)),
        };
        self.continue_left = if expect_continue && !self.body_done() {
            CONTINUE.len()
        } else {
            0
        };
        self.generation
    }

    /// Whether the current body has been read to its end.
    pub fn body_done(&self) -> bool {
        matches!(self.body, BodyState::Done)
    }

    /// Reads the rest of the current body from what is already buffered, discarding it,
    /// without touching the socket: whether that reached its end. For a body the exchange
    /// did not read (the response came first): the connection can be kept only if it ends.
    pub fn skip_buffered_body(&mut self) -> bool {
        loop {
            match self.decode() {
                Ok(Step::Frame(_)) => {}
                Ok(Step::Finished) => return true,
                Ok(Step::NeedMore) | Err(_) => return false,
            }
        }
    }

    /// Ends the current exchange: a body handle still held for it reads no more, and an
    /// interim 100 not begun is not sent.
    pub fn end_exchange(&mut self) {
        self.generation += 1;
        if !self.body_done() {
            self.body = BodyState::Failed;
        }
        if self.continue_left == CONTINUE.len() {
            self.continue_left = 0;
        }
    }

    /// Finishes writing a `100 Continue` that was begun, before anything else is written.
    pub fn poll_finish_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.continue_left == CONTINUE.len() {
            // Not begun: the final response comes instead.
            self.continue_left = 0;
        }
        self.poll_write_continue(cx)
    }

    /// Reads more from the socket into the buffer, with room for at least `want` bytes:
    /// `Ok(0)` at the end of the input.
    pub fn poll_read_more(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        self.buf.reserve(want);
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    /// The next frame of the body of exchange `generation`, reading the socket if the buffer
    /// has none.
    pub fn poll_body(
        &mut self,
        generation: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if generation != self.generation {
            return Poll::Ready(Some(Err(BodyError::Abandoned)));
        }
        loop {
            match self.decode() {
                Ok(Step::Frame(frame)) => return Poll::Ready(Some(Ok(frame))),
                Ok(Step::Finished) => return Poll::Ready(None),
                Ok(Step::NeedMore) => {}
                Err(err) => {
                    self.body = BodyState::Failed;
                    return Poll::Ready(Some(Err(err)));
                }
            }
            if self.continue_left > 0 {
                if self.buf.is_empty() || self.continue_left < CONTINUE.len() {
                    if let Err(err) = ready!(self.poll_write_continue(cx)) {
                        self.body = BodyState::Failed;
                        return Poll::Ready(Some(Err(BodyError::Io(err.to_string()))));
                    }
                } else {
                    // The client sent its body without waiting for the 100.
                    self.continue_left = 0;
                }
            }
            let want = match self.body {
                BodyState::Length(left) => self
                    .read_size
                    .min(usize::try_from(left).unwrap_or(usize::MAX)),
                _ => self.read_size,
            };
            match ready!(self.poll_read_more(cx, want.max(1))) {
                Ok(0) => {
                    self.body = BodyState::Failed;
                    return Poll::Ready(Some(Err(BodyError::Incomplete)));
                }
                Ok(_) => {}
                Err(err) => {
                    self.body = BodyState::Failed;
                    return Poll::Ready(Some(Err(BodyError::Io(err.to_string()))));
                }
            }
        }
    }

    /// Writes what is left of the `100 Continue`, and flushes it.
    fn poll_write_continue(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.continue_left == 0 {
            return Poll::Ready(Ok(()));
        }
        while self.continue_left > 0 {
            let from = CONTINUE.len() - self.continue_left;
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &CONTINUE[from..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.continue_left -= n;
        }
        ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        Poll::Ready(Ok(()))
    }

    fn decode(&mut self) -> Result<Step, BodyError> {
        match &mut self.body {
            BodyState::Done => Ok(Step::Finished),
            BodyState::Failed => Err(BodyError::Abandoned),
            BodyState::Length(left) => {
                if self.buf.is_empty() {
                    return Ok(Step::NeedMore);
                }
                let n = self
                    .buf
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= n as u64;
                if *left == 0 {
                    self.body = BodyState::Done;
                }
                Ok(Step::Frame(Frame::data(crate::shared_copy::take_front(
                    &mut self.buf,
                    n,
                ))))
            }
            BodyState::Chunked(decoder) => match decoder.decode(&mut self.buf)? {
                None => Ok(Step::NeedMore),
                Some(Chunk::Data(data)) => Ok(Step::Frame(Frame::data(data))),
                Some(Chunk::Trailers(trailers)) => {
                    self.body = BodyState::Done;
                    Ok(Step::Frame(Frame::trailers(trailers)))
                }
                Some(Chunk::End) => {
                    self.body = BodyState::Done;
                    Ok(Step::Finished)
                }
            },
        }
    }

    /// What is left of the current body, when known.
    fn remaining(&self) -> Option<u64> {
        match self.body {
            BodyState::Done => Some(0),
            BodyState::Length(left) => Some(left),
            _ => None,
        }
    }
}

/// A request body read from the connection as its consumer asks for it.
pub struct IncomingBody {
    input: Rc<RefCell<Input<dyn Io>>>,
    generation: u64,
}

impl IncomingBody {
    /// The body of exchange `generation` (from [`Input::start_body`]).
    pub fn new(input: Rc<RefCell<Input<dyn Io>>>, generation: u64) -> Self {
        Self { input, generation }
    }
}

impl http_body::Body for IncomingBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        // The input is borrowed only inside a poll, never across one, so it is free here.
        match self.input.try_borrow_mut() {
            Ok(mut input) => input.poll_body(self.generation, cx),
            Err(_) => Poll::Ready(Some(Err(BodyError::Abandoned))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.input
            .try_borrow()
            .is_ok_and(|input| input.generation == self.generation && input.body_done())
    }

    fn size_hint(&self) -> SizeHint {
        match self.input.try_borrow().ok().and_then(|input| {
            (input.generation == self.generation)
                .then(|| input.remaining())
                .flatten()
        }) {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
