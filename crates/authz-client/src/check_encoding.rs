//! The CheckRequest written straight from a [`CheckInput`] into its gRPC frame, in protobuf's
//! wire format: no message structs, no `String`s and no map of headers on the way (building
//! the generated message and encoding it cost more than the rest of the proxy's request).
//!
//! Field numbers are those of `envoy.service.auth.v3` and `envoy.config.core.v3`.
//! [`reference::check_request`] builds the same message with the generated types; the tests
//! and the `ext_authz_check` fuzz target decode this encoding and compare the two.
//!
//! One pass: the HTTP request attributes (the bulk of the message) are written first, after a
//! gap; once their length is known, the length prefixes of the messages that enclose them are
//! written into the end of the gap, and the frame starts where they start. Protobuf takes a
//! message's fields in any order, so the peers and context extensions follow the request.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::Version;

use crate::{AuthzError, CheckInput};

/// gRPC's message framing: a compression flag and a 4-byte length.
pub(crate) use grpc_channel::FRAME_PREFIX;

const MAX_VARINT: usize = 10;
/// Room for the frame prefix and the keys and lengths of the three messages around the HTTP
/// request: CheckRequest.attributes, AttributeContext.request, Request.http.
const GAP: usize = FRAME_PREFIX + 3 * (1 + MAX_VARINT);

// Wire types.
const VARINT: u8 = 0;
const LENGTH_DELIMITED: u8 = 2;

// CheckRequest
const CHECK_REQUEST_ATTRIBUTES: u8 = 1;
// AttributeContext
const ATTRIBUTES_SOURCE: u8 = 1;
const ATTRIBUTES_DESTINATION: u8 = 2;
const ATTRIBUTES_REQUEST: u8 = 4;
const ATTRIBUTES_CONTEXT_EXTENSIONS: u8 = 10;
const ATTRIBUTES_ROUTE_METADATA_CONTEXT: u8 = 13;
// AttributeContext.Peer, config.core.v3.Address, config.core.v3.SocketAddress
const PEER_ADDRESS: u8 = 1;
const ADDRESS_SOCKET_ADDRESS: u8 = 1;
const SOCKET_ADDRESS_ADDRESS: u8 = 2;
const SOCKET_ADDRESS_PORT_VALUE: u8 = 3;
// AttributeContext.Request
const REQUEST_HTTP: u8 = 2;
// AttributeContext.HttpRequest
const HTTP_ID: u8 = 1;
const HTTP_METHOD: u8 = 2;
const HTTP_HEADERS: u8 = 3;
const HTTP_PATH: u8 = 4;
const HTTP_HOST: u8 = 5;
const HTTP_SCHEME: u8 = 6;
const HTTP_SIZE: u8 = 9;
const HTTP_PROTOCOL: u8 = 10;
const HTTP_BODY: u8 = 11;
const HTTP_RAW_BODY: u8 = 12;
// A map<string, string> entry.
const ENTRY_KEY: u8 = 1;
const ENTRY_VALUE: u8 = 2;

