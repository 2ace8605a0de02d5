//! The `header_mutation` filter (Envoy's): header changes made where it sits in the chain,
//! to requests on their way in and to responses on their way back. A route's settings
//! replace the listener's.

use std::cell::RefCell;

use http::Request;

use super::{
    BodyFilter, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, Mutations, PerRouteSettings,
    ResponseCtx, ResponseHead,
};
use crate::context::RequestBody;
use crate::context::request_id::X_REQUEST_ID;
use crate::error::ProxyError;
use config::HeaderMutationConfig;

/// The filter on one worker.
pub(crate) struct HeaderMutation {
    settings: PerRouteSettings<Changes>,
    /// Where templated values are written before they become header values.
    scratch: RefCell<Vec<u8>>,
}

struct Changes {
    request: Mutations,
    response: Mutations,
}

impl HttpFilter for HeaderMutation {
    type Config = HeaderMutationConfig;
    type Shared = ();
    type State = ();

    fn new(config: &HeaderMutationConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        let build = |c: &HeaderMutationConfig| Changes {
            request: Mutations::new(&c.request),
            response: Mutations::new(&c.response),
        };
        Self {
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.header_mutation, build),
            scratch: RefCell::new(Vec::new()),
        }
    }

    fn uses_request_id(&self) -> bool {
        (self.settings.all())
            .any(|c| c.request.uses_request_id() || c.response.uses_request_id())
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        if let Some(changes) = self.settings.get(exchange)
            && !changes.request.is_empty()
        {
            let request_id = if changes.request.uses_request_id() {
                req.headers().get(&X_REQUEST_ID).cloned()
            } else {
                None
            };
            let headers = req.headers_mut();
            (changes.request).apply_in(headers, exchange, request_id.as_ref(), None, &self.scratch);
        }
        Ok(HeadersFlow::Flow(Flow::Continue))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        ctx: &ResponseCtx<'_>,
        _: &mut (),
    ) -> Option<BodyFilter> {
        if let Some(changes) = self.settings.get(ctx.exchange)
            && !changes.response.is_empty()
        {
            changes.response.apply_in(
                head.headers,
                ctx.exchange,
                ctx.request_id,
                ctx.info.upstream,
                &self.scratch,
            );
        }
        None
    }
}
