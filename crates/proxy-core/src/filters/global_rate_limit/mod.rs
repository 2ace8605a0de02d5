//! The `global_rate_limit` filter (Envoy's `ratelimit`): a request is described by the rules
//! that apply to its route (`rate_limit_actions`), the descriptors go to the rate limit
//! service, and its answer decides. The rules, as Envoy picks them: a route's or virtual
//! host's own for the filter, else the filter's, else the route table's `rate_limits` of the
//! filter's stage (the route's, and its virtual host's as `vh_rate_limits` says). Over a limit: `rate_limited_status` (429) with the service's headers and
//! body, `x-envoy-ratelimited` and, when enabled, `x-ratelimit-*`. A failed call lets the
//! request on, or with `failure_mode_deny` answers `status_on_error`. One client per worker
//! and filter, so one connection to the service per worker, as for ext_authz.

mod client;

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderValue as PbHeader;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, rate_limit::Unit,
};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};

use super::rate_limit_actions::Described;
use super::{
    BodyFilter, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings,
    ResponseCtx, ResponseHead,
};
use crate::catalog::GlobalRateLimitStats;
use crate::context::{ConnCtx, RequestBody};
use crate::error::{ProxyError, ResponseFlag};
use crate::throttle::LogThrottle;
use client::{Descriptor, RateLimitClient};
use config::{
    GlobalRateLimitConfig, RateLimitRule, RouteAction, RouteConfig, RouteRateLimits,
    StagedRateLimit, VhRateLimits,
};

static X_ENVOY_RATELIMITED: HeaderName = HeaderName::from_static("x-envoy-ratelimited");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// The filter on one worker. Boxed: its client state is large, and the chain's other filters
/// are a few words.
pub(crate) struct GlobalRateLimit(Box<Inner>);

struct Inner {
    client: RateLimitClient,
    config: GlobalRateLimitConfig,
    /// The rules and domain by route: the listener's, or a host's or route's own.
    settings: PerRouteSettings<RouteRateLimits>,
    /// The route table's routes, whose own `rate_limits` apply where no filter rules do.
    routes: std::sync::Arc<Vec<std::sync::Arc<RouteConfig>>>,
    /// Each virtual host's `rate_limits` of the filter's stage.
    hosts: Box<[Vec<StagedRateLimit>]>,
    stats: GlobalRateLimitStats,
    /// Failed calls, logged at most once a second: a dead service must not flood the log.
    errors: LogThrottle,
}

/// The headers the service gave for the response, kept from the request phase.
pub(crate) type State = Option<Box<HeaderMap>>;

impl HttpFilter for GlobalRateLimit {
    type Config = GlobalRateLimitConfig;
    /// TLS to the service, its files read once per generation rather than by each worker.
    type Shared = grpc_channel::Tls;
    type State = State;

    fn shared(
        config: &GlobalRateLimitConfig,
        _: &config::ListenerConfig,
        _: &str,
    ) -> Option<grpc_channel::Tls> {
        super::grpc_service::service_tls(&config.service, "global_rate_limit")
    }

    fn new(config: &GlobalRateLimitConfig, tls: Option<&grpc_channel::Tls>, ctx: &BuildCtx<'_>) -> Self {
        let listener = RouteRateLimits {
            domain: None,
            rate_limits: Vec::new(),
            vh_rate_limits: None,
        };
        let hosts = (ctx.table.virtual_hosts.iter())
            .map(|h| {
                let staged = h.rate_limits.iter().filter(|r| r.stage == config.stage);
                staged.cloned().collect()
            })
            .collect();
        GlobalRateLimit(Box::new(Inner {
            client: RateLimitClient::new(&config.service, tls.cloned(), config.timeout),
            config: config.clone(),
            settings: PerRouteSettings::new(&listener, ctx.table, ctx.filter, |f| &f.global_rate_limit, Clone::clone),
            routes: ctx.table.routes.clone(),
            hosts,
            stats: ctx.catalog.global_rate_limit(ctx.shard, &ctx.listener.name),
            errors: LogThrottle::default(),
        }))
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut State,
    ) -> Result<HeadersFlow, ProxyError> {
        let inner = &*self.0;
        let Some((domain, rules)) = inner.applicable(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        let described = Described { req, exchange };
        let descriptors: Vec<Descriptor> = rules
            .into_iter()
            .filter_map(|(rule, hits_addend)| {
                let entries = described.entries(rule)?;
                // A rule whose actions all skipped describes nothing (Envoy sends none).
                (!entries.is_empty()).then_some(Descriptor {
                    entries,
                    hits_addend,
                })
            })
            .collect();
        if descriptors.is_empty() {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        // Boxed: the call's future is large, and only this filter needs it.
        let answer = Box::pin(inner.client.should_rate_limit(domain, descriptors)).await;
        Ok(HeadersFlow::Flow(inner.decide(answer, req, exchange.conn, state)))
    }

    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        _: &ResponseCtx<'_>,
        state: &mut State,
    ) -> Option<BodyFilter> {
        if let Some(headers) = state.take() {
            for (name, value) in headers.iter() {
                head.headers.append(name.clone(), value.clone());
            }
        }
        None
    }
}

/// A rule that applies to a request, and the hits it counts for (1 when `None`).
type Applied<'a> = (&'a RateLimitRule, Option<u64>);