/// The CheckRequest Envoy would send for the request, as one uncompressed gRPC frame: the
/// request's attributes, its headers (values of a repeated header joined with `,`, plus the
/// pseudo-headers), both peers, and the route's context extensions.
pub(crate) fn check_frame(input: &CheckInput<'_>) -> Result<Bytes, AuthzError> {
    let mut buf = BytesMut::with_capacity(GAP + capacity_hint(input));
    buf.put_bytes(0, GAP);
    http_request(&mut buf, input);
    let http_len = buf.len() - GAP;
    peer(&mut buf, ATTRIBUTES_SOURCE, input.source);
    peer(&mut buf, ATTRIBUTES_DESTINATION, input.destination);
    for (key, value) in input.context_extensions {
        map_entry(
            &mut buf,
            ATTRIBUTES_CONTEXT_EXTENSIONS,
            key.as_bytes(),
            &[value.as_bytes()],
        );
    }
    if let Some(metadata) = input.route_metadata {
        string_field(&mut buf, ATTRIBUTES_ROUTE_METADATA_CONTEXT, metadata);
    }
    let after_request = buf.len() - GAP - http_len;
    let request_len = field_len(http_len);
    let attributes_len = field_len(request_len) + after_request;
    let message_len = field_len(attributes_len);
    let prefix = u32::try_from(message_len).map_err(|_| {
        AuthzError::Transport(format!("a check of {message_len} bytes is too large"))
    })?;

    let start = GAP
        - (message_len - attributes_len)
        - (attributes_len - after_request - request_len)
        - (request_len - http_len)
        - FRAME_PREFIX;
    let mut head = &mut buf[start..GAP];
    head.put_u8(0);
    head.put_u32(prefix);
    put_key(&mut head, CHECK_REQUEST_ATTRIBUTES, LENGTH_DELIMITED);
    put_varint(&mut head, attributes_len as u64);
    put_key(&mut head, ATTRIBUTES_REQUEST, LENGTH_DELIMITED);
    put_varint(&mut head, request_len as u64);
    put_key(&mut head, REQUEST_HTTP, LENGTH_DELIMITED);
    put_varint(&mut head, http_len as u64);
    debug_assert!(head.is_empty(), "the prefixes fill the gap to the request");
    buf.advance(start);
    Ok(buf.freeze())
}

/// Room for most checks without growing: the strings sent twice (as fields and as
/// pseudo-headers), the body, and an allowance per header.
fn capacity_hint(input: &CheckInput<'_>) -> usize {
    256 + 2 * (input.path.len() + input.host.len())
        + input.request_id.len()
        + input.body.map_or(0, |b| b.len())
        + input.route_metadata.map_or(0, |m| m.len())
        + 64 * input.headers.len()
}

/// AttributeContext.HttpRequest's fields.
fn http_request(buf: &mut BytesMut, input: &CheckInput<'_>) {
    string_field(buf, HTTP_ID, input.request_id.as_bytes());
    string_field(buf, HTTP_METHOD, input.method.as_str().as_bytes());
    let sent = |name: &str| {
        input
            .allowed_headers
            .is_none_or(|a| a.iter().any(|n| n == name))
    };
    for name in input.headers.keys().filter(|n| sent(n.as_str())) {
        let values = input.headers.get_all(name);
        let mut each = values.iter();
        match (each.next(), each.next()) {
            // The common case, one value valid as text, is written as it is.
            (Some(value), None) if std::str::from_utf8(value.as_bytes()).is_ok() => {
                map_entry(
                    buf,
                    HTTP_HEADERS,
                    name.as_str().as_bytes(),
                    &[value.as_bytes()],
                );
            }
            _ => {
                let joined: Vec<_> = values
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()))
                    .collect();
                let parts: Vec<&[u8]> = joined.iter().map(|v| v.as_bytes()).collect();
                map_entry(buf, HTTP_HEADERS, name.as_str().as_bytes(), &parts);
            }
        }
    }
    if sent(":authority") {
        map_entry(buf, HTTP_HEADERS, b":authority", &[input.host.as_bytes()]);
    }
    if sent(":method") {
        map_entry(
            buf,
            HTTP_HEADERS,
            b":method",
            &[input.method.as_str().as_bytes()],
        );
    }
    if sent(":path") {
        map_entry(buf, HTTP_HEADERS, b":path", &[input.path.as_bytes()]);
    }
    string_field(buf, HTTP_PATH, input.path.as_bytes());
    string_field(buf, HTTP_HOST, input.host.as_bytes());
    string_field(buf, HTTP_SCHEME, input.scheme.as_bytes());
    let size = match input.body {
        Some(body) => body.len() as i64,
        None => input
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(-1),
    };
    if size != 0 {
        put_key(buf, HTTP_SIZE, VARINT);
        // int64: a negative value is its two's complement, ten bytes long.
        put_varint(buf, size as u64);
    }
    string_field(buf, HTTP_PROTOCOL, protocol(input.version).as_bytes());
    // A text body goes as `body`, anything else as `raw_body` (never both: it would double
    // the message).
    if let Some(body) = input.body {
        let field = if std::str::from_utf8(body).is_ok() {
            HTTP_BODY
        } else {
            HTTP_RAW_BODY
        };
        string_field(buf, field, body);
    }
}

