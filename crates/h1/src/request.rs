//! Request heads: the request line and header fields, tokenized by httparse in place, then
//! checked for the one reading of the message's length (RFC 9112 section 6).

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TRANSFER_ENCODING};
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri, Version};

use crate::field_values::{has_token, parse_length};

/// More header fields than this is a 431, as in hyper.
pub const MAX_HEADERS: usize = 100;

/// A request head that cannot be served. Each names its cause; [`HeadError::status`] is the
/// answer to send before closing the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeadError {
    #[error("request head over the {limit}-byte limit")]
    TooLarge { limit: usize },
    #[error("more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
    #[error("HTTP version not supported")]
    Version,
    #[error("invalid request target")]
    InvalidTarget,
    /// Both lengths: a message two parsers could split differently (request smuggling).
    #[error("both Content-Length and Transfer-Encoding")]
    ContentLengthAndTransferEncoding,
    #[error("invalid Content-Length")]
    InvalidContentLength,
    /// Transfer-Encoding whose final coding is not `chunked`, or chunked twice.
    #[error("invalid Transfer-Encoding")]
    InvalidTransferEncoding,
    /// A transfer coding other than chunked (gzip, deflate, ...), which is not decoded here.
    #[error("unsupported transfer coding")]
    UnsupportedTransferCoding,
    #[error("Transfer-Encoding in an HTTP/1.0 request")]
    TransferEncodingInHttp10,
}

