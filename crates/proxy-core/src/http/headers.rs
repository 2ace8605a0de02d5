//! Header rules applied to every relayed message (RFC 9110 section 7.6).

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;

use http::HeaderMap;
use http::header::{CONNECTION, HeaderName, HeaderValue, TE, TRANSFER_ENCODING, UPGRADE};

pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub(crate) static X_LEGATE_OVERLOADED: HeaderName = HeaderName::from_static("x-legate-overloaded");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Removes the headers that describe one hop rather than the message: `Connection` and every
/// header it names, plus `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding` (each hop frames
/// the body itself) and `Upgrade`. `TE` is kept only as `trailers`, which gRPC needs.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of these: one pass over the names is cheaper than six
    // hashed removals.
    let any = headers.keys().any(|name| {
        name == CONNECTION
            || name == TRANSFER_ENCODING
            || name == UPGRADE
            || name == TE
            || name == KEEP_ALIVE
            || name == PROXY_CONNECTION
    });
    if !any {
        return;
    }
    if headers.contains_key(CONNECTION) {
        let listed: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
            .collect();
        headers.remove(CONNECTION);
        for name in listed {
            headers.remove(name);
        }
    }
    headers.remove(&KEEP_ALIVE);
    headers.remove(&PROXY_CONNECTION);
    headers.remove(TRANSFER_ENCODING);
    headers.remove(UPGRADE);
    if headers.contains_key(TE)
        && headers
            .get_all(TE)
            .iter()
            .any(|te| !te.as_bytes().eq_ignore_ascii_case(b"trailers"))
    {
        headers.remove(TE);
    }
}

/// Appends the client's address (formatted once per connection) to `x-forwarded-for`,
/// creating it if absent.
pub(crate) fn append_forwarded_for(headers: &mut HeaderMap, client: &HeaderValue) {
    if !headers.contains_key(&X_FORWARDED_FOR) {
        headers.insert(X_FORWARDED_FOR.clone(), client.clone());
        return;
    }
    // Every earlier hop, in order, whether sent on one line or several.
    let mut joined = Vec::with_capacity(64);
    for existing in headers.get_all(&X_FORWARDED_FOR) {
        joined.extend_from_slice(existing.as_bytes());
        joined.extend_from_slice(b", ");
    }
    joined.extend_from_slice(client.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(X_FORWARDED_FOR.clone(), value);
    }
}

/// An address as header text, e.g. for `x-forwarded-for`.
pub(crate) fn ip_header_value(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&ip.to_string()).expect("an IP address is valid header text")
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    // RandomState is seeded from the OS once per thread: good enough to keep workers and
    // restarts from producing the same id sequence.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9E37_79B9_7F4A_7C15);
    h.finish() | 1
}

fn next_u64() -> u64 {
    // xorshift64*: fast, per thread, and request ids need uniqueness, not secrecy.
    RNG.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// A random (version 4) UUID in its text form, for `x-request-id`.
pub(crate) fn new_request_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&next_u64().to_le_bytes());
    bytes[8..].copy_from_slice(&next_u64().to_le_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let mut text = [0u8; 36];
    let mut pos = 0;
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text[pos] = b'-';
            pos += 1;
        }
        text[pos] = HEX[(b >> 4) as usize];
        text[pos + 1] = HEX[(b & 0xf) as usize];
        pos += 2;
    }
    HeaderValue::from_bytes(&text).expect("hex digits and dashes are valid header bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_hop_by_hop_and_connection_listed_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.append("connection", HeaderValue::from_static("x-other"));
        h.insert("x-other", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("proxy-connection", HeaderValue::from_static("close"));
        h.insert("te", HeaderValue::from_static("gzip"));
        h.insert("x-kept", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn keeps_te_trailers() {
        let mut h = HeaderMap::new();
        h.insert("te", HeaderValue::from_static("trailers"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h["te"], "trailers");
        h.append("te", HeaderValue::from_static("gzip"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key("te"));
    }

    #[test]
    fn appends_to_forwarded_for() {
        let mut h = HeaderMap::new();
        let ip = |s: &str| ip_header_value(s.parse().unwrap());
        append_forwarded_for(&mut h, &ip("10.1.2.3"));
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
        append_forwarded_for(&mut h, &ip("::1"));
        assert_eq!(h["x-forwarded-for"], "10.1.2.3, ::1");
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.9"));
        append_forwarded_for(&mut h, &ip("10.0.0.1"));
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "10.1.2.3, ::1, 192.0.2.9, 10.0.0.1");
    }

    #[test]
    fn request_ids_are_uuid_v4_and_distinct() {
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        let text = a.to_str().unwrap();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "4");
        assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"));
        assert_eq!(text.matches('-').count(), 4);
    }
}
