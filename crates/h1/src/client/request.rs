//! Request heads as an upstream connection writes them.

use bytes::{BufMut, BytesMut};
use http::header::{
    AUTHORIZATION, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE,
    MAX_FORWARDS, SET_COOKIE, TRAILER, TRANSFER_ENCODING,
};
use http::{HeaderMap, HeaderName, Method, Version};

use crate::BodyLength;
use crate::field_values::{FramingFields, parse_length};
use crate::response::{decimal, field, last_token_is};

/// What is known of a request's body before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutgoingBody {
    /// There is none (the body is at its end before it starts).
    None,
    /// Exactly this many bytes.
    Known(u64),
    /// A length not known in advance.
    Unknown,
}

/// Writes the request line and header fields of `head` into `out` (its body is not looked at: the
/// caller may have taken it already), and says how its body must be written: as hyper's client
/// decides it. The request's own `Content-Length` or `Transfer-Encoding` are kept when they say how
/// the body goes; otherwise the fitting one is added. An HTTP/1.0 request is written as such, and
/// never chunked; any other as HTTP/1.1. `GET`, `HEAD` and `CONNECT` with a body of unknown length
/// are sent without one.
pub fn encode_request_head<B>(
    head: &http::Request<B>,
    body: OutgoingBody,
    out: &mut BytesMut,
) -> BodyLength {
    encode_request_head_cased(head, body, false, out)
}

/// [`encode_request_head`], writing names as the request's [`crate::HeaderCase`] spells
/// them when `keep_case` (and it has one).
pub fn encode_request_head_cased<B>(
    head: &http::Request<B>,
    body: OutgoingBody,
    keep_case: bool,
    out: &mut BytesMut,
) -> BodyLength {
    let case = if keep_case {
        head.extensions().get::<crate::HeaderCase>()
    } else {
        None
    };
    let headers = head.headers();
    let http10 = head.version() == Version::HTTP_10;
    let framing = FramingFields::of(headers);
    let declared = (framing.content_length).and_then(|v| parse_length(v.as_bytes()));
    let te = framing.transfer_encoding;
    let mut keep_cl = false;
    let mut keep_te = false;
    let mut add = Added::None;
    let length = match body {
        OutgoingBody::None => BodyLength::Empty,
        _ if http10 => {
            if let Some(len) = declared {
                keep_cl = true;
                BodyLength::Length(len)
            } else if let OutgoingBody::Known(len) = body {
                add = Added::ContentLength(len);
                BodyLength::Length(len)
            } else {
                // An HTTP/1.0 request without a length cannot carry a body.
                BodyLength::Empty
            }
        }
        _ if te.is_some() => {
            keep_te = true;
            if !te.is_some_and(|v| last_token_is(v.as_bytes(), b"chunked")) {
                add = Added::ChunkedCoding;
            }
            BodyLength::Chunked
        }
        _ if declared.is_some() => {
            keep_cl = true;
            BodyLength::Length(declared.unwrap_or_default())
        }
        OutgoingBody::Known(len) => {
            add = Added::ContentLength(len);
            BodyLength::Length(len)
        }
        OutgoingBody::Unknown => {
            if matches!(*head.method(), Method::GET | Method::HEAD | Method::CONNECT) {
                BodyLength::Empty
            } else {
                add = Added::TransferEncoding;
                BodyLength::Chunked
            }
        }
    };
    // A body that is not sent leaves the request's own framing fields as they are (a HEAD
    // or GET may well say `content-length: 0`), except a Transfer-Encoding that would tell the
    // server a chunked body follows.
    if length == BodyLength::Empty && body == OutgoingBody::None {
        keep_cl = true;
    }
    let target = match *head.method() {
        Method::CONNECT => head.uri().authority().map(|a| a.as_str()),
        _ => head.uri().path_and_query().map(|p| p.as_str()),
    }
    .filter(|t| !t.is_empty())
    .unwrap_or("/");

    out.reserve(32 + target.len() + headers.len() * 32);
    out.put_slice(head.method().as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(if http10 {
        b" HTTP/1.0\r\n"
    } else {
        b" HTTP/1.1\r\n"
    });
    // Only when `, chunked` is to be added to the last of them.
    let mut te_lines = match add {
        Added::ChunkedCoding => framing.transfer_encoding_lines,
        _ => 0,
    };
    for (name, value) in headers {
        if name == CONTENT_LENGTH && !keep_cl || name == TRANSFER_ENCODING && !keep_te {
            continue;
        }
        out.put_slice(crate::case::spelled(case, name));
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        if name == TRANSFER_ENCODING && te_lines > 0 {
            te_lines -= 1;
            if te_lines == 0 {
                // The last coding must be chunked, the one this body is sent with.
                out.put_slice(b", chunked");
            }
        }
        out.put_slice(b"\r\n");
    }
    match add {
        Added::None | Added::ChunkedCoding => {}
        Added::ContentLength(len) => {
            let mut digits = [0u8; 20];
            field(out, b"content-length", decimal(len, &mut digits));
        }
        Added::TransferEncoding => field(out, b"transfer-encoding", b"chunked"),
    }
    out.put_slice(b"\r\n");
    length
}

enum Added {
    None,
    ContentLength(u64),
    TransferEncoding,
    /// `, chunked` after the request's own codings.
    ChunkedCoding,
}

/// The trailer fields a request declared in its `Trailer` header, the only ones sent after
/// its body (as hyper's client does). `None` when it declared none.
pub fn declared_trailers(headers: &HeaderMap) -> Option<Box<[HeaderName]>> {
    let names: Vec<HeaderName> = headers
        .get_all(TRAILER)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|name| HeaderName::from_bytes(name.trim_ascii()).ok())
        .collect();
    (!names.is_empty()).then(|| names.into_boxed_slice())
}

/// Writes the last chunk of a chunked request body with the trailer fields that were
/// declared, leaving out those no trailer may carry (RFC 9110 section 6.5.1: framing,
/// routing, authentication, and how the content is to be read).
pub fn encode_request_last_chunk(
    trailers: &HeaderMap,
    declared: &[HeaderName],
    out: &mut BytesMut,
) {
    let send = |name: &HeaderName| declared.contains(name) && is_allowed_trailer(name);
    crate::response::encode_last_chunk_with(Some(trailers), send, out);
}

/// The framing fields, and the rest of hyper's list of fields never sent as trailers.
fn is_allowed_trailer(name: &HeaderName) -> bool {
    !crate::is_framing(name)
        && !matches!(
            *name,
            AUTHORIZATION
                | CACHE_CONTROL
                | CONTENT_ENCODING
                | CONTENT_RANGE
                | CONTENT_TYPE
                | MAX_FORWARDS
                | SET_COOKIE
        )
}
