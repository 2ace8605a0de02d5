//! Envoy's `RateLimit` (the `envoy.filters.http.ratelimit` filter) and `RateLimitPerRoute` as
//! the `global_rate_limit` filter's settings. Envoy names the service by a cluster
//! (`rate_limit_service.grpc_service.envoy_grpc.cluster_name`); here the filter calls one
//! address, so that cluster must have exactly one endpoint, and a listener whose rate limit
//! cluster is not there yet waits for it, as for ext_authz.

use envoy_types::pb::envoy::config::route::v3::RateLimit;
use envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::RateLimitPerRoute;
use envoy_types::pb::google::protobuf::Any;

use super::{
    RawGlobalRateLimit, RawGlobalRateLimitRule, RawRouteRateLimits, VhRateLimits,
};
use crate::envoy::{ResourceError, decode, duration, unsupported};
use crate::filters::RawPerRoute;
use crate::filters::grpc_service::xds::Target;
use crate::filters::rate_limit_actions::xds::actions;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute";

/// The filter, with the service's address or the cluster that has it.
#[derive(Debug, Clone)]
pub(crate) struct XdsGlobalRateLimit {
    raw: RawGlobalRateLimit,
    target: Target,
}

impl XdsGlobalRateLimit {
    pub(crate) fn decode(any: &Any, at: &str) -> Result<Self, ResourceError> {
        let mut filter: envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::RateLimit =
            decode(any, TYPE_URL, "a RateLimit")?;
        let service = filter
            .rate_limit_service
            .take()
            .and_then(|s| s.grpc_service)
            .ok_or_else(|| ResourceError::invalid(at, "expected a rate_limit_service.grpc_service"))?;
        // The gRPC service's own timeout is not read by Envoy's filter: the filter's (20 ms by
        // default) bounds each call.
        let (target, _) = Target::of(service, &format!("{at}.rate_limit_service.grpc_service"))?;
        let timeout = duration(filter.timeout.take(), &format!("{at}.timeout"))?;
        let status = |s: Option<envoy_types::pb::envoy::r#type::v3::HttpStatus>, at: String| {
            s.map(|s| {
                u16::try_from(s.code)
                    .ok()
                    .filter(|c| (400..=599).contains(c))
                    .ok_or_else(|| ResourceError::invalid(at, format!("{} is not an error status", s.code)))
            })
            .transpose()
        };
        // Envoy answers 429 in place of a status below 400.
        let rate_limited_status = filter.rate_limited_status.take().map(|s| {
            u16::try_from(s.code)
                .ok()
                .filter(|c| (400..=599).contains(c))
                .unwrap_or(429)
        });
        let status_on_error = status(filter.status_on_error.take(), format!("{at}.status_on_error"))?;
        let x_ratelimit_headers = match std::mem::take(&mut filter.enable_x_ratelimit_headers) {
            0 => false,
            1 => true,
            other => {
                return Err(ResourceError::invalid(
                    format!("{at}.enable_x_ratelimit_headers"),
                    format!("unknown version {other}"),
                ));
            }
        };
        if !matches!(filter.request_type.as_str(), "" | "both") {
            return Err(unsupported(at, "request_type (internal or external requests only)"));
        }
        let rate_limits = rules(std::mem::take(&mut filter.rate_limits), &format!("{at}.rate_limits"))?;
        let raw = RawGlobalRateLimit {
            service: None,
            domain: Some(std::mem::take(&mut filter.domain)),
            timeout,
            failure_mode_deny: Some(std::mem::take(&mut filter.failure_mode_deny)),
            x_ratelimit_headers: Some(x_ratelimit_headers),
            x_envoy_ratelimited_header: Some(!std::mem::take(&mut filter.disable_x_envoy_ratelimited_header)),
            rate_limited_status,
            status_on_error,
            stage: Some(std::mem::take(&mut filter.stage)),
            rate_limits,
        };
        // Names the filter's counters; they are the listener's here.
        filter.stat_prefix.clear();
        filter.request_type.clear();
        let rest = [
            (filter.rate_limited_as_resource_exhausted, "rate_limited_as_resource_exhausted"),
            (!filter.response_headers_to_add.is_empty(), "response_headers_to_add"),
            (filter.filter_enabled.is_some(), "filter_enabled"),
            (filter.filter_enforced.is_some(), "filter_enforced"),
            (filter.failure_mode_deny_percent.is_some(), "failure_mode_deny_percent"),
            (!filter.metadata_namespace.is_empty(), "metadata_namespace"),
            (filter.enable_retry_after_header, "enable_retry_after_header"),
        ];
        let named: Vec<String> = rest.iter().filter(|(set, _)| *set).map(|(_, n)| (*n).to_owned()).collect();
        if !named.is_empty() {
            return Err(ResourceError::Unsupported { at: at.to_owned(), fields: named });
        }
        Ok(Self { raw, target })
    }

    /// The cluster the service's address comes from, if it is named by one.
    pub(crate) fn cluster(&self) -> Option<&str> {
        self.target.cluster()
    }

    /// The filter's section, with the address of its cluster's one host; `None` while that
    /// cluster is not known.
    pub(crate) fn section(&self, clusters: &dyn crate::cluster::xds::ReadyClusters) -> Option<RawGlobalRateLimit> {
        let mut raw = self.raw.clone();
        raw.service = Some(self.target.service(clusters)?);
        Some(raw)
    }
}

