use super::*;

fn parse(text: &str) -> Result<Option<RequestHead>, HeadError> {
    parse_request(&mut BytesMut::from(text.as_bytes()), 8192)
}

fn head(text: &str) -> RequestHead {
    parse(text).unwrap().unwrap()
}

#[test]
fn a_head_split_anywhere_parses_once_complete() {
    let text = b"GET /a?b=c HTTP/1.1\r\nHost: example.com\r\nX-Two: 1\r\nx-two: 2\r\n\r\nNEXT";
    for cut in 0..text.len() - 4 {
        let mut buf = BytesMut::from(&text[..cut]);
        assert!(
            parse_request(&mut buf, 8192).unwrap().is_none(),
            "cut at {cut}"
        );
    }
    let mut buf = BytesMut::from(&text[..]);
    let head = parse_request(&mut buf, 8192).unwrap().unwrap();
    assert_eq!(&buf[..], b"NEXT");
    let req = &head.request;
    assert_eq!(req.method(), Method::GET);
    assert_eq!(req.uri(), "/a?b=c");
    assert_eq!(req.version(), Version::HTTP_11);
    assert_eq!(req.headers()["host"], "example.com");
    let twos: Vec<_> = req.headers().get_all("x-two").iter().collect();
    assert_eq!(twos, ["1", "2"]);
    assert_eq!(head.body, BodyLength::Empty);
    assert!(head.keep_alive);
    assert!(!head.expect_continue);
}

#[test]
fn leading_empty_lines_and_absolute_targets() {
    let head = head("\r\nGET http://a.example/x HTTP/1.1\r\n\r\n");
    assert_eq!(head.request.uri().authority().unwrap(), "a.example");
    assert_eq!(head.request.uri().path(), "/x");
}

#[test]
fn body_lengths() {
    assert_eq!(
        head("POST / HTTP/1.1\r\ncontent-length: 42\r\n\r\n").body,
        BodyLength::Length(42)
    );
    assert_eq!(
        head("POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n").body,
        BodyLength::Empty
    );
    assert_eq!(
        head("POST / HTTP/1.1\r\ncontent-length: 7\r\ncontent-length: 7\r\n\r\n").body,
        BodyLength::Length(7)
    );
    assert_eq!(
        head("POST / HTTP/1.1\r\ncontent-length: 18446744073709551615\r\n\r\n").body,
        BodyLength::Length(u64::MAX)
    );
    assert_eq!(
        head("POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n").body,
        BodyLength::Chunked
    );
}

#[test]
fn smuggling_shapes_are_refused() {
    use HeadError::*;
    for (text, error) in [
        (
            "content-length: 3\r\ntransfer-encoding: chunked",
            ContentLengthAndTransferEncoding,
        ),
        (
            "transfer-encoding: chunked\r\ncontent-length: 3",
            ContentLengthAndTransferEncoding,
        ),
        (
            "transfer-encoding: chunked\r\ncontent-length: 0",
            ContentLengthAndTransferEncoding,
        ),
        (
            "content-length: 3\r\ncontent-length: 4",
            InvalidContentLength,
        ),
        ("content-length: 3, 4", InvalidContentLength),
        ("content-length: 3, 3, 4", InvalidContentLength),
        ("content-length: 3,", InvalidContentLength),
        (
            "content-length: 3\r\ncontent-length: 3, 4",
            InvalidContentLength,
        ),
        ("content-length: 18446744073709551616", InvalidContentLength),
        ("content-length: +3", InvalidContentLength),
        ("content-length: -1", InvalidContentLength),
        ("content-length: 3 3", InvalidContentLength),
        ("content-length: 0x10", InvalidContentLength),
        ("content-length: ", InvalidContentLength),
        ("content-length: 99999999999999999999", InvalidContentLength),
        ("transfer-encoding: gzip", InvalidTransferEncoding),
        ("transfer-encoding: chunked, gzip", InvalidTransferEncoding),
        (
            "transfer-encoding: chunked\r\ntransfer-encoding: chunked",
            InvalidTransferEncoding,
        ),
        (
            "transfer-encoding: chunked, chunked",
            InvalidTransferEncoding,
        ),
        ("transfer-encoding: ,", InvalidTransferEncoding),
        (
            "transfer-encoding: gzip, chunked",
            UnsupportedTransferCoding,
        ),
        (
            "transfer-encoding : chunked",
            Malformed("invalid header name"),
        ),
        (
            "transfer-encoding: chunked\r\n folded",
            Malformed("invalid header name"),
        ),
    ] {
        let text = format!("POST / HTTP/1.1\r\nhost: a\r\n{text}\r\n\r\n");
        assert_eq!(parse(&text).unwrap_err(), error, "{text:?}");
    }
    assert_eq!(
        parse("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n").unwrap_err(),
        HeadError::TransferEncodingInHttp10
    );
}

