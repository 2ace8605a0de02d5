//! Response heads and the framing of response bodies: the status line and header fields
//! written in one buffer, with the one length the body will be sent with.

use std::fmt::Write as _;

use bytes::{BufMut, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, StatusCode, Version};

use crate::field_values::{FramingFields, parse_length};

/// How a response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseLength {
    /// No body follows the head: HEAD, 1xx, 204, 304.
    NoBody,
    Length(u64),
    Chunked,
    /// The body ends when the connection closes (an HTTP/1.0 client and no known length).
    UntilClose,
}

/// What the response's head depends on about the request it answers.
#[derive(Debug, Clone, Copy)]
pub struct Answering {
    pub head_request: bool,
    /// The request is a CONNECT: a 2xx answer opens a tunnel, and its head frames no body
    /// (RFC 9110 section 9.3.6).
    pub connect: bool,
    pub version: Version,
    /// Whether the connection may stay open after this exchange (the client's wish and the
    /// server's).
    pub keep_alive: bool,
}

/// A written head: how its body goes, and whether the connection stays open after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framed {
    pub length: ResponseLength,
    pub keep_alive: bool,
}

/// Writes the status line and header fields of a response into `out`. `exact_len` is the
/// body's length when known before it is sent (a local reply, or an upstream's
/// Content-Length). The response's own `Content-Length` or `Transfer-Encoding` are kept when
/// they say how its body goes; otherwise the fitting one is added. `Connection: close` is
/// added when the connection will close, and `Date` when the response has none.
pub fn encode_head(
    status: StatusCode,
    headers: &HeaderMap,
    exact_len: Option<u64>,
    answering: Answering,
    out: &mut BytesMut,
) -> Framed {
    encode_head_cased(status, headers, None, exact_len, answering, out)
}

