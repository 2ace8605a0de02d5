//! The `cors` filter: CORS preflights from allowed origins are answered by the proxy, and
//! responses to allowed origins get `access-control-allow-origin` and friends. Requests from
//! other origins pass unchanged (the browser then keeps the response from the page).

use bytes::Bytes;
use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, HeaderMap, HeaderValue, ORIGIN,
    VARY,
};
use http::{HeaderName, Method, Request, StatusCode};

use super::{
    BodyFilter, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings,
    ResponseCtx, ResponseHead,
};
use crate::error::ProxyError;
use crate::context::RequestBody;
use config::{AllowList, CorsConfig, OriginMatch, RouteConfiguration};

const ACCESS_CONTROL_REQUEST_PRIVATE_NETWORK: HeaderName =
    HeaderName::from_static("access-control-request-private-network");
const ACCESS_CONTROL_ALLOW_PRIVATE_NETWORK: HeaderName =
    HeaderName::from_static("access-control-allow-private-network");

/// One policy, its fixed header values made once.
struct Policy {
    /// None: no origin may read (a listener's entry whose policies are on routes).
    origins: Vec<OriginMatch>,
    /// Any origin may read, without credentials: the answer is `*`, the same for everyone.
    wildcard: bool,
    allow_credentials: bool,
    allow_methods: Allowed,
    allow_headers: Allowed,
    expose_headers: Option<HeaderValue>,
    max_age: Option<HeaderValue>,
    preflight_status: StatusCode,
    forward_not_matching_preflights: bool,
    allow_private_network_access: bool,
}

/// A preflight answer's list: what was asked for, this value, or nothing.
enum Allowed {
    Asked,
    Value(Option<HeaderValue>),
}

impl Allowed {
    fn new<T: AsRef<str>>(list: &AllowList<T>) -> Self {
        match list {
            AllowList::Asked => Allowed::Asked,
            AllowList::Listed(items) => Allowed::Value(joined(items)),
        }
    }

    /// The answer's value, given what the preflight asked for.
    fn answer(&self, asked: Option<&HeaderValue>) -> Option<HeaderValue> {
        match self {
            Allowed::Asked => asked.cloned(),
            Allowed::Value(value) => value.clone(),
        }
    }
}

/// The filter on one worker.
pub(crate) struct Cors {
    policies: PerRouteSettings<Policy>,
}

fn joined<T: AsRef<str>>(items: &[T]) -> Option<HeaderValue> {
    if items.is_empty() {
        return None;
    }
    let text: Vec<&str> = items.iter().map(AsRef::as_ref).collect();
    HeaderValue::from_str(&text.join(", ")).ok()
}

impl Policy {
    fn new(config: &CorsConfig) -> Self {
        Self {
            allow_methods: Allowed::new(&config.allow_methods),
            allow_headers: Allowed::new(&config.allow_headers),
            expose_headers: joined(&config.expose_headers),
            max_age: config.max_age.map(|age| HeaderValue::from(age.as_secs())),
            origins: config.allow_origins.clone(),
            // Validation refuses `*` with credentials.
            wildcard: config.allow_origins.contains(&OriginMatch::Any) && !config.allow_credentials,
            allow_credentials: config.allow_credentials,
            preflight_status: config.preflight_status,
            forward_not_matching_preflights: config.forward_not_matching_preflights,
            allow_private_network_access: config.allow_private_network_access,
        }
    }

    fn allows(&self, origin: &HeaderValue) -> bool {
        let origin = origin.as_bytes();
        self.origins.iter().any(|allowed| match allowed {
            OriginMatch::Any => true,
            OriginMatch::Exact(exact) => origin.eq_ignore_ascii_case(exact.as_bytes()),
            // A port, if any, must be written in the config's suffix too. Compared in place:
            // no lowercase copy per request.
            OriginMatch::Subdomains { scheme, suffix } => {
                origin.len() > scheme.len() + suffix.len()
                    && origin[..scheme.len()].eq_ignore_ascii_case(scheme.as_bytes())
                    && origin[origin.len() - suffix.len()..].eq_ignore_ascii_case(suffix.as_bytes())
            }
            OriginMatch::Matcher {
                matcher,
                ignore_case,
            } => OriginMatch::matcher_allows(matcher, *ignore_case, origin),
        })
    }

