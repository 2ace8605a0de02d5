//! Requests that came in 0-RTT early data (HTTP/3 with `http3.early_data`), before the
//! client's handshake ended: whoever saw those packets could send them again. Safe methods
//! are served, with `early-data: 1` so the upstream may answer 425 itself; any other method
//! is answered 425 Too Early, which the client sends again once the handshake is done
//! (RFC 8470).

use http::{HeaderName, HeaderValue, Method, Request};

use crate::context::{ConnCtx, RequestBody};
use crate::error::ProxyError;

/// Marks a request the codec read before its connection's handshake ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReceivedInEarlyData;

static EARLY_DATA: HeaderName = HeaderName::from_static("early-data");

/// Lets a request on, or not: one not in early data, or of a safe method (marked for the
/// upstream), goes on; any other is refused with 425.
pub(crate) fn admit(req: &mut Request<RequestBody>, conn: &ConnCtx) -> Result<(), ProxyError> {
    if req.extensions().get::<ReceivedInEarlyData>().is_none() {
        return Ok(());
    }
    if !is_safe(req.method()) {
        conn.listener.stats.rq_too_early.inc();
        return Err(ProxyError::TooEarly);
    }
    req.headers_mut()
        .insert(EARLY_DATA.clone(), HeaderValue::from_static("1"));
    Ok(())
}

/// RFC 9110's safe methods: those that ask for nothing to change.
pub(crate) fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_methods_only() {
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(is_safe(&method), "{method}");
        }
        for method in [
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
            Method::CONNECT,
        ] {
            assert!(!is_safe(&method), "{method}");
        }
        let made_up = Method::from_bytes(b"PURGE").unwrap();
        assert!(!is_safe(&made_up), "a method not known to be safe is not");
    }
}