/// A route's or virtual host's `RateLimitPerRoute`: its domain and rules.
pub(crate) fn per_route(any: &Any, at: &str) -> Result<RawPerRoute<RawRouteRateLimits>, ResourceError> {
    let RateLimitPerRoute {
        vh_rate_limits,
        override_option,
        rate_limits,
        domain,
    } = decode(any, PER_ROUTE, "a RateLimitPerRoute")?;
    // Not implemented by Envoy (hidden in its API).
    if override_option != 0 {
        return Err(unsupported(at, "override_option"));
    }
    let vh_rate_limits = match vh_rate_limits {
        0 => VhRateLimits::Override,
        1 => VhRateLimits::Include,
        2 => VhRateLimits::Ignore,
        other => {
            return Err(ResourceError::invalid(
                format!("{at}.vh_rate_limits"),
                format!("unknown option {other}"),
            ));
        }
    };
    Ok(RawPerRoute::Settings(RawRouteRateLimits {
        domain: Some(domain).filter(|d| !d.is_empty()),
        rate_limits: rules(rate_limits, &format!("{at}.rate_limits"))?,
        vh_rate_limits: Some(vh_rate_limits),
    }))
}

/// Rules given with the filter or a route: `stage`, `disable_key` and `limit` are not read
/// there (Envoy's note); `hits_addend.number` is.
fn rules(rules: Vec<RateLimit>, at: &str) -> Result<Vec<RawGlobalRateLimitRule>, ResourceError> {
    rules
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            let at = format!("{at}[{i}]");
            if r.apply_on_stream_done {
                return Err(unsupported(&at, "apply_on_stream_done"));
            }
            if r.x_ratelimit_option != 0 {
                return Err(unsupported(&at, "x_ratelimit_option"));
            }
            if r.limit.is_some() {
                return Err(unsupported(&at, "limit"));
            }
            let hits_addend = match r.hits_addend.take() {
                None => None,
                Some(h) if h.is_negative_hits => {
                    return Err(unsupported(&at, "hits_addend.is_negative_hits"));
                }
                Some(h) if h.format.is_empty() => h.number.map(|n| n.value),
                Some(_) => return Err(unsupported(&at, "hits_addend.format")),
            };
            Ok(RawGlobalRateLimitRule {
                actions: actions(std::mem::take(&mut r.actions), &at)?,
                hits_addend,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
    use envoy_types::pb::envoy::config::ratelimit::v3::RateLimitServiceConfig;
    use envoy_types::pb::envoy::config::route::v3::rate_limit::{Action, HitsAddend, Override, action};
    use envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::RateLimit as Filter;
    use envoy_types::pb::google::protobuf::UInt64Value;
    use prost::{Message, Name};

    use super::*;

    fn pack<M: Message + Name>(message: &M) -> Any {
        Any {
            type_url: M::type_url(),
            value: message.encode_to_vec(),
        }
    }

    fn service(cluster: &str) -> Option<RateLimitServiceConfig> {
        Some(RateLimitServiceConfig {
            grpc_service: Some(GrpcService {
                target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
                    cluster_name: cluster.into(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            transport_api_version: 2,
        })
    }

    fn generic(value: &str) -> Action {
        Action {
            action_specifier: Some(action::ActionSpecifier::GenericKey(action::GenericKey {
                descriptor_key: String::new(),
                descriptor_value: value.into(),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn the_filter_names_its_cluster_and_keeps_envoys_settings() {
        let filter = Filter {
            domain: "edge".into(),
            failure_mode_deny: true,
            enable_x_ratelimit_headers: 1,
            rate_limit_service: service("ratelimit_cluster"),
            stat_prefix: "rl".into(),
            ..Default::default()
        };
        let decoded = XdsGlobalRateLimit::decode(&pack(&filter), "f").unwrap();
        assert_eq!(decoded.cluster(), Some("ratelimit_cluster"));
        assert_eq!(decoded.raw.domain.as_deref(), Some("edge"));
        assert_eq!(decoded.raw.failure_mode_deny, Some(true));
        assert_eq!(decoded.raw.x_ratelimit_headers, Some(true));
        assert_eq!(decoded.raw.x_envoy_ratelimited_header, Some(true));
        // Each setting that changes what a request meets, and is not done here, by name.
        for (filter, name) in [
            (Filter { rate_limited_as_resource_exhausted: true, ..Default::default() }, "rate_limited_as_resource_exhausted"),
            (Filter { enable_retry_after_header: true, ..Default::default() }, "enable_retry_after_header"),
            (Filter { metadata_namespace: "m".into(), ..Default::default() }, "metadata_namespace"),
            (Filter { request_type: "internal".into(), ..Default::default() }, "request_type"),
        ] {
            let filter = Filter { domain: "edge".into(), rate_limit_service: service("c"), ..filter };
            let err = XdsGlobalRateLimit::decode(&pack(&filter), "f").unwrap_err().to_string();
            assert!(err.contains(name), "{name}: {err}");
        }
    }

    #[test]
    fn a_routes_rules_keep_their_hits_and_refuse_what_is_not_done() {
        let rules = RateLimitPerRoute {
            domain: "people".into(),
            rate_limits: vec![RateLimit {
                actions: vec![generic("a")],
                hits_addend: Some(HitsAddend {
                    number: Some(UInt64Value { value: 3 }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let RawPerRoute::Settings(route) = per_route(&pack(&rules), "r").unwrap() else {
            panic!("settings");
        };
        assert_eq!(route.domain.as_deref(), Some("people"));
        assert_eq!(route.rate_limits[0].hits_addend, Some(3));
        for (rule, name) in [
            (RateLimit { apply_on_stream_done: true, ..Default::default() }, "apply_on_stream_done"),
            (RateLimit { limit: Some(Override::default()), ..Default::default() }, "limit"),
            (RateLimit { x_ratelimit_option: 1, ..Default::default() }, "x_ratelimit_option"),
        ] {
            let rules = RateLimitPerRoute {
                rate_limits: vec![RateLimit { actions: vec![generic("a")], ..rule }],
                ..Default::default()
            };
            let err = per_route(&pack(&rules), "r").unwrap_err().to_string();
            assert!(err.contains(name), "{name}: {err}");
        }
    }
}