    /// The value for `access-control-allow-origin`: `*` when any origin may read and no
    /// credentials are involved, else the origin itself.
    fn allow_origin(&self, origin: &HeaderValue) -> HeaderValue {
        if self.wildcard {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        }
    }
}

impl HttpFilter for Cors {
    type Config = CorsConfig;
    type Shared = ();
    /// The request's allowed `Origin`, for the response's headers.
    type State = Option<HeaderValue>;

    fn new(config: &CorsConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self::from_table(config, ctx.table, ctx.filter)
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut Option<HeaderValue>,
    ) -> Result<HeadersFlow, ProxyError> {
        Ok(HeadersFlow::Flow(self.on_request(req, exchange, state)))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        ctx: &ResponseCtx<'_>,
        state: &mut Option<HeaderValue>,
    ) -> Option<BodyFilter> {
        self.on_response(head, ctx.exchange, state);
        None
    }
}

impl Cors {
    pub(crate) fn from_table(config: &CorsConfig, table: &RouteConfiguration, filter: &str) -> Self {
        Self {
            policies: PerRouteSettings::new(config, table, filter, |f| &f.cors, Policy::new),
        }
    }

    fn on_request(
        &self,
        req: &Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut Option<HeaderValue>,
    ) -> Flow {
        let Some(policy) = self.policies.get(exchange) else {
            return Flow::Continue;
        };
        let Some(origin) = req.headers().get(ORIGIN).filter(|o| !o.is_empty()) else {
            return Flow::Continue;
        };
        let allowed = policy.allows(origin);
        let preflight = req.method() == Method::OPTIONS
            && req
                .headers()
                .get(ACCESS_CONTROL_REQUEST_METHOD)
                .is_some_and(|m| !m.is_empty());
        if !preflight {
            if allowed {
                *state = Some(policy.allow_origin(origin));
            }
            return Flow::Continue;
        }
        // The upstream may know the origin (the default); or the proxy answers without
        // allowing it, and the browser stops there.
        if !allowed && policy.forward_not_matching_preflights {
            return Flow::Continue;
        }
        let mut reply = LocalReply::new(policy.preflight_status, Bytes::new());
        let headers = &mut reply.headers;
        if allowed {
            headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, policy.allow_origin(origin));
        }
        let asked = |name| req.headers().get(name);
        if let Some(methods) = policy
            .allow_methods
            .answer(asked(ACCESS_CONTROL_REQUEST_METHOD))
        {
            headers.insert(ACCESS_CONTROL_ALLOW_METHODS, methods);
        }
        if let Some(names) = policy
            .allow_headers
            .answer(asked(ACCESS_CONTROL_REQUEST_HEADERS))
        {
            headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, names);
        }
        if let Some(age) = &policy.max_age {
            headers.insert(ACCESS_CONTROL_MAX_AGE, age.clone());
        }
        if policy.allow_private_network_access
            && asked(ACCESS_CONTROL_REQUEST_PRIVATE_NETWORK).is_some_and(|v| v == "true")
        {
            headers.insert(
                ACCESS_CONTROL_ALLOW_PRIVATE_NETWORK,
                HeaderValue::from_static("true"),
            );
        }
        add_credentials(headers, policy);
        add_vary(headers, policy);
        Flow::Respond(Box::new(reply))
    }

    fn on_response(
        &self,
        head: &mut ResponseHead<'_>,
        exchange: &Exchange<'_>,
        state: &mut Option<HeaderValue>,
    ) {
        let Some(policy) = self.policies.get(exchange) else {
            return;
        };
        let headers = &mut *head.headers;
        if let Some(origin) = state.take() {
            headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            if let Some(expose) = &policy.expose_headers {
                headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
            }
            add_credentials(headers, policy);
        }
        add_vary(headers, policy);
    }
}

fn add_credentials(headers: &mut HeaderMap, policy: &Policy) {
    if policy.allow_credentials {
        headers.insert(
            ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
}

/// Unless the answer is `*` for everyone, it depends on the origin asking, also when it is
/// no answer: a cache must not give one origin's response to another.
fn add_vary(headers: &mut HeaderMap, policy: &Policy) {
    // No origin allowed: the answer is the same for all.
    if !policy.wildcard && !policy.origins.is_empty() {
        headers.append(VARY, HeaderValue::from_static("origin"));
    }
}
