use bytes::BytesMut;
use http::{HeaderValue, Method, Request, StatusCode, Version};

use super::*;
use crate::{BodyError, BodyLength, ResponseLength, parse_request};

fn request(method: Method, target: &str, fields: &[(&str, &str)]) -> Request<()> {
    let mut req = Request::builder().method(method).uri(target);
    for (name, value) in fields {
        req = req.header(*name, *value);
    }
    req.body(()).unwrap()
}

fn encoded(head: &Request<()>, body: OutgoingBody) -> (String, BodyLength) {
    let mut out = BytesMut::new();
    let length = encode_request_head(head, body, &mut out);
    (String::from_utf8(out.to_vec()).unwrap(), length)
}

#[test]
fn a_get_without_a_body_is_written_as_it_is() {
    let head = request(
        Method::GET,
        "/a/b?c=d",
        &[("host", "example.com"), ("x-id", "1")],
    );
    let (text, length) = encoded(&head, OutgoingBody::None);
    assert_eq!(
        text,
        "GET /a/b?c=d HTTP/1.1\r\nhost: example.com\r\nx-id: 1\r\n\r\n"
    );
    assert_eq!(length, BodyLength::Empty);
}

#[test]
fn a_body_of_known_length_gets_a_content_length() {
    let head = request(Method::POST, "/up", &[("host", "a")]);
    let (text, length) = encoded(&head, OutgoingBody::Known(3));
    assert_eq!(
        text,
        "POST /up HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\n"
    );
    assert_eq!(length, BodyLength::Length(3));
}

#[test]
fn the_requests_own_content_length_is_kept() {
    let head = request(Method::PUT, "/up", &[("content-length", "5")]);
    let (text, length) = encoded(&head, OutgoingBody::Unknown);
    assert_eq!(text, "PUT /up HTTP/1.1\r\ncontent-length: 5\r\n\r\n");
    assert_eq!(length, BodyLength::Length(5));
}

