//! Response bodies, decoded from the front of a connection's read buffer as the bytes arrive.

use bytes::{Bytes, BytesMut};
use http::HeaderMap;

use crate::chunked::{Chunk, ChunkedDecoder};
use crate::{BodyError, ResponseLength};

/// What a step of decoding found.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes, sharing the read buffer's memory.
    Data(Bytes),
    /// The trailer fields of a chunked body: the body is complete.
    Trailers(HeaderMap),
    /// The body is complete.
    End,
    /// The buffer holds no more of the body: read more (and call [`ResponseDecoder::eof`] if
    /// the connection has closed).
    NeedMore,
}

/// Decodes one response body. What follows the body in the buffer is left there.
#[derive(Debug)]
pub struct ResponseDecoder {
    state: State,
}

#[derive(Debug)]
enum State {
    Length(u64),
    Chunked(ChunkedDecoder),
    UntilClose,
    Done,
}

impl ResponseDecoder {
    /// `max_trailers`: the most bytes a chunked body's trailer section may take.
    pub fn new(length: ResponseLength, max_trailers: usize) -> Self {
        let state = match length {
            ResponseLength::NoBody | ResponseLength::Length(0) => State::Done,
            ResponseLength::Length(n) => State::Length(n),
            ResponseLength::Chunked => State::Chunked(ChunkedDecoder::new(max_trailers)),
            ResponseLength::UntilClose => State::UntilClose,
        };
        Self { state }
    }

    /// Whether the body has been read to its end.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// What is left of the body, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self.state {
            State::Done => Some(0),
            State::Length(left) => Some(left),
            _ => None,
        }
    }

    /// How much room the next read should ask for, at most `read_size`: no more than the body
    /// has left when its length is known.
    pub fn next_read(&self, read_size: usize) -> usize {
        match self.state {
            State::Length(left) => read_size.min(usize::try_from(left).unwrap_or(usize::MAX)),
            _ => read_size,
        }
        .max(1)
    }

    /// Decodes what `buf` holds.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, BodyError> {
        match &mut self.state {
            State::Done => Ok(Decoded::End),
            State::Length(left) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                *left -= n as u64;
                if *left == 0 {
                    self.state = State::Done;
                }
                Ok(Decoded::Data(crate::shared_copy::take_front(buf, n)))
            }
            State::UntilClose if buf.is_empty() => Ok(Decoded::NeedMore),
            State::UntilClose => Ok(Decoded::Data(crate::shared_copy::take_front(
                buf,
                buf.len(),
            ))),
            State::Chunked(decoder) => Ok(match decoder.decode(buf)? {
                None => Decoded::NeedMore,
                Some(Chunk::Data(data)) => Decoded::Data(data),
                Some(Chunk::Trailers(trailers)) => {
                    self.state = State::Done;
                    Decoded::Trailers(trailers)
                }
                Some(Chunk::End) => {
                    self.state = State::Done;
                    Decoded::End
                }
            }),
        }
    }

    /// The connection closed with the buffer decoded: the end of a body delimited by the
    /// close, and an error for any other that is not complete.
    pub fn eof(&mut self) -> Result<(), BodyError> {
        match self.state {
            State::Done => Ok(()),
            State::UntilClose => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(BodyError::Incomplete),
        }
    }
}
