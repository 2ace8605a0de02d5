//! The fuzz target of the service's answers, gRPC (a `CheckResponse`'s bytes) and HTTP (a
//! response head and body), mapped to decisions: never a panic, and never a change to the
//! headers that frame a message or describe a hop, on the request, its response or a denial.
//! `fuzz/fuzz_targets/ext_authz_answer.rs` runs it; tests/fuzz_corpus.rs replays the corpus
//! and `fuzz/regressions/ext_authz_answer`.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, HeaderName, HeaderValue, TRANSFER_ENCODING};
use http::{HeaderMap, Response, StatusCode};
use prost::Message;

use crate::{Decision, HeaderMutation, HttpOptions, is_protected};

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
    Some(crate::http_mode::decide(&options, &head, body))
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
