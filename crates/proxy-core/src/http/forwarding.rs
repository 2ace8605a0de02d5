//! Header rules applied to every relayed message (RFC 9110 section 7.6).

use http::HeaderMap;
use http::header::{CONNECTION, HeaderName, HeaderValue, TE, TRANSFER_ENCODING, UPGRADE};

use crate::context::X_FORWARDED_FOR;
pub(crate) use crate::context::X_FORWARDED_PROTO;

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
        strip_connection_listed(headers, true);
        headers.remove(CONNECTION);
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

/// Removes the headers `Connection` names. With `upgrade` false, `Upgrade` stays, and so
/// does `Connection: upgrade` if it was there (the upgrade still needs them); the rest of
/// `Connection` goes. Done before the filters run, so that a client cannot name a header a
/// filter adds (ext_authz's) and have it stripped on the way out.
pub(crate) fn strip_connection_listed(headers: &mut HeaderMap, upgrade: bool) {
    if !headers.contains_key(CONNECTION) {
        return;
    }
    // Only names present are kept, looked up by the token itself: `keep-alive` and `close`,
    // the usual tokens, name no header a request carries, so the common case allocates
    // nothing (a `HeaderName` of a non-standard name is an allocation).
    let listed: Vec<HeaderName> = crate::header_list::items(headers, CONNECTION)
        .filter(|token| token.eq_ignore_ascii_case("upgrade") || headers.contains_key(*token))
        .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
        .collect();
    let mut upgrading = false;
    for name in listed {
        if !upgrade && name == UPGRADE {
            upgrading = true;
        } else {
            headers.remove(name);
        }
    }
    if !upgrade {
        headers.remove(CONNECTION);
        if upgrading {
            headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        }
    }
}

/// Appends the client's address (formatted once per connection) to `x-forwarded-for`,
/// creating it if absent.
pub(crate) fn append_forwarded_for(headers: &mut HeaderMap, client: &HeaderValue) {
    // One lookup: the name is hashed once whether or not the client sent the header.
    let mut existing = match headers.entry(&X_FORWARDED_FOR) {
        http::header::Entry::Vacant(slot) => {
            slot.insert(client.clone());
            return;
        }
        http::header::Entry::Occupied(existing) => existing,
    };
    // Every earlier hop, in order, whether sent on one line or several.
    let mut joined = Vec::with_capacity(64);
    for earlier in existing.iter() {
        joined.extend_from_slice(earlier.as_bytes());
        joined.extend_from_slice(b", ");
    }
    joined.extend_from_slice(client.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        // Replaces every line with the one joined.
        existing.insert(value);
    }
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
        let ip = |s: &str| HeaderValue::from_str(s).unwrap();
        append_forwarded_for(&mut h, &ip("10.1.2.3"));
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
        append_forwarded_for(&mut h, &ip("::1"));
        assert_eq!(h["x-forwarded-for"], "10.1.2.3, ::1");
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.9"));
        append_forwarded_for(&mut h, &ip("10.0.0.1"));
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "10.1.2.3, ::1, 192.0.2.9, 10.0.0.1");
    }
}
