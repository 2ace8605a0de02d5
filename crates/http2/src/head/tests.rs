//! Heads made of fields, and the malformed ones RFC 9113 section 8 names.

use bytes::Bytes;

use super::*;

fn fields(list: &[(&str, &str)]) -> Vec<Field> {
    list.iter()
        .map(|(n, v)| Field {
            name: Bytes::copy_from_slice(n.as_bytes()),
            value: Bytes::copy_from_slice(v.as_bytes()),
            never_indexed: false,
        })
        .collect()
}

const GET: [(&str, &str); 4] = [
    (":method", "GET"),
    (":scheme", "https"),
    (":authority", "example.com"),
    (":path", "/a?b=c"),
];

fn with(extra: &[(&'static str, &'static str)]) -> Vec<Field> {
    let mut list = GET.to_vec();
    list.extend_from_slice(extra);
    fields(&list)
}

fn refused(list: Vec<Field>) -> HeadError {
    request(list, false).expect_err("malformed")
}

#[test]
fn a_request_has_its_parts() {
    let head = request(with(&[("accept", "*/*"), ("content-length", "5")]), false).expect("ok");
    assert_eq!(head.parts.method, Method::GET);
    assert_eq!(head.parts.uri.to_string(), "https://example.com/a?b=c");
    assert_eq!(head.parts.version, Version::HTTP_2);
    assert_eq!(head.parts.headers["accept"], "*/*");
    assert_eq!(head.content_length, Some(5));
}

#[test]
fn pseudo_fields_missing_repeated_unknown_or_late() {
    assert_eq!(refused(fields(&GET[1..])), HeadError::Missing(":method"));
    assert_eq!(
        refused(fields(&[GET[0], GET[1], GET[2]])),
        HeadError::Missing(":path")
    );
    assert_eq!(
        refused(with(&[(":path", "/again")])),
        HeadError::Repeated(":path")
    );
    assert_eq!(
        refused(with(&[(":status", "200")])),
        HeadError::UnknownPseudo
    );
    let mut late = fields(&[("accept", "*/*")]);
    late.extend(fields(&GET));
    assert_eq!(refused(late), HeadError::PseudoAfterRegular);
    assert_eq!(
        refused(fields(&[GET[0], GET[1], GET[2], (":path", "")])),
        HeadError::InvalidPath
    );
    assert_eq!(
        refused(fields(&[GET[0], GET[1], GET[2], (":path", "a")])),
        HeadError::InvalidPath
    );
    assert_eq!(
        refused(fields(&[
            GET[0],
            GET[1],
            (":authority", "u@example.com"),
            GET[3]
        ])),
        HeadError::InvalidAuthority
    );
}

#[test]
fn names_values_and_connection_fields() {
    assert_eq!(refused(with(&[("Accept", "x")])), HeadError::InvalidName);
    assert_eq!(refused(with(&[("accept", " x")])), HeadError::InvalidValue);
    assert_eq!(refused(with(&[("accept", "x\t")])), HeadError::InvalidValue);
    assert_eq!(
        refused(with(&[("accept", "a\rb")])),
        HeadError::InvalidValue
    );
    assert_eq!(
        refused(with(&[("connection", "close")])),
        HeadError::ConnectionSpecific("connection")
    );
    assert_eq!(
        refused(with(&[("transfer-encoding", "chunked")])),
        HeadError::ConnectionSpecific("transfer-encoding")
    );
    assert_eq!(refused(with(&[("te", "gzip")])), HeadError::TeNotTrailers);
    assert!(request(with(&[("te", "trailers")]), false).is_ok());
}

#[test]
fn lengths_and_hosts() {
    assert_eq!(
        refused(with(&[("content-length", "5"), ("content-length", "6")])),
        HeadError::InvalidContentLength
    );
    assert_eq!(
        refused(with(&[("content-length", "+5")])),
        HeadError::InvalidContentLength
    );
    let same = request(
        with(&[("content-length", "5"), ("content-length", "5")]),
        false,
    )
    .expect("the same length twice");
    assert_eq!(
        same.parts.headers.get_all("content-length").iter().count(),
        1
    );
    assert_eq!(
        refused(with(&[("host", "other.example")])),
        HeadError::HostDiffers
    );
    assert!(request(with(&[("host", "EXAMPLE.com")]), false).is_ok());
}

#[test]
fn cookie_crumbs_are_joined_and_credentials_stay_sensitive() {
    let mut list = with(&[("cookie", "a=1"), ("accept", "*/*"), ("cookie", "b=2")]);
    list.push(Field {
        name: Bytes::from_static(b"authorization"),
        value: Bytes::from_static(b"Bearer t"),
        never_indexed: true,
    });
    let head = request(list, false).expect("ok");
    assert_eq!(head.parts.headers["cookie"], "a=1; b=2");
    assert!(head.parts.headers["authorization"].is_sensitive());
}

