//! The fuzz targets of ext_authz, run by `fuzz/fuzz_targets/ext_authz_*.rs`; tests/fuzz_corpus.rs
//! replays their corpora and `fuzz/regressions/`.
//!
//! - [`answer`]: the service's answers, gRPC (a `CheckResponse`'s bytes) and HTTP (a response
//!   head and body), mapped to decisions: never a panic, and never a change to the headers
//!   that frame a message or describe a hop, on the request, its response or a denial.
//! - [`check_request`]: the CheckRequest written for any request decodes to the message the
//!   generated types build for it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, HeaderName, HeaderValue, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Response, StatusCode, Version};
use prost::Message;

use crate::{CheckInput, Decision, HeaderMutation, HttpOptions, is_protected};

/// A request made of the input: a flags byte, then parts split at each 0 byte: path, host,
/// request id, scheme, body, the two peers' addresses, then name and value pairs, each a
/// header when it is a valid one and a context extension when not.
pub fn check_request(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.split(|&b| b == 0);
    let mut text = || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let (path, host, request_id, scheme) = (text(), text(), text(), text());
    let body = Bytes::copy_from_slice(parts.next().unwrap_or_default());
    let addresses = parts.next().unwrap_or_default();
    let (source, destination) = addresses.split_at(addresses.len() / 2);
    let mut headers = HeaderMap::new();
    let mut context_extensions = Vec::new();
    while let (Some(name), Some(value)) = (parts.next(), parts.next()) {
        match (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => context_extensions.push((
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            )),
        }
    }
    let methods = [Method::GET, Method::POST, Method::HEAD, Method::OPTIONS];
    let versions = [
        Version::HTTP_10,
        Version::HTTP_11,
        Version::HTTP_2,
        Version::HTTP_3,
    ];
    let input = CheckInput {
        method: &methods[usize::from(flags & 3)],
        path: &path,
        host: &host,
        scheme: &scheme,
        version: versions[usize::from(flags >> 2 & 3)],
        headers: &headers,
        request_id: &request_id,
        source: socket_address(source),
        destination: socket_address(destination),
        context_extensions: &context_extensions,
        allowed_headers: None,
        route_metadata: None,
        body: (flags & 16 != 0).then_some(&body),
        traceparent: None,
        tracestate: None,
    };
    let (decoded, reference) = crate::check_encoding::decoded_and_reference(&input);
    assert_eq!(decoded, reference);
}

/// IPv6 from 18 bytes or more, else IPv4; the last two bytes are the port.
fn socket_address(bytes: &[u8]) -> SocketAddr {
    let mut padded = [0u8; 18];
    let len = bytes.len().min(18);
    padded[..len].copy_from_slice(&bytes[..len]);
    let port = u16::from_be_bytes([padded[16], padded[17]]);
    let ip = if bytes.len() >= 18 {
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&padded[..16]);
        IpAddr::V6(Ipv6Addr::from(octets))
    } else {
        IpAddr::V4(Ipv4Addr::new(padded[0], padded[1], padded[2], padded[3]))
    };
    SocketAddr::new(ip, port)
}

/// The first byte picks the protocol (even: gRPC); the rest is the service's answer.
pub fn answer(data: &[u8]) {
    let Some((&mode, answer)) = data.split_first() else {
        return;
    };
    let decision = if mode & 1 == 0 {
        let Ok(response) = envoy_types::pb::envoy::service::auth::v3::CheckResponse::decode(answer)
        else {
            return;
        };
        match crate::check_message::decision(response) {
            Ok(decision) => decision,
            Err(_) => return,
        }
    } else {
        match http_answer(answer) {
            Some(decision) => decision,
            None => return,
        }
    };
    check(&decision);
}

/// An HTTP-mode answer: a response head as httparse reads it, the rest its body.
fn http_answer(answer: &[u8]) -> Option<Decision> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Response::new(&mut slots);
    let httparse::Status::Complete(len) = parsed.parse(answer).ok()? else {
        return None;
    };
    let mut builder = Response::builder().status(StatusCode::from_u16(parsed.code?).ok()?);
    for header in parsed.headers.iter() {
        builder = builder.header(
            HeaderName::from_bytes(header.name.as_bytes()).ok()?,
            HeaderValue::from_bytes(header.value).ok()?,
        );
    }
    let head = builder.body(()).ok()?.into_parts().0;
    let options = HttpOptions {
        allowed_upstream_headers: vec![
            HeaderName::from_static("x-user"),
            CONTENT_LENGTH,
            TRANSFER_ENCODING,
            HOST,
        ],
        ..HttpOptions::default()
    };
    let body = Bytes::copy_from_slice(&answer[len..]);
    crate::http_mode::decide(&options, &head, body).ok()
}

/// A head with framing, as a request or a response carries one.
fn framed() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_LENGTH, HeaderValue::from_static("12"));
    headers.insert(HOST, HeaderValue::from_static("legate.test"));
    headers.insert("x-user", HeaderValue::from_static("mallory"));
    headers
}

fn framing(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    headers
        .iter()
        .filter(|(name, _)| is_protected(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

fn check_mutations(mutations: &[HeaderMutation]) {
    for mutation in mutations {
        assert!(!is_protected(&mutation.name), "{mutation:?}");
    }
}

fn check(decision: &Decision) {
    match decision {
        Decision::Allow(allowed) => {
            check_mutations(&allowed.upstream_headers);
            check_mutations(&allowed.response_headers);
            for name in &allowed.headers_to_remove {
                assert!(!is_protected(name), "removes {name}");
            }
            let mut request = framed();
            let before = framing(&request);
            allowed.apply_to_request(&mut request);
            assert_eq!(framing(&request), before, "the request's framing changed");
            let mut response = framed();
            allowed.apply_to_response(&mut response);
            assert_eq!(framing(&response), before, "the response's framing changed");
        }
        Decision::Deny(denied) => {
            check_mutations(&denied.headers);
            // A 1xx (a 101 above all) would tell the client something else than a denial.
            assert!(
                denied.status.as_u16() >= 200,
                "denied with {}",
                denied.status
            );
        }
    }
}
