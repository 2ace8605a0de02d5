//! The `grpc_web` filter (Envoy's): a gRPC-Web request (`application/grpc-web[+proto]`, or
//! its base64 `-text` form) goes upstream as gRPC, and a gRPC response comes back as gRPC-Web:
//! its trailers sent as a last body message (flag 0x80, then `name:value\r\n` lines), and the
//! body base64 for a client that accepts `application/grpc-web-text`, each frame padded as it
//! goes (a streamed message is never held back). Other requests and non-gRPC responses pass
//! as they are.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Request};

use super::body::BodyFilter;
use super::{
    BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, PerRouteSettings, ResponseCtx,
    ResponseHead,
};
use crate::context::RequestBody;
use crate::error::ProxyError;
use config::GrpcWebConfig;

const GRPC_ACCEPT_ENCODING: http::HeaderName =
    http::HeaderName::from_static("grpc-accept-encoding");

/// The filter on one worker.
pub(crate) struct GrpcWeb {
    settings: PerRouteSettings<()>,
}

/// What the request phase learned for the response: a gRPC-Web request, and whether its
/// client wants the response in base64.
#[derive(Default)]
pub(crate) struct State {
    grpc_web: bool,
    text_response: bool,
}

impl HttpFilter for GrpcWeb {
    type Config = GrpcWebConfig;
    type Shared = ();
    type State = State;

    fn new(config: &GrpcWebConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self {
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.grpc_web, |_| ()),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut State,
    ) -> Result<HeadersFlow, ProxyError> {
        if self.settings.get(exchange).is_none() {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        let Some(kind) = req.headers().get(CONTENT_TYPE).and_then(grpc_web_kind) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        state.grpc_web = true;
        // The client's `accept` says whether it reads base64 (as Envoy decides it).
        let accepts = req.headers().get(ACCEPT).and_then(grpc_web_kind);
        state.text_response = accepts == Some(Kind::Text);
        let headers = req.headers_mut();
        // Its length is the gRPC-Web body's, not what goes upstream.
        headers.remove(CONTENT_LENGTH);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(TE, HeaderValue::from_static("trailers"));
        if !headers.contains_key(&GRPC_ACCEPT_ENCODING) {
            headers.insert(
                GRPC_ACCEPT_ENCODING,
                HeaderValue::from_static("identity,deflate,gzip"),
            );
        }
        if kind == Kind::Text {
            req.body_mut().decode_base64();
        }
        Ok(HeadersFlow::Flow(Flow::Continue))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        _: &ResponseCtx<'_>,
        state: &mut State,
    ) -> Option<BodyFilter> {
        if !state.grpc_web || !crate::context::grpc::is_grpc(head.headers) {
            return None;
        }
        head.headers.remove(CONTENT_LENGTH);
        let content_type = if state.text_response {
            "application/grpc-web-text+proto"
        } else {
            "application/grpc-web+proto"
        };
        (head.headers).insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        Some(BodyFilter::grpc_web(state.text_response))
    }
}

/// The gRPC-Web content types Envoy takes: these four, exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `application/grpc-web`, `application/grpc-web+proto`.
    Binary,
    /// `application/grpc-web-text`, `application/grpc-web-text+proto`.
    Text,
}

fn grpc_web_kind(value: &HeaderValue) -> Option<Kind> {
    match value.as_bytes() {
        b"application/grpc-web" | b"application/grpc-web+proto" => Some(Kind::Binary),
        b"application/grpc-web-text" | b"application/grpc-web-text+proto" => Some(Kind::Text),
        _ => None,
    }
}

/// The trailers as gRPC-Web's last message: 0x80, the length, `name:value\r\n` lines.
pub(crate) fn trailer_message(trailers: &HeaderMap) -> Bytes {
    let mut lines = BytesMut::new();
    for (name, value) in trailers {
        lines.put_slice(name.as_str().as_bytes());
        lines.put_u8(b':');
        lines.put_slice(value.as_bytes());
        lines.put_slice(b"\r\n");
    }
    let mut message = BytesMut::with_capacity(5 + lines.len());
    message.put_u8(0x80);
    message.put_u32(lines.len() as u32);
    message.put_slice(&lines);
    message.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_are_read_as_envoy_reads_them() {
        let kind = |t: &str| grpc_web_kind(&HeaderValue::from_str(t).unwrap());
        assert_eq!(kind("application/grpc-web"), Some(Kind::Binary));
        assert_eq!(kind("application/grpc-web+proto"), Some(Kind::Binary));
        assert_eq!(kind("application/grpc-web-text"), Some(Kind::Text));
        assert_eq!(kind("application/grpc-web-text+proto"), Some(Kind::Text));
        // Other formats, parameters and spellings are not Envoy's gRPC-Web.
        assert_eq!(kind("application/grpc-web+json"), None);
        assert_eq!(kind("application/grpc-web-text; charset=utf-8"), None);
        assert_eq!(kind("application/grpc"), None);
    }

    #[test]
    fn trailers_become_the_last_message() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("grpc-message", HeaderValue::from_static("ok"));
        let message = trailer_message(&trailers);
        let lines = b"grpc-status:0\r\ngrpc-message:ok\r\n";
        assert_eq!(message[0], 0x80);
        assert_eq!(&message[1..5], &(lines.len() as u32).to_be_bytes());
        assert_eq!(&message[5..], lines);
    }
}
