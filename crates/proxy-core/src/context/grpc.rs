//! gRPC as the proxy meets it: telling gRPC messages from others by their content type, and
//! the form a local reply takes for a gRPC call, as Envoy does both.

use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, StatusCode};

/// `application/grpc`, or a subtype of it (`application/grpc+proto`, parameters after `;`);
/// not gRPC-Web (`application/grpc-web...`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    })
}

/// Envoy's form of a local reply to a gRPC request: a trailers-only answer (200,
/// `content-type: application/grpc`, `grpc-status`, the body as `grpc-message`), so that a
/// gRPC client reads a status instead of an HTTP error it cannot parse. The status is the
/// reply's own `grpc-status` header, else `grpc_status` (a filter's), else the one its HTTP
/// status maps to. A HEAD request gets no message, as it gets no body. The body is the
/// caller's to drop.
pub(crate) fn local_reply(
    status: &mut StatusCode,
    headers: &mut HeaderMap,
    body: &[u8],
    grpc_status: Option<u32>,
    head: bool,
) {
    let http_status = std::mem::replace(status, StatusCode::OK);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    // Trailers-only: nothing follows the head.
    headers.remove(CONTENT_LENGTH);
    if !headers.contains_key(GRPC_STATUS) {
        let code = grpc_status.unwrap_or_else(|| grpc_status_of(http_status));
        headers.insert(GRPC_STATUS, HeaderValue::from(code));
    }
    // A formatted body's line end is not part of the message.
    let message = body.strip_suffix(b"\n").unwrap_or(body);
    if !message.is_empty() && !head {
        // gRPC's percent-encoding: what is not printable ASCII, and `%`.
        const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
        let encoded = percent_encoding::percent_encode(message, GRPC_MESSAGE).to_string();
        if let Ok(value) = HeaderValue::from_str(&encoded) {
            headers.insert(GRPC_MESSAGE_HEADER, value);
        }
    }
}

const GRPC_STATUS: &str = "grpc-status";
const GRPC_MESSAGE_HEADER: &str = "grpc-message";

/// The gRPC status an HTTP status stands for (Envoy's `httpToGrpcStatus`, after gRPC's
/// table of HTTP to gRPC status codes).
fn grpc_status_of(status: StatusCode) -> u32 {
    const INTERNAL: u32 = 13;
    const UNAUTHENTICATED: u32 = 16;
    const PERMISSION_DENIED: u32 = 7;
    const UNIMPLEMENTED: u32 = 12;
    const UNAVAILABLE: u32 = 14;
    const UNKNOWN: u32 = 2;
    match status.as_u16() {
        400 => INTERNAL,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 => UNIMPLEMENTED,
        429 | 502 | 503 | 504 => UNAVAILABLE,
        _ => UNKNOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_web_is_not_grpc() {
        let of = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, http::HeaderValue::from_static(value));
            is_grpc(&headers)
        };
        assert!(of("application/grpc"));
        assert!(of("application/grpc+proto"));
        assert!(of("application/grpc;charset=utf-8"));
        assert!(!of("application/grpc-web"));
        assert!(!of("application/grpc-web-text+proto"));
        assert!(!of("application/json"));
        assert!(!is_grpc(&HeaderMap::new()));
    }
}
