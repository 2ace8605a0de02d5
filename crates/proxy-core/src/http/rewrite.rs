//! The request head as the upstream gets it (hop-by-hop headers gone, `x-forwarded-*` added,
//! the authority and target in the form the upstream's protocol wants), and the response head
//! as the client gets it.

use http::Version;
use http::header::{EXPECT, HeaderValue};
use http::uri::PathAndQuery;

use super::forwarding::{X_FORWARDED_PROTO, append_forwarded_for, strip_hop_by_hop};
use crate::cluster::{HeadFields, HostPool};
use crate::context::ConnCtx;
use crate::error::ProxyError;

/// The host a route's `host_rewrite_header` or `host_rewrite_path_regex` makes of the
/// request as it came; `None` without one, or when the header is absent or empty (the host
/// is then left as it is, as Envoy's), or when the substitution is no header value.
pub(crate) fn host_from_request(
    forward: &config::ForwardAction,
    head: &impl HeadFields,
) -> Option<HeaderValue> {
    if let Some(name) = &forward.host_rewrite_header {
        return head.headers().get(name).filter(|v| !v.is_empty()).cloned();
    }
    let rewrite = forward.host_rewrite_path_regex.as_ref()?;
    let host = rewrite
        .pattern
        .replace_all(head.uri().path(), rewrite.replacement.as_str());
    HeaderValue::from_str(&host).ok().filter(|v| !v.is_empty())
}

/// Rewrites a request head for `host`. `authority` is what the client asked for, after any
/// `host_rewrite`; without one, the host's address stands in.
pub(crate) fn request_for_upstream(
    head: &mut impl HeadFields,
    authority: Option<HeaderValue>,
    host: &HostPool,
    conn: &ConnCtx,
) -> Result<(), ProxyError> {
    let headers = head.headers_mut();
    strip_hop_by_hop(headers);
    // The downstream codec already answered any `100-continue`; the upstream gets the body
    // as it streams.
    headers.remove(EXPECT);
    let trust = conn.listener.forwarded_trust;
    if trust.use_remote_address {
        // The peer, whichever entry the client was read from (as Envoy appends it).
        append_forwarded_for(headers, &conn.peer_ip);
    }
    // Behind trusted proxies, theirs is kept.
    if trust.overwrites_proto() || !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(
            X_FORWARDED_PROTO.clone(),
            conn.listener.forwarded_proto.clone(),
        );
    }
    let authority = match authority {
        Some(authority) => authority,
        None => host.addr_text().clone(),
    };
    let path = head
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let protocol = host.protocol_for(head.version());
    crate::cluster::write_request_for(head, path, authority, protocol, host.tls())
}

/// Rewrites an upstream's response head for the client.
pub(crate) fn response_for_client(head: &mut http::response::Parts) {
    strip_hop_by_hop(&mut head.headers);
    // The downstream codec frames the response for its own protocol; an HTTP/2 version from
    // the upstream would only make the HTTP/1.1 encoder complain.
    head.version = Version::HTTP_11;
}
