//! The `csrf` filter (Envoy's): a state-changing request (POST, PUT, DELETE, PATCH) must come
//! from the origin it asks for (its `origin`, else its `referer`, as `host[:port]`, against its
//! host) or from one of `additional_origins`; otherwise it is refused 403 `Invalid origin`
//! where enforced, counted only where shadowed.

use bytes::Bytes;
use http::header::{ORIGIN, REFERER};
use http::{Method, Request, StatusCode};

use super::{
    BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings,
};
use crate::catalog::CsrfStats;
use crate::context::RequestBody;
use crate::error::ProxyError;
use crate::random::drawn;
use config::CsrfConfig;

/// The filter on one worker.
pub(crate) struct Csrf {
    settings: PerRouteSettings<CsrfConfig>,
    stats: CsrfStats,
}

impl HttpFilter for Csrf {
    type Config = CsrfConfig;
    type Shared = ();
    type State = ();

    fn new(config: &CsrfConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self {
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.csrf, Clone::clone),
            stats: ctx.catalog.csrf(ctx.shard, &ctx.listener.name),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        let Some(policy) = self.settings.get(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        let changes_state = matches!(
            *req.method(),
            Method::POST | Method::PUT | Method::DELETE | Method::PATCH
        );
        if !changes_state {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        let enforced = drawn(policy.enabled);
        if !enforced && !drawn(policy.shadow) {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        let headers = req.headers();
        let source = headers
            .get(ORIGIN)
            .filter(|v| !v.is_empty())
            .or_else(|| headers.get(REFERER))
            .and_then(|v| v.to_str().ok())
            .map(host_and_port)
            .unwrap_or("");
        if source.is_empty() {
            self.stats.missing_source_origin.inc();
        }
        let target = host_and_port(exchange.host_text());
        let valid = !source.is_empty()
            && (source == target
                || (policy.additional_origins.iter()).any(|m| m.matches(source.as_bytes())));
        if valid {
            self.stats.request_valid.inc();
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        self.stats.request_invalid.inc();
        if !enforced {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        Ok(HeadersFlow::Flow(Flow::Respond(Box::new(LocalReply::new(
            StatusCode::FORBIDDEN,
            Bytes::from_static(b"Invalid origin"),
        )))))
    }
}

/// The `host[:port]` of an absolute URL (`https://app.test:8443/path`), or the value as it is
/// when it is not one (a host header, `null`), as Envoy reads origins.
fn host_and_port(value: &str) -> &str {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value;
    };
    if scheme.is_empty() || !scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) {
        return value;
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Any user information is not part of the origin.
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if host.is_empty() { value } else { host }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_read_as_host_and_port() {
        assert_eq!(host_and_port("https://app.test"), "app.test");
        assert_eq!(host_and_port("http://app.test:8080/a/b?c"), "app.test:8080");
        assert_eq!(host_and_port("https://u:p@app.test/"), "app.test");
        assert_eq!(host_and_port("app.test:8080"), "app.test:8080");
        assert_eq!(host_and_port("null"), "null");
        assert_eq!(host_and_port(""), "");
    }
}
