//! The ext_authz HTTP filter (gRPC or HTTP service) and its per-route settings.
//!
//! Envoy names the authorization service by a cluster (`envoy_grpc.cluster_name`); here the
//! filter talks to one address, so that cluster must have exactly one endpoint (a sidecar on
//! the same host, as is usual). A listener whose authorization cluster is not there yet waits
//! for it like one waiting for its routes. `google_grpc.target_uri` may give the address
//! directly (`IP:PORT` or `unix:/path`).


use envoy_types::pb::envoy::config::core::v3::{grpc_service, http_uri};
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
    ExtAuthz, ExtAuthzPerRoute, HttpService, ext_authz, ext_authz_per_route,
};
use envoy_types::pb::envoy::r#type::matcher::v3::ListStringMatcher;
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::google::protobuf::Any;

use super::{
    RawAuthzBody, RawAuthzGrpc, RawAuthzHttp, RawAuthzRetry, RawExtAuthz, RawRouteAuthz,
    RawRouteAuthzSettings,
};
use crate::envoy::{ResourceError, duration};

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute";

/// The filter, with its service's address or the cluster that has it.
#[derive(Debug, Clone)]
pub(crate) struct XdsAuthz {
    raw: RawExtAuthz,
    target: Target,
    /// gRPC: the request headers sent (`allowed_headers`, exact names); `None`: all.
    grpc_allowed_headers: Option<Vec<String>>,
    /// gRPC: the calls' retry policy.
    grpc_retry: Option<RawAuthzRetry>,
}

#[derive(Debug, Clone)]
enum Target {
    Address(String),
    /// A cluster, and for gRPC the calls' `:authority` when given.
    Cluster(String, Option<String>),
}

impl XdsAuthz {
    pub(crate) fn decode(value: &Any, at: &str) -> Result<Self, ResourceError> {
        let mut filter: ExtAuthz = prost::Message::decode(value.value.as_slice())
            .map_err(|e| ResourceError::invalid(at, format!("cannot decode ExtAuthz: {e}")))?;
        let unsupported = |what: &str| ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec![what.to_owned()],
        };
        let mut grpc_allowed_headers = None;
        let mut grpc_retry = None;
        let (target, timeout, http) = match filter.services.take() {
            Some(ext_authz::Services::GrpcService(service)) => {
                let (target, timeout, retry) = grpc_target(service, at)?;
                grpc_retry = retry;
                if let Some(list) = filter.allowed_headers.take() {
                    grpc_allowed_headers =
                        Some(exact_names(Some(list), &format!("{at}.allowed_headers"))?);
                }
                (target, timeout, None)
            }
            Some(ext_authz::Services::HttpService(service)) => {
                // The modern list of request headers sent, over the deprecated one.
                let allowed = filter.allowed_headers.take();
                let (target, timeout, http) = http_target(service, allowed, at)?;
                (target, timeout, Some(Box::new(http)))
            }
            None => return Err(ResourceError::invalid(at, "expected a grpc_service or an http_service")),
        };
        if filter
            .with_request_body
            .as_ref()
            .is_some_and(|b| b.pack_as_bytes)
        {
            return Err(unsupported("with_request_body.pack_as_bytes"));
        }
        let with_request_body = filter.with_request_body.take().map(|b| RawAuthzBody {
            max_request_bytes: Some(u64::from(b.max_request_bytes)),
            allow_partial_message: Some(b.allow_partial_message),
        });
        let status_on_error = match filter.status_on_error.take().map(|s| s.code) {
            None | Some(0) => None,
            Some(code) => Some(u16::try_from(code).map_err(|_| {
                ResourceError::invalid(
                    format!("{at}.status_on_error"),
                    format!("{code} is not a status"),
                )
            })?),
        };
        // Sent with gRPC checks only; Envoy takes and ignores them for HTTP.
        let mut namespaces = std::mem::take(&mut filter.route_metadata_context_namespaces);
        if http.is_some() {
            namespaces.clear();
        }
        let raw = RawExtAuthz {
            grpc: None,
            http,
            timeout,
            failure_mode_allow: Some(std::mem::take(&mut filter.failure_mode_allow)),
            status_on_error,
            with_request_body,
            route_metadata_context_namespaces: namespaces,
            clear_route_cache: Some(std::mem::take(&mut filter.clear_route_cache)),
        };
        // The v3 API is the only one, and the stats prefix changes nothing.
        filter.transport_api_version = 0;
        filter.stat_prefix.clear();
        if filter != Default::default() {
            return Err(unsupported(
                "ext_authz settings besides grpc_service or http_service, allowed_headers, failure_mode_allow, status_on_error, with_request_body, route_metadata_context_namespaces and clear_route_cache",
            ));
        }
        Ok(Self {
            raw,
            target,
            grpc_allowed_headers,
            grpc_retry,
        })
    }

    /// The cluster the service's address comes from, if it is named by one.
    pub(crate) fn cluster(&self) -> Option<&str> {
        match &self.target {
            Target::Cluster(name, _) => Some(name),
            Target::Address(_) => None,
        }
    }

    /// The filter's section, with the address of its cluster's one host; `None` while that
    /// cluster is not known.
    pub(crate) fn section(&self, clusters: &dyn crate::cluster::xds::ReadyClusters) -> Option<RawExtAuthz> {
        let (address, authority, tls) = match &self.target {
            Target::Address(address) => (address.clone(), None, None),
            Target::Cluster(cluster, authority) => {
                // The cluster's TLS, as Envoy's checks through it would have.
                let host = clusters.single_host(cluster.as_str())?;
                (
                    host.address.to_owned(),
                    authority.clone(),
                    host.tls.cloned(),
                )
            }
        };
        let mut raw = self.raw.clone();
        match &mut raw.http {
            Some(http) => {
                http.address = address;
                http.tls = tls;
            }
            None => {
                raw.grpc = Some(RawAuthzGrpc {
                    address,
                    authority,
                    tls,
                    allowed_headers: self.grpc_allowed_headers.clone(),
                    retry_policy: self.grpc_retry.clone(),
                })
            }
        }
        Some(raw)
    }
}

