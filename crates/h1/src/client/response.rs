//! Response heads as an upstream connection reads them: the status line and header fields
//! tokenized by httparse in place, then the one reading of the body's length.

use std::mem::MaybeUninit;

use bytes::{Buf, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, StatusCode, Version};

use crate::field_values::has_token;
use crate::request::{HeadCopy, content_length_field};
use crate::{MAX_HEADERS, ResponseLength};

/// A response head that cannot be relayed. An upstream that sends one gets no more requests
/// on the connection, and the client gets a 502.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResponseError {
    #[error("response head over the {limit}-byte limit")]
    TooLarge { limit: usize },
    #[error("more than {MAX_HEADERS} header fields in a response")]
    TooManyHeaders,
    #[error("malformed response head: {0}")]
    Malformed(&'static str),
    #[error("response version is not HTTP/1.0 or HTTP/1.1")]
    Version,
    /// Both lengths: a message a client (or a cache between) could split differently.
    #[error("both content-length and transfer-encoding")]
    ContentLengthAndTransferEncoding,
    #[error("invalid content-length")]
    InvalidContentLength,
    #[error("transfer-encoding chunked more than once")]
    ChunkedTwice,
    #[error("transfer-encoding in an HTTP/1.0 response")]
    TransferEncodingInHttp10,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status, version and header fields; the values share one copy of the head.
    pub parts: http::response::Parts,
    pub length: ResponseLength,
    /// Whether the connection can carry another request after this response's body:
    /// HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`, and
    /// never after a body that ends with the connection.
    pub keep_alive: bool,
}

/// Parses a response head from the front of `buf`, removing it from `buf` when complete.
/// `Ok(None)`: the head is not all there yet (and is within `max_head` bytes so far).
/// `head_request`: the request was a HEAD, so no body follows whatever the head says.
///
/// The length is read as RFC 9112 section 6.3 says: no body after a 1xx, 204 or 304 or a
/// response to HEAD; a body to the connection's close when the final transfer coding is not
/// chunked or nothing gives a length. Where parsers could disagree, the response is refused:
/// both lengths, lengths that differ, chunked twice, a transfer coding in HTTP/1.0.
pub fn parse_response(
    buf: &mut BytesMut,
    max_head: usize,
    head_request: bool,
) -> Result<Option<ResponseHead>, ResponseError> {
    parse::<false>(buf, max_head, head_request)
}

/// [`parse_response`], noting in the response's extensions how its names were spelled (a
/// [`crate::HeaderCase`], when some had capitals).
pub fn parse_response_keeping_case(
    buf: &mut BytesMut,
    max_head: usize,
    head_request: bool,
) -> Result<Option<ResponseHead>, ResponseError> {
    parse::<true>(buf, max_head, head_request)
}

/// `KEEP_CASE` is a constant for the reason [`crate::request`]'s parse gives.
fn parse<const KEEP_CASE: bool>(
    buf: &mut BytesMut,
    max_head: usize,
    head_request: bool,
) -> Result<Option<ResponseHead>, ResponseError> {
    let mut fields: [MaybeUninit<httparse::Header<'_>>; MAX_HEADERS] =
        [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut res = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut res,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= max_head => {
            return Err(ResponseError::TooLarge { limit: max_head });
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ResponseError::TooManyHeaders),
        Err(httparse::Error::Version) => return Err(ResponseError::Version),
        Err(err) => return Err(ResponseError::Malformed(malformed(err))),
    };
    if len > max_head {
        return Err(ResponseError::TooLarge { limit: max_head });
    }
    let version = match res.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return Err(ResponseError::Version),
    };
    let status = res
        .code
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or(ResponseError::Malformed("invalid status code"))?;
    // Copied out (a few hundred bytes), so that the read buffer is not shared with a head
    // that lives on (in an HTTP/2 client's HPACK table, say) and can be used again.
    let head = HeadCopy::new(&buf[..len]);
    let mut headers = crate::maps::take(res.headers.len());
    let mut framing = Framing::default();
    let mut case = crate::HeaderCase::default();
    for field in res.headers.iter() {
        let name = crate::names::header_name(field.name.as_bytes())
            .map_err(|_| ResponseError::Malformed("invalid header name"))?;
        let mut value = head.value(field);
        if name == CONTENT_LENGTH {
            match content_length_field(&mut framing.content_length, value) {
                Ok(Some(one)) => value = one,
                // A repeat of the first: one line goes on.
                Ok(None) => continue,
                Err(()) => return Err(ResponseError::InvalidContentLength),
            }
        } else {
            framing.field(&name, &value)?;
        }
        if KEEP_CASE {
            case.note(&name, field.name.as_bytes(), || {
                head.slice(field.name.as_bytes())
            });
        }
        headers.append(name, value);
    }
    buf.advance(len);
    let bodiless = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let length = framing.length(version, bodiless)?;
    let keep_alive = length != ResponseLength::UntilClose
        && !framing.close
        && (version == Version::HTTP_11 || framing.keep_alive_token);
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    parts.headers = headers;
    if KEEP_CASE && !case.is_empty() {
        parts.extensions.insert(case);
    }
    Ok(Some(ResponseHead {
        parts,
        length,
        keep_alive,
    }))
}

fn malformed(err: httparse::Error) -> &'static str {
    match err {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid token in the status line",
        _ => "malformed head",
    }
}

/// What the header fields say about the body and the connection, as they are read.
#[derive(Default)]
struct Framing {
    content_length: Option<u64>,
    /// Transfer-Encoding seen; whether its last coding so far is chunked.
    transfer_encoding: Option<bool>,
    chunked_count: usize,
    close: bool,
    keep_alive_token: bool,
}

impl Framing {
    /// Notes a field other than Content-Length (`content_length_field` reads those).
    fn field(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<(), ResponseError> {
        if name == TRANSFER_ENCODING {
            // Present, even empty: the length is not the Content-Length's.
            self.transfer_encoding.get_or_insert(false);
            for coding in value.as_bytes().split(|&b| b == b',') {
                let coding = coding.trim_ascii();
                if coding.is_empty() {
                    continue;
                }
                let chunked = coding.eq_ignore_ascii_case(b"chunked");
                self.chunked_count += usize::from(chunked);
                self.transfer_encoding = Some(chunked);
            }
        } else if name == CONNECTION {
            self.close |= has_token(value.as_bytes(), b"close");
            self.keep_alive_token |= has_token(value.as_bytes(), b"keep-alive");
        }
        Ok(())
    }

    fn length(&self, version: Version, bodiless: bool) -> Result<ResponseLength, ResponseError> {
        if bodiless {
            return Ok(ResponseLength::NoBody);
        }
        match (self.transfer_encoding, self.content_length) {
            (Some(_), Some(_)) => Err(ResponseError::ContentLengthAndTransferEncoding),
            (Some(_), None) if version == Version::HTTP_10 => {
                Err(ResponseError::TransferEncodingInHttp10)
            }
            (Some(_), None) if self.chunked_count > 1 => Err(ResponseError::ChunkedTwice),
            (Some(true), None) => Ok(ResponseLength::Chunked),
            // Another coding last: the body runs to the close (RFC 9112 section 6.3).
            (Some(false), None) => Ok(ResponseLength::UntilClose),
            (None, Some(len)) => Ok(ResponseLength::Length(len)),
            (None, None) => Ok(ResponseLength::UntilClose),
        }
    }
}
