//! Span names from the formats of `operation` and `upstream_operation`, filled in for one
//! request (and one try at a host). What an operator has no value for is left empty, as
//! Envoy leaves it.

use config::SpanName;
use config::tracing::span_name::{PathSource, SpanNamePart};
use http::{HeaderMap, HeaderValue, Method, Request, Uri, Version};

/// The request a name reads: as it came, or its parts as they go upstream (path, headers
/// and host rewritten, as Envoy's names read them).
#[derive(Clone, Copy)]
pub(crate) struct RequestView<'a> {
    pub(crate) method: &'a Method,
    pub(crate) uri: &'a Uri,
    pub(crate) headers: &'a HeaderMap,
}

/// The client's side of the exchange, which the request as it goes upstream no longer
/// shows: its protocol, and whether its connection is TLS (`:scheme`).
#[derive(Clone, Copy)]
pub(crate) struct ClientSide {
    pub(crate) version: Version,
    pub(crate) tls: bool,
}

impl<'a, B> From<&'a Request<B>> for RequestView<'a> {
    fn from(req: &'a Request<B>) -> Self {
        Self {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
        }
    }
}

impl<'a> From<&'a http::request::Parts> for RequestView<'a> {
    fn from(parts: &'a http::request::Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
        }
    }
}

/// The host a try went to, for an upstream span's name.
pub(crate) struct Upstream<'a> {
    pub(crate) address: &'a HeaderValue,
    pub(crate) hostname: Option<&'a HeaderValue>,
    pub(crate) cluster: &'a str,
}

/// `name` for `req`. `original`: the path as the client sent it, where the route rewrote
/// it.
pub(crate) fn render(
    name: &SpanName,
    req: RequestView<'_>,
    client: ClientSide,
    original: Option<&str>,
    upstream: Option<&Upstream<'_>>,
) -> String {
    let mut out = String::new();
    for part in &name.0 {
        match part {
            SpanNamePart::Literal(text) => out.push_str(text),
            SpanNamePart::RequestHeader(field) => {
                let read = |name: &str| match name {
                    ":scheme" => Some(if client.tls { &b"https"[..] } else { b"http" }),
                    name => crate::pseudo_headers::request_header(
                        req.method,
                        req.uri,
                        req.headers,
                        client.tls,
                        name,
                    ),
                };
                let value =
                    read(&field.name).or_else(|| field.alternative.as_deref().and_then(read));
                if let Some(value) = value {
                    let cut = field
                        .max_len
                        .map_or(value.len(), |max| max.min(value.len()));
                    out.push_str(&String::from_utf8_lossy(&value[..cut]));
                }
            }
            SpanNamePart::Path { query, source } => {
                let current = req.uri.path_and_query().map(|p| p.as_str());
                let path = match source {
                    PathSource::Original => original,
                    PathSource::Path => current,
                    PathSource::OriginalOrPath => original.or(current),
                };
                if let Some(path) = path {
                    out.push_str(if *query {
                        path
                    } else {
                        path.split('?').next().unwrap_or(path)
                    });
                }
            }
            SpanNamePart::Protocol => out.push_str(match client.version {
                Version::HTTP_10 => "HTTP/1.0",
                Version::HTTP_11 => "HTTP/1.1",
                Version::HTTP_2 => "HTTP/2",
                Version::HTTP_3 => "HTTP/3",
                _ => "",
            }),
            SpanNamePart::UpstreamHost => {
                if let Some(up) = upstream {
                    out.push_str(&String::from_utf8_lossy(up.address.as_bytes()));
                }
            }
            SpanNamePart::UpstreamHostName => {
                if let Some(up) = upstream {
                    let name = up.hostname.unwrap_or(up.address);
                    out.push_str(&String::from_utf8_lossy(name.as_bytes()));
                }
            }
            SpanNamePart::UpstreamCluster => {
                if let Some(up) = upstream {
                    out.push_str(up.cluster);
                }
            }
        }
    }
    super::bounded(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HTTP11: ClientSide = ClientSide {
        version: Version::HTTP_11,
        tls: false,
    };

    fn request(path: &str) -> Request<()> {
        Request::builder()
            .uri(path)
            .header("host", "shop.example")
            .header("x-custom-header", "abc")
            .body(())
            .unwrap()
    }

    #[test]
    fn request_operators_read_the_request_and_the_path_before_its_rewrite() {
        let name = SpanName::parse("%REQ(:AUTHORITY)%%PATH(NQ:ORIG)%", false).unwrap();
        let req = request("/v2/items?page=2");
        assert_eq!(
            render(&name, (&req).into(), HTTP11, None, None),
            "shop.example"
        );
        assert_eq!(
            render(&name, (&req).into(), HTTP11, Some("/items?page=2"), None),
            "shop.example/items"
        );
        let name = SpanName::parse("custom-%REQ(X-CUSTOM-HEADER)%-%REQ(x-absent)%", false).unwrap();
        assert_eq!(
            render(&name, (&req).into(), HTTP11, None, None),
            "custom-abc-"
        );
        let name = SpanName::parse("%PATH%|%PATH(NQ:PATH)%|%PROTOCOL%", false).unwrap();
        assert_eq!(
            render(&name, (&req).into(), HTTP11, Some("/items?page=2"), None),
            "/items?page=2|/v2/items|HTTP/1.1"
        );
    }

    #[test]
    fn upstream_operators_read_the_try_s_host() {
        let name = SpanName::parse(
            "%UPSTREAM_HOST_NAME% %UPSTREAM_HOST% %UPSTREAM_CLUSTER%",
            true,
        )
        .unwrap();
        let address = HeaderValue::from_static("127.0.0.1:8080");
        let hostname = HeaderValue::from_static("backend.internal");
        let req = request("/");
        let named = Upstream {
            address: &address,
            hostname: Some(&hostname),
            cluster: "backend",
        };
        assert_eq!(
            render(&name, (&req).into(), HTTP11, None, Some(&named)),
            "backend.internal 127.0.0.1:8080 backend"
        );
        let unnamed = Upstream {
            hostname: None,
            ..named
        };
        assert_eq!(
            render(&name, (&req).into(), HTTP11, None, Some(&unnamed)),
            "127.0.0.1:8080 127.0.0.1:8080 backend"
        );
    }

    #[test]
    fn protocol_and_scheme_are_the_clients_whatever_goes_upstream() {
        let name = SpanName::parse("%PROTOCOL% %REQ(:scheme)%", false).unwrap();
        // The request as it goes to an HTTP/2 upstream over TLS: absolute form, version 2.
        let upstream_shaped = Request::builder()
            .uri("https://backend.internal/x")
            .version(Version::HTTP_2)
            .body(())
            .unwrap();
        let client = ClientSide {
            version: Version::HTTP_11,
            tls: false,
        };
        assert_eq!(
            render(&name, (&upstream_shaped).into(), client, None, None),
            "HTTP/1.1 http"
        );
        let tls_h2 = ClientSide {
            version: Version::HTTP_2,
            tls: true,
        };
        assert_eq!(
            render(&name, (&upstream_shaped).into(), tls_h2, None, None),
            "HTTP/2 https"
        );
    }
}