/// A gRPC service's target (a cluster and the calls' authority, or an address), timeout and
/// retry policy (the service's, for a cluster's calls, as Envoy reads it).
fn grpc_target(
    mut service: envoy_types::pb::envoy::config::core::v3::GrpcService,
    at: &str,
) -> Result<(Target, Option<std::time::Duration>, Option<RawAuthzRetry>), ResourceError> {
    let mut retry = service
        .retry_policy
        .take()
        .map(|r| retry_policy(r, &format!("{at}.grpc_service.retry_policy")))
        .transpose()?;
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.to_owned(),
        fields: vec![what.to_owned()],
    };
    let target = match service.target_specifier.take() {
        Some(grpc_service::TargetSpecifier::EnvoyGrpc(mut grpc)) => {
            let cluster = std::mem::take(&mut grpc.cluster_name);
            let authority = Some(std::mem::take(&mut grpc.authority)).filter(|a| !a.is_empty());
            // Envoy honours it for its own xDS streams only; a check takes the service's.
            grpc.retry_policy = None;
            if grpc != Default::default() {
                return Err(unsupported(
                    "envoy_grpc besides cluster_name and authority (max_receive_message_length, skip_envoy_headers)",
                ));
            }
            Target::Cluster(cluster, authority)
        }
        Some(grpc_service::TargetSpecifier::GoogleGrpc(mut grpc)) => {
            // Envoy's google_grpc clients do not retry by the service's policy.
            retry = None;
            let target = std::mem::take(&mut grpc.target_uri);
            if grpc != Default::default() {
                return Err(unsupported("google_grpc besides target_uri (credentials)"));
            }
            Target::Address(target)
        }
        None => {
            return Err(ResourceError::invalid(
                at,
                "the gRPC service names no target",
            ));
        }
    };
    let timeout = duration(
        service.timeout.take(),
        &format!("{at}.grpc_service.timeout"),
    )?;
    if service != Default::default() {
        return Err(unsupported(
            "grpc_service (besides the target, timeout and retry_policy)",
        ));
    }
    Ok((target, timeout, retry))
}

