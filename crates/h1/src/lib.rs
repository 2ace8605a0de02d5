//! Legate's HTTP/1.1 codec, without I/O policy: what bytes mean and what bytes to write. The
//! connections that drive it (reads, timeouts, keep-alive, drain, pooling) are the proxy's.
//!
//! - [`parse_request`] reads a request head straight from the read buffer with httparse and
//!   decides the one way its body is delimited. It is strict where parsers have disagreed
//!   (request smuggling): a request with both `Content-Length` and `Transfer-Encoding` is
//!   refused, as are differing lengths, a final coding other than `chunked`, and
//!   `Transfer-Encoding` in HTTP/1.0.
//! - [`Input`] is a connection's read side: the buffer, the socket, and the body of the
//!   request being served, which an [`IncomingBody`] reads on demand (backpressure: nothing
//!   is read that the consumer has not asked for).
//! - [`encode_head`], [`encode_chunk`] and [`encode_last_chunk`] write a response.
//! - [`HeaderCase`] keeps the spelling of names read (for [`parse_request_keeping_case`]
//!   and its client twin), to write them the same way ([`encode_head_cased`]).
//! - [`client`] is the other side, for upstream connections: requests written, response
//!   heads parsed (as strictly) and response bodies decoded.
//! - Heads are parsed into header maps from a per-thread pool: [`recycle_header_map`] gives
//!   one back once its head is written ([`request_header_map`] takes one for another codec's
//!   request head). Header names go through a per-thread cache, so a
//!   non-standard name read again is not allocated again. A head is copied out of the read
//!   buffer into a per-thread chunk shared by many ([`copy_shared`]), so a warm worker
//!   parses heads without allocating; [`own_values`] detaches a head's values from it.
//!
//! ```
//! use bytes::BytesMut;
//! use h1::{BodyLength, parse_request};
//!
//! let mut buf = BytesMut::from(&b"POST /upload HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\nabc"[..]);
//! let head = parse_request(&mut buf, 8192)?.expect("a whole head");
//! assert_eq!(head.request.uri().path(), "/upload");
//! assert_eq!(head.body, BodyLength::Length(3));
//! assert_eq!(&buf[..], b"abc"); // the body stays in the buffer
//!
//! let mut smuggled = BytesMut::from(
//!     &b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"[..],
//! );
//! assert!(parse_request(&mut smuggled, 8192).is_err());
//! # Ok::<(), h1::HeadError>(())
//! ```

mod body;
mod case;
mod chunked;
pub mod client;
mod date;
mod field_values;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod maps;
mod names;
mod request;
mod response;
mod shared_copy;

pub use body::{IncomingBody, Input, Io};
pub use case::HeaderCase;
pub use chunked::{Chunk, ChunkedDecoder};
pub use date::with as with_date;
pub use maps::{recycle_header_map, release_unused_header_maps, request_header_map};
pub use request::{
    BodyLength, HeadError, MAX_HEADERS, RequestHead, parse_request, parse_request_keeping_case,
};
pub use response::{
    Answering, Framed, ResponseLength, encode_chunk, encode_chunk_header, encode_head,
    encode_head_cased, encode_last_chunk, is_framing,
};
pub use shared_copy::{copy_shared, own_values};

/// Why a request body could not be read to its end.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the connection closed before the body's end")]
    Incomplete,
    #[error("invalid chunk size line")]
    InvalidChunkSize,
    #[error("chunk size over 16 hex digits")]
    ChunkSizeTooLarge,
    #[error("chunk not followed by CRLF")]
    MissingCrlf,
    #[error("chunk extensions over the limit")]
    ExtensionsTooLong,
    #[error("trailer section over the limit")]
    TrailersTooLarge,
    #[error("malformed trailer section")]
    InvalidTrailers,
    #[error("reading the request body failed: {0}")]
    Io(String),
    /// The exchange the body belonged to is over (answered without reading it all).
    #[error("the exchange ended before its body was read")]
    Abandoned,
}
