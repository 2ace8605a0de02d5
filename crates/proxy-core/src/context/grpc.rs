//! Telling gRPC messages from others by their content type, as Envoy does.

use http::HeaderMap;
use http::header::CONTENT_TYPE;

/// `application/grpc`, or a subtype of it (`application/grpc+proto`, parameters after `;`);
/// not gRPC-Web (`application/grpc-web...`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get(CONTENT_TYPE).is_some_and(|v| {
        let v = v.as_bytes();
        v.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    })
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