impl Inner {
    /// The domain and the rules for this request, as Envoy picks them; `None` where the filter
    /// is off, or no route to a cluster took the request (Envoy asks for those only: not for a
    /// direct response or a redirect).
    fn applicable(&self, exchange: &Exchange<'_>) -> Option<(&str, Vec<Applied<'_>>)> {
        let route_index = exchange.route?;
        let taken = self.routes.get(route_index)?;
        if !matches!(taken.action, RouteAction::Forward(_)) {
            return None;
        }
        let [listener, host, route] = self.settings.layered(exchange);
        if listener.is_none() && host.is_none() && route.is_none() {
            return None;
        }
        // The most specific of the route's and its host's own settings.
        let own = route.or(host);
        let domain = own
            .and_then(|o| o.domain.as_deref())
            .unwrap_or(&self.config.domain);
        let given = own
            .map(|o| &o.rate_limits)
            .filter(|r| !r.is_empty())
            .unwrap_or(&self.config.rate_limits);
        if !given.is_empty() {
            return Some((domain, given.iter().map(|r| (&r.rule, r.hits_addend)).collect()));
        }
        let policy = taken.rate_limits.as_deref();
        let stage = self.config.stage;
        let mut rules: Vec<Applied<'_>> = policy
            .into_iter()
            .flat_map(|p| &p.rate_limits)
            .filter(|r| r.stage == stage)
            .map(|r| (&r.rule, None))
            .collect();
        let option = if policy.is_some_and(|p| p.include_vh_rate_limits) {
            VhRateLimits::Include
        } else {
            own.and_then(|o| o.vh_rate_limits)
                .unwrap_or(VhRateLimits::Override)
        };
        let with_host = match option {
            VhRateLimits::Include => true,
            VhRateLimits::Ignore => false,
            VhRateLimits::Override => policy.is_none_or(|p| p.rate_limits.is_empty()),
        };
        if with_host && let Some(host) = exchange.virtual_host.and_then(|i| self.hosts.get(i)) {
            rules.extend(host.iter().map(|r| (&r.rule, None)));
        }
        Some((domain, rules))
    }