/// An HTTP service (Envoy Gateway's HTTP authorization): its cluster, timeout, path prefix,
/// the request headers sent (`allowed_headers`, exact names) and the answer's headers that go
/// upstream on an allow (`allowed_upstream_headers`, exact names). The address is filled in
/// from the cluster.
fn http_target(
    mut service: HttpService,
    allowed: Option<ListStringMatcher>,
    at: &str,
) -> Result<(Target, Option<std::time::Duration>, RawAuthzHttp), ResourceError> {
    let at = format!("{at}.http_service");
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.clone(),
        fields: vec![what.to_owned()],
    };
    let uri = service
        .server_uri
        .take()
        .ok_or_else(|| ResourceError::invalid(&at, "expected a server_uri"))?;
    let Some(http_uri::HttpUpstreamType::Cluster(cluster)) = uri.http_upstream_type else {
        return Err(ResourceError::invalid(
            format!("{at}.server_uri"),
            "expected a cluster",
        ));
    };
    let timeout = duration(uri.timeout, &format!("{at}.server_uri.timeout"))?;
    let mut request = service.authorization_request.take().unwrap_or_default();
    let mut headers_to_add = std::collections::BTreeMap::new();
    for (i, header) in std::mem::take(&mut request.headers_to_add).into_iter().enumerate() {
        let value = if header.raw_value.is_empty() {
            header.value
        } else {
            String::from_utf8(header.raw_value).map_err(|_| {
                ResourceError::invalid(
                    format!("{at}.authorization_request.headers_to_add[{i}]"),
                    "expected a header value (visible ASCII)",
                )
            })?
        };
        headers_to_add.insert(header.key.to_ascii_lowercase(), value);
    }
    #[allow(deprecated)]
    let allowed = allowed.or_else(|| request.allowed_headers.take());
    let mut response = service.authorization_response.take().unwrap_or_default();
    let allowed_upstream = response.allowed_upstream_headers.take();
    let to_append = response.allowed_upstream_headers_to_append.take();
    let client_on_success = response.allowed_client_headers_on_success.take();
    let client = response.allowed_client_headers.take();
    if response != Default::default() {
        return Err(unsupported(
            "authorization_response.dynamic_metadata_from_headers (no dynamic metadata here)",
        ));
    }
    let response_at = format!("{at}.authorization_response");
    let retry_policy = service
        .retry_policy
        .take()
        .map(|r| retry_policy(r, &format!("{at}.retry_policy")))
        .transpose()?;
    let http = RawAuthzHttp {
        address: String::new(),
        path_prefix: Some(std::mem::take(&mut service.path_prefix)).filter(|p| !p.is_empty()),
        path_override: Some(std::mem::take(&mut service.path_override)).filter(|p| !p.is_empty()),
        retry_policy,
        allowed_headers: exact_names(allowed, &format!("{at}.allowed_headers"))?,
        allowed_upstream_headers: exact_names(
            allowed_upstream,
            &format!("{response_at}.allowed_upstream_headers"),
        )?,
        allowed_upstream_headers_to_append: exact_names(
            to_append,
            &format!("{response_at}.allowed_upstream_headers_to_append"),
        )?,
        allowed_client_headers_on_success: exact_names(
            client_on_success,
            &format!("{response_at}.allowed_client_headers_on_success"),
        )?,
        // Unset: every header of a denial, as Envoy.
        allowed_client_headers: client
            .map(|list| exact_names(Some(list), &format!("{response_at}.allowed_client_headers")))
            .transpose()?,
        headers_to_add,
        tls: None,
    };
    Ok((Target::Cluster(cluster, None), timeout, http))
}

/// A service's retry policy: its conditions, retries and back-off. The service is one host,
/// so host predicates and priorities have nothing to choose from: refused.
fn retry_policy(
    mut policy: envoy_types::pb::envoy::config::core::v3::RetryPolicy,
    at: &str,
) -> Result<RawAuthzRetry, ResourceError> {
    if policy.retry_priority.is_some()
        || !policy.retry_host_predicate.is_empty()
        || policy.host_selection_retry_max_attempts != 0
    {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec![
                "retry_priority, retry_host_predicate, host_selection_retry_max_attempts".into(),
            ],
        });
    }
    let retry_on = crate::envoy::retry_conditions(&policy.retry_on);
    if retry_on.is_empty() {
        return Err(ResourceError::invalid(
            format!("{at}.retry_on"),
            "expected the conditions to retry on",
        ));
    }
    let retry_back_off = match policy.retry_back_off.take() {
        None => None,
        Some(b) => Some(crate::envoy::retry_back_off(
            b.base_interval,
            b.max_interval,
            at,
        )?),
    };
    Ok(RawAuthzRetry {
        retry_on,
        num_retries: policy.num_retries.map(|n| n.value),
        retry_back_off,
    })
}