#[test]
fn a_body_of_unknown_length_is_chunked_except_on_get_head_and_connect() {
    let head = request(Method::POST, "/up", &[]);
    let (text, length) = encoded(&head, OutgoingBody::Unknown);
    assert_eq!(
        text,
        "POST /up HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    assert_eq!(length, BodyLength::Chunked);
    for method in [Method::GET, Method::HEAD] {
        let head = request(method, "/", &[]);
        let (text, length) = encoded(&head, OutgoingBody::Unknown);
        assert!(!text.contains("transfer-encoding"), "{text}");
        assert_eq!(length, BodyLength::Empty);
    }
}

#[test]
fn transfer_encoding_wins_over_content_length_and_ends_in_chunked() {
    let head = request(
        Method::POST,
        "/",
        &[("transfer-encoding", "gzip"), ("content-length", "9")],
    );
    let (text, length) = encoded(&head, OutgoingBody::Unknown);
    assert_eq!(
        text,
        "POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n"
    );
    assert_eq!(length, BodyLength::Chunked);

    let head = request(Method::POST, "/", &[("transfer-encoding", "chunked")]);
    let (text, length) = encoded(&head, OutgoingBody::Known(4));
    assert_eq!(
        text,
        "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    assert_eq!(length, BodyLength::Chunked);
}

#[test]
fn a_request_without_a_body_drops_transfer_encoding_but_keeps_content_length() {
    let head = request(
        Method::POST,
        "/",
        &[("transfer-encoding", "chunked"), ("content-length", "0")],
    );
    let (text, length) = encoded(&head, OutgoingBody::None);
    assert_eq!(text, "POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(length, BodyLength::Empty);
}

#[test]
fn http10_requests_are_never_chunked() {
    let mut head = request(Method::POST, "/", &[("transfer-encoding", "chunked")]);
    *head.version_mut() = Version::HTTP_10;
    let (text, length) = encoded(&head, OutgoingBody::Unknown);
    assert_eq!(text, "POST / HTTP/1.0\r\n\r\n");
    assert_eq!(length, BodyLength::Empty);
    let (text, length) = encoded(&head, OutgoingBody::Known(2));
    assert_eq!(text, "POST / HTTP/1.0\r\ncontent-length: 2\r\n\r\n");
    assert_eq!(length, BodyLength::Length(2));
}

#[test]
fn targets_connect_and_empty_paths() {
    let head = request(Method::CONNECT, "example.com:443", &[]);
    assert!(
        encoded(&head, OutgoingBody::None)
            .0
            .starts_with("CONNECT example.com:443 HTTP/1.1\r\n")
    );
    let head = request(Method::OPTIONS, "*", &[]);
    assert!(
        encoded(&head, OutgoingBody::None)
            .0
            .starts_with("OPTIONS * HTTP/1.1\r\n")
    );
    let head = request(Method::GET, "http://example.com", &[]);
    assert!(
        encoded(&head, OutgoingBody::None)
            .0
            .starts_with("GET / HTTP/1.1\r\n")
    );
}

/// What the server side of the codec reads from what the client side writes: the same
/// request, and the same framing.
#[test]
fn written_requests_parse_back_with_the_same_framing() {
    let cases = [
        (
            request(Method::GET, "/x?y", &[("host", "a")]),
            OutgoingBody::None,
        ),
        (
            request(Method::POST, "/", &[("host", "a")]),
            OutgoingBody::Known(7),
        ),
        (
            request(Method::POST, "/", &[("host", "a")]),
            OutgoingBody::Unknown,
        ),
        (
            request(Method::PATCH, "/", &[("content-length", "3")]),
            OutgoingBody::Known(3),
        ),
    ];
    for (head, body) in cases {
        let mut out = BytesMut::new();
        let length = encode_request_head(&head, body, &mut out);
        let parsed = parse_request(&mut out, 8192).unwrap().unwrap();
        assert_eq!(parsed.body, length);
        assert_eq!(parsed.request.method(), head.method());
        assert_eq!(
            parsed.request.uri().path_and_query(),
            head.uri().path_and_query()
        );
        for (name, value) in head.headers() {
            assert_eq!(parsed.request.headers().get(name), Some(value));
        }
        assert!(out.is_empty());
    }
}

fn parsed(bytes: &[u8], head_request: bool) -> Result<Option<ResponseHead>, ResponseError> {
    parse_response(&mut BytesMut::from(bytes), 8192, head_request)
}

fn length_of(bytes: &[u8]) -> Result<(ResponseLength, bool), ResponseError> {
    parsed(bytes, false).map(|head| {
        let head = head.unwrap();
        (head.length, head.keep_alive)
    })
}

#[test]
fn a_response_head_is_split_off_and_its_body_left() {
    let mut buf =
        BytesMut::from(&b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-a: b\r\n\r\nabcHTTP"[..]);
    let head = parse_response(&mut buf, 8192, false).unwrap().unwrap();
    assert_eq!(head.parts.status, StatusCode::OK);
    assert_eq!(head.parts.version, Version::HTTP_11);
    assert_eq!(
        head.parts.headers.get("x-a"),
        Some(&HeaderValue::from_static("b"))
    );
    assert_eq!(head.length, ResponseLength::Length(3));
    assert!(head.keep_alive);
    assert_eq!(&buf[..], b"abcHTTP");
}

#[test]
fn a_head_split_byte_by_byte_is_read_when_whole() {
    let whole = b"HTTP/1.1 204 No Content\r\nx: y\r\n\r\n";
    let mut buf = BytesMut::new();
    for (i, byte) in whole.iter().enumerate() {
        buf.extend_from_slice(&[*byte]);
        let head = parse_response(&mut buf, 8192, false).unwrap();
        assert_eq!(
            head.is_some(),
            i == whole.len() - 1,
            "after {} bytes",
            i + 1
        );
    }
    assert!(buf.is_empty());
}

#[test]
fn how_response_bodies_are_delimited() {
    use ResponseLength::*;
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
        Ok((Chunked, true))
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
        Ok((Length(0), true))
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n"),
        Ok((Length(5), true))
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\n\r\n"),
        Ok((UntilClose, false))
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
        Ok((UntilClose, false))
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
        Ok((Chunked, true))
    );
    for status in [
        "100 Continue",
        "101 Switching Protocols",
        "204 No Content",
        "304 Not Modified",
    ] {
        let head = format!("HTTP/1.1 {status}\r\ncontent-length: 10\r\n\r\n");
        assert_eq!(length_of(head.as_bytes()), Ok((NoBody, true)), "{status}");
    }
    let head = parsed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n", true)
        .unwrap()
        .unwrap();
    assert_eq!(head.length, NoBody);
}

#[test]
fn whether_the_connection_stays_open() {
    use ResponseLength::*;
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n"),
        Ok((Length(1), false))
    );
    assert_eq!(
        length_of(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n"),
        Ok((Length(1), false))
    );
    assert_eq!(
        length_of(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n"),
        Ok((Length(1), true))
    );
}

#[test]
fn ambiguous_framing_is_refused() {
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"),
        Err(ResponseError::ContentLengthAndTransferEncoding)
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n"),
        Err(ResponseError::InvalidContentLength)
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ncontent-length: +3\r\n\r\n"),
        Err(ResponseError::InvalidContentLength)
    );
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n"),
        Err(ResponseError::ChunkedTwice)
    );
    assert_eq!(
        length_of(b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
        Err(ResponseError::TransferEncodingInHttp10)
    );
    assert_eq!(
        length_of(b"HTTP/2.0 200 OK\r\n\r\n"),
        Err(ResponseError::Version)
    );
    assert!(matches!(
        length_of(b"HTTP/1.1 2x0 OK\r\n\r\n"),
        Err(ResponseError::Malformed(_))
    ));
    assert!(matches!(
        length_of(b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n"),
        Err(ResponseError::Malformed(_))
    ));
}

#[test]
fn heads_over_the_limit_are_refused() {
    let mut big = b"HTTP/1.1 200 OK\r\n".to_vec();
    big.extend(std::iter::repeat_n(b'a', 300));
    assert_eq!(
        parse_response(&mut BytesMut::from(&big[..]), 256, false).unwrap_err(),
        ResponseError::TooLarge { limit: 256 }
    );
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..=crate::MAX_HEADERS {
        many.extend(format!("x-{i}: v\r\n").bytes());
    }
    many.extend(b"\r\n");
    assert_eq!(
        parse_response(&mut BytesMut::from(&many[..]), 64 * 1024, false).unwrap_err(),
        ResponseError::TooManyHeaders
    );
}

/// Decodes all of `input`, fed in pieces of `step` bytes, then the connection's close.
fn decode_all(
    length: ResponseLength,
    input: &[u8],
    step: usize,
) -> Result<(Vec<u8>, Option<http::HeaderMap>, BytesMut), BodyError> {
    let mut decoder = ResponseDecoder::new(length, 1024);
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    let mut pieces = input.chunks(step);
    loop {
        match decoder.decode(&mut buf)? {
            Decoded::Data(data) => body.extend_from_slice(&data),
            Decoded::Trailers(trailers) => return Ok((body, Some(trailers), buf)),
            Decoded::End => return Ok((body, None, buf)),
            Decoded::NeedMore => match pieces.next() {
                Some(piece) => buf.extend_from_slice(piece),
                None => {
                    decoder.eof()?;
                    assert!(decoder.is_done());
                }
            },
        }
    }
}

#[test]
fn bodies_decode_across_reads_and_leave_what_follows() {
    for step in [1, 2, 7, 1000] {
        let (body, trailers, rest) =
            decode_all(ResponseLength::Length(5), b"helloHTTP/1.1", step).unwrap();
        assert_eq!(body, b"hello");
        assert!(trailers.is_none());
        // Only what was fed before the body's end is left; nothing past it was asked for.
        assert!(b"HTTP/1.1".starts_with(&rest), "{rest:?}");

        let chunked = b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-sum: 9\r\n\r\nNEXT";
        let (body, trailers, _) = decode_all(ResponseLength::Chunked, chunked, step).unwrap();
        assert_eq!(body, b"abcde");
        assert_eq!(trailers.unwrap().get("x-sum").unwrap(), "9");

        let (body, _, _) = decode_all(ResponseLength::UntilClose, b"all of it", step).unwrap();
        assert_eq!(body, b"all of it");
    }
}

#[test]
fn a_close_before_the_end_is_an_error_except_for_a_body_delimited_by_it() {
    assert_eq!(
        decode_all(ResponseLength::Length(10), b"short", 3).unwrap_err(),
        BodyError::Incomplete
    );
    assert_eq!(
        decode_all(ResponseLength::Chunked, b"5\r\nab", 3).unwrap_err(),
        BodyError::Incomplete
    );
    assert!(
        decode_all(ResponseLength::NoBody, b"", 1)
            .unwrap()
            .0
            .is_empty()
    );
}

#[test]
fn reads_ask_for_no_more_room_than_the_body_has_left() {
    let decoder = ResponseDecoder::new(ResponseLength::Length(10), 1024);
    assert_eq!(decoder.next_read(4096), 10);
    assert_eq!(decoder.remaining(), Some(10));
    let decoder = ResponseDecoder::new(ResponseLength::Chunked, 1024);
    assert_eq!(decoder.next_read(4096), 4096);
    assert_eq!(decoder.remaining(), None);
}

#[test]
fn names_keep_the_spelling_read_when_asked() {
    let mut buf = BytesMut::from(
        &b"GET / HTTP/1.1\r\nHost: a\r\nX-Trace-ID: 1\r\nx-lower: 2\r\nX-Trace-Id: 3\r\n\r\n"[..],
    );
    let head = crate::parse_request_keeping_case(&mut buf, 8192)
        .unwrap()
        .unwrap();
    let mut out = BytesMut::new();
    encode_request_head_cased(&head.request, OutgoingBody::None, true, &mut out);
    // One spelling per name (the first read), lower case where none had capitals.
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        "GET / HTTP/1.1\r\nHost: a\r\nX-Trace-ID: 1\r\nX-Trace-ID: 3\r\nx-lower: 2\r\n\r\n"
    );
    let mut plain = BytesMut::new();
    encode_request_head_cased(&head.request, OutgoingBody::None, false, &mut plain);
    assert!(
        std::str::from_utf8(&plain)
            .unwrap()
            .contains("x-trace-id: 1")
    );
    // Without asking, nothing is noted.
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..]);
    let head = crate::parse_request(&mut buf, 8192).unwrap().unwrap();
    assert!(
        head.request
            .extensions()
            .get::<crate::HeaderCase>()
            .is_none()
    );

    let mut buf =
        BytesMut::from(&b"HTTP/1.1 200 OK\r\nX-Served-By: u\r\nContent-Length: 0\r\n\r\n"[..]);
    let res = parse_response_keeping_case(&mut buf, 8192, false)
        .unwrap()
        .unwrap();
    let case = res.parts.extensions.get::<crate::HeaderCase>();
    let mut out = BytesMut::new();
    crate::encode_head_cased(
        res.parts.status,
        &res.parts.headers,
        case,
        Some(0),
        crate::Answering {
            version: http::Version::HTTP_11,
            keep_alive: true,
            head_request: false,
            connect: false,
        },
        &mut out,
    );
    let text = std::str::from_utf8(&out).unwrap();
    assert!(
        text.contains("X-Served-By: u\r\nContent-Length: 0\r\n"),
        "{text}"
    );
}

#[test]
fn repeated_content_lengths_of_a_response_go_on_as_one_field_with_one_value() {
    for text in [
        "content-length: 2\r\ncontent-length: 2",
        "content-length: 2, 2",
    ] {
        let bytes = format!("HTTP/1.1 200 OK\r\n{text}\r\n\r\nok");
        let head = parsed(bytes.as_bytes(), false).unwrap().unwrap();
        assert_eq!(head.length, ResponseLength::Length(2), "{text}");
        let values: Vec<_> = head
            .parts
            .headers
            .get_all("content-length")
            .iter()
            .collect();
        assert_eq!(values, ["2"], "{text}");
    }
    assert_eq!(
        length_of(b"HTTP/1.1 200 OK\r\ncontent-length: 2, 3\r\n\r\n"),
        Err(ResponseError::InvalidContentLength)
    );
}

#[test]
fn response_values_are_the_bytes_header_values_take_and_folded_lines_are_refused() {
    // Values are made without checking their bytes again (`HeadCopy::value`): only what
    // httparse takes may reach them, and its default refuses obsolete line folding.
    let head = parsed(
        b"HTTP/1.1 200 OK\r\nX-A: caf\xe9\tau\r\nContent-Length: 0\r\n\r\n",
        false,
    )
    .unwrap()
    .unwrap();
    assert_eq!(head.parts.headers["x-a"].as_bytes(), b"caf\xe9\tau");
    for refused in [
        &b"HTTP/1.1 200 OK\r\nX-A: one\r\n two\r\nContent-Length: 0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\nContent-Length: 0\r\n\r\n",
    ] {
        assert!(
            parsed(refused, false).is_err(),
            "{:?}",
            String::from_utf8_lossy(refused)
        );
    }
}