#[test]
fn connect_plain_and_extended() {
    let tunnel = request(
        fields(&[(":method", "CONNECT"), (":authority", "db.internal:5432")]),
        false,
    )
    .expect("a tunnel");
    assert_eq!(
        tunnel.parts.uri.authority().map(|a| a.as_str()),
        Some("db.internal:5432")
    );
    assert_eq!(
        refused(fields(&[
            (":method", "CONNECT"),
            (":authority", "a:1"),
            (":path", "/")
        ])),
        HeadError::ConnectWithPath
    );
    assert_eq!(
        refused(fields(&[(":method", "CONNECT")])),
        HeadError::Missing(":authority")
    );
    let websocket = [
        (":method", "CONNECT"),
        (":protocol", "websocket"),
        (":scheme", "https"),
        (":authority", "example.com"),
        (":path", "/chat"),
    ];
    assert_eq!(refused(fields(&websocket)), HeadError::UnexpectedProtocol);
    let head = request(fields(&websocket), true).expect("announced");
    assert_eq!(head.protocol.as_deref(), Some(&b"websocket"[..]));
    assert_eq!(head.parts.uri.path(), "/chat");
}

#[test]
fn responses_and_trailers() {
    let (parts, length) =
        response(fields(&[(":status", "204"), ("server", "x")])).expect("a response");
    assert_eq!(parts.status, StatusCode::NO_CONTENT);
    assert_eq!(length, None);
    assert_eq!(
        response(fields(&[("server", "x")])).map(|_| ()),
        Err(HeadError::Missing(":status"))
    );
    assert_eq!(
        response(fields(&[(":status", "2000")])).map(|_| ()),
        Err(HeadError::InvalidStatus)
    );
    assert_eq!(
        response(fields(&[(":status", "200"), (":path", "/")])).map(|_| ()),
        Err(HeadError::UnknownPseudo)
    );
    let (parts, length) = response(fields(&[
        (":status", "200"),
        ("content-length", "7"),
        ("content-length", "7"),
    ]))
    .expect("the same length twice");
    assert_eq!(length, Some(7));
    assert_eq!(parts.headers.get_all("content-length").iter().count(), 1);
    assert_eq!(
        response(fields(&[
            (":status", "200"),
            ("content-length", "7"),
            ("content-length", "8"),
        ]))
        .map(|_| ()),
        Err(HeadError::InvalidContentLength)
    );
    assert_eq!(
        trailers(fields(&[("grpc-status", "0")])).map(|t| t.len()),
        Ok(1)
    );
    assert_eq!(
        trailers(fields(&[(":status", "200")])).map(|_| ()),
        Err(HeadError::UnknownPseudo)
    );
}

#[test]
fn a_request_without_authority_takes_its_host_from_host() {
    let head = request(
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/x"),
            ("host", "example.com"),
        ]),
        false,
    )
    .expect("origin form with Host");
    assert_eq!(head.parts.uri, "/x");
    assert_eq!(head.parts.headers["host"], "example.com");
    assert_eq!(
        refused(fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/x"),
            ("host", "a.example"),
            ("host", "b.example"),
        ])),
        HeadError::HostDiffers
    );
}

#[test]
fn the_rest_of_section_8() {
    assert_eq!(
        refused(fields(&[GET[0], GET[1], GET[2], (":path", "/a#frag")])),
        HeadError::InvalidPath
    );
    assert_eq!(
        refused(fields(&[
            (":method", "CONNECT"),
            (":authority", "db.internal")
        ])),
        HeadError::InvalidAuthority,
        "a tunnel names a port"
    );
    assert!(request(with(&[("te", "Trailers")]), false).is_ok());
    assert_eq!(
        response(fields(&[(":status", "101")])).map(|_| ()),
        Err(HeadError::InvalidStatus)
    );
    let mut crumbs = with(&[("cookie", "a=1")]);
    crumbs.push(Field {
        name: Bytes::from_static(b"cookie"),
        value: Bytes::from_static(b"session=secret"),
        never_indexed: true,
    });
    let head = request(crumbs, false).expect("ok");
    assert!(head.parts.headers["cookie"].is_sensitive());
}

#[test]
fn more_fields_than_a_map_holds_are_refused_not_a_panic() {
    let mut list = fields(&GET);
    list.extend((0..33_000).map(|i| Field {
        name: Bytes::from(format!("x-{i}")),
        value: Bytes::new(),
        never_indexed: false,
    }));
    assert_eq!(refused(list), HeadError::TooManyFields);
}
