//! The client side of the codec, for a proxy's upstream connections: request heads written
//! with the one framing their body goes with, response heads parsed with httparse in the
//! read buffer (then copied out, so that nothing pins the buffer), and response bodies decoded
//! as they arrive, sharing the buffer's memory.
//!
//! ```text
//! request.rs   a request head, written, and how its body is framed
//! response.rs  a response head, parsed, and how its body is delimited (RFC 9112 section 6.3)
//! body.rs      a response body, decoded from the read buffer
//! ```

mod body;
mod request;
mod response;

pub use body::{Decoded, ResponseDecoder};
pub use request::{
    OutgoingBody, declared_trailers, encode_request_head, encode_request_head_cased,
    encode_request_last_chunk,
};
pub use response::{ResponseError, ResponseHead, parse_response, parse_response_keeping_case};

#[cfg(test)]
mod tests;