pub(crate) fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_2 => "HTTP/2",
        Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// A Peer with its socket address: `{ address { socket_address { address, port_value } } }`.
fn peer(buf: &mut BytesMut, field: u8, addr: SocketAddr) {
    let ip = IpText::of(addr.ip());
    let ip = ip.as_bytes();
    let port = u64::from(addr.port());
    // port_value is in a oneof: present, so written, even when 0.
    let socket_address_len = string_field_len(ip.len()) + 1 + varint_len(port);
    let address_len = field_len(socket_address_len);
    let peer_len = field_len(address_len);
    put_key(buf, field, LENGTH_DELIMITED);
    put_varint(buf, peer_len as u64);
    put_key(buf, PEER_ADDRESS, LENGTH_DELIMITED);
    put_varint(buf, address_len as u64);
    put_key(buf, ADDRESS_SOCKET_ADDRESS, LENGTH_DELIMITED);
    put_varint(buf, socket_address_len as u64);
    string_field(buf, SOCKET_ADDRESS_ADDRESS, ip);
    put_key(buf, SOCKET_ADDRESS_PORT_VALUE, VARINT);
    put_varint(buf, port);
}

/// One entry of a `map<string, string>`: the value is `parts` joined with `,`.
fn map_entry(buf: &mut BytesMut, field: u8, key: &[u8], parts: &[&[u8]]) {
    let value_len = parts.iter().map(|p| p.len()).sum::<usize>() + parts.len().saturating_sub(1);
    let entry_len = string_field_len(key.len()) + string_field_len(value_len);
    put_key(buf, field, LENGTH_DELIMITED);
    put_varint(buf, entry_len as u64);
    string_field(buf, ENTRY_KEY, key);
    if value_len > 0 {
        put_key(buf, ENTRY_VALUE, LENGTH_DELIMITED);
        put_varint(buf, value_len as u64);
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                buf.put_u8(b',');
            }
            buf.put_slice(part);
        }
    }
}

/// A string or bytes field; proto3 leaves an empty one out.
fn string_field(buf: &mut BytesMut, field: u8, value: &[u8]) {
    if !value.is_empty() {
        put_key(buf, field, LENGTH_DELIMITED);
        put_varint(buf, value.len() as u64);
        buf.put_slice(value);
    }
}

fn string_field_len(len: usize) -> usize {
    if len == 0 { 0 } else { field_len(len) }
}

/// A length-delimited field's size with its key (one byte: every field number here is
/// below 16) and length.
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_key(buf: &mut impl BufMut, field: u8, wire_type: u8) {
    buf.put_u8(field << 3 | wire_type);
}

fn put_varint(buf: &mut impl BufMut, mut value: u64) {
    while value >= 0x80 {
        buf.put_u8(value as u8 | 0x80);
        value >>= 7;
    }
    buf.put_u8(value as u8);
}

