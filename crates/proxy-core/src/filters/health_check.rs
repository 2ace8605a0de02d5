//! The `health_check` filter: a load balancer's probes of this proxy (the requests its
//! settings match) are answered here, 200 while the proxy serves and 503 (flag LH) once the
//! admin's `POST /healthcheck/fail` or the drain asks to be taken out, as Envoy's filter
//! without pass-through. Other requests go on; while the proxy fails, their responses carry
//! `x-envoy-immediate-health-check-fail: true`, so a proxy in front (Envoy's router) takes
//! this one out at once.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, StatusCode};

use super::{
    BodyFilter, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, ResponseCtx,
    ResponseHead,
};
use crate::context::RequestBody;
use crate::error::{ProxyError, ResponseFlag};
use config::ProbeConfig;

/// Tells the prober (and Envoy's outlier detection, which knows the header) that this proxy
/// fails on purpose.
const IMMEDIATE_FAIL: HeaderName = HeaderName::from_static("x-envoy-immediate-health-check-fail");

/// The filter on one worker.
pub(crate) struct HealthCheck {
    config: ProbeConfig,
}

impl HttpFilter for HealthCheck {
    type Config = ProbeConfig;
    type Shared = ();
    /// The request was a probe (answered here).
    type State = bool;

    fn new(config: &ProbeConfig, _: Option<&()>, _: &BuildCtx<'_>) -> Self {
        Self {
            config: config.clone(),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        probe: &mut bool,
    ) -> Result<HeadersFlow, ProxyError> {
        if !self.is_probe(req) {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        *probe = true;
        let reply = if exchange.conn.worker.health.failing() {
            let mut reply = LocalReply::new(StatusCode::SERVICE_UNAVAILABLE, Bytes::new());
            reply.flag = Some(ResponseFlag::FailedLocalHealthCheck);
            reply
        } else {
            LocalReply::new(StatusCode::OK, Bytes::new())
        };
        Ok(HeadersFlow::Flow(Flow::Respond(Box::new(reply))))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        ctx: &ResponseCtx<'_>,
        probe: &mut bool,
    ) -> Option<BodyFilter> {
        if !*probe && ctx.exchange.conn.worker.health.failing() {
            head.headers
                .insert(IMMEDIATE_FAIL, HeaderValue::from_static("true"));
        }
        None
    }
}

impl HealthCheck {
    fn is_probe(&self, req: &Request<RequestBody>) -> bool {
        let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
        self.config.path.as_ref().is_none_or(|path| path == target)
            && self.config.headers.iter().all(|h| h.matches(req.headers()))
    }
}
