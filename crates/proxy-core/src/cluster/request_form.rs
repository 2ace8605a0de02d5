//! The request head as the protocol spoken to a host writes it: HTTP/1.1's origin form and
//! `host` header, or HTTP/2's absolute form. An `auto` cluster's hosts each choose their
//! protocol, so a request written for one (a retry's earlier host) is rewritten for another.

use http::header::HOST;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderValue, Uri, Version};

use crate::context::RequestBody;
use crate::error::ProxyError;
use config::UpstreamProtocol;

/// The request line and authority as `protocol` writes them: HTTP/1.1's origin form and
/// `host` header, or HTTP/2's absolute form (`:scheme`, `:authority`).
pub(crate) fn write_request_for(
    parts: &mut http::request::Parts,
    path: PathAndQuery,
    authority: HeaderValue,
    protocol: UpstreamProtocol,
    tls: bool,
) -> Result<(), ProxyError> {
    match protocol {
        UpstreamProtocol::Http1 => {
            parts.uri = Uri::from(path);
            parts.version = Version::HTTP_11;
            parts.headers.insert(HOST, authority);
        }
        // `Downstream` is resolved to one of the two before a request is written.
        UpstreamProtocol::Http2 | UpstreamProtocol::Auto | UpstreamProtocol::Downstream => {
            parts.headers.remove(HOST);
            let scheme = if tls { Scheme::HTTPS } else { Scheme::HTTP };
            parts.uri = Uri::builder()
                .scheme(scheme)
                .authority(authority.as_bytes())
                .path_and_query(path)
                .build()
                .map_err(|_| ProxyError::BadRequest("host is not a valid authority"))?;
            parts.version = Version::HTTP_2;
        }
    }
    Ok(())
}

/// Rewrites a request written for one protocol for the other (an `auto` cluster's hosts
/// each choose theirs): the same path and authority.
pub(crate) fn fit_to_protocol(
    req: &mut http::Request<RequestBody>,
    protocol: UpstreamProtocol,
    tls: bool,
) {
    // HTTP/3 requests come in the absolute form, as HTTP/2's.
    let written = if req.version() >= Version::HTTP_2 {
        UpstreamProtocol::Http2
    } else {
        UpstreamProtocol::Http1
    };
    let wanted = match protocol {
        UpstreamProtocol::Http1 => UpstreamProtocol::Http1,
        UpstreamProtocol::Http2 | UpstreamProtocol::Auto | UpstreamProtocol::Downstream => {
            UpstreamProtocol::Http2
        }
    };
    if written == wanted {
        return;
    }
    let authority = match (req.uri().authority(), req.headers().get(HOST)) {
        (Some(authority), _) => HeaderValue::from_str(authority.as_str()).ok(),
        (None, Some(host)) => Some(host.clone()),
        (None, None) => None,
    };
    let Some(authority) = authority else {
        return;
    };
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let (mut parts, body) =
        std::mem::replace(req, http::Request::new(RequestBody::empty())).into_parts();
    // The authority came from a valid URI or header: writing it again cannot fail.
    let _ = write_request_for(&mut parts, path, authority, wanted, tls);
    *req = http::Request::from_parts(parts, body);
}