    fn decide(
        &self,
        answer: Result<RateLimitResponse, client::CallError>,
        req: &mut Request<RequestBody>,
        conn: &ConnCtx,
        state: &mut State,
    ) -> Flow {
        // Envoy's client reads anything but OVER_LIMIT (an UNKNOWN overall code included) as OK.
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                self.stats.error.inc();
                self.log_error(&error, conn);
                if !self.config.failure_mode_deny {
                    self.stats.failure_mode_allowed.inc();
                    return Flow::Continue;
                }
                let mut reply = LocalReply::new(status(self.config.status_on_error), Bytes::new());
                reply.flag = Some(ResponseFlag::RateLimitServiceError);
                return Flow::Respond(Box::new(reply));
            }
        };
        let mut response_headers = HeaderMap::new();
        for (name, value) in service_headers(&answer.response_headers_to_add) {
            response_headers.append(name, value);
        }
        if self.config.x_ratelimit_headers {
            x_ratelimit_headers(&answer.statuses, &mut response_headers);
        }
        if answer.overall_code() == Code::OverLimit {
            self.stats.over_limit.inc();
            let mut reply = LocalReply::new(status(self.config.rate_limited_status), Bytes::from(answer.raw_body));
            reply.headers = response_headers;
            if self.config.x_envoy_ratelimited_header {
                reply.headers.insert(X_ENVOY_RATELIMITED.clone(), HeaderValue::from_static("true"));
            }
            reply.flag = Some(ResponseFlag::RateLimited);
            return Flow::Respond(Box::new(reply));
        }
        self.stats.ok.inc();
        // Set over the client's own of the name: a client must not pass for what the service says.
        for (name, value) in service_headers(&answer.request_headers_to_add) {
            req.headers_mut().insert(name, value);
        }
        if !response_headers.is_empty() {
            *state = Some(Box::new(response_headers));
        }
        Flow::Continue
    }

    /// One warning a second at most, with the count since the last.
    fn log_error(&self, error: &client::CallError, conn: &ConnCtx) {
        if let Some(failed) = self.errors.hit() {
            tracing::warn!(
                listener = %conn.listener.name,
                failed,
                failure_mode_deny = self.config.failure_mode_deny,
                %error,
                "rate limit call failed"
            );
        }
    }
}

/// A status checked at load.
fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The service's headers; one that is not a valid header is left out.
fn service_headers(from: &[PbHeader]) -> impl Iterator<Item = (HeaderName, HeaderValue)> + '_ {
    from.iter().filter_map(|header| {
        let value = if header.raw_value.is_empty() {
            HeaderValue::from_str(&header.value).ok()
        } else {
            HeaderValue::from_bytes(&header.raw_value).ok()
        };
        Some((HeaderName::from_bytes(header.key.as_bytes()).ok()?, value?))
    })
}

/// `x-ratelimit-limit`, `-remaining` and `-reset` (the IETF draft's version 03), as Envoy
/// writes them: the descriptor with the fewest requests left gives the remaining count and the
/// reset, and every limit with its window is listed after its own count.
fn x_ratelimit_headers(statuses: &[DescriptorStatus], headers: &mut HeaderMap) {
    let Some(closest) = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| s.limit_remaining)
    else {
        return;
    };
    let Some(limit) = &closest.current_limit else {
        return;
    };
    let mut text = limit.requests_per_unit.to_string();
    for status in statuses {
        let Some(limit) = &status.current_limit else {
            continue;
        };
        let window = match limit.unit() {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
            Unit::Unknown => continue,
        };
        text.push_str(&format!(", {};w={window}", limit.requests_per_unit));
        if !limit.name.is_empty() {
            text.push_str(&format!(";name=\"{}\"", limit.name));
        }
    }
    let reset = closest.duration_until_reset.as_ref().map_or(0, |d| d.seconds.max(0));
    for (name, value) in [
        (&X_RATELIMIT_LIMIT, HeaderValue::from_str(&text)),
        (&X_RATELIMIT_REMAINING, Ok(HeaderValue::from(closest.limit_remaining))),
        (&X_RATELIMIT_RESET, Ok(HeaderValue::from(reset))),
    ] {
        if let Ok(value) = value {
            headers.insert(name.clone(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit as Limit;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    fn status(per_unit: u32, unit: Unit, remaining: u32, reset: i64, name: &str) -> DescriptorStatus {
        DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(Limit {
                name: name.into(),
                requests_per_unit: per_unit,
                unit: unit as i32,
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(PbDuration { seconds: reset, nanos: 0 }),
            ..Default::default()
        }
    }

    #[test]
    fn x_ratelimit_headers_name_the_closest_limit_and_list_every_window() {
        let mut headers = HeaderMap::new();
        x_ratelimit_headers(
            &[
                status(100, Unit::Minute, 40, 30, ""),
                DescriptorStatus::default(),
                status(10, Unit::Second, 3, 1, "per-user"),
            ],
            &mut headers,
        );
        assert_eq!(headers["x-ratelimit-limit"], "10, 100;w=60, 10;w=1;name=\"per-user\"");
        assert_eq!(headers["x-ratelimit-remaining"], "3");
        assert_eq!(headers["x-ratelimit-reset"], "1");
        // No status with a limit: no headers.
        let mut none = HeaderMap::new();
        x_ratelimit_headers(&[DescriptorStatus::default()], &mut none);
        assert!(none.is_empty());
    }
}