/// A list of header names given as `exact` patterns (any case: header names are compared
/// in lower case); any other pattern is refused.
fn exact_names(list: Option<ListStringMatcher>, at: &str) -> Result<Vec<String>, ResourceError> {
    list.map(|l| l.patterns)
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, m)| match m.match_pattern {
            Some(MatchPattern::Exact(name)) => Ok(name.to_ascii_lowercase()),
            _ => Err(ResourceError::Unsupported {
                at: format!("{at}[{i}]"),
                fields: vec!["a header pattern other than exact".into()],
            }),
        })
        .collect()
}

/// ext_authz's entry in a route's or virtual host's `typed_per_filter_config`: disabled,
/// or context extensions; `None` for an entry that changes nothing.
pub(crate) fn per_route(value: &Any, at: &str) -> Result<Option<RawRouteAuthz>, ResourceError> {
    let per_route: ExtAuthzPerRoute = prost::Message::decode(value.value.as_slice())
        .map_err(|e| ResourceError::invalid(at, format!("cannot decode ExtAuthzPerRoute: {e}")))?;
    Ok(match per_route.r#override {
        Some(ext_authz_per_route::Override::Disabled(true)) => {
            Some(RawRouteAuthz::Word("disabled".into()))
        }
        Some(ext_authz_per_route::Override::CheckSettings(mut settings)) => {
            let context_extensions = std::mem::take(&mut settings.context_extensions);
            if settings != Default::default() {
                return Err(ResourceError::Unsupported {
                    at: at.to_owned(),
                    fields: vec!["check_settings besides context_extensions".into()],
                });
            }
            Some(RawRouteAuthz::Settings(RawRouteAuthzSettings {
                disabled: None,
                context_extensions: context_extensions.into_iter().collect(),
            }))
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HttpUri};
    use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
        AuthorizationRequest, AuthorizationResponse,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher;

    fn names(names: &[&str]) -> Option<ListStringMatcher> {
        Some(ListStringMatcher {
            patterns: (names.iter())
                .map(|n| StringMatcher {
                    match_pattern: Some(MatchPattern::Exact((*n).into())),
                    ignore_case: true,
                })
                .collect(),
        })
    }

    fn decoded(response: AuthorizationResponse) -> Result<XdsAuthz, ResourceError> {
        let filter = ExtAuthz {
            services: Some(ext_authz::Services::HttpService(HttpService {
                server_uri: Some(HttpUri {
                    uri: "http://authz".into(),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster("authz".into())),
                    timeout: None,
                }),
                authorization_request: Some(AuthorizationRequest {
                    headers_to_add: vec![HeaderValue {
                        key: "X-Check-Key".into(),
                        value: "s3cret".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                authorization_response: Some(response),
                ..Default::default()
            })),
            ..Default::default()
        };
        let any = Any {
            type_url: TYPE_URL.into(),
            value: prost::Message::encode_to_vec(&filter),
        };
        XdsAuthz::decode(&any, "f")
    }

    #[test]
    fn istios_header_lists_are_taken() {
        let authz = decoded(AuthorizationResponse {
            allowed_upstream_headers: names(&["x-user"]),
            allowed_upstream_headers_to_append: names(&["x-Groups"]),
            allowed_client_headers: names(&["x-reason"]),
            allowed_client_headers_on_success: names(&["set-cookie"]),
            ..Default::default()
        })
        .map_err(|e| e.to_string())
        .unwrap();
        let http = authz.raw.http.as_deref().unwrap();
        assert_eq!(http.headers_to_add["x-check-key"], "s3cret");
        assert_eq!(http.allowed_upstream_headers_to_append, ["x-groups"]);
        assert_eq!(http.allowed_client_headers.as_deref(), Some(&["x-reason".to_owned()][..]));
        assert_eq!(http.allowed_client_headers_on_success, ["set-cookie"]);
        // Unset, a denial's headers all go to the client.
        let authz = decoded(AuthorizationResponse::default()).map_err(|e| e.to_string()).unwrap();
        assert_eq!(authz.raw.http.as_deref().unwrap().allowed_client_headers, None);
        let refused = decoded(AuthorizationResponse {
            dynamic_metadata_from_headers: names(&["x-user"]),
            ..Default::default()
        });
        assert!(
            refused.is_err_and(|e| e.to_string().contains("dynamic_metadata_from_headers"))
        );
    }
}
