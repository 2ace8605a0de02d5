//! The `buffer` filter (Envoy's): a request's whole body is read before the request goes on,
//! up to `max_request_bytes`; a longer body is answered 413 and never sent. The request then
//! goes upstream with its `content-length`.

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderValue, Request, StatusCode};
use http_body::Body;

use super::{
    BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings,
};
use crate::context::RequestBody;
use crate::error::ProxyError;
use config::BufferConfig;

/// The filter on one worker.
pub(crate) struct Buffer {
    settings: PerRouteSettings<u64>,
}

impl HttpFilter for Buffer {
    type Config = BufferConfig;
    type Shared = ();
    type State = ();

    fn new(config: &BufferConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self {
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.buffer, |c| {
                c.max_request_bytes
            }),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        let Some(&max) = self.settings.get(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        let too_large = || {
            Ok(HeadersFlow::Flow(Flow::Respond(Box::new(LocalReply::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Bytes::from_static(b"Payload Too Large"),
            )))))
        };
        if req.body().is_end_stream() {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        let declared = (req.headers().get(CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|len| len > max) {
            return too_large();
        }
        let read = req
            .body_mut()
            .read_whole(max)
            .await
            .map_err(|source| ProxyError::ClientAborted { source })?;
        let Some(len) = read else {
            return too_large();
        };
        let headers = req.headers_mut();
        headers.remove(TRANSFER_ENCODING);
        headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
        Ok(HeadersFlow::Flow(Flow::Continue))
    }
}
