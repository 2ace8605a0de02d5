//! The request head as the protocol spoken to a host writes it: HTTP/1.1's origin form and
//! `host` header, or HTTP/2's absolute form. An `auto` cluster's hosts each choose their
//! protocol, so a request written for one (a retry's earlier host) is rewritten for another.

use http::header::HOST;
use http::uri::{PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Request, Uri, Version};

use crate::context::RequestBody;
use crate::error::ProxyError;
use config::UpstreamProtocol;

/// The fields of a request head that are rewritten for an upstream: a whole request's, or
/// those of one taken apart. The proxied request is rewritten where it is: taking it apart
/// and putting it back copied it (312 bytes) each way.
pub(crate) trait HeadFields {
    fn uri(&self) -> &Uri;
    fn uri_mut(&mut self) -> &mut Uri;
    fn version(&self) -> Version;
    fn version_mut(&mut self) -> &mut Version;
    fn headers(&self) -> &HeaderMap;
    fn headers_mut(&mut self) -> &mut HeaderMap;
}

impl HeadFields for http::request::Parts {
    fn uri(&self) -> &Uri {
        &self.uri
    }
    fn uri_mut(&mut self) -> &mut Uri {
        &mut self.uri
    }
    fn version(&self) -> Version {
        self.version
    }
    fn version_mut(&mut self) -> &mut Version {
        &mut self.version
    }
    fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    fn headers_mut(&mut self) -> &mut HeaderMap {
        &mut self.headers
    }
}

impl<B> HeadFields for Request<B> {
    fn uri(&self) -> &Uri {
        Request::uri(self)
    }
    fn uri_mut(&mut self) -> &mut Uri {
        Request::uri_mut(self)
    }
    fn version(&self) -> Version {
        Request::version(self)
    }
    fn version_mut(&mut self) -> &mut Version {
        Request::version_mut(self)
    }
    fn headers(&self) -> &HeaderMap {
        Request::headers(self)
    }
    fn headers_mut(&mut self) -> &mut HeaderMap {
        Request::headers_mut(self)
    }
}

/// The request line and authority as `protocol` writes them: HTTP/1.1's origin form and
/// `host` header, or HTTP/2's absolute form (`:scheme`, `:authority`).
pub(crate) fn write_request_for(
    head: &mut impl HeadFields,
    path: PathAndQuery,
    authority: HeaderValue,
    protocol: UpstreamProtocol,
    tls: bool,
) -> Result<(), ProxyError> {
    match protocol {
        UpstreamProtocol::Http1 => {
            *head.uri_mut() = Uri::from(path);
            *head.version_mut() = Version::HTTP_11;
            head.headers_mut().insert(HOST, authority);
        }
        // `Downstream` is resolved to one of the two before a request is written.
        UpstreamProtocol::Http2 | UpstreamProtocol::Auto | UpstreamProtocol::Downstream => {
            head.headers_mut().remove(HOST);
            let scheme = if tls { Scheme::HTTPS } else { Scheme::HTTP };
            *head.uri_mut() = Uri::builder()
                .scheme(scheme)
                .authority(authority.as_bytes())
                .path_and_query(path)
                .build()
                .map_err(|_| ProxyError::BadRequest("host is not a valid authority"))?;
            *head.version_mut() = Version::HTTP_2;
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
    // The authority came from a valid URI or header: writing it again cannot fail.
    let _ = write_request_for(req, path, authority, wanted, tls);
}