fn varint_len(value: u64) -> usize {
    // Seven bits a byte; 0 takes one byte.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

/// An IP address as text, without allocating: the longest (an IPv4-mapped IPv6 address) is
/// 45 bytes.
struct IpText {
    buf: [u8; 48],
    len: usize,
}

impl Default for IpText {
    fn default() -> Self {
        Self {
            buf: [0; 48],
            len: 0,
        }
    }
}

impl IpText {
    fn of(ip: IpAddr) -> Self {
        let mut text = Self::default();
        match ip {
            // By hand: `Display` of an IPv4 address took half the cost of a check's encoding.
            IpAddr::V4(v4) => {
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.push(b'.');
                    }
                    if octet >= 100 {
                        text.push(b'0' + octet / 100);
                    }
                    if octet >= 10 {
                        text.push(b'0' + octet / 10 % 10);
                    }
                    text.push(b'0' + octet % 10);
                }
            }
            // An address always fits (IpText holds the longest IPv6 text).
            IpAddr::V6(v6) => {
                let _ = write!(text, "{v6}");
            }
        }
        text
    }

    /// One byte of an IPv4 address's text (15 at most, well within the buffer).
    fn push(&mut self, byte: u8) {
        self.buf[self.len] = byte;
        self.len += 1;
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// The same CheckRequest built with the generated types: what the encoding is checked
/// against.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) mod reference {
    use std::collections::HashMap;

    use envoy_types::pb::envoy::config::core::v3::{
        Address, SocketAddress, address, socket_address,
    };
    use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
        HttpRequest, Peer, Request,
    };
    use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest};

    use super::protocol;
    use crate::CheckInput;

    fn peer(addr: std::net::SocketAddr) -> Peer {
        Peer {
            address: Some(Address {
                address: Some(address::Address::SocketAddress(SocketAddress {
                    address: addr.ip().to_string(),
                    port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                        addr.port(),
                    ))),
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }
    }

    pub(crate) fn check_request(input: &CheckInput<'_>) -> CheckRequest {
        let mut headers: HashMap<String, String> = HashMap::new();
        for (name, value) in input.headers {
            let value = String::from_utf8_lossy(value.as_bytes());
            headers
                .entry(name.as_str().to_owned())
                .and_modify(|v| {
                    v.push(',');
                    v.push_str(&value);
                })
                .or_insert_with(|| value.into_owned());
        }
        headers.insert(":authority".into(), input.host.to_owned());
        headers.insert(":method".into(), input.method.as_str().to_owned());
        headers.insert(":path".into(), input.path.to_owned());
        if let Some(allowed) = input.allowed_headers {
            headers.retain(|name, _| allowed.contains(name));
        }
        let (body, raw_body, size) = match input.body {
            Some(body) => match std::str::from_utf8(body) {
                Ok(text) => (text.to_owned(), Vec::new(), body.len() as i64),
                Err(_) => (String::new(), body.to_vec(), body.len() as i64),
            },
            None => (
                String::new(),
                Vec::new(),
                input
                    .headers
                    .get(http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(-1),
            ),
        };
        CheckRequest {
            attributes: Some(AttributeContext {
                source: Some(peer(input.source)),
                destination: Some(peer(input.destination)),
                request: Some(Request {
                    http: Some(HttpRequest {
                        id: input.request_id.to_owned(),
                        method: input.method.as_str().to_owned(),
                        headers,
                        path: input.path.to_owned(),
                        host: input.host.to_owned(),
                        scheme: input.scheme.to_owned(),
                        size,
                        protocol: protocol(input.version).to_owned(),
                        body,
                        raw_body,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                context_extensions: input.context_extensions.iter().cloned().collect(),
                route_metadata_context: input.route_metadata.map(|bytes| {
                    prost::Message::decode(bytes).expect("the test gives an encoded Metadata")
                }),
                ..Default::default()
            }),
        }
    }
}

/// The frame's message decoded, and the message [`reference::check_request`] builds, for the
/// tests and the fuzz target: equal for every input.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn decoded_and_reference(
    input: &CheckInput<'_>,
) -> (
    envoy_types::pb::envoy::service::auth::v3::CheckRequest,
    envoy_types::pb::envoy::service::auth::v3::CheckRequest,
) {
    use prost::Message;
    let frame = match check_frame(input) {
        Ok(frame) => frame,
        Err(error) => panic!("cannot encode a check: {error}"),
    };
    assert_eq!(frame[0], 0, "uncompressed");
    let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
    assert_eq!(
        len,
        frame.len() - FRAME_PREFIX,
        "the prefix gives the length"
    );
    let decoded =
        envoy_types::pb::envoy::service::auth::v3::CheckRequest::decode(&frame[FRAME_PREFIX..])
            .unwrap_or_else(|e| panic!("the encoding does not decode: {e}"));
    (decoded, reference::check_request(input))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    use http::{HeaderMap, HeaderValue, Method};

    fn input<'a>(
        headers: &'a HeaderMap,
        context: &'a [(String, String)],
        body: Option<&'a Bytes>,
    ) -> CheckInput<'a> {
        CheckInput {
            method: &Method::POST,
            path: "/orders?id=7",
            host: "shop.test",
            scheme: "https",
            version: Version::HTTP_2,
            headers,
            request_id: "req-1",
            source: "192.0.2.7:51000".parse().unwrap_or_else(|_| unreachable!()),
            destination: "127.0.0.1:8443".parse().unwrap_or_else(|_| unreachable!()),
            context_extensions: context,
            allowed_headers: None,
            route_metadata: None,
            body,
            traceparent: None,
            tracestate: None,
        }
    }

    #[test]
    fn the_request_carries_what_envoy_sends() {
        let mut headers = HeaderMap::new();
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        let context = [("tenant".to_string(), "blue".to_string())];
        let (request, reference) = decoded_and_reference(&input(&headers, &context, None));
        assert_eq!(request, reference);
        let attributes = request.attributes.unwrap_or_default();
        let http = attributes.request.and_then(|r| r.http).unwrap_or_default();
        assert_eq!(http.method, "POST");
        assert_eq!(http.path, "/orders?id=7");
        assert_eq!(http.host, "shop.test");
        assert_eq!(http.scheme, "https");
        assert_eq!(http.protocol, "HTTP/2");
        assert_eq!(http.id, "req-1");
        assert_eq!(http.size, -1);
        assert_eq!(http.headers["x-multi"], "a,b");
        assert_eq!(http.headers[":path"], "/orders?id=7");
        assert_eq!(http.headers[":authority"], "shop.test");
        assert_eq!(attributes.context_extensions["tenant"], "blue");
        let source = attributes
            .source
            .and_then(|p| p.address)
            .and_then(|a| a.address);
        let Some(address::Address::SocketAddress(source)) = source else {
            panic!("source address");
        };
        assert_eq!(source.address, "192.0.2.7");
        assert_eq!(
            source.port_specifier,
            Some(socket_address::PortSpecifier::PortValue(51000))
        );
    }

    #[test]
    fn allowed_headers_and_route_metadata_go_as_envoy_sends_them() {
        use envoy_types::pb::envoy::config::core::v3::Metadata;
        use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
        use prost::Message;
        let mut headers = HeaderMap::new();
        headers.insert("header1", HeaderValue::from_static("one"));
        headers.insert("cookie", HeaderValue::from_static("secret"));
        let allowed = ["header1".to_string(), ":path".to_string()];
        let metadata = Metadata {
            filter_metadata: [(
                "envoy-gateway".to_string(),
                Struct {
                    fields: [(
                        "kind".to_string(),
                        Value {
                            kind: Some(Kind::StringValue("HTTPRoute".into())),
                        },
                    )]
                    .into(),
                },
            )]
            .into(),
            ..Default::default()
        };
        let encoded = metadata.encode_to_vec();
        let mut check = input(&headers, &[], None);
        check.allowed_headers = Some(&allowed);
        check.route_metadata = Some(&encoded);
        let (request, reference) = decoded_and_reference(&check);
        assert_eq!(request, reference);
        let attributes = request.attributes.unwrap_or_default();
        let http = attributes.request.and_then(|r| r.http).unwrap_or_default();
        let mut names: Vec<&str> = http.headers.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, [":path", "header1"], "only the allowed ones");
        assert_eq!(
            http.host, "shop.test",
            "the fields are sent whatever the list"
        );
        assert_eq!(attributes.route_metadata_context, Some(metadata));
    }

    #[test]
    fn it_decodes_to_the_generated_message_for_every_shape() {
        let mut headers = HeaderMap::new();
        headers.insert("content-length", HeaderValue::from_static("12"));
        headers.insert("x-empty", HeaderValue::from_static(""));
        headers.append("x-two", HeaderValue::from_static(""));
        headers.append("x-two", HeaderValue::from_static(""));
        // Not UTF-8: sent as text with replacement characters, as Envoy does.
        headers.append(
            "x-bin",
            HeaderValue::from_bytes(b"caf\xe9").unwrap_or_else(|_| unreachable!()),
        );
        headers.append("x-bin", HeaderValue::from_static("ok"));
        headers.insert(
            "x-latin",
            HeaderValue::from_bytes(b"\xe9t\xe9").unwrap_or_else(|_| unreachable!()),
        );
        headers.insert(
            "x-long",
            HeaderValue::from_str(&"v".repeat(300)).unwrap_or_else(|_| unreachable!()),
        );
        let context = [
            ("a".to_string(), String::new()),
            ("a".to_string(), "last wins".to_string()),
            (String::new(), "empty key".to_string()),
        ];
        let text = Bytes::from_static(b"hello");
        let binary = Bytes::from_static(b"\xff\x00");
        let empty = Bytes::new();
        let large = Bytes::from(vec![b'x'; 70_000]);
        for body in [None, Some(&text), Some(&binary), Some(&empty), Some(&large)] {
            for (source, destination) in [
                ("[::1]:0", "[2001:db8::ffff:1]:65535"),
                ("[::ffff:192.0.2.1]:80", "0.0.0.0:1"),
            ] {
                let mut input = input(&headers, &context, body);
                input.source = source.parse().unwrap_or_else(|_| unreachable!());
                input.destination = destination.parse().unwrap_or_else(|_| unreachable!());
                for version in [Version::HTTP_10, Version::HTTP_11, Version::HTTP_3] {
                    input.version = version;
                    let (decoded, reference) = decoded_and_reference(&input);
                    assert_eq!(
                        decoded, reference,
                        "body {body:?}, {source} -> {destination}"
                    );
                }
            }
        }
        let empty = HeaderMap::new();
        let mut bare = input(&empty, &[], None);
        bare.request_id = "";
        bare.scheme = "";
        let (decoded, reference) = decoded_and_reference(&bare);
        assert_eq!(decoded, reference);
    }

    #[test]
    fn addresses_are_written_as_their_display_writes_them() {
        let mut addresses: Vec<IpAddr> = Vec::new();
        // Every octet value in each position, so every digit count is written.
        for octet in 0..=255u8 {
            addresses.push([octet, 0, 9, 10].into());
            addresses.push([99, octet, 100, 255].into());
            addresses.push([1, 200, octet, 0].into());
            addresses.push([255, 255, 255, octet].into());
        }
        for v6 in [
            "::",
            "::1",
            "2001:db8::ffff:1",
            "::ffff:192.0.2.1",
            "fe80::1:2:3:4:5",
        ] {
            addresses.push(v6.parse().unwrap_or_else(|_| unreachable!()));
        }
        addresses.push(IpAddr::V6(std::net::Ipv6Addr::from([0xffff; 8])));
        for ip in addresses {
            assert_eq!(IpText::of(ip).as_bytes(), ip.to_string().as_bytes());
        }
    }

    #[test]
    fn varints_are_as_long_as_protobuf_makes_them() {
        for (value, len) in [
            (0, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::MAX, 10),
        ] {
            assert_eq!(varint_len(value), len, "{value}");
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), len, "{value}");
            assert_eq!(
                prost::encoding::decode_varint(&mut &out[..]).ok(),
                Some(value)
            );
        }
    }
}