impl HeadError {
    /// The status to answer with.
    pub fn status(&self) -> StatusCode {
        match self {
            HeadError::TooLarge { .. } | HeadError::TooManyHeaders => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            HeadError::Version => StatusCode::HTTP_VERSION_NOT_SUPPORTED,
            HeadError::UnsupportedTransferCoding => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// How the request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body (neither Content-Length nor Transfer-Encoding, or `Content-Length: 0`).
    Empty,
    Length(u64),
    Chunked,
}

/// A parsed request head and what it says about the connection.
#[derive(Debug)]
pub struct RequestHead {
    /// Method, target, version and header fields; the target and values share one copy of the
    /// head, apart from the read buffer.
    pub request: Request<()>,
    pub body: BodyLength,
    /// Whether the client keeps the connection open after this exchange (HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`).
    pub keep_alive: bool,
    /// `Expect: 100-continue` on an HTTP/1.1 request with a body.
    pub expect_continue: bool,
}

/// Parses a request head from the front of `buf`, removing it from `buf` when complete.
/// `Ok(None)`: the head is not all there yet (and is within `max_head` bytes so far).
pub fn parse_request(
    buf: &mut BytesMut,
    max_head: usize,
) -> Result<Option<RequestHead>, HeadError> {
    parse::<false>(buf, max_head)
}

/// [`parse_request`], noting in the request's extensions how its names were spelled (a
/// [`crate::HeaderCase`], when some had capitals).
pub fn parse_request_keeping_case(
    buf: &mut BytesMut,
    max_head: usize,
) -> Result<Option<RequestHead>, HeadError> {
    parse::<true>(buf, max_head)
}

/// `KEEP_CASE` is a constant, not an argument: the plain parse carries no trace of the
/// spellings (no note, no empty list to drop), and is inlined where it is called.
fn parse<const KEEP_CASE: bool>(
    buf: &mut BytesMut,
    max_head: usize,
) -> Result<Option<RequestHead>, HeadError> {
    let mut fields: [MaybeUninit<httparse::Header<'_>>; MAX_HEADERS] =
        [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut fields,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= max_head => {
            return Err(HeadError::TooLarge { limit: max_head });
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
        Err(httparse::Error::Version) if names_a_version(buf) => return Err(HeadError::Version),
        Err(err) => return Err(HeadError::Malformed(malformed(err))),
    };
    if len > max_head {
        return Err(HeadError::TooLarge { limit: max_head });
    }
    let version = match req.version {
        Some(1) => Version::HTTP_11,
        Some(0) => Version::HTTP_10,
        _ => return Err(HeadError::Version),
    };
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Malformed("invalid method"))?;
    // The head is copied out (a few hundred bytes, into the thread's chunk of copies) and the
    // target and values are sliced from the copy. The read buffer then stays the connection's
    // alone and is refilled in place: one shared with a request's fields would need a new
    // allocation for the next read, and a shared-state one to be split.
    let head = HeadCopy::new(&buf[..len]);
    let slice = |s: &[u8]| head.slice(s);

    let uri = Uri::from_maybe_shared(slice(req.path.unwrap_or_default().as_bytes()))
        .map_err(|_| HeadError::InvalidTarget)?;
    // Room for the fields a proxy adds (request id, forwarding headers) without the map
    // growing, which would copy and rehash it.
    let mut headers = crate::maps::request_header_map(req.headers.len());
    let mut framing = Framing::new(version);
    let mut case = crate::HeaderCase::default();
    for field in req.headers.iter() {
        let name = crate::names::header_name(field.name.as_bytes())
            .map_err(|_| HeadError::Malformed("invalid header name"))?;
        let mut value = head.value(field);
        if name == CONTENT_LENGTH {
            match content_length_field(&mut framing.content_length, value) {
                Ok(Some(one)) => value = one,
                // A repeat of the first: one line goes on.
                Ok(None) => continue,
                Err(()) => return Err(HeadError::InvalidContentLength),
            }
        } else {
            framing.field(&name, &value)?;
        }
        if KEEP_CASE {
            case.note(&name, field.name.as_bytes(), || {
                slice(field.name.as_bytes())
            });
        }
        headers.append(name, value);
    }
    buf.advance(len);
    let body = framing.body()?;
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = headers;
    if KEEP_CASE && !case.is_empty() {
        request.extensions_mut().insert(case);
    }
    Ok(Some(RequestHead {
        request,
        body,
        keep_alive: framing.keep_alive(),
        expect_continue: framing.expect_continue && body != BodyLength::Empty,
    }))
}

/// A head copied out of the read buffer, and the pieces httparse found in the buffer sliced
/// from the copy: no allocation per field, and none per head on a warm thread.
pub(crate) struct HeadCopy {
    copy: Bytes,
    base: usize,
}

impl HeadCopy {
    pub(crate) fn new(head: &[u8]) -> Self {
        Self {
            copy: crate::copy_shared(head),
            base: head.as_ptr() as usize,
        }
    }

    /// The copy of `piece`, a slice of the head that was copied (a piece from elsewhere is
    /// copied on its own).
    pub(crate) fn slice(&self, piece: &[u8]) -> Bytes {
        match (piece.as_ptr() as usize).checked_sub(self.base) {
            Some(at) if at + piece.len() <= self.copy.len() => {
                self.copy.slice(at..at + piece.len())
            }
            _ => Bytes::copy_from_slice(piece),
        }
    }

    /// The copy of the value of a field httparse parsed (with its default configuration), as
    /// a header value.
    #[allow(unsafe_code)]
    pub(crate) fn value(&self, field: &httparse::Header<'_>) -> HeaderValue {
        let value = self.slice(field.value);
        // SAFETY: `HeaderValue` takes tab, 0x20 to 0x7e and 0x80 to 0xff, and httparse takes
        // into a value only those bytes (`is_header_value_token` and its SIMD scans agree),
        // never a CR or LF: the parsers here use `ParserConfig::default()`, which refuses
        // obsolete line folding (a test below holds them to it). Checking each byte again
        // costs a few instructions a byte. `http` states the contract as valid UTF-8, but
        // relies only on those bytes (`to_str` checks again, as for any obs-text value
        // `from_maybe_shared` takes; hyper builds its values so too), and it checks them in
        // debug builds, which the tests and the fuzz targets run.
        unsafe { HeaderValue::from_maybe_shared_unchecked(value) }
    }
}

/// Whether the request line ends in `HTTP/<digit>.<digit>`: a version, if not one of ours
/// (505), rather than something that is not HTTP at all (400).
fn names_a_version(buf: &[u8]) -> bool {
    let line = buf
        .split(|&b| b == b'\n')
        .find(|l| !l.trim_ascii().is_empty());
    line.map(<[u8]>::trim_ascii_end).is_some_and(|line| {
        line.len() >= 8 && {
            let v = &line[line.len() - 8..];
            v.starts_with(b"HTTP/")
                && v[5].is_ascii_digit()
                && v[6] == b'.'
                && v[7].is_ascii_digit()
        }
    })
}

fn malformed(err: httparse::Error) -> &'static str {
    match err {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid token in the request line",
        httparse::Error::Version => "not an HTTP request line",
        _ => "malformed head",
    }
}

/// What the header fields say about the body and the connection, as they are read.
struct Framing {
    version: Version,
    content_length: Option<u64>,
    /// Transfer-Encoding seen; whether its last coding so far is chunked.
    transfer_encoding: Option<bool>,
    chunked_count: usize,
    other_coding: bool,
    close: bool,
    keep_alive_token: bool,
    expect_continue: bool,
}

impl Framing {
    fn new(version: Version) -> Self {
        Self {
            version,
            content_length: None,
            transfer_encoding: None,
            chunked_count: 0,
            other_coding: false,
            close: false,
            keep_alive_token: false,
            expect_continue: false,
        }
    }

    /// Notes a field other than Content-Length ([`content_length_field`] reads those).
    fn field(&mut self, name: &HeaderName, value: &HeaderValue) -> Result<(), HeadError> {
        if name == TRANSFER_ENCODING {
            for coding in value.as_bytes().split(|&b| b == b',') {
                let coding = coding.trim_ascii();
                if coding.is_empty() {
                    continue;
                }
                let chunked = coding.eq_ignore_ascii_case(b"chunked");
                if chunked {
                    self.chunked_count += 1;
                } else {
                    self.other_coding = true;
                }
                self.transfer_encoding = Some(chunked);
            }
            if self.transfer_encoding.is_none() {
                return Err(HeadError::InvalidTransferEncoding);
            }
        } else if name == CONNECTION {
            self.close |= has_token(value.as_bytes(), b"close");
            self.keep_alive_token |= has_token(value.as_bytes(), b"keep-alive");
        } else if name == EXPECT {
            self.expect_continue = value
                .as_bytes()
                .trim_ascii()
                .eq_ignore_ascii_case(b"100-continue")
                && self.version == Version::HTTP_11;
        }
        Ok(())
    }

    fn body(&self) -> Result<BodyLength, HeadError> {
        match (self.transfer_encoding, self.content_length) {
            (Some(_), Some(_)) => Err(HeadError::ContentLengthAndTransferEncoding),
            (Some(_), None) if self.version == Version::HTTP_10 => {
                Err(HeadError::TransferEncodingInHttp10)
            }
            (Some(true), None) if self.chunked_count == 1 && !self.other_coding => {
                Ok(BodyLength::Chunked)
            }
            (Some(true), None) if self.chunked_count == 1 => {
                Err(HeadError::UnsupportedTransferCoding)
            }
            (Some(_), None) => Err(HeadError::InvalidTransferEncoding),
            (None, Some(0)) | (None, None) => Ok(BodyLength::Empty),
            (None, Some(len)) => Ok(BodyLength::Length(len)),
        }
    }

    fn keep_alive(&self) -> bool {
        !self.close && (self.version == Version::HTTP_11 || self.keep_alive_token)
    }
}

/// Reads a Content-Length field's `value` into `seen`: digits, or a list of the same digits
/// (`42, 42`), agreeing with any earlier field; `Err` otherwise. As RFC 9110 section 8.6 asks
/// of a recipient that takes such a message, one field with one value goes on: `Some` with
/// the first field's value (a list collapsed to its number), `None` for a field that repeats
/// it.
pub(crate) fn content_length_field(
    seen: &mut Option<u64>,
    value: HeaderValue,
) -> Result<Option<HeaderValue>, ()> {
    let bytes = value.as_bytes();
    let list = bytes.contains(&b',');
    // One number, the usual field: read without splitting.
    let len = if list {
        let mut len = None;
        for item in bytes.split(|&b| b == b',') {
            let item = parse_length(item.trim_ascii()).ok_or(())?;
            if len.is_some_and(|l| l != item) {
                return Err(());
            }
            len = Some(item);
        }
        len.ok_or(())?
    } else {
        parse_length(bytes.trim_ascii()).ok_or(())?
    };
    match *seen {
        Some(first) if first != len => Err(()),
        Some(_) => Ok(None),
        None => {
            *seen = Some(len);
            Ok(Some(if list { HeaderValue::from(len) } else { value }))
        }
    }
}

#[cfg(test)]
mod tests;
