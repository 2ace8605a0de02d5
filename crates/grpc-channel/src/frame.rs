//! A gRPC message as it goes on the wire: a compression flag and its length, then the message.

use bytes::{BufMut, Bytes, BytesMut};

/// The bytes before a gRPC message: its compression flag and its length.
pub const FRAME_PREFIX: usize = 5;

/// An encoded message framed for the wire: uncompressed, its length before it.
pub fn unary_frame(message: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(FRAME_PREFIX + message.len());
    frame.put_u8(0);
    frame.put_u32(message.len() as u32);
    frame.put_slice(message);
    frame.freeze()
}