/// [`encode_head`], writing the names `case` spells as it spells them.
pub fn encode_head_cased(
    status: StatusCode,
    headers: &HeaderMap,
    case: Option<&crate::HeaderCase>,
    exact_len: Option<u64>,
    answering: Answering,
    out: &mut BytesMut,
) -> Framed {
    let mut keep_alive = answering.keep_alive;
    let framing = FramingFields::of(headers);
    let says_close = framing.says_close;
    keep_alive &= !says_close;
    let bodiless_status = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let declared = (framing.content_length).and_then(|v| parse_length(v.as_bytes()));
    let te_chunked = (framing.transfer_encoding).map(|v| last_token_is(v.as_bytes(), b"chunked"));
    // Which of the response's own framing fields are written, and what is added.
    let mut keep_te = false;
    let mut keep_cl = false;
    let mut add = Added::None;
    let length = if answering.connect && status.is_success() {
        // Bytes after this head are the tunnel's: no length and no coding describe them.
        ResponseLength::NoBody
    } else if answering.head_request || bodiless_status {
        // The head describes a body that is not sent; 1xx and 204 never have one.
        keep_cl = !status.is_informational() && status != StatusCode::NO_CONTENT;
        keep_te = keep_cl && answering.version == Version::HTTP_11;
        ResponseLength::NoBody
    } else if let Some(chunked) = te_chunked {
        if answering.version == Version::HTTP_11 && chunked {
            keep_te = true;
            ResponseLength::Chunked
        } else if answering.version == Version::HTTP_11 {
            // Another coding last: the body runs to the close (RFC 9112 section 6.3).
            keep_te = true;
            ResponseLength::UntilClose
        } else {
            ResponseLength::UntilClose
        }
    } else if let Some(len) = declared {
        keep_cl = true;
        ResponseLength::Length(len)
    } else if let Some(len) = exact_len {
        add = Added::ContentLength(len);
        ResponseLength::Length(len)
    } else if answering.version == Version::HTTP_11 {
        add = Added::Chunked;
        ResponseLength::Chunked
    } else {
        ResponseLength::UntilClose
    };
    if length == ResponseLength::UntilClose {
        keep_alive = false;
    }

    out.reserve(64 + headers.len() * 32);
    out.put_slice(b"HTTP/1.1 ");
    out.put_slice(status.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.put_slice(b"\r\n");
    let mut has_date = false;
    for (name, value) in headers {
        if name == CONTENT_LENGTH && !keep_cl
            || name == TRANSFER_ENCODING && !keep_te
            || name == CONNECTION
                && !says_close
                && !keep_alive
                && status != StatusCode::SWITCHING_PROTOCOLS
        {
            continue;
        }
        has_date |= name == DATE;
        field(out, crate::case::spelled(case, name), value.as_bytes());
    }
    match add {
        Added::None => {}
        Added::ContentLength(len) => {
            let mut digits = [0u8; 20];
            field(out, b"content-length", decimal(len, &mut digits));
        }
        Added::Chunked => field(out, b"transfer-encoding", b"chunked"),
    }
    if !keep_alive && !says_close && status != StatusCode::SWITCHING_PROTOCOLS {
        field(out, b"connection", b"close");
    } else if keep_alive && answering.version == Version::HTTP_10 {
        field(out, b"connection", b"keep-alive");
    }
    if !has_date {
        crate::date::with(|date| field(out, b"date", date));
    }
    out.put_slice(b"\r\n");
    Framed { length, keep_alive }
}

enum Added {
    None,
    ContentLength(u64),
    Chunked,
}

pub(crate) fn field(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_slice(name);
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// `n` in decimal, written at the end of `buf`.
pub(crate) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Writes one chunk of a chunked body (nothing for empty data: that would end the body).
pub fn encode_chunk(data: &[u8], out: &mut BytesMut) {
    if data.is_empty() {
        return;
    }
    encode_chunk_header(data.len(), out);
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// Writes the size line of a chunk of `len` bytes (non-zero), for data written from its own
/// memory; a CRLF must follow the data.
pub fn encode_chunk_header(len: usize, out: &mut BytesMut) {
    let _ = write!(out, "{len:X}\r\n");
}

/// Writes the last chunk of a chunked body, with its trailer fields. Fields that would change
/// the message's framing are left out.
pub fn encode_last_chunk(trailers: Option<&HeaderMap>, out: &mut BytesMut) {
    encode_last_chunk_with(trailers, |name| !is_framing(name), out);
}

/// Writes the last chunk of a chunked body with the trailer fields `send` keeps.
pub(crate) fn encode_last_chunk_with(
    trailers: Option<&HeaderMap>,
    send: impl Fn(&HeaderName) -> bool,
    out: &mut BytesMut,
) {
    out.put_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        if send(name) {
            field(out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    out.put_slice(b"\r\n");
}

/// Fields that say how a message is delimited or routed, never taken from a trailer section.
pub fn is_framing(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "upgrade"
            | "te"
            | "trailer"
            | "host"
    )
}

pub(crate) fn last_token_is(list: &[u8], token: &[u8]) -> bool {
    list.split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .rfind(|t| !t.is_empty())
        .is_some_and(|t| t.eq_ignore_ascii_case(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(
        status: u16,
        fields: &[(&str, &str)],
        exact: Option<u64>,
        answering: Answering,
    ) -> (String, Framed) {
        let mut headers = HeaderMap::new();
        for (n, v) in fields {
            headers.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let mut out = BytesMut::new();
        let framed = encode_head(
            StatusCode::from_u16(status).unwrap(),
            &headers,
            exact,
            answering,
            &mut out,
        );
        let text = String::from_utf8(out.to_vec()).unwrap();
        // The date changes; everything else is compared whole.
        let text = text
            .lines()
            .filter(|l| !l.starts_with("date: "))
            .collect::<Vec<_>>()
            .join("\n");
        (text, framed)
    }

    const GET11: Answering = Answering {
        head_request: false,
        connect: false,
        version: Version::HTTP_11,
        keep_alive: true,
    };

    #[test]
    fn known_length_is_added() {
        let (text, framed) = head(200, &[("x-a", "1")], Some(5), GET11);
        assert_eq!(text, "HTTP/1.1 200 OK\nx-a: 1\ncontent-length: 5\n");
        assert_eq!(framed.length, ResponseLength::Length(5));
        assert!(framed.keep_alive);
    }

    #[test]
    fn unknown_length_is_chunked_or_until_close() {
        let (text, framed) = head(200, &[], None, GET11);
        assert_eq!(text, "HTTP/1.1 200 OK\ntransfer-encoding: chunked\n");
        assert_eq!(framed.length, ResponseLength::Chunked);
        let old = Answering {
            version: Version::HTTP_10,
            keep_alive: true,
            ..GET11
        };
        let (text, framed) = head(200, &[], None, old);
        assert_eq!(text, "HTTP/1.1 200 OK\nconnection: close\n");
        assert_eq!(framed.length, ResponseLength::UntilClose);
        assert!(!framed.keep_alive);
    }

    #[test]
    fn declared_length_and_encoding_are_kept() {
        let (text, framed) = head(200, &[("content-length", "7")], Some(7), GET11);
        assert_eq!(text, "HTTP/1.1 200 OK\ncontent-length: 7\n");
        assert_eq!(framed.length, ResponseLength::Length(7));
        let (text, framed) = head(200, &[("transfer-encoding", "chunked")], None, GET11);
        assert_eq!(text, "HTTP/1.1 200 OK\ntransfer-encoding: chunked\n");
        assert_eq!(framed.length, ResponseLength::Chunked);
    }

    #[test]
    fn head_and_bodiless_statuses() {
        let head_req = Answering {
            head_request: true,
            ..GET11
        };
        let (text, framed) = head(200, &[("content-length", "42")], None, head_req);
        assert_eq!(text, "HTTP/1.1 200 OK\ncontent-length: 42\n");
        assert_eq!(framed.length, ResponseLength::NoBody);
        let (text, _) = head(204, &[("content-length", "0")], Some(0), GET11);
        assert_eq!(text, "HTTP/1.1 204 No Content\n");
        let (text, _) = head(304, &[("content-length", "9")], None, GET11);
        assert_eq!(text, "HTTP/1.1 304 Not Modified\ncontent-length: 9\n");
    }

    #[test]
    fn a_2xx_to_connect_frames_no_body() {
        let connect = Answering {
            connect: true,
            ..GET11
        };
        let (text, framed) = head(200, &[("content-length", "0")], Some(0), connect);
        assert_eq!(text, "HTTP/1.1 200 OK\n");
        assert_eq!(framed.length, ResponseLength::NoBody);
        let (text, _) = head(200, &[("transfer-encoding", "chunked")], None, connect);
        assert_eq!(text, "HTTP/1.1 200 OK\n");
        // A refusal is a response like any other.
        let (text, framed) = head(403, &[], Some(4), connect);
        assert_eq!(text, "HTTP/1.1 403 Forbidden\ncontent-length: 4\n");
        assert_eq!(framed.length, ResponseLength::Length(4));
    }

    #[test]
    fn closing_is_said() {
        let closing = Answering {
            keep_alive: false,
            ..GET11
        };
        let (text, framed) = head(200, &[], Some(0), closing);
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\ncontent-length: 0\nconnection: close\n"
        );
        assert!(!framed.keep_alive);
        let (text, framed) = head(200, &[("connection", "close")], Some(0), GET11);
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\nconnection: close\ncontent-length: 0\n"
        );
        assert!(!framed.keep_alive);
        let old_keep = Answering {
            version: Version::HTTP_10,
            ..GET11
        };
        let (text, framed) = head(200, &[], Some(2), old_keep);
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\ncontent-length: 2\nconnection: keep-alive\n"
        );
        assert!(framed.keep_alive);
    }

    #[test]
    fn switching_protocols_keeps_its_fields() {
        let (text, framed) = head(
            101,
            &[("connection", "upgrade"), ("upgrade", "websocket")],
            None,
            GET11,
        );
        assert_eq!(
            text,
            "HTTP/1.1 101 Switching Protocols\nconnection: upgrade\nupgrade: websocket\n"
        );
        assert_eq!(framed.length, ResponseLength::NoBody);
    }

    #[test]
    fn chunks() {
        let mut out = BytesMut::new();
        encode_chunk(b"", &mut out);
        encode_chunk(&[b'a'; 26], &mut out);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("content-length", "1".parse().unwrap());
        encode_last_chunk(Some(&trailers), &mut out);
        assert_eq!(
            &out[..],
            b"1A\r\naaaaaaaaaaaaaaaaaaaaaaaaaa\r\n0\r\ngrpc-status: 0\r\n\r\n"
        );
    }
}
