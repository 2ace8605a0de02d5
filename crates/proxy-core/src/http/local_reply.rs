//! Responses the proxy writes itself: direct responses and error replies, the listener's
//! rewrites of them, and their form for gRPC calls.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

use super::ResponseBody;
use crate::filters::LocalReply;

/// A response with a plain-text body.
pub(crate) fn text(status: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::local(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// A 307 to `location`: `escaped_slashes: unescape_and_redirect` sends the client to the path
/// with its escaped slashes unescaped.
pub(crate) fn redirect(location: HeaderValue) -> Response<ResponseBody> {
    let mut reply = text(StatusCode::TEMPORARY_REDIRECT, Bytes::new());
    reply.headers_mut().insert(http::header::LOCATION, location);
    reply
}

/// A filter's answer (a denial, a 429, a CORS preflight) as a response. Its own headers win
/// over the default content type, and an empty body gets none.
pub(crate) fn from_filter(reply: LocalReply) -> Response<ResponseBody> {
    let empty = reply.body.is_empty();
    let mut response = text(reply.status, reply.body);
    let headers = response.headers_mut();
    if empty || reply.headers.contains_key(CONTENT_TYPE) {
        headers.remove(CONTENT_TYPE);
    }
    for (name, value) in reply.headers.iter() {
        headers.append(name.clone(), value.clone());
    }
    response
}

/// Envoy's form of a local reply to a gRPC request (see [`crate::context::grpc::local_reply`]).
pub(crate) fn to_grpc(reply: &mut Response<ResponseBody>, grpc_status: Option<u32>, head: bool) {
    let body = reply.body_mut().take_local().unwrap_or_default();
    let mut status = reply.status();
    crate::context::grpc::local_reply(&mut status, reply.headers_mut(), &body, grpc_status, head);
    *reply.status_mut() = status;
}

/// A listener's rewrites of its local replies (`local_reply`), built once per worker.
pub(crate) struct LocalReplies {
    mappers: Box<[Mapper]>,
    /// The request headers the mappers' filters read (pseudo-headers aside): kept before a
    /// request goes upstream, which takes its headers.
    reads: Box<[http::HeaderName]>,
}

struct Mapper {
    filter: config::access_log::filter::LogFilter,
    rewrite: crate::filters::ReplyRewrite,
}

impl LocalReplies {
    pub(crate) fn new(config: &config::local_reply::LocalReplyConfig) -> Self {
        let mut reads: Vec<http::HeaderName> = (config.mappers.iter())
            .flat_map(|m| m.filter.headers())
            // An HTTP/1.1 request's authority is its `host` header.
            .map(|name| {
                if name == ":authority" {
                    "host".into()
                } else {
                    name
                }
            })
            .filter_map(|name| http::HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
        reads.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        reads.dedup();
        Self {
            mappers: (config.mappers.iter())
                .map(|m| Mapper {
                    filter: m.filter.clone(),
                    rewrite: crate::filters::ReplyRewrite::new(&m.rewrite),
                })
                .collect(),
            reads: reads.into_boxed_slice(),
        }
    }

    /// The request headers the mappers read, copied before the request goes upstream;
    /// `None` when they read none.
    pub(crate) fn keep_headers(&self, headers: &http::HeaderMap) -> Option<http::HeaderMap> {
        if self.reads.is_empty() {
            return None;
        }
        let mut kept = http::HeaderMap::new();
        for name in self.reads.iter() {
            for value in headers.get_all(name) {
                kept.append(name.clone(), value.clone());
            }
        }
        Some(kept)
    }

    /// Rewrites `reply` by the first mapper whose filter holds for it (read with its status
    /// as the proxy made it): its status, body and headers where the mapper sets them.
    pub(crate) fn rewrite(
        &self,
        reply: &mut Response<ResponseBody>,
        facts: &ReplyFacts<'_>,
        exchange: &crate::filters::Exchange<'_>,
    ) {
        let Some(mapper) = self.mappers.iter().find(|m| m.filter.passes(facts)) else {
            return;
        };
        let mut status = reply.status();
        let body = mapper
            .rewrite
            .apply(&mut status, reply.headers_mut(), |rules, headers| {
                rules.apply_to_reply(headers, exchange)
            });
        *reply.status_mut() = status;
        if let Some(body) = body {
            *reply.body_mut() = ResponseBody::local(body);
        }
    }
}

/// A local reply as a mapper's filter reads it: the request, the status and flag the proxy
/// gave, and the time so far.
pub(crate) struct ReplyFacts<'a> {
    pub(crate) method: &'a http::Method,
    pub(crate) uri: &'a http::Uri,
    pub(crate) headers: &'a http::HeaderMap,
    pub(crate) status: StatusCode,
    pub(crate) flag: Option<crate::error::ResponseFlag>,
    pub(crate) duration: std::time::Duration,
    /// The client's connection is TLS (the scheme, where the request names none).
    pub(crate) tls: bool,
}

impl config::cel::Attributes for ReplyFacts<'_> {
    fn response_code(&self) -> Option<u16> {
        Some(self.status.as_u16())
    }

    fn path(&self) -> Option<&str> {
        self.uri.path_and_query().map(|p| p.as_str())
    }

    fn host(&self) -> Option<&str> {
        self.request_header(":authority")
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    fn method(&self) -> Option<&str> {
        Some(self.method.as_str())
    }

    fn scheme(&self) -> Option<&str> {
        Some(match self.uri.scheme_str() {
            Some("https") => "https",
            Some(_) => "http",
            None if self.tls => "https",
            None => "http",
        })
    }

    fn request_header(&self, name: &str) -> Option<&[u8]> {
        crate::pseudo_headers::request_header(self.method, self.uri, self.headers, self.tls, name)
    }
}

impl config::access_log::filter::LogFacts for ReplyFacts<'_> {
    fn duration_ms(&self) -> u64 {
        self.duration.as_millis() as u64
    }

    fn flag(&self) -> Option<&str> {
        self.flag.map(crate::error::ResponseFlag::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc_form(
        status: StatusCode,
        body: &'static str,
        grpc_status: Option<u32>,
        head: bool,
    ) -> Response<ResponseBody> {
        let mut reply = text(status, Bytes::from_static(body.as_bytes()));
        reply
            .headers_mut()
            .insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        to_grpc(&mut reply, grpc_status, head);
        reply
    }

    #[test]
    fn a_grpc_local_reply_is_trailers_only_with_the_mapped_status() {
        let reply = grpc_form(
            StatusCode::SERVICE_UNAVAILABLE,
            "no healthy upstream\n",
            None,
            false,
        );
        assert_eq!(reply.status(), StatusCode::OK);
        assert_eq!(reply.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(reply.headers()["grpc-status"], "14");
        assert_eq!(reply.headers()["grpc-message"], "no healthy upstream");
        assert!(reply.headers().get(http::header::CONTENT_LENGTH).is_none());
        assert!(http_body::Body::is_end_stream(reply.body()));
        let code = |status: u16| {
            let reply = grpc_form(StatusCode::from_u16(status).unwrap(), "", None, false);
            reply.headers()["grpc-status"].to_str().unwrap().to_owned()
        };
        let codes: Vec<String> = [400, 401, 403, 404, 429, 502, 503, 504, 500, 418, 200]
            .into_iter()
            .map(code)
            .collect();
        assert_eq!(
            codes,
            ["13", "16", "7", "12", "14", "14", "14", "14", "2", "2", "2"]
        );
    }

    #[test]
    fn a_filters_or_the_replys_own_grpc_status_wins() {
        let reply = grpc_form(StatusCode::OK, "fault filter abort", Some(8), false);
        assert_eq!(reply.headers()["grpc-status"], "8");
        let mut own = text(StatusCode::FORBIDDEN, Bytes::new());
        own.headers_mut()
            .insert("grpc-status", HeaderValue::from_static("9"));
        to_grpc(&mut own, Some(8), false);
        assert_eq!(own.headers()["grpc-status"], "9");
        assert!(
            own.headers().get("grpc-message").is_none(),
            "no body, no message"
        );
    }

    #[test]
    fn the_message_is_percent_encoded_and_a_head_request_gets_none() {
        let reply = grpc_form(StatusCode::FORBIDDEN, "100% denied\tnow é", None, false);
        assert_eq!(
            reply.headers()["grpc-message"],
            "100%25 denied%09now %C3%A9"
        );
        let reply = grpc_form(StatusCode::FORBIDDEN, "denied", None, true);
        assert!(reply.headers().get("grpc-message").is_none());
    }
}
