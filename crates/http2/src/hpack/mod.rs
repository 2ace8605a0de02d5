//! HPACK (RFC 7541): header blocks read with a dynamic table bounded by the size this side
//! announces, and written with the size the peer allows (capped).
//!
//! ```
//! use bytes::BytesMut;
//! use http2::hpack::{Decoder, Encoder};
//!
//! let mut encoder = Encoder::new(4096);
//! let mut block = BytesMut::new();
//! encoder.encode([(&b":status"[..], &b"200"[..], false), (b"server", b"legate", false)], &mut block);
//!
//! let mut decoder = Decoder::new(4096);
//! let mut fields = Vec::new();
//! decoder.decode(&block.freeze(), 16 * 1024, |f| fields.push((f.name, f.value)))?;
//! assert_eq!((&fields[1].0[..], &fields[1].1[..]), (&b"server"[..], &b"legate"[..]));
//! # Ok::<(), http2::hpack::DecodeError>(())
//! ```

mod decoder;
mod encoder;
mod huffman;
mod static_table;
mod table;

pub use decoder::{DecodeError, Decoder, Field};
pub use encoder::{DEFAULT_TABLE_SIZE, Encoder};
pub use huffman::HuffmanError;

#[cfg(test)]
mod tests;