#[test]
fn statuses_of_refusals() {
    assert_eq!(parse("NOT HTTP AT ALL\r\n\r\n").unwrap_err().status(), 400);
    assert_eq!(parse("GET / HTTP/2.0\r\n\r\n").unwrap_err().status(), 505);
    assert_eq!(
        parse("POST / HTTP/1.1\r\ntransfer-encoding: br, chunked\r\n\r\n")
            .unwrap_err()
            .status(),
        501
    );
    let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
    let err = parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err();
    assert_eq!(err, HeadError::TooManyHeaders);
    assert_eq!(err.status(), 431);
}

#[test]
fn heads_over_the_limit() {
    let long = format!("GET / HTTP/1.1\r\nx: {}\r\n\r\n", "v".repeat(200));
    let err = parse_request(&mut BytesMut::from(long.as_bytes()), 100).unwrap_err();
    assert_eq!(err, HeadError::TooLarge { limit: 100 });
    // Incomplete but already too long: refused without waiting for the rest.
    let partial = &long[..150];
    let err = parse_request(&mut BytesMut::from(partial.as_bytes()), 100).unwrap_err();
    assert_eq!(err.status(), 431);
}

#[test]
fn connection_and_expect() {
    assert!(!head("GET / HTTP/1.1\r\nconnection: keep-alive, Close\r\n\r\n").keep_alive);
    assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive);
    assert!(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
    let with_body = head("PUT / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n");
    assert!(with_body.expect_continue);
    assert!(!head("GET / HTTP/1.1\r\nexpect: 100-continue\r\n\r\n").expect_continue);
}

#[test]
fn values_pass_as_sent() {
    let text = b"GET /a%zz HTTP/1.1\r\nhost: a b\r\nhost: c\r\nx: \xff\r\n\r\n";
    let head = parse_request(&mut BytesMut::from(&text[..]), 8192)
        .unwrap()
        .unwrap();
    assert_eq!(head.request.uri().path(), "/a%zz");
    assert_eq!(head.request.headers().get_all("host").iter().count(), 2);
    assert_eq!(head.request.headers()["x"].as_bytes(), b"\xff");
}

#[test]
fn repeated_content_lengths_go_on_as_one_field_with_one_value() {
    // RFC 9110 section 8.6: a recipient that takes such a message replaces the list with one
    // valid value before forwarding.
    for text in [
        "content-length: 7\r\ncontent-length: 7",
        "content-length: 7, 7",
        "content-length: 7,7\r\ncontent-length: 7",
        "content-length: 7\r\nx-a: 1\r\ncontent-length: 7 , 7",
    ] {
        let head = head(&format!("POST / HTTP/1.1\r\n{text}\r\n\r\n"));
        assert_eq!(head.body, BodyLength::Length(7), "{text}");
        let values: Vec<_> = head
            .request
            .headers()
            .get_all("content-length")
            .iter()
            .collect();
        assert_eq!(values, ["7"], "{text}");
    }
}

#[test]
fn values_are_the_bytes_header_values_take_and_folded_lines_are_refused() {
    // Values are made without checking their bytes again (`HeadCopy::value`): only what
    // httparse takes may reach them.
    let head = head("GET / HTTP/1.1\r\nX-A: caf\u{e9}\tau lait\r\n\r\n");
    assert_eq!(
        head.request.headers()["x-a"].as_bytes(),
        "caf\u{e9}\tau lait".as_bytes()
    );
    for refused in [
        "GET / HTTP/1.1\r\nX-A: one\r\n two\r\n\r\n",
        "GET / HTTP/1.1\r\nX-A: a\x01b\r\n\r\n",
        "GET / HTTP/1.1\r\nX-A: a\x7fb\r\n\r\n",
        "GET / HTTP/1.1\r\nX-A: a\rb\r\n\r\n",
    ] {
        assert!(parse(refused).is_err(), "{refused:?}");
    }
}
