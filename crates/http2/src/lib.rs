//! Legate's HTTP/2 codec, without I/O: what bytes mean and what bytes to write. The task
//! that drives a connection (reads, writes, timers, the requests' service) is the proxy's.
//!
//! - [`flow`] keeps flow-control windows (below zero when the peer shrinks them) and
//!   gives a receiver's credit back in few WINDOW_UPDATE frames.
//! - [`frame`] reads frames from the front of a buffer with each type's rules checked (a
//!   stream error or a connection error, with its code), puts header blocks together from
//!   their CONTINUATION frames with the flood bounded, and writes frames.
//! - [`head`] makes the fields of a block into a request or response head (RFC 9113
//!   section 8): the `http` types the HTTP/1.1 path uses, malformed messages refused by
//!   name, cookie crumbs joined for an HTTP/1.1 hop.
//! - [`hpack`] reads header blocks with a dynamic table bounded by the size this side
//!   announces, hands on fields only while the header list is within its limit (an HPACK
//!   bomb costs the decoder the block's length, not its expansion), and writes blocks with
//!   credentials never indexed.
//! - [`server`] is a server's connection: bytes read in, events out (requests, bodies,
//!   resets), responses in, bytes to write out; SETTINGS, PING, GOAWAY, both sides' flow
//!   control and the flood limits (rapid reset, CONTINUATION, PING and SETTINGS, stream
//!   errors) handled inside. `examples/echo_server.rs` drives one over TCP.
//! - [`spares`] keeps, per thread, what a connection holds only while busy (queues, buffers),
//!   so that an idle connection holds none and a busy one does not allocate them anew.
//! - [`stream`] moves a stream through RFC 9113's states as frames are sent and received,
//!   and names the error (stream or connection) a frame in the wrong state is.
//!
//! A request read from the wire, as a server connection reads it:
//!
//! ```
//! use bytes::BytesMut;
//! use http2::frame::{self, BlockAssembler, Frame};
//! use http2::hpack::{Decoder, Encoder};
//!
//! // What a client writes: HEADERS for GET https://example.com/ (RFC 7541 C.4.1's block).
//! let mut wire = BytesMut::new();
//! let mut encoder = Encoder::new(4096);
//! let mut block = BytesMut::new();
//! encoder.encode(
//!     [(&b":method"[..], &b"GET"[..], false), (b":scheme", b"https", false),
//!      (b":path", b"/", false), (b":authority", b"example.com", false)],
//!     &mut block,
//! );
//! frame::encode_header_block(1, &block.freeze(), true, 16_384, &mut wire);
//!
//! // What the server does with it.
//! let mut assembler = BlockAssembler::new(16 * 1024, 16_384);
//! let mut decoder = Decoder::new(4096);
//! let frame = frame::decode(&mut wire, 16_384)?.expect("a whole frame");
//! let Some(Frame::Headers { stream, end_stream, fragment, .. }) = assembler.push(frame)? else {
//!     unreachable!("one HEADERS frame with END_HEADERS");
//! };
//! let mut fields = Vec::new();
//! decoder.decode(&fragment, 16 * 1024, |field| fields.push(field))?;
//! let request = http2::head::request(fields, false)?;
//! assert_eq!((stream, end_stream), (1, true));
//! assert_eq!(request.parts.uri, "https://example.com/");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod flow;
pub mod frame;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod head;
pub mod hpack;
pub mod server;
pub mod spares;
pub mod stream;
