//! Span names from the formats of `operation` and `upstream_operation`, filled in for one
//! request (and one try at a host). What an operator has no value for is left empty, as
//! Envoy leaves it.

use config::SpanName;
use config::tracing::span_name::{PathSource, SpanNamePart};
use http::{HeaderMap, HeaderValue, Method, Request, Uri, Version};

/// The request a name reads: as it came, or its parts as they go upstream.
#[derive(Clone, Copy)]
pub(crate) struct RequestView<'a> {
    pub(crate) method: &'a Method,
    pub(crate) uri: &'a Uri,
    pub(crate) headers: &'a HeaderMap,
    pub(crate) version: Version,
}

impl<'a, B> From<&'a Request<B>> for RequestView<'a> {
    fn from(req: &'a Request<B>) -> Self {
        Self {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            version: req.version(),
        }
    }
}

impl<'a> From<&'a http::request::Parts> for RequestView<'a> {
    fn from(parts: &'a http::request::Parts) -> Self {
        Self {
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            version: parts.version,
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
/// it; `tls`: the client's connection is TLS (`:scheme`).
pub(crate) fn render(
    name: &SpanName,
    req: RequestView<'_>,
    original: Option<&str>,
    tls: bool,
    upstream: Option<&Upstream<'_>>,
) -> String {
    let mut out = String::new();
    for part in &name.0 {
        match part {
            SpanNamePart::Literal(text) => out.push_str(text),
            SpanNamePart::RequestHeader(field) => {
                let read = |name: &str| {
                    crate::pseudo_headers::request_header(
                        req.method,
                        req.uri,
                        req.headers,
                        tls,
                        name,
                    )
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
            SpanNamePart::Protocol => out.push_str(match req.version {
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
            render(&name, (&req).into(), None, false, None),
            "shop.example"
        );
        assert_eq!(
            render(&name, (&req).into(), Some("/items?page=2"), false, None),
            "shop.example/items"
        );
        let name = SpanName::parse("custom-%REQ(X-CUSTOM-HEADER)%-%REQ(x-absent)%", false).unwrap();
        assert_eq!(
            render(&name, (&req).into(), None, false, None),
            "custom-abc-"
        );
        let name = SpanName::parse("%PATH%|%PATH(NQ:PATH)%|%PROTOCOL%", false).unwrap();
        assert_eq!(
            render(&name, (&req).into(), Some("/items?page=2"), false, None),
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
            render(&name, (&req).into(), None, false, Some(&named)),
            "backend.internal 127.0.0.1:8080 backend"
        );
        let unnamed = Upstream {
            hostname: None,
            ..named
        };
        assert_eq!(
            render(&name, (&req).into(), None, false, Some(&unnamed)),
            "127.0.0.1:8080 127.0.0.1:8080 backend"
        );
    }
}
